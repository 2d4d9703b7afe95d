//! The stat family, `fstat` on tracked fds, and `access`/`faccessat`.
//!
//! A positive answer comes from the catalog only when the kernel's answer would be the same;
//! everything else (misses, stale entries, W_OK, unknown `_STAT_VER`) goes to the real call, so
//! errors are always the kernel's own.

use core::ffi::{c_char, c_int, c_uint, c_void};

use granary_shm::{job, state, EntryRec, StatRec};

use super::{find, locate};
use crate::detour::Guard;
use crate::fdtable::{self, flag, FdKind, Tracked};
use crate::path::Buf;
use crate::sys::{self, real};
use crate::{statbuf, usermem};

/// Where an answer goes.
#[derive(Clone, Copy)]
enum Out {
    Stat(*mut libc::stat),
    Statx(u32, *mut libc::statx),
}

impl Out {
    /// Writes the catalog's answer into the program's buffer, as the kernel would: a buffer that
    /// is not writable is not a crash but a pass-through (the kernel then says EFAULT).
    fn store(self, s: &StatRec) -> bool {
        match self {
            Out::Stat(p) => {
                let mut st = sys::empty_stat();
                statbuf::stat(s, &mut st);
                usermem::write_value(p, &st)
            }
            Out::Statx(mask, p) => {
                // SAFETY: `struct statx` is plain integers; all-zero is a valid value.
                let mut sx: libc::statx = unsafe { core::mem::zeroed() };
                statbuf::statx(s, mask, &mut sx);
                usermem::write_value(p, &sx)
            }
        }
    }

    /// The kernel's answer for fd `fd` written into the program's buffer (so a bad buffer gets
    /// the kernel's EFAULT), then the copy's inode as the kernel saw it.
    fn kernel_answer(self, fd: c_int) -> Result<u64, c_int> {
        let r = match self {
            Out::Stat(p) => sys::raw_fstat(fd, p),
            Out::Statx(mask, p) => sys::sys!(
                libc::SYS_statx,
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                mask,
                p
            ) as c_int,
        };
        if r != 0 {
            return Err(r);
        }
        // SAFETY: the kernel just wrote the whole struct there, so it is mapped and writable.
        Ok(unsafe {
            match self {
                Out::Stat(p) => (*p).st_ino,
                Out::Statx(_, p) => (*p).stx_ino,
            }
        })
    }

    /// Overwrites a buffer the kernel just filled with the catalog's answer.
    fn overwrite(self, s: &StatRec) {
        // SAFETY: `kernel_answer` succeeded on this very buffer: it is mapped and writable.
        unsafe {
            match self {
                Out::Stat(p) => statbuf::stat(s, &mut *p),
                Out::Statx(mask, p) => statbuf::statx(s, mask, &mut *p),
            }
        }
    }
}

/// Answers a stat of fd `fd` when granary opened it on a tier copy: the source's fields from the
/// catalog. `None` means: ask the kernel (every other fd is the kernel's to describe, real
/// directory fds included). A copy of a file the program has since changed in place is
/// described by the source: the fd moves there, or the source path is asked.
fn fd_answer(g: &Guard, fd: c_int, out: Out) -> Option<c_int> {
    let mut t = fdtable::peek(fd)?;
    // A copy opened unchecked: `fstat` fills what the check needs (it is made below, with the
    // kernel's answer); a `statx` may not, so it checks first.
    let check_after = t.has(flag::UNCHECKED) && matches!(out, Out::Stat(_));
    if t.has(flag::UNCHECKED) && !check_after {
        t = crate::tracked::confirm(fd, t)?;
    }
    match t.kind {
        FdKind::Tier(_) => {}
        FdKind::Pack => return extracted_answer(g, fd, t, out),
        // A tree that exists only in the pack: the directory fd is a stand-in.
        FdKind::Dir if g.table.pack_mount() => {
            let entry = g.table.entry(t.entry)?;
            if let Err(r) = out.kernel_answer(fd) {
                return Some(r);
            }
            out.overwrite(&entry.stat);
            g.count(job::CATALOG_META, 1);
            return Some(0);
        }
        _ => return None,
    }
    let entry = crate::entries::get(g.table, t.entry)?;
    let stale = |t: &Tracked| {
        t.has(flag::DAMAGED) || state::state_of(g.table.state(t.entry)) == state::STALE
    };
    if !check_after && stale(&t) {
        return stale_answer(g, fd, t, &entry, out);
    }
    let ino = match out.kernel_answer(fd) {
        Ok(ino) => ino,
        Err(r) => return Some(r),
    };
    if let (true, Out::Stat(p)) = (check_after, out) {
        // SAFETY: the kernel just wrote the whole struct there, so it is mapped and readable.
        let st = unsafe { *p };
        // `None`: the number names something else now; the kernel's answer stands.
        let Some(now) = crate::tracked::confirm_with(fd, t, &st) else {
            return Some(0);
        };
        t = now;
        if !matches!(t.kind, FdKind::Tier(_)) {
            // The copy failed and the source was put under the fd: the kernel describes it.
            return None;
        }
        if stale(&t) {
            return stale_answer(g, fd, t, &entry, out);
        }
    }
    let (copy_ino, _) = g.table.copy_identity(t.entry);
    if ino != copy_ino {
        // Not our copy any more (the number was closed and reused behind our back).
        fdtable::take(fd);
        return Some(0);
    }
    out.overwrite(&entry.stat);
    g.count(job::CATALOG_META, 1);
    Some(0)
}

