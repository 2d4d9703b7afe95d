//! What granary does for the stat family (`stat`, `lstat`, `fstatat`, `statx`, the `__xstat`
//! aliases), `fstat` of the fds it opened, `access`/`faccessat` and `fstatfs`.
//!
//! A positive answer comes from the catalog only when the kernel's answer would be the same;
//! everything else (misses, stale entries, W_OK) goes to the real call, so errors are always
//! the kernel's own.

use core::ffi::{c_char, c_int};

use granary_shm::{job, EntryRec, State};

use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::fds::tracked;
use crate::ops::detour::{self, Bypass, Detour, Guard};
use crate::ops::lookup;
use crate::ops::path::Buf;
use crate::sys::statbuf::Out;
use crate::sys::{self, sys};

/// Answers a stat of fd `fd` when granary opened it on a tier copy: the source's fields from the
/// catalog. `Err`: ask the kernel (every other fd is the kernel's to describe, real directory
/// fds included). A copy of a file the program has since changed in place is described by the
/// source: the fd moves there, or the source path is asked.
fn fd_answer(g: &Guard, fd: c_int, out: Out) -> Result<c_int, Bypass> {
    let mut t = fdtable::peek(fd).ok_or(Bypass::Untracked)?;
    // A copy opened unchecked: `fstat` fills what the check needs (it is made below, with the
    // kernel's answer); a `statx` may not, so it checks first.
    let check_after = t.has(flag::UNCHECKED) && matches!(out, Out::Stat(_));
    if t.has(flag::UNCHECKED) && !check_after {
        t = tracked::confirm(fd, t).ok_or(Bypass::Untracked)?;
    }
    match t.kind {
        FdKind::Tier(_) => {}
        FdKind::Pack => return extracted_answer(g, fd, t, out),
        // A tree that exists only in the pack: the directory fd is a stand-in.
        FdKind::Dir if g.table.pack_mount() => {
            let entry = g.table.entry(t.entry).ok_or(UNREADABLE)?;
            let w = match out.kernel_answer(fd) {
                Ok(w) => w,
                Err(r) => return Ok(r),
            };
            w.overwrite(&entry.stat);
            g.count(job::CATALOG_META, 1);
            return Ok(0);
        }
        _ => return Err(Bypass::OnSource),
    }
    let entry = lookup::entry(g.table, t.entry).ok_or(UNREADABLE)?;
    let stale =
        |t: &Tracked| t.has(flag::DAMAGED) || g.table.state(t.entry).state() == State::Stale;
    if !check_after && stale(&t) {
        return stale_answer(g, fd, t, &entry, out);
    }
    let w = match out.kernel_answer(fd) {
        Ok(w) => w,
        Err(r) => return Ok(r),
    };
    if let (true, Some(st)) = (check_after, w.stat()) {
        // `None`: the number names something else now; the kernel's answer stands.
        let Some(now) = tracked::confirm_with(fd, t, &st) else {
            return Ok(0);
        };
        t = now;
        if !matches!(t.kind, FdKind::Tier(_)) {
            // The copy failed and the source was put under the fd: the kernel describes it.
            return Err(Bypass::CopyUnusable);
        }
        if stale(&t) {
            return stale_answer(g, fd, t, &entry, out);
        }
    }
    let (copy_ino, _) = g.table.copy_identity(t.entry);
    if w.ino != copy_ino {
        // Not our copy any more (the number was closed and reused behind our back).
        fdtable::take(fd);
        return Ok(0);
    }
    w.overwrite(&entry.stat);
    g.count(job::CATALOG_META, 1);
    Ok(0)
}

/// An entry record that cannot be read (a damaged table).
const UNREADABLE: Bypass = Bypass::Catalog(granary_shm::Miss::Unprovable);

/// A file extracted from the pack into memory (`pack::extract`): described by the catalog,
/// while the fd is still that memory file (the number may have been closed and reused behind
/// our back).
fn extracted_answer(g: &Guard, fd: c_int, t: Tracked, out: Out) -> Result<c_int, Bypass> {
    let entry = g.table.entry(t.entry).ok_or(UNREADABLE)?;
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0
        || !crate::pack::is_extracted(st.st_nlink, st.st_mode, st.st_size, &entry)
    {
        fdtable::take(fd);
        return Err(Bypass::Untracked);
    }
    let w = match out.kernel_answer(fd) {
        Ok(w) => w,
        Err(r) => return Ok(r),
    };
    w.overwrite(&entry.stat);
    g.count(job::CATALOG_META, 1);
    Ok(0)
}

