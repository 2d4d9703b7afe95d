//! `granary cache verify`: every recorded copy re-read and hashed against the checksum recorded
//! when it was placed, and its file on the source checked to be the version it is a copy of
//! (one `statx` each, where the tree exists). Nothing is changed: a copy found wrong is never
//! served (clients check identities, the agent re-hashes reused copies) and is removed by the
//! source's next job or `granary cache clean`.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use granary_shm::{object_name, Table};
use serde::Serialize;

use super::copies::Copies;
use crate::sys;

/// What one source directory's copies are.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Verdict {
    /// Bytes as recorded, of the version the source holds (or, with no tree to ask, as recorded).
    pub valid: u64,
    /// Bytes that are not what was placed.
    pub damaged: Vec<String>,
    /// Recorded copies gone or replaced.
    pub missing: Vec<String>,
    /// Copies of a version of the file the source no longer holds (changed or removed).
    pub changed: Vec<String>,
    /// Copies whose source file could not be asked (no tree, or no catalog to name it).
    pub source_unchecked: u64,
}

impl Verdict {
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty() && self.missing.is_empty() && self.changed.is_empty()
    }
}

/// Verifies the copies `rec` records in `dir` (`<tier>/<id>`). `catalog` (the source's saved
/// catalog) names them; with `tree` (the source as a directory), each file is asked there.
pub fn verify(
    root: &Path,
    id: &str,
    rec: &Copies,
    catalog: Option<&Table>,
    tree: Option<&Path>,
) -> std::io::Result<Verdict> {
    let mut v = Verdict::default();
    let objects = match crate::tierdir::open_existing(root, id) {
        Ok(Some(o)) => o.objects,
        Ok(None) => {
            v.missing = rec
                .records
                .iter()
                .map(|r| name(catalog, r.object))
                .collect();
            return Ok(v);
        }
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    };
    let mut buf = vec![0u8; 1 << 20];
    for r in &rec.records {
        let n = || name(catalog, r.object);
        let obj = object_name(r.object);
        let there = sys::copy_stat_at(&objects, &obj).is_ok_and(|c| {
            c.is_regular && c.uid == sys::uid() && c.size == r.size && (c.ino, c.ctime_ns) == r.copy
        });
        let sum = there
            .then(|| sys::open_read_at(&objects, &obj).ok())
            .flatten()
            .and_then(|f| crate::placement::sweep::hash(&f, &mut buf).ok());
        match sum {
            None => {
                v.missing.push(n());
                continue;
            }
            Some(s) if s != r.checksum => {
                v.damaged.push(n());
                continue;
            }
            Some(_) => {}
        }
        let rel = catalog.and_then(|t| t.lookup_object(r.object).and_then(|i| t.rel_path_vec(i)));
        match (tree, rel) {
            (Some(tree), Some(rel)) => {
                let p = tree.join(std::ffi::OsStr::from_bytes(&rel));
                if sys::statx_nofollow(&p).is_ok_and(|s| r.is_copy_of(&s)) {
                    v.valid += 1;
                } else {
                    v.changed.push(n());
                }
            }
            _ => {
                v.valid += 1;
                v.source_unchecked += 1;
            }
        }
    }
    Ok(v)
}

/// The file a copy is of, by its path in the catalog (else its object name).
fn name(catalog: Option<&Table>, object: u64) -> String {
    catalog
        .and_then(|t| t.lookup_object(object).and_then(|i| t.rel_path_vec(i)))
        .map(|r| String::from_utf8_lossy(&r).into_owned())
        .unwrap_or_else(|| format!("object {}", String::from_utf8_lossy(&object_name(object))))
}

/// The saved catalog of source id `id` in any of `roots` (the first tier of whichever tiers it
/// was last saved with), to name copies and find their files on the source.
pub fn find_catalog(roots: &[PathBuf], id: &str) -> Option<(granary_shm::Mapping, Table)> {
    roots.iter().find_map(|r| {
        crate::tierdir::existing_source_dir(r, id).ok().flatten()?;
        crate::catalog::open_saved(&r.join(id).join("catalog.table"))
    })
}
