//! Opening the agent's files in a tier (complete copies, `.part` files, chunk files) so that
//! nobody else's bytes are ever served:
//!
//! - only through a directory fd of the tier's object directory that this process verified once
//!   (a directory owned by us, closed to group and other, whose device and inode are the ones the
//!   agent recorded in the table), so no path component can be swapped under us;
//! - by a single name of our making with `O_NOFOLLOW` and `O_NONBLOCK`, so a symlink is never
//!   followed and a FIFO never blocks;
//! - and the opened fd is checked with `fstat`: a regular file, owned by us, mode 0600, on the
//!   tier's device, with the inode (and for a complete copy the ctime and size) the agent
//!   recorded when it wrote it. A copy damaged, truncated or replaced after placement fails this.
//!
//! The directory fds are the library's only long-lived fds (close-on-exec). A program that closes
//! one (its `close`/`dup2`/`close_range` reach `forget`) gets it reopened on the next use; one
//! closed behind our back (a raw syscall) and reused for another file is caught by the checks
//! above, never trusted.
//!
//! On top, an entry's files as the table records them: its complete copy (`open_copy`, checked
//! now; `open_copy_unchecked`, checked at the fd's first use by `tracked`) and its part or chunk
//! file (`open_recorded`).

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use granary_shm::layout::MAX_TIERS;
use granary_shm::{job, object_name, EntryRec, State, Table};

use crate::fds::fdtable::{self, flag};
use crate::ops::detour::Guard;
use crate::sys::log;
use crate::sys::PATH_BUF;
use crate::sys::{self, sys, KeepErrno};

static DIRS: [AtomicI32; MAX_TIERS] = [const { AtomicI32::new(-1) }; MAX_TIERS];

/// What the agent promised about a file it wrote.
pub struct Expect {
    pub ino: u64,
    /// ctime in ns; 0 = not checked (a `.part` file, still being written).
    pub ctime_ns: u64,
    /// Size; `None` = not checked (a `.part` or chunk file).
    pub size: Option<u64>,
}

/// Our effective uid without a system call: a process that consults the table has the agent's
/// credentials (`detour::creds_match`), which the table records.
fn our_euid(table: &Table) -> u32 {
    if crate::ops::detour::creds_match() {
        table.agent_creds().0
    } else {
        sys!(libc::SYS_geteuid) as u32
    }
}

fn verified(st: &libc::stat, dev: u64, ino: u64, euid: u32) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
        && st.st_mode & 0o077 == 0
        && st.st_uid == euid
        && st.st_dev == dev
        && st.st_ino == ino
}

/// Why a tier file was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not there, or not the file the agent wrote (or the tier's directory is not usable).
    NotCopy,
    /// No fd to spare (`EMFILE`, `ENFILE`): says nothing about the copy. The tier's directory
    /// fd has been given back, so the program's own open gets the slot it took.
    NoRoom,
    /// A vfork child (`fdtable::not_a_vfork_child`): the directory fds are its parent's to
    /// open, close and forget, and an fd this child has may not be one of them any more.
    NoDir,
}

fn no_room(errno: c_int) -> bool {
    errno == libc::EMFILE || errno == libc::ENFILE
}

/// The verified object directory fd of `tier`, opening it on first use.
fn dir_fd(table: &Table, tier: u8) -> Result<c_int, Refused> {
    let slot = DIRS.get(tier as usize).ok_or(Refused::NotCopy)?;
    let fd = slot.load(Ordering::Acquire);
    if fd >= 0 {
        return Ok(fd);
    }
    // A vfork child's fd would be published in its parent's memory under a number that names
    // something else there.
    if !fdtable::not_a_vfork_child() {
        return Err(Refused::NoDir);
    }
    let (dev, ino) = table.tier_dir_id(tier as u32).ok_or(Refused::NotCopy)?;
    if ino == 0 {
        return Err(Refused::NotCopy);
    }
    let path = table.tier_dir(tier as u32).ok_or(Refused::NotCopy)?;
    let mut buf = [0u8; PATH_BUF];
    buf.get_mut(..path.len())
        .ok_or(Refused::NotCopy)?
        .copy_from_slice(path);
    *buf.get_mut(path.len()).ok_or(Refused::NotCopy)? = 0;
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        buf.as_ptr().cast(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return Err(if no_room(sys::errno()) {
            Refused::NoRoom
        } else {
            Refused::NotCopy
        });
    }
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 || !verified(&st, dev, ino, our_euid(table)) {
        sys::raw_close(fd);
        return Err(Refused::NotCopy);
    }
    let fd = out_of_the_way(fd);
    match slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Ok(fd),
        Err(other) => {
            // Another thread got there first: keep one.
            sys::raw_close(fd);
            Ok(other)
        }
    }
}

