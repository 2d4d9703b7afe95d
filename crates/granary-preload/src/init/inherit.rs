//! Fds a process inherited across `exec` (a shell's `< file`, `subprocess` with `pass_fds`): the
//! fd table of the process that opened them is gone, so without this a child would see a copy's
//! `fstat` (another inode, mode 0600) and an inherited directory fd would not be known as a
//! catalogued directory. At start, every open fd is looked at once: a copy in one of the table's
//! tiers (found by its object name, and only if it is exactly the copy the agent recorded), a
//! catalogued directory or file of the source. They are tracked as shared (the parent may still
//! hold the same open file description), so nothing ever switches them.
//!
//! Costs a `getdents64` of `/proc/self/fd` and an `fstat` per open fd at start; without `/proc`
//! nothing is adopted (an inherited copy then answers `fstat` as the copy: a documented limit).

use core::ffi::c_int;

use granary_shm::{parse_object_name, strip_root, State, Table};

use crate::fds::copies::ctime_ns;
use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::sys::PATH_BUF;
use crate::sys::{self, sys};

pub fn adopt(table: &Table) {
    let dir = sys::raw_openat(
        libc::AT_FDCWD,
        c"/proc/self/fd".as_ptr(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    );
    if dir < 0 {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        let n = sys!(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
        if n <= 0 {
            break;
        }
        let mut off = 0usize;
        while off + 19 < n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 {
                break;
            }
            let name = &buf[off + 19..(off + reclen).min(n as usize)];
            let name = name.split(|&b| b == 0).next().unwrap_or(b"");
            if let Some(fd) = parse_fd(name) {
                if fd != dir {
                    look_at(table, fd);
                }
            }
            off += reclen;
        }
    }
    sys::raw_close(dir);
}

fn parse_fd(name: &[u8]) -> Option<c_int> {
    if name.is_empty() || name.len() > 9 {
        return None;
    }
    let mut v: c_int = 0;
    for &b in name {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + (b - b'0') as c_int;
    }
    Some(v)
}

/// The path `/proc/self/fd/<fd>` resolves to, in `out`; `None` if unreadable or deleted.
fn fd_path(fd: c_int, out: &mut [u8; PATH_BUF]) -> Option<usize> {
    let mut link = [0u8; 40];
    link[..14].copy_from_slice(b"/proc/self/fd/");
    let mut d = [0u8; 20];
    let digits = crate::sys::log::num(fd as u64, &mut d);
    link.get_mut(14..14 + digits.len())?.copy_from_slice(digits);
    let n = sys!(
        libc::SYS_readlinkat,
        libc::AT_FDCWD,
        link.as_ptr(),
        out.as_mut_ptr(),
        out.len()
    );
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n > 0 && n < out.len())?;
    Some(n)
}

fn look_at(table: &Table, fd: c_int) {
    if fdtable::peek(fd).is_some() {
        return;
    }
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 {
        return;
    }
    let ty = st.st_mode & libc::S_IFMT;
    if ty != libc::S_IFREG && ty != libc::S_IFDIR {
        return;
    }
    let mut path = [0u8; PATH_BUF];
    let Some(n) = fd_path(fd, &mut path) else {
        return;
    };
    let p = &path[..n];
    let found = if ty == libc::S_IFREG {
        copy_entry(table, fd, p, &st).or_else(|| source_entry(table, p, &st))
    } else {
        source_entry(table, p, &st)
    };
    if let Some(t) = found {
        fdtable::track(fd, t);
    }
}

/// A complete copy in one of the table's tiers: its name leads to the entry, and its identity
/// must be the one the agent recorded for that entry's current placement.
fn copy_entry(table: &Table, fd: c_int, p: &[u8], st: &libc::stat) -> Option<Tracked> {
    for tier in 0..table.tier_count() {
        let Some(dir) = table.tier_dir(tier) else {
            continue;
        };
        let Some(name) = strip_root(p, dir) else {
            continue;
        };
        let idx = table.lookup_object(parse_object_name(name)?)?;
        let word = table.state(idx);
        let (ino, ctime) = table.copy_identity(idx);
        let placed = word.state() == State::Placed && word.tier() as u32 == tier;
        let e = table.entry(idx)?;
        if placed
            && st.st_ino == ino
            && ctime_ns(st) == ctime
            && st.st_size as u64 == e.stat.size
            && table
                .tier_dir_id(tier)
                .is_some_and(|(dev, _)| dev == st.st_dev)
        {
            return Some(Tracked::new(
                idx,
                FdKind::Tier(tier as u8),
                flag::SHARED | added_at_open(fd),
            ));
        }
        return None;
    }
    None
}

/// The status flags `copies::open` adds (`O_NONBLOCK`, `O_NOFOLLOW`, `O_NOATIME`) that an
/// inherited copy's fd carries, recorded as granary's so `F_GETFL` hides them as it did in the
/// process that opened the copy. Which of them that program asked for itself is not known here:
/// one that opens its dataset files with them and checks them in an exec'd child is far rarer
/// than one that opened without them (a shell's `< file`, `pass_fds`).
fn added_at_open(fd: c_int) -> u64 {
    let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
    if fl < 0 {
        return 0;
    }
    flag::added(fl as c_int & (libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOATIME))
}

/// A catalogued file or directory of the source, opened by the parent on the source itself:
/// the very inode the catalog describes.
fn source_entry(table: &Table, p: &[u8], st: &libc::stat) -> Option<Tracked> {
    let rel = strip_root(p, table.source_real_root())?;
    let idx = table.lookup(rel)?;
    // Its listing or state would come from the catalog: only once checked in this attach.
    if !table.is_validated(idx) {
        return None;
    }
    let e = table.entry(idx)?;
    let same = e.stat.ino == st.st_ino
        && libc::makedev(e.stat.dev_major, e.stat.dev_minor) == st.st_dev
        && e.stat.file_type() == st.st_mode & libc::S_IFMT;
    if !same {
        return None;
    }
    let kind = if e.stat.is_dir() {
        FdKind::Dir
    } else {
        FdKind::Source
    };
    Some(Tracked::new(idx, kind, flag::SHARED | flag::PINNED))
}
