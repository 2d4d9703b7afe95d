//! Partial copies (`State::Partial`): a file no tier has room for, kept as fixed-size chunks of
//! a sparse `<object>.chunks` file (`placement::chunks`) on the tier with most free space.
//!
//! When a placement finds no room for the whole file and the file has a chunk bitmap, the
//! chunk file is created, the entry becomes `PARTIAL | tier << 8`, and the worker fetches
//! chunks sequentially from the start (a streaming reader wants them next) while capacity
//! allows. A client read that misses a chunk pushes CHUNK; the agent fetches that chunk and the
//! missing ones right after it, up to `block_size`, in one source read.
//!
//! Per chunk: reserve its bytes (no room: stop), write it, checksum it into the header, commit
//! the reservation, and only then set the table's bit. Commit and bit happen together under the
//! entry's lock, and dropping the chunk file (INVALIDATE, DAMAGED) clears the bits, unlinks the
//! file and releases the charge of the set bits under the same lock: the tier is charged exactly
//! for the chunks whose bits are set, so it is released once, however the two race.
//!
//! - `partials`: the entries touched and their chunk files (`Partials`), knowing nothing of
//!   `SourceCtx`; here: placing, fetching, dropping and accounting chunks.

pub(super) mod partials;

pub use partials::Partials;
use partials::Slot;

use granary_shm::{chunks_name, EntryRec, State, StateWord, Table};

use super::buffers::{align_up, aligned, DIRECT_ALIGN};
use super::chunks::{self, ChunkFile, ChunkGeometry};
use super::copy::{matches_catalog, no_room, open_source, source_only, SourceReader, Started};
use super::engine::Engine;
use super::mmap::Follower;
use super::outcome::PlaceOutcome;
use super::policy::free_space;
use super::source_ctx::SourceCtx;
use super::space::Space;
use crate::stats::AgentCounters;
use crate::sync::{lock, Arc, Mutex};
use crate::sys;
use crate::tiers::Tiers;

/// The chunk geometry of an entry in this table.
fn geometry(t: &Table, e: &EntryRec) -> ChunkGeometry {
    ChunkGeometry::of(&e.stat, t.chunk_size())
}

/// Bytes charged on `tiers`' tier `tier` for the chunks of entry `idx` whose bits are set.
fn present_charge(t: &Table, tiers: &Tiers, idx: u32, geo: &ChunkGeometry, tier: usize) -> u64 {
    (0..t.chunk_count(idx))
        .filter(|&k| t.chunk_present(idx, k))
        .map(|k| tiers.charge(tier, geo.range(k).1))
        .sum()
}

/// The entry's slot; opened from its chunk file on first use when the entry is PARTIAL (a chunk
/// file reused from an earlier run). `None` if the entry is not PARTIAL or its file is unusable.
fn slot(ctx: &SourceCtx, idx: u32) -> Option<Arc<Mutex<Slot>>> {
    let mut map = lock(&ctx.partials.map);
    if let Some(s) = map.get(&idx) {
        return Some(s.clone());
    }
    let w = ctx.table.state(idx);
    if w.state() != State::Partial {
        return None;
    }
    let tier = w.tier() as usize;
    let e = ctx.table.entry(idx)?;
    let geo = geometry(&ctx.table, &e);
    let opened = ctx
        .space
        .dir(tier)
        .and_then(|dir| ChunkFile::open_matching(dir, &chunks_name(e.object), geo).ok())
        .flatten();
    let Some(cf) = opened else {
        drop(map);
        tracing::debug!("chunk file of entry {idx} is gone or foreign: withdrawn");
        withdraw_partial(ctx, idx, w);
        return None;
    };
    let s = Arc::new(Mutex::new(Slot {
        file: Some(Arc::new(cf)),
        tier,
        busy: vec![false; geo.count() as usize],
    }));
    map.insert(idx, s.clone());
    Some(s)
}

