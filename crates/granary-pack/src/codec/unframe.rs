//! Decoding framed files (docs/pack-format.md, "Stored bytes of a file"), without allocating:
//! raw frames are copied, holes left as they are (the caller's output is zeroed, or it skips
//! them), lz4 frames decompressed straight into the output, zstd frames with a decompression
//! context in memory the caller lends (`Workspace`). The preload library calls this inside
//! `open()` of a program, where nothing may allocate (preload rule 5); the agent and the pack
//! reader call the same code.

use std::fmt;

use super::frame::{self, frame_count, frame_raw_len};
use super::zstd_dctx;

/// Why stored bytes are not a framed file's bytes: the pack is damaged (or hostile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame's stored bytes are not the length its word says.
    LengthMismatch,
    /// A raw frame of `stored` bytes where the file has `raw`.
    RawLength { stored: usize, raw: usize },
    /// A hole frame with stored bytes.
    HoleWithBytes,
    /// An lz4 frame that does not decode to exactly its raw length.
    Lz4,
    /// A zstd frame that does not decode to exactly its raw length.
    Zstd,
    /// No memory for zstd's decompression context.
    NoWorkspace,
    /// The frame table is shorter than the file's frame count.
    TableCutShort,
    /// The frames (and table) add up to `frames` bytes, the index says `stored`.
    Sum { frames: u64, stored: u64 },
    /// A frame runs past the stored bytes.
    BeyondStored,
    /// Bytes after the last frame.
    Trailing,
    /// A block size of 0, or a file too large for this machine's address space.
    Geometry,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FrameError::LengthMismatch => f.write_str("frame length mismatch"),
            FrameError::RawLength { stored, raw } => {
                write!(f, "raw frame of {stored} bytes where {raw} expected")
            }
            FrameError::HoleWithBytes => f.write_str("hole frame with stored bytes"),
            FrameError::Lz4 => f.write_str("lz4 frame does not decode to its length"),
            FrameError::Zstd => f.write_str("zstd frame does not decode to its length"),
            FrameError::NoWorkspace => f.write_str("no memory to decode a zstd frame"),
            FrameError::TableCutShort => f.write_str("frame table cut short"),
            FrameError::Sum { frames, stored } => {
                write!(
                    f,
                    "frames add up to {frames} bytes, the index says {stored}"
                )
            }
            FrameError::BeyondStored => f.write_str("frame beyond stored bytes"),
            FrameError::Trailing => f.write_str("bytes after the last frame"),
            FrameError::Geometry => f.write_str("impossible block size or file size"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Memory for zstd's decompression context, asked for at the first zstd frame: the preload
/// library maps it only then, the agent keeps a `Vec` per thread.
pub trait Workspace {
    /// At least `len` bytes, or `None` (the frame then does not decode: `NoWorkspace`).
    fn room(&mut self, len: usize) -> Option<&mut [u8]>;
}

impl Workspace for Vec<u8> {
    fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.len() < len {
            self.resize(len, 0);
        }
        Some(&mut self[..])
    }
}

/// Decodes one frame (`word`, its `stored` bytes) into `out`, exactly the frame's raw length.
/// A hole leaves `out` untouched: it is zeros already in the caller's output, or the caller
/// skips holes.
pub fn decode_frame(
    word: u32,
    stored: &[u8],
    out: &mut [u8],
    ws: &mut impl Workspace,
) -> Result<(), FrameError> {
    if stored.len() != frame::len(word) {
        return Err(FrameError::LengthMismatch);
    }
    match frame::kind(word) {
        frame::RAW => {
            if stored.len() != out.len() {
                return Err(FrameError::RawLength {
                    stored: stored.len(),
                    raw: out.len(),
                });
            }
            out.copy_from_slice(stored);
        }
        frame::ZERO => {
            if !stored.is_empty() {
                return Err(FrameError::HoleWithBytes);
            }
        }
        frame::LZ4 => {
            if !lz4_flex::block::decompress_into(stored, out).is_ok_and(|n| n == out.len()) {
                return Err(FrameError::Lz4);
            }
        }
        _ => {
            let ws = ws
                .room(zstd_dctx::workspace_len())
                .ok_or(FrameError::NoWorkspace)?;
            if !zstd_dctx::decompress(ws, stored, out) {
                return Err(FrameError::Zstd);
            }
        }
    }
    Ok(())
}

/// Checks a framed file's frame table (the first `4 × frame_count` stored bytes) against the
/// file's stored length.
fn check_table(table: &[u8], stored_len: u64, size: u64, block: u32) -> Result<(), FrameError> {
    if block == 0 {
        return Err(FrameError::Geometry);
    }
    let n = frame_count(size, block);
    if table.len() as u64 != n * 4 {
        return Err(FrameError::TableCutShort);
    }
    let frames: u64 = words(table).map(|w| frame::len(w) as u64).sum();
    if n * 4 + frames != stored_len {
        return Err(FrameError::Sum {
            frames: n * 4 + frames,
            stored: stored_len,
        });
    }
    Ok(())
}

fn words(table: &[u8]) -> impl Iterator<Item = u32> + '_ {
    table
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Checks a framed file's frame table against its stored length; returns the words (for a
/// reader that gets the frames piece by piece).
pub fn frame_table(
    table: &[u8],
    stored_len: u64,
    size: u64,
    block: u32,
) -> Result<Vec<u32>, FrameError> {
    check_table(table, stored_len, size, block)?;
    Ok(words(table).collect())
}

/// Decodes a whole framed file: `stored` is its frame table and frames, `out` exactly its size
/// and zeroed (holes are left as they are).
pub fn unframe(
    stored: &[u8],
    out: &mut [u8],
    block: u32,
    ws: &mut impl Workspace,
) -> Result<(), FrameError> {
    let size = out.len() as u64;
    if block == 0 {
        return Err(FrameError::Geometry);
    }
    let table_len =
        usize::try_from(frame_count(size, block) * 4).map_err(|_| FrameError::Geometry)?;
    let table = stored.get(..table_len).ok_or(FrameError::TableCutShort)?;
    check_table(table, stored.len() as u64, size, block)?;
    let mut at = table_len;
    for (k, w) in words(table).enumerate() {
        let len = frame::len(w);
        let src = stored.get(at..at + len).ok_or(FrameError::BeyondStored)?;
        let start = k * block as usize;
        let raw = frame_raw_len(k as u64, size, block);
        decode_frame(w, src, &mut out[start..start + raw], ws)?;
        at += len;
    }
    if at != stored.len() {
        return Err(FrameError::Trailing);
    }
    Ok(())
}