/// A tier file's open failed for want of an fd: our directory fd `dir` of `tier` is given
/// back, so the program's own open (the source's, next) has the slot it holds — without granary
/// the program would have had it. Opened again at the next use that finds room.
fn give_back_dir(tier: u8, dir: c_int) {
    if !fdtable::not_a_vfork_child() {
        return;
    }
    if let Some(slot) = DIRS.get(tier as usize) {
        // Only the thread that takes it out of the slot closes it: never a number twice.
        if slot
            .compare_exchange(dir, -1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            sys::raw_close(dir);
        }
    }
}

/// Moves one of our fds to a high number, so the numbers the program's own opens get are the
/// ones they get without granary (programs and tests do print, pass and assume fd numbers).
fn out_of_the_way(fd: c_int) -> c_int {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let r = sys!(
        libc::SYS_prlimit64,
        0,
        libc::RLIMIT_NOFILE,
        0usize,
        &mut lim as *mut libc::rlimit
    );
    if r != 0 || lim.rlim_cur < 128 {
        return fd;
    }
    let floor = (lim.rlim_cur / 2).min(1000) as c_int;
    let high = sys!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, floor) as c_int;
    if high < 0 {
        return fd;
    }
    sys::raw_close(fd);
    high
}

/// Closes every tier directory fd this process holds (a test's process starting afresh).
#[cfg(test)]
pub fn close_dirs() {
    for (tier, d) in DIRS.iter().enumerate() {
        let fd = d.load(Ordering::Acquire);
        if fd >= 0 {
            give_back_dir(tier as u8, fd);
        }
    }
}

/// The program closed (or replaced) fd `fd`: if it was one of our directory fds, forget it (the
/// kernel already closed it). Cheap: a few loads.
#[inline]
pub fn forget(fd: c_int) {
    for d in &DIRS {
        // Not in a vfork child (whose closes are of its own fd table): its parent would open
        // another and keep this one open for nothing — an fd leaked at every subprocess.
        if d.load(Ordering::Relaxed) == fd && fd >= 0 && fdtable::not_a_vfork_child() {
            d.store(-1, Ordering::Release);
        }
    }
}

/// The program closed the fds `first..=last`: forget ours among them.
pub fn forget_range(first: u32, last: u32) {
    for d in &DIRS {
        let fd = d.load(Ordering::Relaxed);
        if fd >= 0 && (first..=last).contains(&(fd as u32)) && fdtable::not_a_vfork_child() {
            d.store(-1, Ordering::Release);
        }
    }
}

/// Opens `name` in tier `tier`'s object directory with the caller's `flags` (read-only), and
/// returns the fd only if it is the file the agent wrote (see the module comment). Never
/// blocks, never follows a link, never changes errno. The second value is the status flags
/// granary added to the caller's (`O_NONBLOCK`, `O_NOFOLLOW`, `O_NOATIME`): they stay
/// on the fd — none changes what a regular file on a local tier reads — and
/// `fcntl(F_GETFL)` hides them.
pub fn open(
    table: &Table,
    tier: u8,
    name: &[u8],
    flags: c_int,
    expect: &Expect,
) -> Option<(c_int, c_int)> {
    open_or_why(table, tier, name, flags, expect).ok()
}