/// No tier has room for the whole file `b` (the caller owns it, PLACING, source untouched):
/// with a chunk bitmap it becomes PARTIAL on the policy's chunk tier and the worker fetches
/// chunks from the start; otherwise SOURCE_ONLY (`no_room`).
pub(super) fn no_room_for_whole(
    ctx: &SourceCtx,
    b: Started,
    engine: &Engine,
    buf: &mut Vec<u8>,
) -> PlaceOutcome {
    let idx = b.idx;
    let t = &ctx.table;
    if t.chunk_count(idx) == 0 || t.chunk_size() == 0 {
        return no_room(ctx, idx);
    }
    let geo = geometry(&ctx.table, &b.entry);
    let first_len = geo.range(0).1;
    let free = free_space(&ctx.space.tiers);
    let tier = engine.policy.chunk_tier(&ctx.space.tiers).filter(|&tier| {
        ctx.space.dir(tier).is_some()
            && free
                .get(tier)
                .is_some_and(|&f| f >= ctx.space.tiers.charge(tier, first_len))
    });
    let (Some(tier), Some(dir)) = (tier, tier.and_then(|x| ctx.space.dir(x))) else {
        return no_room(ctx, idx);
    };
    AgentCounters::add(&ctx.counters.no_room, 1);
    let name = chunks_name(b.entry.object);
    // A leftover (the walk keeps only validated chunk files of PARTIAL entries) is never
    // continued: nothing vouches for it.
    let _ = sys::unlink_at(dir, &name);
    let cf = match ChunkFile::create(dir, &name, geo) {
        Ok(cf) => cf,
        Err(err) => {
            ctx.space.tier_failed(tier, &err);
            return source_only(ctx, idx);
        }
    };
    let ino = cf.ino();
    // The slot exists before the word says PARTIAL, so the first CHUNK request finds it.
    lock(&ctx.partials.map).insert(
        idx,
        Arc::new(Mutex::new(Slot {
            file: Some(Arc::new(cf)),
            tier,
            busy: vec![false; geo.count() as usize],
        })),
    );
    // Clients open the chunk file only if it is this inode (recorded before PARTIAL).
    let placing = t.state(idx);
    if !granary_shm::lifecycle::to_partial(t, idx, placing, tier as u8, ino) {
        // A client invalidated it meanwhile; nothing was charged yet.
        lock(&ctx.partials.map).remove(&idx);
        let _ = sys::unlink_at(dir, &name);
        return PlaceOutcome::Skipped;
    }
    // The program just opened it: a streaming reader wants the start next.
    chunk_job(ctx, idx, engine, 0, false, buf)
}

/// CHUNK from a client (its read missed chunk `k`): true if a fetch of it is to be queued
/// (`CopyMethod::Chunk`, requested), marked busy here; false if the chunk is present, already
/// queued or being fetched, or there is no room for it.
pub(super) fn claim_chunk(ctx: &SourceCtx, idx: u32, k: u64) -> bool {
    if ctx.work.is_retired() || k >= ctx.table.chunk_count(idx) || ctx.table.chunk_present(idx, k) {
        return false;
    }
    let Some(s) = slot(ctx, idx) else {
        return false;
    };
    let mut g = lock(&s);
    if g.file.is_none() || g.busy.get(k as usize) != Some(&false) {
        return false;
    }
    let Some(e) = ctx.table.entry(idx) else {
        return false;
    };
    let len = geometry(&ctx.table, &e).range(k).1;
    // Cheap early answer for a full tier: every missed read of a file that cannot grow would
    // otherwise queue a job that only finds no room.
    if free_space(&ctx.space.tiers)
        .get(g.tier)
        .is_none_or(|&f| f < ctx.space.tiers.charge(g.tier, len))
    {
        return false;
    }
    g.busy[k as usize] = true;
    true
}

/// Fetches chunks of a PARTIAL entry: with `requested`, chunk `first` (already marked busy by
/// `claim_chunk`) and the missing chunks right after it, up to `block_size`, in one source
/// read; otherwise runs of missing chunks from `first` on, until the end or no room.
pub(super) fn chunk_job(
    ctx: &SourceCtx,
    idx: u32,
    engine: &Engine,
    first: u64,
    requested: bool,
    buf: &mut Vec<u8>,
) -> PlaceOutcome {
    let Some(s) = slot(ctx, idx) else {
        return PlaceOutcome::Skipped;
    };
    let out = fetch_runs(ctx, idx, engine, &s, first, requested, buf);
    if requested {
        // However it ended, the requested chunk is no longer queued.
        if let Some(b) = lock(&s).busy.get_mut(first as usize) {
            *b = false;
        }
    }
    out
}

