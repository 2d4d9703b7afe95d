//! Placement of a packed source: whole partitions streamed from the pack in large sequential
//! reads, each file's copy written as its bytes arrive (docs/pack-format.md, "Serving a pack").
//!
//! Each partition is cut into **segments**: runs of consecutive files whose stored bytes span
//! at most `SEGMENT_SPAN` (a file larger than that is a segment of its own, read in
//! `block_size` pieces). A few streamer threads per table — as many as the node's source-stream
//! cap allows, at most one per partition — sweep the partitions, each read holding one of the
//! node's source streams (`Streams`); the sweep takes as many consecutive segments as one
//! `block_size` read spans and reads them at once. A file a program opened and waits for
//! (`request`) moves its segment to the front: the next read of any streamer is that one
//! segment — a small read, so a program that opens files in random order (a shuffled first
//! epoch) waits for its files, not for 8 MiB around each — and the sweep then goes on where it
//! was, never reading a byte twice.
//!
//! In cluster mode (`granary serve`) each node streams only the files it owns (`restrict`):
//! its segments of the pack, each read once for the whole job; it reads another file of the
//! pack only when the nodes that own it cannot send it (`adopt`).
//!
//! Per segment, room comes first: each file that still needs a copy is claimed and reserved on
//! the policy's tiers before a byte is read (a file no tier can take becomes SOURCE_ONLY, and a
//! segment nobody can take is never read). Its stored bytes are decoded (`unpack`) into a
//! temporary file, checked against the index's checksum, and published through the same path
//! as every copy (identity recorded, `lifecycle::record_copy`, `states::finish`). A partition
//! whose header does not match the index, or a file whose bytes fail their checksum, is never
//! placed: those files stay served from the source (or, with only the pack, extracted and
//! checked by the preload library).
//!
//! - `streamer`: the segments and what is done of them (`Streamer`), knowing nothing of
//!   `SourceCtx`; here: the streamer threads, and the requests of programs and other nodes.

pub(super) mod streamer;

pub use streamer::Streamer;
use streamer::{AGAIN, DONE, NONE, TAKEN, TODO};

use std::fs::File;
use std::ops::Range;
use std::time::Duration;

use granary_shm::lifecycle::{self, EntryCell};
use granary_shm::{EntryRec, Locator, State, Table};

use super::buffers::{align_up, DIRECT_ALIGN};
use super::copy::{
    no_room, publish as publish_copy, source_only, write_all_at, SourceReader, SETTLE,
};
use super::engine::Engine;
use super::source_ctx::SourceCtx;
use super::states::Finish;
use super::unpack::{Damaged, Decoder, Scratch};
use crate::stats::AgentCounters;
use crate::sync::atomic::Ordering;
use crate::sync::{lock, statics, thread, Arc};
use crate::sys;
use crate::tiers::Reservation;

impl Streamer {
    /// Cluster mode: packed entry `idx`, another node's, could not be had from it; this node
    /// reads it from its partition after all (only its stored bytes) and keeps the copy.
    pub fn adopt(&self, ctx: &SourceCtx, idx: u32) {
        if let Some(m) = self.mine.get(idx as usize) {
            m.store(true, Ordering::Release);
            self.request(ctx, idx);
        }
    }

