//! Acting on the requests clients push to a table's ring (`granary_shm::request`).

use granary_shm::{object_name, request, State};

use granary_shm::lifecycle::{self, EntryCell};

use super::pool::{CopyMethod, CopyTask, Pool};
use super::source_ctx::SourceCtx;
use super::space::Space;
use super::states;
use crate::sync::Arc;
use crate::sys;

/// Acts on one request from a table's ring. Requests are hints from untrusted-but-same-user
/// clients: each is checked against the entry's current state before anything happens.
///
/// `arg` is the request's argument (`request::arg_of`; the chunk index of CHUNK).
pub fn handle_request(ctx: &Arc<SourceCtx>, kind: u8, idx: u32, arg: u32, pool: &Pool) {
    let t = &ctx.table;
    let tiers = &*ctx.space.tiers;
    if kind == request::MAPPED {
        ctx.mmap.request(idx, arg);
        return;
    }
    if kind == request::CLOSED && closed_waits(ctx) {
        // Nobody waits for a small file's copy, and its copy runs only on an idle core
        // (`pool`): so does deciding it (its entry, state and claim, several loads that miss
        // the cache), on the idle-class workers (`CopyMethod::Closed`), not here at the
        // program's priority beside it. Once per file until a worker took it.
        if ctx.closed_waiting.set(idx) {
            pool.submit(CopyTask {
                ctx: ctx.clone(),
                entry: idx,
                method: CopyMethod::Closed,
                slot: arg,
            });
        }
        return;
    }
    let Some(e) = t.entry(idx) else { return };
    // The preload library decides from the same header which files the agent fetches whole.
    let whole = e.stat.size >= t.prefetch_min_size();
    if let Some(order) = &ctx.order {
        order.on_request(ctx, kind, idx);
    } else if ctx.pack.get().is_none()
        && (matches!(kind, request::OPEN_UNPLACED | request::OPENED)
            || kind == request::CLOSED && !whole && t.state(idx).state() == State::Unplaced)
    {
        // Before the open's own fetch is queued: a file the read-ahead claimed is not
        // fetched twice, and the one this open asks for goes first either way. A small file
        // nobody claimed yet was opened without a request (`OPEN_UNPLACED` is left to its
        // close): its CLOSED stands for the open here.
        ctx.ahead.on_open(ctx, idx, pool);
    }
    if let (Some(pack), request::OPEN_UNPLACED | request::CLOSED) = (ctx.pack.get(), kind) {
        if t.locator(idx).is_some() {
            if !pack.streams(idx) {
                // Cluster mode: another node streams it and sends it here; if none can, this
                // node reads it from the pack itself.
                if kind == request::OPEN_UNPLACED && lifecycle::claim(&EntryCell { table: t, idx })
                {
                    let handed = ctx.remote.get().and_then(|r| r.fetch(ctx, idx, arg));
                    if handed.is_none() {
                        pack.adopt(ctx, idx);
                    }
                }
                return;
            }
            // A packed file's bytes come from its partition, never from the source's file: the
            // program waits for this copy, so its segment is streamed next.
            pack.request(ctx, idx);
            return;
        }
    }
    match kind {
        request::OPEN_UNPLACED => {
            if e.stat.is_file() && lifecycle::claim(&EntryCell { table: t, idx }) {
                let job = |method| CopyTask {
                    ctx: ctx.clone(),
                    entry: idx,
                    method,
                    slot: arg,
                };
                if whole {
                    // Cluster mode: a file another node holds goes to a fetcher at once (the
                    // pool's worker would only hand it on: one thread hand-off less).
                    if let Some(r) = ctx.remote.get() {
                        if r.fetch(ctx, idx, arg).is_some() {
                            return;
                        }
                    }
                    // The agent is the one reader of a file it fetches whole: start now, the
                    // program's reads are served from the partial copy.
                    pool.submit(job(CopyMethod::Fetch));
                } else {
                    // The program reads it itself; copy its pages once it is done with them.
                    pool.submit_delayed(job(CopyMethod::Small { closed: false }));
                }
            }
        }
        request::CLOSED => {
            // The program closed a small file it read: copy it now, from the page cache. (Only
            // a QUEUED file can be waiting for its close in the pool.)
            let queued = t.state(idx).state() == State::Queued;
            if !(queued && pool.promote(ctx, idx))
                && e.stat.is_file()
                && !whole
                && lifecycle::claim(&EntryCell { table: t, idx })
            {
                // No OPEN_UNPLACED came (a small file's open sends none unless the agent follows
                // opens, or the ring was full): the close is enough to act on.
                pool.submit(CopyTask {
                    ctx: ctx.clone(),
                    entry: idx,
                    method: CopyMethod::Small { closed: true },
                    slot: arg,
                });
            }
        }
        request::CHUNK => {
            // A client's read of a PARTIAL file missed chunk `arg`.
            if t.state(idx).state() == State::Partial
                && super::partial::claim_chunk(ctx, idx, arg as u64)
            {
                pool.submit(CopyTask {
                    ctx: ctx.clone(),
                    entry: idx,
                    method: CopyMethod::Chunk {
                        first: arg,
                        requested: true,
                    },
                    slot: 0,
                });
            }
        }
        request::INVALIDATE => {
            // The client already marked the entry STALE; withdraw a placed copy (one CAS, so a
            // state set in between is never overwritten) and drop any copy or chunk file so its
            // space comes back.
            if e.stat.is_file() {
                lifecycle::invalidate_placed(&EntryCell { table: t, idx });
                drop_all_copies(ctx, idx, &e);
            }
            // Cluster mode: the other nodes stop serving it too.
            if let Some(r) = ctx.remote.get() {
                r.invalidated(ctx, idx);
            }
        }
        request::DAMAGED => {
            let w = t.state(idx);
            if w.state() == State::Partial {
                // A chunk file that cannot be used: withdraw it, the next open starts over.
                super::partial::withdraw_partial(ctx, idx, w);
                return;
            }
            if w.state() != State::Placed {
                return;
            }
            let tier = w.tier() as usize;
            let name = object_name(e.object);
            let Some(dir) = ctx.space.dir(tier) else {
                return;
            };
            let recorded = t.copy_identity(idx);
            let intact = matches!(sys::copy_stat_at(dir, &name),
                Ok(c) if c.is_regular && c.size == e.stat.size
                    && (c.ino, c.ctime_ns) == recorded);
            if intact && !ctx.space.is_lost(tier) {
                // The copy is the one we wrote, where we wrote it: the client's trouble was its
                // own (a closed directory fd, a signal). Nothing to do.
                return;
            }
            // Withdraw it first so no new client opens it, then delete and give the space back.
            if lifecycle::withdraw(&EntryCell { table: t, idx }, w) {
                tracing::debug!("damaged copy of entry {idx} on tier {tier}: removing");
                // Wrong or gone (deleted behind our back): either way its space is still charged.
                let _ = sys::unlink_at(dir, &name);
                tiers.release(tier, tiers.charge(tier, e.stat.size));
            }
        }
        // Only moves the known-order position (above).
        request::OPENED => {}
        request::LMDB_LOCK => {
            crate::stats::AgentCounters::add(&ctx.counters.lmdb_local_locks, 1);
        }
        request::VALIDATE => {
            let v = ctx.validation.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = v.as_ref() {
                v.hint(idx);
            }
        }
        _ => tracing::debug!("unknown request kind {kind} for entry {idx}"),
    }
}

/// True if a CLOSED request of `ctx` needs nothing but its claim and copy, which the idle-class
/// workers can decide: no known order or read-ahead follows the program's opens (the close of a
/// small file stands for its open there), no pack serves its bytes.
fn closed_waits(ctx: &SourceCtx) -> bool {
    ctx.order.is_none()
        && ctx.pack.get().is_none()
        && !ctx.table.reports_opens()
        && !ctx.ahead.may_fetch(&ctx.table)
}

/// Deletes every copy of a void entry (whole copies on any tier, a chunk file) and gives their
/// space back.
pub(crate) fn drop_all_copies(ctx: &SourceCtx, idx: u32, e: &granary_shm::EntryRec) {
    drop_copies(&ctx.space, e);
    super::partial::drop_partial(ctx, idx);
}

fn drop_copies(space: &Space, e: &granary_shm::EntryRec) {
    let name = object_name(e.object);
    for (tier, dir) in space.dirs().iter().enumerate() {
        let Some(dir) = dir else { continue };
        // Racing with a worker's `states::finish`: whoever unlinks releases, once.
        states::drop_object(&space.tiers, tier, e.stat.size, || {
            sys::unlink_at(dir, &name).is_ok()
        });
    }
}