fn fetch_runs(
    ctx: &SourceCtx,
    idx: u32,
    engine: &Engine,
    s: &Mutex<Slot>,
    first: u64,
    requested: bool,
    buf: &mut Vec<u8>,
) -> PlaceOutcome {
    let t = &ctx.table;
    let c = &ctx.counters;
    let Some(e) = t.entry(idx) else {
        return PlaceOutcome::Skipped;
    };
    let geo = geometry(&ctx.table, &e);
    let mut src = None;
    let mut cursor = first;
    let mut placed = 0u64;
    let mut tier = 0;
    loop {
        if ctx.work.is_retired() {
            break;
        }
        // The next run: its chunks are marked busy while we hold them.
        let (cf, k0, n) = {
            let mut g = lock(s);
            let Some(cf) = g.file.clone() else { break };
            tier = g.tier;
            let present = |k: u64| t.chunk_present(idx, k);
            let k0 = if requested {
                if cursor != first {
                    break;
                }
                first
            } else {
                match (cursor..geo.count()).find(|&k| !present(k) && !g.busy[k as usize]) {
                    Some(k) => k,
                    None => break,
                }
            };
            let n = chunks::coalesce(&geo, k0, engine.params.block_size, |k| {
                present(k) || (k != k0 && g.busy[k as usize])
            });
            if n == 0 {
                break;
            }
            for k in k0..k0 + n {
                g.busy[k as usize] = true;
            }
            (cf, k0, n)
        };
        // Room for each chunk before the source is touched; the run ends at the first that
        // does not fit.
        let mut res: Vec<_> = (k0..k0 + n)
            .map_while(|k| ctx.space.tiers.reserve(tier, geo.range(k).1))
            .map(Some)
            .collect();
        let got = res.len() as u64;
        if got < n {
            let mut g = lock(s);
            for k in k0 + got..k0 + n {
                g.busy[k as usize] = false;
            }
        }
        if got == 0 {
            // The tier is full: the rest of the file stays on the source (`no_room` counts
            // files, and this one was counted when it became PARTIAL).
            break;
        }
        // A requested chunk is waited on; the chunks after it ride along in the same read.
        // Sequential prefetch is waited on by nobody and backs off.
        let _stream = engine.stream_for(ctx, requested);
        if src.is_none() {
            let path = t.rel_path_vec(idx).map(|r| {
                use std::os::unix::ffi::OsStrExt;
                ctx.source_real.join(std::ffi::OsStr::from_bytes(&r))
            });
            match path.map(|p| open_source(&ctx.counters, &p)) {
                Some(Ok(f)) if matches_catalog(&f, &e) => {
                    // Buffered, not O_DIRECT: the program reads these chunks from the source
                    // too until their bits are set, and shares the agent's pages that way
                    // (measured: direct reads here cost the device 20-30 MiB more per 96 MiB).
                    let r = SourceReader::new_buffered(&f);
                    src = Some((f, r));
                }
                other => {
                    let failed = !matches!(other, Some(Ok(_)));
                    unbusy(s, k0, n);
                    if failed {
                        AgentCounters::add(&c.failures, 1);
                    } else {
                        AgentCounters::add(&c.stale, 1);
                    }
                    break;
                }
            }
        }
        let Some((f, reader)) = src.as_mut() else {
            break;
        };
        let r = fetch_run(
            &ctx.counters,
            f,
            reader,
            &cf,
            k0,
            got,
            requested,
            buf,
            |k| {
                let mut g = lock(s);
                let live = g.file.as_ref().is_some_and(|x| Arc::ptr_eq(x, &cf));
                let Some(r) = res[(k - k0) as usize].take() else {
                    return;
                };
                if live {
                    // Commit and bit together, under the lock `drop_partial` takes.
                    let len = geo.range(k).1;
                    r.commit();
                    granary_shm::lifecycle::chunk(t, idx, k, true);
                    AgentCounters::add(&c.chunks_placed, 1);
                    AgentCounters::add(&c.chunk_bytes_placed, len);
                    AgentCounters::add(&c.tier_bytes[tier], len);
                    placed += len;
                }
                g.busy[k as usize] = false;
            },
        );
        drop(res);
        unbusy(s, k0, n);
        match r {
            Ok(()) => drop_behind(&ctx.mmap, idx, f, &geo, k0, got),
            Err(err) => {
                if matches!(
                    err.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EIO) | Some(libc::EFBIG)
                ) {
                    ctx.space.tier_failed(tier, &err);
                } else {
                    AgentCounters::add(&c.failures, 1);
                    tracing::debug!("chunks of entry {idx}: {err}");
                }
                break;
            }
        }
        cursor = k0 + got;
    }
    if placed > 0 {
        PlaceOutcome::Placed {
            tier,
            bytes: placed,
        }
    } else {
        PlaceOutcome::Skipped
    }
}

