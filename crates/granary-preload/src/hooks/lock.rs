//! fd calls that act on the *file* rather than its bytes — locks (`flock`, `fcntl` record and
//! OFD locks, `lockf`), attribute changes (`fchmod`, `fchown`, `futimens`, `futimes`,
//! `fsetxattr`, `fremovexattr`) and `fstatfs` — must reach the source, never the copy: a lock on
//! the copy would not exclude a writer of the source, a `chmod` of the copy would change nothing
//! the program can see.
//!
//! A tier fd is first moved to the source (`switch::to_source`, only when its OFD is not shared);
//! one that cannot move has its attribute changes made on the source path instead, and its lock
//! taken on the copy (a documented limit: docs/reliability.md). Attribute changes then void the
//! entry, like the path calls in `mutate`.

use core::ffi::{c_char, c_int, c_void};

use crate::fdtable::{self, FdKind, Tracked};
use crate::path::{self, Buf};
use crate::switch;
use crate::sys::{real, sys, KeepErrno};

use super::mutate::fd_changed;

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
fn onto_source(fd: c_int, t: Tracked) -> bool {
    if !matches!(t.kind, FdKind::Tier(_)) {
        return true;
    }
    let Some(g) = crate::detour::enter_any_creds() else {
        return false;
    };
    let Some(e) = crate::entries::get(g.table, t.entry) else {
        return false;
    };
    if !fdtable::lock(fd) {
        return false;
    }
    // Another thread may have moved it meanwhile.
    let moved = match crate::tracked::get(fd) {
        Some(now) if matches!(now.kind, FdKind::Tier(_)) => switch::to_source(&g, fd, now, &e),
        _ => true,
    };
    fdtable::unlock(fd);
    moved
}

/// A lock call on tracked fd `fd`: on the source.
pub fn locking(fd: c_int, t: Tracked, call: impl FnOnce() -> c_int) -> c_int {
    {
        let _keep = KeepErrno::new();
        onto_source(fd, t);
    }
    call()
}

type FlockFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type LockfFn = unsafe extern "C" fn(c_int, c_int, libc::off_t) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    let call = || real!(FLOCK as FlockFn, (fd, op) else sys!(libc::SYS_flock, fd, op) as c_int);
    match crate::tracked::get(fd) {
        Some(t) => locking(fd, t, call),
        None => call(),
    }
}

macro_rules! lockf_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        /// glibc's `lockf` calls its internal `fcntl`, which we never see.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int {
            let call = || real!($slot as LockfFn, $cname, (fd, cmd, len) or -1);
            match crate::tracked::get(fd) {
                Some(t) => locking(fd, t, call),
                None => call(),
            }
        }
    };
}
lockf_hook!(lockf, LOCKF, c"lockf");
lockf_hook!(lockf64, LOCKF64, c"lockf64");

/// An attribute change on `fd`: made on the source (through the fd once it is a source fd, else
/// through the source path with `by_path`), then the entry is voided.
fn attribute(
    fd: c_int,
    perms: bool,
    call: impl FnOnce() -> c_int,
    by_path: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    let Some(t) = crate::tracked::get(fd) else {
        let r = call();
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
        call()
    } else {
        let mut buf = Buf::new();
        match crate::detour::table().and_then(|tb| path::entry_path(tb, t.entry, &mut buf)) {
            Some(p) => by_path(p),
            None => call(),
        }
    };
    if r == 0 {
        fd_changed(fd, perms);
    }
    r
}

type FchmodFn = unsafe extern "C" fn(c_int, libc::mode_t) -> c_int;
type FchownFn = unsafe extern "C" fn(c_int, libc::uid_t, libc::gid_t) -> c_int;
type FutimensFn = unsafe extern "C" fn(c_int, *const c_void) -> c_int;
type FsetxattrFn = unsafe extern "C" fn(c_int, *const c_char, *const c_void, usize, c_int) -> c_int;
type FremovexattrFn = unsafe extern "C" fn(c_int, *const c_char) -> c_int;
type SetxattrFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const c_void, usize, c_int) -> c_int;
type RemovexattrFn = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;
type UtimesFn = unsafe extern "C" fn(*const c_char, *const c_void) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    attribute(
        fd,
        true,
        || real!(FCHMOD as FchmodFn, (fd, mode) else sys!(libc::SYS_fchmod, fd, mode) as c_int),
        |p| sys!(libc::SYS_fchmodat, libc::AT_FDCWD, p, mode) as c_int,
    )
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    attribute(
        fd,
        true,
        || real!(FCHOWN as FchownFn, (fd, uid, gid) else sys!(libc::SYS_fchown, fd, uid, gid) as c_int),
        |p| sys!(libc::SYS_fchownat, libc::AT_FDCWD, p, uid, gid, 0) as c_int,
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const c_void) -> c_int {
    attribute(
        fd,
        false,
        || {
            real!(FUTIMENS as FutimensFn, (fd, times)
            else sys!(libc::SYS_utimensat, fd, 0usize, times, 0) as c_int)
        },
        |p| sys!(libc::SYS_utimensat, libc::AT_FDCWD, p, times, 0) as c_int,
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, times: *const c_void) -> c_int {
    attribute(
        fd,
        false,
        || real!(FUTIMES as FutimensFn, c"futimes", (fd, times) or -1),
        |p| real!(UTIMES as UtimesFn, c"utimes", (p, times) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    attribute(
        fd,
        true,
        || real!(FSETXATTR as FsetxattrFn, c"fsetxattr", (fd, name, value, size, flags) or -1),
        |p| real!(SETXATTR as SetxattrFn, c"setxattr", (p, name, value, size, flags) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    attribute(
        fd,
        true,
        || real!(FREMOVEXATTR as FremovexattrFn, c"fremovexattr", (fd, name) or -1),
        |p| real!(REMOVEXATTR as RemovexattrFn, c"removexattr", (p, name) or -1),
    )
}

type FstatfsFn = unsafe extern "C" fn(c_int, *mut libc::statfs) -> c_int;

macro_rules! fstatfs_hook {
    ($name:ident, $slot:ident) => {
        /// A tier fd's file system is the tier's; the program asked about the source's.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut libc::statfs) -> c_int {
            let call = || real!($slot as FstatfsFn, (fd, buf) else sys!(libc::SYS_fstatfs, fd, buf) as c_int);
            match crate::tracked::get(fd) {
                Some(t) if matches!(t.kind, FdKind::Tier(_)) => {
                    let mut pbuf = Buf::new();
                    match crate::detour::table().and_then(|tb| path::entry_path(tb, t.entry, &mut pbuf)) {
                        Some(p) => sys!(libc::SYS_statfs, p, buf) as c_int,
                        None => call(),
                    }
                }
                _ => call(),
            }
        }
    };
}
fstatfs_hook!(fstatfs, FSTATFS);
fstatfs_hook!(fstatfs64, FSTATFS64);
