//! The on-disk format (docs/pack-format.md is its specification): explicit little-endian
//! records at fixed offsets, so the index can be used straight from a mapping and nothing
//! depends on a Rust struct layout.
//!
//! A pack is a directory holding `index` and `part-00000`, `part-00001`, …

pub mod entry;
pub(crate) mod fields;
pub mod header;
pub mod name;

pub use entry::{IndexEntry, Stat, Timestamp};
pub use fields::checksum;
pub use header::{
    IndexHeader, PartitionHeader, PartitionRec, KIND_INDEX, KIND_PARTITION, MAGIC, VERSION_MAJOR,
    VERSION_MINOR,
};

pub const INDEX_FILE: &str = "index";

/// `part-00042`: sorted names, one per partition.
pub fn partition_file(n: u32) -> String {
    format!("part-{n:05}")
}

/// Raw bytes per frame of a framed file (a power of two between these bounds).
pub const DEFAULT_BLOCK_SIZE: u32 = 1 << 20;
pub const MIN_BLOCK_SIZE: u32 = 1 << 12;
pub const MAX_BLOCK_SIZE: u32 = 1 << 26;
