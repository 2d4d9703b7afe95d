//! The requesting side: a program on this node opened a file another rank reads from the source
//! (or this rank holds a replica of). The entry is taken (PLACING), room reserved — the staging
//! tier for a file of another rank's, this rank's own tiers for a replica —, the file's owners
//! asked in turn, and what arrives written through the ordinary publication path
//! (`placement::peer_copy`).
//!
//! **The program's read, inline.** The thread that takes the program's request (the ring
//! consumer) starts the transfer itself (`start`): it sends the request to the owner, then
//! takes the entry, reserves the room and readies the landing while the owner answers; from
//! there the communication
//! thread carries the transfer on (`Inline`, a `transport::Transfer`): it checksums each piece
//! as it lands and publishes the copy as the last one does, which wakes the program. No thread
//! stands in between: the request reaches the thread that makes the MPI call, and completion
//! wakes the program from it.
//!
//! **The slow path.** Anything else — an owner that says "wait" for longer than the peer
//! timeout or is silent (written off, `Peers::failed`), one that holds no copy, a failure on
//! this side, copies made at start (`Node::copy_others`), no live owner — is a fetcher thread's
//! (`place`): it asks the next owner, or the file's stand-in, or finally reads the source — a
//! packed file from the pack, by this node's partition streamer (only its stored bytes, by its
//! partition offset). Fetchers never wait for this node's placement pool, and the pool never
//! waits for a peer, so two ranks asking each other cannot deadlock.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;
use granary_core::placement::peer_copy::{self, NotStarted, ReceiveError, Receiving};
use granary_core::placement::{whole_file, PlaceOutcome, SourceCtx};
use granary_core::stats::AgentCounters;
use granary_shm::{part_name, EntryRec, State};

use super::node::{Node, RemoteFetch};
use super::peers::{Late, Patience};
use super::staging::{Evicted, Free, Slot};
use super::transport::{Event, Flow, Landing, Transfer};
use super::wire::{Answer, Msg};

/// A program's request for `job` (the ring consumer's, or a pool worker's): carried on by the
/// communication thread when it can be (`inline`), else handed to a fetcher. `Err`: neither
/// (the node is stopping); the caller keeps the job's `inflight` count.
pub fn start(node: &Arc<Node>, job: RemoteFetch) -> Result<(), RemoteFetch> {
    if job.copy {
        return node.fetch_q.send(job).map_err(|e| e.0);
    }
    match inline(node, job) {
        Ok(()) => Ok(()),
        Err(job) => node.fetch_q.send(job).map_err(|e| e.0),
    }
}

/// A job is over: its placement credited to its job slot, its counts given back.
fn done(node: &Node, job: &RemoteFetch, out: PlaceOutcome) {
    tracing::trace!("remote placement of entry {}: {out:?}", job.idx);
    if let PlaceOutcome::Placed { tier, bytes } = out {
        job.ctx
            .counters
            .credit_placement(&job.ctx.table, job.slot, tier, bytes);
    }
    if job.copy {
        node.copies_pending.fetch_sub(1, Ordering::AcqRel);
    }
    job.ctx.work.release();
}

/// Fetcher threads: each takes jobs until the node stops. A job holds one piece of `ctx.work`
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
                    done(&node, &job, out);
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
    /// Nobody delivered: read the source (the entry is QUEUED for `whole_file::fetch`).
    Source,
}

/// Where a copy of `idx` goes and whom to ask: the staging tier for another rank's file, this
/// rank's own tiers for a replica; its live owners but this rank (and `skip`).
fn plan(node: &Node, ctx: &SourceCtx, idx: u32, skip: Option<u32>) -> (Vec<usize>, Vec<u32>) {
    let tiers: Vec<usize> = match node.staging_tier {
        Some(st) if !node.own.holds(node.rank, idx) => vec![st],
        _ => (0..ctx.space.tiers.placeable()).collect(),
    };
    let owners = node
        .own
        .owners(idx)
        .into_iter()
        .filter(|&r| r != node.rank && Some(r) != skip && node.peers.alive(r))
        .collect();
    (tiers, owners)
}

