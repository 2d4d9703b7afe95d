//! What a tier root holds, for `granary cache`: each source's directory with its copies — how
//! many, their bytes, when the source last used the tier, and which are valid as far as the
//! cache itself can tell (recorded, and there as recorded; `verify` re-reads them and asks the
//! source). Nothing is created or changed, nothing is followed through a symlink.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::copies::{self, Copies};
use super::journal;
use crate::sys;

/// One source's directory in one tier.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Store {
    /// The tier root.
    pub tier: PathBuf,
    /// Its source id (`<tier>/<id>` is the directory).
    pub id: String,
    /// The source's resolved path (for `mount`: where programs read the pack's tree); `None`
    /// when neither a record nor a catalog says.
    pub source: Option<PathBuf>,
    pub pack: Option<PathBuf>,
    pub mount: bool,
    /// Complete copies in it, and their bytes.
    pub files: u64,
    pub bytes: u64,
    /// Copies recorded and there as recorded: valid unless the source changed since.
    pub valid: u64,
    /// Copies nobody recorded, in the record or its journal (a killed agent's last ones whose
    /// journal record it never wrote, or placed a moment ago while it still runs): no table
    /// vouches for them; the source's next job removes them.
    pub unrecorded: u64,
    /// Recorded copies that are gone.
    pub missing: u64,
    /// Recorded copies written, replaced or damaged since they were placed (their inode, ctime
    /// or size is not the one recorded): never served, replaced at the source's next job.
    pub changed: u64,
    /// Partial copies, temporaries and lock files.
    pub other_files: u64,
    /// Everything in the directory, as allocated on the tier.
    pub disk_bytes: u64,
    /// When a job last used the source on this tier (Unix seconds).
    pub last_use: Option<i64>,
    /// Why the record of copies could not be read (`None`: read, or none yet).
    pub record_problem: Option<String>,
    /// Whether the source (or, for `mount`, the pack) is still there.
    pub source_present: Option<bool>,
}

impl Store {
    pub fn dir(&self) -> PathBuf {
        self.tier.join(&self.id)
    }
}

/// Every source directory in the tier root `root`, by id.
pub fn stores(root: &Path) -> Result<Vec<Store>, crate::tierdir::TierDirError> {
    crate::tierdir::open_root(root)?;
    Ok(crate::tierdir::source_dirs(root)
        .into_iter()
        .filter_map(|id| store(root, &id))
        .collect())
}

/// The source directory `<root>/<id>` (`None`: not a directory of the user's).
pub fn store(root: &Path, id: &str) -> Option<Store> {
    let dirs = match crate::tierdir::existing_source_dir(root, id) {
        Ok(Some(d)) => d,
        _ => return None,
    };
    let dir = root.join(id);
    let mut s = Store {
        tier: root.to_path_buf(),
        id: id.to_string(),
        ..Store::default()
    };
    let rec = match read_record(root, id) {
        Ok(r) => r,
        Err(e) => {
            s.record_problem = Some(e.to_string());
            None
        }
    };
    match &rec {
        Some(c) => {
            s.source = Some(c.header.source.clone());
            s.pack = c.header.pack.clone();
            s.mount = c.header.mount;
            s.last_use = Some((c.header.saved_ns / 1_000_000_000) as i64);
        }
        None => describe_from_catalog(&dir, &mut s),
    }
    count_files(&dirs, rec.as_ref(), &mut s);
    s.source_present = s.source.as_ref().map(|src| {
        let p = match (&s.pack, s.mount) {
            (Some(pack), true) => pack,
            _ => src,
        };
        sys::statx_nofollow(p).is_ok()
    });
    Some(s)
}

/// The record of `<root>/<id>` with the copies its journal adds (published after the record
/// was last saved, by an agent running or killed since: `journal::merge`). A journal that
/// cannot be used adds nothing: its copies count as nobody's.
pub fn read_record(root: &Path, id: &str) -> Result<Option<Copies>, copies::Error> {
    let dir = root.join(id);
    let Some(rec) = copies::read(&dir)? else {
        return Ok(None);
    };
    let Ok(Some(o)) = crate::tierdir::open_existing(root, id) else {
        return Ok(Some(rec));
    };
    // No table to bound it by: the record's size and a million more.
    let bound = u32::try_from(rec.records.len() as u64 + (1 << 20)).unwrap_or(u32::MAX);
    let m = super::journal::merge(&dir, &o.objects, Some(rec), journal::max_records(bound));
    let mut c = m.base.unwrap_or_default();
    c.records.extend(m.journaled);
    Ok(Some(c))
}

/// A directory without a record (from before records): its catalog says whose it is.
fn describe_from_catalog(dir: &Path, s: &mut Store) {
    let file = dir.join("catalog.table");
    if let Some((_m, t)) = crate::catalog::open_saved(&file) {
        let os = |b: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(b));
        s.source = Some(os(t.source_real_root()));
        s.pack = t.pack_dir().map(os);
        s.mount = t.pack_mount();
    }
    s.last_use = std::fs::symlink_metadata(&file)
        .or_else(|_| std::fs::symlink_metadata(dir))
        .ok()
        .map(|m| m.mtime());
}

/// Counts the directory's files: its own (catalog, record) and its copies, checked against the
/// record.
fn count_files(source_dir: &OwnedFd, rec: Option<&Copies>, s: &mut Store) {
    for name in list(source_dir) {
        if name.as_bytes() == b"objects" {
            continue;
        }
        if let Ok(c) = sys::copy_stat_at(source_dir, name.as_bytes()) {
            s.disk_bytes += c.allocated;
        }
    }
    let Ok(Some(objects)) =
        crate::tierdir::open_existing(&s.tier, &s.id).map(|o| o.map(|o| o.objects))
    else {
        return;
    };
    let recorded: std::collections::HashMap<u64, &copies::Record> = rec
        .map(|c| c.records.iter().map(|r| (r.object, r)).collect())
        .unwrap_or_default();
    let mut seen = 0u64;
    for name in list(&objects) {
        let b = name.as_bytes();
        let Ok(c) = sys::copy_stat_at(&objects, b) else {
            continue;
        };
        s.disk_bytes += c.allocated;
        let Some(object) = granary_shm::parse_object_name(b).filter(|_| c.is_regular) else {
            s.other_files += 1;
            continue;
        };
        s.files += 1;
        s.bytes += c.size;
        match recorded.get(&object) {
            Some(r) if r.size == c.size && r.copy == (c.ino, c.ctime_ns) && c.uid == sys::uid() => {
                s.valid += 1;
                seen += 1;
            }
            Some(_) => {
                s.changed += 1;
                seen += 1;
            }
            None => s.unrecorded += 1,
        }
    }
    s.missing = recorded.len() as u64 - seen;
}

/// Names in a directory, through a fresh fd of the verified one.
fn list(dir: &OwnedFd) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map(|rd| rd.flatten().map(|d| d.file_name()).collect())
        .unwrap_or_default()
}
