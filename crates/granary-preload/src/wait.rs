//! Bounded, interruptible waits on the agent: a read waiting for a partial copy's progress, an
//! open waiting for a copy (cluster mode, a packed file), a check another process holds. Every
//! wait gives up when the agent's heartbeat goes stale, when progress stands still, after a
//! bound in all, and at once when a signal the program handles arrives (`Gate`): granary may
//! make a call slower, never hang it.

use granary_shm::State;

use crate::ops::detour::Guard;
use crate::sys::log;
use crate::sys::{self, sys, KeepErrno};

/// A waiting read gives up when progress stood still this long…
pub const STALL_NS: u64 = 2_000_000_000;

/// …or when it waited this long in all.
const WAIT_MAX_NS: u64 = 60_000_000_000;

pub const SLEEP_MIN_NS: i64 = 200_000;

pub const SLEEP_MAX_NS: i64 = 1_000_000;

/// An open waiting for a cluster copy sleeps on the table's count of published copies, and the
/// agent wakes it when it publishes one: its naps only bound how late it sees anything else (a
/// copy given up, a pending signal, the agent gone). Each wake-up costs the program CPU (a
/// context switch, ~10 µs on a VM), against ~40 µs for the whole read of a 128 KiB copy: with
/// naps from 50 µs, a remote open woke 2–3 times before its copy came, 13 times for 8 MiB; from
/// 0.5 ms doubling to 1 ms, 2.7–3.4 times for 8 MiB (a same-host read of ~2 ms), from 2 ms
/// doubling to 4 ms, 0.8–1.2 times (voluntary context switches per file). The price: a signal
/// that arrives while the open sleeps (held: `Gate`) is handled up to 4 ms later, and a copy
/// given up or an agent gone is seen as late.
const OPEN_SLEEP_MIN_NS: i64 = 2_000_000;

const OPEN_SLEEP_MAX_NS: i64 = 4_000_000;

/// …and it waits longer for the copy to start moving: the agent bounds its own waits on other
/// nodes (it reads the source when one is silent), its own death or stop ends the wait at once
/// (heartbeat), and a loaded node can take a few seconds before the copy's first byte.
const OPEN_STALL_NS: u64 = 10_000_000_000;

pub enum Waited {
    /// Progress covers the range; the partial copy lives in this tier.
    Covered(u8),
    /// The copy is complete.
    Placed,
    /// Not worth waiting (agent gone or stopped, no progress, not being fetched, a signal):
    /// use the source.
    GiveUp,
}

