//! Placement: copying files from the source into a tier in the background (docs/placement.md).
//!
//! A request (a client opened an unplaced file) moves the entry UNPLACED → QUEUED and becomes a
//! `CopyTask`: a file at least as large as the table's whole-fetch size (`prefetch_min_size`, or
//! less on a source whose readahead makes the program's own reads cost more requests:
//! `whole_file::threshold`) is fetched whole by the agent at once (`whole_file`), a smaller one
//! is copied from the page cache once the program closed it (`page_cache_copy`). A worker moves
//! it QUEUED → PLACING, asks the `Policy` which tiers to try, reserves capacity, copies under a
//! temporary name, renames, and publishes PLACED. Every failure releases what it took and leaves
//! the entry served from the source.
//!
//! - here: one published table as placement holds it (`SourceCtx`), what its children share,
//!   made of handles that functions take one by one: the `Table`, where its copies go
//!   (`space`), the work held for it (`work`); `params`: the engine's parameters;
//! - `requests`: acting on the requests clients push to a table's ring;
//! - `pool`: the worker threads and their queue; `engine`: what every job runs with (the
//!   parameters, the policy, the node-wide cap on source streams);
//! - `whole_file`: the whole-file fetch of a large file (`direct`: in one direct read; `order`:
//!   where it reads while programs map the file; `threshold`: which files are fetched whole);
//! - `page_cache_copy`: the copy of a small file the program read, from the page cache;
//! - `partial`, `chunks`: a file no tier has room for, kept as chunks (the chunk file format);
//! - `pack_streamer`, `unpack`: a packed source's partitions streamed into copies;
//! - `peer_copy`: copies whose bytes come from another node (cluster mode);
//! - `copy`: what those share (claiming, reserving, opening the source, publishing);
//!   `states`: the lifecycle steps that also move tier space;
//! - `policy`, `known_order`: where copies go, and the known-order policy's prefetcher;
//! - `ahead`: files fetched ahead of a program that opens a directory's files in name order;
//! - `residency`: which copies keep their pages in the page cache;
//! - `sweep`: the tiers' object directories kept to what the table names, copies re-hashed;
//! - `mmap`: following programs through their mappings and reading the source ahead of them.

pub mod ahead;
pub mod chunks;
mod copy;
mod engine;
pub mod known_order;
pub mod mmap;
pub mod pack_streamer;
mod page_cache_copy;
mod params;
mod partial;
pub mod peer_copy;
mod policy;
mod pool;
mod requests;
pub mod residency;
mod space;
pub mod states;
pub mod sweep;
mod unpack;
pub mod whole_file;
mod work;

pub use copy::{object_dir, PlaceOutcome};
pub use engine::{Engine, Held, Stream, Streams};
pub use params::{
    Params, DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE, DEFAULT_MAX_SOURCE_STREAMS,
    DEFAULT_PREFETCH_MIN_SIZE, DEFAULT_SMALL_COPY_DELAY,
};
pub use partial::{adopt_charges, copies_now, release_partial_charges, Partials};
pub use peer_copy::Remote;
pub use policy::{
    free_space, most_free, reserve_first, FillHighestFirst, KnownOrder, OrderState, Policy,
};
pub use pool::{default_workers, CopyMethod, CopyTask, Pool};
pub use requests::handle_request;
pub use space::Space;
pub use whole_file::threshold::SourceRequests;
pub use work::Work;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use granary_shm::{Mapping, Table};

use crate::stats::AgentCounters;
use crate::sync::atomic::{fence, AtomicU64, Ordering};
use crate::sync::{statics, Arc, OnceLock, RwLock};
use crate::tiers::Tiers;