    /// A program opened packed entry `idx` and waits for its copy: its segment goes first. A
    /// segment already streamed is streamed again if the entry lost its copy since (withdrawn
    /// as damaged).
    pub fn request(&self, ctx: &SourceCtx, idx: u32) {
        let Some(&seg) = self.segment_of.get(idx as usize) else {
            return;
        };
        if ctx.work.is_retired() {
            return;
        }
        if seg == NONE {
            return;
        }
        let st = &self.seg_state[seg as usize];
        let unplaced = matches!(
            ctx.table.state(idx).state(),
            State::Unplaced | State::Queued
        );
        loop {
            let now = st.load(Ordering::Acquire);
            let next = match now {
                TODO => break,
                DONE if unplaced => TODO,
                // Being streamed: it may have passed this file over (not this node's then, or
                // not yet asked for), so once done it is streamed again.
                TAKEN if unplaced => AGAIN,
                _ => return,
            };
            if st
                .compare_exchange(now, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            if next == AGAIN {
                return;
            }
            if self.remaining.fetch_add(1, Ordering::AcqRel) == 0 {
                self.hold(&ctx.work);
            }
            break;
        }
        self.urge(seg);
    }
}

/// Starts `ctx`'s partition streamers (a table serving a pack), as many as the node's source
/// streams and the partitions allow. They run until the table is retired.
pub fn spawn(ctx: Arc<SourceCtx>, engine: Arc<Engine>) -> std::io::Result<()> {
    let Some(st) = ctx.pack.get().cloned() else {
        return Ok(());
    };
    if st.remaining.load(Ordering::Acquire) > 0 {
        st.hold(&ctx.work);
    }
    let todo = |r: &Range<u32>| {
        r.clone()
            .any(|k| st.seg_state[k as usize].load(Ordering::Acquire) == TODO)
    };
    let threads = engine
        .params
        .max_source_streams
        .min(st.parts.iter().filter(|r| todo(r)).count())
        .max(1);
    tracing::info!(
        "{}: streaming {} partitions ({} of {} segments here) with {threads} streams",
        ctx.source_real.display(),
        st.parts.len(),
        st.remaining.load(Ordering::Acquire),
        st.segments.len()
    );
    for i in 0..threads {
        let (ctx, engine, st) = (ctx.clone(), engine.clone(), st.clone());
        thread::Builder::new()
            .name(format!("partition-{i}"))
            .spawn(move || run(&ctx, &engine, &st))?;
    }
    Ok(())
}

fn run(ctx: &SourceCtx, engine: &Engine, st: &Streamer) {
    // One block, aligned, plus room for the alignment of a segment's start.
    let mut buf = vec![0u8; st.block as usize + 2 * DIRECT_ALIGN];
    let mut scratch = Scratch::default();
    let (mut current, mut urgent) = (None, false);
    while !ctx.work.is_retired() {
        match st.next(&mut current, urgent) {
            Some((segs, waited_on)) => {
                urgent = waited_on;
                segment(ctx, engine, st, segs.clone(), &mut buf, &mut scratch);
                for seg in segs {
                    st.done(&ctx.work, seg);
                }
            }
            None => {
                urgent = false;
                sys::release_pages(&mut buf);
                scratch = Scratch::default();
                // `retired` is looked at under the lock `wake_all` takes: a retirement is
                // never missed between the loop's check and the wait.
                let q = lock(&st.urgent);
                if q.is_empty() && !ctx.work.is_retired() {
                    let _ = st.wake.wait_timeout(q, Duration::from_millis(100));
                }
            }
        }
    }
    st.unhold(&ctx.work);
}

/// One file of a segment being written: where, and how far.
struct Out<'a> {
    idx: u32,
    entry: EntryRec,
    loc: Locator,
    res: Option<Reservation<'a>>,
    /// Admitted to the page cache's resident set (`residency`): forgotten unless published.
    resident: bool,
    tmp: Vec<u8>,
    file: Option<File>,
    dec: Decoder,
    /// Why it will not be published.
    failed: Option<Failed>,
}

enum Failed {
    Damaged(Damaged),
    Tier(std::io::Error),
    Source(std::io::Error),
    Lost,
}

static TMP_SEQ: statics::AtomicUsize = statics::AtomicUsize::new(0);

fn segment(
    ctx: &SourceCtx,
    engine: &Engine,
    st: &Streamer,
    segs: Range<u32>,
    buf: &mut [u8],
    scratch: &mut Scratch,
) {
    let t = &ctx.table;
    let (Some(first), Some(last)) = (
        st.segments.get(segs.start as usize),
        st.segments.get((segs.end as usize).saturating_sub(1)),
    ) else {
        return;
    };
    // Consecutive segments of one partition: their members are consecutive too.
    let (part, members) = (first.part, first.members.start..last.members.end);
    let block = t.pack_block_size();
    let mut outs: Vec<Out<'_>> = Vec::new();
    for &idx in &st.members[members.start as usize..members.end as usize] {
        if !st.streams(idx) {
            continue; // another node's (cluster mode)
        }
        let cell = EntryCell { table: t, idx };
        let (Some(entry), Some(loc)) = (t.entry(idx), t.locator(idx)) else {
            continue;
        };
        let claimable = match t.state(idx).state() {
            State::Unplaced => lifecycle::claim(&cell) || t.state(idx).state() == State::Queued,
            State::Queued => true,
            _ => false,
        };
        if !claimable {
            continue;
        }
        if ctx.work.is_retired() {
            lifecycle::unclaim(&cell);
            continue;
        }
        if !lifecycle::start(t, idx) {
            continue;
        }
        let size = entry.stat.size;
        let order: Vec<usize> = engine.policy.tiers_for(size, &ctx.space.tiers);
        let Some(res) = ctx.space.reserve_on(&order, size) else {
            no_room(ctx, idx);
            continue;
        };
        outs.push(Out {
            idx,
            entry,
            loc,
            res: Some(res),
            resident: false,
            tmp: Vec::new(),
            file: None,
            dec: Decoder::new(loc.codec, size, loc.stored_len, block),
            failed: None,
        });
    }
    if outs.is_empty() {
        return;
    }
    let Some(file) = st.part_file(&ctx.counters, part) else {
        for o in outs {
            drop(o.res);
            source_only(ctx, o.idx);
        }
        return;
    };
    for o in outs.iter_mut() {
        if let Err(e) = create(ctx, o) {
            o.failed = Some(Failed::Tier(e));
        }
    }
    // Only the stored bytes of the files that need them, in runs without gaps: what lies
    // between is placed already or another node's (cluster mode), which reads it itself.
    for (start, end) in runs(&outs) {
        if let Err(e) = stream(ctx, engine, st, &file, start, end, buf, scratch, &mut outs) {
            for o in outs.iter_mut() {
                o.failed
                    .get_or_insert(Failed::Source(std::io::Error::new(e.kind(), e.to_string())));
            }
            break;
        }
    }
    for o in outs {
        publish(ctx, o);
    }
}

