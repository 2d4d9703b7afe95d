//! The requesting side: a program on this node opened a file another rank reads from the source
//! (or this rank holds a replica of). A fetcher thread takes the entry (PLACING), reserves room
//! — the staging tier for a file of another rank's, this rank's own tiers for a replica —,
//! asks the file's owners in turn and writes what arrives through the ordinary publication path
//! (`placement::incoming`). Every wait is bounded by the peer timeout: an owner that is silent
//! that long (stopped, dead, hung) is written off (`Peers::failed`) and the next owner, or
//! finally the source, serves the file — a packed file is then read from the pack by this
//! node's partition streamer (only its stored bytes, by its partition offset). Fetchers never wait for this node's placement pool, and
//! the pool never waits for a peer, so two ranks asking each other cannot deadlock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use granary_core::placement::incoming::{self, NotStarted, ReceiveError, Receiving};
use granary_core::placement::{fetch_large, PlaceOutcome, SourceCtx};
use granary_core::stats::AgentCounters;
use granary_shm::{state, EntryRec};

use super::staging::{Evicted, Free, Slot};
use super::transport::{Event, Landing};
use super::wire::{Answer, Msg};
use super::Node;

/// A file some other node holds, to copy here over MPI.
pub struct RemoteFetch {
    pub ctx: Arc<SourceCtx>,
    pub idx: u32,
    /// The job slot the copy is credited to (0: nobody's, e.g. a replica copied at start).
    pub slot: u32,
    /// One of the copies made at start (`Node::copy_others`): counted down when done.
    pub copy: bool,
}

/// Fetcher threads: each takes jobs until the node stops. A job holds one `ctx.inflight`
/// count, given back when it is done.
pub fn spawn(node: &Arc<Node>, jobs: Receiver<RemoteFetch>, threads: usize) -> std::io::Result<()> {
    for k in 0..threads {
        let (node, jobs) = (node.clone(), jobs.clone());
        std::thread::Builder::new()
            .name(format!("fetch-{k}"))
            .spawn(move || {
                let mut buf = Vec::new();
                for job in jobs {
                    let out = place(&node, &job, &mut buf);
                    tracing::trace!("remote placement of entry {}: {out:?}", job.idx);
                    if let PlaceOutcome::Placed { tier, bytes } = out {
                        job.ctx
                            .counters
                            .credit_placement(&job.ctx.table, job.slot, tier, bytes);
                    }
                    if job.copy {
                        node.copies_pending.fetch_sub(1, Ordering::AcqRel);
                    }
                    job.ctx.inflight.fetch_sub(1, Ordering::AcqRel);
                    granary_core::sys::release_pages(&mut buf);
                }
            })?;
    }
    Ok(())
}

/// How a request to the owners ended.
enum Got {
    Placed(PlaceOutcome),
    /// Decided without a copy (stale, nobody holds it, not ours to place).
    Outcome(PlaceOutcome),
    /// Nobody delivered: read the source (the entry is QUEUED for `fetch_large`).
    Source,
}

fn place(node: &Node, job: &RemoteFetch, buf: &mut Vec<u8>) -> PlaceOutcome {
    let (ctx, idx) = (&job.ctx, job.idx);
    let Some(e) = ctx.table.entry(idx) else {
        return PlaceOutcome::Skipped;
    };
    // A replica belongs in this rank's own tiers; another rank's file in the staging tier.
    let tiers: Vec<usize> = match node.staging_tier {
        Some(st) if !node.own.holds(node.rank, idx) => vec![st],
        _ => (0..ctx.tiers.placeable()).collect(),
    };
    let mut owners: Vec<u32> = node
        .own
        .owners(idx)
        .into_iter()
        .filter(|&r| r != node.rank && node.peers.alive(r))
        .collect();
    // Every owner written off: the file's stand-in reads it from the source once and serves
    // it (this rank, if it is the stand-in: below).
    if owners.is_empty() && !node.own.holds(node.rank, idx) {
        owners.extend(node.stand_in(idx).filter(|&r| r != node.rank));
    }
    let mut got = if owners.is_empty() {
        Got::Source
    } else {
        remote(node, ctx, idx, &e, &tiers, &owners)
    };
    // Its owners went silent during this request: their stand-in, now.
    if matches!(got, Got::Source) && !node.own.holds(node.rank, idx) {
        if let Some(s) = node
            .stand_in(idx)
            .filter(|s| *s != node.rank && !owners.contains(s))
        {
            got = remote(node, ctx, idx, &e, &tiers, &[s]);
        }
    }
    match got {
        Got::Placed(out) | Got::Outcome(out) => out,
        Got::Source => {
            AgentCounters::add(&ctx.counters.remote_fallbacks, 1);
            if let (Some(st), Some(_)) = (ctx.pack.get(), ctx.table.locator(idx)) {
                // The entry is QUEUED: the streamer takes it as this node's from now on.
                st.adopt(ctx, idx);
                return PlaceOutcome::Skipped;
            }
            let Some(setup) = node.agent.setup.get() else {
                return PlaceOutcome::Skipped;
            };
            fetch_large(ctx, idx, setup.pool.shared(), buf)
        }
    }
}

