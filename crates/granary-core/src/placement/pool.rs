//! The placement pool: worker threads, a priority queue, and small-file copies held back until
//! the program closed the file. The workers run each task with the `Engine` (the node-wide cap
//! on source streams, the parameters, the policy).
//!
//! Copies of small files the program has read (`CopyMethod::Small`) are what epoch 1 of a
//! small-file dataset costs the node's CPU, and nobody waits for one: they run on workers of
//! their own in the `SCHED_IDLE` class (`sys::sched_idle`), which take a core only when
//! the program leaves one free. The other workers, at the program's priority, take everything
//! else — fetches a program waits on first. Measured on 2 cores: docs/benchmarks.md, "A placed
//! open as cheap as a direct one".

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::params::Params;
use super::policy::Policy;
use super::source_ctx::SourceCtx;
use crate::sync::thread::{self, JoinHandle};
use crate::sync::{lock, Arc, Condvar, Mutex};

/// How a copy task copies its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// Whole-file fetch of a large file by the agent (`whole_file::fetch`): a program may be
    /// waiting on its progress, so it goes first.
    Fetch,
    /// Copy of a small file the program has read, from the page cache (`page_cache_copy::copy_small`):
    /// nobody waits for it. `closed`: the program closed the file (CLOSED), so once the copy
    /// holds its bytes the source's pages can go.
    Small { closed: bool },
    /// Chunks of a PARTIAL file (`partial::chunk_job`) from chunk `first`: `requested` = a
    /// client's read missed it (CHUNK; it goes first), else a sequential prefetch from `first`
    /// while capacity allows.
    Chunk { first: u32, requested: bool },
    /// Whole-file fetch of a file a program reading its directory in name order is about to
    /// open (`ahead`): after the fetches programs wait on, before small copies.
    Ahead,
    /// A small file's close request (CLOSED) the ring consumer handed on without looking at it
    /// (`requests::handle_request`): an idle-class worker decides it as the consumer would
    /// have (`claim_closed`), then copies the file (`Small { closed: true }`).
    Closed,
}

pub struct CopyTask {
    pub ctx: Arc<SourceCtx>,
    pub entry: u32,
    pub method: CopyMethod,
    /// The job slot of the client whose request this is (0: nobody's), credited with the copy.
    pub slot: u32,
}

#[derive(Default)]
struct Queue {
    high: VecDeque<CopyTask>,
    /// Name-order read-ahead (`CopyMethod::Ahead`), in the order the program will want it.
    ahead: VecDeque<CopyTask>,
    low: VecDeque<CopyTask>,
    /// Small copies (`CopyMethod::Small`): only the idle-class workers take them.
    small: VecDeque<CopyTask>,
    closed: bool,
}

/// Shared by the workers, the timer and the submitters.
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Wakes the idle-class workers (small copies).
    small_ready: Condvar,
    /// How many idle-class workers there are.
    idle_workers: usize,
    /// Small files opened and not yet closed: copied when CLOSED arrives (`promote`) or when the
    /// deadline passes. Keyed by (table, entry).
    delayed: Mutex<HashMap<(usize, u32), (Instant, CopyTask)>>,
    engine: Arc<Engine>,
}

/// A fixed pool of placement workers shared by every source (each job's `SourceCtx` carries the
/// tiers it places on). Requests are deduplicated by the entry's state word (only
/// UNPLACED → QUEUED enqueues), so the queues hold each file once.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// Workers when the configuration does not say: the copies are I/O-bound, so one per core, at
/// least 2, capped (source streams are capped separately by `max_source_streams`). As many
/// idle-class workers again take the small copies.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

/// The idle-class workers' read size: a small copy (of a file below the whole-fetch size) loops
/// over its file in pieces this large, so these buffers add little to the pool's memory.
const SMALL_BLOCK: u64 = 256 << 10;

fn key(job: &CopyTask) -> (usize, u32) {
    (Arc::as_ptr(&job.ctx) as usize, job.entry)
}

