//! The C entry points of reading extended attributes: `getxattr`, `lgetxattr`, `fgetxattr`,
//! `listxattr`, `llistxattr`, `flistxattr`. What granary does for them is `ops::xattr`.

use core::ffi::{c_char, c_int, c_void};

use crate::ops::detour::Detour;
use crate::ops::xattr;
use crate::sys::{real, set_errno, sys};

type GetxattrFn = unsafe extern "C" fn(*const c_char, *const c_char, *mut c_void, usize) -> isize;
type FgetxattrFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_void, usize) -> isize;
type ListxattrFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> isize;
type FlistxattrFn = unsafe extern "C" fn(c_int, *mut c_char, usize) -> isize;

/// Granary's answer, or `real()` (the debug log says why, naming `call` and `what`).
fn finish<G>(
    d: Detour<isize, G>,
    call: &[u8],
    what: impl FnOnce() -> Option<c_int>,
    path: *const c_char,
    real: impl FnOnce() -> isize,
) -> isize {
    match d {
        Detour::Answer(n) => n,
        Detour::Fail(e) => {
            set_errno(e);
            -1
        }
        Detour::Bypass(why, guard) => {
            match what() {
                Some(fd) => why.log_fd(call, fd),
                None => why.log_path(call, path),
            }
            let r = real();
            drop(guard);
            r
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn getxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: usize,
) -> isize {
    finish(
        xattr::get(path, name, true),
        b"getxattr",
        || None,
        path,
        || {
            real!(GETXATTR as GetxattrFn, (path, name, value, size)
            else sys!(libc::SYS_getxattr, path, name, value, size) as isize)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn lgetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: usize,
) -> isize {
    finish(
        xattr::get(path, name, false),
        b"lgetxattr",
        || None,
        path,
        || {
            real!(LGETXATTR as GetxattrFn, (path, name, value, size)
            else sys!(libc::SYS_lgetxattr, path, name, value, size) as isize)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const c_char,
    value: *mut c_void,
    size: usize,
) -> isize {
    let d = xattr::fget(fd, name, value, size);
    finish(
        d,
        b"fgetxattr",
        || Some(fd),
        core::ptr::null(),
        || {
            real!(FGETXATTR as FgetxattrFn, (fd, name, value, size)
            else sys!(libc::SYS_fgetxattr, fd, name, value, size) as isize)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn listxattr(path: *const c_char, list: *mut c_char, size: usize) -> isize {
    finish(
        xattr::list(path, true),
        b"listxattr",
        || None,
        path,
        || {
            real!(LISTXATTR as ListxattrFn, (path, list, size)
            else sys!(libc::SYS_listxattr, path, list, size) as isize)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn llistxattr(path: *const c_char, list: *mut c_char, size: usize) -> isize {
    finish(
        xattr::list(path, false),
        b"llistxattr",
        || None,
        path,
        || {
            real!(LLISTXATTR as ListxattrFn, (path, list, size)
            else sys!(libc::SYS_llistxattr, path, list, size) as isize)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, size: usize) -> isize {
    finish(
        xattr::flist(fd, list, size),
        b"flistxattr",
        || Some(fd),
        core::ptr::null(),
        || {
            real!(FLISTXATTR as FlistxattrFn, (fd, list, size)
            else sys!(libc::SYS_flistxattr, fd, list, size) as isize)
        },
    )
}