/// `open`, saying why not.
pub fn open_or_why(
    table: &Table,
    tier: u8,
    name: &[u8],
    flags: c_int,
    expect: &Expect,
) -> Result<(c_int, c_int), Refused> {
    let _keep = KeepErrno::new();
    if expect.ino == 0 {
        return Err(Refused::NotCopy);
    }
    let (fd, added) = open_unchecked(table, tier, name, flags)?;
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 || !is_copy(table, tier, &st, expect) {
        sys::raw_close(fd);
        if let Ok(dir) = dir_fd(table, tier) {
            recheck_dir(table, tier, dir);
        }
        return Err(Refused::NotCopy);
    }
    Ok((fd, added))
}

/// `open` without the check of what was opened: the caller checks the fd's first `fstat` with
/// `is_copy` before any of its bytes or metadata reach the program. Same directory fd, same
/// single name, same flags.
pub fn open_unchecked(
    table: &Table,
    tier: u8,
    name: &[u8],
    flags: c_int,
) -> Result<(c_int, c_int), Refused> {
    let _keep = KeepErrno::new();
    let dir = dir_fd(table, tier)?;
    let nonblock_added = if flags & libc::O_NONBLOCK == 0 {
        libc::O_NONBLOCK
    } else {
        0
    };
    let noatime_added = if flags & libc::O_NOATIME == 0 && !NOATIME_REFUSED.load(Ordering::Relaxed)
    {
        libc::O_NOATIME
    } else {
        0
    };
    let mut opened = open_beneath(dir, name, flags | libc::O_NONBLOCK | noatime_added);
    let mut noatime = noatime_added;
    if opened.0 < 0 && noatime != 0 && sys::errno() == libc::EPERM {
        // Not the copy's owner (another fsuid): O_NOATIME is refused, never needed.
        NOATIME_REFUSED.store(true, Ordering::Relaxed);
        noatime = 0;
        opened = open_beneath(dir, name, flags | libc::O_NONBLOCK);
    }
    let (fd, nofollow_added) = opened;
    if fd < 0 {
        if no_room(sys::errno()) {
            give_back_dir(tier, dir);
            return Err(Refused::NoRoom);
        }
        if !fdtable::not_a_vfork_child() {
            // A vfork child that closed its copy of the directory fd, say: nothing is known
            // of the copy.
            return Err(Refused::NoDir);
        }
        recheck_dir(table, tier, dir);
        return Err(Refused::NotCopy);
    }
    let nofollow = if nofollow_added { libc::O_NOFOLLOW } else { 0 };
    Ok((fd, nonblock_added | nofollow | noatime))
}

/// Set once an open of a copy with `O_NOATIME` was refused (`EPERM`: the process's fsuid does
/// not own the copies): later opens do without it, so no open pays for a refusal twice.
static NOATIME_REFUSED: AtomicBool = AtomicBool::new(false);

/// `st` (an `fstat`) is the file that has name `name` in tier `tier`'s object directory now,
/// or one that looks like the agent's (`is_ours`): what a copy's fd can name. Anything else —
/// a socket, another user's file — means the fd's number was closed behind our back and reused.
pub fn could_be_copy(table: &Table, tier: u8, name: &[u8], st: &libc::stat) -> bool {
    // Not in a vfork child, whose fd may be a file of its own (a private file on the tier's
    // device looks like ours): there only the file at the copy's name counts.
    if is_ours(table, tier, st) && fdtable::not_a_vfork_child() {
        return true;
    }
    let _keep = KeepErrno::new();
    let Ok(dir) = dir_fd(table, tier) else {
        return false;
    };
    let Some(cname) = one_name(name) else {
        return false;
    };
    let mut now = sys::empty_stat();
    sys::raw_newfstatat(
        dir,
        cname.as_ptr().cast(),
        (&mut now as *mut libc::stat).cast(),
        libc::AT_SYMLINK_NOFOLLOW,
    ) == 0
        && now.st_dev == st.st_dev
        && now.st_ino == st.st_ino
}

