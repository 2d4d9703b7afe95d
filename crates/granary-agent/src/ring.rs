//! The ring consumer: drains every source's request ring and hands requests to placement.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use granary_core::placement::handle_request;

use crate::agent::Agent;

/// Naps of the consumer when its rings are empty: from `NAP_MIN` after a request, doubling up
/// to `NAP_MAX`, so a program opening file after file is answered within tens of microseconds
/// while an idle agent wakes about a thousand times a second. With one table (a job's source, a
/// serving agent's) the consumer sleeps on the ring's doorbell instead — a push someone waits
/// for wakes it at once; requests nobody waits for (a small file closed,
/// `Table::push_hint_arg`) do not ring, and are taken in batches at its next look — for up to
/// `BELL_NAP_MAX`: it only wakes by itself to step over a ring slot a dead client left, and to look for a second table (an idle agent's consumer used a hundredth
/// of a core waking every millisecond). Its naps then start at `BELL_NAP_MIN`, not `NAP_MIN`: a
/// push wakes it, and every nap that ends by itself is a wake-up for nothing (~20 µs of CPU on
/// a VM, `bench/floor/wakeups.c`; from 50 µs, the consumer woke by itself two or three times
/// between two remote reads of 128 KiB) — but for a push being published (the ring's backlog:
/// it will not ring for it), looked at again after `NAP_MIN`.
const NAP_MIN: Duration = Duration::from_micros(50);
const NAP_MAX: Duration = Duration::from_millis(1);
const BELL_NAP_MIN: Duration = Duration::from_millis(1);
const BELL_NAP_MAX: Duration = Duration::from_millis(50);

pub fn consume(agent: Arc<Agent>) {
    let mut empty_since: Option<Instant> = None;
    let mut nap = NAP_MIN;
    while !agent.stopping.load(Ordering::Acquire) {
        let Some(setup) = agent.setup.get() else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let ctxs = agent.tables();
        let mut did = 0usize;
        for ctx in &ctxs {
            // Placement backs off while the program's own source reads move.
            ctx.sample_program_reads();
            // Bounded per pass so one busy source cannot starve the others.
            for _ in 0..4096 {
                // Held from before the pop until the request is handed on, so `pending` never
                // sees a request that is neither in the ring nor in the pool (see
                // `SourceCtx::pending`).
                ctx.work.hold();
                fence(Ordering::SeqCst);
                let Some(granary_shm::Request {
                    kind,
                    entry: idx,
                    arg,
                }) = ctx.table.pop_request()
                else {
                    ctx.work.release();
                    break;
                };
                handle_request(ctx, kind, idx, arg, &setup.pool);
                ctx.work.release();
                did += 1;
            }
        }
        if did > 0 {
            empty_since = None;
            nap = NAP_MIN;
            continue;
        }
        let since = *empty_since.get_or_insert_with(Instant::now);
        if since.elapsed() > Duration::from_secs(1) {
            // A client that died between claiming a slot and publishing it would block the ring.
            for ctx in &ctxs {
                if ctx.table.skip_stuck_request() {
                    tracing::debug!("skipped a stuck ring slot");
                }
            }
            empty_since = None;
        }
        match ctxs.as_slice() {
            // One table (a job's source, a serving agent's): woken by a client's push.
            [one] => {
                let nap_now = if one.table.ring_backlog() > 0 {
                    NAP_MIN
                } else {
                    nap.max(BELL_NAP_MIN)
                };
                one.table.wait_for_requests(nap_now);
                nap = (nap_now * 2).min(BELL_NAP_MAX);
            }
            _ => {
                std::thread::sleep(nap.min(NAP_MAX));
                nap = (nap * 2).min(NAP_MAX);
            }
        }
    }
}
