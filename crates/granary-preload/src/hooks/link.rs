//! The C entry points of `readlink`, `readlinkat`, `realpath` and `__realpath_chk`. What
//! granary does for them is `ops::link`.

use core::ffi::{c_char, c_int};

use crate::ops::detour::Detour;
use crate::ops::link;
use crate::sys::{real, set_errno, sys};

type ReadlinkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> isize;
type ReadlinkatFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_char, usize) -> isize;
type RealpathFn = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
type RealpathChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> *mut c_char;

fn readlink_at(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
    real: impl FnOnce(c_int, *const c_char) -> isize,
) -> isize {
    match link::readlink(dirfd, path, buf, size) {
        Detour::Answer(n) => n,
        Detour::Fail(e) => {
            set_errno(e);
            -1
        }
        Detour::Bypass(why, guard) => {
            why.log_path(b"readlink", path);
            let r = real(dirfd, path);
            drop(guard);
            r
        }
    }
}

/// `realpath` into the caller's buffer, if granary can answer.
fn realpath_answer(path: *const c_char, resolved: *mut c_char) -> Option<*mut c_char> {
    match link::realpath(path, resolved) {
        Detour::Answer(p) => Some(p),
        Detour::Fail(_) => None,
        Detour::Bypass(why, ()) => {
            why.log_path(b"realpath", path);
            None
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize {
    readlink_at(libc::AT_FDCWD, path, buf, size, |d, p| {
        if d == libc::AT_FDCWD && p == path {
            real!(READLINK as ReadlinkFn, (p, buf, size)
                else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
        } else {
            real!(READLINKAT as ReadlinkatFn, (d, p, buf, size)
                else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> isize {
    readlink_at(dirfd, path, buf, size, |d, p| {
        real!(READLINKAT as ReadlinkatFn, (d, p, buf, size)
            else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // A NULL buffer means realpath allocates: that is libc's job, not a hook's.
    if !resolved.is_null() {
        if let Some(r) = realpath_answer(path, resolved) {
            return r;
        }
    }
    real!(REALPATH as RealpathFn, c"realpath", (path, resolved) or core::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    resolved_len: usize,
) -> *mut c_char {
    if !resolved.is_null() && resolved_len >= libc::PATH_MAX as usize {
        if let Some(r) = realpath_answer(path, resolved) {
            return r;
        }
    }
    real!(REALPATH_CHK as RealpathChkFn, c"__realpath_chk", (path, resolved, resolved_len)
        or core::ptr::null_mut())
}