/// `st`, an `fstat` of an fd opened in tier `tier`, is the file the agent wrote as `expect`.
pub fn is_copy(table: &Table, tier: u8, st: &libc::stat, expect: &Expect) -> bool {
    expect.ino != 0
        && is_ours(table, tier, st)
        && st.st_ino == expect.ino
        && (expect.ctime_ns == 0 || ctime_ns(st) == expect.ctime_ns)
        && expect.size.is_none_or(|s| st.st_size as u64 == s)
}

/// Opens (creating it 0600 if `flags` say so) `name` in tier `tier`'s object directory for the
/// caller, through the same verified directory fd, never following a link: a file of granary's
/// that is not a copy (the node-local LMDB lock file). Checked like a copy, minus the identity:
/// a regular file of ours, closed to others, on the tier's device. Never changes errno.
pub fn open_own(table: &Table, tier: u8, name: &[u8], flags: c_int) -> Option<c_int> {
    let _keep = KeepErrno::new();
    let dir = dir_fd(table, tier).ok()?;
    let (fd, _) = open_beneath_mode(dir, name, flags | libc::O_NOFOLLOW, 0o600);
    if fd < 0 {
        recheck_dir(table, tier, dir);
        return None;
    }
    let mut st = sys::empty_stat();
    if !ours(table, tier, fd, &mut st) {
        sys::raw_close(fd);
        return None;
    }
    Some(fd)
}

/// `fd` (its `fstat` into `st`) is a regular file of ours, closed to others, on tier `tier`'s
/// device.
fn ours(table: &Table, tier: u8, fd: c_int, st: &mut libc::stat) -> bool {
    sys::raw_fstat(fd, st) == 0 && is_ours(table, tier, st)
}

fn is_ours(table: &Table, tier: u8, st: &libc::stat) -> bool {
    let Some((dev, _)) = table.tier_dir_id(tier as u32) else {
        return false;
    };
    st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_mode & 0o077 == 0
        && st.st_uid == our_euid(table)
        && st.st_dev == dev
}