impl Pool {
    pub fn new(workers: usize, policy: Arc<dyn Policy>, params: Params) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            ready: Condvar::new(),
            small_ready: Condvar::new(),
            idle_workers: workers.max(1),
            delayed: Mutex::default(),
            engine: Arc::new(Engine::new(policy, params)),
        });
        let mut handles = (0..workers.max(1))
            .map(|i| {
                let sh = shared.clone();
                thread::Builder::new()
                    .name(format!("place-{i}"))
                    .spawn(move || worker(&sh, Class::Program))
            })
            .chain((0..workers.max(1)).map(|i| {
                let sh = shared.clone();
                thread::Builder::new()
                    .name(format!("place-idle-{i}"))
                    .spawn(move || worker(&sh, Class::Idle))
            }))
            .collect::<std::io::Result<Vec<_>>>()?;
        let sh = shared.clone();
        handles.push(
            thread::Builder::new()
                .name("place-timer".into())
                .spawn(move || timer(&sh))?,
        );
        Ok(Pool {
            shared,
            workers: handles,
        })
    }

    pub fn params(&self) -> &Params {
        &self.shared.engine.params
    }

    /// What the pool's workers run their tasks with: for placement work started elsewhere
    /// (partition streamers, the known-order prefetcher, cluster-mode fetches).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.shared.engine
    }

    /// Queues a job now: fetches before small copies.
    pub fn submit(&self, job: CopyTask) {
        job.ctx.work.hold();
        enqueue(&self.shared, job);
    }

    /// Queues a small copy for later: `promote` (the program closed the file) or the deadline
    /// (`small_copy_delay`; no close came, e.g. the program keeps it open) releases it.
    pub fn submit_delayed(&self, job: CopyTask) {
        job.ctx.work.hold();
        let at = Instant::now() + self.shared.engine.params.small_copy_delay;
        let k = key(&job);
        if let Some((_, old)) = lock(&self.shared.delayed).insert(k, (at, job)) {
            // Cannot happen (one QUEUED per entry), but never strand a count.
            old.ctx.work.release();
        }
    }

    /// The program closed `entry`: its pages are hot, copy it now. False if it was not waiting.
    pub fn promote(&self, ctx: &Arc<SourceCtx>, entry: u32) -> bool {
        promote(&self.shared, ctx, entry)
    }

    /// Lets queued jobs finish (retired tables drop theirs quickly) and joins the workers.
    pub fn shutdown(mut self) {
        let delayed: Vec<_> = lock(&self.shared.delayed).drain().collect();
        for (_, (_, job)) in delayed {
            enqueue(&self.shared, job);
        }
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
        self.shared.small_ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn promote(sh: &Shared, ctx: &Arc<SourceCtx>, entry: u32) -> bool {
    let k = (Arc::as_ptr(ctx) as usize, entry);
    let job = lock(&sh.delayed).remove(&k);
    match job {
        Some((_, mut job)) => {
            job.method = CopyMethod::Small { closed: true };
            enqueue(sh, job);
            true
        }
        None => false,
    }
}

/// A close request handed on by the ring consumer (`CopyMethod::Closed`), decided as the
/// consumer decides a CLOSED (`requests::handle_request`): true if this worker now holds the
/// file's claim (QUEUED) and copies it.
fn claim_closed(sh: &Shared, job: &CopyTask) -> bool {
    use granary_shm::lifecycle::{self, EntryCell};
    let (ctx, idx) = (&job.ctx, job.entry);
    // From here on, another close of the file is handed on again.
    ctx.closed_waiting.clear(idx);
    let t = &ctx.table;
    if ctx.work.is_retired() {
        return false;
    }
    if t.state(idx).state() == granary_shm::State::Queued {
        // Its open asked for it (the table reported opens then): the delayed copy goes now.
        promote(sh, ctx, idx);
        return false;
    }
    t.entry(idx).is_some_and(|e| {
        e.stat.is_file()
            && e.stat.size < t.prefetch_min_size()
            && lifecycle::claim(&EntryCell { table: t, idx })
    })
}

fn enqueue(sh: &Shared, job: CopyTask) {
    let mut q = lock(&sh.queue);
    match job.method {
        CopyMethod::Fetch
        | CopyMethod::Chunk {
            requested: true, ..
        } => q.high.push_back(job),
        CopyMethod::Ahead => q.ahead.push_back(job),
        CopyMethod::Small { .. } | CopyMethod::Closed => {
            // A wake-up is a system call of the ring consumer's per copy: only while fewer are
            // queued than there are idle-class workers. A worker sleeps only on an empty queue,
            // and the push that ended it being empty woke one, which drains it before it sleeps.
            let wake = q.small.len() < sh.idle_workers;
            q.small.push_back(job);
            drop(q);
            if wake {
                sh.small_ready.notify_one();
            }
            return;
        }
        CopyMethod::Chunk { .. } => q.low.push_back(job),
    }
    drop(q);
    sh.ready.notify_one();
}

/// Which work a worker takes, and at what priority.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The program's priority: fetches, read-ahead, chunks.
    Program,
    /// `SCHED_IDLE`: small copies only.
    Idle,
}

