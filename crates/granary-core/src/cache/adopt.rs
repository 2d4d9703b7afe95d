//! A new table takes over the copies the user already has instead of placing them again.
//!
//! - **Its own directories** (`own`): in each tier, the record of copies (`copies`) says what
//!   the source's directory holds, whichever table wrote it last — this source on these tiers
//!   before, on other tiers since, in this agent or an earlier one — and its journal
//!   (`journal`) what that table published after (an agent killed before its next save). On a
//!   tier with a record, the table's placed entries are replaced by the recorded copies of
//!   files the table holds in the same version; then, for each object the journal names, the
//!   last of its records (the record's, then the journal's) that is the copy on disk is taken.
//!   (A tier without a record — a cache from before records — keeps what the table says, and
//!   takes the journal's copies of files it has none of.)
//! - **The same dataset served another way** (`siblings`): a tree read plainly, from its pack
//!   (`--pack`) and mounted from the pack elsewhere (`--mount`) has one source id per way, and
//!   one directory per tier each. A copy another way recorded in the same tier root, of a file
//!   this table holds in the same version (and, for a file served from the pack, whose bytes
//!   have the pack's checksum), is moved into this table's directory (a rename) and dropped
//!   from the other record; a second copy of a file the table holds in that root already (two
//!   ways ran at once) is removed. One copy per file, whichever way the last job read it.
//!
//! A copy taken from another way's directory is checked before it is moved: a regular file of
//! the user's, of the recorded size, whose inode and ctime are the ones recorded — the file the
//! placement wrote, never another. Copies in the table's own directories are taken on their
//! record's word, as a saved catalog's always were: every open checks the copy's identity.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use granary_shm::lifecycle::{self, EntryCell};
use granary_shm::{object_name, State, Table};

use super::copies::{self, Copies, Record, RootId};
use super::journal;
use crate::sys;

/// One tier of the new table: the source's directory there and its verified `objects` fd.
pub struct Store<'a> {
    pub tier: u8,
    /// `<tier root>/<source id>`.
    pub dir: PathBuf,
    pub objects: &'a OwnedFd,
}

/// What was taken over.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub files: u64,
    pub bytes: u64,
    /// Another way's second copies of files the table holds in the same directory root,
    /// removed (the bytes stay cached, once).
    pub duplicates: u64,
    /// Of `files`, those taken on a journal's record (published after the last save).
    pub journaled: u64,
}

impl std::ops::AddAssign for Taken {
    fn add_assign(&mut self, o: Taken) {
        self.files += o.files;
        self.bytes += o.bytes;
        self.duplicates += o.duplicates;
        self.journaled += o.journaled;
    }
}

/// The copies recorded in the table's own directories, in their records and then their
/// journals (see the module comment).
pub fn own(t: &Table, stores: &[Store<'_>]) -> Taken {
    let mut taken = Taken::default();
    for s in stores {
        let rec = match copies::read(&s.dir) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    "record of copies in {} not used: {e}; what the catalog says stands",
                    s.dir.display()
                );
                None
            }
        };
        let m = journal::merge(
            &s.dir,
            s.objects,
            rec,
            journal::max_records(t.entry_count()),
        );
        if let Some(p) = &m.problem {
            tracing::warn!(
                "{}: {p}; the copies it records are placed again",
                s.dir.display()
            );
        }
        if let Some(rec) = &m.base {
            forget_tier(t, s.tier);
            // Taken on the record's word, as a saved catalog's copies are (no call per copy: a
            // re-attach to a million files stays quick): every open checks the copy's
            // identity, a mismatch is withdrawn and placed again, and the sweep withdraws
            // copies that are gone.
            for r in &rec.records {
                let Some(idx) = wanted(t, r) else { continue };
                if lifecycle::adopt_placed(t, idx, s.tier, r.checksum, r.copy.0, r.copy.1) {
                    taken.files += 1;
                    taken.bytes += r.size;
                }
            }
        }
        // Checked on disk by `merge`: a copy evicted, replaced or moved after its journal
        // record was written (the agent died before its next save) is not among them.
        for r in &m.journaled {
            let Some(idx) = wanted(t, r) else { continue };
            if lifecycle::adopt_placed(t, idx, s.tier, r.checksum, r.copy.0, r.copy.1) {
                taken.files += 1;
                taken.bytes += r.size;
                taken.journaled += 1;
            }
        }
    }
    taken
}