pub fn ctime_ns(st: &libc::stat) -> u64 {
    (st.st_ctime as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(st.st_ctime_nsec as u64)
}

/// Opens `name` in `dir` without following a link. `name` is one component of our own making
/// (an object name), neither `.` nor `..`: `openat` with `O_NOFOLLOW` then resolves nothing but
/// that entry of the verified directory and refuses it if it is a symlink, which is all
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` would add for such a name — at 0.2 µs less
/// per open. Anything else is refused (-1). The flag is true if `O_NOFOLLOW` was added to
/// the caller's.
fn open_beneath(dir: c_int, name: &[u8], flags: c_int) -> (c_int, bool) {
    open_beneath_mode(dir, name, flags, 0)
}

fn open_beneath_mode(dir: c_int, name: &[u8], flags: c_int, mode: libc::mode_t) -> (c_int, bool) {
    let Some(cname) = one_name(name) else {
        return (-1, false);
    };
    let fd = sys::raw_openat(dir, cname.as_ptr().cast(), flags | libc::O_NOFOLLOW, mode);
    (fd, flags & libc::O_NOFOLLOW == 0)
}

/// `name` NUL-terminated, if it is one component of ours: not empty, `.` or `..`, no `/` or
/// NUL, short enough for the buffer (object, part, chunk and lock names are).
fn one_name(name: &[u8]) -> Option<[u8; 48]> {
    let single = !name.is_empty()
        && name != b"."
        && name != b".."
        && !name.contains(&b'/')
        && !name.contains(&0);
    let mut cname = [0u8; 48];
    if !single || name.len() >= cname.len() {
        return None;
    }
    cname.get_mut(..name.len())?.copy_from_slice(name);
    Some(cname)
}

/// After a failed open or check: is our directory fd still the verified directory? If not (the
/// program closed it behind our back and the number now names something else), forget it —
/// without closing it, since it is not ours any more.
fn recheck_dir(table: &Table, tier: u8, dir: c_int) {
    let Some((dev, ino)) = table.tier_dir_id(tier as u32) else {
        return;
    };
    if !fdtable::not_a_vfork_child() {
        // A vfork child's fd table is not the one the directory fds are kept for.
        return;
    }
    let mut st = sys::empty_stat();
    if sys::raw_fstat(dir, &mut st) != 0 || !verified(&st, dev, ino, our_euid(table)) {
        if let Some(slot) = DIRS.get(tier as usize) {
            let _ = slot.compare_exchange(dir, -1, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

// ---- an entry's files: its complete copy, its part and chunk file ----

/// The entry's complete copy, opened read-only with `flags`, if it is exactly what the agent
/// placed. Reports a damaged copy (not one that could not be opened for want of an fd). Never
/// changes errno.
pub fn open_copy(g: &Guard, idx: u32, e: &EntryRec, flags: c_int) -> Option<(c_int, u8, u64)> {
    let word = g.table.state(idx);
    if word.state() != State::Placed {
        return None;
    }
    let tier = word.tier();
    let expect = recorded(g.table, idx, e);
    match open_or_why(g.table, tier, &object_name(e.object), flags, &expect) {
        Ok((fd, added)) => Some((fd, tier, flag::added(added))),
        // Nothing known of the copy.
        Err(Refused::NoRoom | Refused::NoDir) => None,
        Err(Refused::NotCopy) => {
            // Gone, damaged, replaced: the agent drops it and places it again.
            g.table.push_request(granary_shm::request::DAMAGED, idx);
            g.count(job::FALLBACKS, 1);
            if log::enabled() {
                log::line(&[
                    b"cached copy unusable, using the source: ",
                    g.table.name(e).unwrap_or(b"?"),
                ]);
            }
            None
        }
    }
}

/// What the agent recorded when it placed entry `idx`'s complete copy.
pub fn recorded(table: &Table, idx: u32, e: &EntryRec) -> Expect {
    let (ino, ctime_ns) = table.copy_identity(idx);
    Expect {
        ino,
        ctime_ns,
        size: Some(e.stat.size),
    }
}

/// `open_copy` for an fd tracked at once and closed on exec, with the identity check left to
/// the fd's first use (`confirm`): CPython's `open` calls `fstat` next, which then makes the
/// check (one system call instead of two). The fd's flags carry `UNCHECKED`.
pub fn open_copy_unchecked(
    g: &Guard,
    idx: u32,
    object: u64,
    e: Option<&EntryRec>,
    flags: c_int,
) -> Option<(c_int, u8, u64)> {
    // The checked open, with the entry (decoded now if the caller has not).
    let checked = || {
        let e = e
            .copied()
            .or_else(|| crate::ops::lookup::entry(g.table, idx))?;
        open_copy(g, idx, &e, flags)
    };
    let word = g.table.state(idx);
    if word.state() != State::Placed || flags & libc::O_CLOEXEC == 0 {
        return checked();
    }
    let tier = word.tier();
    match open_unchecked(g.table, tier, &object_name(object), flags) {
        Ok((fd, added)) => Some((fd, tier, flag::added(added) | flag::UNCHECKED)),
        // No fd to spare (the source's open may still have one: the directory fd's), or a
        // vfork child.
        Err(Refused::NoRoom | Refused::NoDir) => None,
        // Gone: the checked open reports it.
        Err(Refused::NotCopy) => checked(),
    }
}

/// The tier file `name` (the entry's chunk file or part) in `tier`, read-only, if it is the one
/// the agent recorded for entry `idx`.
pub fn open_recorded(g: &Guard, idx: u32, tier: u8, name: &[u8]) -> Option<c_int> {
    let (ino, _) = g.table.copy_identity(idx);
    let expect = Expect {
        ino,
        ctime_ns: 0,
        size: None,
    };
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    open(g.table, tier, name, flags, &expect).map(|(fd, _)| fd)
}
