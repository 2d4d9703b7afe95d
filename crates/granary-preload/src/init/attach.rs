//! How a process of the job reaches its catalog table, and what it can see of the job from where
//! it runs. A container may give the program its own `/dev/shm` (where the table's path lives),
//! leave a tier or the source unbound, or bind the source at another path.
//!
//! `granary run` hands the table over twice: as an fd inherited across `exec`
//! (`GRANARY_TABLE_FD`, opened read-write without close-on-exec at a high number) and as a path
//! (`GRANARY_TABLE`), with the table's identity (`GRANARY_TABLE_ID=dev:ino`). The fd reaches into
//! any container started by fork and exec, whatever its `/dev/shm`; the path serves processes
//! started by a parent that closed the fd. Either way the file must be a regular file of ours,
//! closed to others, and (when the identity is given) exactly the job's table: nobody else's table.
//!
//! The fd is kept open for the children: a program closing all its fds before starting one
//! (`subprocess` with `close_fds`, a forkserver) leaves it open (`is_table_fd`), so children in a
//! container keep reaching the table.
//!
//! What a process cannot see is recorded in its job's `SEEN` word, so `granary run` can say why
//! the job was not served: a tier whose directory is not the agent's one at its path, a source
//! root that is not the catalogued directory (then this process passes everything through: the
//! catalog describes a directory the process does not see).

use core::ffi::{c_char, c_int};
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use granary_shm::{job, seen, Mapping, Table};

use crate::sys::env::{parse_u32, parse_u64, var as env, var_ptr as env_ptr};
use crate::sys::PATH_BUF;
use crate::sys::{self, sys};

/// The inherited table fd this process keeps open for its children; -1 when none.
static TABLE_FD: AtomicI32 = AtomicI32::new(-1);
/// `(st_dev, st_ino)` of the table this process mapped.
static TABLE_DEV: AtomicU64 = AtomicU64::new(0);
static TABLE_INO: AtomicU64 = AtomicU64::new(0);

/// True when `GRANARY_TABLE_ID`'s value `id` names another table than this process's (a
/// nested `granary run` giving its program its own job).
pub fn names_another_table(id: &[u8]) -> bool {
    parse_id(id).is_some_and(|id| {
        id != (
            TABLE_DEV.load(Ordering::Relaxed),
            TABLE_INO.load(Ordering::Relaxed),
        )
    })
}

/// True for the fd that carries the table to this process's children: a program's close of it
/// (or of a range holding it) leaves it open.
#[inline]
pub fn is_table_fd(fd: c_int) -> bool {
    fd >= 0 && TABLE_FD.load(Ordering::Relaxed) == fd
}

/// The table fd's number, -1 when none.
pub fn table_fd() -> c_int {
    TABLE_FD.load(Ordering::Relaxed)
}

/// The program put another file at the table fd's number (`dup2` onto it): it is no longer ours.
pub fn replaced(fd: c_int) {
    let _ = TABLE_FD.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
}

/// The job's table, from the inherited fd or else the path; `fd_lost` when an fd was named
/// but could not be used.
pub struct Found {
    pub table: Table,
    pub fd_lost: bool,
}

/// Finds and maps the table named by the environment. `Err` says why not (for the log).
pub fn table() -> Result<Found, &'static [u8]> {
    let id = env(c"GRANARY_TABLE_ID").and_then(parse_id);
    let mut fd_lost = false;
    if let Some(fd) = env(c"GRANARY_TABLE_FD").and_then(parse_u32) {
        let fd = fd as c_int;
        match map_fd(fd, id) {
            Ok(table) => {
                TABLE_FD.store(fd, Ordering::Relaxed);
                return Ok(Found {
                    table,
                    fd_lost: false,
                });
            }
            Err(_) => fd_lost = true,
        }
    }
    let path = env_ptr(c"GRANARY_TABLE").ok_or(&b"no GRANARY_TABLE"[..])?;
    let table = map_path(path, id)?;
    Ok(Found { table, fd_lost })
}

fn map_path(path: *const c_char, id: Option<(u64, u64)>) -> Result<Table, &'static [u8]> {
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        path,
        libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        return Err(b"cannot open GRANARY_TABLE (a container with its own /dev/shm?)");
    }
    let r = map_fd(fd, id);
    sys::raw_close(fd);
    r
}

/// Maps the table open at `fd`: a regular file of ours that nobody else may write, and the
/// job's own when its identity is known.
fn map_fd(fd: c_int, id: Option<(u64, u64)>) -> Result<Table, &'static [u8]> {
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 {
        return Err(b"table fd not open");
    }
    let euid = sys!(libc::SYS_geteuid) as u32;
    let ours =
        st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == euid && st.st_mode & 0o022 == 0;
    if !ours {
        return Err(b"the table is not a regular file of ours, closed to others");
    }
    if id.is_some_and(|id| id != (st.st_dev, st.st_ino)) {
        return Err(b"not the job's table (GRANARY_TABLE_ID differs)");
    }
    let (mapping, table) =
        Mapping::map(fd, st.st_size as usize).map_err(|_| &b"invalid table"[..])?;
    mapping.leak();
    if !table.is_valid() {
        return Err(b"table withdrawn by the agent");
    }
    TABLE_DEV.store(st.st_dev, Ordering::Relaxed);
    TABLE_INO.store(st.st_ino, Ordering::Relaxed);
    Ok(table)
}

