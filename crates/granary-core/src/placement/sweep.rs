//! Keeping the tiers' object directories to what the catalog names, in the background of an
//! attach that did not build the catalog itself (a saved one was loaded, or a walk took over an
//! earlier table): files nobody names (stale copies, `.part` and `.tmp-*` files a killed agent
//! left, chunk files of files no longer partial; beside the objects, the `.tmp-*` of a catalog
//! or a record of copies it was saving) are deleted, and copies the catalog names but
//! that are gone from the tier are withdrawn (their space given back).
//!
//! With `verify = "checksum"`, each reused copy is then re-hashed at idle priority against the
//! checksum recorded when it was placed (direct I/O where the tier allows it, so resident
//! copies stay resident and nothing else is pushed out); a copy that fails is withdrawn and
//! deleted. What each layer of integrity catches is in docs/architecture.md.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use granary_shm::lifecycle;
use granary_shm::{object_name, parse_object_name, State, StateWord, Table};

use super::space::Space;
use super::work::Work;
use crate::sys;

/// Temporary files younger than this may belong to a copy in progress.
const TMP_GRACE_S: i64 = 120;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Files deleted from the object directories.
    pub removed: u64,
    /// Copies the catalog named that were missing or not files: withdrawn.
    pub missing: u64,
    /// Copies that failed their checksum: withdrawn and deleted.
    pub rejected: u64,
}

/// What a name in tier `tier`'s object directory is, for the current table.
fn wanted(t: &Table, tier: usize, name: &[u8]) -> Option<u32> {
    let (stem, suffix) = match name.iter().position(|&b| b == b'.') {
        Some(p) => (&name[..p], &name[p..]),
        None => (name, &b""[..]),
    };
    let idx = t.lookup_object(parse_object_name(stem)?)?;
    let w = t.state(idx);
    if w.tier() as usize != tier {
        return None;
    }
    // An object name while the entry is PLACING on this tier: a copy being published right now
    // (renamed, not yet PLACED) — deleting it would leave a PLACED entry with no copy.
    let keep = matches!(
        (suffix, w.state()),
        (b"", State::Placed | State::Placing)
            | (b".part", State::Placing)
            | (b".chunks", State::Partial)
    );
    keep.then_some(idx)
}

/// The node-local lock file of an LMDB environment whose data file the catalog names (the
/// preload's `lmdb`), whatever the data file's state: processes may hold it open, and LMDB
/// re-initialises a stale one itself.
fn is_lmdb_lock(t: &Table, tier: usize, name: &[u8]) -> bool {
    let Some(stem) = name.strip_suffix(b".lmdb-lock") else {
        return false;
    };
    tier == 0
        && parse_object_name(stem)
            .and_then(|o| t.lookup_object(o))
            .and_then(|idx| t.entry(idx))
            .is_some_and(|e| e.stat.is_file())
}

fn is_young_tmp(dir: &OwnedFd, name: &[u8], now: i64) -> bool {
    if !name.starts_with(b".tmp-") {
        return false;
    }
    let Ok(c) = sys::copy_stat_at(dir, name) else {
        return false;
    };
    now - (c.ctime_ns / 1_000_000_000) as i64 <= TMP_GRACE_S
}

fn now_s() -> i64 {
    (crate::cache::copies::now_ns() / 1_000_000_000) as i64
}

