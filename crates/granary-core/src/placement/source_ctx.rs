//! One published table as placement holds it (`SourceCtx`): the handles functions take one by
//! one (the `Table`, where its copies go, the work held for it) and the state of each helper
//! that works on it, which knows nothing of `SourceCtx` itself; and cluster mode's hook into
//! placement (`Remote`), which takes it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use granary_shm::{Mapping, Table};

use super::ahead::name_order::NameOrder;
use super::known_order::prefetcher::Prefetcher;
use super::mmap::follower::Follower;
use super::outcome::PlaceOutcome;
use super::pack_streamer::streamer::Streamer;
use super::partial::partials::Partials;
use super::residency::Residency;
use super::space::Space;
use super::work::Work;
use crate::stats::AgentCounters;
use crate::sync::atomic::{fence, AtomicU64, Ordering};
use crate::sync::{Arc, OnceLock, RwLock};
use crate::tiers::{Reservation, Tiers};

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
    pub residency: Arc<Residency>,
    /// Entries in PARTIAL state the agent has touched: their chunk files and chunks in flight.
    pub partials: Partials,
    /// The known-order policy of this table (`[placement] policy = "known-order"`), driven by
    /// `prefetch`; `None`: fill the highest tier first, never evict.
    pub order: Option<Arc<Prefetcher>>,
    /// Programs' mappings of this source's files, followed and read ahead of.
    pub mmap: Follower,
    /// Programs reading a directory's files in name order, and the files fetched ahead of them.
    pub ahead: NameOrder,
    /// Small files' close requests left to the idle-class workers and not taken yet
    /// (`requests::handle_request`, `CopyMethod::Closed`).
    pub closed_waiting: EntryBits,
    /// The current attach's background validation (`catalog::validate`), which clients point
    /// at the directories they are in (`request::VALIDATE`).
    pub validation: RwLock<Option<Arc<crate::catalog::Validation>>>,
    /// The partition streamer of a table serving a pack (`granary run --pack`), set before any
    /// job has the table.
    pub pack: OnceLock<Arc<Streamer>>,
    /// Cluster mode: the other nodes of the job, asked before the source is read
    /// (`Remote`); unset on one node.
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
        residency: Arc<Residency>,
    ) -> SourceCtx {
        let space = Space::new(&table, tiers, dirs);
        let closed_waiting = EntryBits::new(table.entry_count());
        let ctx = SourceCtx {
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
            closed_waiting,
            validation: Default::default(),
            pack: Default::default(),
            remote: Default::default(),
            program: Default::default(),
            _mapping: mapping,
        };
        // Here, before any request: the whole table is looked at once, not by the ring consumer.
        ctx.ahead.may_fetch(&ctx.table);
        ctx
    }

    /// With the known-order policy's prefetcher (`order`).
    pub fn with_order(mut self, order: Option<Arc<Prefetcher>>) -> SourceCtx {
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
    ///
    /// Zero also writes the journal of copies (`Work::journal`): every copy published so far
    /// is in it before anyone is told nothing is pending.
    pub fn pending(&self, busy_entries: u64) -> u64 {
        let ring = self.table.ring_backlog();
        fence(Ordering::SeqCst);
        let held = self.work.held() as u64;
        let pending = ring + held.max(busy_entries);
        if pending == 0 {
            if let Some(j) = self.work.journal.get() {
                j.flush();
            }
        }
        pending
    }

    /// Samples the program's source reads (at most every 10 ms; the ring consumer calls this on
    /// every pass, so a change is seen within about that long).
    pub fn sample_program_reads(&self) {
        let p = &self.program;
        let now = super::clock::mono_ns();
        if now.saturating_sub(p.sampled_ns.load(Ordering::Relaxed)) < 10_000_000 {
            return;
        }
        p.sampled_ns.store(now, Ordering::Relaxed);
        let t = &self.table;
        let sum = (0..t.job_slots())
            .map(|s| t.job_value(s, granary_shm::job::SOURCE_READS))
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
        moved != 0 && super::clock::mono_ns().saturating_sub(moved) < BUSY_WINDOW.as_nanos() as u64
    }
}

/// One bit per entry of a table, set and cleared atomically.
pub struct EntryBits(Box<[AtomicU64]>);

impl EntryBits {
    pub fn new(entries: u32) -> EntryBits {
        EntryBits(
            (0..(entries as usize).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        )
    }

    /// Sets entry `idx`'s bit; true if it was clear (false for an entry out of range).
    pub fn set(&self, idx: u32) -> bool {
        let bit = 1u64 << (idx % 64);
        // A load first: most calls find the bit set (a file read again before it was taken).
        self.0.get(idx as usize / 64).is_some_and(|w| {
            w.load(Ordering::Acquire) & bit == 0 && w.fetch_or(bit, Ordering::AcqRel) & bit == 0
        })
    }

    pub fn clear(&self, idx: u32) {
        if let Some(w) = self.0.get(idx as usize / 64) {
            w.fetch_and(!(1u64 << (idx % 64)), Ordering::AcqRel);
        }
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

/// Cluster mode's hook into placement (one per table, `SourceCtx::remote`).
pub trait Remote: Send + Sync {
    /// A worker took a fetch of entry `idx` (QUEUED), asked for by job slot `slot` (or the ring
    /// consumer, for a packed file this node does not stream). `None`: read the source as on
    /// one node (a file this node owns, or nobody else can serve).
    /// `Some(outcome)`: handled — placed from a peer, decided, or handed to another thread
    /// (`Skipped`), which then holds its own piece of `ctx.work` until it is done.
    fn fetch(&self, ctx: &Arc<SourceCtx>, idx: u32, slot: u32) -> Option<PlaceOutcome>;

    /// A client voided entry `idx` on this node (it wrote, renamed or removed it, or found it
    /// changed): every other node must stop serving it too.
    fn invalidated(&self, ctx: &SourceCtx, idx: u32);

    /// A whole-file fetch of entry `idx` (`size` bytes, the caller holds it: PLACING) found no
    /// room on the policy's tiers: room elsewhere, reserved — held, so no other copy can take
    /// it before this one is written (cluster mode: the staging tier, its oldest copies
    /// dropped to make it) —, or `None` (the fetch goes on as on one node: chunks, or the
    /// source).
    fn overflow<'a>(&self, ctx: &'a SourceCtx, idx: u32, size: u64) -> Option<Reservation<'a>> {
        let _ = (ctx, idx, size);
        None
    }

    /// The copy of `idx` was placed on the room `overflow` gave.
    fn overflowed(&self, ctx: &SourceCtx, idx: u32) {
        let _ = (ctx, idx);
    }
}

/// The program's source reads (`job::SOURCE_READS` summed over the table's job slots) as last
/// sampled, and when the sum last changed.
#[derive(Debug, Default)]
struct ProgramReads {
    last: AtomicU64,
    /// `super::clock::mono_ns()` of the last change (0: never).
    moved_ns: AtomicU64,
    sampled_ns: AtomicU64,
}

/// The program's reads count as "now" for this long after they moved.
pub const BUSY_WINDOW: std::time::Duration = std::time::Duration::from_millis(100);