/// `dev:ino` in decimal.
fn parse_id(s: &[u8]) -> Option<(u64, u64)> {
    let colon = s.iter().position(|&b| b == b':')?;
    Some((parse_u64(s.get(..colon)?)?, parse_u64(s.get(colon + 1..)?)?))
}

/// True when this process is in the mount namespace `granary run` started the program in
/// (`GRANARY_MNT_NS`, the inode of `/proc/self/ns/mnt`): it sees the source and the tiers where
/// the agent does, and checking them would cost a metadata call on the source per process.
pub fn same_mount_ns() -> bool {
    let Some(want) = env(c"GRANARY_MNT_NS").and_then(parse_u64) else {
        return false;
    };
    let mut st = sys::empty_stat();
    let r = sys::raw_newfstatat(
        libc::AT_FDCWD,
        c"/proc/self/ns/mnt".as_ptr(),
        (&mut st as *mut libc::stat).cast(),
        0,
    );
    r == 0 && st.st_ino == want
}

/// `(st_dev, st_ino)` of what `path` names (following links), if anything.
fn dev_ino(path: &[u8]) -> Option<(u64, u64)> {
    let mut buf = [0u8; PATH_BUF];
    buf.get_mut(..path.len())?.copy_from_slice(path);
    *buf.get_mut(path.len())? = 0;
    let mut st = sys::empty_stat();
    let r = sys::raw_newfstatat(
        libc::AT_FDCWD,
        buf.as_ptr().cast(),
        (&mut st as *mut libc::stat).cast(),
        0,
    );
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// `(st_dev, st_ino)` of the catalogued source root.
fn root_id(table: &Table) -> Option<(u64, u64)> {
    let root = table.entry(0)?;
    Some((
        libc::makedev(root.stat.dev_major, root.stat.dev_minor),
        root.stat.ino,
    ))
}

/// The spellings of the source root this process takes for the catalogued root, each proven by
/// one `stat` of it now (none for the real root's path, which the agent validates): the
/// table's — kept only while it still leads there (a symlink retargeted since the table was
/// made names another directory, whose files the catalog's copies are not) — and the job's
/// own, `GRANARY_SOURCE`, when it is neither of the table's (a job naming the source through a
/// symlink, served by a table made for a job that named the real path, or another symlink).
/// An unproven spelling is a path outside the source: passed through.
pub fn check_spellings(table: &mut Table) {
    let Some(want) = root_id(table) else {
        table.forget_spelling();
        return;
    };
    if table.source_root() != table.source_real_root() && dev_ino(table.source_root()) != Some(want)
    {
        table.forget_spelling();
        crate::sys::log::line(&[
            b"the table's spelling of the source no longer leads to it: not taken: ",
            table.source_root(),
        ]);
    }
    if let Some(job) = env(c"GRANARY_SOURCE") {
        let other = job != table.source_root() && job != table.source_real_root();
        if other && dev_ino(job) == Some(want) {
            crate::ops::path::set_job_root(table, job);
        }
    }
}

/// True when this process sees the catalogued source root at its path. When it does not, the
/// job learns why (`SOURCE_HIDDEN`, and `SOURCE_ELSEWHERE` when a mount point shows it).
pub fn sees_source(table: &Table, slot: u32) -> bool {
    let (Some(root), Some(want)) = (table.entry(0), root_id(table)) else {
        return false;
    };
    let at = |p: &[u8]| !p.is_empty() && dev_ino(p) == Some(want);
    // The job's spelling was proven so already (`check_spellings`).
    if crate::ops::path::job_root().is_some()
        || at(table.source_root())
        || at(table.source_real_root())
    {
        return true;
    }
    let mut bits = seen::SOURCE_HIDDEN;
    if crate::sys::mounts::shows(root.stat.dev_major, root.stat.dev_minor, want) {
        bits |= seen::SOURCE_ELSEWHERE;
    }
    table.mark(slot, job::SEEN, bits);
    false
}

/// Records each tier whose object directory is not the agent's at its path (copies on it are
/// then read from the source instead).
pub fn check_tiers(table: &Table, slot: u32) {
    let mut hidden = 0u64;
    for t in 0..table.tier_count() {
        let (Some(id), Some(path)) = (table.tier_dir_id(t), table.tier_dir(t)) else {
            continue;
        };
        if id.1 != 0 && dev_ino(path) != Some(id) {
            hidden |= seen::TIER_HIDDEN << t;
        }
    }
    if hidden != 0 {
        table.mark(slot, job::SEEN, hidden);
    }
}