/// One published table of one source. Jobs hold it by `Arc`, so a table replaced by a new walk
/// stays mapped until its last job is done.
pub struct SourceCtx {
    pub table: Table,
    /// The source root with symlinks resolved; entries' relative paths are joined to it.
    pub source_real: PathBuf,
    /// Where this table's copies go.
    pub space: Space,
    /// The placement work the agent holds for this table, and whether it is withdrawn.
    pub work: Work,
    pub counters: Arc<AgentCounters>,
    /// Which copies keep their pages in the page cache (shared by every source of the agent).
    pub residency: Arc<residency::Residency>,
    /// Entries in PARTIAL state the agent has touched: their chunk files and chunks in flight.
    pub partials: Partials,
    /// The known-order policy of this table (`[placement] policy = "known-order"`), driven by
    /// `prefetch`; `None`: fill the highest tier first, never evict.
    pub order: Option<Arc<known_order::Prefetcher>>,
    /// Programs' mappings of this source's files, followed and read ahead of.
    pub mmap: mmap::Follower,
    /// Programs reading a directory's files in name order, and the files fetched ahead of them.
    pub ahead: ahead::NameOrder,
    /// The current attach's background validation (`catalog::validate`), which clients point
    /// at the directories they are in (`request::VALIDATE`).
    pub validation: RwLock<Option<Arc<crate::catalog::Validation>>>,
    /// The partition streamer of a table serving a pack (`granary run --pack`), set before any
    /// job has the table.
    pub pack: OnceLock<Arc<pack_streamer::Streamer>>,
    /// Cluster mode: the other nodes of the job, asked before the source is read
    /// (`peer_copy::Remote`); unset on one node.
    pub remote: OnceLock<Arc<dyn Remote>>,
    /// Whether the program's own source reads are moving (`program_busy`).
    program: ProgramReads,
    /// Keeps `table` mapped.
    _mapping: Mapping,
}

impl SourceCtx {
    /// The context of `table` (mapped by `mapping`), its copies going to `tiers`, in the
    /// source's object directory `dirs[t]` of each (`None`: unusable, never placed on).
    pub fn new(
        (mapping, table): (Mapping, Table),
        source_real: PathBuf,
        tiers: Arc<Tiers>,
        dirs: Vec<Option<OwnedFd>>,
        counters: Arc<AgentCounters>,
        residency: Arc<residency::Residency>,
    ) -> SourceCtx {
        let space = Space::new(&table, tiers, dirs);
        SourceCtx {
            table,
            source_real,
            space,
            work: Work::default(),
            counters,
            residency,
            partials: Default::default(),
            order: None,
            mmap: Default::default(),
            ahead: Default::default(),
            validation: Default::default(),
            pack: Default::default(),
            remote: Default::default(),
            program: Default::default(),
            _mapping: mapping,
        }
    }

    /// With the known-order policy's prefetcher (`order`).
    pub fn with_order(mut self, order: Option<Arc<known_order::Prefetcher>>) -> SourceCtx {
        self.order = order;
        self
    }

    /// Withdraws the table from placement: queued jobs are dropped, running ones stop at their
    /// next check, idle partition streamers stop now. The caller then waits for the work held
    /// (`Work::held`) to drain.
    pub fn retire(&self) {
        self.work.retired.store(true, Ordering::Release);
        if let Some(st) = self.pack.get() {
            st.wake_all();
        }
    }

    /// Placement work not finished for this table: requests still in its ring plus work the
    /// agent holds (`Work`). Every entry in QUEUED or PLACING has a job behind it, so
    /// `busy_entries` (their count, if the caller has it) only guards against an entry stranded
    /// in those states. Zero means every request made so far has been decided (PLACED,
    /// SOURCE_ONLY, STALE, or dropped because the table was retired).
    ///
    /// Ordering: the consumer holds work before it pops (with a SeqCst fence between), and a job
    /// holds it before the consumer lets its own go, so reading the ring first and then the work
    /// held (fenced likewise) never misses a request in hand.
    pub fn pending(&self, busy_entries: u64) -> u64 {
        let ring = self.table.ring_backlog();
        fence(Ordering::SeqCst);
        let held = self.work.held() as u64;
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

impl crate::catalog::validate::Subject for SourceCtx {
    fn table(&self) -> &Table {
        &self.table
    }
    fn root(&self) -> &Path {
        &self.source_real
    }
    fn withdrawn(&self) -> bool {
        self.work.is_retired()
    }
}

/// The program's source reads (`job::SOURCE_READS` summed over the table's job slots) as last
/// sampled, and when the sum last changed.
#[derive(Debug, Default)]
struct ProgramReads {
    last: AtomicU64,
    /// `mono_ns()` of the last change (0: never).
    moved_ns: AtomicU64,
    sampled_ns: AtomicU64,
}

/// The program's reads count as "now" for this long after they moved.
pub const BUSY_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Nanoseconds since the first call in this process (never 0).
fn mono_ns() -> u64 {
    static BASE: statics::OnceLock<std::time::Instant> = statics::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}
