//! LMDB's lock file, node-local (the *ownlock* of Stanovnik et al.'s MPI-Caffe study, without
//! symlink farms or code changes).
//!
//! A read-only LMDB environment (`readonly=True`, with `lock=True`) still opens its lock file
//! (`lock.mdb`, or `<data>-lock` without a subdirectory) with `O_RDWR | O_CREAT` and writes its
//! reader table there: every reader of every node then shares one small file on the PFS — the
//! contention that stalled MPI-Caffe on FEFS (Stanovnik et al.). The lock file only coordinates
//! readers with a writer; while nobody writes the data file, readers need no one but each other.
//!
//! So while the data file is a catalogued, validated LMDB data file (its meta page says so) that
//! no process of the job opened for writing, the open is given a lock file of granary's in tier
//! 0's object directory, one per environment (named after the data file's object), shared by
//! every process of the node: LMDB's own protocol (its `fcntl` lock on byte 0, its reader table)
//! runs there unchanged and initialises it on first use. Once a process opened the data file for
//! writing (the entry is void), a lock file still in use by some process of the node (LMDB holds
//! a read lock on its first byte for as long as an environment is open) keeps being given out,
//! so the writer and the readers already there see each other's transactions; when none holds it
//! any more, the source's lock file is opened again (the shared lock, as without granary).
//!
//! The source's lock file is never written by granary's readers; an open that would fail on the
//! source (no write permission, a read-only file system: LMDB then runs without a lock file) is
//! left to fail there. A writer on another node, or a process outside the job, is not seen
//! (docs/reliability.md).

use core::ffi::{c_char, c_int};

use granary_shm::{object_name, request};

use crate::ops::detour::Guard;
use crate::sys::PATH_BUF;
use crate::sys::{self, sys, KeepErrno};

/// `MDB_MAGIC`, the first word of an LMDB meta page after its 16-byte page header.
const MDB_MAGIC: u32 = 0xBEEF_C0DE;
const LOCK_SUFFIX: &[u8] = b".lmdb-lock";

/// The open of `(dirfd, path)` with `flags`, if it is an LMDB lock file granary gives the
/// node-local lock file instead; `None`: the caller makes the real call.
pub fn lock_open(dirfd: c_int, path: *const c_char, flags: c_int) -> Option<c_int> {
    // 0o100000: the kernel's O_LARGEFILE, which glibc's headers call 0.
    let wanted = libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_LARGEFILE | 0o100000;
    if flags & libc::O_ACCMODE != libc::O_RDWR || flags & !wanted != 0 {
        return None;
    }
    let p = crate::ops::path::bytes(path)?;
    let name = p.rsplit(|&b| b == b'/').next()?;
    let data_name: &[u8] = if name == b"lock.mdb" {
        b"data.mdb"
    } else {
        name.strip_suffix(b"-lock").filter(|n| !n.is_empty())?
    };
    let g = crate::ops::detour::enter().ok()?;
    let _keep = KeepErrno::new();
    // The data file's path: the lock file's with its last component replaced.
    let mut data = [0u8; PATH_BUF];
    let dir_len = p.len() - name.len();
    data.get_mut(..dir_len)?.copy_from_slice(p.get(..dir_len)?);
    data.get_mut(dir_len..dir_len + data_name.len())?
        .copy_from_slice(data_name);
    *data.get_mut(dir_len + data_name.len())? = 0;
    let data_path: *const c_char = data.as_ptr().cast();
    let (idx, live) = data_entry(&g, dirfd, data_path)?;
    let entry = g.table.entry(idx)?;
    let mut lname = [0u8; 32];
    lname
        .get_mut(..16)?
        .copy_from_slice(&object_name(entry.object));
    lname
        .get_mut(16..16 + LOCK_SUFFIX.len())?
        .copy_from_slice(LOCK_SUFFIX);
    let lname = lname.get(..16 + LOCK_SUFFIX.len())?;
    if !live && !in_use(&g, lname) {
        return None;
    }
    if !source_would_open(dirfd, path, flags) {
        return None;
    }
    let fd = crate::fds::copies::open_own(g.table, 0, lname, flags)?;
    crate::fds::fdtable::take(fd);
    crate::fds::copies::forget(fd);
    g.table.push_request_arg(request::LMDB_LOCK, idx, g.slot);
    if crate::sys::log::enabled() {
        crate::sys::log::line(&[
            b"LMDB lock file node-local: ",
            g.table.name(&entry).unwrap_or(b"?"),
        ]);
    }
    Some(fd)
}

