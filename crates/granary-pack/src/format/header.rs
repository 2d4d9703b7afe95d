//! The fixed headers: the index's (with its section table) and each partition's. Every header
//! ends with the xxh3 of the bytes before it.

use std::path::Path;

use super::fields::*;
use crate::error::{PackError, Result};

/// First bytes of every pack file.
pub const MAGIC: [u8; 8] = *b"GRANPACK";
pub const KIND_INDEX: [u8; 4] = *b"INDX";
pub const KIND_PARTITION: [u8; 4] = *b"PART";
/// Readers refuse another major version; a higher minor version only adds what old readers may
/// ignore (reserved fields, longer records).
pub const VERSION_MAJOR: u16 = 1;
pub const VERSION_MINOR: u16 = 0;

pub const INDEX_HEADER_LEN: usize = 256;
pub const PARTITION_HEADER_LEN: usize = 128;
pub const PARTITION_REC_LEN: usize = 32;

/// A byte range of the index file and the xxh3 of its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Section {
    pub off: u64,
    pub len: u64,
    pub sum: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexHeader {
    pub minor: u16,
    pub header_len: u32,
    pub entry_count: u64,
    pub partition_count: u32,
    pub block_size: u32,
    /// xxh3-128 of the partition table, entries and names: ties partitions to their index.
    pub pack_id: [u8; 16],
    pub partitions: Section,
    pub entries: Section,
    pub names: Section,
    pub entry_len: u32,
    pub partition_rec_len: u32,
    pub file_count: u64,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub dir_count: u64,
    pub symlink_count: u64,
    /// `info::*`: facts about the pack that readers may ignore.
    pub info: u32,
}

/// Bits of `IndexHeader::info`.
pub mod info {
    /// Made from a `--files` list: the source may hold more than the pack.
    pub const SUBSET: u32 = 1;
}

/// Checks the fields every pack file starts with; returns the header length.
fn check_preamble(b: &[u8], kind: [u8; 4], min_len: usize, path: &Path) -> Result<usize> {
    let what = if kind == KIND_INDEX {
        "index"
    } else {
        "partition"
    };
    if b.len() < 24 || get_bytes::<8>(b, 0) != MAGIC {
        return Err(PackError::corrupt(
            path,
            format!("not a granary pack {what} (no GRANPACK header)"),
        ));
    }
    if get_bytes::<4>(b, 8) != kind {
        return Err(PackError::corrupt(
            path,
            format!("not a pack {what} (wrong kind)"),
        ));
    }
    let (major, minor) = (get_u16(b, 12), get_u16(b, 14));
    if major != VERSION_MAJOR {
        return Err(PackError::Version {
            path: path.to_path_buf(),
            major,
            minor,
            supported: VERSION_MAJOR,
        });
    }
    let header_len = get_u32(b, 16) as usize;
    if header_len < min_len || header_len > b.len() || header_len % 8 != 0 {
        return Err(PackError::corrupt(
            path,
            format!(
                "{what} header length {header_len} (file has {} bytes)",
                b.len()
            ),
        ));
    }
    let stored = get_u64(b, header_len - 8);
    if checksum(&b[..header_len - 8]) != stored {
        return Err(PackError::corrupt(
            path,
            format!("{what} header checksum mismatch"),
        ));
    }
    if get_u32(b, 20) != 0 {
        return Err(PackError::corrupt(
            path,
            format!("{what} requires features this granary does not know"),
        ));
    }
    Ok(header_len)
}

fn put_preamble(b: &mut [u8], kind: [u8; 4]) {
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&kind);
    put_u16(b, 12, VERSION_MAJOR);
    put_u16(b, 14, VERSION_MINOR);
    put_u32(b, 16, b.len() as u32);
    put_u32(b, 20, 0);
}

fn seal(b: &mut [u8]) {
    let n = b.len();
    let sum = checksum(&b[..n - 8]);
    put_u64(b, n - 8, sum);
}

impl IndexHeader {
    /// Decodes and checks the header (magic, version, checksum); sections are checked by the index.
    pub fn decode(b: &[u8], path: &Path) -> Result<IndexHeader> {
        let header_len = check_preamble(b, KIND_INDEX, INDEX_HEADER_LEN, path)?;
        let section = |o| Section {
            off: get_u64(b, o),
            len: get_u64(b, o + 8),
            sum: get_u64(b, o + 16),
        };
        Ok(IndexHeader {
            minor: get_u16(b, 14),
            header_len: header_len as u32,
            entry_count: get_u64(b, 24),
            partition_count: get_u32(b, 32),
            block_size: get_u32(b, 36),
            pack_id: get_bytes::<16>(b, 40),
            partitions: section(56),
            entries: section(80),
            names: section(104),
            entry_len: get_u32(b, 128),
            partition_rec_len: get_u32(b, 132),
            file_count: get_u64(b, 136),
            raw_bytes: get_u64(b, 144),
            stored_bytes: get_u64(b, 152),
            dir_count: get_u64(b, 160),
            symlink_count: get_u64(b, 168),
            info: get_u32(b, 176),
        })
    }