/// A copy the program changed in place: described by the source (the fd moved there, or its
/// path asked).
fn stale_answer(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec, out: Out) -> Result<c_int, Bypass> {
    if fdtable::lock(fd) {
        let moved = crate::fds::switch::to_source(g, fd, t, e);
        fdtable::unlock(fd);
        if moved {
            return Err(Bypass::OnSource);
        }
    }
    let mut buf = Buf::new();
    let p = crate::ops::path::entry_path(g.table, t.entry, &mut buf).ok_or(Bypass::OnSource)?;
    Ok(match out {
        Out::Stat(st) => sys::raw_stat(libc::AT_FDCWD, p, st, 0),
        Out::Statx(mask, sx) => sys!(libc::SYS_statx, libc::AT_FDCWD, p, 0, mask, sx) as c_int,
    })
}

/// The stat family on `(dirfd, path)` with `flags` (`AT_EMPTY_PATH` and "": the fd `dirfd`),
/// answered into `out`. A bypass holds the guard across the real call.
pub fn stat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    out: Out,
) -> Detour<c_int, Option<Guard>> {
    if flags & libc::AT_EMPTY_PATH != 0
        && crate::ops::path::bytes(path).is_some_and(|p| p.is_empty())
    {
        let g = match detour::enter_any_creds() {
            Ok(g) => g,
            Err(why) => return Detour::Bypass(why, None),
        };
        return match fd_answer(&g, dirfd, out) {
            Ok(r) => Detour::Answer(r),
            Err(why) => Detour::Bypass(why, Some(g)),
        };
    }
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, None),
    };
    let mut buf = Buf::new();
    let loc = lookup::locate(&g, dirfd, path, &mut buf);
    if loc.rel.is_none() {
        return Detour::Bypass(Bypass::Outside, Some(g));
    }
    let why = match lookup::find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
        Ok(f) if out.store(&f.entry.stat) => {
            g.count(job::CATALOG_META, 1);
            return Detour::Answer(0);
        }
        Ok(_) => Bypass::BadBuffer,
        Err(why) => why,
    };
    g.count(job::SOURCE_META, 1);
    Detour::Bypass(why, Some(g))
}

/// `fstat` of `fd` into `out`.
pub fn fstat(fd: c_int, out: Out) -> Detour<c_int, Option<Guard>> {
    if fdtable::peek(fd).is_none() {
        return Detour::Bypass(Bypass::Untracked, None);
    }
    let g = match detour::enter_any_creds() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, None),
    };
    match fd_answer(&g, fd, out) {
        Ok(r) => Detour::Answer(r),
        Err(why) => Detour::Bypass(why, Some(g)),
    }
}

/// `access`/`faccessat` from the catalog where it is exact for this process (whose credentials
/// are the agent's, `creds`): existence; read and search of a directory the walk listed; read of
/// a file the agent placed (it opened it with these credentials, and its identity — mode, ACLs:
/// ctime — has not changed since). Everything else, W_OK included, is the kernel's.
pub fn access(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> Detour<c_int, Option<Guard>> {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, None),
    };
    let mut buf = Buf::new();
    let loc = lookup::locate(&g, dirfd, path, &mut buf);
    if loc.rel.is_none() {
        return Detour::Bypass(Bypass::Outside, Some(g));
    }
    let known_flags = flags & !(libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW) == 0;
    let why = if known_flags && mode & !(libc::R_OK | libc::X_OK) == 0 {
        match lookup::find(&g, &loc, flags & libc::AT_SYMLINK_NOFOLLOW == 0) {
            Ok(f) => {
                let placed = g.table.state(f.idx).state() == State::Placed;
                // A tree that exists only in the pack has nobody else to ask: its mode bits say.
                let mount = g.table.pack_mount() && crate::pack::may(&f.entry.stat, mode);
                let granted = match mode {
                    0 => true,
                    _ if f.entry.stat.is_dir() => true,
                    libc::R_OK => placed || mount,
                    _ => mount,
                };
                if granted {
                    g.count(job::CATALOG_META, 1);
                    return Detour::Answer(0);
                }
                Bypass::KernelDecides
            }
            Err(why) => why,
        }
    } else {
        Bypass::Flags
    };
    g.count(job::SOURCE_META, 1);
    Detour::Bypass(why, Some(g))
}