fn place(node: &Node, job: &RemoteFetch, buf: &mut Vec<u8>) -> PlaceOutcome {
    let (ctx, idx) = (&job.ctx, job.idx);
    let Some(e) = ctx.table.entry(idx) else {
        return PlaceOutcome::Skipped;
    };
    let (tiers, mut owners) = plan(node, ctx, idx, job.skip);
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
            // Into this node's own tiers, or, with no room there, into the staging tier
            // (`Remote::overflow`), where it is served to programs here and to other nodes
            // like any copy until it is dropped in turn.
            whole_file::fetch(ctx, idx, setup.pool.engine(), buf)
        }
    }
}

/// Why a transfer from one owner did not deliver.
enum Failure {
    /// It holds no copy and will not (no room, a chunked copy): ask the next, else the source.
    NotHeld,
    /// The source changed.
    Stale,
    /// Nothing from it at all for the peer timeout and an `Ask` (`Patience`), or messages out
    /// of order: written off.
    Silent,
    /// Heard from, but the transfer did not move for `PATIENCE_MAX` (or no tag was free):
    /// given up on without writing it off.
    Slow,
    /// Our side failed (writing the tier, the entry taken away).
    Local(ReceiveError),
}

/// Takes entry `idx` and reserves room for its copy on `tiers` (the staging tier: making room
/// by dropping its oldest copies, whose files may be reused for this one). The copy and the
/// free staging file it may land in; or how it ended without one.
fn prepare(
    node: &Node,
    ctx: &Arc<SourceCtx>,
    idx: u32,
    size: u64,
    tiers: &[usize],
) -> Result<(Receiving, Option<Free>), Got> {
    let staging = node.staging_tier.filter(|st| tiers == [*st]);
    // A staging file ready for reuse (its pages allocated and mapped), if there is one.
    let mut free = staging.and_then(|st| node.staging.take(&ctx.space, st, size));
    let give_back = |free: Option<Free>| {
        if let (Some(st), Some(f)) = (staging, free) {
            node.staging.give_back(&ctx.space, st, f);
        }
    };
    loop {
        match peer_copy::receive(ctx, idx, tiers) {
            Ok(rx) => {
                if staging.is_some() && free.is_none() {
                    node.staging.count_fresh();
                }
                return Ok((rx, free));
            }
            Err(NotStarted::Skipped(o)) => {
                give_back(free);
                return Err(Got::Outcome(o));
            }
            Err(NotStarted::NoRoom) => {
                let Some(st) = staging else {
                    // No room for a replica: the source.
                    return Err(Got::Source);
                };
                let part = ctx.table.entry(idx).map(|e| part_name(e.object));
                let want = part.as_ref().map(|p| &p[..]).filter(|_| free.is_none());
                match node.staging.evict_oldest(ctx, st, want) {
                    Evicted::Dropped => continue,
                    Evicted::Recycled(f) => {
                        if free.is_none() && f.slot.map.len() as u64 >= size {
                            free = Some(f);
                        } else {
                            node.staging.give_back(&ctx.space, st, f);
                        }
                        continue;
                    }
                    // Larger than the staging tier: the source.
                    Evicted::Nothing => {
                        give_back(free);
                        return Err(Got::Source);
                    }
                }
            }
        }
    }
}

/// The whole copy arrived from `owner` with its announced checksum `sum`: checked and published
/// (PLACED: programs waiting for it wake), counted, and kept in the staging tier's order with
/// the file and mapping it landed in (`mapped`) for reuse. `Err`: not published (the caller
/// abandons it).
fn publish(
    node: &Node,
    rx: &mut Receiving,
    sum: u64,
    owner: u32,
    mapped: &mut Option<Arc<memmap2::MmapRaw>>,
    started: Instant,
) -> Result<PlaceOutcome, ReceiveError> {
    let ctx = &node.ctx;
    let idx = rx.idx();
    // A packed file is checked against the index's checksum itself, not only the owner's word
    // for it.
    let sum = ctx.table.locator(idx).map_or(sum, |l| l.checksum.max(1));
    // Counted before the copy is published: the program it wakes may finish, and its job's
    // numbers be taken, before this thread runs again (a job's last remote file went
    // uncounted so, under load).
    let c = &ctx.counters;
    AgentCounters::add(&c.remote_files, 1);
    AgentCounters::add(&c.remote_bytes, rx.size());
    let done = rx.finish(sum);
    node.hashed_bytes.fetch_add(rx.written(), Ordering::Relaxed);
    node.hashing_ns
        .fetch_add(rx.hashing().as_nanos() as u64, Ordering::Relaxed);
    if done.is_err() {
        c.remote_files.fetch_sub(1, Ordering::Relaxed);
        c.remote_bytes.fetch_sub(rx.size(), Ordering::Relaxed);
    }
    let out = done?;
    tracing::debug!(
        "entry {idx}: {} bytes from rank {owner} in {:?}",
        rx.size(),
        started.elapsed()
    );
    if let (Some(st), PlaceOutcome::Placed { tier, .. }) = (node.staging_tier, &out) {
        if *tier == st {
            let slot = rx
                .take_file()
                .zip(mapped.take())
                .map(|(file, map)| Slot { file, map });
            node.staging.push(idx, slot);
        }
    }
    Ok(out)
}

