//! Placement: copying files from the source into a tier in the background.
//!
//! A request (a client opened an unplaced file) moves the entry UNPLACED → QUEUED and becomes a
//! `Job` on the pool's queue; a worker moves it QUEUED → PLACING, asks the `Policy` which tiers to
//! try, reserves capacity, copies under a temporary name, renames, and publishes PLACED. Every
//! failure releases what it took and leaves the entry served from the source.

pub mod chunks;
mod copy;
mod policy;
mod pool;
mod requests;
pub mod states;

pub use copy::{object_dir, place, PlaceOutcome};
pub use policy::{free_space, most_free, reserve_first, FillHighestFirst, KnownOrder, OrderState, Policy};
pub use pool::{default_workers, Job, Pool};
pub use requests::handle_request;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use granary_shm::{Mapping, Table};

use crate::stats::AgentCounters;
use crate::tiers::Tiers;

/// One published table of one source, as placement sees it. Jobs hold it by `Arc`, so a table
/// replaced by a new walk stays mapped until its last job is done.
pub struct SourceCtx {
    pub table: Table,
    /// Keeps `table` mapped.
    pub mapping: Mapping,
    /// The source root with symlinks resolved; entries' relative paths are joined to it.
    pub source_real: PathBuf,
    /// The tiers this table was published with (its `SLOT_TIER0 + t`); placement reserves on
    /// them, so one pool serves sources with different tiers.
    pub tiers: Arc<Tiers>,
    /// Tier `t`'s object directory for this source (`None`: unusable, never placed on).
    pub object_dirs: Vec<Option<OwnedFd>>,
    pub counters: Arc<AgentCounters>,
    /// Set when the table is being replaced: queued jobs are dropped.
    pub retired: AtomicBool,
    /// Placement work the agent holds for this table: jobs queued or running in the pool, plus
    /// a request the ring consumer has popped and not yet handed on (see `pending`).
    pub inflight: AtomicUsize,
}

impl SourceCtx {
    /// Placement work not finished for this table: requests still in its ring plus work the
    /// agent holds (`inflight`). Every entry in QUEUED or PLACING has a job behind it, so
    /// `busy_entries` (their count, if the caller has it) only guards against an entry stranded
    /// in those states. Zero means every request made so far has been decided (PLACED,
    /// SOURCE_ONLY, STALE, or dropped because the table was retired).
    ///
    /// Ordering: the consumer raises `inflight` before it pops (with a SeqCst fence between), and
    /// a job raises it before the consumer lowers its own, so reading the ring first and then
    /// `inflight` (fenced likewise) never misses a request in hand.
    pub fn pending(&self, busy_entries: u64) -> u64 {
        let ring = self.table.ring_backlog();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let held = self.inflight.load(std::sync::atomic::Ordering::Acquire) as u64;
        ring + held.max(busy_entries)
    }
}
