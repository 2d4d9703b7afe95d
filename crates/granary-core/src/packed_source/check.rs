//! A job joining a packed table that other jobs hold gets no new catalog: the tree is checked
//! again the way the catalog was built, per directory, before the new job starts. A directory
//! whose identity moved is voided (its listing passes through from then on: new names are the
//! source's) and each of its children is stat'ed — a changed or removed one is voided too, for
//! every job of the table (served from the source, its copy dropped).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use granary_shm::lifecycle::{self, Void};
use granary_shm::{State, Table};

use crate::sys::statx_nofollow;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recheck {
    pub dirs_checked: u64,
    pub dirs_changed: u64,
    /// Entries voided (changed or removed).
    pub voided: u64,
}

fn path_of(source: &Path, table: &Table, idx: u32) -> Option<std::path::PathBuf> {
    let rel = table.rel_path_vec(idx)?;
    Some(if rel.is_empty() {
        source.to_path_buf()
    } else {
        source.join(OsStr::from_bytes(&rel))
    })
}

/// Checks every directory of `table` still served against `source` (one `statx` each).
pub fn recheck(table: &Table, source: &Path) -> Recheck {
    let mut r = Recheck::default();
    for i in 0..table.entry_count() {
        let Some(e) = table.entry(i) else { continue };
        if !e.stat.is_dir() || table.state(i).state() == State::Gone {
            continue;
        }
        let Some(path) = path_of(source, table, i) else {
            continue;
        };
        r.dirs_checked += 1;
        let now = statx_nofollow(&path);
        if matches!(&now, Ok(now) if e.stat.same_version(now)) {
            continue;
        }
        r.dirs_changed += 1;
        match now {
            Ok(now) if now.is_dir() => {
                if lifecycle::void_entry(table, i, Void::Stale) {
                    r.voided += 1;
                }
            }
            _ => {
                if lifecycle::void_entry(table, i, Void::Gone) {
                    r.voided += 1;
                }
                continue;
            }
        }
        for c in e.first_child..e.first_child.saturating_add(e.child_count) {
            let Some(ce) = table.entry(c) else { continue };
            if ce.stat.is_dir() || table.state(c).is_void() {
                continue;
            }
            let Some(cp) = path_of(source, table, c) else {
                continue;
            };
            let how = match statx_nofollow(&cp) {
                Ok(now) if ce.stat.same_version(&now) => continue,
                Ok(_) => Void::Stale,
                Err(_) => Void::Gone,
            };
            if lifecycle::void_entry(table, c, how) {
                r.voided += 1;
            }
        }
    }
    r
}
