//! What granary does for locks on a tracked fd (`flock`, `fcntl` record and OFD locks, `lockf`):
//! they must reach the source, never the copy — a lock on the copy would not exclude a writer
//! of the source. A tier fd is first moved to the source (`switch::to_source`, only when its
//! open file description is not shared); one that cannot move takes its lock on the copy (a
//! documented limit: docs/reliability.md).

use core::ffi::c_int;

use crate::fds::fdtable::{self, FdKind, Tracked};
use crate::ops::detour;
use crate::sys::KeepErrno;
use crate::{fds::switch, fds::tracked};

pub fn is_lock(cmd: c_int) -> bool {
    matches!(
        cmd,
        libc::F_SETLK
            | libc::F_SETLKW
            | libc::F_GETLK
            | libc::F_OFD_SETLK
            | libc::F_OFD_SETLKW
            | libc::F_OFD_GETLK
    )
}

/// Moves tier fd `fd` to the source if it is one; true if it now is a source fd (or never was a
/// tier fd), false if it had to stay on the copy.
pub fn onto_source(fd: c_int, t: Tracked) -> bool {
    if !matches!(t.kind, FdKind::Tier(_)) {
        return true;
    }
    let Ok(g) = detour::enter_any_creds() else {
        return false;
    };
    let Some(e) = crate::ops::lookup::entry(g.table, t.entry) else {
        return false;
    };
    if !fdtable::lock(fd) {
        return false;
    }
    // Another thread may have moved it meanwhile.
    let moved = match tracked::get(fd) {
        Some(now) if matches!(now.kind, FdKind::Tier(_)) => switch::to_source(&g, fd, now, &e),
        _ => true,
    };
    fdtable::unlock(fd);
    moved
}

/// A lock call on `fd` (tracked: `t`, else the call as is); `real` makes it, on the source.
pub fn locking(fd: c_int, t: Tracked, real: impl FnOnce() -> c_int) -> c_int {
    {
        let _keep = KeepErrno::new();
        onto_source(fd, t);
    }
    real()
}

/// A lock call on `fd`, tracked or not.
pub fn lock(fd: c_int, real: impl FnOnce() -> c_int) -> c_int {
    match tracked::get(fd) {
        Some(t) => locking(fd, t, real),
        None => real(),
    }
}
