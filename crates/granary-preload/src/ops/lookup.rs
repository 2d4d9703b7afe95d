//! Which live catalog entry a path argument names — the lookup every path call makes: the path
//! located lexically against the source (`path::locate`), the entry found in the table with one
//! call (`Table::find`: resolved, live), and, where the agent's validation has not reached it
//! yet, checked against the source first (`validate`). The last entry decoded is remembered per
//! thread: a program opens a file and then `fstat`s and reads it, and every hook on the way
//! needs the same entry (entries are immutable for the life of the mapped table, so a
//! remembered one never goes stale).

use core::cell::Cell;
use core::ffi::{c_char, c_int};

use granary_shm::{EntryRec, FileHit, Found, Table};

use crate::ops::detour::{Bypass, Guard};
use crate::ops::path::{self, Buf, Loc};

thread_local! {
    // const-initialised and destructor-free: usable from any hook, including in a vfork child.
    static LAST: Cell<Option<(u32, EntryRec)>> = const { Cell::new(None) };
}

/// Locates `path` (relative to `dirfd`) against the source.
#[inline]
pub fn locate<'a>(g: &Guard, dirfd: c_int, path: *const c_char, buf: &'a mut Buf) -> Loc<'a> {
    path::locate(g.table, dirfd, path, buf)
}

/// The live entry `loc` names (following a final symlink with `follow`), if the catalog may
/// answer for it now; else why not.
pub fn find(g: &Guard, loc: &Loc, follow: bool) -> Result<Found, Bypass> {
    let rel = loc.rel.ok_or(Bypass::Outside)?;
    // "dir/" follows a final symlink even for lstat, and must name a directory.
    let follow = follow || loc.must_dir;
    if loc.root_link && !follow {
        return Err(Bypass::RootLink);
    }
    let hash = loc.hash.unwrap_or_else(|| granary_shm::path_hash(rel));
    // Every symlink followed on the way must still be the source's, checked as it is followed:
    // one replaced or retargeted between jobs (`ln -sf`) led to its old target's copy.
    let mut why = None;
    let found = g
        .table
        .find_hashed_with(
            rel,
            hash,
            follow,
            loc.must_dir,
            |idx, e| match link_confirmed(g.table, idx, e) {
                Ok(()) => true,
                Err(w) => {
                    why = Some(w);
                    false
                }
            },
        )
        .map_err(|m| why.unwrap_or(Bypass::Catalog(m)))?;
    LAST.set(Some((found.idx, found.entry)));
    confirmed(g.table, &found)?;
    Ok(found)
}

/// `find` for an open's common case, without decoding the entry: `Some` only where `find`
/// would answer `Ok` with this entry, the entry being no symlink and validated in this attach
/// (so nothing is checked against the source). `None` says nothing: the caller asks `find`.
/// The thread's last entry (`entry`) is left as it was.
#[inline]
pub fn find_file(g: &Guard, loc: &Loc, follow: bool) -> Option<FileHit> {
    let rel = loc.rel?;
    let follow = follow || loc.must_dir;
    if loc.root_link && !follow {
        return None;
    }
    let hash = loc.hash.unwrap_or_else(|| granary_shm::path_hash(rel));
    g.table
        .find_file(rel, hash, loc.must_dir)
        .filter(|hit| hit.validated)
}

/// A link on the way to an entry is live and, like an entry answered for, validated in this
/// attach or checked against the source now.
#[inline(never)]
fn link_confirmed(table: &Table, idx: u32, e: &EntryRec) -> Result<(), Bypass> {
    if table.state(idx).state().is_void() {
        return Err(Bypass::Catalog(granary_shm::Miss::Void));
    }
    if table.is_validated(idx) || !table.is_packed() && crate::ops::validate::check(table, idx, e) {
        Ok(())
    } else {
        Err(Bypass::Unconfirmed)
    }
}

/// An entry found, validated in this attach or checked against the source just now. A packed
/// table was checked whole before the program started: its source (if any) is never asked per
/// entry.
pub fn confirmed(table: &Table, f: &Found) -> Result<(), Bypass> {
    if f.validated || !table.is_packed() && crate::ops::validate::check(table, f.idx, &f.entry) {
        Ok(())
    } else {
        Err(Bypass::Unconfirmed)
    }
}

/// Entry `idx` of the process's table (the thread's last one, or decoded now).
#[inline]
pub fn entry(table: &Table, idx: u32) -> Option<EntryRec> {
    if let Some((i, e)) = LAST.get() {
        if i == idx {
            return Some(e);
        }
    }
    let e = table.entry(idx)?;
    LAST.set(Some((idx, e)));
    Some(e)
}
