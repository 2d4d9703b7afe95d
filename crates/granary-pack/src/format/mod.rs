//! The on-disk format (docs/pack-format.md is its specification): explicit little-endian
//! records at fixed offsets, so the index can be used straight from a mapping and nothing
//! depends on a Rust struct layout.
//!
//! A pack is a directory holding `index` and `part-00000`, `part-00001`, …

pub mod entry;
pub mod header;
pub mod name;

pub use entry::{IndexEntry, Stat, Timestamp};
pub use header::{IndexHeader, PartitionHeader, PartitionRec};

/// First bytes of every pack file.
pub const MAGIC: [u8; 8] = *b"GRANPACK";
pub const KIND_INDEX: [u8; 4] = *b"INDX";
pub const KIND_PARTITION: [u8; 4] = *b"PART";
/// Readers refuse another major version; a higher minor version only adds what old readers may
/// ignore (reserved fields, longer records).
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 0;

pub const INDEX_FILE: &str = "index";

/// `part-00042`: sorted names, one per partition.
pub fn partition_file(n: u32) -> String {
    format!("part-{n:05}")
}

/// Raw bytes per frame of a framed file (a power of two between these bounds).
pub const DEFAULT_BLOCK_SIZE: u32 = 1 << 20;
pub const MIN_BLOCK_SIZE: u32 = 1 << 12;
pub const MAX_BLOCK_SIZE: u32 = 1 << 26;

/// xxh3-64, the one checksum of the format.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

// Field access that never panics: a short slice reads as zeros, which the validators then reject
// (every record is length-checked before its fields are used).
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .unwrap_or(0)
}
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .unwrap_or(0)
}
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}
pub(crate) fn get_i64(b: &[u8], off: usize) -> i64 {
    get_u64(b, off) as i64
}
pub(crate) fn get_bytes<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    b.get(off..off + N)
        .and_then(|s| s.try_into().ok())
        .unwrap_or([0; N])
}

pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