/// `fstatfs` of `fd` into `buf`: a tier fd's file system is the tier's, and the program asked
/// about the source's.
pub fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> Detour<c_int> {
    match tracked::get(fd) {
        Some(t) if matches!(t.kind, FdKind::Tier(_)) => {
            let mut pbuf = Buf::new();
            match detour::table()
                .and_then(|tb| crate::ops::path::entry_path(tb, t.entry, &mut pbuf))
            {
                Some(p) => Detour::Answer(sys!(libc::SYS_statfs, p, buf) as c_int),
                None => Detour::Bypass(Bypass::OnSource, ()),
            }
        }
        Some(_) => Detour::Bypass(Bypass::OnSource, ()),
        None => Detour::Bypass(Bypass::Untracked, ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture, PLACED, UNPLACED};
    use granary_shm::Miss;

    fn answered<T>(d: Detour<c_int, T>) -> c_int {
        match d {
            Detour::Answer(r) => r,
            Detour::Fail(e) => panic!("failed with errno {e}"),
            Detour::Bypass(why, _) => panic!("passed through: {why:?}"),
        }
    }

    fn why<T, U>(d: Detour<T, U>) -> Bypass {
        match d {
            Detour::Bypass(why, _) => why,
            _ => panic!("answered"),
        }
    }

    #[test]
    fn stat_answers_with_the_catalogs_record() {
        let f = fixture();
        let mut st = sys::empty_stat();
        let p = f.path(UNPLACED);
        assert_eq!(
            answered(stat(libc::AT_FDCWD, p.as_ptr(), 0, Out::Stat(&mut st))),
            0
        );
        let e = f.table.entry(f.idx(UNPLACED)).unwrap();
        assert_eq!((st.st_ino, st.st_size as u64), (e.stat.ino, e.stat.size));
        assert_eq!(st.st_mtime, e.stat.mtime.sec);
        // The kernel's answer, for the record: the same file.
        let mut real = sys::empty_stat();
        assert_eq!(sys::raw_stat(libc::AT_FDCWD, p.as_ptr(), &mut real, 0), 0);
        assert_eq!(
            (st.st_dev, st.st_ino, st.st_mode),
            (real.st_dev, real.st_ino, real.st_mode)
        );
        // A symlink: followed by stat, itself for lstat.
        let l = f.path("link");
        assert_eq!(
            answered(stat(libc::AT_FDCWD, l.as_ptr(), 0, Out::Stat(&mut st))),
            0
        );
        assert_eq!(st.st_ino, f.table.entry(f.idx("a.txt")).unwrap().stat.ino);
        let nofollow = libc::AT_SYMLINK_NOFOLLOW;
        assert_eq!(
            answered(stat(
                libc::AT_FDCWD,
                l.as_ptr(),
                nofollow,
                Out::Stat(&mut st)
            )),
            0
        );
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
    }

    #[test]
    fn stat_passes_through_what_the_catalog_cannot_answer() {
        let f = fixture();
        let mut st = sys::empty_stat();
        let out = Out::Stat(&mut st);
        let changed = f.path("changed.txt");
        assert_eq!(
            why(stat(libc::AT_FDCWD, changed.as_ptr(), 0, out)),
            Bypass::Catalog(Miss::Void)
        );
        let missing = f.path("train/none");
        let missed = why(stat(libc::AT_FDCWD, missing.as_ptr(), 0, out));
        assert_eq!(missed, Bypass::Catalog(Miss::NotCatalogued));
        // A buffer the kernel would refuse (EFAULT) is the kernel's to refuse.
        let bad = Out::Stat(core::ptr::dangling_mut::<libc::stat>());
        let p = f.path(UNPLACED);
        assert_eq!(
            why(stat(libc::AT_FDCWD, p.as_ptr(), 0, bad)),
            Bypass::BadBuffer
        );
        assert_eq!(why(fstat(0, out)), Bypass::Untracked);
    }

    #[test]
    fn fstat_of_a_copy_describes_the_source_file() {
        let f = fixture();
        let p = f.path(PLACED);
        let Detour::Answer(fd) = crate::ops::open::open(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            None,
        ) else {
            panic!("a placed file opens its copy");
        };
        let mut st = sys::empty_stat();
        assert_eq!(answered(fstat(fd, Out::Stat(&mut st))), 0);
        let e = f.table.entry(f.idx(PLACED)).unwrap();
        assert_eq!((st.st_ino, st.st_mode), (e.stat.ino, e.stat.mode));
        // The first fstat made the copy's deferred check.
        assert!(!fdtable::peek(fd).unwrap().has(flag::UNCHECKED));
        fdtable::take(fd);
        sys::raw_close(fd);
    }

    #[test]
    fn access_grants_what_the_catalog_proves() {
        let f = fixture();
        let at = |rel: &str, mode| access(libc::AT_FDCWD, f.path(rel).as_ptr(), mode, 0);
        assert_eq!(answered(at(UNPLACED, libc::F_OK)), 0);
        assert_eq!(answered(at(PLACED, libc::R_OK)), 0);
        assert_eq!(answered(at("train", libc::R_OK | libc::X_OK)), 0);
        // Read of a file no copy vouches for, and any write: the kernel's.
        assert_eq!(why(at(UNPLACED, libc::R_OK)), Bypass::KernelDecides);
        assert_eq!(why(at(PLACED, libc::W_OK)), Bypass::Flags);
    }
}