fn remote(
    node: &Node,
    ctx: &Arc<SourceCtx>,
    idx: u32,
    e: &EntryRec,
    tiers: &[usize],
    owners: &[u32],
) -> Got {
    let staging = node.staging_tier.filter(|st| tiers == [*st]);
    let (mut rx, mut free) = match prepare(node, ctx, idx, e.stat.size, tiers) {
        Ok(p) => p,
        Err(got) => return got,
    };
    let mut not_held = 0;
    // The mapping the copy landed in, kept with its file for reuse once staged.
    let mut mapped = None;
    for &owner in owners {
        let started = Instant::now();
        match transfer(node, &mut rx, owner, idx, e, &mut free, &mut mapped) {
            Ok(sum) => {
                return match publish(node, &mut rx, sum, owner, &mut mapped, started) {
                    Ok(out) => Got::Placed(out),
                    Err(why) => {
                        tracing::warn!("copy of entry {idx} from rank {owner}: {why}");
                        rx.abandon(&why);
                        Got::Source
                    }
                };
            }
            Err(Failure::NotHeld) => not_held += 1,
            Err(Failure::Stale) => {
                rx.give_up(State::Stale);
                return Got::Outcome(PlaceOutcome::Stale);
            }
            Err(f @ (Failure::Silent | Failure::Slow)) => {
                tracing::debug!("rank {owner} did not send entry {idx} in time");
                if matches!(f, Failure::Silent) {
                    node.write_off(owner);
                }
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
    if let (Some(st), Some(f)) = (staging, free.take()) {
        node.staging.give_back(&ctx.space, st, f);
    }
    if not_held == owners.len() {
        // Held nowhere (larger than the owner's staging tier too): the program reads the
        // source, as on one node, and this node keeps no copy either.
        AgentCounters::add(&ctx.counters.remote_fallbacks, 1);
        rx.give_up(State::SourceOnly);
        return Got::Outcome(PlaceOutcome::SourceOnly);
    }
    rx.abandon(&ReceiveError::Mismatch("sender"));
    Got::Source
}

/// `job` after `prepare` said `got` instead of readying a receipt: over if that decided its
/// outcome (`Ok`), else a fetcher's (`Err`).
fn unprepared(node: &Node, job: RemoteFetch, got: Got) -> Result<(), RemoteFetch> {
    match got {
        Got::Outcome(out) => {
            done(node, &job, out);
            Ok(())
        }
        _ => Err(job),
    }
}

/// Starts a program's remote read of `job` on the communication thread: the request sent to
/// its first live owner, then — while the request travels and the owner answers — the entry
/// taken, room reserved and the landing readied, and the transfer handed to the communication
/// thread (`Inline`). The request leaves first because only the landing must exist before the
/// first byte moves: the owner's answer and its pieces wait for it (kept, matched but not
/// received), so taking the entry, reserving the room (dropping the oldest staged copies, a
/// free staging file taken) and renaming the file into place overlap the round trip to the
/// owner instead of preceding it. When the preparation fails after the request went out (the
/// entry taken by someone else meanwhile, no staged copy that may be dropped), the request is
/// cancelled and its tag retired for good; once a quarter of the tags for that owner are
/// retired (`Tags::plenty`), the preparation comes first again, so cancels can never use up the
/// tags. `Err`: the job is a fetcher's (no live owner, no tag, no room but the source, a
/// failure before the transfer started).
fn inline(node: &Arc<Node>, job: RemoteFetch) -> Result<(), RemoteFetch> {
    let (ctx, idx) = (job.ctx.clone(), job.idx);
    let Some(e) = ctx.table.entry(idx) else {
        return Err(job);
    };
    let (tiers, owners) = plan(node, &ctx, idx, job.skip);
    let Some(&owner) = owners.first() else {
        return Err(job);
    };
    if let Some(src) = node.direct.source(idx, e.object, e.stat.size, &owners) {
        return match prepare(node, &ctx, idx, e.stat.size, &tiers) {
            Ok((rx, free)) => direct(node, job, rx, free, src),
            Err(got) => unprepared(node, job, got),
        };
    }
    // A file the staging tier cannot hold at all goes to the source (`prepare` would say so
    // after the request went out).
    if node.staging_tier.is_some_and(|st| tiers == [st])
        && ctx
            .space
            .tiers
            .usage()
            .get(tiers[0])
            .is_some_and(|u| e.stat.size > u.capacity)
    {
        return Err(job);
    }
    // Prepared before the request once cancels have retired many of this owner's tags.
    let early = if node.tags.plenty(owner) {
        None
    } else {
        match prepare(node, &ctx, idx, e.stat.size, &tiers) {
            Ok(p) => Some(p),
            Err(got) => return unprepared(node, job, got),
        }
    };
    let Some(tag) = node.tags.take(owner) else {
        if let Some((rx, free)) = early {
            if let (Some(st), Some(f)) = (node.staging_tier, free) {
                node.staging.give_back(&ctx.space, st, f);
            }
            rx.abandon(&ReceiveError::Lost);
        }
        return Err(job);
    };
    let started = Instant::now();
    node.comm.expect_inline(owner, tag);
    node.comm.ctrl(
        owner,
        &Msg::Request {
            tag,
            idx,
            object: e.object,
            size: e.stat.size,
        },
    );
    let cancel = || {
        tracing::debug!("entry {idx}: request to rank {owner} cancelled, its preparation failed");
        node.comm.forget(owner, tag);
        node.tags.give_back(owner, tag, false);
        node.comm.ctrl(owner, &Msg::Cancel { tag });
    };
    let prepared = early.map_or_else(|| prepare(node, &ctx, idx, e.stat.size, &tiers), Ok);
    let (mut rx, mut free) = match prepared {
        Ok(p) => p,
        Err(got) => {
            cancel();
            return unprepared(node, job, got);
        }
    };
    // The part file, allocated and mapped, where the pieces land straight from the owner's
    // copy (the first ones wait for it, matched, not received).
    let landing = match land(node, &mut rx, &mut free) {
        Ok(l) => Arc::new(l),
        Err(why) => {
            cancel();
            rx.abandon(&why);
            return Err(job);
        }
    };
    let t = Inline {
        node: node.clone(),
        job: Some(job),
        rx: Some(rx),
        owner,
        tag,
        mapped: Some(landing.map()),
        landing: landing.clone(),
        sum: None,
        patience: Patience::new(node.timeout),
        started,
    };
    node.comm.carry(owner, tag, landing, Box::new(t));
    Ok(())
}

/// A program's remote read of a file a rank on this host holds (`direct`): copied from its
/// mapping by this thread, slice by slice, checked and published. `Err`: the job is a
/// fetcher's, the MPI way (the mapping was not what was announced, the owner is gone).
fn direct(
    node: &Node,
    job: RemoteFetch,
    mut rx: Receiving,
    mut free: Option<Free>,
    src: super::direct::Source,
) -> Result<(), RemoteFetch> {
    let started = Instant::now();
    let landing = match land(node, &mut rx, &mut free) {
        Ok(l) => l,
        Err(why) => {
            rx.abandon(&why);
            return Err(job);
        }
    };
    let mut mapped = Some(landing.map());
    let res = node
        .direct
        .copy(&src, &landing, &mut rx)
        .and_then(|()| publish(node, &mut rx, src.m.sum, src.rank, &mut mapped, started));
    match res {
        Ok(out) => {
            node.direct.count(src.m.size);
            done(node, &job, out);
            Ok(())
        }
        Err(why) => {
            tracing::debug!(
                "direct read of entry {} from rank {}: {why}",
                job.idx,
                src.rank
            );
            node.direct.forget(job.idx);
            rx.abandon(&why);
            Err(job)
        }
    }
}

/// A program's remote read from `owner`, carried on by the communication thread (module
/// comment): every event is handled as it arrives, on that thread, and never blocks.
struct Inline {
    node: Arc<Node>,
    /// `None` once over.
    job: Option<RemoteFetch>,
    rx: Option<Receiving>,
    owner: u32,
    tag: i32,
    landing: Arc<Landing>,
    /// The landing's mapping, kept with the staged copy's file for reuse.
    mapped: Option<Arc<memmap2::MmapRaw>>,
    /// The checksum the owner announced (`Coming`).
    sum: Option<u64>,
    /// When the owner's next message is due, and what its silence means.
    patience: Patience,
    started: Instant,
}

impl Transfer for Inline {
    fn event(&mut self, ev: Event) -> Flow {
        let Some(rx) = self.rx.as_mut() else {
            return Flow::Done;
        };
        let res = match ev {
            Event::Reply(Answer::Wait) => Ok(()),
            Event::Reply(Answer::Coming { sum }) => {
                self.sum = Some(sum);
                Ok(())
            }
            Event::Reply(Answer::NotHeld) => return self.end(Err(Failure::NotHeld)),
            Event::Reply(Answer::Stale) => return self.end(Err(Failure::Stale)),
            Event::Landed { off, len } => {
                let r = rx.landed(self.landing.landed(off, len));
                arrived(&self.node, rx.idx(), len as u64);
                r
            }
            Event::Data(buf) => {
                self.node
                    .bounce
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
                let r = rx.append(&buf);
                arrived(&self.node, rx.idx(), buf.len() as u64);
                self.node.comm.bufs.put(buf);
                r
            }
            Event::Overflow => return self.end(Err(Failure::Silent)),
        };
        if let Err(why) = res {
            return self.end(Err(Failure::Local(why)));
        }
        self.patience.heard();
        match self.sum {
            Some(sum) if rx.written() == rx.size() => self.end(Ok(sum)),
            _ => Flow::More,
        }
    }

    fn tick(&mut self, now: Instant) -> Flow {
        match self.patience.late(&self.node.peers, self.owner, now) {
            Late::Wait => Flow::More,
            Late::Ask => {
                self.node.comm.quiet(self.owner, &Msg::Ask);
                Flow::More
            }
            Late::Silent => self.end(Err(Failure::Silent)),
            Late::Slow => self.end(Err(Failure::Slow)),
        }
    }
}

impl Inline {
    /// The transfer is over: every announced byte arrived with its checksum (`Ok`), or not.
    /// The copy is published (the program wakes) or given up, or the job goes to a fetcher.
    fn end(&mut self, how: Result<u64, Failure>) -> Flow {
        let (Some(mut rx), Some(mut job)) = (self.rx.take(), self.job.take()) else {
            return Flow::Done;
        };
        let (node, owner, tag, idx) = (&*self.node, self.owner, self.tag, job.idx);
        // A tag is used again only if nothing more can arrive for it.
        let clean = matches!(how, Ok(_) | Err(Failure::NotHeld | Failure::Stale));
        node.tags.give_back(owner, tag, clean);
        if !clean {
            node.comm.ctrl(owner, &Msg::Cancel { tag });
        }
        let retry = match how {
            Ok(sum) => match publish(node, &mut rx, sum, owner, &mut self.mapped, self.started) {
                Ok(out) => {
                    done(node, &job, out);
                    return Flow::Done;
                }
                Err(why) => {
                    tracing::warn!("copy of entry {idx} from rank {owner}: {why}");
                    rx.abandon(&why);
                    Some(owner)
                }
            },
            Err(Failure::Stale) => {
                rx.give_up(State::Stale);
                done(node, &job, PlaceOutcome::Stale);
                return Flow::Done;
            }
            Err(Failure::NotHeld) if node.own.owners(idx).len() <= 1 => {
                // Held nowhere (larger than the owner's staging tier too): the program reads
                // the source, as on one node, and this node keeps no copy either.
                AgentCounters::add(&job.ctx.counters.remote_fallbacks, 1);
                rx.give_up(State::SourceOnly);
                done(node, &job, PlaceOutcome::SourceOnly);
                return Flow::Done;
            }
            Err(Failure::NotHeld) => {
                rx.abandon(&ReceiveError::Mismatch("sender"));
                Some(owner)
            }
            Err(f @ (Failure::Silent | Failure::Slow)) => {
                tracing::debug!("rank {owner} did not send entry {idx} in time");
                if matches!(f, Failure::Silent) {
                    node.write_off(owner);
                }
                rx.abandon(&ReceiveError::Mismatch("sender"));
                Some(owner)
            }
            Err(Failure::Local(why)) => {
                tracing::warn!("receiving entry {idx} from rank {owner}: {why}");
                rx.abandon(&why);
                None
            }
        };
        // The rest is a fetcher's: the next owner, the stand-in or the source.
        job.skip = retry;
        if let Err(e) = node.fetch_q.send(job) {
            done(node, &e.0, PlaceOutcome::Skipped);
        }
        Flow::Done
    }
}

impl Drop for Inline {
    /// Dropped unfinished (the node stops): the copy is given up, the counts given back.
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            self.node.tags.give_back(self.owner, self.tag, false);
            if let Some(rx) = self.rx.take() {
                rx.abandon(&ReceiveError::Lost);
            }
            done(&self.node, &job, PlaceOutcome::Skipped);
        }
    }
}

/// Asks `owner` for entry `idx` and appends what it sends to `rx`; returns the checksum it
/// announced. Its tag is given back clean only if every announced byte arrived (or it answered
/// without data): otherwise late pieces could land in a later transfer, so it is retired.
fn transfer(
    node: &Node,
    rx: &mut Receiving,
    owner: u32,
    idx: u32,
    e: &EntryRec,
    free: &mut Option<Free>,
    mapped: &mut Option<Arc<memmap2::MmapRaw>>,
) -> Result<u64, Failure> {
    let Some(tag) = node.tags.take(owner) else {
        return Err(Failure::Slow);
    };
    let events = node.comm.expect(owner, tag);
    let mut patience = Patience::new(node.timeout);
    // The owner's next event, waited for with patience.
    let mut next = || loop {
        match events.recv_deadline(patience.deadline()) {
            Ok(ev) => {
                patience.heard();
                return Ok(ev);
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(Failure::Silent),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                match patience.late(&node.peers, owner, Instant::now()) {
                    Late::Wait => {}
                    Late::Ask => node.comm.quiet(owner, &Msg::Ask),
                    Late::Silent => return Err(Failure::Silent),
                    Late::Slow => return Err(Failure::Slow),
                }
            }
        }
    };
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
            match next()? {
                Event::Reply(Answer::Wait) => {}
                Event::Reply(Answer::Coming { sum }) => break sum,
                Event::Reply(Answer::NotHeld) => {
                    clean = true;
                    return Err(Failure::NotHeld);
                }
                Event::Reply(Answer::Stale) => {
                    clean = true;
                    return Err(Failure::Stale);
                }
                _ => return Err(Failure::Silent),
            }
        };
        while rx.written() < rx.size() {
            match next()? {
                Event::Landed { off, len } => {
                    rx.landed(landing.landed(off, len))
                        .map_err(Failure::Local)?;
                    arrived(node, idx, len as u64);
                }
                Event::Data(buf) => {
                    node.bounce.fetch_add(buf.len() as u64, Ordering::Relaxed);
                    let r = rx.append(&buf);
                    arrived(node, idx, buf.len() as u64);
                    node.comm.bufs.put(buf);
                    r.map_err(Failure::Local)?;
                }
                _ => return Err(Failure::Silent),
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
fn land(node: &Node, rx: &mut Receiving, free: &mut Option<Free>) -> Result<Landing, ReceiveError> {
    if let Some(f) = free.take() {
        let size = rx.size() as usize;
        let Free {
            slot, name, known, ..
        } = f;
        match rx.part_from(slot.file, &name, known) {
            Ok(_) => {
                if let Some(l) = Landing::on(slot.map, size) {
                    return Ok(l);
                }
            }
            Err(why) => {
                tracing::debug!("reusing a staging file: {why}");
                if let Some(dir) = node.ctx.space.dir(rx.tier()) {
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
