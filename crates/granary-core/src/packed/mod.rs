//! Serving a pack (docs/pack-format.md, "Serving a pack"): the pack's index becomes the
//! catalog, so a job asks the source for nothing per file, and placement streams whole
//! partitions instead of reading files (`placement::partition`).
//!
//! Two ways to serve one:
//! - **with the original tree** (`granary run --source DIR --pack PACK`): before the program
//!   starts, every directory of the tree is compared with the index — one `statx` each; a
//!   directory whose identity (inode, mtime, ctime) is the one packed cannot have other names, so
//!   its files are taken from the index; one that changed is listed and its changed or new files
//!   are served from the source (`catalog`). After the start the source sees no metadata call.
//! - **pack only** (`--mount PATH`): the index is the truth; the tree exists nowhere else.

pub mod catalog;
pub mod check;
pub mod damage;

use std::path::{Path, PathBuf};

use granary_pack::format::header::{INDEX_HEADER_LEN, PARTITION_REC_LEN};
use granary_pack::format::{partition_file, IndexHeader, PartitionRec, INDEX_FILE};
use granary_pack::Index;

pub use catalog::{build, Built};
pub use check::recheck;

/// An opened pack: its index, checked completely (every checksum, the whole structure).
pub struct Pack {
    /// The pack directory (canonical).
    pub dir: PathBuf,
    pub index: Index<memmap2::Mmap>,
}

impl Pack {
    pub fn open(dir: &Path) -> Result<Pack, granary_pack::PackError> {
        let dir = std::fs::canonicalize(dir).map_err(|e| granary_pack::PackError::io(dir, e))?;
        let index = granary_pack::map_index(&dir)?;
        Ok(Pack { dir, index })
    }

    /// What placement needs once the index is no longer mapped.
    pub fn layout(&self) -> Layout {
        let h = *self.index.header();
        Layout {
            dir: self.dir.clone(),
            partitions: (0..h.partition_count)
                .map(|n| self.index.partition(n).unwrap_or_default())
                .collect(),
            header: h,
        }
    }
}

/// The pack's partitions, as the partition streamer opens and checks them.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
    pub header: IndexHeader,
    pub partitions: Vec<PartitionRec>,
}

impl Layout {
    pub fn partition_path(&self, n: u32) -> PathBuf {
        self.dir.join(partition_file(n))
    }

    /// The index header and partition table as bytes (cluster mode: rank 0 sends them with
    /// its catalog, so no other rank reads the index).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = self.header.encode().to_vec();
        for p in &self.partitions {
            b.extend_from_slice(&p.encode());
        }
        b
    }

    /// `encode`'s bytes for the pack at `dir`: the header checked (its checksum) and a record
    /// for each of its partitions, else `None`.
    pub fn decode(dir: &Path, b: &[u8]) -> Option<Layout> {
        let head = b.get(..INDEX_HEADER_LEN)?;
        let header = IndexHeader::decode(head, &dir.join(INDEX_FILE)).ok()?;
        let recs = &b[INDEX_HEADER_LEN..];
        if recs.len() != header.partition_count as usize * PARTITION_REC_LEN {
            return None;
        }
        Some(Layout {
            dir: dir.to_path_buf(),
            header,
            partitions: recs
                .chunks_exact(PARTITION_REC_LEN)
                .map(PartitionRec::decode)
                .collect(),
        })
    }
}
