//! The format's primitives: little-endian fields at fixed offsets, and its one checksum.

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
