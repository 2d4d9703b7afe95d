//! The placement pool: worker threads, a two-level priority queue, small-file copies held back
//! until the program closed the file, and the node-wide cap on concurrent source streams.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Params, Policy, SourceCtx};

/// How a copy task copies its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// Whole-file fetch of a large file by the agent (`fetch::fetch_large`): a program may be
    /// waiting on its progress, so it goes first.
    Fetch,
    /// Copy of a small file the program has read, from the page cache (`small::copy_small`):
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
}

pub struct CopyTask {
    pub ctx: Arc<SourceCtx>,
    pub entry: u32,
    pub method: CopyMethod,
    /// The job slot of the client whose request this is (0: nobody's), credited with the copy.
    pub slot: u32,
}

/// A counting semaphore: at most `max` source streams at once, node-wide. A placement holds one
/// for as long as it reads the source; page-cache copies take none.
pub struct Streams {
    max: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

/// One stream held; dropping it lets the next placement read the source.
pub struct Stream<'a>(&'a Streams);

impl Streams {
    pub fn new(max: usize) -> Streams {
        Streams {
            max: max.max(1),
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    pub fn acquire(&self) -> Stream<'_> {
        let mut used = lock(&self.used);
        while *used >= self.max {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += 1;
        Stream(self)
    }

    /// Streams in use now (for tests and status).
    pub fn in_use(&self) -> usize {
        *lock(&self.used)
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        *lock(&self.0.used) -= 1;
        self.0.freed.notify_one();
    }
}

#[derive(Default)]
struct Queue {
    high: VecDeque<CopyTask>,
    /// Name-order read-ahead (`CopyMethod::Ahead`), in the order the program will want it.
    ahead: VecDeque<CopyTask>,
    low: VecDeque<CopyTask>,
    closed: bool,
}

/// Shared by the workers, the timer and the submitters.
pub struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Small files opened and not yet closed: copied when CLOSED arrives (`promote`) or when the
    /// deadline passes. Keyed by (table, entry).
    delayed: Mutex<HashMap<(usize, u32), (Instant, CopyTask)>>,
    pub streams: Streams,
    /// One stream: what source-reading work nobody waits on holds, besides its stream, while
    /// the program's own source reads are moving (`stream_for`).
    background: Streams,
    pub params: Params,
    pub policy: Arc<dyn Policy>,
}

/// A fixed pool of placement workers shared by every source (each job's `SourceCtx` carries the
/// tiers it places on). Requests are deduplicated by the entry's state word (only
/// UNPLACED → QUEUED enqueues), so the queues hold each file once.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

/// Workers when the configuration does not say: the copies are I/O-bound, so one per core, at
/// least 2, capped (source streams are capped separately by `max_source_streams`).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(job: &CopyTask) -> (usize, u32) {
    (Arc::as_ptr(&job.ctx) as usize, job.entry)
}

