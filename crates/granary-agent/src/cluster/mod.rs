//! Cluster mode (`granary serve`, docs/cluster.md): one serving agent per node, started by an
//! MPI launcher; together they make every node's local tiers one cache of the dataset.
//!
//! - One catalog per job: rank 0 walks (or loads) the source, and its table image reaches every
//!   rank (`mpi::Mpi::broadcast`), which adopts it without a call on the source.
//! - One source read per byte: every file has owners (`ownership`); the first one reads it from
//!   the source (through the ordinary placement pool) and serves it to the others. A pack's
//!   files are dealt out in contiguous stretches of the pack, which each rank's partition
//!   streamer reads in large sequential reads (`placement::pack_streamer`).
//! - Remote reads: a program opening a file another rank holds waits (the table's cluster flag)
//!   while a fetcher (`fetch`) gets it from an owner's provider (`provide`) into this node's
//!   staging tier (`staging`); then it opens a real local copy, as on one node.
//! - Faults: every wait on a peer is bounded (`peers`, the peer timeout); what a silent rank
//!   holds comes from a replica or the source.
//! - MPI lives in one thread (`transport`, `mpi`), in the serving agent only.
//! - One rank's state as its threads share it (`node::Node`: table, ownership, peers, staging,
//!   the fetchers' and providers' queues) is `node`'s; here: starting it, heartbeats, the MPI
//!   messages it gets, and placement's hook into it (`Remote`).

// Without the `mpi` feature only the flags, the status types and the tested logic are built.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

mod config;
mod direct;
mod doorbell;
mod fetch;
mod maps;
#[cfg(feature = "mpi")]
mod mpi;
mod node;
pub mod ownership;
mod peers;
mod provide;
#[cfg(feature = "mpi")]
mod serve;
mod staging;
mod transport;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use granary_core::placement::{PlaceOutcome, Remote, SourceCtx};
use granary_core::Reservation;
use granary_shm::lifecycle::{self, EntryCell, Void};
use granary_shm::State;

use crate::agent::Agent;
use crate::protocol::{ClusterStatus, PeerStatus};
use crate::serving::{Serving, ServingNode};
use ownership::Ownership;
use peers::Peers;
use staging::Staging;
use transport::{Comm, Inbox, Tags};
use wire::{Beat, Msg};

use config::replicated;
pub use config::{for_rank, replicate_set, ServeConfig};
pub use node::{Node, Setup};
use node::{PeerRequest, RemoteFetch};

/// `granary serve`: this process is one rank of the serving job, until it is stopped.
pub fn serve(config: ServeConfig) -> Result<()> {
    #[cfg(feature = "mpi")]
    {
        serve::serve(config)
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = config;
        anyhow::bail!(
            "this granary was built without MPI: `granary serve` needs a build with the `mpi` \
             feature (`cargo build --release --features mpi`, with an MPI library such as \
             OpenMPI's libopenmpi-dev and libclang-dev installed)"
        )
    }
}

/// How often a heartbeat's count of held copies is taken again (a pass over every entry).
const HELD_EVERY: Duration = Duration::from_secs(1);

/// Threads of each kind: fetchers mostly wait on peers, providers on the source (the pool's
/// stream cap bounds those reads).
const FETCHERS: usize = 16;
const PROVIDERS: usize = 8;