/// Copies of the same dataset that other ways of serving it recorded in the tier roots of
/// `stores` (see the module comment). `release(id)` is asked before anything is taken from the
/// directories of source id `id`: false means a table in use holds them (they are left alone).
/// With `moving` false (a live table, whose charges are already counted), only second copies
/// are removed.
pub fn siblings(
    t: &Table,
    id: &str,
    stores: &[Store<'_>],
    release: &dyn Fn(&str) -> bool,
    moving: bool,
) -> Taken {
    let mut taken = Taken::default();
    let root_id = RootId::of(t);
    if root_id == RootId::default() {
        return taken;
    }
    for s in stores {
        let Some(root) = s.dir.parent() else { continue };
        for sib in crate::tierdir::source_dirs(root) {
            if sib == id {
                continue;
            }
            let sib_dir = root.join(&sib);
            let mine = |c: &Copies| {
                c.records
                    .iter()
                    .any(|r| (moving && wanted(t, r).is_some()) || is_duplicate(t, r, s.tier))
            };
            // The header first: another dataset's record is not read further.
            let same = copies::read_header(&sib_dir)
                .is_some_and(|h| h.uid == sys::uid() && h.root == root_id);
            // With its journal: the copies a killed agent of that way placed count too.
            if !same
                || !super::inventory::read_record(root, &sib)
                    .ok()
                    .flatten()
                    .is_some_and(|c| mine(&c))
            {
                continue;
            }
            if !release(&sib) {
                tracing::info!("copies in {} are in use: not taken", sib_dir.display());
                continue;
            }
            // Read again: releasing saved the record afresh.
            let Ok(Some(rec)) = super::inventory::read_record(root, &sib) else {
                continue;
            };
            taken += take_from(t, s, root, &sib, rec, moving);
        }
    }
    taken
}

/// Moves what `rec` (source id `sib` in `root`) holds for `t` into `s`'s directory (with
/// `moving`), and removes its second copies of what `t` holds there.
fn take_from(
    t: &Table,
    s: &Store<'_>,
    root: &Path,
    sib: &str,
    mut rec: Copies,
    moving: bool,
) -> Taken {
    let mut taken = Taken::default();
    let sib_dirs = match crate::tierdir::open_existing(root, sib) {
        Ok(Some(d)) => d,
        Ok(None) => return taken,
        Err(e) => {
            tracing::warn!("{e}: its copies are not taken");
            return taken;
        }
    };
    // `rec` holds what that way's journal vouched for too: once the record is saved again
    // below, the journal is emptied (no table uses that directory now).
    let before = rec.records.len();
    rec.records.retain(|r| {
        // Two ways read the dataset at once and each placed its copy: one goes.
        if is_duplicate(t, r, s.tier) && copies::is_the_copy(&sib_dirs.objects, r) {
            let gone = sys::unlink_at(&sib_dirs.objects, &object_name(r.object)).is_ok();
            taken.duplicates += gone as u64;
            return !gone;
        }
        let Some(idx) = wanted(t, r).filter(|_| moving) else {
            return true;
        };
        let name = object_name(r.object);
        if !copies::is_the_copy(&sib_dirs.objects, r) {
            return true;
        }
        if let Err(e) = sys::rename_between(&sib_dirs.objects, s.objects, &name) {
            tracing::debug!(
                "moving a copy out of {}: {e}",
                sib_dirs.objects_path.display()
            );
            return true;
        }
        // The rename changed its ctime: the identity clients check is the one it has now.
        let moved = Record {
            copy: match sys::copy_stat_at(s.objects, &name) {
                Ok(c) => (c.ino, c.ctime_ns),
                Err(_) => return false,
            },
            ..*r
        };
        if take_in_place(t, idx, &moved, s) {
            taken.files += 1;
            taken.bytes += r.size;
        }
        false
    });
    if rec.records.len() != before {
        tracing::info!(
            "{} copies moved from {} (the same files, served another way), {} second copies \
             removed there",
            before as u64 - rec.records.len() as u64 - taken.duplicates,
            sib_dirs.objects_path.display(),
            taken.duplicates
        );
        match copies::save(&root.join(sib), &rec) {
            Ok(()) => {
                if let Err(e) = journal::discard(&root.join(sib)) {
                    tracing::warn!(
                        "cannot empty the journal of copies in {}: {e}",
                        root.join(sib).display()
                    );
                }
            }
            Err(e) => tracing::warn!(
                "cannot update the record in {}: {e}",
                root.join(sib).display()
            ),
        }
    }
    taken
}

/// The entry of `t` that `r` is a copy of, if `t` holds that file in the same version and has
/// no copy of it yet (and, served from a pack, the pack's checksum is the copy's).
fn wanted(t: &Table, r: &Record) -> Option<u32> {
    let idx = t.lookup_object(r.object)?;
    let e = t.entry(idx)?;
    if t.state(idx).state() != State::Unplaced || !r.is_copy_of(&e.stat) {
        return None;
    }
    if let Some(l) = t.locator(idx).filter(|l| l.is_packed()) {
        // The placement's checksum is never 0 (`max(1)`).
        if l.checksum.max(1) != r.checksum {
            return None;
        }
    }
    Some(idx)
}

/// True if `t` holds a copy of the very file `r` is a copy of, with the same bytes, in the
/// directory of tier `tier` (the same tier root as `r`'s).
fn is_duplicate(t: &Table, r: &Record, tier: u8) -> bool {
    let Some(idx) = t.lookup_object(r.object) else {
        return false;
    };
    let w = t.state(idx);
    w.state() == State::Placed
        && w.tier() == tier
        && t.checksum(idx) == r.checksum
        && t.entry(idx).is_some_and(|e| r.is_copy_of(&e.stat))
}

/// Entry `idx` gets the copy `r` records in `s`'s directory, if it is there as recorded.
fn take_in_place(t: &Table, idx: u32, r: &Record, s: &Store<'_>) -> bool {
    copies::is_the_copy(s.objects, r)
        && lifecycle::adopt_placed(t, idx, s.tier, r.checksum, r.copy.0, r.copy.1)
}

/// The table's complete copies on `tier` are forgotten (its record is what holds).
fn forget_tier(t: &Table, tier: u8) {
    for idx in 0..t.entry_count() {
        let w = t.state(idx);
        if w.state() == State::Placed && w.tier() == tier {
            lifecycle::withdraw(&EntryCell { table: t, idx }, w);
        }
    }
}