/// Reads chunks `k0..k0 + n` and writes each into the chunk file; `done(k)` runs after chunk k
/// is complete (set the table bit there). Counts what it reads.
///
/// Chunk `k0` is taken from the page cache first: a CHUNK request means the program's read of
/// it just missed and went to the source, so its pages are there. The rest of the run (what of
/// `k0` is not cached, and the chunks after it, which the program has not read) is one source
/// read. With `requested`, the bytes of `k0` that had to come from the source count as
/// `duplicate_bytes` (the program reads them from the source too). A short source read (the
/// source shrank) is an error: the chunks already written stay valid, the rest are not written.
#[allow(clippy::too_many_arguments)]
fn fetch_run(
    c: &AgentCounters,
    f: &std::fs::File,
    reader: &mut SourceReader,
    cf: &ChunkFile,
    k0: u64,
    n: u64,
    requested: bool,
    buf: &mut Vec<u8>,
    mut done: impl FnMut(u64),
) -> std::io::Result<()> {
    let geo = cf.geo;
    let (start, len0) = geo.range(k0);
    let (lstart, llen) = geo.range(k0 + n - 1);
    let total = (lstart + llen - start) as usize;
    let len0 = len0 as usize;
    let b = aligned(buf, align_up(total as u64) as usize);
    // Whole pages of k0 come from the cache, or all of it.
    let mut hit = reader.cached(f, &mut b[..len0], start);
    if hit < len0 {
        hit = hit / DIRECT_ALIGN * DIRECT_ALIGN;
    }
    if hit < total {
        let calls = reader.read_exact_at(f, &mut b[hit..], start + hit as u64, total - hit)?;
        AgentCounters::add(&c.source_reads, calls);
        AgentCounters::add(&c.source_bytes, (total - hit) as u64);
        if requested {
            AgentCounters::add(&c.duplicate_bytes, (len0 - hit) as u64);
        }
    }
    AgentCounters::add(&c.page_cache_bytes, hit as u64);
    for k in k0..k0 + n {
        let (s, len) = geo.range(k);
        let at = (s - start) as usize;
        cf.write_chunk(k, &b[at..at + len as usize])?;
        done(k);
    }
    Ok(())
}

/// The chunk file has the bytes of chunks `k0..k0 + n` now: the source's pages of that range
/// are not ours to keep. Only that range: the program may be reading the next chunk from the
/// source right now, and its pages are what the agent copies when asked for that chunk (dropping
/// the whole file here made every later request read its chunk from the source again). A
/// program mapping the file still faults these pages from the source: they stay then.
fn drop_behind(mmap: &Follower, idx: u32, f: &std::fs::File, geo: &ChunkGeometry, k0: u64, n: u64) {
    if n == 0 || mmap.is_mapped(idx) {
        return;
    }
    let (start, _) = geo.range(k0);
    let (last, len) = geo.range(k0 + n - 1);
    sys::fadvise(f, start, last + len - start, libc::POSIX_FADV_DONTNEED);
}

fn unbusy(s: &Mutex<Slot>, k0: u64, n: u64) {
    let mut g = lock(s);
    for k in k0..k0 + n {
        if let Some(b) = g.busy.get_mut(k as usize) {
            *b = false;
        }
    }
}

/// Drops the entry's chunk file (INVALIDATE: the client already stored STALE; DAMAGED: after
/// `withdraw_partial` moved the word): the bits are cleared, the file unlinked, and the charge
/// of the set bits released on the tier whose file this call removed. Jobs still running see
/// the slot empty and commit nothing more.
pub fn drop_partial(ctx: &SourceCtx, idx: u32) {
    let mut map = lock(&ctx.partials.map);
    let s = map.remove(&idx);
    let mut g = s.as_ref().map(|s| lock(s));
    if let Some(g) = g.as_mut() {
        g.file = None;
    }
    let Some(e) = ctx.table.entry(idx) else {
        return;
    };
    let geo = geometry(&ctx.table, &e);
    let name = chunks_name(e.object);
    // The chunks were charged on the slot's tier (when we know it); the one unlink that
    // succeeds gives that charge back (as `states::drop_object` does for whole copies).
    let charged = g.as_ref().map(|g| g.tier);
    for (tier, dir) in ctx.space.dirs().iter().enumerate() {
        let Some(dir) = dir else { continue };
        if charged.is_some_and(|c| c != tier) {
            continue;
        }
        let charge = present_charge(&ctx.table, &ctx.space.tiers, idx, &geo, tier);
        if sys::unlink_at(dir, &name).is_ok() {
            ctx.space.tiers.release(tier, charge);
        }
    }
    for k in 0..ctx.table.chunk_count(idx) {
        granary_shm::lifecycle::chunk(&ctx.table, idx, k, false);
    }
    drop(g);
    drop(map);
}