/// The stored byte ranges of `outs` (in data order), merged where one starts in the page the
/// previous one ends in (reads are page-aligned: that page is read once either way).
fn runs(outs: &[Out<'_>]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for o in outs {
        let (start, end) = (o.loc.offset, o.loc.offset + o.loc.stored_len);
        match runs.last_mut() {
            Some(last) if start <= align_up(last.1) => last.1 = last.1.max(end),
            _ => runs.push((start, end)),
        }
    }
    runs
}

/// The copy's temporary file in the reserved tier, with the file's length when it may have
/// holes (framed), so a hole frame is left unwritten.
fn create(ctx: &SourceCtx, o: &mut Out<'_>) -> std::io::Result<()> {
    let Some(res) = &o.res else {
        return Err(std::io::Error::other("no reservation"));
    };
    let tier = res.tier();
    let Some(dir) = ctx.space.dir(tier) else {
        return Err(std::io::Error::other("tier unusable"));
    };
    o.tmp = format!(
        ".tmp-{:016x}-{}-{}",
        o.entry.object,
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    )
    .into_bytes();
    let f = sys::create_excl_at(dir, &o.tmp, 0o600)?;
    o.resident = ctx.residency.admit(o.entry.stat.size);
    lifecycle::set_transient(&ctx.table, o.idx, !o.resident);
    if o.loc.codec != granary_pack::format::entry::codec::NONE {
        f.set_len(o.entry.stat.size)?;
    }
    o.file = Some(f);
    Ok(())
}

