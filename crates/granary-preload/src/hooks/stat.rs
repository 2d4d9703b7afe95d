//! The C entry points of the stat family (`stat`, `lstat`, `fstatat`, `statx` and their `64`
//! and `__xstat` aliases), `fstat`, `access`/`faccessat` and `fstatfs`. What granary does for
//! them is `ops::stat`; here are the C arguments (an `_STAT_VER` we do not know is the real
//! call's), errno and the real calls.

use core::ffi::{c_char, c_int, c_uint};

use crate::ops::detour::Detour;
use crate::ops::stat;
use crate::sys::statbuf::Out;
use crate::sys::{self, real, sys};

/// A stat of `(dirfd, path)`: granary's answer, or `real(dirfd, path)`.
fn stat_at(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    out: Out,
    real: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    match stat::stat(dirfd, path, flags, out) {
        Detour::Answer(r) => r,
        Detour::Fail(e) => fail(e),
        Detour::Bypass(why, guard) => {
            why.log_path(b"stat", path);
            let r = real(dirfd, path);
            drop(guard);
            r
        }
    }
}

fn fstat_of(fd: c_int, buf: *mut libc::stat, real: impl FnOnce() -> c_int) -> c_int {
    match stat::fstat(fd, Out::Stat(buf)) {
        Detour::Answer(r) => r,
        Detour::Fail(e) => fail(e),
        Detour::Bypass(why, guard) => {
            why.log_fd(b"fstat", fd);
            let r = real();
            drop(guard);
            r
        }
    }
}

fn access_at(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
    real: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    match stat::access(dirfd, path, mode, flags) {
        Detour::Answer(r) => r,
        Detour::Fail(e) => fail(e),
        Detour::Bypass(why, guard) => {
            why.log_path(b"access", path);
            let r = real(dirfd, path);
            drop(guard);
            r
        }
    }
}

fn fail(e: c_int) -> c_int {
    sys::set_errno(e);
    -1
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type StatxFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
type FstatFn = unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;
type XstatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat) -> c_int;
type FxstatatFn =
    unsafe extern "C" fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type FxstatFn = unsafe extern "C" fn(c_int, c_int, *mut libc::stat) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

macro_rules! stat_hook {
    ($name:ident, $slot:ident, $st:ty, $flags:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            stat_at(libc::AT_FDCWD, path, $flags, Out::Stat(buf), |d, p| {
                if d == libc::AT_FDCWD && p == path {
                    real!($slot as StatFn, (p, buf) else sys::raw_stat(d, p, buf, $flags))
                } else {
                    real!(FSTATAT as FstatatFn, (d, p, buf, $flags) else sys::raw_stat(d, p, buf, $flags))
                }
            })
        }
    };
}
stat_hook!(stat, STAT, libc::stat, 0);
stat_hook!(stat64, STAT64, libc::stat64, 0);
stat_hook!(lstat, LSTAT, libc::stat, libc::AT_SYMLINK_NOFOLLOW);
stat_hook!(lstat64, LSTAT64, libc::stat64, libc::AT_SYMLINK_NOFOLLOW);

macro_rules! fstatat_hook {
    ($name:ident, $slot:ident, $st:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            buf: *mut $st,
            flags: c_int,
        ) -> c_int {
            let buf = buf.cast::<libc::stat>();
            stat_at(dirfd, path, flags, Out::Stat(buf), |d, p| {
                real!($slot as FstatatFn, (d, p, buf, flags) else sys::raw_stat(d, p, buf, flags))
            })
        }
    };
}
fstatat_hook!(fstatat, FSTATAT, libc::stat);
fstatat_hook!(fstatat64, FSTATAT64, libc::stat64);

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    stat_at(dirfd, path, flags, Out::Statx(mask, buf), |d, p| {
        real!(STATX as StatxFn, (d, p, flags, mask, buf)
            else sys::sys!(libc::SYS_statx, d, p, flags, mask, buf) as c_int)
    })
}

macro_rules! fstat_hook {
    ($name:ident, $slot:ident, $st:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            fstat_of(fd, buf, || {
                real!($slot as FstatFn, (fd, buf) else sys::raw_fstat(fd, buf))
            })
        }
    };
}
fstat_hook!(fstat, FSTAT, libc::stat);
fstat_hook!(fstat64, FSTAT64, libc::stat64);

/// `_STAT_VER` of the kernel-layout `struct stat` the `__xstat` family was built against.
#[cfg(target_arch = "x86_64")]
const STAT_VER: c_int = 1;
#[cfg(not(target_arch = "x86_64"))]
const STAT_VER: c_int = 0;

