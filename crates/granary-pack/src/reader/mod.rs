//! Reading a pack: its index, and each file's bytes out of its partition. A file's bytes are
//! handed out only once they match the index's checksum, so a damaged pack gives an error,
//! never wrong bytes.

mod resolve;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::codec::{decode_frame, frame_count, frame_raw_len, frame_table};
use crate::error::{PackError, Result};
use crate::format::entry::codec;
use crate::format::{partition_file, IndexEntry};
use crate::index::Index;
use crate::listing::escape;
use crate::partition::{self, read_exact_at, Partition};

/// Files up to this size are read, checked and then handed out from memory.
pub const MEMORY_LIMIT: u64 = 256 << 20;
/// Reads of uncompressed data in pieces of this size.
const PIECE: u64 = 8 << 20;

pub struct Pack {
    dir: PathBuf,
    index: Index<Vec<u8>>,
    parts: Vec<OnceLock<Partition>>,
}

impl Pack {
    /// Opens the pack directory `dir` and checks its index completely (partitions are checked
    /// when first used).
    pub fn open(dir: &Path) -> Result<Pack> {
        let (path, mut f) = crate::locate::open_index(dir)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| PackError::io(&path, e))?;
        let index = Index::parse(bytes, &path)?;
        let parts = (0..index.header().partition_count)
            .map(|_| OnceLock::new())
            .collect();
        Ok(Pack {
            dir: dir.to_path_buf(),
            index,
            parts,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn index(&self) -> &Index<Vec<u8>> {
        &self.index
    }

    pub fn partition_path(&self, n: u32) -> PathBuf {
        self.dir.join(partition_file(n))
    }

    /// Partition `n`, opened and checked against the index on first use.
    pub fn partition(&self, n: u32) -> Result<&Partition> {
        let slot = self
            .parts
            .get(n as usize)
            .ok_or_else(|| PackError::corrupt(self.index.path(), format!("no partition {n}")))?;
        if let Some(p) = slot.get() {
            return Ok(p);
        }
        let rec = self
            .index
            .partition(n)
            .ok_or_else(|| PackError::corrupt(self.index.path(), format!("no partition {n}")))?;
        let p = partition::open(&self.partition_path(n), n, self.index.header(), &rec)?;
        let _ = slot.set(p);
        slot.get()
            .ok_or_else(|| PackError::corrupt(self.index.path(), "partition slot"))
    }

    fn entry_of(&self, i: u32) -> Result<IndexEntry> {
        let e = self
            .index
            .entry(i)
            .ok_or_else(|| PackError::corrupt(self.index.path(), format!("no entry {i}")))?;
        if !e.stat.is_file() {
            let what = if e.stat.is_dir() {
                "a directory"
            } else if e.stat.is_symlink() {
                "a symlink"
            } else {
                "not a regular file"
            };
            return Err(PackError::Invalid(format!(
                "{}: {what}",
                String::from_utf8_lossy(&self.index.path_of(i))
            )));
        }
        Ok(e)
    }

    /// Decodes entry `i`'s bytes in order into `sink`, then checks them against the index's
    /// checksum. `sink` may have seen bytes when an error is returned: use `read_file` or
    /// `copy_to` unless the caller verifies separately.
    pub fn stream(&self, i: u32, sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> Result<()> {
        let e = self.entry_of(i)?;
        let p = self.partition(e.partition)?;
        let ppath = self.partition_path(e.partition);
        // Every error names the file first (`verify` prints them as they are).
        let bad = |what: String| {
            PackError::corrupt(
                &ppath,
                format!("{}: {what}", escape(&self.index.path_of(i))),
            )
        };
        let read_at = |buf: &mut [u8], off: u64| {
            read_exact_at(&p.file, buf, off, &ppath).map_err(|e| match e {
                PackError::Corrupt { what, .. } => bad(what),
                e => e,
            })
        };
        if e.offset < p.header.header_len as u64 {
            return Err(bad("data overlaps the partition header".into()));
        }
        let sink_err = |err: std::io::Error| PackError::io("<output>", err);
        let mut hash = xxhash_rust::xxh3::Xxh3::new();
        match e.codec {
            codec::NONE => {
                let mut at = 0;
                let mut buf = Vec::new();
                while at < e.stored_len {
                    let n = (e.stored_len - at).min(PIECE) as usize;
                    buf.resize(n, 0);
                    read_at(&mut buf, e.offset + at)?;
                    hash.update(&buf);
                    sink(&buf).map_err(sink_err)?;
                    at += n as u64;
                }
            }
            codec::FRAMED => {
                let block = self.index.header().block_size;
                let n = frame_count(e.stat.size, block);
                let mut table = vec![0u8; (n * 4) as usize];
                read_at(&mut table, e.offset)?;
                let words = frame_table(&table, e.stored_len, e.stat.size, block)
                    .map_err(|m| bad(m.to_string()))?;
                let mut at = e.offset + table.len() as u64;
                let (mut stored, mut raw, mut zstd) = (Vec::new(), Vec::new(), Vec::new());
                for (k, &w) in words.iter().enumerate() {
                    stored.resize(crate::codec::frame::len(w), 0);
                    read_at(&mut stored, at)?;
                    raw.clear();
                    raw.resize(frame_raw_len(k as u64, e.stat.size, block), 0);
                    decode_frame(w, &stored, &mut raw, &mut zstd)
                        .map_err(|m| bad(format!("frame {k}: {m}")))?;
                    hash.update(&raw);
                    sink(&raw).map_err(sink_err)?;
                    at += stored.len() as u64;
                }
            }
            c => return Err(bad(format!("unknown codec {c}"))),
        }
        if hash.digest() != e.checksum {
            return Err(bad("checksum mismatch: the stored bytes are damaged".into()));
        }
        Ok(())
    }

    /// Entry `i`'s bytes, checked (files up to `MEMORY_LIMIT`).
    pub fn read_file(&self, i: u32) -> Result<Vec<u8>> {
        let e = self.entry_of(i)?;
        if e.stat.size > MEMORY_LIMIT {
            return Err(PackError::Invalid(format!(
                "{}: {} bytes, too large to read into memory (use copy_to)",
                String::from_utf8_lossy(&self.index.path_of(i)),
                e.stat.size
            )));
        }
        let mut out = Vec::with_capacity(e.stat.size as usize);
        self.stream(i, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    /// Writes entry `i`'s bytes to `w` only after checking them: files up to `MEMORY_LIMIT`
    /// from memory, larger ones by a checking pass and then a writing pass.
    pub fn copy_to(&self, i: u32, w: &mut dyn Write) -> Result<u64> {
        let e = self.entry_of(i)?;
        let out_err = |err| PackError::io("<output>", err);
        if e.stat.size <= MEMORY_LIMIT {
            let bytes = self.read_file(i)?;
            w.write_all(&bytes).map_err(out_err)?;
            return Ok(bytes.len() as u64);
        }
        self.stream(i, &mut |_| Ok(()))?;
        self.stream(i, &mut |b| w.write_all(b))?;
        Ok(e.stat.size)
    }

    /// Follows symlinks inside the pack (see `resolve`).
    pub fn resolve(&self, path: &[u8]) -> Result<u32> {
        resolve::resolve(&self.index, path)
    }
}

/// Opens a partition without an index (for tools that inspect one file).
pub fn partition_header(path: &Path) -> Result<crate::format::PartitionHeader> {
    let f = File::open(path).map_err(|e| PackError::io(path, e))?;
    let mut head = vec![0u8; crate::format::header::PARTITION_HEADER_LEN];
    read_exact_at(&f, &mut head, 0, path)?;
    crate::format::PartitionHeader::decode(&head, path)
}
