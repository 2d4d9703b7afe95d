//! What a served pack turned out to hold that cannot be served: partitions the streamer refused
//! (missing, cut, another pack's, a damaged header) and files whose stored bytes failed their
//! checksum. The partition streamer keeps it per table; every job's statistics carry it
//! (`stats::PackDamage`), so the job's report names the pack, how many of its files could not
//! be served from it, what is wrong and the command that names every damaged file — a damaged
//! pack makes a job slower (or, with the pack alone, some opens fail with EIO), never silently.

use std::collections::BTreeMap;
use std::path::Path;

use crate::stats::PackDamage;
use crate::sync::Mutex;

/// Lines of `PackDamage::problems` at most (the count is always complete).
const MAX_PROBLEMS: usize = 10;

#[derive(Debug, Default)]
pub struct Damage {
    found: Mutex<Found>,
}

#[derive(Debug, Default)]
struct Found {
    /// Refused partitions: number → (files of the table in it, why).
    partitions: BTreeMap<u32, (u64, String)>,
    /// Damaged files of partitions that were not refused: table entry → what is wrong.
    files: BTreeMap<u32, String>,
}

impl Damage {
    fn found(&self) -> crate::sync::MutexGuard<'_, Found> {
        self.found.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Partition `n`, holding `files` files of the table, cannot be used: `why`.
    pub fn partition(&self, n: u32, files: u64, why: String) {
        self.found().partitions.entry(n).or_insert((files, why));
    }

    /// Table entry `idx`'s stored bytes are damaged: `what` (its path and the fault).
    pub fn file(&self, idx: u32, what: String) {
        self.found().files.entry(idx).or_insert(what);
    }

    /// The damage found so far in the pack at `pack`, if any.
    pub fn report(&self, pack: &Path) -> Option<PackDamage> {
        let f = self.found();
        if f.partitions.is_empty() && f.files.is_empty() {
            return None;
        }
        let mut d = PackDamage::new(pack);
        d.files = f.partitions.values().map(|p| p.0).sum::<u64>() + f.files.len() as u64;
        d.problems = f
            .partitions
            .values()
            .map(|(n, why)| format!("{why}: {n} files in it"))
            .chain(f.files.values().cloned())
            .take(MAX_PROBLEMS)
            .collect();
        Some(d)
    }
}

/// `e`, from opening the pack at `dir` to serve it, as damage: its index (or what stands in
/// for it) is damaged, so no file can be served from it. `None` for other errors (not a pack,
/// a newer format, the system's).
pub fn of_open_error(dir: &Path, e: &granary_pack::PackError) -> Option<PackDamage> {
    if !e.is_damage() {
        return None;
    }
    let mut d = PackDamage::new(dir);
    d.index = true;
    d.problems = vec![e.to_string()];
    // Its header has a checksum of its own: when it holds, it says how many files are lost.
    let index = dir.join(granary_pack::format::INDEX_FILE);
    let mut head = vec![0u8; granary_pack::format::header::INDEX_HEADER_LEN];
    let read = std::fs::File::open(&index)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok();
    if let Some(h) = read
        .then(|| granary_pack::format::IndexHeader::decode(&head, &index).ok())
        .flatten()
    {
        d.files = h.file_count;
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_file_once_and_partitions_whole() {
        let d = Damage::default();
        assert_eq!(d.report(Path::new("/p")), None);
        d.partition(1, 300, "/p/part-00001: truncated".into());
        d.partition(1, 300, "/p/part-00001: again".into());
        d.file(7, "a/b: checksum mismatch".into());
        d.file(7, "a/b: checksum mismatch".into());
        let r = d.report(Path::new("/p")).unwrap();
        assert_eq!(r.files, 301);
        assert_eq!(
            r.problems,
            [
                "/p/part-00001: truncated: 300 files in it",
                "a/b: checksum mismatch"
            ]
        );
        assert_eq!(r.verify, "granary pack verify /p");
    }
}