fn worker(sh: &Shared, class: Class) {
    // With slack for an aligned block inside (`buffers::aligned`: page-aligned, huge-page backed
    // where it can be, so large reads and tier writes move whole pages).
    let engine = &*sh.engine;
    let block = match class {
        Class::Program => engine.params.block_size,
        Class::Idle => engine.params.block_size.min(SMALL_BLOCK),
    };
    let mut buf = super::buffers::worker_buffer(block);
    // One-way for an unprivileged thread (the kernel lets it back only within `RLIMIT_NICE`),
    // hence threads of their own. Not under Shuttle, which runs a test's threads on one.
    if class == Class::Idle && !cfg!(feature = "shuttle") {
        crate::sys::sched_idle();
    }
    let ready = match class {
        Class::Program => &sh.ready,
        Class::Idle => &sh.small_ready,
    };
    let mut cores = (class == Class::Idle && !cfg!(feature = "shuttle")).then(FreeCores::new);
    loop {
        // `behind`: small copies still queued after this one.
        let (job, behind) = {
            let mut q = lock(&sh.queue);
            loop {
                let next = match class {
                    Class::Program => q
                        .high
                        .pop_front()
                        .or_else(|| q.ahead.pop_front())
                        .or_else(|| q.low.pop_front()),
                    Class::Idle => q.small.pop_front(),
                };
                if let Some(j) = next {
                    break (j, q.small.len());
                }
                if q.closed {
                    return;
                }
                // Idle: give the buffer's pages back (the allocation stays, so nothing is
                // reallocated or zeroed eagerly). The agent runs in the job's memory cgroup,
                // where every resident MiB it keeps is page cache the program lacks.
                crate::sys::release_pages(&mut buf);
                q = ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let mut job = job;
        if job.method == CopyMethod::Closed {
            if !claim_closed(sh, &job) {
                job.ctx.work.release();
                continue;
            }
            job.method = CopyMethod::Small { closed: true };
        }
        // (A retired table's copies end at once: nothing to wait for.)
        let charged = match cores.as_mut().filter(|_| !job.ctx.work.is_retired()) {
            Some(c) => c.wait_for_one(behind).then(crate::sys::thread_cpu_time),
            None => None,
        };
        let out = match job.method {
            // Cluster mode: another node may hold the file (`source_ctx::Remote`).
            CopyMethod::Fetch | CopyMethod::Ahead => match job.ctx.remote.get() {
                Some(r) => match r.fetch(&job.ctx, job.entry, job.slot) {
                    Some(out) => out,
                    None => super::whole_file::fetch(&job.ctx, job.entry, engine, &mut buf),
                },
                None => super::whole_file::fetch(&job.ctx, job.entry, engine, &mut buf),
            },
            CopyMethod::Small { closed } => {
                super::page_cache_copy::copy_small(&job.ctx, job.entry, engine, &mut buf, closed)
            }
            // Made a small copy above.
            CopyMethod::Closed => super::outcome::PlaceOutcome::Skipped,
            CopyMethod::Chunk { first, requested } => super::partial::chunk_job(
                &job.ctx,
                job.entry,
                engine,
                first as u64,
                requested,
                &mut buf,
            ),
        };
        tracing::trace!(
            "placement of entry {} ({:?}): {out:?}",
            job.entry,
            job.method
        );
        if let super::outcome::PlaceOutcome::Placed { tier, bytes } = out {
            job.ctx
                .counters
                .credit_placement(&job.ctx.table, job.slot, tier, bytes);
            if job.method == CopyMethod::Ahead {
                crate::stats::AgentCounters::add(&job.ctx.counters.read_ahead, 1);
            }
        }
        if let (Some(c), Some(before)) = (cores.as_mut(), charged) {
            c.charge(crate::sys::thread_cpu_time().saturating_sub(before));
        }
        job.ctx.work.release();
    }
}

/// `SCHED_IDLE` alone does not keep the small copies off the cores a program wants: during a
/// reader's first pass over 100,000 1 KiB files on the 2-core machine (Linux 6.18), two fork
/// workers reading flat out, the two idle-class workers took 11–15 % of the machine's CPU
/// (docs/benchmarks.md, "A placed open as cheap as a direct one"). So before each small copy an
/// idle-class worker looks at how many tasks are runnable on the node (`/proc/loadavg`, one
/// `pread`): it copies if they are no more than the cores (itself and the other workers
/// copying included). Otherwise it copies on its `Share` of a core, paid in the copies' own
/// CPU time, while fewer than `SHARE_BACKLOG` small copies wait: a node whose cores stay busy
/// (a loader decoding on every core, other jobs) still has the files of a program reading at
/// the source's pace placed as they are read, while their pages are cached — without it they
/// were placed at the floor's pace, and later epochs read the source again (docs/benchmarks.md,
/// "Later epochs on a busy node"). A longer queue means a program reading faster than the
/// shares follow, cached files on busy cores: its copies wait for a free core. Past the share
/// a worker sleeps, from `BACKOFF_MIN` doubling to `BACKOFF_MAX`, and copies one file anyway
/// after `FLOOR` of waiting.
struct FreeCores {
    loadavg: Option<std::fs::File>,
    cpus: usize,
    buf: [u8; 128],
    share: Share,
    at: Instant,
}

/// The runnable tasks of a `/proc/loadavg` line: the R of its fourth field, "R/T".
fn runnable_of(loadavg: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let (r, _) = text.split_ascii_whitespace().nth(3)?.split_once('/')?;
    r.parse().ok()
}

const BACKOFF_MIN: Duration = Duration::from_millis(2);
const BACKOFF_MAX: Duration = Duration::from_millis(16);
const FLOOR: Duration = Duration::from_millis(50);
/// Each idle-class worker's share of a core while none is free, in thousandths.
const SHARE: u64 = 10;
/// Queued small copies past which the share is not spent (`FreeCores::wait_for_one`): several
/// seconds of the shares' copies (a 1 KiB copy took 64–78 µs of a worker's CPU).
const SHARE_BACKLOG: usize = 1024;
/// The most a worker saves of its share while it does not copy: about ten small copies, so
/// the copies that follow a quiet spell come at the share's pace, not in a burst.
const CREDIT_MAX: Duration = Duration::from_millis(1);

/// CPU time a worker may spend on copies while no core is free: earned at `SHARE` of the time
/// passing, at most `CREDIT_MAX`, spent by each such copy's own CPU time (it may go below
/// zero: the next copy waits until the debt is earned back).
struct Share {
    /// Nanoseconds.
    credit: i64,
}

impl Share {
    fn earn(&mut self, passed: Duration) {
        let ns =
            (u64::try_from(passed.as_nanos()).unwrap_or(u64::MAX) / 1000).saturating_mul(SHARE);
        let max = CREDIT_MAX.as_nanos() as i64;
        self.credit = self
            .credit
            .saturating_add(i64::try_from(ns).unwrap_or(i64::MAX))
            .min(max);
    }

    fn spend(&mut self, cpu: Duration) {
        let ns = i64::try_from(cpu.as_nanos()).unwrap_or(i64::MAX);
        self.credit = self.credit.saturating_sub(ns);
    }

    fn allows(&self) -> bool {
        self.credit > 0
    }
}

impl FreeCores {
    fn new() -> FreeCores {
        FreeCores {
            loadavg: std::fs::File::open("/proc/loadavg").ok(),
            cpus: crate::sys::online_cpus(),
            buf: [0; 128],
            share: Share { credit: 0 },
            at: Instant::now(),
        }
    }

    /// Tasks runnable on the node now, this one included.
    fn runnable(&mut self) -> Option<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.loadavg.as_ref()?.read_at(&mut self.buf, 0).ok()?;
        runnable_of(self.buf.get(..n)?)
    }

    /// Returns once this worker may copy: true if the copy is paid from its share (`charge`),
    /// false if a core was free. `behind`: small copies queued after this one; past
    /// `SHARE_BACKLOG` the program reads faster than the shares follow (a reader of cached
    /// files, CPU-bound), and its copies wait for a free core (or the floor) instead.
    fn wait_for_one(&mut self, behind: usize) -> bool {
        let mut nap = BACKOFF_MIN;
        let mut waited = Duration::ZERO;
        loop {
            // A copying worker blocked on I/O takes no core and is not counted: right.
            match self.runnable() {
                Some(n) if n > self.cpus => {}
                _ => return false,
            }
            let now = Instant::now();
            self.share.earn(now.duration_since(self.at));
            self.at = now;
            if (behind <= SHARE_BACKLOG && self.share.allows()) || waited >= FLOOR {
                return true;
            }
            thread::sleep(nap);
            waited += nap;
            nap = (nap * 2).min(BACKOFF_MAX);
        }
    }

    /// A copy made while no core was free took `cpu` of this thread's time.
    fn charge(&mut self, cpu: Duration) {
        self.share.spend(cpu);
    }
}

/// Releases delayed small copies whose deadline passed, and those of retired tables at once (so
/// retiring a table never waits for them).
fn timer(sh: &Shared) {
    loop {
        thread::sleep(Duration::from_millis(20));
        if lock(&sh.queue).closed {
            return;
        }
        let now = Instant::now();
        let due: Vec<CopyTask> = {
            let mut d = lock(&sh.delayed);
            let keys: Vec<_> = d
                .iter()
                .filter(|(_, (at, j))| *at <= now || j.ctx.work.is_retired())
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter()
                .filter_map(|k| d.remove(&k).map(|(_, j)| j))
                .collect()
        };
        for j in due {
            enqueue(sh, j);
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn runnable_tasks_are_read_from_loadavg() {
        assert_eq!(runnable_of(b"2.14 2.82 2.30 3/456 12345\n"), Some(3));
        assert_eq!(runnable_of(b"0.00 0.01 0.05 1/80 7"), Some(1));
        // Anything else: no answer (the worker then copies as it would without the check).
        assert_eq!(runnable_of(b"2.14 2.82 2.30"), None);
        assert_eq!(runnable_of(b"2.14 2.82 2.30 x/456 1"), None);
        assert_eq!(runnable_of(b"2.14 2.82 2.30 3 1"), None);
        assert_eq!(runnable_of(b"\xff\xfe"), None);
        // This machine's own answer counts at least the thread asking.
        let mut c = FreeCores::new();
        assert!(c.runnable().is_some_and(|n| n >= 1));
    }

    #[test]
    fn a_busy_node_pays_copies_from_the_share_of_the_time_passing() {
        let ms = Duration::from_millis;
        let mut s = Share { credit: 0 };
        assert!(!s.allows());
        // 10 ‰ of 50 ms: 0.5 ms of copying.
        s.earn(ms(50));
        assert!(s.allows());
        s.spend(Duration::from_micros(400));
        assert!(s.allows());
        s.spend(Duration::from_micros(300));
        // 0.2 ms spent ahead: 20 ms more pass before the next copy.
        assert!(!s.allows());
        s.earn(ms(19));
        assert!(!s.allows());
        s.earn(ms(2));
        assert!(s.allows());
        // A long quiet spell saves at most CREDIT_MAX: one copy of 1.5 ms, then a wait.
        s.earn(Duration::from_secs(3600));
        s.spend(Duration::from_micros(1500));
        assert!(!s.allows());
        // Nothing overflows: an absurd debt saturates and stays a debt.
        s.spend(Duration::MAX);
        s.spend(Duration::MAX);
        s.earn(Duration::MAX);
        assert!(!s.allows());
    }
}
