//! Opening a partition file: its header must match the index that names it (number, pack id,
//! length), and the file must be exactly as long as the index says — a cut or extended
//! partition is refused before any of its bytes are used.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{PackError, Result};
use crate::format::header::PARTITION_HEADER_LEN;
use crate::format::{IndexHeader, PartitionHeader, PartitionRec};

/// An open, checked partition.
#[derive(Debug)]
pub struct Partition {
    pub file: File,
    pub header: PartitionHeader,
}

pub fn open(
    path: &Path,
    number: u32,
    index: &IndexHeader,
    rec: &PartitionRec,
) -> Result<Partition> {
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            PackError::corrupt(path, "missing (the pack is incomplete)")
        }
        _ => PackError::io(path, e),
    })?;
    check(file, path, number, index, rec)
}

/// `open` of a file the caller opened at `path` (e.g. to advise the kernel on it before the
/// header is read).
pub fn check(
    file: File,
    path: &Path,
    number: u32,
    index: &IndexHeader,
    rec: &PartitionRec,
) -> Result<Partition> {
    let len = file.metadata().map_err(|e| PackError::io(path, e))?.len();
    let mut head = vec![0u8; PARTITION_HEADER_LEN];
    read_exact_at(&file, &mut head, 0, path)?;
    let header_len = crate::format::fields::get_u32(&head, 16) as usize;
    if header_len > PARTITION_HEADER_LEN && header_len as u64 <= len && header_len <= 1 << 20 {
        head.resize(header_len, 0);
        read_exact_at(&file, &mut head, 0, path)?;
    }
    let header = PartitionHeader::decode(&head, path)?;
    let bad = |what: String| PackError::corrupt(path, what);
    if header.number != number || header.partition_count != index.partition_count {
        return Err(bad(format!(
            "partition {}/{} where the index expects {number}/{}",
            header.number, header.partition_count, index.partition_count
        )));
    }
    if header.pack_id != index.pack_id {
        return Err(bad(
            "belongs to another pack (pack id differs from the index's)".into(),
        ));
    }
    if header.data_len != rec.data_len || header.file_count != rec.file_count {
        return Err(bad(format!(
            "header says {} data bytes in {} files, the index {} in {}",
            header.data_len, header.file_count, rec.data_len, rec.file_count
        )));
    }
    let want = header.header_len as u64 + header.data_len;
    if len != want {
        return Err(bad(format!(
            "{} bytes long where {want} expected ({})",
            len,
            if len < want { "truncated" } else { "extended" }
        )));
    }
    Ok(Partition { file, header })
}

/// `read_exact_at` whose short read is a clear "truncated" error.
pub fn read_exact_at(file: &File, buf: &mut [u8], off: u64, path: &Path) -> Result<()> {
    file.read_exact_at(buf, off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            PackError::corrupt(
                path,
                format!("truncated: {} bytes at {off} missing", buf.len()),
            )
        } else {
            PackError::io(path, e)
        }
    })
}
