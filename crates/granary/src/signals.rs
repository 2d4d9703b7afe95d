//! Forwarding SIGINT/SIGTERM/SIGHUP from `granary run` to the program it started.

use std::sync::atomic::{AtomicI32, Ordering};

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

pub fn forward_to(pid: u32) {
    CHILD.store(pid as i32, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs an async-signal-safe handler (one atomic load and kill).
        unsafe {
            libc::signal(sig, forward as *const () as libc::sighandler_t);
        }
    }
}
