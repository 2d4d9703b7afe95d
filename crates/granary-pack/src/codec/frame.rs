//! The frames of a framed file: one 32-bit word per frame (its kind in the top two bits, its
//! stored length in the low 30), and how a file of a given size is cut into frames.

/// A frame's kind (`kind`): its bytes stored as they are, a hole (nothing stored), lz4, zstd.
pub const RAW: u32 = 0;
pub const ZERO: u32 = 1;
pub const LZ4: u32 = 2;
pub const ZSTD: u32 = 3;
/// The stored length's bits of a frame word.
pub const LEN_MASK: u32 = (1 << 30) - 1;
/// The word of a frame of `kind` stored in `len` bytes.
pub fn word(kind: u32, len: usize) -> u32 {
    kind << 30 | (len as u32 & LEN_MASK)
}
pub fn kind(word: u32) -> u32 {
    word >> 30
}
pub fn len(word: u32) -> usize {
    (word & LEN_MASK) as usize
}

/// Number of frames of a framed file of `size` bytes.
pub fn frame_count(size: u64, block: u32) -> u64 {
    size.div_ceil(block as u64)
}

/// Raw length of frame `i` of a file of `size` bytes.
pub fn frame_raw_len(i: u64, size: u64, block: u32) -> usize {
    let start = i * block as u64;
    size.saturating_sub(start).min(block as u64) as usize
}
