//! Chunk files: the partial copy of a file too large for any tier's free space
//! (`State::Partial`), as fixed-size chunks of a sparse `<object>.chunks` file.
//!
//! Format (`granary_shm::layout`): a header — `CHUNK_MAGIC`, `CHUNK_VERSION`, chunk size, source
//! size, mtime, chunk count, ctime, device, inode, then one xxh3 per chunk (0 = absent) — padded to
//! 4096 bytes; chunk `k` at `chunk_data_offset(size, chunk) + k × chunk`. Like mountpoint-s3's
//! disk cache blocks, the header is versioned and names the source version it was cut from, and
//! every chunk carries a checksum, so a chunk file left by an earlier run is reused only where
//! its bytes provably belong to the current source.
//!
//! Order of a chunk write: data first, then its checksum in the header, and only then the
//! table's bit (`Table::set_chunk`) — a set bit promises complete bytes to clients, and a
//! checksum on disk promises them to the next run.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use granary_shm::layout::{
    chunk_count, chunk_data_offset, CHUNK_HEADER_FIXED, CHUNK_MAGIC, CHUNK_VERSION,
};

use crate::sys;

/// The fixed header fields: which source version and geometry a chunk file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGeometry {
    pub chunk_size: u64,
    /// Source size in bytes.
    pub size: u64,
    /// The source version the chunks were cut from: mtime, ctime (sec, nsec), device, inode.
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub dev: (u32, u32),
    pub ino: u64,
}

impl ChunkGeometry {
    /// The geometry of `stat`'s file cut in `chunk_size` chunks.
    pub fn of(stat: &granary_shm::StatRec, chunk_size: u64) -> ChunkGeometry {
        ChunkGeometry {
            chunk_size,
            size: stat.size,
            mtime: (stat.mtime.sec, stat.mtime.nsec),
            ctime: (stat.ctime.sec, stat.ctime.nsec),
            dev: (stat.dev_major, stat.dev_minor),
            ino: stat.ino,
        }
    }
    pub fn count(&self) -> u64 {
        chunk_count(self.size, self.chunk_size)
    }
    pub fn data_offset(&self) -> u64 {
        chunk_data_offset(self.size, self.chunk_size)
    }
    /// Byte range of chunk `k` in the source (the last chunk may be short).
    pub fn range(&self, k: u64) -> (u64, u64) {
        let start = k * self.chunk_size;
        (start, self.chunk_size.min(self.size.saturating_sub(start)))
    }
    fn header_fixed(&self) -> [u8; CHUNK_HEADER_FIXED] {
        let mut h = [0u8; CHUNK_HEADER_FIXED];
        h[0..8].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&CHUNK_VERSION.to_le_bytes());
        h[16..24].copy_from_slice(&self.chunk_size.to_le_bytes());
        h[24..32].copy_from_slice(&self.size.to_le_bytes());
        h[32..40].copy_from_slice(&self.mtime.0.to_le_bytes());
        h[40..44].copy_from_slice(&self.mtime.1.to_le_bytes());
        h[48..56].copy_from_slice(&self.count().to_le_bytes());
        h[56..64].copy_from_slice(&self.ctime.0.to_le_bytes());
        h[64..68].copy_from_slice(&self.ctime.1.to_le_bytes());
        h[68..72].copy_from_slice(&self.dev.0.to_le_bytes());
        h[72..76].copy_from_slice(&self.dev.1.to_le_bytes());
        h[80..88].copy_from_slice(&self.ino.to_le_bytes());
        h
    }
}

fn checksum_offset(k: u64) -> u64 {
    CHUNK_HEADER_FIXED as u64 + 8 * k
}

/// xxh3 of a chunk's bytes as recorded in the header (never 0, which means absent).
pub fn chunk_hash(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data).max(1)
}

/// An open chunk file.
#[derive(Debug)]
pub struct ChunkFile {
    file: File,
    pub geo: ChunkGeometry,
}

/// Opens `name` in `dir` read-write, never through a symlink. `/proc/self/fd/N/` resolves to the
/// directory the fd holds (not to a path someone could swap), and `O_NOFOLLOW` guards the name.
fn open_rw_at(dir: &OwnedFd, name: &[u8]) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(std::ffi::OsStr::from_bytes(name));
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
}

impl ChunkFile {
    /// Creates a new chunk file (O_EXCL, 0600) with every chunk absent. Its length covers every
    /// chunk, but holes take no space: only written chunks do.
    pub fn create(dir: &OwnedFd, name: &[u8], geo: ChunkGeometry) -> io::Result<ChunkFile> {
        if geo.chunk_size == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let file = sys::create_excl_at(dir, name, 0o600)?;
        let init = || -> io::Result<()> {
            file.write_all_at(&geo.header_fixed(), 0)?;
            file.set_len(geo.data_offset() + geo.size)
        };
        if let Err(e) = init() {
            let _ = sys::unlink_at(dir, name);
            return Err(e);
        }
        // Writes only; reopen read-write so the same handle can validate later.
        drop(file);
        let file = open_rw_at(dir, name)?;
        Ok(ChunkFile { file, geo })
    }

