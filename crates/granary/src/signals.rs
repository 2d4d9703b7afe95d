//! `granary run` passes on every signal a wrapper like `srun` or `timeout` would, so the program
//! sees it (Slurm's `--signal=B:USR1@T` checkpoint-before-timeout, `scancel --signal`, `kill`),
//! and keeps waiting for the program, whose status it then returns.
//!
//! Not forwarded: SIGKILL and SIGSTOP (they cannot be caught); SIGCHLD (ours); SIGTSTP, SIGTTIN
//! and SIGTTOU (job control stops `granary run` like any process of the job); the faults of
//! `granary run` itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT); a signal
//! the kernel sent to the whole foreground process group (Ctrl-C, a terminal hangup, a window
//! resize: the program, in the same group, got it already); a SIGPIPE `granary run` caused
//! itself. `granary demo` uses the same handlers and also notes an interruption (`interrupted`),
//! so it can clean up what it created and stop; `granary pack` catches only the interruptions
//! (`catch_stop_signals`), removes its temporary pack and ends by the signal.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// The program's pid; 0 before it exists and once it has exited.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// Signals received while there was no program (bit `sig - 1`), forwarded when it starts.
static PENDING: AtomicU64 = AtomicU64::new(0);
/// SIGINT, SIGTERM or SIGHUP arrived (`granary demo` and `granary pack` stop and clean up).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The first of them that arrived (0: none), for `die_by`.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Every signal that is forwarded.
pub fn forwarded() -> Vec<libc::c_int> {
    let mut v = vec![
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGPIPE,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGCONT,
        libc::SIGURG,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGWINCH,
        libc::SIGIO,
        libc::SIGPWR,
    ];
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

fn send_pending(pid: libc::pid_t) {
    let mut bits = PENDING.swap(0, Ordering::AcqRel);
    while bits != 0 {
        let sig = bits.trailing_zeros() as libc::c_int + 1;
        bits &= bits - 1;
        // SAFETY: kill is async-signal-safe; pid is our own child.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    if !(1..=64).contains(&sig) {
        return;
    }
    if matches!(sig, libc::SIGINT | libc::SIGTERM | libc::SIGHUP) {
        let _ = STOP_SIGNAL.compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed);
        INTERRUPTED.store(true, Ordering::Relaxed);
    }
    let pid = CHILD.load(Ordering::Acquire);
    if !info.is_null() {
        // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO; si_pid is read only for
        // SI_USER/SI_QUEUE, where it is defined.
        let (code, sender) = unsafe {
            let code = (*info).si_code;
            let user = code == libc::SI_USER || code == libc::SI_QUEUE;
            (code, if user { (*info).si_pid() } else { 0 })
        };
        // SAFETY: getpid, getpgrp and getpgid are async-signal-safe system calls.
        let (me, group, child_group) = unsafe {
            (
                libc::getpid(),
                libc::getpgrp(),
                if pid > 0 { libc::getpgid(pid) } else { -1 },
            )
        };
        if sig == libc::SIGPIPE && sender == me {
            return;
        }
        if code == libc::SI_KERNEL && child_group == group {
            return;
        }
    }
    PENDING.fetch_or(1 << (sig - 1), Ordering::AcqRel);
    // Loaded again: the program may have started (on another thread) since the first load.
    let pid = CHILD.load(Ordering::Acquire);
    if pid > 0 {
        send_pending(pid);
    }
}

/// Installs the forwarding handlers; signals that arrive before `started` are held for the
/// program. Call just before spawning it.
pub fn install() {
    install_for(&forwarded());
}

fn install_for(signals: &[libc::c_int]) {
    for &sig in signals {
        // SAFETY: a zeroed sigaction with an empty mask is valid; the handler only uses
        // atomics, getpid and kill, all async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The program started as `pid`: forward what was held and everything from now on.
pub fn started(pid: u32) {
    CHILD.store(pid as i32, Ordering::Release);
    send_pending(pid as libc::pid_t);
}

/// Waits until the program has exited, without reaping it, then stops forwarding: a signal
/// can never reach another process that reused its pid. The caller reaps it (`Child::wait`).
pub fn wait_exit(pid: u32) {
    loop {
        // SAFETY: zeroed siginfo_t is a valid out-buffer; WNOWAIT leaves the child waitable.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    CHILD.store(0, Ordering::Release);
}

/// `granary demo`: from now on SIGINT/SIGTERM/SIGHUP no longer end this process; they are
/// forwarded to the current child (`set_child`) and noted (`interrupted`).
pub fn catch_interrupts() {
    install();
}

/// The child that gets forwarded signals (0: none).
pub fn set_child(pid: u32) {
    CHILD.store(pid as i32, Ordering::Release);
}

/// True once SIGINT/SIGTERM/SIGHUP arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// `granary pack`: SIGINT, SIGTERM and SIGHUP no longer end this process; they are noted
/// (`interrupted`), so it can remove what it wrote, and it then ends by the same signal
/// (`die_by_stop_signal`). Every other signal keeps its default action.
pub fn catch_stop_signals() {
    install_for(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
}

/// Ends the process by the SIGINT, SIGTERM or SIGHUP that interrupted it, with its default
/// action, as if it had never been caught (a shell sees 128 + the signal; a parent, the
/// signal); 1 if none arrived.
pub fn die_by_stop_signal() -> ! {
    let sig = STOP_SIGNAL.load(Ordering::Relaxed);
    if sig != 0 {
        // SAFETY: restores one signal's default action, unblocks it and sends it to this
        // process; the process ends there.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(if sig != 0 { 128 + sig } else { 1 })
}
