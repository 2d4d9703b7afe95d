//! The one path every way an fd goes away takes — `close`, `fclose`, `close_range`, `dup2`/`dup3`
//! over a tracked fd, `freopen` — so that each does what a close means: the fd is forgotten
//! before the kernel can hand its number out again, a transient copy's pages are dropped while
//! the fd still names it, and the agent hears of a small source file the program has read.
//!
//! In a vfork child (which shares its parent's memory until `exec`) nothing happens: its closes
//! are not the parent's, and dropping pages there would drop the parent's.

use core::ffi::c_int;

use crate::fdtable::{self, Tracked};

/// Before the real call that closes `fd`: forgets it and returns what it was.
#[inline]
pub fn before(fd: c_int) -> Option<Tracked> {
    crate::copies::forget(fd);
    let t = fdtable::take(fd)?;
    crate::pagedrop::before_close(fd, t);
    Some(t)
}

/// After the real call: what the agent should learn from it.
pub fn after(t: Option<Tracked>) {
    if let Some(t) = t {
        let _keep = crate::sys::KeepErrno::new();
        crate::place::on_release(t);
    }
}
