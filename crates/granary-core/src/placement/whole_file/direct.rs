//! A mid-size file (up to `granary_shm::DIRECT_FETCH_MAX`) fetched whole in one direct read.
//!
//! Through the page cache, a read of a 700 KiB file lands in ~175 scattered 4 KiB pages, and a
//! block device takes at most `max_segments` of them per request (128 on loop devices and most
//! NVMe drives): two requests per file, where a source that charges per request (the
//! benchmark's emulated PFS: 150 requests/s) is then read at half speed. A direct read into the
//! worker's huge-page buffer (`buffers::aligned`) is one physically contiguous request.
//!
//! The page cache is what a mapping of the file would share with the fetch (issue 11: no byte
//! read twice), so a direct fetch is only made when no program maps the file, and the library's
//! `mmap` of a file of this size still being fetched waits for the copy instead of mapping the
//! source (`granary_preload::place::on_map`; the wait is one request long).

use crate::placement::buffers::{align_up, DIRECT_ALIGN};
use crate::placement::copy::{CopyError, Opened, SourceReader};
use crate::placement::mmap::Follower;
use crate::placement::source_ctx::SourceCtx;
use crate::stats::AgentCounters;
use crate::sys;

/// Whether entry `idx`, of `size` bytes, is fetched in one direct read: small enough for the
/// library's `mmap` to wait for it, and mapped by no program the agent follows.
pub(super) fn wanted(mmap: &Follower, idx: u32, size: u64) -> bool {
    size <= granary_shm::DIRECT_FETCH_MAX && !mmap.is_mapped(idx)
}

/// Reads the whole source file of `cl` into the start of `buf` with `O_DIRECT`, and says how
/// many bytes it holds (the file's size). `None`: not done here (a sparse source, whose holes
/// the copy keeps; a buffer too small; a file system that refuses direct reads) — the caller
/// fetches it through the page cache. A file whose length is no longer the catalog's is
/// `Changed`: the read asks for one block past the end, so growth is seen in the same request.
pub(super) fn read_whole(
    ctx: &SourceCtx,
    cl: &Opened,
    reader: &mut SourceReader,
    buf: &mut [u8],
) -> Result<Option<usize>, CopyError> {
    let size = cl.entry.stat.size;
    let want = align_up(size + 1) as usize;
    if cl.sparse() || want > buf.len() || buf.as_ptr() as usize % DIRECT_ALIGN != 0 {
        return Ok(None);
    }
    if sys::set_direct(&cl.src, true).is_err() {
        return Ok(None);
    }
    let res = read_direct(&ctx.mmap, cl, reader, &mut buf[..want]);
    // The rest of the fetch (the end-of-file probe, drop-behind) uses the page cache.
    let restored = sys::set_direct(&cl.src, false);
    let (got, calls) = match res {
        Ok(r) => r,
        // Refused (alignment the file system wants larger, or no direct I/O at all): nothing
        // was transferred, the caller reads it through the page cache.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::debug!("{}: direct read refused ({e})", cl.path.display());
            return match restored {
                Ok(()) => Ok(None),
                Err(e) => Err(CopyError::Source(e)),
            };
        }
        Err(e) => return Err(CopyError::Source(e)),
    };
    restored.map_err(CopyError::Source)?;
    let c = &ctx.counters;
    AgentCounters::add(&c.source_reads, calls);
    AgentCounters::add(&c.source_bytes, got as u64);
    if got as u64 != size {
        return Err(CopyError::Changed);
    }
    Ok(Some(got))
}

/// Direct reads from offset 0 until `buf` is full or the file ends; (bytes, read calls). A
/// direct read is short only at end of file (or, on some network file systems, at a block
/// boundary, where the next read continues).
fn read_direct(
    mmap: &Follower,
    cl: &Opened,
    reader: &mut SourceReader,
    buf: &mut [u8],
) -> std::io::Result<(usize, u64)> {
    let _in_flight = mmap.flight().sync_read(buf.len() as u64);
    let (mut got, mut calls) = (0usize, 0u64);
    while got < buf.len() {
        let n = reader.read_at(&cl.src, &mut buf[got..], got as u64)?;
        calls += 1;
        got += n;
        if n == 0 || got % DIRECT_ALIGN != 0 {
            break;
        }
    }
    Ok((got, calls))
}