/// Why a transfer from one owner did not deliver.
enum Failure {
    /// It holds no copy and will not (no room, a chunked copy): ask the next, else the source.
    NotHeld,
    /// The source changed.
    Stale,
    /// No message for the peer timeout, or out of order: written off.
    Silent,
    /// Our side failed (writing the tier, the entry taken away).
    Local(ReceiveError),
}

fn remote(
    node: &Node,
    ctx: &SourceCtx,
    idx: u32,
    e: &EntryRec,
    tiers: &[usize],
    owners: &[u32],
) -> Got {
    let staging = node.staging_tier.filter(|st| tiers == [*st]);
    let size = e.stat.size;
    // A staging file ready for reuse (its pages allocated and mapped), if there is one.
    let mut free = staging.and_then(|st| node.staging.take(ctx, st, size));
    let give_back = |free: Option<Free>| {
        if let (Some(st), Some(f)) = (staging, free) {
            node.staging.give_back(ctx, st, f);
        }
    };
    let mut rx = loop {
        match incoming::receive(ctx, idx, tiers) {
            Ok(rx) => break rx,
            Err(NotStarted::Skipped(o)) => {
                give_back(free);
                return Got::Outcome(o);
            }
            Err(NotStarted::NoRoom) => {
                let Some(st) = staging else {
                    // No room for a replica: the source.
                    return Got::Source;
                };
                let want = free.is_none().then_some(size);
                match node.staging.evict_oldest(ctx, st, want) {
                    Evicted::Dropped => continue,
                    Evicted::Recycled(f) => {
                        if free.is_none() && f.slot.map.len() as u64 >= size {
                            free = Some(f);
                        } else {
                            node.staging.give_back(ctx, st, f);
                        }
                        continue;
                    }
                    // Larger than the staging tier: the source.
                    Evicted::Nothing => {
                        give_back(free);
                        return Got::Source;
                    }
                }
            }
        }
    };
    let mut not_held = 0;
    // The mapping the copy landed in, kept with its file for reuse once staged.
    let mut mapped = None;
    for &owner in owners {
        let started = std::time::Instant::now();
        match transfer(node, &mut rx, owner, idx, e, &mut free, &mut mapped) {
            Ok(sum) => {
                // A packed file is checked against the index's checksum itself, not only the
                // owner's word for it.
                let sum = ctx.table.locator(idx).map_or(sum, |l| l.checksum.max(1));
                let done = rx.finish(sum);
                node.hashed_bytes.fetch_add(rx.written(), Ordering::Relaxed);
                node.hashing_ns
                    .fetch_add(rx.hashing().as_nanos() as u64, Ordering::Relaxed);
                return match done {
                    Ok(out) => {
                        tracing::debug!(
                            "entry {idx}: {} bytes from rank {owner} in {:?}",
                            e.stat.size,
                            started.elapsed()
                        );
                        let c = &ctx.counters;
                        AgentCounters::add(&c.remote_files, 1);
                        AgentCounters::add(&c.remote_bytes, e.stat.size);
                        if let (Some(st), PlaceOutcome::Placed { tier, .. }) = (staging, &out) {
                            if *tier == st {
                                let slot = rx
                                    .take_file()
                                    .zip(mapped.take())
                                    .map(|(file, map)| Slot { file, map });
                                node.staging.push(idx, slot);
                            }
                        }
                        Got::Placed(out)
                    }
                    Err(why) => {
                        tracing::warn!("copy of entry {idx} from rank {owner}: {why}");
                        rx.abandon(&why);
                        Got::Source
                    }
                };
            }
            Err(Failure::NotHeld) => not_held += 1,
            Err(Failure::Stale) => {
                rx.give_up(state::STALE);
                return Got::Outcome(PlaceOutcome::Stale);
            }
            Err(Failure::Silent) => {
                tracing::debug!("rank {owner} did not send entry {idx} in time");
                node.write_off(owner);
                if rx.written() > 0 {
                    // Part of the copy came from it: start over from the source.
                    rx.abandon(&ReceiveError::Mismatch("sender"));
                    return Got::Source;
                }
            }
            Err(Failure::Local(why)) => {
                tracing::warn!("receiving entry {idx} from rank {owner}: {why}");
                rx.abandon(&why);
                return Got::Source;
            }
        }
    }
    give_back(free.take());
    if not_held == owners.len() {
        // Held nowhere (the dataset exceeds the nodes' room): the program reads the source, as
        // on one node, and this node keeps no copy either.
        AgentCounters::add(&ctx.counters.remote_fallbacks, 1);
        rx.give_up(state::SOURCE_ONLY);
        return Got::Outcome(PlaceOutcome::SourceOnly);
    }
    rx.abandon(&ReceiveError::Mismatch("sender"));
    Got::Source
}