impl Pool {
    pub fn new(workers: usize, policy: Arc<dyn Policy>, params: Params) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            ready: Condvar::new(),
            delayed: Mutex::default(),
            streams: Streams::new(params.max_source_streams),
            background: Streams::new(1),
            params,
            policy,
        });
        let mut handles = (0..workers.max(1))
            .map(|i| {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name(format!("place-{i}"))
                    .spawn(move || worker(&sh))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let sh = shared.clone();
        handles.push(
            std::thread::Builder::new()
                .name("place-timer".into())
                .spawn(move || timer(&sh))?,
        );
        Ok(Pool {
            shared,
            workers: handles,
        })
    }

    pub fn params(&self) -> &Params {
        &self.shared.params
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Queues a job now: fetches before small copies.
    pub fn submit(&self, job: CopyTask) {
        job.ctx.inflight.fetch_add(1, Ordering::AcqRel);
        enqueue(&self.shared, job);
    }

    /// Queues a small copy for later: `promote` (the program closed the file) or the deadline
    /// (`small_copy_delay`; no close came, e.g. the program keeps it open) releases it.
    pub fn submit_delayed(&self, job: CopyTask) {
        job.ctx.inflight.fetch_add(1, Ordering::AcqRel);
        let at = Instant::now() + self.shared.params.small_copy_delay;
        let k = key(&job);
        if let Some((_, old)) = lock(&self.shared.delayed).insert(k, (at, job)) {
            // Cannot happen (one QUEUED per entry), but never strand a count.
            old.ctx.inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The program closed `entry`: its pages are hot, copy it now. False if it was not waiting.
    pub fn promote(&self, ctx: &Arc<SourceCtx>, entry: u32) -> bool {
        let k = (Arc::as_ptr(ctx) as usize, entry);
        let job = lock(&self.shared.delayed).remove(&k);
        match job {
            Some((_, mut job)) => {
                job.method = CopyMethod::Small { closed: true };
                enqueue(&self.shared, job);
                true
            }
            None => false,
        }
    }

    /// Lets queued jobs finish (retired tables drop theirs quickly) and joins the workers.
    pub fn shutdown(mut self) {
        let delayed: Vec<_> = lock(&self.shared.delayed).drain().collect();
        for (_, (_, job)) in delayed {
            enqueue(&self.shared, job);
        }
        lock(&self.shared.queue).closed = true;
        self.shared.ready.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A source stream held by a placement, and the background slot when it backed off.
pub struct Held<'a> {
    // Dropped after the stream (fields drop in order): the slot was taken first.
    _stream: Stream<'a>,
    _background: Option<Stream<'a>>,
}

impl Shared {
    /// A source stream for placement work on `ctx`. Work a client waits on (`waited`: a large
    /// file it opened, a chunk its read missed) keeps its priority. Work nobody waits on (a
    /// small copy whose pages are gone, chunk prefetch) backs off while the program's own
    /// source reads moved within the last `BUSY_WINDOW` (`SourceCtx::program_busy`): such work
    /// then runs one stream at a time node-wide, so the program's reads find the source free.
    pub fn stream_for(&self, ctx: &SourceCtx, waited: bool) -> Held<'_> {
        let background = (!waited && ctx.program_busy()).then(|| {
            crate::stats::AgentCounters::add(&ctx.counters.backoffs, 1);
            self.background.acquire()
        });
        Held {
            _stream: self.streams.acquire(),
            _background: background,
        }
    }
}

fn enqueue(sh: &Shared, job: CopyTask) {
    let mut q = lock(&sh.queue);
    match job.method {
        CopyMethod::Fetch
        | CopyMethod::Chunk {
            requested: true, ..
        } => q.high.push_back(job),
        CopyMethod::Ahead => q.ahead.push_back(job),
        CopyMethod::Small { .. } | CopyMethod::Chunk { .. } => q.low.push_back(job),
    }
    drop(q);
    sh.ready.notify_one();
}

fn worker(sh: &Shared) {
    // With slack for an aligned block inside (`copy::aligned`: page-aligned, huge-page backed
    // where it can be, so large reads and tier writes move whole pages).
    let mut buf = super::copy::worker_buffer(sh.params.block_size);
    loop {
        let job = {
            let mut q = lock(&sh.queue);
            loop {
                if let Some(j) = q
                    .high
                    .pop_front()
                    .or_else(|| q.ahead.pop_front())
                    .or_else(|| q.low.pop_front())
                {
                    break j;
                }
                if q.closed {
                    return;
                }
                // Idle: give the buffer's pages back (the allocation stays, so nothing is
                // reallocated or zeroed eagerly). The agent runs in the job's memory cgroup,
                // where every resident MiB it keeps is page cache the program lacks.
                crate::sys::release_pages(&mut buf);
                q = sh.ready.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let out = match job.method {
            // Cluster mode: another node may hold the file (`incoming::Remote`).
            CopyMethod::Fetch | CopyMethod::Ahead => match job.ctx.remote.get() {
                Some(r) => match r.fetch(&job.ctx, job.entry, job.slot) {
                    Some(out) => out,
                    None => super::fetch::fetch_large(&job.ctx, job.entry, sh, &mut buf),
                },
                None => super::fetch::fetch_large(&job.ctx, job.entry, sh, &mut buf),
            },
            CopyMethod::Small { closed } => {
                super::small::copy_small(&job.ctx, job.entry, sh, &mut buf, closed)
            }
            CopyMethod::Chunk { first, requested } => super::partial::chunk_job(
                &job.ctx,
                job.entry,
                sh,
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
        if let super::PlaceOutcome::Placed { tier, bytes } = out {
            job.ctx
                .counters
                .credit_placement(&job.ctx.table, job.slot, tier, bytes);
            if job.method == CopyMethod::Ahead {
                crate::stats::AgentCounters::add(&job.ctx.counters.read_ahead, 1);
            }
        }
        job.ctx.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Releases delayed small copies whose deadline passed, and those of retired tables at once (so
/// retiring a table never waits for them).
fn timer(sh: &Shared) {
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if lock(&sh.queue).closed {
            return;
        }
        let now = Instant::now();
        let due: Vec<CopyTask> = {
            let mut d = lock(&sh.delayed);
            let keys: Vec<_> = d
                .iter()
                .filter(|(_, (at, j))| *at <= now || j.ctx.retired.load(Ordering::Acquire))
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
