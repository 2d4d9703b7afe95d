//! One rank of the serving job as its threads share it (`Node`): its table, ownership, peers,
//! staging tier, the queues of its fetchers (`RemoteFetch`) and providers (`PeerRequest`), and
//! the questions they ask of it (who stands in for a dead owner, whether a copy goes to staging,
//! whether a transfer was cancelled). What runs it — starting the node, heartbeats, MPI
//! messages, placement's hook — is `cluster`'s; `fetch`, `provide` and `serve` take a `Node`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use granary_core::placement::SourceCtx;
use granary_core::Reservation;
use granary_shm::State;

use super::direct::Direct;
use super::maps;
use super::ownership::Ownership;
use super::peers::Peers;
use super::staging::Staging;
use super::transport::{Comm, Tags};
use super::wire::Msg;
use crate::agent::Agent;

/// One rank of the serving job, as the rest of the agent and the other ranks see it.
pub struct Node {
    /// This node's own `Arc` (a transfer the communication thread carries on holds one).
    pub(super) me: std::sync::Weak<Node>,
    pub rank: u32,
    pub ranks: u32,
    pub agent: Arc<Agent>,
    /// The served source's table (the serve's own lease keeps it; it is never replaced).
    pub ctx: Arc<SourceCtx>,
    pub own: Ownership,
    pub peers: Peers,
    pub comm: Comm,
    pub(super) tags: Tags,
    pub staging: Staging,
    /// The staging tier's index in the table (`None`: none configured).
    pub staging_tier: Option<usize>,
    /// How long a rank waits for another's next message.
    pub timeout: Duration,
    pub(super) fetch_q: Sender<RemoteFetch>,
    pub(super) provide_q: Sender<PeerRequest>,
    /// Transfers a requester gave up on (provider side), until the provider sees it.
    pub(super) cancelled: Mutex<HashSet<(u32, i32)>>,
    /// Copies of other ranks' files (replicas, `--replicate`) still to be made.
    pub copies_pending: AtomicU64,
    /// Entries other ranks told this one were changed (written, removed) on the source.
    pub invalidations: AtomicU64,
    /// Bytes of copies that went through a buffer here (sent or received): 0 on the normal
    /// path, where MPI moves them between the two copies' mappings.
    pub bounce: AtomicU64,
    /// Copies received and checksummed: bytes, and the time the checksums took (one thread).
    pub hashed_bytes: AtomicU64,
    pub hashing_ns: AtomicU64,
    /// Mappings of this rank's own copies, kept for sending from.
    pub(super) maps: maps::Maps,
    /// Ranks on this host and their copies' mappings, read directly (`direct`).
    pub(super) direct: Direct,
    pub replicate: Vec<String>,
    pub(super) replicas: u32,
    /// `held`'s last count: when, files, bytes.
    pub(super) held: Mutex<(Option<std::time::Instant>, u64, u64)>,
    /// The communication thread is stuck in MPI (`transport::Pulse`): no peer is counted on.
    pub(super) cut_off: AtomicBool,
}

/// What `Node::new` needs besides the agent and its table.
pub struct Setup {
    pub rank: u32,
    pub ranks: u32,
    pub replicas: u32,
    pub replicate: Vec<String>,
    pub replicate_set: globset::GlobSet,
    pub timeout: Duration,
    /// Read copies of ranks on this host directly (`direct`).
    pub direct: bool,
}

/// A file some other node holds, to copy here over MPI.
pub struct RemoteFetch {
    pub ctx: Arc<SourceCtx>,
    pub idx: u32,
    /// The job slot the copy is credited to (0: nobody's, e.g. a replica copied at start).
    pub slot: u32,
    /// One of the copies made at start (`Node::copy_others`): counted down when done.
    pub copy: bool,
    /// An owner not to ask again (it holds no copy, or sent a bad one).
    pub skip: Option<u32>,
}

/// A peer's request for a copy this node holds, queued for the provider threads.
pub struct PeerRequest {
    pub from: u32,
    pub tag: i32,
    pub idx: u32,
    pub object: u64,
    pub size: u64,
}

impl Node {
    /// True if `idx` is a packed file this rank reads from the pack itself.
    pub(super) fn streams(&self, ctx: &SourceCtx, idx: u32) -> bool {
        ctx.table.locator(idx).is_some() && ctx.pack.get().is_some_and(|st| st.streams(idx))
    }