/// Reads `[start, end)` of the partition in block reads (page-aligned buffers) and feeds
/// every file its stored bytes as they arrive.
#[allow(clippy::too_many_arguments)]
fn stream(
    ctx: &SourceCtx,
    engine: &Engine,
    st: &Streamer,
    file: &File,
    start: u64,
    end: u64,
    buf: &mut [u8],
    scratch: &mut Scratch,
    outs: &mut [Out<'_>],
) -> std::io::Result<()> {
    let c = &ctx.counters;
    let mut at = start / DIRECT_ALIGN as u64 * DIRECT_ALIGN as u64;
    let base = (buf.as_ptr() as usize).wrapping_neg() % DIRECT_ALIGN;
    let room = (buf.len() - base) / DIRECT_ALIGN * DIRECT_ALIGN;
    let piece_max = (st.block as usize).min(room);
    // Empty files have nothing stored: they are complete before any read.
    feed(outs, at, &[], scratch);
    let _stream = if end > start {
        Some(engine.stream_for(ctx, true))
    } else {
        None
    };
    let mut reader = SourceReader::new_buffered(file);
    while at < end {
        if ctx.work.is_retired() || outs.iter().all(|o| o.failed.is_some()) {
            return Err(std::io::Error::other("stopped"));
        }
        let len = ((end - at) as usize).min(piece_max);
        let want = (align_up(len as u64) as usize).min(room);
        let b = &mut buf[base..base + want];
        let calls = reader.read_exact_at(file, b, at, len)?;
        AgentCounters::add(&c.source_reads, calls);
        AgentCounters::add(&c.source_bytes, len as u64);
        ctx.table.add_pack_streamed(len as u64);
        feed(outs, at, &buf[base..base + len], scratch);
        // No program maps a pack's partition: its pages are of no use once copied.
        sys::fadvise(file, at, len as u64, libc::POSIX_FADV_DONTNEED);
        at += len as u64;
    }
    Ok(())
}

/// Hands each file the part of `data` (partition bytes from `at`) that is its stored bytes.
fn feed(outs: &mut [Out<'_>], at: u64, data: &[u8], scratch: &mut Scratch) {
    let end = at + data.len() as u64;
    for o in outs.iter_mut() {
        if o.failed.is_some() {
            continue;
        }
        let (fs, fe) = (o.loc.offset, o.loc.offset + o.loc.stored_len);
        let (s, e) = (fs.max(at), fe.min(end));
        if s > e || (s == e && !(data.is_empty() && fs == fe)) {
            continue;
        }
        let piece = &data[(s - at) as usize..(e - at) as usize];
        let Some(file) = &o.file else {
            o.failed = Some(Failed::Lost);
            continue;
        };
        let r = o.dec.feed(piece, scratch, &mut |off, bytes: &[u8]| {
            write_all_at(file, bytes, off)
        });
        match r {
            Err(d) => o.failed = Some(Failed::Damaged(d)),
            Ok(Err(e)) => o.failed = Some(Failed::Tier(e)),
            Ok(Ok(())) => {}
        }
    }
}

/// Publishes one file's copy (checked against the index's checksum), or gives it up.
fn publish(ctx: &SourceCtx, mut o: Out<'_>) {
    let t = &ctx.table;
    let size = o.entry.stat.size;
    let res = o.res.take();
    let tier = res.as_ref().map_or(0, |r| r.tier());
    let dir = ctx.space.dir(tier);
    let failed = match (&o.failed, &o.file) {
        (Some(_), _) | (_, None) => true,
        (None, Some(_)) => {
            if let Err(d) = o.dec.finish(o.loc.checksum) {
                o.failed = Some(Failed::Damaged(d));
                true
            } else {
                false
            }
        }
    };
    let resident = o.resident;
    if failed {
        if let (Some(dir), false) = (dir, o.tmp.is_empty()) {
            let _ = sys::unlink_at(dir, &o.tmp);
        }
        drop(res);
        if resident {
            ctx.residency.forget(size);
        }
        match o.failed {
            Some(Failed::Damaged(d)) => {
                tracing::warn!(
                    "{}: damaged in the pack ({}); served from the source",
                    path_of(t, o.idx),
                    d.0
                );
                if let Some(st) = ctx.pack.get() {
                    st.damage
                        .file(o.idx, format!("{}: {}", path_of(t, o.idx), d.0));
                }
                source_only(ctx, o.idx);
            }
            Some(Failed::Tier(e)) => {
                ctx.space.tier_failed(tier, &e);
                source_only(ctx, o.idx);
            }
            Some(Failed::Source(e)) => {
                tracing::debug!("reading the pack for {} failed: {e}", path_of(t, o.idx));
                if ctx.work.is_retired() {
                    lifecycle::give_up(
                        &EntryCell {
                            table: t,
                            idx: o.idx,
                        },
                        State::Unplaced,
                    );
                } else {
                    source_only(ctx, o.idx);
                }
            }
            _ => {
                source_only(ctx, o.idx);
            }
        }
        return;
    }
    let (Some(file), Some(res), Some(dir)) = (o.file.as_ref(), res, dir) else {
        source_only(ctx, o.idx);
        return;
    };
    let sum = o.dec.finish(o.loc.checksum).unwrap_or(0).max(1);
    settle(&ctx.table, o.idx, file, size);
    let name = granary_shm::object_name(o.entry.object);
    match publish_copy(ctx, o.idx, res, dir, (&o.tmp, &name), file, sum) {
        Finish::Placed { .. } => {}
        Finish::RenameFailed => {
            let _ = sys::unlink_at(dir, &o.tmp);
            if resident {
                ctx.residency.forget(size);
            }
            source_only(ctx, o.idx);
        }
        Finish::Invalidated => {
            if resident {
                ctx.residency.forget(size);
            }
        }
    }
}

/// Starts write-back of a finished copy; a transient one is written back now and its pages
/// dropped (`residency`), as for every copy.
fn settle(t: &Table, idx: u32, file: &File, size: u64) {
    if sys::is_memory_fs(file) {
        return;
    }
    if t.is_transient(idx) {
        sys::sync_range(file, 0, size, SETTLE);
        sys::fadvise(file, 0, 0, libc::POSIX_FADV_DONTNEED);
    } else {
        sys::sync_range(file, 0, size, libc::SYNC_FILE_RANGE_WRITE);
    }
}

fn path_of(t: &Table, idx: u32) -> String {
    t.rel_path_vec(idx)
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_else(|| format!("entry {idx}"))
}
