//! Forwarding SIGINT/SIGTERM/SIGHUP from `granary run` (and `granary demo`) to the program it
//! started; `granary demo` also notes that it was interrupted, so it can clean up and stop.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static CHILD: AtomicI32 = AtomicI32::new(0);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

extern "C" fn note_and_forward(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
    forward(sig);
}

fn install(handler: extern "C" fn(libc::c_int)) {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs an async-signal-safe handler (atomic loads and stores, and kill).
        unsafe {
            libc::signal(sig, handler as *const () as libc::sighandler_t);
        }
    }
}

pub fn forward_to(pid: u32) {
    CHILD.store(pid as i32, Ordering::Relaxed);
    install(forward);
}

/// From now on SIGINT/SIGTERM/SIGHUP no longer end this process: they are forwarded to the
/// current child (`set_child`) and noted (`interrupted`).
pub fn catch_interrupts() {
    install(note_and_forward);
}

/// The child that gets forwarded signals (0: none).
pub fn set_child(pid: u32) {
    CHILD.store(pid as i32, Ordering::Relaxed);
}

/// True once SIGINT/SIGTERM/SIGHUP arrived after `catch_interrupts`.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
