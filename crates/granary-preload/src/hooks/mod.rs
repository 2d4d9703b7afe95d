//! The interposed C entry points, one module per family, and what they share: turning a path
//! argument into a live catalog entry.
//!
//! Every hook follows one rule: unless the catalog can give the answer the kernel would give, the
//! real function runs with the caller's original arguments.

// C ABI entry points: their safety contract is libc's, documented in the man pages.
#![allow(clippy::missing_safety_doc)]

pub mod dir;
pub mod exec;
pub mod fd;
pub mod link;
pub mod lock;
pub mod mem;
pub mod mutate;
pub mod open;
pub mod read;
pub mod stat;

use core::ffi::{c_char, c_int};

use granary_shm::{lifecycle, resolve, EntryRec, Resolved, State, Table};

use crate::detour::Guard;
use crate::path::{self, Buf, Loc};

/// A catalogued entry a call may be answered from.
pub struct Found {
    pub idx: u32,
    pub entry: EntryRec,
}

/// The live entry `loc` names (following a final symlink with `follow`); `None` when the
/// catalog cannot answer for it (not catalogued, not provable, void, or below a path the program
/// renamed or removed).
pub fn find(g: &Guard, loc: &Loc, follow: bool) -> Option<Found> {
    let rel = loc.rel?;
    // "dir/" follows a final symlink even for lstat, and must name a directory.
    let follow = follow || loc.must_dir;
    if loc.root_link && !follow {
        return None;
    }
    let Resolved::Entry(idx, entry) = resolve(g.table, rel, follow) else {
        return None;
    };
    crate::entries::remember(idx, &entry);
    if g.table.state(idx).is_void() {
        return None;
    }
    if loc.must_dir && !entry.stat.is_dir() {
        return None;
    }
    if !ancestors_live(g.table, idx) {
        return None;
    }
    // A packed table was checked whole before the program started: its source (if any) is
    // never asked per entry.
    if !lifecycle::is_validated(g.table, idx)
        && (g.table.is_packed() || !crate::validate::check(g.table, idx, &entry))
    {
        return None;
    }
    Some(Found { idx, entry })
}

/// No ancestor of entry `idx` was renamed or removed by the program (`State::Gone`). The walk
/// could list every catalogued directory with the agent's credentials, which are this process's
/// (`creds`), so search permission needs no check of its own.
pub fn ancestors_live(table: &Table, idx: u32) -> bool {
    let mut cur = idx;
    // Bounded by the depth limit of a path.
    for _ in 0..4096 {
        if cur == 0 {
            return true;
        }
        let Some(parent) = table.parent_of(cur) else {
            return false;
        };
        if parent >= cur {
            return false;
        }
        if table.state(parent).state() == State::Gone {
            return false;
        }
        cur = parent;
    }
    false
}

/// Locates `path` (relative to `dirfd`).
#[inline]
pub fn locate<'a>(g: &Guard, dirfd: c_int, path: *const c_char, buf: &'a mut Buf) -> Loc<'a> {
    path::locate(g.table, dirfd, path, buf)
}

/// A metadata call on a dataset path that the catalog could not answer.
pub fn source_meta(g: &Guard, call: &[u8], loc: &Loc) {
    g.count(granary_shm::job::SOURCE_META, 1);
    if crate::log::enabled() {
        crate::log::line(&[call, b" passed through: ", loc.rel.unwrap_or(b"?")]);
    }
}