    /// Opens an existing chunk file if its header matches `geo` (same format version, same
    /// source size and mtime, same chunk size); `None` if it belongs to something else.
    pub fn open_matching(
        dir: &OwnedFd,
        name: &[u8],
        geo: ChunkGeometry,
    ) -> io::Result<Option<ChunkFile>> {
        let file = open_rw_at(dir, name)?;
        let mut h = [0u8; CHUNK_HEADER_FIXED];
        if file.read_exact_at(&mut h, 0).is_err() || h != geo.header_fixed() {
            return Ok(None);
        }
        if file.metadata()?.len() < geo.data_offset() + geo.size {
            return Ok(None);
        }
        Ok(Some(ChunkFile { file, geo }))
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The chunk file's inode: clients open it only if it is still this file.
    pub fn ino(&self) -> u64 {
        crate::sys::dev_ino(&self.file).map_or(0, |(_, ino)| ino)
    }

    /// The checksum recorded for chunk `k` (0: absent).
    pub fn recorded(&self, k: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.file.read_exact_at(&mut b, checksum_offset(k))?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes chunk `k` (exactly its length, the last one may be short), then its checksum.
    /// Only after this returns Ok may the table's bit be set.
    pub fn write_chunk(&self, k: u64, data: &[u8]) -> io::Result<()> {
        let (_, len) = self.geo.range(k);
        if k >= self.geo.count() || data.len() as u64 != len {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        self.file
            .write_all_at(data, self.geo.data_offset() + k * self.geo.chunk_size)?;
        // The data must be on its way before the header says it is there: a crash in between
        // leaves a checksum over bytes that never landed, which validation then rejects.
        self.file.sync_data()?;
        self.file
            .write_all_at(&chunk_hash(data).to_le_bytes(), checksum_offset(k))
    }

    /// Forgets chunk `k` (checksum 0). Its blocks stay allocated until the chunk is rewritten or
    /// the file is deleted: the capacity accounting charges present chunks only.
    pub fn drop_chunk(&self, k: u64) -> io::Result<()> {
        self.file
            .write_all_at(&0u64.to_le_bytes(), checksum_offset(k))
    }

    /// Re-hashes every chunk that has a checksum; drops the ones that do not match. Returns the
    /// present chunks as bitmap words (bit k of word k/64), as `CatalogEntry.chunks` wants.
    pub fn validate(&self) -> io::Result<Vec<u64>> {
        let n = self.geo.count();
        let mut words = vec![0u64; n.div_ceil(64) as usize];
        let mut buf = vec![0u8; self.geo.chunk_size as usize];
        for k in 0..n {
            let sum = self.recorded(k)?;
            if sum == 0 {
                continue;
            }
            let (_, len) = self.geo.range(k);
            let data = &mut buf[..len as usize];
            let ok = self
                .file
                .read_exact_at(data, self.geo.data_offset() + k * self.geo.chunk_size)
                .is_ok()
                && chunk_hash(data) == sum;
            if ok {
                words[(k / 64) as usize] |= 1 << (k % 64);
            } else {
                self.drop_chunk(k)?;
            }
        }
        Ok(words)
    }
}

/// Bytes of the present chunks in `words` (what a reused chunk file is charged).
pub fn present_bytes(geo: &ChunkGeometry, words: &[u64]) -> u64 {
    (0..geo.count())
        .filter(|&k| is_set(words, k))
        .map(|k| geo.range(k).1)
        .sum()
}

fn is_set(words: &[u64], k: u64) -> bool {
    words
        .get((k / 64) as usize)
        .is_some_and(|w| w & (1 << (k % 64)) != 0)
}

/// Coalescing: a request for chunk `first` becomes one read of `first` and the missing chunks
/// right after it, up to `max_bytes` (the block size, at least one chunk) and the end of the
/// file. Returns the number of chunks to read (0 if `first` is present or out of range).
pub fn coalesce(
    geo: &ChunkGeometry,
    first: u64,
    max_bytes: u64,
    present: impl Fn(u64) -> bool,
) -> u64 {
    if first >= geo.count() || present(first) {
        return 0;
    }
    let max = (max_bytes / geo.chunk_size.max(1)).max(1);
    let mut n = 1;
    while n < max && first + n < geo.count() && !present(first + n) {
        n += 1;
    }
    n
}

/// Reads chunks `first..first + n` from the source in one read and writes each into the chunk
/// file; `done(k)` runs after chunk k is complete (set the table bit there). Returns source bytes
/// read. `buf` must hold `n` chunks. A short read (the source shrank) is an error: the chunks
/// already written stay valid, the rest are not written.
pub fn fetch(
    src: &File,
    cf: &ChunkFile,
    first: u64,
    n: u64,
    buf: &mut Vec<u8>,
    mut done: impl FnMut(u64),
) -> io::Result<u64> {
    let geo = cf.geo;
    let (start, _) = geo.range(first);
    let last = first + n - 1;
    let (lstart, llen) = geo.range(last);
    let total = (lstart + llen - start) as usize;
    buf.resize(total.max(buf.len()), 0);
    src.read_exact_at(&mut buf[..total], start)?;
    for k in first..=last {
        let (s, len) = geo.range(k);
        let at = (s - start) as usize;
        cf.write_chunk(k, &buf[at..at + len as usize])?;
        done(k);
    }
    Ok(total as u64)
}
