//! The stat family, `fstat` on tracked fds, and `access`/`faccessat`.
//!
//! A positive answer comes from the catalog only when the kernel's answer would be the same;
//! everything else (misses, stale entries, W_OK, unknown `_STAT_VER`) goes to the real call, so
//! errors are always the kernel's own.

use core::ffi::{c_char, c_int, c_uint, c_void};

use granary_shm::{job, StatRec};

use super::{find, locate};
use crate::detour::{self, real, Guard, KeepErrno};
use crate::fdtable::{self, Kind};
use crate::path::Bufs;
use crate::{config, fill, perm};

/// Where an answer goes.
#[derive(Clone, Copy)]
enum Out {
    Stat(*mut libc::stat),
    Statx(u32, *mut libc::statx),
}

impl Out {
    fn fill(self, s: &StatRec) -> bool {
        match self {
            Out::Stat(p) if !p.is_null() => {
                // SAFETY: libc's contract: the caller passes a writable struct stat (stat64 has
                // the same layout on our targets).
                fill::stat(s, unsafe { &mut *p });
                true
            }
            Out::Statx(mask, p) if !p.is_null() => {
                // SAFETY: as above, a writable struct statx.
                fill::statx(s, mask, unsafe { &mut *p });
                true
            }
            _ => false,
        }
    }
}

/// Answers a stat of fd `fd` from the catalog when granary opened it for a tier copy or a
/// catalogued directory; `None` means: ask the kernel. A file opened on the source is the
/// kernel's to describe.
fn fd_answer(g: &Guard, fd: c_int, out: Out) -> Option<c_int> {
    let t = fdtable::get(fd)?;
    if t.kind == Kind::Source {
        return None;
    }
    let entry = g.table.entry(t.entry)?;
    // Make sure the fd still is what we opened: one fstat, as the caller would have paid anyway.
    let _keep = KeepErrno::new();
    let mut st = detour::empty_stat();
    if detour::raw_fstat(fd, &mut st) != 0 {
        return None;
    }
    let same = match t.kind {
        Kind::Dir => config::is_shadow(&st),
        _ => st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size as u64 == entry.stat.size,
    };
    if !same {
        fdtable::clear(fd);
        return None;
    }
    if !out.fill(&entry.stat) {
        return None;
    }
    g.count(job::CATALOG_META, 1);
    Some(0)
}

fn stat_impl(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    out: Out,
    pass: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = detour::enter() else {
        return pass(dirfd, path);
    };
    if flags & libc::AT_EMPTY_PATH != 0 && crate::path::bytes(path).is_some_and(|p| p.is_empty()) {
        return match fd_answer(&g, dirfd, out) {
            Some(r) => r,
            None => pass(dirfd, path),
        };
    }
    let mut bufs = Bufs::new();
    let loc = locate(&g, dirfd, path, &mut bufs);
    let (d, p) = loc.pass_args(dirfd, path);
    if loc.rel.is_none() {
        return pass(d, p);
    }
    if let Some(f) = find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
        if out.fill(&f.entry.stat) {
            g.count(job::CATALOG_META, 1);
            return 0;
        }
    }
    super::source_meta(&g, b"stat", &loc);
    pass(d, p)
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

fn raw_stat(d: c_int, p: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    detour::raw_newfstatat(d, p, buf.cast::<c_void>(), flags)
}

macro_rules! stat_hook {
    ($name:ident, $slot:ident, $st:ty, $flags:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            stat_impl(libc::AT_FDCWD, path, $flags, Out::Stat(buf), |d, p| {
                if d == libc::AT_FDCWD && p == path {
                    real!($slot as StatFn, (p, buf) else raw_stat(d, p, buf, $flags))
                } else {
                    real!(FSTATAT as FstatatFn, (d, p, buf, $flags) else raw_stat(d, p, buf, $flags))
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
            stat_impl(dirfd, path, flags, Out::Stat(buf), |d, p| {
                real!($slot as FstatatFn, (d, p, buf, flags) else raw_stat(d, p, buf, flags))
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
    stat_impl(dirfd, path, flags, Out::Statx(mask, buf), |d, p| {
        real!(STATX as StatxFn, (d, p, flags, mask, buf)
            else detour::sys!(libc::SYS_statx, d, p, flags, mask, buf) as c_int)
    })
}

fn fstat_impl(fd: c_int, buf: *mut libc::stat, pass: impl FnOnce() -> c_int) -> c_int {
    if fdtable::get(fd).is_none() {
        return pass();
    }
    let Some(g) = detour::enter() else {
        return pass();
    };
    fd_answer(&g, fd, Out::Stat(buf)).unwrap_or_else(pass)
}

macro_rules! fstat_hook {
    ($name:ident, $slot:ident, $st:ty) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut $st) -> c_int {
            let buf = buf.cast::<libc::stat>();
            fstat_impl(fd, buf, || {
                real!($slot as FstatFn, (fd, buf) else detour::raw_fstat(fd, buf))
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
                    raw_stat(d, p, buf, $flags)
                }
            };
            if ver != STAT_VER {
                return pass(libc::AT_FDCWD, path);
            }
            stat_impl(libc::AT_FDCWD, path, $flags, Out::Stat(buf), pass)
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
                    raw_stat(d, p, buf, flags)
                }
            };
            if ver != STAT_VER {
                return pass(dirfd, path);
            }
            stat_impl(dirfd, path, flags, Out::Stat(buf), pass)
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
            fstat_impl(fd, buf, pass)
        }
    };
}
fxstat_hook!(__fxstat, FXSTAT, libc::stat);
fxstat_hook!(__fxstat64, FXSTAT64, libc::stat64);

fn access_impl(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
    pass: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = detour::enter() else {
        return pass(dirfd, path);
    };
    let mut bufs = Bufs::new();
    let loc = locate(&g, dirfd, path, &mut bufs);
    let (d, p) = loc.pass_args(dirfd, path);
    if loc.rel.is_none() {
        return pass(d, p);
    }
    // Write permission depends on more than mode bits (read-only mounts, immutable files).
    let certain = mode & !(libc::R_OK | libc::X_OK) == 0
        && flags & !(libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW) == 0;
    if certain {
        if let Some(f) = find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
            let want = (mode as u32) & (perm::R | perm::X);
            if want == 0 || perm::certain(&f.entry.stat, want) {
                g.count(job::CATALOG_META, 1);
                return 0;
            }
        }
    }
    super::source_meta(&g, b"access", &loc);
    pass(d, p)
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    access_impl(libc::AT_FDCWD, path, mode, 0, |d, p| {
        if d == libc::AT_FDCWD && p == path {
            real!(ACCESS as AccessFn, (p, mode)
                else detour::sys!(libc::SYS_faccessat, d, p, mode) as c_int)
        } else {
            real!(FACCESSAT as FaccessatFn, (d, p, mode, 0)
                else detour::sys!(libc::SYS_faccessat, d, p, mode) as c_int)
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
    access_impl(dirfd, path, mode, flags, |d, p| {
        real!(FACCESSAT as FaccessatFn, (d, p, mode, flags)
            else detour::sys!(libc::SYS_faccessat2, d, p, mode, flags) as c_int)
    })
}
