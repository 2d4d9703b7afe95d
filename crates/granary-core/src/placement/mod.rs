//! Placement: copying files from the source into a tier in the background (docs/placement.md).
//!
//! A request (a client opened an unplaced file) moves the entry UNPLACED → QUEUED and becomes a
//! `CopyTask`: a file at least as large as the table's whole-fetch size (`prefetch_min_size`, or less
//! on a source whose readahead makes the program's own reads cost more requests: `whole_fetch`)
//! is fetched whole by the agent at once (`fetch`), a smaller one is copied from the page cache
//! once the program closed it (`small`). A worker
//! moves it QUEUED → PLACING, asks the `Policy` which tiers to try, reserves capacity, copies
//! under a temporary name, renames, and publishes PLACED. Every failure releases what it took
//! and leaves the entry served from the source.

pub mod ahead;
pub mod chunks;
mod copy;
mod fetch;
mod fetch_direct;
pub mod fetch_order;
pub mod incoming;
pub mod mapping;
mod partial;
pub mod partition;
mod policy;
mod pool;
pub mod prefetch;
mod requests;
pub mod residency;
mod small;
pub mod states;
mod unpack;
mod whole_fetch;

pub use copy::{object_dir, PlaceOutcome};
pub use fetch::{fetch_large, fetch_onto};
pub use incoming::Remote;
pub use partial::{adopt_charges, copies_now, release_partial_charges, Partials};
pub use policy::{
    free_space, most_free, reserve_first, FillHighestFirst, KnownOrder, OrderState, Policy,
};
pub use pool::{default_workers, CopyMethod, CopyTask, Held, Pool, Shared, Stream, Streams};
pub use requests::handle_request;
pub use small::copy_small;
pub use whole_fetch::SourceRequests;

/// The placement engine's parameters (`[placement]` in the configuration), resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Size of the agent's reads of the source.
    pub block_size: u64,
    /// Source reads in flight at once, node-wide.
    pub max_source_streams: usize,
    /// Files at least this large are fetched whole by the agent from their first open (smaller
    /// ones too on a source with a small readahead: `SourceRequests::whole_fetch_from`);
    /// 0 = never (every file is copied from the page cache after the program read it).
    pub prefetch_min_size: u64,
    /// Chunk size of partial copies (0 = none).
    pub chunk_size: u64,
    /// A small file is copied this long after its open if no CLOSED arrived before.
    pub small_copy_delay: std::time::Duration,
}

impl Default for Params {
    fn default() -> Params {
        use crate::config as c;
        Params {
            block_size: c::DEFAULT_BLOCK_SIZE,
            max_source_streams: c::DEFAULT_MAX_SOURCE_STREAMS,
            prefetch_min_size: c::DEFAULT_PREFETCH_MIN_SIZE,
            chunk_size: c::DEFAULT_CHUNK_SIZE,
            small_copy_delay: c::DEFAULT_SMALL_COPY_DELAY,
        }
    }
}

impl Params {
    /// The configuration's values over the defaults.
    pub fn from_config(cfg: &crate::config::Config) -> Params {
        let d = Params::default();
        Params {
            block_size: cfg.block_size.unwrap_or(d.block_size),
            max_source_streams: cfg.max_source_streams.unwrap_or(d.max_source_streams),
            prefetch_min_size: cfg.prefetch_min_size.unwrap_or(d.prefetch_min_size),
            chunk_size: cfg.chunk_size.unwrap_or(d.chunk_size),
            small_copy_delay: cfg.small_copy_delay.unwrap_or(d.small_copy_delay),
        }
    }