/// A file extracted from the pack into memory (`packed::extract`): described by the catalog,
/// while the fd is still that memory file (the number may have been closed and reused behind
/// our back).
fn extracted_answer(g: &Guard, fd: c_int, t: Tracked, out: Out) -> Option<c_int> {
    let entry = g.table.entry(t.entry)?;
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0
        || !crate::packed::is_extracted(st.st_nlink, st.st_mode, st.st_size, &entry)
    {
        fdtable::take(fd);
        return None;
    }
    if let Err(r) = out.kernel_answer(fd) {
        return Some(r);
    }
    out.overwrite(&entry.stat);
    g.count(job::CATALOG_META, 1);
    Some(0)
}

fn stale_answer(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec, out: Out) -> Option<c_int> {
    if fdtable::lock(fd) {
        let moved = crate::switch::to_source(g, fd, t, e);
        fdtable::unlock(fd);
        if moved {
            return None;
        }
    }
    let mut buf = Buf::new();
    let p = crate::path::entry_path(g.table, t.entry, &mut buf)?;
    Some(match out {
        Out::Stat(st) => raw_stat(libc::AT_FDCWD, p, st, 0),
        Out::Statx(mask, sx) => sys::sys!(libc::SYS_statx, libc::AT_FDCWD, p, 0, mask, sx) as c_int,
    })
}

fn stat_impl(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    out: Out,
    pass: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0 && crate::path::bytes(path).is_some_and(|p| p.is_empty()) {
        let Some(g) = crate::detour::enter_any_creds() else {
            return pass(dirfd, path);
        };
        return match fd_answer(&g, dirfd, out) {
            Some(r) => r,
            None => pass(dirfd, path),
        };
    }
    let Some(g) = crate::detour::enter() else {
        return pass(dirfd, path);
    };
    let mut buf = Buf::new();
    let loc = locate(&g, dirfd, path, &mut buf);
    if loc.rel.is_none() {
        return pass(dirfd, path);
    }
    if let Some(f) = find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
        if out.store(&f.entry.stat) {
            g.count(job::CATALOG_META, 1);
            return 0;
        }
    }
    super::source_meta(&g, b"stat", &loc);
    pass(dirfd, path)
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
    sys::raw_newfstatat(d, p, buf.cast::<c_void>(), flags)
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
            else sys::sys!(libc::SYS_statx, d, p, flags, mask, buf) as c_int)
    })
}

fn fstat_impl(fd: c_int, buf: *mut libc::stat, pass: impl FnOnce() -> c_int) -> c_int {
    if fdtable::peek(fd).is_none() {
        return pass();
    }
    let Some(g) = crate::detour::enter_any_creds() else {
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

/// `access`/`faccessat` from the catalog where it is exact for this process (whose credentials
/// are the agent's, `creds`): existence; read and search of a directory the walk listed; read of
/// a file the agent placed (it opened it with these credentials, and its identity — mode, ACLs:
/// ctime — has not changed since). Everything else, W_OK included, is the kernel's.
fn access_impl(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
    pass: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = crate::detour::enter() else {
        return pass(dirfd, path);
    };
    let mut buf = Buf::new();
    let loc = locate(&g, dirfd, path, &mut buf);
    if loc.rel.is_none() {
        return pass(dirfd, path);
    }
    let known_flags = flags & !(libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW) == 0;
    if known_flags && mode & !(libc::R_OK | libc::X_OK) == 0 {
        if let Some(f) = find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
            let placed = state::state_of(g.table.state(f.idx)) == state::PLACED;
            // A tree that exists only in the pack has nobody else to ask: its mode bits say.
            let mount = g.table.pack_mount() && crate::packed::may(&f.entry.stat, mode);
            let granted = match mode {
                0 => true,
                _ if f.entry.stat.is_dir() => true,
                libc::R_OK => placed || mount,
                _ => mount,
            };
            if granted {
                g.count(job::CATALOG_META, 1);
                return 0;
            }
        }
    }
    super::source_meta(&g, b"access", &loc);
    pass(dirfd, path)
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    access_impl(libc::AT_FDCWD, path, mode, 0, |d, p| {
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
    access_impl(dirfd, path, mode, flags, |d, p| {
        real!(FACCESSAT as FaccessatFn, (d, p, mode, flags)
            else sys::sys!(libc::SYS_faccessat2, d, p, mode, flags) as c_int)
    })
}