/// The data file's entry, and whether it is served as the catalog describes it (validated, not
/// opened for writing by the program); `None` when it is no catalogued LMDB data file.
fn data_entry(g: &Guard, dirfd: c_int, data_path: *const c_char) -> Option<(u32, bool)> {
    let mut buf = crate::ops::path::Buf::new();
    let loc = crate::ops::lookup::locate(g, dirfd, data_path, &mut buf);
    if let Ok(f) = crate::ops::lookup::find(g, &loc, true) {
        return (f.entry.stat.is_file() && is_lmdb(g, f.idx, &f.entry)).then_some((f.idx, true));
    }
    // Void (a writer appeared) or not ours: what the kernel finds there now.
    let idx = crate::ops::mutate::entry_at(g.table, dirfd, data_path, true)?;
    let void = g.table.state(idx).state().is_void();
    (void && g.table.entry(idx)?.stat.is_file()).then_some((idx, false))
}

/// The data file's first meta page carries LMDB's magic (read from the copy when there is one,
/// else from the source: the page LMDB reads next anyway).
fn is_lmdb(g: &Guard, idx: u32, e: &granary_shm::EntryRec) -> bool {
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    let fd = crate::fds::copies::open_copy(g, idx, e, flags)
        .map(|(fd, _, _)| fd)
        .or_else(|| crate::fds::switch::open_source(g, idx, e, flags));
    let Some(fd) = fd else {
        return false;
    };
    let yes = starts_as_data_file(fd);
    sys::raw_close(fd);
    yes
}

/// The file of `fd` starts with an LMDB meta page: its magic 16 bytes in (`pread` leaves the
/// fd's offset alone). A read that fails or comes short: not LMDB.
pub fn starts_as_data_file(fd: c_int) -> bool {
    let mut word = [0u8; 4];
    let n = sys!(libc::SYS_pread64, fd, word.as_mut_ptr(), 4, 16);
    n == 4 && u32::from_ne_bytes(word) == MDB_MAGIC
}

/// Some process holds a lock on the node-local lock file `name` (LMDB keeps a read lock on its
/// first byte while an environment is open).
fn in_use(g: &Guard, name: &[u8]) -> bool {
    let flags = libc::O_RDWR | libc::O_CLOEXEC;
    let Some(fd) = crate::fds::copies::open_own(g.table, 0, name, flags) else {
        return false;
    };
    let mut lk = sys::empty_flock();
    lk.l_type = libc::F_WRLCK as i16;
    lk.l_whence = libc::SEEK_SET as i16;
    lk.l_start = 0;
    lk.l_len = 1;
    let r = sys!(
        libc::SYS_fcntl,
        fd,
        libc::F_GETLK,
        &mut lk as *mut libc::flock
    );
    sys::raw_close(fd);
    r == 0 && lk.l_type != libc::F_UNLCK as i16
}

/// The source's lock file could be opened with `flags` by this process: it exists and is
/// readable and writable, or it does not and may be created in its directory. Otherwise the
/// real open fails (or LMDB runs without a lock file on a read-only file system) as it would
/// without granary.
fn source_would_open(dirfd: c_int, path: *const c_char, flags: c_int) -> bool {
    let rw = libc::R_OK | libc::W_OK;
    if sys!(libc::SYS_faccessat2, dirfd, path, rw, libc::AT_EACCESS) == 0 {
        return true;
    }
    if sys::errno() != libc::ENOENT || flags & libc::O_CREAT == 0 {
        return false;
    }
    // Created in its directory: write and search permission there.
    let p = match crate::ops::path::bytes(path) {
        Some(p) => p,
        None => return false,
    };
    let mut dir = [0u8; PATH_BUF];
    let dir_path: *const c_char = match p.iter().rposition(|&b| b == b'/') {
        None => c".".as_ptr(),
        Some(0) => c"/".as_ptr(),
        Some(i) => {
            match (dir.get_mut(..i), p.get(..i)) {
                (Some(d), Some(s)) => d.copy_from_slice(s),
                _ => return false,
            }
            dir.as_ptr().cast()
        }
    };
    let wx = libc::W_OK | libc::X_OK;
    sys!(libc::SYS_faccessat2, dirfd, dir_path, wx, libc::AT_EACCESS) == 0
}
