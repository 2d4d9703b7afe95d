//! What every placement job runs with, whichever thread runs it (a pool worker, a partition
//! streamer, the known-order prefetcher, a cluster-mode fetcher): the placement parameters, the
//! policy, and the node-wide cap on concurrent source streams.
//!
//! The jobs (`whole_file`, `page_cache_copy`, `partial`, `pack_streamer`, `known_order`) take
//! an `&Engine`; none of them knows the pool that may be running it.

use super::params::Params;
use super::policy::Policy;
use super::source_ctx::SourceCtx;
use crate::sync::{lock, Arc, Condvar, Mutex};

pub struct Engine {
    /// Source reads in flight at once, node-wide (`Params::max_source_streams`).
    pub streams: Streams,
    /// One stream: what source-reading work nobody waits on holds, besides its stream, while
    /// the program's own source reads are moving (`stream_for`).
    background: Streams,
    pub params: Params,
    pub policy: Arc<dyn Policy>,
}

impl Engine {
    pub fn new(policy: Arc<dyn Policy>, params: Params) -> Engine {
        Engine {
            streams: Streams::new(params.max_source_streams),
            background: Streams::new(1),
            params,
            policy,
        }
    }

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

    /// A source stream for a thread of the idle scheduling class (a small copy whose pages are
    /// gone): always through the background slot, so however long such a thread waits for a
    /// core, it holds at most one of the streams the program's fetches need.
    pub fn stream_for_idle(&self) -> Held<'_> {
        let background = Some(self.background.acquire());
        Held {
            _stream: self.streams.acquire(),
            _background: background,
        }
    }
}

/// A source stream held by a placement, and the background slot when it backed off.
pub struct Held<'a> {
    // Dropped after the stream (fields drop in order): the slot was taken first.
    _stream: Stream<'a>,
    _background: Option<Stream<'a>>,
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