/// Deletes the `.tmp-*` files older than the grace in `parent`, the source's directory the
/// tier's objects are in: a catalog or a record of copies an agent was saving when it was killed (a save
/// in progress writes its file, which keeps it young). Returns how many.
fn sweep_beside(parent: &OwnedFd, now: i64) -> u64 {
    let Ok(rd) = list(parent) else {
        return 0;
    };
    let mut removed = 0;
    for de in rd.flatten() {
        let name = de.file_name();
        let b = name.as_bytes();
        if b.starts_with(b".tmp-")
            && de.file_type().is_ok_and(|t| t.is_file())
            && !is_young_tmp(parent, b, now)
            && sys::unlink_at(parent, b).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// `sweep_beside` of the directory the object directory `objects` is in, if that is still
/// the one its path `recorded` (as the table records it) says: an object directory moved while
/// the agent ran has another parent now, whose `.tmp-*` files are not a save's.
fn sweep_beside_of(objects: &OwnedFd, recorded: &Path, now: i64) -> u64 {
    let here = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let Ok(parent) = sys::open_path_at(objects, b"..") else {
        return 0;
    };
    let (Ok(o), Ok(p)) = (sys::dev_ino(objects), sys::dev_ino(&parent)) else {
        return 0;
    };
    if Some(o) != here(recorded) || Some(p) != recorded.parent().and_then(here) {
        return 0;
    }
    sweep_beside(&parent, now)
}

/// Deletes from `space`'s object directories what table `t` does not name, and withdraws what
/// it names but the tier lost; stops early once `work` is retired.
pub fn sweep(t: &Table, space: &Space, work: &Work) -> SweepOutcome {
    let mut out = SweepOutcome::default();
    let now = now_s();
    let words = granary_shm::layout::bitmap_words(t.entry_count() as usize);
    let mut seen = vec![0u64; words];
    for (tier, dir) in space.dirs().iter().enumerate() {
        let Some(dir) = dir else { continue };
        let Ok(rd) = list(dir) else { continue };
        for de in rd.flatten() {
            if work.is_retired() {
                return out;
            }
            let name = de.file_name();
            let b = name.as_bytes();
            match wanted(t, tier, b) {
                Some(idx) => seen[(idx / 64) as usize] |= 1 << (idx % 64),
                None if is_young_tmp(dir, b, now) || is_lmdb_lock(t, tier, b) => {}
                None => {
                    if sys::unlink_at(dir, b).is_ok() {
                        out.removed += 1;
                    }
                }
            }
        }
        if let Some(recorded) = space.recorded_path(tier) {
            out.removed += sweep_beside_of(dir, recorded, now);
        }
    }
    for idx in 0..t.entry_count() {
        let w = t.state(idx);
        if w.state() != State::Placed || seen[(idx / 64) as usize] & (1 << (idx % 64)) != 0 {
            continue;
        }
        let tier = w.tier() as usize;
        let Some(dir) = space.dir(tier) else {
            continue;
        };
        // Placed after the listing went by: there, not missing.
        let there = t
            .entry(idx)
            .is_some_and(|e| sys::copy_stat_at(dir, &object_name(e.object)).is_ok());
        if !there && withdraw(t, space, idx, w, false) {
            out.missing += 1;
        }
    }
    out
}

/// Lists a directory through a fresh fd of it (`/proc/self/fd` keeps it the verified one).
fn list(dir: &OwnedFd) -> std::io::Result<std::fs::ReadDir> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// Takes a placed copy back (PLACED → UNPLACED) and gives its space back; `delete` removes the
/// object too. False if the entry moved meanwhile.
fn withdraw(t: &Table, space: &Space, idx: u32, placed: StateWord, delete: bool) -> bool {
    let tier = placed.tier() as usize;
    if !lifecycle::withdraw(&lifecycle::EntryCell { table: t, idx }, placed) {
        return false;
    }
    if let (true, Some(dir), Some(e)) = (delete, space.dir(tier), t.entry(idx)) {
        let _ = sys::unlink_at(dir, &object_name(e.object));
    }
    if let Some(e) = t.entry(idx) {
        if tier < space.tiers.len() {
            space
                .tiers
                .release(tier, space.tiers.charge(tier, e.stat.size));
        }
    }
    true
}

/// Re-hashes every copy table `t` places in `space` against its recorded checksum; withdraws
/// and deletes the ones that fail; stops early once `work` is retired. Tiers that take no direct
/// I/O on a disk are skipped (hashing through the page cache would push resident copies out).
pub fn verify_copies(t: &Table, space: &Space, work: &Work) -> SweepOutcome {
    let mut out = SweepOutcome::default();
    let mut buf = AlignedBuf::new(1 << 20);
    let mut skip = vec![false; space.dirs().len()];
    for idx in 0..t.entry_count() {
        if work.is_retired() {
            break;
        }
        let w = t.state(idx);
        let tier = w.tier() as usize;
        if w.state() != State::Placed || skip.get(tier).copied().unwrap_or(true) {
            continue;
        }
        let (Some(dir), Some(e)) = (space.dir(tier), t.entry(idx)) else {
            continue;
        };
        let Ok(f) = sys::open_read_at(dir, &object_name(e.object)) else {
            continue;
        };
        let direct = sys::set_direct(&f, true).is_ok();
        if !direct && !sys::is_memory_fs(&f) {
            tracing::info!("tier {tier}: no direct I/O, copies are not re-hashed there");
            skip[tier] = true;
            continue;
        }
        let Ok(sum) = hash(&f, buf.as_mut()) else {
            continue;
        };
        // Only a copy still the one recorded counts (it may have been replaced meanwhile).
        if t.state(idx) == w && sum != t.checksum(idx) && withdraw(t, space, idx, w, true) {
            tracing::warn!(
                "cached copy of {} failed its checksum: withdrawn, placed again on demand",
                crate::catalog::walk::rel_display(&t.rel_path_vec(idx).unwrap_or_default())
                    .display()
            );
            out.rejected += 1;
        }
    }
    out
}

/// xxh3 of a whole file as placement computes it (never 0).
pub(crate) fn hash(f: &std::fs::File, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut off = 0u64;
    loop {
        match std::os::unix::fs::FileExt::read_at(f, buf, off) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(h.digest().max(1))
}

/// A heap buffer aligned for direct I/O.
struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let v = vec![0u8; len + 4096];
        let off = v.as_ptr().align_offset(4096);
        AlignedBuf { v, off, len }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_files_a_killed_save_left_beside_the_objects_go_once_old() {
        let d = tempfile::tempdir().unwrap();
        let objects = d.path().join("objects");
        std::fs::create_dir(&objects).unwrap();
        for name in [
            ".tmp-copies-4242-0",
            ".tmp-catalog-4242",
            "copies",
            "copies.journal",
        ] {
            std::fs::write(d.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join(".tmp-a-directory")).unwrap();
        std::fs::write(objects.join(".tmp-in-objects"), b"x").unwrap();
        let fd = sys::open_dir(&objects).unwrap();
        let fd = sys::open_path_at(&fd, b"..").unwrap();
        assert_eq!(
            sweep_beside(&fd, now_s()),
            0,
            "young: maybe a save in progress"
        );
        assert_eq!(sweep_beside(&fd, now_s() + TMP_GRACE_S + 10), 2);
        let mut left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [".tmp-a-directory", "copies", "copies.journal", "objects"]
        );
        assert!(
            objects.join(".tmp-in-objects").exists(),
            "the objects' own sweep's"
        );
    }

    #[test]
    fn an_object_directory_moved_elsewhere_leaves_its_new_neighbours_alone() {
        // The tier's objects moved while the agent ran (an operator's `mv`): `..` of the open
        // directory is now the user's own directory, whose `.tmp-*` files are none of ours.
        let d = tempfile::tempdir().unwrap();
        let source = d.path().join("source-id");
        let objects = source.join("objects");
        std::fs::create_dir_all(&objects).unwrap();
        std::fs::write(source.join(".tmp-catalog-4242"), b"x").unwrap();
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join(".tmp-the-users-own"), b"x").unwrap();
        let fd = sys::open_dir(&objects).unwrap();
        let later = now_s() + TMP_GRACE_S + 10;
        std::fs::rename(&objects, home.join("objects")).unwrap();
        assert_eq!(sweep_beside_of(&fd, &objects, later), 0);
        assert!(home.join(".tmp-the-users-own").exists());
        assert!(
            source.join(".tmp-catalog-4242").exists(),
            "not found either"
        );
        // Moved back: swept.
        std::fs::rename(home.join("objects"), &objects).unwrap();
        assert_eq!(sweep_beside_of(&fd, &objects, later), 1);
        assert!(!source.join(".tmp-catalog-4242").exists());
        // A symlink named like a save's file, to a file of the user's: left, and so is its file.
        std::fs::write(home.join("data"), b"x").unwrap();
        std::os::unix::fs::symlink(home.join("data"), source.join(".tmp-link")).unwrap();
        assert_eq!(sweep_beside_of(&fd, &objects, later), 0);
        assert!(source.join(".tmp-link").exists() && home.join("data").exists());
    }
}
