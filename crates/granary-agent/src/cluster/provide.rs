//! The serving side: another rank asks for a file this rank holds. A provider thread makes sure
//! the copy exists — placing it from the source through this node's ordinary placement pool if
//! no one has yet (the pool's source-stream cap staggers those reads), saying `Wait` every
//! `KEEPALIVE` meanwhile; a packed file this rank streams goes to the front of its partition
//! streamer's queue instead — then sends it in `PIECE`s from the copy, checked against the identity
//! recorded at placement like any client open. A requester that gave up (`Cancel`) or went
//! silent gets nothing more.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use granary_core::placement::{CopyMethod, CopyTask};
use granary_core::stats::AgentCounters;
use granary_shm::lifecycle::{self, EntryCell};
use granary_shm::{object_name, State};

use super::node::{Node, PeerRequest};
use super::transport::{Payload, PIECE};
use super::wire::{Answer, Msg};

/// How often a provider still placing a file tells its requester to keep waiting.
const KEEPALIVE: Duration = Duration::from_millis(200);

pub fn spawn(node: &Arc<Node>, jobs: Receiver<PeerRequest>, threads: usize) -> std::io::Result<()> {
    for k in 0..threads {
        let (node, jobs) = (node.clone(), jobs.clone());
        std::thread::Builder::new()
            .name(format!("provide-{k}"))
            .spawn(move || {
                for job in jobs {
                    serve(&node, &job);
                    node.cancelled(job.from, job.tag, false);
                }
            })?;
    }
    Ok(())
}

fn serve(node: &Node, job: &PeerRequest) {
    let ctx = &node.ctx;
    let t = &ctx.table;
    let idx = job.idx;
    let reply = |answer| {
        node.comm.ctrl(
            job.from,
            &Msg::Reply {
                tag: job.tag,
                answer,
            },
        )
    };
    let Some(e) = t
        .entry(idx)
        .filter(|e| e.object == job.object && e.stat.size == job.size && e.stat.is_file())
    else {
        reply(Answer::Stale);
        return;
    };
    let gone = || node.cancelled(job.from, job.tag, true) || !node.peers.alive(job.from);
    let mut keepalive = Instant::now();
    let mut nap = Duration::from_micros(100);
    let streams = node.streams(ctx, idx);
    let mut asked: Option<Instant> = None;
    let word = loop {
        if gone() {
            return;
        }
        let w = t.state(idx);
        match w.state() {
            State::Placed => break w,
            // Asked again now and then: a sweep may have passed it meanwhile (a lost race).
            State::Unplaced | State::Queued if streams => {
                if asked.is_none_or(|at| at.elapsed() >= KEEPALIVE) {
                    if let Some(st) = ctx.pack.get() {
                        st.request(ctx, idx);
                    }
                    asked = Some(Instant::now());
                }
            }
            // Ours, or a file whose owners are all written off and which this rank stands in
            // for (`Node::stand_in`): placed here from the source, once, for every asker.
            State::Unplaced
                if node.own.holds(node.rank, idx) || node.stand_in(idx) == Some(node.rank) =>
            {
                if lifecycle::claim(&EntryCell { table: t, idx }) {
                    let Some(setup) = node.agent.setup.get() else {
                        reply(Answer::NotHeld);
                        return;
                    };
                    setup.pool.submit(CopyTask {
                        ctx: ctx.clone(),
                        entry: idx,
                        method: CopyMethod::Fetch,
                        slot: 0,
                    });
                }
            }
            State::Queued | State::Placing => {}
            State::Stale | State::Gone => {
                reply(Answer::Stale);
                return;
            }
            // Not ours (we never place others' files for them), no room, or only chunks.
            _ => {
                reply(Answer::NotHeld);
                return;
            }
        }
        if keepalive.elapsed() >= KEEPALIVE {
            reply(Answer::Wait);
            keepalive = Instant::now();
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(2));
    };
    let tier = word.tier() as usize;
    // Sent from the copy's kept mapping (`maps`): the pieces go from its pages to the
    // requester's with no buffer in between; read into buffers where it cannot be mapped.
    let staged = Some(tier) == node.staging_tier;
    let map = node
        .maps
        .get(&ctx.table, idx, tier, e.object, e.stat.size, staged, || {
            open_copy(node, idx, tier, e.object, e.stat.size)
        });
    let mut file = None;
    if map.is_none() {
        file = open_copy(node, idx, tier, e.object, e.stat.size);
        if file.is_none() {
            reply(Answer::NotHeld);
            return;
        }
    }
    reply(Answer::Coming {
        sum: t.checksum(idx),
    });
    let size = e.stat.size;
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(PIECE as u64);
        let deadline = Instant::now() + node.timeout * 4;
        if gone() || !node.comm.budget.acquire(n, deadline) {
            return;
        }
        let mapped = map
            .as_ref()
            .and_then(|m| Payload::mapped(m, off as usize, n as usize));
        let piece = match (mapped, file.as_mut()) {
            (Some(p), _) => p,
            (None, None) => {
                node.comm.budget.release(n);
                return;
            }
            (None, Some(file)) => {
                let mut buf = node.comm.bufs.get(n as usize);
                // Into the buffer's spare room (no zeroing pass over what is overwritten).
                match file.take(n).read_to_end(&mut buf) {
                    Ok(got) if got as u64 == n => {
                        node.bounce
                            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        Payload::Owned(buf)
                    }
                    r => {
                        // The copy changed under us (or an I/O error): the requester times
                        // out and reads the source; this copy is checked again.
                        tracing::warn!("reading the copy of entry {idx} failed: {r:?}");
                        node.comm.budget.release(n);
                        node.comm.bufs.put(buf);
                        t.push_request(granary_shm::request::DAMAGED, idx);
                        return;
                    }
                }
            }
        };
        node.comm.data(job.from, job.tag, piece, n);
        off += n;
    }
    let c = &ctx.counters;
    AgentCounters::add(&c.peer_files, 1);
    AgentCounters::add(&c.peer_bytes, size);
}

