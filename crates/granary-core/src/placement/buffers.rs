//! The workers' read buffers: direct-read alignment (`DIRECT_ALIGN`) and huge-page-backed
//! blocks (`worker_buffer`, `aligned`).

use crate::sys;

/// Alignment of direct reads (buffer address, file offset, length): the largest logical block
/// size in practice; 4096 covers 512-byte devices too.
pub const DIRECT_ALIGN: usize = 4096;

/// `x` rounded up to `DIRECT_ALIGN`.
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(DIRECT_ALIGN as u64) * DIRECT_ALIGN as u64
}

/// Where a worker buffer has room, its reads start at a boundary of this size, in memory the
/// kernel is asked to back with transparent huge pages. A direct read into 4 KiB pages that are
/// not physically contiguous goes out in requests of at most `max_segments` pages (128 × 4 KiB =
/// 512 KiB on loop devices and most NVMe drives); into a huge page, as one request of up to
/// `max_sectors_kb`. Measured on the benchmark's emulated PFS: a 700 KiB file cost 2 requests,
/// now 1.
const HUGE_ALIGN: usize = 2 << 20;

/// A worker's scratch buffer for reads of `block` bytes, with the slack `aligned` uses. The
/// slack is address space only: zeroed allocations this large are mapped on first touch.
pub fn worker_buffer(block: u64) -> Vec<u8> {
    vec![0u8; block.max(DIRECT_ALIGN as u64) as usize + HUGE_ALIGN]
}

/// `len` bytes of `buf` starting at a `HUGE_ALIGN`-aligned address if `buf` has room (with a
/// huge-page hint), else at a `DIRECT_ALIGN`-aligned one (`buf` grows if needed).
pub fn aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len + DIRECT_ALIGN {
        buf.resize(len + DIRECT_ALIGN, 0);
    }
    let ptr = buf.as_ptr() as usize;
    let huge = ptr.wrapping_neg() % HUGE_ALIGN;
    if huge + len <= buf.len() {
        let b = &mut buf[huge..huge + len];
        sys::hugepage_hint(b, HUGE_ALIGN);
        return b;
    }
    let at = ptr.wrapping_neg() % DIRECT_ALIGN;
    &mut buf[at..at + len]
}
