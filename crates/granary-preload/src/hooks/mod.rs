//! The interposed C entry points, one module per family, and what they share: turning a path
//! argument into a live catalog entry.
//!
//! Every hook follows one rule: unless the catalog can give the answer the kernel would give, the
//! real function runs with the caller's original arguments.

// C ABI entry points: their safety contract is libc's, documented in the man pages.
#![allow(clippy::missing_safety_doc)]

pub mod dir;
pub mod fd;
pub mod link;
pub mod open;
pub mod read;
pub mod stat;

use core::ffi::{c_char, c_int};

use granary_shm::{resolve, state, EntryRec, Resolved, Table};

use crate::detour::Guard;
use crate::path::{self, Bufs, Loc};
use crate::perm;

/// A catalogued entry a call may be answered from.
pub struct Found {
    pub idx: u32,
    pub entry: EntryRec,
}

/// The live entry `loc` names (following a final symlink with `follow`); `None` when the
/// catalog cannot answer for it (not catalogued, not provable, stale, or an ancestor the caller
/// may not be able to search).
pub fn find(g: &Guard, loc: &Loc, follow: bool) -> Option<Found> {
    let rel = loc.rel?;
    // "dir/" follows a final symlink even for lstat, and must name a directory.
    let follow = follow || loc.must_dir;
    if loc.root_link && !follow {
        return None;
    }
    let Resolved::Entry(idx) = resolve(g.table, rel, follow) else {
        return None;
    };
    let entry = g.table.entry(idx)?;
    if state::state_of(g.table.state(idx)) == state::STALE {
        return None;
    }
    if loc.must_dir && !entry.stat.is_dir() {
        return None;
    }
    if !perm::ancestors_searchable(g.table, idx) {
        return None;
    }
    Some(Found { idx, entry })
}

/// Cheap early exit for absolute paths that cannot be under the source: their first component
/// differs from both roots'. A miss here only costs us a pass-through, never a wrong answer.
pub fn surely_outside(table: &Table, path: *const c_char) -> bool {
    let Some(p) = path::bytes(path) else {
        return true;
    };
    if p.first() != Some(&b'/') {
        return false;
    }
    let first = |s: &[u8]| -> usize {
        s.iter()
            .skip(1)
            .position(|&b| b == b'/')
            .map_or(s.len(), |i| i + 1)
    };
    let root_prefix = |root: &[u8]| -> bool {
        let n = first(root);
        match (root.get(..n), p.get(..n)) {
            (Some(r), Some(q)) => r == q && (p.len() == n || p.get(n) == Some(&b'/') || n == 1),
            _ => false,
        }
    };
    !root_prefix(table.source_root()) && !root_prefix(table.source_real_root())
}

/// Locates `path` unless it is surely outside; `Loc::outside()` otherwise.
pub fn locate<'a>(g: &Guard, dirfd: c_int, path: *const c_char, bufs: &'a mut Bufs) -> Loc<'a> {
    if dirfd == libc::AT_FDCWD && surely_outside(g.table, path) {
        return Loc::outside();
    }
    path::locate(g.table, dirfd, path, bufs)
}

/// A metadata call on a dataset path that the catalog could not answer.
pub fn source_meta(g: &Guard, call: &[u8], loc: &Loc) {
    g.count(granary_shm::job::SOURCE_META, 1);
    if crate::log::enabled() {
        crate::log::line(&[call, b" passed through: ", loc.rel.unwrap_or(b"?")]);
    }
}
