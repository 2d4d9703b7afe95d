//! The C entry points of attribute changes through an fd: `fchmod`, `fchown`, `futimens`,
//! `futimes`, `fsetxattr`, `fremovexattr`. What granary does for them is `ops::attr`.

use core::ffi::{c_char, c_int, c_void};

use crate::ops::attr;
use crate::sys::{real, sys};

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
    attr::change(
        fd,
        true,
        || real!(FCHMOD as FchmodFn, (fd, mode) else sys!(libc::SYS_fchmod, fd, mode) as c_int),
        |p| sys!(libc::SYS_fchmodat, libc::AT_FDCWD, p, mode) as c_int,
    )
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    attr::change(
        fd,
        true,
        || real!(FCHOWN as FchownFn, (fd, uid, gid) else sys!(libc::SYS_fchown, fd, uid, gid) as c_int),
        |p| sys!(libc::SYS_fchownat, libc::AT_FDCWD, p, uid, gid, 0) as c_int,
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const c_void) -> c_int {
    attr::change(
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
    attr::change(
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
    attr::change(
        fd,
        true,
        || real!(FSETXATTR as FsetxattrFn, c"fsetxattr", (fd, name, value, size, flags) or -1),
        |p| real!(SETXATTR as SetxattrFn, c"setxattr", (p, name, value, size, flags) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    attr::change(
        fd,
        true,
        || real!(FREMOVEXATTR as FremovexattrFn, c"fremovexattr", (fd, name) or -1),
        |p| real!(REMOVEXATTR as RemovexattrFn, c"removexattr", (p, name) or -1),
    )
}