macro_rules! xstat_hook {
    ($name:ident, $slot:ident, $st:ty, $flags:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(ver: c_int, path: *const c_char, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            let pass = |d: c_int, p: *const c_char| {
                if d == libc::AT_FDCWD && p == path {
                    real!($slot as XstatFn, stringify_c!($name), (ver, p, buf) or -1)
                } else {
                    sys::raw_stat(d, p, buf, $flags)
                }
            };
            if ver != STAT_VER {
                return pass(libc::AT_FDCWD, path);
            }
            stat_at(libc::AT_FDCWD, path, $flags, Out::Stat(buf), pass)
        }
    };
}

macro_rules! stringify_c {
    (__xstat) => {
        c"__xstat"
    };
    (__xstat64) => {
        c"__xstat64"
    };
    (__lxstat) => {
        c"__lxstat"
    };
    (__lxstat64) => {
        c"__lxstat64"
    };
    (__fxstatat) => {
        c"__fxstatat"
    };
    (__fxstatat64) => {
        c"__fxstatat64"
    };
    (__fxstat) => {
        c"__fxstat"
    };
    (__fxstat64) => {
        c"__fxstat64"
    };
}

xstat_hook!(__xstat, XSTAT, libc::stat, 0);
xstat_hook!(__xstat64, XSTAT64, libc::stat64, 0);
xstat_hook!(__lxstat, LXSTAT, libc::stat, libc::AT_SYMLINK_NOFOLLOW);
xstat_hook!(
    __lxstat64,
    LXSTAT64,
    libc::stat64,
    libc::AT_SYMLINK_NOFOLLOW
);

macro_rules! fxstatat_hook {
    ($name:ident, $slot:ident, $st:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ver: c_int,
            dirfd: c_int,
            path: *const c_char,
            buf: *mut $st,
            flags: c_int,
        ) -> c_int {
            let buf = buf.cast::<libc::stat>();
            let pass = |d: c_int, p: *const c_char| {
                if d == dirfd && p == path {
                    real!($slot as FxstatatFn, stringify_c!($name), (ver, d, p, buf, flags) or -1)
                } else {
                    sys::raw_stat(d, p, buf, flags)
                }
            };
            if ver != STAT_VER {
                return pass(dirfd, path);
            }
            stat_at(dirfd, path, flags, Out::Stat(buf), pass)
        }
    };
}
fxstatat_hook!(__fxstatat, FXSTATAT, libc::stat);
fxstatat_hook!(__fxstatat64, FXSTATAT64, libc::stat64);

macro_rules! fxstat_hook {
    ($name:ident, $slot:ident, $st:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(ver: c_int, fd: c_int, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            let pass = || real!($slot as FxstatFn, stringify_c!($name), (ver, fd, buf) or -1);
            if ver != STAT_VER {
                return pass();
            }
            fstat_of(fd, buf, pass)
        }
    };
}
fxstat_hook!(__fxstat, FXSTAT, libc::stat);
fxstat_hook!(__fxstat64, FXSTAT64, libc::stat64);

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    access_at(libc::AT_FDCWD, path, mode, 0, |d, p| {
        if d == libc::AT_FDCWD && p == path {
            real!(ACCESS as AccessFn, (p, mode)
                else sys::sys!(libc::SYS_faccessat, d, p, mode) as c_int)
        } else {
            real!(FACCESSAT as FaccessatFn, (d, p, mode, 0)
                else sys::sys!(libc::SYS_faccessat, d, p, mode) as c_int)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    access_at(dirfd, path, mode, flags, |d, p| {
        real!(FACCESSAT as FaccessatFn, (d, p, mode, flags)
            else sys::sys!(libc::SYS_faccessat2, d, p, mode, flags) as c_int)
    })
}

type FstatfsFn = unsafe extern "C" fn(c_int, *mut libc::statfs) -> c_int;

macro_rules! fstatfs_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut libc::statfs) -> c_int {
            match stat::fstatfs(fd, buf) {
                Detour::Answer(r) => r,
                Detour::Fail(e) => fail(e),
                Detour::Bypass(why, ()) => {
                    why.log_fd(b"fstatfs", fd);
                    real!($slot as FstatfsFn, (fd, buf)
                        else sys!(libc::SYS_fstatfs, fd, buf) as c_int)
                }
            }
        }
    };
}
fstatfs_hook!(fstatfs, FSTATFS);
fstatfs_hook!(fstatfs64, FSTATFS64);
