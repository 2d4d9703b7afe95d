//! Driving the known-order policy (`KnownOrder`) in the agent: following the program's
//! position, keeping the window of upcoming files placed, and evicting files the program has
//! already read this epoch when that window needs room (docs/placement.md, "Known order").
//!
//! - Position: with `FLAG_REPORT_OPENS` set in the table header, clients push `OPENED` after
//!   every open of a catalogued file (placed ones included, which the agent never saw before);
//!   `OPENED` and `OPEN_UNPLACED` both move `KnownOrder`'s position (`on_request`).
//! - Prefetch: one thread per table (`spawn`) copies the files `prefetch` names, one at a time
//!   through `whole_file::fetch` (the agent is the only reader, in large sequential reads, and a
//!   program that opens the file meanwhile is served from the partial copy). One at a time means
//!   at most one of the node's `max_source_streams` ever goes to work nobody waits on yet, so
//!   the fetches a program waits on (the pool's) keep the others.
//! - Eviction: when no tier has room for a file the window (or a client's open) needs, the
//!   policy's victims (placed, opened this epoch, next use furthest away) are dropped. Order:
//!   CAS PLACED → UNPLACED first (no client opens the copy any more; a client that looks the
//!   state up afterwards goes to the source), then unlink the object (a client that already
//!   opened it keeps a valid fd: the inode lives until its last close), then release its charge
//!   (only if our unlink removed the file, so a racing INVALIDATE never releases twice).
//!
//! - `prefetcher`: the policy's state (`Prefetcher`, built from the job's `OrderSpec`), knowing
//!   nothing of `SourceCtx`; here: what moves it on requests, evicts, and the prefetch thread.

pub(super) mod prefetcher;

pub use prefetcher::{default_window, OrderSpec, Prefetcher};

use std::io;
use std::time::Duration;

use granary_shm::{request, State};

use super::engine::Engine;
use super::outcome::PlaceOutcome;
use super::policy::Policy;
use super::source_ctx::SourceCtx;
use crate::stats::AgentCounters;
use crate::sync::{lock, thread, Arc};
use crate::sys;

impl Prefetcher {
    /// A request from the table's ring (before the normal handling): opens move the position;
    /// an open of an unplaced file makes room first, so the fetch the program now waits on
    /// finds a tier instead of falling back to the source for good.
    pub fn on_request(&self, ctx: &SourceCtx, kind: u8, idx: u32) {
        if kind != request::OPENED && kind != request::OPEN_UNPLACED {
            return;
        }
        self.order.observe(idx);
        if kind == request::OPEN_UNPLACED && ctx.table.state(idx).state() == State::Unplaced {
            if let Some(e) = ctx.table.entry(idx) {
                self.make_room(ctx, e.stat.size);
            }
        }
        *lock(&self.wake.0) = true;
        self.wake.1.notify_one();
    }

    /// Evicts victims until some tier has `size` bytes free. False if the policy has nothing
    /// it may evict (nothing placed was read this epoch): the file goes where it can.
    pub fn make_room(&self, ctx: &SourceCtx, size: u64) -> bool {
        let room = || {
            super::policy::free_space(&ctx.space.tiers)
                .iter()
                .enumerate()
                .any(|(t, &f)| f >= ctx.space.tiers.charge(t, size) && !ctx.space.tiers.is_full(t))
        };
        if room() {
            return true;
        }
        let placed = |e: u32| ctx.table.state(e).state() == State::Placed;
        for v in self.order.victims(size, &placed) {
            self.evict(ctx, v);
            if room() {
                return true;
            }
        }
        room()
    }

    /// Drops the placed copy of `idx` (see the module comment for the order). False if the
    /// entry was not PLACED any more when we tried.
    pub fn evict(&self, ctx: &SourceCtx, idx: u32) -> bool {
        let t = &ctx.table;
        let Some(tier) = super::states::withdraw_copy(t, &ctx.space, idx, |dir, name| {
            sys::unlink_at(dir, name).is_ok()
        }) else {
            return false;
        };
        let st = self.order.state();
        AgentCounters::add(&ctx.counters.evictions, 1);
        // The test suite checks from this line that every evicted file was read in the epoch
        // it was evicted in (the clock is the same the program can read: CLOCK_MONOTONIC).
        tracing::info!(
            "evicted {} from tier {tier} (epoch {}, position {:?}, t_mono_ns {})",
            String::from_utf8_lossy(&t.rel_path_vec(idx).unwrap_or_else(|| b"?".to_vec())),
            st.epoch,
            st.pos,
            sys::monotonic_ns()
        );
        true
    }

    /// The next file to place ahead of the program, claimed (QUEUED), if any; makes room for
    /// it first. `None`: the window is placed, or there is no room to be had.
    fn next(&self, ctx: &SourceCtx) -> Option<u32> {
        let t = &ctx.table;
        let epoch = self.order.state().epoch;
        // SOURCE_ONLY counts as "to place" once per epoch (it may have been a moment without
        // room); QUEUED/PLACING/PLACED/STALE/PARTIAL are on their way or not ours to touch.
        let want = |e: u32| match t.state(e).state() {
            State::Unplaced => true,
            State::SourceOnly => lock(&self.retried).get(&e) != Some(&epoch),
            _ => false,
        };
        for idx in self.order.prefetch(&|e| !want(e)) {
            let Some(e) = t.entry(idx) else { continue };
            if !self.make_room(ctx, e.stat.size) {
                return None;
            }
            let w = t.state(idx);
            let from = w.state();
            if from == State::SourceOnly {
                lock(&self.retried).insert(idx, epoch);
            }
            if granary_shm::lifecycle::claim_ahead(
                &granary_shm::lifecycle::EntryCell { table: t, idx },
                w,
            ) {
                return Some(idx);
            }
        }
        None
    }
}

/// Starts the prefetch thread of a table with a known order (no-op otherwise). It ends when
/// the table is retired; its placement counts in `SourceCtx::work`, so retirement and `pending`
/// wait for the copy in hand.
pub fn spawn(ctx: Arc<SourceCtx>, engine: Arc<Engine>) -> io::Result<()> {
    if ctx.order.is_none() {
        return Ok(());
    }
    ctx.table.set_reports_opens(true);
    thread::Builder::new()
        .name("prefetch".into())
        .spawn(move || run(&ctx, &engine))?;
    Ok(())
}

fn run(ctx: &SourceCtx, engine: &Engine) {
    let Some(pf) = ctx.order.as_deref() else {
        return;
    };
    let mut buf = super::buffers::worker_buffer(engine.params.block_size);
    while !ctx.work.is_retired() {
        ctx.work.hold();
        let next = pf.next(ctx);
        if let Some(idx) = next {
            let out = super::whole_file::fetch(ctx, idx, engine, &mut buf);
            if matches!(out, PlaceOutcome::Placed { .. }) {
                AgentCounters::add(&ctx.counters.prefetched, 1);
            }
            tracing::trace!("prefetch of entry {idx}: {out:?}");
        }
        ctx.work.release();
        if next.is_some() {
            continue;
        }
        // Nothing to do until the program moves (or a moment passed: room may have come back).
        let g = lock(&pf.wake.0);
        let (mut g, _) = pf
            .wake
            .1
            .wait_timeout_while(g, Duration::from_millis(100), |w| !*w)
            .unwrap_or_else(|e| e.into_inner());
        *g = false;
    }
}