impl Node {
    /// The node of this rank: ownership dealt, threads started, placement hooked.
    pub fn start(
        agent: Arc<Agent>,
        ctx: Arc<SourceCtx>,
        s: Setup,
        comm: Comm,
    ) -> Result<Arc<Node>> {
        let t = &ctx.table;
        let own = Ownership::assign(t, s.ranks, s.replicas, |rel| {
            replicated(&s.replicate_set, rel)
        });
        let staging_tier = (ctx.space.tiers.placeable() < ctx.space.tiers.len())
            .then_some(ctx.space.tiers.placeable());
        let (fetch_q, fetch_rx) = crossbeam_channel::unbounded();
        let (provide_q, provide_rx) = crossbeam_channel::unbounded();
        let node = Arc::new_cyclic(|me| Node {
            me: me.clone(),
            rank: s.rank,
            ranks: s.ranks,
            agent,
            ctx: ctx.clone(),
            own,
            peers: Peers::new(s.rank, s.ranks),
            comm,
            tags: Tags::new(s.ranks),
            staging: Staging::default(),
            staging_tier,
            timeout: s.timeout,
            fetch_q,
            provide_q,
            cancelled: Mutex::default(),
            copies_pending: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            bounce: AtomicU64::new(0),
            hashed_bytes: AtomicU64::new(0),
            hashing_ns: AtomicU64::new(0),
            maps: maps::Maps::default(),
            direct: direct::Direct::new(s.ranks, s.direct),
            replicate: s.replicate,
            replicas: s.replicas,
            held: Mutex::default(),
            cut_off: AtomicBool::new(false),
        });
        node.place_empty_files();
        node.stage_kept_copies();
        if node.direct.on() {
            let card = node.direct.card();
            for r in (0..node.ranks).filter(|&r| r != node.rank) {
                node.comm.quiet(r, &card);
            }
        }
        fetch::spawn(&node, fetch_rx, FETCHERS)?;
        provide::spawn(&node, provide_rx, PROVIDERS)?;
        let hook: Arc<dyn Remote> = node.clone();
        let _ = ctx.remote.set(hook);
        ctx.table.set_cluster(true);
        node.stream_pack()?;
        {
            let n = node.clone();
            std::thread::Builder::new()
                .name("cluster-beat".into())
                .spawn(move || n.heartbeats())?;
        }
        {
            let n = node.clone();
            std::thread::Builder::new()
                .name("cluster-copies".into())
                .spawn(move || n.copy_others())?;
        }
        {
            let n = node.clone();
            std::thread::Builder::new()
                .name("cluster-maps".into())
                .spawn(move || {
                    granary_core::sys::sched_idle();
                    n.warm_maps();
                })?;
        }
        if let Some(st) = node.staging_tier {
            // Staging files are recycled (staging.rs): leases tell when nobody else has one open.
            granary_core::sys::ignore_lease_breaks();
            let n = node.clone();
            std::thread::Builder::new()
                .name("cluster-stage".into())
                .spawn(move || {
                    // Made ahead with spare cycles only: never in the way of a transfer or a
                    // program.
                    granary_core::sys::sched_idle();
                    let sample = n.others_sizes();
                    let stopping = || n.agent.stopping.load(Ordering::Acquire);
                    n.staging.fill(&n.ctx.space, st, sample, &stopping);
                })?;
        }
        Ok(node)
    }

    /// Keeps the mappings of this rank's own copies on tiers in memory made and populated
    /// (`maps`), a pass whenever the copies it holds changed (and every half minute, to drop
    /// those of copies gone).
    fn warm_maps(&self) {
        let ctx = &self.ctx;
        let memory: Vec<bool> = (0..ctx.space.tiers.len())
            .map(|t| {
                Some(t) != self.staging_tier
                    && ctx
                        .space
                        .dir(t)
                        .is_some_and(granary_core::sys::is_memory_fs)
            })
            .collect();
        let stopping = || self.agent.stopping.load(Ordering::Acquire);
        let mut seen = None;
        let mut at = std::time::Instant::now();
        while !stopping() {
            let held = self.held();
            if seen != Some(held) || at.elapsed() > Duration::from_secs(30) {
                seen = Some(held);
                at = std::time::Instant::now();
                self.maps.warm(
                    &ctx.table,
                    &memory,
                    |idx| self.own.holds(self.rank, idx),
                    |idx, tier, object, size| provide::open_copy(self, idx, tier, object, size),
                    &stopping,
                );
            }
            self.announce_maps(&memory);
            self.direct.warm(&stopping);
            std::thread::sleep(HELD_EVERY);
        }
    }

    /// Tells the ranks on this host where the mappings kept since the last call are (every
    /// kept one after a rank on this host was learned): they read those copies directly
    /// (`direct`).
    fn announce_maps(&self, memory: &[bool]) {
        let near = self.direct.near_ranks();
        let all = self.direct.take_announce_all();
        if near.is_empty() {
            return;
        }
        let v = self.maps.to_announce(&self.ctx.table, memory, all);
        for chunk in v.chunks(wire::MAPPED_PER_MSG) {
            let msg = Msg::Mapped(chunk.to_vec());
            for &r in &near {
                self.comm.quiet(r, &msg);
            }
        }
    }

