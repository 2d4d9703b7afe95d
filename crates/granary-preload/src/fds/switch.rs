//! Switching an fd to another file: the complete copy of a file it has open on the source, or
//! the source of a copy the program has since changed. The other file is opened and `dup3`'d
//! over the fd's number at the same offset, so the fd gets a new open file description (OFD):
//! only done when the OFD is this fd's alone (`exclusive`), or a `dup`, a forked child or an
//! `exec`'d child sharing it would keep reading the old file at an offset no longer shared.
//! A shared fd keeps its file and has each read answered from the other one (`serve`;
//! docs/preload-rules.md, "Shared offsets").

use core::ffi::c_int;

use granary_shm::{job, EntryRec, Table};

use crate::fds::copies;
use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::ops::detour::Guard;
use crate::ops::path::{self, Buf};
use crate::sys::log;
use crate::sys::{self, sys, KeepErrno};

/// True if `t`'s open file description is this fd's alone, so switching it changes nothing for
/// anybody else.
pub fn exclusive(t: &Tracked) -> bool {
    !t.has(flag::SHARED) && !t.has(flag::PINNED) && fdtable::owned()
}

/// Opens the entry's file on the source, read-only with `flags`, if it is still the inode the
/// catalog describes (a program that changed the file in place keeps its inode). Never changes
/// errno.
pub fn open_source(g: &Guard, idx: u32, e: &EntryRec, flags: c_int) -> Option<c_int> {
    open_source_in(g.table, idx, e, flags)
}

pub fn open_source_in(table: &Table, idx: u32, e: &EntryRec, flags: c_int) -> Option<c_int> {
    let _keep = KeepErrno::new();
    let mut buf = Buf::new();
    let p = path::entry_path(table, idx, &mut buf)?;
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        p,
        flags | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        return None;
    }
    let mut st = sys::empty_stat();
    let same = sys::raw_fstat(fd, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_ino == e.stat.ino
        && st.st_dev == libc::makedev(e.stat.dev_major, e.stat.dev_minor);
    let restored = flags & libc::O_NONBLOCK != 0 || {
        let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
        fl >= 0
            && sys!(
                libc::SYS_fcntl,
                fd,
                libc::F_SETFL,
                fl & !(libc::O_NONBLOCK as i64)
            ) == 0
    };
    if !same || !restored {
        sys::raw_close(fd);
        return None;
    }
    Some(fd)
}

/// The status flags to open a replacement for `fd` (tracked with flags `tracked`) with: the fd's
/// own, without creation flags and without the `O_NOATIME` granary added (`NOATIME_ADDED`); the
/// replacement is close-on-exec until `dup3` gives it the fd's own FD_CLOEXEC.
pub fn replacement_flags(fd: c_int, tracked: u64) -> Option<c_int> {
    let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
    if fl < 0 || fl as c_int & libc::O_ACCMODE != libc::O_RDONLY {
        return None;
    }
    let mut dropped = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC;
    if tracked & flag::NOATIME_ADDED != 0 {
        // Ours, and refused on a source file of another owner: the replacement does without
        // it (only its access time differs). The program's own O_NOATIME stays, as `F_GETFL`
        // shows it.
        dropped |= libc::O_NOATIME;
    }
    Some((fl as c_int & !dropped) | libc::O_CLOEXEC)
}

/// Puts `new` (a freshly opened fd) under `fd`'s number at `fd`'s offset, keeping its
/// FD_CLOEXEC, and tracks it as `to`. The caller holds `fd`'s `BUSY` lock and checked
/// `exclusive`. `new` is always closed.
fn put_under(fd: c_int, new: c_int, to: Tracked) -> bool {
    let pos = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
    put_under_at(fd, new, to, pos)
}

