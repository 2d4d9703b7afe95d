//! What granary does for attribute changes through an fd (`fchmod`, `fchown`, `futimens`,
//! `futimes`, `fsetxattr`, `fremovexattr`): made on the source, never the copy (a `chmod` of
//! the copy would change nothing the program can see), then the entry is voided like a path
//! call in `mutate` would void it. A tier fd is first moved to the source (`lock::onto_source`);
//! one that cannot move has its change made through the source path instead.

use core::ffi::{c_char, c_int};

use crate::ops::path::{self, Buf};
use crate::sys::KeepErrno;

use super::lock::onto_source;
use super::mutate::fd_changed;

/// An attribute change on `fd`; `perms`: a permission change. `real` makes the call through
/// the fd, `by_path` through the source path of a copy that had to stay where it is.
pub fn change(
    fd: c_int,
    perms: bool,
    real: impl FnOnce() -> c_int,
    by_path: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    let Some(t) = crate::fds::tracked::get(fd) else {
        let r = real();
        if r == 0 {
            fd_changed(fd, perms);
        }
        return r;
    };
    let on_source = {
        let _keep = KeepErrno::new();
        onto_source(fd, t)
    };
    let r = if on_source {
        real()
    } else {
        let mut buf = Buf::new();
        match crate::ops::detour::table().and_then(|tb| path::entry_path(tb, t.entry, &mut buf)) {
            Some(p) => by_path(p),
            None => real(),
        }
    };
    if r == 0 {
        fd_changed(fd, perms);
    }
    r
}
