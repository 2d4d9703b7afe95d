//! The C entry points of the calls that create fds for paths: `open` and its aliases, `creat`,
//! `fopen`, `freopen`, `fclose`. What granary does for them is `ops::open`; here are the C
//! arguments, errno and the real calls.

use core::ffi::{c_char, c_int};

use crate::ops::detour::Detour;
use crate::ops::{fd, open};
use crate::sys::{self, real, set_errno};

/// The open family: granary's fd, or the real call (`real`) and its fd tracked.
fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, real: impl FnOnce() -> c_int) -> c_int {
    // Made once: by `open::open` itself (an open that can only go to the source), or below.
    let mut real = Some(real);
    let mut call = || real.take().map_or(-1, |f| f());
    match open::open(dirfd, path, flags, Some(&mut call)) {
        Detour::Answer(fd) => fd,
        Detour::Fail(e) => {
            set_errno(e);
            -1
        }
        Detour::Bypass(why, then) => {
            why.log_path(b"open", path);
            let fd = call();
            open::after_real(fd, then);
            fd
        }
    }
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;

fn wants_mode(flags: c_int) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

macro_rules! open_hook {
    ($name:ident, $slot:ident) => {
        // The mode is taken as a fixed third argument (x86-64/aarch64 ABI) and read only when
        // the flags say it exists.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
            let mode = if wants_mode(flags) { mode } else { 0 };
            open_at(libc::AT_FDCWD, path, flags, || {
                real!($slot as OpenFn, (path, flags, mode)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, mode))
            })
        }
    };
}
open_hook!(open, OPEN);
open_hook!(open64, OPEN64);

macro_rules! open2_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            open_at(libc::AT_FDCWD, path, flags, || {
                real!($slot as Open2Fn, (path, flags)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, 0))
            })
        }
    };
}
open2_hook!(__open_2, OPEN_2);
open2_hook!(__open64_2, OPEN64_2);

macro_rules! openat_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            flags: c_int,
            mode: libc::mode_t,
        ) -> c_int {
            let mode = if wants_mode(flags) { mode } else { 0 };
            open_at(dirfd, path, flags, || {
                real!($slot as OpenatFn, (dirfd, path, flags, mode)
                    else sys::raw_openat(dirfd, path, flags, mode))
            })
        }
    };
}
openat_hook!(openat, OPENAT);
openat_hook!(openat64, OPENAT64);

macro_rules! openat2_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
            open_at(dirfd, path, flags, || {
                real!($slot as Openat2Fn, (dirfd, path, flags)
                    else sys::raw_openat(dirfd, path, flags, 0))
            })
        }
    };
}
openat2_hook!(__openat_2, OPENAT_2);
openat2_hook!(__openat64_2, OPENAT64_2);

macro_rules! creat_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: libc::mode_t) -> c_int {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            open_at(libc::AT_FDCWD, path, flags, || {
                real!($slot as CreatFn, (path, mode)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, mode))
            })
        }
    };
}
creat_hook!(creat, CREAT);
creat_hook!(creat64, CREAT64);

type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type FdopenFn = unsafe extern "C" fn(c_int, *const c_char) -> *mut libc::FILE;
type FreopenFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *mut libc::FILE) -> *mut libc::FILE;
type FcloseFn = unsafe extern "C" fn(*mut libc::FILE) -> c_int;

fn stream_fd(fp: *mut libc::FILE) -> c_int {
    if fp.is_null() {
        return -1;
    }
    // SAFETY: a non-null FILE* the caller owns; fileno only reads it.
    unsafe { libc::fileno(fp) }
}

fn fopen_at(
    path: *const c_char,
    mode: *const c_char,
    real: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    match open::fopen(path, mode) {
        Detour::Answer(fd) => {
            let fp = real!(FDOPEN as FdopenFn, c"fdopen", (fd, mode) or core::ptr::null_mut());
            if fp.is_null() {
                open::fdopen_failed(fd);
            }
            fp
        }
        Detour::Fail(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
        Detour::Bypass(why, then) => {
            why.log_path(b"fopen", path);
            let fp = real();
            open::after_real(stream_fd(fp), then);
            fp
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    fopen_at(
        path,
        mode,
        || real!(FOPEN as FopenFn, c"fopen", (path, mode) or core::ptr::null_mut()),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    fopen_at(
        path,
        mode,
        || real!(FOPEN64 as FopenFn, c"fopen64", (path, mode) or core::ptr::null_mut()),
    )
}

fn freopen_at(
    mode: *const c_char,
    stream: *mut libc::FILE,
    real: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // freopen closes the stream's fd inside libc, where we cannot see it.
    let closing = fd::closing(stream_fd(stream));
    let fp = real();
    fd::closed(closing);
    open::reopened(stream_fd(fp), mode);
    fp
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    freopen_at(
        mode,
        stream,
        || real!(FREOPEN as FreopenFn, c"freopen", (path, mode, stream) or core::ptr::null_mut()),
    )
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    freopen_at(
        mode,
        stream,
        || real!(FREOPEN64 as FreopenFn, c"freopen64", (path, mode, stream) or core::ptr::null_mut()),
    )
}

/// fclose closes its fd inside libc: the release path around it.
#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut libc::FILE) -> c_int {
    let closing = fd::closing(stream_fd(fp));
    let r = real!(FCLOSE as FcloseFn, c"fclose", (fp) or libc::EOF);
    fd::closed(closing);
    r
}
