//! Placement: copying files from the source into a tier in the background.
//!
//! A request (a client opened an unplaced file) moves the entry UNPLACED → QUEUED and becomes a
//! `Job` on the pool's queue; a worker moves it QUEUED → PLACING, asks the `Policy` which tiers to
//! try, reserves capacity, copies under a temporary name, renames, and publishes PLACED. Every
//! failure releases what it took and leaves the entry served from the source.

mod copy;
mod policy;
mod pool;
mod requests;

pub use copy::{object_dir, place, PlaceOutcome};
pub use policy::{FillHighestFirst, Policy};
pub use pool::{default_workers, Job, Pool};
pub use requests::handle_request;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use granary_shm::{Mapping, Table};

use crate::stats::AgentCounters;

/// One published table of one source, as placement sees it. Jobs hold it by `Arc`, so a table
/// replaced by a new walk stays mapped until its last job is done.
pub struct SourceCtx {
    pub table: Table,
    /// Keeps `table` mapped.
    pub mapping: Mapping,
    /// The source root with symlinks resolved; entries' relative paths are joined to it.
    pub source_real: PathBuf,
    /// Tier `t`'s object directory for this source (`None`: unusable, never placed on).
    pub object_dirs: Vec<Option<OwnedFd>>,
    pub counters: Arc<AgentCounters>,
    /// Set when the table is being replaced: queued jobs are dropped.
    pub retired: AtomicBool,
    /// Jobs queued or running for this table.
    pub inflight: AtomicUsize,
}
