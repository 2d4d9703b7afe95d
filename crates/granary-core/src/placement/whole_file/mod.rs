//! Whole-file fetch of a large file (size ≥ `prefetch_min_size`), started by the program's first
//! open: the agent is the only reader of the source, in `block_size` sequential reads, writing
//! `<object>.part` and publishing `progress` after each block so the program's reads are served
//! from the part as soon as it covers them (docs/placement.md).
//!
//! Order of publication, relied on by the preload library: `reset_progress` happens before the
//! state word names a tier (`PLACING | tier`), the part file exists before that word is stored,
//! a block's bytes are written before `progress` covers them, and the part is renamed to the
//! object name (same inode: open fds keep working) before PLACED. When a tier fails the part is
//! unlinked before progress is reset and the next tier is announced, so a client holding the old
//! word finds no file (and reads the source) rather than someone else's bytes.

mod direct;
pub mod order;
pub mod threshold;

use std::os::fd::OwnedFd;

use granary_shm::lifecycle;
use granary_shm::{part_name, Table};

use order::{Next, Order};

use super::buffers::{aligned, DIRECT_ALIGN};
use super::copy::{
    begin, open_started, place_on_tiers, still_ours, write_all_at, CopyError, Opened, SourceReader,
    Written, SETTLE,
};
use super::engine::Engine;
use super::mmap::Follower;
use super::outcome::PlaceOutcome;
use super::source_ctx::SourceCtx;
use crate::stats::AgentCounters;
use crate::sync::thread;
use crate::sys;

/// The first read of a fetch; each next one doubles, up to the block size.
const RAMP_START: usize = 1 << 20;
/// The pieces a fetch keeps track of (`whole_file::order`), at most: never more than one block, the
/// largest read the worker's buffer takes (`whole_file::order` reads at least one piece at a time).
const ORDER_UNIT: u64 = 1 << 20;
/// What a fetch reads this soon after it started stays in the page cache: a program that
/// opened the file may be about to map it.
const MAP_GRACE: std::time::Duration = std::time::Duration::from_millis(300);