    pub fn encode(&self) -> [u8; INDEX_HEADER_LEN] {
        let mut b = [0u8; INDEX_HEADER_LEN];
        put_preamble(&mut b, KIND_INDEX);
        put_u64(&mut b, 24, self.entry_count);
        put_u32(&mut b, 32, self.partition_count);
        put_u32(&mut b, 36, self.block_size);
        b[40..56].copy_from_slice(&self.pack_id);
        for (o, s) in [(56, self.partitions), (80, self.entries), (104, self.names)] {
            put_u64(&mut b, o, s.off);
            put_u64(&mut b, o + 8, s.len);
            put_u64(&mut b, o + 16, s.sum);
        }
        put_u32(&mut b, 128, self.entry_len);
        put_u32(&mut b, 132, self.partition_rec_len);
        put_u64(&mut b, 136, self.file_count);
        put_u64(&mut b, 144, self.raw_bytes);
        put_u64(&mut b, 152, self.stored_bytes);
        put_u64(&mut b, 160, self.dir_count);
        put_u64(&mut b, 168, self.symlink_count);
        put_u32(&mut b, 176, self.info);
        seal(&mut b);
        b
    }
}

/// One row of the index's partition table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionRec {
    /// Bytes after the partition's header: the partition file is exactly header + this long.
    pub data_len: u64,
    pub raw_bytes: u64,
    pub file_count: u32,
}

impl PartitionRec {
    pub fn decode(b: &[u8]) -> PartitionRec {
        PartitionRec {
            data_len: get_u64(b, 0),
            raw_bytes: get_u64(b, 8),
            file_count: get_u32(b, 16),
        }
    }
    pub fn encode(&self) -> [u8; PARTITION_REC_LEN] {
        let mut b = [0u8; PARTITION_REC_LEN];
        put_u64(&mut b, 0, self.data_len);
        put_u64(&mut b, 8, self.raw_bytes);
        put_u32(&mut b, 16, self.file_count);
        b
    }
}

/// The header at the start of each partition file; the files' stored bytes follow it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionHeader {
    pub header_len: u32,
    pub number: u32,
    pub partition_count: u32,
    pub pack_id: [u8; 16],
    pub data_len: u64,
    pub file_count: u32,
}

impl PartitionHeader {
    pub fn decode(b: &[u8], path: &Path) -> Result<PartitionHeader> {
        let header_len = check_preamble(b, KIND_PARTITION, PARTITION_HEADER_LEN, path)?;
        Ok(PartitionHeader {
            header_len: header_len as u32,
            number: get_u32(b, 24),
            partition_count: get_u32(b, 28),
            pack_id: get_bytes::<16>(b, 32),
            data_len: get_u64(b, 48),
            file_count: get_u32(b, 56),
        })
    }

    pub fn encode(&self) -> [u8; PARTITION_HEADER_LEN] {
        let mut b = [0u8; PARTITION_HEADER_LEN];
        put_preamble(&mut b, KIND_PARTITION);
        put_u32(&mut b, 24, self.number);
        put_u32(&mut b, 28, self.partition_count);
        b[32..48].copy_from_slice(&self.pack_id);
        put_u64(&mut b, 48, self.data_len);
        put_u32(&mut b, 56, self.file_count);
        seal(&mut b);
        b
    }
}

/// Recomputes every checksum of an index image in place (its header's and its sections'), so
/// tests and tools can build deliberately hostile indexes that only the structural checks catch.
pub fn reseal_index(b: &mut [u8]) {
    if b.len() < INDEX_HEADER_LEN {
        return;
    }
    let header_len = (get_u32(b, 16) as usize).clamp(INDEX_HEADER_LEN, b.len());
    for o in [56usize, 80, 104] {
        let (off, len) = (get_u64(b, o) as usize, get_u64(b, o + 8) as usize);
        if let Some(s) = off.checked_add(len).and_then(|end| b.get(off..end)) {
            let sum = checksum(s);
            put_u64(b, o + 16, sum);
        }
    }
    let sum = checksum(&b[..header_len - 8]);
    put_u64(b, header_len - 8, sum);
}