    /// A pack: this rank's partition streamers, reading its own stretch of the pack only.
    fn stream_pack(&self) -> Result<()> {
        let (Some(st), Some(setup)) = (self.ctx.pack.get(), self.agent.setup.get()) else {
            return Ok(());
        };
        st.restrict(|idx| self.own.primary(idx) == Some(self.rank));
        granary_core::placement::pack_streamer::spawn(
            self.ctx.clone(),
            setup.pool.engine().clone(),
        )?;
        Ok(())
    }

    /// Empty files are placed here at once: their copy needs no byte from anyone, and a
    /// program opening one then never opens the source (the preload's cluster wait is for files
    /// of at least one byte).
    fn place_empty_files(&self) {
        let t = &self.ctx.table;
        let tiers: Vec<usize> = (0..self.ctx.space.tiers.placeable()).collect();
        let mut n = 0;
        for idx in 0..t.entry_count() {
            let empty = t
                .entry(idx)
                .is_some_and(|e| e.stat.is_file() && e.stat.size == 0);
            if !empty || !lifecycle::claim(&EntryCell { table: t, idx }) {
                continue;
            }
            match granary_core::placement::peer_copy::receive(&self.ctx, idx, &tiers) {
                Ok(mut rx) => match rx.finish(0) {
                    Ok(_) => n += 1,
                    Err(why) => {
                        tracing::debug!("empty file {idx}: {why}");
                        rx.give_up(State::SourceOnly);
                    }
                },
                Err(_) => {
                    lifecycle::unclaim(&EntryCell { table: t, idx });
                }
            }
        }
        if n > 0 {
            tracing::info!("{n} empty files placed");
        }
    }

    /// Copies in the staging tier that an earlier serve of this node left (kept by its saved
    /// catalog) join the staging tier's order, so they are dropped oldest first like the ones
    /// this serve stages instead of holding their room for good.
    fn stage_kept_copies(&self) {
        let Some(st) = self.staging_tier else { return };
        let t = &self.ctx.table;
        let mut n = 0;
        for idx in 0..t.entry_count() {
            let w = t.state(idx);
            if w.state() == State::Placed && w.tier() as usize == st {
                self.staging.push(idx, None);
                n += 1;
            }
        }
        if n > 0 {
            tracing::info!("{n} staged copies of the last serve kept");
        }
    }