/// How long a large file may stay UNPLACED after an open asked the agent to fetch it, when the
/// request may have been lost (a full ring): the agent claims a request as soon as it gets to
/// it. A request known to be on the ring (`asked`) is not held to this: under load the agent
/// can take longer to get to it (three serving ranks and their readers on two busy cores, the
/// ranks under strace: 3 of 300 opens read the source after 100 ms), and is waited for as long
/// as it is alive and within the stall bound.
const UNCLAIMED_NS: u64 = 100_000_000;

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    sys!(
        libc::SYS_clock_gettime,
        libc::CLOCK_MONOTONIC,
        &mut ts as *mut libc::timespec
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until `progress ≥ end` (or, with `end == None`, until the copy is complete), as long as
/// the file is being fetched, the agent's heartbeat is fresh and progress keeps moving. A signal
/// delivered meanwhile ends the wait at once (the read then goes to the source), so the program's
/// handler runs as promptly as without granary.
pub fn wait(g: &Guard, idx: u32, end: Option<u64>) -> Waited {
    wait_with(
        g,
        idx,
        end,
        (SLEEP_MIN_NS, SLEEP_MAX_NS),
        STALL_NS,
        false,
        false,
    )
}

/// `wait`, napping from `naps.0` doubling up to `naps.1` nanoseconds, giving up when progress
/// stood still for `stall` nanoseconds. `asked`: this wait's own request for the entry is on
/// the ring (pushed), so while the entry stays UNPLACED the agent has not got to it yet.
fn wait_with(
    g: &Guard,
    idx: u32,
    end: Option<u64>,
    naps: (i64, i64),
    stall: u64,
    woken: bool,
    mut asked: bool,
) -> Waited {
    let mut start = 0;
    let mut moved = 0;
    let mut last = 0;
    let mut sleep = naps.0;
    // Signals are held back while the wait looks at the table. A nap lets them in atomically
    // (`ppoll`); a futex sleep cannot, so the woken wait sleeps with them held and looks for
    // one pending before each sleep (each at most `naps.1`).
    let gate = Gate::hold();
    loop {
        let seen = g.table.placed_count();
        let word = g.table.state(idx);
        let st = word.state();
        if st == State::Placed {
            return Waited::Placed;
        }
        if st != State::Unplaced && st != State::Queued && st != State::Placing {
            return Waited::GiveUp;
        }
        // Claimed: an UNPLACED entry from now on was put back, not yet got to.
        asked &= st == State::Unplaced;
        // Progress is only meaningful while PLACING (a QUEUED entry may carry an old one).
        let p = if st == State::Placing {
            g.table.progress(idx)
        } else {
            0
        };
        if let Some(e) = end {
            if st == State::Placing && p >= e {
                return Waited::Covered(word.tier());
            }
        }
        let now = now_ns();
        if !g.table.agent_alive(now) {
            return give_up(b"the agent does not answer");
        }
        if start == 0 {
            (start, moved, last) = (now, now, p);
        } else if p != last {
            (moved, last) = (now, p);
        }
        // Still UNPLACED after a grace period: our request was lost (ring full) or refused.
        let unclaimed = !asked && st == State::Unplaced && now - start > UNCLAIMED_NS;
        if unclaimed || now - moved > stall || now - start > WAIT_MAX_NS {
            return give_up(b"the copy does not progress");
        }
        let interrupted = if woken {
            gate.sleep_until_placed(g, seen, &mut sleep, naps.1)
        } else {
            !gate.nap(&mut sleep, naps.1)
        };
        if interrupted {
            return give_up(b"a signal arrived");
        }
    }
}

/// A wait's hold on the program's signals: held back while the wait looks at the table, let
/// in only while it sleeps (`ppoll` swaps the mask for the sleep atomically). A signal that
/// arrives between two naps is then not handled unseen — the wait going on for seconds while
/// the program's Ctrl-C handler already ran — but interrupts the next nap at once. Faults
/// (`SIGSEGV`, `SIGBUS`, …) and glibc's internal signals are never held. The program's own
/// mask comes back when the gate is dropped.
pub struct Gate {
    /// The thread's mask before the gate (a kernel `sigset_t`, 64 signals); `None`: the mask
    /// could not be changed, naps are plain sleeps.
    orig: Option<u64>,
}

/// Signals a wait never holds back: synchronous faults (blocked, the kernel kills the
/// process), the two that cannot be blocked, and glibc's cancellation and set*id signals (32,
/// 33: another thread's `setuid` waits for every thread to take one).
const NEVER_HELD: u64 = sig_bit(libc::SIGSEGV)
    | sig_bit(libc::SIGBUS)
    | sig_bit(libc::SIGFPE)
    | sig_bit(libc::SIGILL)
    | sig_bit(libc::SIGTRAP)
    | sig_bit(libc::SIGSYS)
    | sig_bit(libc::SIGKILL)
    | sig_bit(libc::SIGSTOP)
    | sig_bit(32)
    | sig_bit(33);

const fn sig_bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

impl Gate {
    pub fn hold() -> Gate {
        let block: u64 = !NEVER_HELD;
        let mut orig: u64 = 0;
        let r = sys!(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &block as *const u64,
            &mut orig as *mut u64,
            8usize
        );
        Gate {
            orig: (r == 0).then_some(orig),
        }
    }

    /// True if a signal the gate holds back is pending and the program handles it (a handler
    /// of its own, or a default that ends or stops it): the wait must end so that it runs.
    /// Signals it ignores (`SIG_IGN`, or ignored by default: a child's `SIGCHLD`, `SIGWINCH`,
    /// `SIGURG`, `SIGCONT`) do not end it.
    pub fn pending(&self) -> bool {
        let Some(orig) = self.orig else {
            return false;
        };
        let mut set: u64 = 0;
        if sys!(libc::SYS_rt_sigpending, &mut set as *mut u64, 8usize) != 0 {
            return false;
        }
        let held = set & !orig & !NEVER_HELD;
        (1..=64).filter(|&sig| held & sig_bit(sig) != 0).any(|sig| {
            // The kernel's `struct sigaction` starts with the handler on every architecture;
            // 4 words hold it whole (handler, flags, restorer, mask on x86-64).
            let mut act = [0u64; 4];
            let r = sys!(
                libc::SYS_rt_sigaction,
                sig,
                core::ptr::null::<u64>(),
                act.as_mut_ptr(),
                8usize
            );
            let ignored_by_default = matches!(
                sig,
                libc::SIGCHLD | libc::SIGWINCH | libc::SIGURG | libc::SIGCONT
            );
            r != 0
                || !(act[0] == libc::SIG_IGN as u64
                    || act[0] == libc::SIG_DFL as u64 && ignored_by_default)
        })
    }

    /// Sleeps until the agent publishes a copy after `seen` (`Table::placed_count`), at most
    /// `sleep` ns, then doubles `sleep` up to `max`; true if a signal the program handles is
    /// pending. A futex sleep cannot let signals in atomically as `nap` does: with them held,
    /// it looks for one pending first, and each sleep is short.
    pub fn sleep_until_placed(&self, g: &Guard, seen: u32, sleep: &mut i64, max: i64) -> bool {
        let t = core::time::Duration::from_nanos(*sleep as u64);
        *sleep = (*sleep * 2).min(max);
        self.pending() || g.table.wait_placed(seen, t)
    }

    /// Sleeps `sleep` ns with the program's signals let in, then doubles `sleep` up to `max`;
    /// false if a signal came (now, or while the wait looked at the table).
    pub fn nap(&self, sleep: &mut i64, max: i64) -> bool {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: *sleep,
        };
        let r = match &self.orig {
            Some(orig) => sys!(
                libc::SYS_ppoll,
                core::ptr::null_mut::<libc::pollfd>(),
                0usize,
                &ts as *const libc::timespec,
                orig as *const u64,
                8usize
            ),
            None => sys!(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize),
        };
        let interrupted = r < 0 && sys::errno() == libc::EINTR;
        *sleep = (*sleep * 2).min(max);
        !interrupted
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(orig) = &self.orig {
            let _keep = KeepErrno::new();
            sys!(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                orig as *const u64,
                core::ptr::null_mut::<u64>(),
                8usize
            );
        }
    }
}

/// Waits (as `wait` does) until the copy of `idx` is complete; false when it gave up. Between
/// looks it sleeps on the table's count of published copies (the agent wakes it when it
/// publishes one), each sleep bounded as `wait`'s naps are. `asked`: the caller's request for
/// it was pushed onto the ring just now (`wait_with`).
pub fn wait_placed(g: &Guard, idx: u32, asked: bool) -> bool {
    woken_wait(
        g,
        idx,
        (OPEN_SLEEP_MIN_NS, OPEN_SLEEP_MAX_NS),
        OPEN_STALL_NS,
        asked,
    )
}

/// Waits for the complete copy of `idx`, woken when the agent publishes a copy; false when it
/// gave up.
pub fn woken_wait(g: &Guard, idx: u32, naps: (i64, i64), stall: u64, asked: bool) -> bool {
    matches!(
        wait_with(g, idx, None, naps, stall, true, asked),
        Waited::Placed
    )
}

fn give_up(why: &[u8]) -> Waited {
    if log::enabled() {
        log::line(&[
            b"stopped waiting for the agent (",
            why,
            b"), reading the source",
        ]);
    }
    Waited::GiveUp
}
