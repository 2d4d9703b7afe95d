//! A packed source: a source served from a pack (docs/pack-format.md, "Serving a pack"). The
//! pack's index becomes the catalog, so a job asks the source for nothing per file, and placement streams whole
//! partitions instead of reading files (`placement::pack_streamer`).
//!
//! Two ways to serve one:
//! - **with the original tree** (`granary run --source DIR --pack PACK`): before the program
//!   starts, every directory of the tree is compared with the index — one `statx` each; a
//!   directory whose identity (inode, mtime, ctime) is the one packed cannot have other names, so
//!   its files are taken from the index; one that changed is listed and its changed or new files
//!   are served from the source (`catalog`). After the start the source sees no metadata call.
//! - **pack only** (`--mount PATH`): the index is the truth; the tree exists nowhere else.
//!
//! `catalog`: the index as the catalog, checked per directory; `check`: a job joining others
//! checks the tree again; `damage`: what was found damaged, for the job's report; here: the
//! opened index (`PackIndex`), its `Partitions` for placement, and the conversion of the pack's
//! stat records into the table's (`stat_rec`).

pub mod catalog;
pub mod check;
pub mod damage;
mod stat;

use std::path::{Path, PathBuf};

use granary_pack::format::header::{INDEX_HEADER_LEN, PARTITION_REC_LEN};
use granary_pack::format::{partition_file, IndexHeader, PartitionRec, INDEX_FILE};
use granary_pack::Index;

pub use catalog::{build, Built};
pub use check::recheck;
pub use stat::stat_rec;

/// An opened pack's index, mapped and checked completely (every checksum, the whole
/// structure), and the directory it is in.
pub struct PackIndex {
    /// The pack directory (canonical).
    pub dir: PathBuf,
    pub index: Index<memmap2::Mmap>,
}

impl PackIndex {
    pub fn open(dir: &Path) -> Result<PackIndex, granary_pack::PackError> {
        let dir = std::fs::canonicalize(dir).map_err(|e| granary_pack::PackError::io(dir, e))?;
        let index = granary_pack::map_index(&dir)?;
        Ok(PackIndex { dir, index })
    }

    /// What placement needs once the index is no longer mapped.
    pub fn partitions(&self) -> Partitions {
        let h = *self.index.header();
        Partitions {
            dir: self.dir.clone(),
            records: (0..h.partition_count)
                .map(|n| self.index.partition(n).unwrap_or_default())
                .collect(),
            header: h,
        }
    }
}

/// The pack's partitions (where they are, the index header and each partition's record), as
/// the pack streamer opens and checks them (`placement::pack_streamer`).
#[derive(Clone, Debug)]
pub struct Partitions {
    pub dir: PathBuf,
    pub header: IndexHeader,
    /// One per partition, in order.
    pub records: Vec<PartitionRec>,
}

impl Partitions {
    pub fn partition_path(&self, n: u32) -> PathBuf {
        self.dir.join(partition_file(n))
    }

    /// The index header and partition table as bytes (cluster mode: rank 0 sends them with
    /// its catalog, so no other rank reads the index).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.header.encode().to_vec();
        for p in &self.records {
            b.extend_from_slice(&p.encode());
        }
        b
    }

    /// `encode`'s bytes for the pack at `dir`: the header checked (its checksum) and a record
    /// for each of its partitions, else `None`.
    pub fn decode(dir: &Path, b: &[u8]) -> Option<Partitions> {
        let head = b.get(..INDEX_HEADER_LEN)?;
        let header = IndexHeader::decode(head, &dir.join(INDEX_FILE)).ok()?;
        let recs = &b[INDEX_HEADER_LEN..];
        if recs.len() != header.partition_count as usize * PARTITION_REC_LEN {
            return None;
        }
        Some(Partitions {
            dir: dir.to_path_buf(),
            header,
            records: recs
                .chunks_exact(PARTITION_REC_LEN)
                .map(PartitionRec::decode)
                .collect(),
        })
    }
}