/// Files up to this size are sent by the communication thread itself when their copy is here
/// (`serve_now`).
const AT_ONCE: u64 = 4 * PIECE as u64;

/// Serves `job` from the communication thread, as it arrives, when the copy is here (PLACED)
/// and the in-flight budget has room for all of it now: the reply and the pieces are queued
/// without waking a provider thread (two thread hand-offs less on the requester's critical
/// path), from the copy's kept mapping (`maps`: populated ahead on a tier in memory; else the
/// first transfer maps its pages and the next ones find them mapped). False: a provider serves it (not placed yet, stale, cancelled, no room, large).
pub fn serve_now(node: &Node, job: &PeerRequest) -> bool {
    let ctx = &node.ctx;
    let t = &ctx.table;
    let idx = job.idx;
    let Some(e) = t
        .entry(idx)
        .filter(|e| e.object == job.object && e.stat.size == job.size && e.stat.is_file())
    else {
        return false;
    };
    let w = t.state(idx);
    let size = e.stat.size;
    if w.state() != State::Placed || size == 0 || size > AT_ONCE {
        return false;
    }
    if node.cancelled(job.from, job.tag, true) || !node.comm.budget.acquire(size, Instant::now()) {
        return false;
    }
    let tier = w.tier() as usize;
    let staged = Some(tier) == node.staging_tier;
    let map = node
        .maps
        .get(&ctx.table, idx, tier, e.object, size, staged, || {
            open_copy(node, idx, tier, e.object, size)
        });
    let Some(map) = map else {
        node.comm.budget.release(size);
        return false;
    };
    node.comm.ctrl(
        job.from,
        &Msg::Reply {
            tag: job.tag,
            answer: Answer::Coming {
                sum: t.checksum(idx),
            },
        },
    );
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(PIECE as u64);
        match Payload::mapped(&map, off as usize, n as usize) {
            Some(p) => node.comm.data(job.from, job.tag, p, n),
            None => node.comm.budget.release(n),
        }
        off += n;
    }
    let c = &ctx.counters;
    AgentCounters::add(&c.peer_files, 1);
    AgentCounters::add(&c.peer_bytes, size);
    true
}

/// The complete copy of `idx` on `tier`, opened and checked: a regular file of the catalog's
/// size with the identity recorded when it was placed.
pub(super) fn open_copy(
    node: &Node,
    idx: u32,
    tier: usize,
    object: u64,
    size: u64,
) -> Option<std::fs::File> {
    let ctx = &node.ctx;
    let dir = ctx.space.dir(tier)?;
    let f = granary_core::sys::open_read_at(dir, &object_name(object)).ok()?;
    let md = f.metadata().ok()?;
    let id = granary_core::sys::copy_identity(&f).ok()?;
    let ok = md.is_file()
        && md.len() == size
        && id == ctx.table.copy_identity(idx)
        && ctx.table.state(idx).state() == State::Placed;
    if !ok {
        ctx.table.push_request(granary_shm::request::DAMAGED, idx);
        return None;
    }
    Some(f)
}