pub fn fetch(ctx: &SourceCtx, idx: u32, engine: &Engine, buf: &mut Vec<u8>) -> PlaceOutcome {
    let b = match begin(ctx, idx) {
        Ok(b) => b,
        Err(out) => return out,
    };
    // Room first: a file no tier can take never costs the source an open.
    let size = b.entry.stat.size;
    let order = engine.policy.tiers_for(size, &ctx.space.tiers);
    // None of the policy's tiers has room: cluster mode may hold room elsewhere for it (its
    // staging tier), reserved in one step with the decision, so no other copy takes it between.
    let remote = ctx.remote.get();
    let (order, res, overflow) = match ctx.space.reserve_on(&order, size) {
        Some(res) => (order, res, false),
        None => match remote.and_then(|r| r.overflow(ctx, b.idx, size)) {
            Some(res) => (vec![res.tier()], res, true),
            None => return super::partial::no_room_for_whole(ctx, b, engine, buf),
        },
    };
    // One source stream for the whole file: sequential reads of one file are what a PFS serves
    // best, and the cap keeps many workers (and nodes) from hammering it. A program may be
    // waiting on this fetch: it never backs off.
    let _stream = engine.stream_for(ctx, true);
    let mut cl = match open_started(ctx, b) {
        Ok(cl) => cl,
        Err(out) => return out,
    };
    // Through the page cache, not O_DIRECT: a program that maps the file (now, or a moment
    // from now: its open started this fetch) faults the source's pages itself, and must find
    // the ones the agent read — or is reading — there, so no byte is read twice. What the
    // copy took is dropped behind it (`copy_part`) unless a program maps the file.
    let block = (engine.params.block_size as usize).max(DIRECT_ALIGN) / DIRECT_ALIGN * DIRECT_ALIGN;
    let mut reader = SourceReader::new_buffered(&cl.src);
    let direct = direct::wanted(&ctx.mmap, idx, size);
    let out = place_on_tiers(ctx, &mut cl, &order, res, |cl, tier, dir| {
        copy_part(ctx, cl, &mut reader, tier, dir, buf, block, direct)
    });
    if !ctx.mmap.is_mapped(idx) {
        tracing::trace!("entry {idx}: fetch done, the source's pages dropped");
        sys::fadvise(&cl.src, 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    if let (true, Some(r), PlaceOutcome::Placed { .. }) = (overflow, remote, &out) {
        r.overflowed(ctx, idx);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn copy_part(
    ctx: &SourceCtx,
    cl: &mut Opened,
    reader: &mut SourceReader,
    tier: usize,
    dir: &OwnedFd,
    buf: &mut Vec<u8>,
    block: usize,
    direct: bool,
) -> Result<Written, CopyError> {
    let buf = aligned(buf, block);
    let t = &ctx.table;
    let idx = cl.idx;
    let name = part_name(cl.entry.object);
    // A part left by a killed agent (or an earlier attempt) is never continued: its bytes were
    // never published as complete and may be torn.
    let _ = sys::unlink_at(dir, &name);
    let out = sys::create_excl_at(dir, &name, 0o600).map_err(CopyError::Tier)?;
    // From here on, a failure unlinks the part before the next tier is announced.
    let res = (|| {
        let size = cl.entry.stat.size;
        // The part has the file's length from the start: holes stay holes, and pieces read
        // out of order (where a program reads) land where they belong. Readers of the part
        // trust only `progress`, the prefix written.
        out.set_len(size).map_err(CopyError::Tier)?;
        // Clients check the part they open against this inode; recorded before the state
        // names the tier, with no ctime yet (the part changes until it is complete).
        let (ino, _) = sys::copy_identity(&out).map_err(CopyError::Tier)?;
        if !lifecycle::announce_part(t, idx, tier as u8, ino) {
            return Err(CopyError::Lost);
        }
        let memory = sys::is_memory_fs(&out);
        let c = &ctx.counters;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        if direct {
            if let Some(n) = direct::read_whole(ctx, cl, reader, buf)? {
                write_all_at(&out, &buf[..n], 0).map_err(CopyError::Tier)?;
                hasher.update(&buf[..n]);
                lifecycle::progress(t, idx, size);
                if !memory {
                    settle(&ctx.table, &ctx.mmap, idx, &out, 0, size);
                }
                if !still_ours(&ctx.table, idx) {
                    return Err(CopyError::Lost);
                }
                return Ok(hasher.digest().max(1));
            }
        }
        let mut hashed = 0u64;
        let mut last: Option<(u64, u64)> = None;
        // Read, and not needed by a program that maps the file (yet): dropped once the next
        // read is done, if still no program maps it (one that is about to — its open started
        // this fetch — finds them).
        let mut drop_later: Option<(u64, u64)> = None;
        let mut order = Order::new(size, ORDER_UNIT.min(buf.len() as u64), &cl.extents);
        // The first reads are short and grow to a block: a program waiting for the file's
        // first bytes (its first record, through a mapping or a read) gets them in the time of
        // a short read, not of a whole block.
        let mut ramp = RAMP_START.min(buf.len());
        let mut waited = 0u32;
        let began = std::time::Instant::now();
        // Which of the source's pages are in the page cache (made when a reader is first seen).
        let mut cached_pages: Option<Option<sys::CachedPages>> = None;
        let mut res = Vec::new();
        loop {
            let steer = ctx.mmap.steering(idx);
            let (readers, window, lead, idle) =
                steer.as_ref().map_or((&[][..], 0, 0, false), |s| {
                    (&s.readers[..], s.window, s.lead, s.idle)
                });
            // While programs map this source's files, reads are short: a program's fault (or a
            // new mapping's first one) waits at the source behind what the agent has in flight
            // there (`mmap::in_flight`).
            let flight = ctx.mmap.flight();
            let max = if ctx.mmap.followed() > 0 {
                (ramp as u64).min(flight.piece())
            } else {
                ramp as u64
            };
            // Pages all in the page cache now (read ahead for a reader, or by it): copied first
            // (`whole_file::order`), while they cost the source nothing.
            let mut cached = |off: u64, len: u64| {
                if cached_pages.is_none() {
                    cached_pages = Some(sys::CachedPages::of(&cl.src).ok());
                }
                cached_pages
                    .as_ref()
                    .and_then(|c| c.as_ref())
                    .is_some_and(|c| {
                        c.resident(off, len, &mut res).is_ok()
                            && !res.is_empty()
                            && res.iter().all(|&m| m & 1 == 1)
                    })
            };
            let next = order.next(readers, window, lead, idle, max, &mut cached);
            if !matches!(next, Next::Wait) {
                tracing::trace!("entry {idx}: {next:?} for readers {readers:?} (idle {idle})");
            }
            let (off, len, keep) = match next {
                Next::Done => break,
                Next::Wait => {
                    // Everything left is ahead of the readers: wait for them to read it
                    // (bounded: the follower says `idle` once they stop).
                    waited += 1;
                    if waited % 64 == 0 && !still_ours(&ctx.table, idx) {
                        return Err(CopyError::Lost);
                    }
                    thread::sleep(std::time::Duration::from_millis(2));
                    continue;
                }
                Next::Read { off, len, keep } => (off, len, keep),
            };
            if let Some((o, n)) = drop_later.take() {
                // Not in the first moments: the program whose open started this fetch may be
                // about to map the file (the agent learns of it within milliseconds).
                if steer.is_none() && began.elapsed() >= MAP_GRACE {
                    tracing::trace!("entry {idx}: dropped [{o}, {}) behind the fetch", o + n);
                    sys::fadvise(&cl.src, o, n, libc::POSIX_FADV_DONTNEED);
                }
            }
            let n = len as usize;
            let b = &mut buf[..n];
            // Only the data: holes are zeros in the part already.
            let (mut got, mut hit) = (0usize, 0usize);
            for (s, e) in data_in(&cl.extents, off, off + len) {
                let (i, j) = ((s - off) as usize, (e - off) as usize);
                b[got..i].fill(0);
                // What a program's faults (or read-ahead) already brought in costs the source
                // nothing: counted apart.
                let h = reader.cached(&cl.src, &mut b[i..j], s);
                let r = if i + h == j {
                    0
                } else {
                    let _in_flight = flight.sync_read((j - i - h) as u64);
                    match reader.read_exact_at(&cl.src, &mut b[i + h..j], s + h as u64, j - i - h) {
                        Ok(_) => j - i - h,
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                            return Err(CopyError::Changed)
                        }
                        Err(e) => return Err(CopyError::Source(e)),
                    }
                };
                AgentCounters::add(&c.source_reads, 1);
                AgentCounters::add(&c.source_bytes, r as u64);
                hit += h;
                write_all_at(&out, &b[i..j], s).map_err(CopyError::Tier)?;
                got = j;
            }
            b[got..].fill(0);
            if hit < n {
                tracing::trace!("entry {idx}: [{off}, +{len}): {hit} bytes cached, the rest read");
            }
            AgentCounters::add(&c.page_cache_bytes, hit as u64);
            ramp = (ramp * 2).min(buf.len());
            if off == hashed {
                hasher.update(&buf[..n]);
                hashed += len;
            }
            order.mark(off, len);
            // Pieces read earlier out of order that now continue the prefix: hashed from the
            // part (written, so readable), in order.
            let prefix = order.prefix_bytes();
            while hashed < prefix {
                let k = ((prefix - hashed) as usize).min(buf.len());
                read_part(&out, &mut buf[..k], hashed).map_err(CopyError::Tier)?;
                hasher.update(&buf[..k]);
                hashed += k as u64;
            }
            // Written bytes are visible to every process that opens the part: publish them.
            lifecycle::progress(t, idx, prefix);
            if !memory {
                // Start write-back of this block now, and wait for the previous one and drop
                // its pages: dirty pages never pile up (Monarch's figure-19 stall), and the
                // tier's copy does not double the page cache.
                sys::sync_range(&out, off, len, libc::SYNC_FILE_RANGE_WRITE);
                if let Some((po, pn)) = last {
                    settle(&ctx.table, &ctx.mmap, idx, &out, po, pn);
                }
            }
            if !keep {
                drop_later = Some((off, len));
            }
            last = Some((off, len));
            if !still_ours(&ctx.table, idx) {
                return Err(CopyError::Lost);
            }
        }
        if let Some((o, n)) = drop_later {
            if !ctx.mmap.is_mapped(idx) {
                sys::fadvise(&cl.src, o, n, libc::POSIX_FADV_DONTNEED);
            }
        }
        // The file may have grown since the walk: a byte past `size` means it changed (one
        // byte: readahead never goes past EOF, so this costs no device read).
        if matches!(reader.read_at(&cl.src, &mut buf[..1], size), Ok(n) if n > 0) {
            return Err(CopyError::Changed);
        }
        if !memory {
            if let Some((po, pn)) = last {
                settle(&ctx.table, &ctx.mmap, idx, &out, po, pn);
            }
        }
        Ok(hasher.digest().max(1))
    })();
    match res {
        Ok(sum) => Ok(Written {
            name: name.to_vec(),
            sum,
            file: out,
        }),
        Err(e) => {
            let _ = sys::unlink_at(dir, &name);
            Err(e)
        }
    }
}

/// The data ranges of `[a, b)` (`extents`: the source's data, ascending).
fn data_in(extents: &[(u64, u64)], a: u64, b: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
    extents
        .iter()
        .filter(move |&&(s, e)| s < b && a < e)
        .map(move |&(s, e)| (s.max(a), e.min(b)))
}

/// Reads back what was written to the part (to hash it in order).
fn read_part(f: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, off)
}

/// Waits for a written range to reach the device. Its pages stay if the copy is resident:
/// clean pages cost the kernel nothing to reclaim (only dirty ones stall, Monarch's figure 19),
/// and they are exactly what the next epoch reads (dropping them made placed epochs 1.2× slower
/// than Local under a memory cap). A transient copy's pages go (`residency`), even though a
/// program still to read them (a `mmap` of the finished copy) then reads them from the tier:
/// left for the program's reads to drop, they stayed cached (dirty when read) and crowded the
/// resident copies out. Measured: the mmap workload's epoch 1 reads 280 MB of 483 again from
/// local disk, at no measurable cost in time (0.19 × PFS-direct, 0.20 before).
///
/// While a program maps the file, the copy's pages go too: that program reads the source's
/// pages (its mapping was made before the copy was complete), and two cached copies of what it
/// reads leave the read-ahead ahead of it no room (measured: three readers of a 384 MiB LMDB
/// under a 256 MiB cap read 16–42 % of it twice, the kernel evicting read-ahead pages before
/// they were read).
fn settle(t: &Table, mmap: &Follower, idx: u32, out: &std::fs::File, off: u64, len: u64) {
    sys::sync_range(out, off, len, SETTLE);
    if t.is_transient(idx) || mmap.is_mapped(idx) {
        sys::fadvise(out, off, len, libc::POSIX_FADV_DONTNEED);
    }
}