    /// Draws sizes of the files other ranks hold, each file weighted by its bytes (what this
    /// node's staging tier will receive): what the staging filler makes ahead first.
    fn others_sizes(&self) -> impl FnMut() -> Option<u64> {
        let t = &self.ctx.table;
        let mut sizes = Vec::new();
        let mut total = 0u64;
        for idx in 0..t.entry_count() {
            let Some(e) = t.entry(idx) else { continue };
            if e.stat.is_file() && e.stat.size > 0 && !self.own.holds(self.rank, idx) {
                total += e.stat.size;
                sizes.push((total, e.stat.size));
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(self.rank);
        move || {
            if total == 0 {
                return None;
            }
            // xorshift: any spread will do.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = x % total;
            let k = sizes.partition_point(|&(cum, _)| cum <= at);
            sizes.get(k).map(|&(_, s)| s)
        }
    }

    /// Liveness (`peers`: a ring): every `BEAT_PERIOD` a heartbeat with this rank's numbers to
    /// its successor, and a look at its predecessor, written off (and every rank told) when
    /// silent for `SUSPECT_AFTER`.
    fn heartbeats(&self) {
        let mut last = std::time::Instant::now();
        // Since when this thread has run without being stopped itself.
        let mut awake = last;
        while !self.agent.stopping.load(Ordering::Acquire) {
            // This thread was stopped itself (SIGSTOP, a frozen VM): the predecessor's silence
            // meanwhile says nothing, watch it afresh; so does the communication thread's.
            if last.elapsed() > 4 * peers::BEAT_PERIOD {
                self.peers.rewatch();
                awake = std::time::Instant::now();
            }
            last = std::time::Instant::now();
            self.watch_mpi(awake.elapsed());
            let b = self.beat();
            self.peers.beat(self.rank, b);
            if let Some(next) = self.peers.successor() {
                self.comm.quiet(next, &Msg::Heartbeat(b));
            }
            match self.peers.check() {
                peers::Watch::Fine => {}
                peers::Watch::Ask(p) => self.comm.quiet(p, &Msg::Ask),
                peers::Watch::Down(dead) => {
                    tracing::warn!(
                        "rank {dead} silent for {:?}, and did not answer: written off",
                        peers::SUSPECT_AFTER + peers::ASK_GRACE
                    );
                    self.tell_down(dead);
                }
            }
            for (rank, life) in self.peers.retell_due() {
                tracing::debug!("rank {rank} told again that it is written off (its life {life})");
                self.comm.quiet(rank, &Msg::Down { rank, life });
            }
            std::thread::sleep(peers::BEAT_PERIOD);
        }
    }

    /// A communication thread stuck inside the MPI library (`transport::Pulse`) for
    /// `STUCK_AFTER` while this thread ran (`awake`: a stopped process is not a stuck one) can
    /// reach no peer and hear none: every peer is written off here (nobody can be told), so transfers
    /// waiting on them end, and this node serves what its tiers hold and reads the rest from
    /// the source until the thread moves again (peers are then heard from again).
    fn watch_mpi(&self, awake: Duration) {
        let silent = self.comm.pulse.silent().min(awake);
        let stuck = silent >= transport::STUCK_AFTER;
        if stuck == self.cut_off.swap(stuck, Ordering::AcqRel) {
            if stuck {
                // Kept written off: a rank written off elsewhere may have been heard from
                // just before.
                self.peers.cut_off();
            }
            return;
        }
        if stuck {
            tracing::error!(
                "the communication thread has not returned from the MPI library for {silent:?}: \
                 MPI hangs on this rank (OpenMPI's TCP transport can, after a peer died in the \
                 middle of a message to it). This node serves what its tiers hold and reads the \
                 rest from the source"
            );
            self.peers.cut_off();
        } else {
            tracing::warn!("the communication thread moves again after {silent:?} in MPI");
        }
    }

    /// Complete copies in this rank's own tiers (not staging): one pass over the table, at most
    /// every `HELD_EVERY` (a heartbeat carries the last count).
    fn held(&self) -> (u64, u64) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.0.is_some_and(|at| at.elapsed() < HELD_EVERY) {
            return (h.1, h.2);
        }
        let t = &self.ctx.table;
        let (mut files, mut bytes) = (0, 0);
        for i in 0..t.entry_count() {
            let w = t.state(i);
            let staged = Some(w.tier() as usize) == self.staging_tier;
            if w.state() == State::Placed && !staged {
                files += 1;
                bytes += t.entry(i).map_or(0, |e| e.stat.size);
            }
        }
        *h = (Some(std::time::Instant::now()), files, bytes);
        (files, bytes)
    }

    fn beat(&self) -> Beat {
        let p = self.ctx.counters.snapshot();
        let (files, bytes) = self.held();
        Beat {
            files_held: files,
            bytes_held: bytes,
            bytes_staged: self
                .staging_tier
                .map_or(0, |st| self.staging.bytes(&self.ctx.space, st)),
            remote_files: p.remote_files,
            remote_bytes: p.remote_bytes,
            peer_files: p.peer_files,
            peer_bytes: p.peer_bytes,
            pfs_bytes: p.agent_source_bytes,
            fallbacks: p.remote_fallbacks,
            jobs: self.agent.jobs.load(Ordering::Acquire).saturating_sub(1) as u64,
            bounce_bytes: self.bounce.load(Ordering::Relaxed),
        }
    }

    /// At start: the copies this rank holds of files another rank reads from the source
    /// (replicas, `--replicate`), fetched from them a few at a time, so they are there when a
    /// program (or a rank whose owner died) wants them.
    fn copy_others(&self) {
        let todo = self.own.copies_of_others(self.rank);
        self.copies_pending
            .store(todo.len() as u64, Ordering::Release);
        if !todo.is_empty() {
            tracing::info!(
                "copying {} files other ranks read from the source",
                todo.len()
            );
        }
        for idx in todo {
            if self.agent.stopping.load(Ordering::Acquire) {
                return;
            }
            while self.ctx.work.held() >= FETCHERS / 2 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let claimed = lifecycle::claim(&EntryCell {
                table: &self.ctx.table,
                idx,
            });
            if claimed {
                self.ctx.work.hold();
                let job = RemoteFetch {
                    ctx: self.ctx.clone(),
                    idx,
                    slot: 0,
                    copy: true,
                    skip: None,
                };
                if self.fetch_q.send(job).is_ok() {
                    continue;
                }
                self.ctx.work.release();
            }
            // Placed or on its way already (a program asked first).
            self.copies_pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl ServingNode for Node {
    fn stop_all(&self) {
        for r in (0..self.ranks).filter(|&r| r != self.rank) {
            self.comm.ctrl(r, &Msg::Stop);
        }
    }

    fn status(&self, serving: &Serving) -> ClusterStatus {
        let (files, bytes) = self.owned();
        // A user asked: this rank's count as of now, not of the last heartbeat's pass.
        self.held.lock().unwrap_or_else(|e| e.into_inner()).0 = None;
        self.peers.beat(self.rank, self.beat());
        // The other ranks' numbers, asked for now (liveness does not carry them): every live
        // rank answers with a heartbeat, waited for a moment at most.
        let mark = self.peers.mark();
        let others: Vec<u32> = (0..self.ranks)
            .filter(|&r| r != self.rank && self.peers.alive(r))
            .collect();
        for &r in &others {
            self.comm.quiet(r, &Msg::Ask);
        }
        self.peers
            .await_beats(&others, mark, Duration::from_millis(300));
        let free = self.staging.free();
        ClusterStatus {
            rank: self.rank,
            ranks: self.ranks,
            ready: true,
            source: serving.source.clone(),
            pack: serving.pack.clone(),
            mount: serving.mount,
            replicas: self.replicas,
            replicate: self.replicate.clone(),
            copies_pending: self.copies_pending.load(Ordering::Acquire),
            invalidations: self.invalidations.load(Ordering::Acquire),
            staging_recycled: self.staging.recycled(),
            staging_fresh: self.staging.fresh(),
            staging_free_files: free.0,
            staging_free_bytes: free.1,
            hashed_bytes: self.hashed_bytes.load(Ordering::Relaxed),
            hashing_ns: self.hashing_ns.load(Ordering::Relaxed),
            maps_kept: self.maps.len() as u64,
            direct_files: self.direct.files.load(Ordering::Relaxed),
            direct_bytes: self.direct.bytes.load(Ordering::Relaxed),
            direct_known: self.direct.known() as u64,
            mpi_stuck_ms: self
                .cut_off
                .load(Ordering::Acquire)
                .then(|| self.comm.pulse.silent().as_millis() as u64),
            files_owned: files,
            bytes_owned: bytes,
            peers: (0..self.ranks)
                .map(|r| PeerStatus {
                    rank: r,
                    alive: self.peers.alive(r),
                    silent_ms: self.peers.silence(r).map(|d| d.as_millis() as u64),
                    numbers: self.peers.last_beat(r),
                })
                .collect(),
        }
    }
}

impl Remote for Node {
    fn fetch(&self, ctx: &Arc<SourceCtx>, idx: u32, slot: u32) -> Option<PlaceOutcome> {
        // The first owner reads the source (so does anyone, for a file nobody owns); a packed
        // file, from its partition.
        if self.own.primary(idx).is_none_or(|p| p == self.rank) {
            return match (ctx.pack.get(), ctx.table.locator(idx)) {
                (Some(st), Some(_)) => {
                    st.adopt(ctx, idx);
                    Some(PlaceOutcome::Skipped)
                }
                // Read by a pool worker (`whole_file::fetch`); with no room for it here, into
                // the staging tier (`Remote::overflow`), so every node asking for it meanwhile
                // gets it from this one read.
                _ => None,
            };
        }
        let me = self.me.upgrade()?;
        ctx.work.hold();
        let job = RemoteFetch {
            ctx: ctx.clone(),
            idx,
            slot,
            copy: false,
            skip: None,
        };
        // A program waits for it: started here (the ring consumer) and carried on by the
        // communication thread, or a fetcher's.
        if fetch::start(&me, job).is_err() {
            ctx.work.release();
            return None;
        }
        Some(PlaceOutcome::Skipped)
    }

    fn overflow<'a>(&self, ctx: &'a SourceCtx, idx: u32, size: u64) -> Option<Reservation<'a>> {
        self.staging_room(ctx, idx, size)
    }

    fn overflowed(&self, _ctx: &SourceCtx, idx: u32) {
        self.staging.push(idx, None);
    }

    fn invalidated(&self, ctx: &SourceCtx, idx: u32) {
        let Some(e) = ctx.table.entry(idx) else {
            return;
        };
        self.direct.forget(idx);
        let gone = ctx.table.state(idx).state() == State::Gone;
        let msg = Msg::Invalidate {
            idx,
            object: e.object,
            gone,
        };
        for r in (0..self.ranks).filter(|&r| r != self.rank) {
            self.comm.ctrl(r, &msg);
        }
    }
}

impl Inbox for Node {
    fn heard(&self, from: u32) {
        if !self.peers.heard(from) {
            if let Some(life) = self.peers.tell_again(from) {
                // It may never have received the `Down` sent to it (`Peers::tell_again`).
                self.comm.quiet(from, &Msg::Down { rank: from, life });
            }
        }
    }

    fn control(&self, from: u32, msg: Msg) {
        match msg {
            Msg::Request {
                tag,
                idx,
                object,
                size,
            } => {
                let req = PeerRequest {
                    from,
                    tag,
                    idx,
                    object,
                    size,
                };
                if !provide::serve_now(self, &req) {
                    let _ = self.provide_q.send(req);
                }
            }
            Msg::Cancel { tag } => {
                self.cancelled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((from, tag));
            }
            Msg::Heartbeat(b) => {
                self.peers.beat(from, b);
            }
            Msg::Back { life, beat } => {
                if self.peers.back(from, life) {
                    tracing::info!("rank {from} is back (its life {life})");
                }
                self.peers.beat(from, beat);
            }
            Msg::Ask => self.comm.quiet(from, &Msg::Heartbeat(self.beat())),
            Msg::Down { rank, life } if rank == self.rank => {
                // Written off by `from` (this rank was stopped, or slow): a new life, told to
                // everyone — or, for a write-off of a life it left already, to `from` again.
                let (life, fresh) = self.peers.new_life(life);
                let back = Msg::Back {
                    life,
                    beat: self.beat(),
                };
                if fresh {
                    tracing::info!(
                        "rank {from} wrote this rank off: telling every rank it is back (life {life})"
                    );
                    for r in (0..self.ranks).filter(|&r| r != self.rank) {
                        self.comm.quiet(r, &back);
                    }
                } else {
                    self.comm.quiet(from, &back);
                }
            }
            Msg::Down { rank, life } => {
                if self.peers.down(rank, life) {
                    tracing::info!("rank {from} wrote rank {rank} off");
                }
            }
            Msg::Invalidate { idx, object, gone } => {
                self.direct.forget(idx);
                let t = &self.ctx.table;
                if t.entry(idx).is_some_and(|e| e.object == object) {
                    self.invalidations.fetch_add(1, Ordering::AcqRel);
                    let how = if gone { Void::Gone } else { Void::Stale };
                    // Not through the ring: that would tell every rank again.
                    if lifecycle::void(&EntryCell { table: t, idx }, how) {
                        tracing::debug!("entry {idx} invalidated by rank {from}");
                        granary_core::placement::peer_copy::drop_void(&self.ctx, idx);
                    }
                }
            }
            Msg::Stop => {
                tracing::info!("rank {from} asked every rank to stop");
                self.agent.stopping.store(true, Ordering::Release);
            }
            Msg::Near { host, pid } => self.direct.learn(from, host, pid),
            Msg::Mapped(v) => self.direct.learn_mapped(from, v),
            // The communication thread's own business.
            Msg::Reply { .. } | Msg::Door { .. } => {}
        }
    }

    fn failed(&self, rank: u32) {
        self.write_off(rank);
    }
}