/// `put_under` at offset `pos`.
pub fn put_under_at(fd: c_int, new: c_int, to: Tracked, pos: libc::c_long) -> bool {
    let fdfl = sys!(libc::SYS_fcntl, fd, libc::F_GETFD);
    let cloexec = if fdfl >= 0 && fdfl as c_int & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // Position first: dup3 shares the OFD, offset included, so nothing can fail after the fd
    // has been replaced.
    let ok = fdfl >= 0
        && pos >= 0
        && sys!(libc::SYS_lseek, new, pos, libc::SEEK_SET) == pos
        && sys!(libc::SYS_dup3, new, fd, cloexec) == fd as libc::c_long;
    sys::raw_close(new);
    if ok {
        fdtable::track(fd, to);
    }
    ok
}

/// A source fd whose file is now placed: switched to the complete copy when the fd is
/// `exclusive` and not a small file's (`flag::SMALL`). Tried once: a failure (or a shared fd)
/// pins it to the source, whose reads are then served from the copy call by call (`serve`).
pub fn to_copy(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec) -> Option<u8> {
    if t.has(flag::SMALL) {
        // Its reads pass straight through without the fd's BUSY lock (`read`): a switch by
        // another thread's `lseek` or `mmap` could fall between one of them and the offset it
        // moves, and the next read repeat or skip bytes. It stays on the source (a mapping of
        // it is still backed by the copy: `map`).
        return None;
    }
    let _keep = KeepErrno::new();
    if !exclusive(&t) {
        if log::enabled() {
            let why: &[u8] = if t.has(flag::SHARED) {
                b"shared"
            } else if t.has(flag::PINNED) {
                b"pinned"
            } else {
                b"not ours"
            };
            let mut d = [0u8; 20];
            let n = log::num(fd as u64, &mut d);
            log::line(&[
                why,
                b" fd ",
                n,
                b", served from the copy call by call: ",
                rel(g, e),
            ]);
        }
        return None;
    }
    let switched = replacement_flags(fd, t.flags)
        .and_then(|fl| copies::open_copy(g, t.entry, e, fl))
        .and_then(|(new, tier, added)| {
            put_under(fd, new, Tracked::new(t.entry, FdKind::Tier(tier), added)).then_some(tier)
        });
    match switched {
        Some(tier) => {
            // Its open was counted on the source; from now on the tier serves it. Moved, not
            // added: the report's opens are each counted once (tier + source + pack = opens).
            g.table.uncount(g.slot, job::SOURCE_OPENS, 1);
            g.count(job::TIER_FILES + tier as usize, 1);
            if log::enabled() {
                let mut d = [0u8; 20];
                let n = log::num(fd as u64, &mut d);
                log::line(&[b"switched fd ", n, b" to the complete copy: ", rel(g, e)]);
            }
        }
        None => {
            fdtable::set_flag(fd, flag::PINNED);
            if log::enabled() {
                log::line(&[
                    b"could not switch to the copy, staying on the source: ",
                    rel(g, e),
                ]);
            }
        }
    }
    switched
}

/// A tier fd whose entry the program changed in place (or that takes a lock, or changes the
/// file's attributes): switched to the source when the fd is `exclusive`. Returns false when it
/// stays on the copy (its reads are then served from the source call by call).
pub fn to_source(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec) -> bool {
    let _keep = KeepErrno::new();
    if !exclusive(&t) {
        return false;
    }
    // The O_NONBLOCK and O_NOFOLLOW granary added stay on the replacement
    // (`replacement_flags`), hidden from `F_GETFL` as before.
    let added = t.flags & (flag::NONBLOCK_ADDED | flag::NOFOLLOW_ADDED);
    let to = Tracked::new(t.entry, FdKind::Source, flag::PINNED | added);
    let ok = replacement_flags(fd, t.flags)
        .and_then(|fl| open_source(g, t.entry, e, fl))
        .is_some_and(|new| put_under(fd, new, to));
    if ok && log::enabled() {
        log::line(&[b"moved to the source: ", rel(g, e)]);
    }
    ok
}

fn rel<'a>(g: &'a Guard, e: &EntryRec) -> &'a [u8] {
    g.table.name(e).unwrap_or(b"?")
}