    /// The smallest file the agent fetches whole on the source at `path`, on device
    /// `major:minor` (0: none), for its table's header, where the preload library reads it too.
    /// The device comes from a record the caller has (no call on the source for it).
    pub fn whole_fetch_from(&self, path: &std::path::Path, dev: (u32, u32)) -> u64 {
        let src = SourceRequests::from_sysfs(std::path::Path::new("/sys"), dev.0, dev.1);
        let from = src.whole_fetch_from(self.prefetch_min_size, self.block_size);
        tracing::info!("{}: {}", path.display(), src.describe(from));
        from
    }
}

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The known-order policy of this table (`[placement] policy = "known-order"`), driven by
    /// `prefetch`; `None`: fill the highest tier first, never evict.
    pub order: Option<Arc<prefetch::Prefetcher>>,
    /// Entries in PARTIAL state the agent has touched: their chunk files and chunks in flight.
    pub partials: Partials,
    /// Whether the program's own source reads are moving (`program_busy`).
    pub program: ProgramReads,
    /// Which copies keep their pages in the page cache (shared by every source of the agent).
    pub residency: Arc<residency::Residency>,
    /// Tiers whose object directory is no longer where the table says (removed or renamed
    /// while the agent ran), one bit each: nothing is placed there any more.
    pub lost: std::sync::atomic::AtomicU8,
    /// The current attach's background validation (`catalog::validate`), which clients point
    /// at the directories they are in (`request::VALIDATE`).
    pub validation: std::sync::RwLock<Option<Arc<crate::catalog::Validation>>>,
    /// The partition streamer of a table serving a pack (`granary run --pack`).
    pub pack: std::sync::OnceLock<Arc<partition::Streamer>>,
    /// Programs' mappings of this source's files, followed and read ahead of.
    pub mappings: mapping::Mappings,
    /// Cluster mode: the other nodes of the job, asked before the source is read
    /// (`incoming::Remote`); unset on one node.
    pub remote: std::sync::OnceLock<Arc<dyn Remote>>,
    /// Programs reading a directory's files in name order, and the files fetched ahead of them.
    pub ahead: ahead::NameOrder,
}

/// True if tier `tier`'s object directory is gone from its path (removed, renamed, replaced):
/// clients open copies by that path, so a copy placed in the orphan could never be served.
/// Noticed once (a warning), then remembered in `ctx.lost`.
pub fn tier_lost(ctx: &SourceCtx, tier: usize) -> bool {
    let bit = 1u8 << (tier as u32 & 7);
    if ctx.lost.load(Ordering::Acquire) & bit != 0 {
        return true;
    }
    let recorded = ctx.table.tier_dir_id(tier as u32);
    let path = ctx
        .table
        .tier_dir(tier as u32)
        .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)));
    let here = path
        .as_ref()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| (m.dev(), m.ino()));
    let lost = here.is_none() || here != recorded;
    if lost && ctx.lost.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
        tracing::warn!(
            "tier {tier} ({}) was removed or renamed while in use: no more copies there",
            path.as_deref()
                .unwrap_or(std::path::Path::new("?"))
                .display()
        );
    }
    lost
}

/// The program's source reads (`job::SOURCE_READS` summed over the table's job slots) as last
/// sampled, and when the sum last changed.
#[derive(Debug, Default)]
pub struct ProgramReads {
    last: AtomicU64,
    /// `mono_ns()` of the last change (0: never).
    moved_ns: AtomicU64,
    sampled_ns: AtomicU64,
}

/// The program's reads count as "now" for this long after they moved.
pub const BUSY_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Nanoseconds since the first call in this process (never 0).
fn mono_ns() -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
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
        std::sync::atomic::fence(Ordering::SeqCst);
        let held = self.inflight.load(Ordering::Acquire) as u64;
        ring + held.max(busy_entries)
    }

    /// Samples the program's source reads (at most every 10 ms; the ring consumer calls this on
    /// every pass, so a change is seen within about that long).
    pub fn sample_program_reads(&self) {
        let p = &self.program;
        let now = mono_ns();
        if now.saturating_sub(p.sampled_ns.load(Ordering::Relaxed)) < 10_000_000 {
            return;
        }
        p.sampled_ns.store(now, Ordering::Relaxed);
        let t = &self.table;
        let sum = (0..t.job_slots())
            .filter_map(|s| t.counter(s, granary_shm::job::SOURCE_READS))
            .map(|c| c.load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add);
        if p.last.swap(sum, Ordering::Relaxed) != sum {
            p.moved_ns.store(now, Ordering::Relaxed);
        }
    }

    /// True if the program read the source within the last `BUSY_WINDOW`: placement work that
    /// reads the source and that nobody waits on should back off.
    pub fn program_busy(&self) -> bool {
        self.sample_program_reads();
        let moved = self.program.moved_ns.load(Ordering::Relaxed);
        moved != 0 && mono_ns().saturating_sub(moved) < BUSY_WINDOW.as_nanos() as u64
    }
}