/// Asks `owner` for entry `idx` and appends what it sends to `rx`; returns the checksum it
/// announced. Its tag is given back clean only if every announced byte arrived (or it answered
/// without data): otherwise late pieces could land in a later transfer, so it is retired.
fn transfer(
    node: &Node,
    rx: &mut Receiving<'_>,
    owner: u32,
    idx: u32,
    e: &EntryRec,
    free: &mut Option<Free>,
    mapped: &mut Option<Arc<memmap2::MmapRaw>>,
) -> Result<u64, Failure> {
    let Some(tag) = node.tags.take(owner) else {
        return Err(Failure::Silent);
    };
    let events = node.comm.expect(owner, tag);
    node.comm.ctrl(
        owner,
        &Msg::Request {
            tag,
            idx,
            object: e.object,
            size: e.stat.size,
        },
    );
    let mut clean = false;
    let res = (|| {
        // While the owner answers: the part file, allocated and mapped, where the pieces land
        // straight from the owner's copy (the first ones wait for it, matched, not received).
        let landing = match land(node, rx, free) {
            Ok(l) => Arc::new(l),
            Err(e) => return Err(Failure::Local(e)),
        };
        *mapped = Some(landing.map());
        node.comm.land(owner, tag, landing.clone());
        let sum = loop {
            match events.recv_timeout(node.timeout) {
                Ok(Event::Reply(Answer::Wait)) => {}
                Ok(Event::Reply(Answer::Coming { sum })) => break sum,
                Ok(Event::Reply(Answer::NotHeld)) => {
                    clean = true;
                    return Err(Failure::NotHeld);
                }
                Ok(Event::Reply(Answer::Stale)) => {
                    clean = true;
                    return Err(Failure::Stale);
                }
                Ok(_) | Err(_) => return Err(Failure::Silent),
            }
        };
        while rx.written() < rx.size() {
            match events.recv_timeout(node.timeout) {
                Ok(Event::Landed { off, len }) => {
                    rx.landed(landing.landed(off, len))
                        .map_err(Failure::Local)?;
                    arrived(node, idx, len as u64);
                }
                Ok(Event::Data(buf)) => {
                    node.bounce.fetch_add(buf.len() as u64, Ordering::Relaxed);
                    let r = rx.append(&buf);
                    arrived(node, idx, buf.len() as u64);
                    node.comm.bufs.put(buf);
                    r.map_err(Failure::Local)?;
                }
                Ok(_) | Err(_) => return Err(Failure::Silent),
            }
        }
        clean = true;
        Ok(sum)
    })();
    node.comm.forget(owner, tag);
    node.tags.give_back(owner, tag, clean);
    if !clean {
        node.comm.ctrl(owner, &Msg::Cancel { tag });
    }
    res
}

/// Where the pieces land: a free staging file made part file (its pages reused, mapped
/// already), else a new part file, allocated and mapped.
fn land(
    node: &Node,
    rx: &mut Receiving<'_>,
    free: &mut Option<Free>,
) -> Result<Landing, ReceiveError> {
    if let Some(f) = free.take() {
        let size = rx.size() as usize;
        let Free { slot, name, .. } = f;
        match rx.part_from(slot.file, &name) {
            Ok(_) => {
                if let Some(l) = Landing::on(slot.map, size) {
                    return Ok(l);
                }
            }
            Err(why) => {
                tracing::debug!("reusing a staging file: {why}");
                if let Some(Some(dir)) = node.ctx.object_dirs.get(rx.tier()) {
                    let _ = granary_core::sys::unlink_at(dir, &name);
                }
            }
        }
    }
    Landing::over(rx.part_file()?).map_err(ReceiveError::Tier)
}

/// `n` bytes of entry `idx` arrived. A program waiting for a packed file watches the pack's
/// stream on its node (docs/pack-format.md, "Serving a pack"): bytes of the pack arriving from
/// another node move it as the node's own partition reads do.
fn arrived(node: &Node, idx: u32, n: u64) {
    let t = &node.ctx.table;
    if t.locator(idx).is_some() {
        t.add_pack_streamed(n);
    }
}