/// DAMAGED or an unusable chunk file: moves `word` (PARTIAL) back to UNPLACED, then drops it.
pub fn withdraw_partial(ctx: &SourceCtx, idx: u32, word: StateWord) -> bool {
    if granary_shm::lifecycle::drop_partial(
        &granary_shm::lifecycle::EntryCell {
            table: &ctx.table,
            idx,
        },
        word,
    ) {
        drop_partial(ctx, idx);
        return true;
    }
    false
}

/// Charges the tiers for the copies a new table starts with (reused from an earlier table or a
/// saved catalog): complete copies by size, chunk files by present chunk. A copy its tier has no
/// room for any more (its capacity shrank) is unplaced; the sweep deletes its file. Returns the
/// files and bytes adopted.
pub fn adopt_charges(t: &Table, space: &Space) -> (u64, u64) {
    let (mut files, mut bytes) = (0u64, 0u64);
    for idx in 0..t.entry_count() {
        let w = t.state(idx);
        let s = w.state();
        if s != State::Placed && s != State::Partial {
            continue;
        }
        let tier = w.tier() as usize;
        let Some(e) = t.entry(idx) else { continue };
        let cell = granary_shm::lifecycle::EntryCell { table: t, idx };
        let (charge, present) = if s == State::Placed {
            (e.stat.size, e.stat.size)
        } else {
            let geo = geometry(t, &e);
            let c = present_charge(t, &space.tiers, idx, &geo, tier);
            (c, super::chunks::present_bytes(&geo, &bitmap_of(t, idx)))
        };
        let ok = tier < space.tiers.len()
            && space.dir(tier).is_some()
            && space.tiers.adopt(tier, charge);
        if ok {
            files += 1;
            bytes += present;
            continue;
        }
        let undone = if s == State::Placed {
            granary_shm::lifecycle::withdraw(&cell, w)
        } else {
            granary_shm::lifecycle::unplace_partial(t, idx, w)
        };
        if !undone {
            tracing::debug!("entry {idx} moved while its copy was being adopted");
        }
    }
    (files, bytes)
}

/// The copies table `t` holds now: complete ones and chunk files, with the bytes they hold.
pub fn copies_now(t: &Table) -> (u64, u64) {
    let (mut files, mut bytes) = (0u64, 0u64);
    for idx in 0..t.entry_count() {
        let s = t.state(idx).state();
        let Some(e) = t
            .entry(idx)
            .filter(|_| s == State::Placed || s == State::Partial)
        else {
            continue;
        };
        files += 1;
        bytes += if s == State::Placed {
            e.stat.size
        } else {
            super::chunks::present_bytes(&geometry(t, &e), &bitmap_of(t, idx))
        };
    }
    (files, bytes)
}

fn bitmap_of(t: &Table, idx: u32) -> Vec<u64> {
    let n = t.chunk_count(idx);
    let mut words = vec![0u64; n.div_ceil(64) as usize];
    for k in 0..n {
        if t.chunk_present(idx, k) {
            words[(k / 64) as usize] |= 1 << (k % 64);
        }
    }
    words
}

/// At retirement (no job running): gives back what table `t`'s PARTIAL entries charge on
/// `tiers`.
pub fn release_partial_charges(t: &Table, tiers: &Tiers) {
    for idx in 0..t.entry_count() {
        let w = t.state(idx);
        if w.state() != State::Partial {
            continue;
        }
        let tier = w.tier() as usize;
        let Some(e) = t.entry(idx) else { continue };
        if tier < tiers.len() {
            let charge = present_charge(t, tiers, idx, &geometry(t, &e), tier);
            tiers.release(tier, charge);
        }
    }
}