    /// `rank` did not deliver in time: written off here, and every other rank told.
    pub fn write_off(&self, rank: u32) {
        if self.peers.failed(rank) {
            self.tell_down(rank);
        }
    }

    pub(super) fn tell_down(&self, rank: u32) {
        let down = Msg::Down {
            rank,
            life: self.peers.life(rank),
        };
        for r in (0..self.ranks).filter(|&r| r != self.rank && r != rank) {
            self.comm.quiet(r, &down);
        }
        // It may only be stopped: when it continues, it learns it was written off and
        // announces a new life.
        self.comm.quiet(rank, &down);
    }

    /// Who reads `idx` from the source and serves it while every rank holding it is written
    /// off (dead, or stopped): the first live rank after its first owner on the ring, so a
    /// dead rank's files are read from the source once for the job, not once per node that
    /// wants them. `None` while an owner is alive (or nobody holds the file).
    pub fn stand_in(&self, idx: u32) -> Option<u32> {
        let owners = self.own.owners(idx);
        let first = *owners.first()?;
        if owners.iter().any(|&r| self.peers.alive(r)) {
            return None;
        }
        (1..self.ranks)
            .map(|k| (first + k) % self.ranks)
            .find(|&r| self.peers.alive(r))
    }

    /// Room on the staging tier for a copy of `idx` read from the source here (`size` bytes),
    /// reserved, when this node's own tiers have none for it (the dataset is larger than the
    /// nodes' tiers together; `Remote::overflow`). There it is served like any copy until the
    /// staging tier drops it (oldest first), so the nodes that ask for it meanwhile — in a job
    /// whose nodes read the same files at about the same time — get it from one source read
    /// instead of each reading the source. The room is held from the decision on: a copy that
    /// found none on the own tiers never finds the staging tier taken in between and gives
    /// the file up (every node would then read it from the source).
    pub fn staging_room<'a>(
        &self,
        ctx: &'a SourceCtx,
        idx: u32,
        size: u64,
    ) -> Option<Reservation<'a>> {
        let st = self.staging_tier?;
        ctx.table.entry(idx).filter(|e| e.stat.is_file())?;
        self.staging.room(ctx, st, size)
    }

    /// Provider side: was the transfer `(from, tag)` cancelled? `forget` clears the mark.
    pub(super) fn cancelled(&self, from: u32, tag: i32, keep: bool) -> bool {
        let mut c = self.cancelled.lock().unwrap_or_else(|e| e.into_inner());
        if keep {
            c.contains(&(from, tag))
        } else {
            c.remove(&(from, tag))
        }
    }
}

/// This rank's share of the dataset and how much of it is here, from local numbers only.
pub(crate) struct Share {
    pub files_owned: u64,
    pub bytes_owned: u64,
    pub files_held: u64,
    pub bytes_held: u64,
    /// Copies of other ranks' files (replicas, `--replicate`) still to make.
    pub copies_pending: u64,
    /// Bytes this rank's agent read from the source.
    pub pfs_bytes: u64,
}

impl Node {
    /// Where this rank stands in holding its share (no other rank is asked): one pass over
    /// the table.
    pub(crate) fn share(&self) -> Share {
        let t = &self.ctx.table;
        let mut s = Share {
            files_owned: 0,
            bytes_owned: 0,
            files_held: 0,
            bytes_held: 0,
            copies_pending: self.copies_pending.load(Ordering::Acquire),
            pfs_bytes: self.ctx.counters.snapshot().agent_source_bytes,
        };
        for i in 0..t.entry_count() {
            if !self.own.holds(self.rank, i) {
                continue;
            }
            let size = t.entry(i).map_or(0, |e| e.stat.size);
            s.files_owned += 1;
            s.bytes_owned += size;
            let w = t.state(i);
            let staged = Some(w.tier() as usize) == self.staging_tier;
            if w.state() == State::Placed && !staged {
                s.files_held += 1;
                s.bytes_held += size;
            }
        }
        s
    }

    /// Files and bytes this rank holds of the dataset as dealt out (first owner or replica).
    pub(super) fn owned(&self) -> (u64, u64) {
        let t = &self.ctx.table;
        let (mut files, mut bytes) = (0, 0);
        for i in 0..t.entry_count() {
            if self.own.holds(self.rank, i) {
                files += 1;
                bytes += t.entry(i).map_or(0, |e| e.stat.size);
            }
        }
        (files, bytes)
    }
}
