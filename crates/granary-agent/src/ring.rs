//! The ring consumer: drains every source's request ring and hands requests to placement.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use granary_core::placement::handle_request;
use granary_shm::layout::RING_SHARDS;

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
    let mut looked_stuck = Instant::now();
    // Per table: the ring shards' heads found claimed but unpublished at the last look.
    let mut stuck_seen: Vec<(usize, [u64; RING_SHARDS])> = Vec::new();
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
            // Held from before the first pop until the last request is handed on, so `pending`
            // never sees a request that is neither in the ring nor in the pool (see
            // `SourceCtx::pending`): once for the whole batch, not around each request (the
            // fence alone was a quarter of the consumer's samples per small file's close).
            ctx.work.hold();
            fence(Ordering::SeqCst);
            // Bounded per pass so one busy source cannot starve the others.
            for _ in 0..4096 {
                let Some(granary_shm::Request {
                    kind,
                    entry: idx,
                    arg,
                }) = ctx.table.pop_request()
                else {
                    break;
                };
                handle_request(ctx, kind, idx, arg, &setup.pool);
                did += 1;
            }
            ctx.work.release();
        }
        if looked_stuck.elapsed() > Duration::from_secs(1) {
            // A client that died between claiming a slot and publishing it would block its ring
            // shard: looked for every second, busy or not (the other shards' processes can keep
            // the consumer busy while one shard waits), and skipped at the second look.
            looked_stuck = Instant::now();
            stuck_seen.retain(|(key, _)| ctxs.iter().any(|c| Arc::as_ptr(c) as usize == *key));
            for ctx in &ctxs {
                let key = Arc::as_ptr(ctx) as usize;
                let at = match stuck_seen.iter().position(|(k, _)| *k == key) {
                    Some(at) => at,
                    None => {
                        stuck_seen.push((key, [u64::MAX; RING_SHARDS]));
                        stuck_seen.len() - 1
                    }
                };
                if ctx.table.skip_stuck_request(&mut stuck_seen[at].1) {
                    tracing::debug!("skipped a stuck ring slot");
                }
            }
        }
        if did > 0 {
            nap = NAP_MIN;
            continue;
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
