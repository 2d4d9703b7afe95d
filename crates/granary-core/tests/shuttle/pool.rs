//! The placement pool (`placement::Pool`) with its real workers, timer and jobs, fed by the
//! real request dispatcher (`handle_request`), copying real files into a real tier.

use std::time::Duration;

use granary_core::placement::{handle_request, FillHighestFirst, Params, Pool};
use granary_core::sync::atomic::{AtomicBool, Ordering};
use granary_core::sync::Arc;
use granary_shm::lifecycle::{self, EntryCell};
use granary_shm::{request, TableSpec};
use shuttle::rand::Rng;
use shuttle::thread;

use super::fixture::{check_random, wait_until, Placing, Source};

const ITERATIONS: usize = 300;
/// Files at least this large are fetched whole (`CopyMethod::Fetch`), smaller ones copied
/// once the program closed them (`CopyMethod::Small`, held back by the pool until then).
const WHOLE: u64 = 16 << 10;

/// A client thread that sees `name` change: it voids the entry itself (`Void::Stale`), then
/// says so in the flag returned beside it, which the consumer waits for before it tells the pool.
fn voiding_client(p: &Placing, name: &str) -> (thread::JoinHandle<()>, Arc<AtomicBool>) {
    let voided = Arc::new(AtomicBool::new(false));
    let (ctx, flag) = (p.ctx.clone(), voided.clone());
    let idx = p.idx(name);
    let client = thread::spawn(move || {
        lifecycle::void(
            &EntryCell {
                table: &ctx.table,
                idx,
            },
            lifecycle::Void::Stale,
        );
        flag.store(true, Ordering::Release);
    });
    (client, voided)
}

/// Two programs open every file (the second open finds it claimed), close two of the small
/// ones (`small2` stays open), and one of them sees `small1` change and invalidates it while
/// it may be queued, held back, copied or placed; then the pool shuts down. Workers, the
/// pool's timer and the ring consumer race with each other and with a source stream cap of
/// one. Afterwards every file is placed exactly once with its bytes, the invalidated one has
/// no copy, the tier is charged for exactly what it holds, and every job the pool took was
/// finished once (the work held back to zero, not wrapped).
#[test]
fn the_pool_places_every_file_once() {
    let source = Source::new(&[
        ("big0", 20 << 10),
        ("big1", (20 << 10) + 123),
        ("small0", 5000),
        ("small1", 3000),
        ("small2", 7000),
    ]);
    let cat = source.catalog();
    check_random(
        move || {
            let spec = TableSpec {
                prefetch_min_size: WHOLE,
                ..Default::default()
            };
            let p = Placing::new(&source.src(), &cat, spec, 1 << 20);
            // Small copies held back for no time (the timer may release one before or after its
            // CLOSED arrives) or for longer than the test (CLOSED releases them, or shutdown).
            let delay = if shuttle::rand::thread_rng().gen() {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            };
            let params = Params {
                block_size: 4096,
                max_source_streams: 1,
                prefetch_min_size: WHOLE,
                chunk_size: 0,
                small_copy_delay: delay,
            };
            let pool = Arc::new(Pool::new(2, Arc::new(FillHighestFirst), params).unwrap());
            let ctx = p.ctx.clone();
            // A client sees small1 change: it voids the entry itself, then tells the agent.
            let (client, voided) = voiding_client(&p, "small1");
            // The ring consumer: one thread, requests in the order the clients pushed them.
            let consumer = {
                let (ctx, pool, voided) = (ctx.clone(), pool.clone(), voided.clone());
                let idx: Vec<u32> = ["big0", "small0", "big1", "small1", "small2"]
                    .iter()
                    .map(|n| p.idx(n))
                    .collect();
                thread::spawn(move || {
                    for &i in &idx {
                        handle_request(&ctx, request::OPEN_UNPLACED, i, 1, &pool);
                    }
                    handle_request(&ctx, request::OPEN_UNPLACED, idx[0], 2, &pool);
                    handle_request(&ctx, request::CLOSED, idx[1], 1, &pool);
                    handle_request(&ctx, request::CLOSED, idx[3], 1, &pool);
                    wait_until("the client's invalidation", || {
                        voided.load(Ordering::Acquire)
                    });
                    handle_request(&ctx, request::INVALIDATE, idx[3], 1, &pool);
                })
            };
            client.join().unwrap();
            consumer.join().unwrap();
            let Ok(pool) = Arc::try_unwrap(pool) else {
                panic!("the pool is still shared")
            };
            pool.shutdown();
            p.check_placed(&source.files, &["small1"]);
        },
        ITERATIONS,
    );
}

/// Only small files, so nothing is ever read ahead: the ring consumer hands each close request
/// on to the idle-class workers untouched (`CopyMethod::Closed`), and they decide it. `small0`
/// was opened first (its copy is held back until its close, which a worker then releases),
/// `small1` is closed twice (one task while the first is not taken yet) while a client sees it
/// change and invalidates it, `small2` and `small3` are only closed; then the pool shuts down
/// with close requests maybe still queued. Afterwards every file is placed exactly once with
/// its bytes, the invalidated one has no copy, and the work held is back to zero.
#[test]
fn close_requests_left_to_the_idle_workers_place_every_file_once() {
    let source = Source::new(&[
        ("small0", 5000),
        ("small1", 3000),
        ("small2", 7000),
        ("small3", 100),
    ]);
    let cat = source.catalog();
    check_random(
        move || {
            let spec = TableSpec {
                prefetch_min_size: WHOLE,
                ..Default::default()
            };
            let p = Placing::new(&source.src(), &cat, spec, 1 << 20);
            let params = Params {
                block_size: 4096,
                max_source_streams: 1,
                prefetch_min_size: WHOLE,
                chunk_size: 0,
                small_copy_delay: Duration::from_secs(3600),
            };
            let pool = Arc::new(Pool::new(2, Arc::new(FillHighestFirst), params).unwrap());
            let ctx = p.ctx.clone();
            assert!(
                !ctx.ahead.may_fetch(&ctx.table),
                "no file here is fetched whole: close requests go to the idle-class workers"
            );
            let (client, voided) = voiding_client(&p, "small1");
            let consumer = {
                let (ctx, pool, voided) = (ctx.clone(), pool.clone(), voided.clone());
                let idx: Vec<u32> = ["small0", "small1", "small2", "small3"]
                    .iter()
                    .map(|n| p.idx(n))
                    .collect();
                thread::spawn(move || {
                    handle_request(&ctx, request::OPEN_UNPLACED, idx[0], 1, &pool);
                    for &i in &[idx[1], idx[0], idx[2], idx[1], idx[3]] {
                        handle_request(&ctx, request::CLOSED, i, 1, &pool);
                    }
                    wait_until("the client's invalidation", || {
                        voided.load(Ordering::Acquire)
                    });
                    handle_request(&ctx, request::INVALIDATE, idx[1], 1, &pool);
                })
            };
            client.join().unwrap();
            consumer.join().unwrap();
            let Ok(pool) = Arc::try_unwrap(pool) else {
                panic!("the pool is still shared")
            };
            pool.shutdown();
            p.check_placed(&source.files, &["small1"]);
        },
        ITERATIONS,
    );
}
