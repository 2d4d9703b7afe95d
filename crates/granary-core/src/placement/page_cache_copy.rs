//! Copies of small files (size < `prefetch_min_size`) from the page cache. The program reads a
//! small file from the source itself (it must never wait for the agent); right after (CLOSED,
//! or `small_copy_delay` after the open) the agent copies it with `preadv2(RWF_NOWAIT)`, which
//! returns only pages already cached, so the copy costs the source nothing. Bytes whose pages
//! are gone already are read normally and counted as `duplicate_bytes` (the program read them
//! from the source too).

use std::os::fd::OwnedFd;

use super::copy::{
    begin, hash_zeros, open_started, place_on_tiers, write_all_at, CopyError, Opened, Written,
    SETTLE,
};
use super::engine::{Engine, Held};
use super::outcome::PlaceOutcome;
use super::source_ctx::SourceCtx;
use crate::stats::AgentCounters;
use crate::sync::statics::{AtomicU64, Ordering};
use crate::sync::thread;
use crate::sys;

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Reads past the cached run are this small, so a partly cached file costs the source only
/// what is missing (the next cached run is tried again after it).
const UNCACHED_READ: usize = 128 << 10;

/// `closed`: the program closed the file, so the source's pages may be dropped once copied.
pub fn copy_small(
    ctx: &SourceCtx,
    idx: u32,
    engine: &Engine,
    buf: &mut Vec<u8>,
    closed: bool,
) -> PlaceOutcome {
    let b = match begin(ctx, idx) {
        Ok(b) => b,
        Err(out) => return out,
    };
    // Room first: a file no tier can take never costs the source an open.
    let size = b.entry.stat.size;
    let order = engine.policy.tiers_for(size, &ctx.space.tiers);
    let Some(res) = ctx.space.reserve_on(&order, size) else {
        return super::partial::no_room_for_whole(ctx, b, engine, buf);
    };
    let mut cl = match open_started(ctx, b) {
        Ok(cl) => cl,
        Err(out) => return out,
    };
    let mut stream = None;
    let out = place_on_tiers(ctx, &mut cl, &order, res, |cl, _tier, dir| {
        copy_tmp(ctx, cl, dir, buf, engine, &mut stream)
    });
    if closed && matches!(out, PlaceOutcome::Placed { .. }) {
        // The copy holds these bytes now and the program is done with them: two copies of every
        // file in a capped page cache would leave the next epoch half the hits.
        sys::fadvise(&cl.src, 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    out
}

fn copy_tmp<'s>(
    ctx: &SourceCtx,
    cl: &mut Opened,
    dir: &OwnedFd,
    buf: &mut [u8],
    engine: &'s Engine,
    stream: &mut Option<Held<'s>>,
) -> Result<Written, CopyError> {
    let tmp = format!(
        ".tmp-{:016x}-{}-{}",
        cl.entry.object,
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    )
    .into_bytes();
    let out = sys::create_excl_at(dir, &tmp, 0o600).map_err(CopyError::Tier)?;
    let res = (|| {
        let size = cl.entry.stat.size;
        if cl.sparse() {
            // Holes stay holes: the copy has the file's length, and only data is written.
            out.set_len(size).map_err(CopyError::Tier)?;
        }
        let c = &ctx.counters;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut off = 0u64;
        let mut nowait = true;
        for &(start, end) in &cl.extents.clone() {
            if off < start {
                hash_zeros(&mut hasher, start - off);
                off = start;
            }
            while off < end {
                let want = buf.len().min((end - off) as usize);
                let cached = if nowait {
                    match pread_cached(&cl.src, &mut buf[..want], off) {
                        Ok(n) => n,
                        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => 0,
                        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                            // The file system cannot tell what is cached: read normally (and count
                            // it as a duplicate, the conservative answer).
                            nowait = false;
                            0
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(CopyError::Source(e)),
                    }
                } else {
                    0
                };
                let n = if cached > 0 {
                    AgentCounters::add(&c.page_cache_bytes, cached as u64);
                    cached
                } else {
                    // Not cached: the program's pages were evicted (or never cached). One stream,
                    // taken once per file, as for any source read; nobody waits for this copy,
                    // made by a thread of the idle class (`pool`): through the background slot.
                    if stream.is_none() {
                        *stream = Some(engine.stream_for_idle());
                    }
                    let want = want.min(if nowait { UNCACHED_READ } else { want });
                    let n =
                        match std::os::unix::fs::FileExt::read_at(&cl.src, &mut buf[..want], off) {
                            Ok(0) => return Err(CopyError::Changed),
                            Ok(n) => n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(CopyError::Source(e)),
                        };
                    AgentCounters::add(&c.source_reads, 1);
                    AgentCounters::add(&c.source_bytes, n as u64);
                    AgentCounters::add(&c.duplicate_bytes, n as u64);
                    n
                };
                hasher.update(&buf[..n]);
                write_all_at(&out, &buf[..n], off).map_err(CopyError::Tier)?;
                off += n as u64;
            }
        }
        hash_zeros(&mut hasher, size - off);
        let mut probe = [0u8; 1];
        if matches!(std::os::unix::fs::FileExt::read_at(&cl.src, &mut probe, size), Ok(n) if n > 0)
        {
            return Err(CopyError::Changed);
        }
        if !sys::is_memory_fs(&out) {
            if ctx.table.is_transient(cl.idx) {
                // Not to be kept in the page cache: written back now, so its pages can go.
                sys::sync_range(&out, 0, size, SETTLE);
                sys::fadvise(&out, 0, 0, libc::POSIX_FADV_DONTNEED);
            } else {
                sys::sync_range(&out, 0, size, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
        Ok(hasher.digest().max(1))
    })();
    match res {
        Ok(sum) => Ok(Written {
            name: tmp,
            sum,
            file: out,
        }),
        Err(e) => {
            let _ = sys::unlink_at(dir, &tmp);
            Err(e)
        }
    }
}

/// `preadv2(RWF_NOWAIT)`, retried twice over ~1 ms: EAGAIN also means "a page is still
/// under I/O" (another reader's readahead of this file is in flight), not only "not cached",
/// and reading the source for that would be a needless duplicate.
fn pread_cached(src: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut tries = 0;
    loop {
        match sys::pread_nowait(src, buf, off) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 2 => {
                tries += 1;
                thread::sleep(std::time::Duration::from_micros(500));
            }
            other => return other,
        }
    }
}
