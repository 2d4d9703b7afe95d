//! One published table of one source as placement sees it (`SourceCtx`), made of the handles its
//! users take one by one: the table itself, where its copies go (`Space`), the placement work
//! held for it (`Work`), and the per-source helpers that follow programs.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use granary_shm::{Mapping, Table};

use super::{ahead, known_order, mmap, pack_streamer, residency, Partials, Remote};
use crate::stats::AgentCounters;
use crate::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{statics, Arc, OnceLock, RwLock};
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

/// Where a table's copies go: the tiers it was published with (its `SLOT_TIER0 + t`; placement
/// reserves on them, so one pool serves sources with different tiers) and this source's object
/// directory in each.
pub struct Space {
    pub tiers: Arc<Tiers>,
    /// Tier `t`'s object directory for this source (`None`: unusable, never placed on).
    dirs: Vec<Option<OwnedFd>>,
    /// Per tier, the object directory as the table records it: clients open copies by its path.
    recorded: Vec<RecordedDir>,
    /// Tiers whose object directory is no longer where the table says (removed or renamed
    /// while the agent ran), one bit each: nothing is placed there any more.
    lost: AtomicU8,
}

impl Space {
    fn new(table: &Table, tiers: Arc<Tiers>, dirs: Vec<Option<OwnedFd>>) -> Space {
        let recorded = (0..dirs.len() as u32)
            .map(|t| {
                let path = table
                    .tier_dir(t)
                    .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)));
                RecordedDir {
                    path,
                    id: table.tier_dir_id(t),
                }
            })
            .collect();
        Space {
            tiers,
            dirs,
            recorded,
            lost: AtomicU8::new(0),
        }
    }

    /// Tier `tier`'s object directory (`None`: unusable, never placed on).
    pub fn dir(&self, tier: usize) -> Option<&OwnedFd> {
        self.dirs.get(tier)?.as_ref()
    }

    /// The object directories, tier by tier (`None`: unusable).
    pub fn dirs(&self) -> &[Option<OwnedFd>] {
        &self.dirs
    }

    /// True if tier `tier`'s object directory is gone from its path (removed, renamed,
    /// replaced): clients open copies by that path, so a copy placed in the orphan could never
    /// be served. Noticed once (a warning), then remembered.
    pub fn is_lost(&self, tier: usize) -> bool {
        let bit = 1u8 << (tier as u32 & 7);
        if self.lost.load(Ordering::Acquire) & bit != 0 {
            return true;
        }
        let rec = self.recorded.get(tier);
        let path = rec.and_then(|r| r.path.as_deref());
        let here = path
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .map(|m| (m.dev(), m.ino()));
        let lost = here.is_none() || here != rec.and_then(|r| r.id);
        if lost && self.lost.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            tracing::warn!(
                "tier {tier} ({}) was removed or renamed while in use: no more copies there",
                path.unwrap_or(Path::new("?")).display()
            );
        }
        lost
    }

    /// The first of the policy's tiers with room for `size` (reserved), in the policy's order.
    pub fn reserve_on(&self, tiers_order: &[usize], size: u64) -> Option<Reservation<'_>> {
        tiers_order.iter().find_map(|&t| {
            (self.dir(t).is_some() && !self.is_lost(t))
                .then(|| self.tiers.reserve(t, size))
                .flatten()
        })
    }

    /// A reservation on a tier after `failed` in the policy's order.
    pub fn reserve_after(
        &self,
        order: &[usize],
        failed: usize,
        size: u64,
    ) -> Option<Reservation<'_>> {
        let at = order.iter().position(|&t| t == failed)?;
        self.reserve_on(&order[at + 1..], size)
    }

    /// A write to `tier` failed: ENOSPC/EDQUOT/EIO mean the tier cannot take more now,
    /// whatever the accounting says (a tier configured larger than its file system, a failing
    /// disk).
    pub fn tier_failed(&self, tier: usize, err: &std::io::Error) {
        let full = matches!(
            err.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EIO) | Some(libc::EFBIG)
        );
        if full && self.tiers.mark_full(tier) {
            tracing::warn!(
                "tier {} ({}): {err}; no new copies there until space is freed",
                tier,
                self.tiers.spec(tier).path.display()
            );
        } else {
            tracing::debug!("placement: writing tier {tier} failed: {err}");
        }
    }
}

/// A tier's object directory as the table records it.
struct RecordedDir {
    path: Option<PathBuf>,
    /// Device and inode.
    id: Option<(u64, u64)>,
}

/// The placement work the agent holds for one table — jobs queued or running in the pool, a
/// request the ring consumer has popped and not yet handed on, a streamer's or a fetcher's file
/// — and whether the table is withdrawn from placement (`SourceCtx::retire`).
#[derive(Debug, Default)]
pub struct Work {
    retired: AtomicBool,
    held: AtomicUsize,
}

impl Work {
    /// True once the table is withdrawn: queued work is dropped, running work stops.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// One more piece of work held.
    pub fn hold(&self) {
        self.held.fetch_add(1, Ordering::AcqRel);
    }

    /// A piece of work done or dropped.
    pub fn release(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }

    /// Work held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
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
