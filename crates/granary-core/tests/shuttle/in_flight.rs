//! In-flight tracking (`placement::mmap::in_flight`): the follower issues and retires
//! read-ahead while whole-file fetches hold synchronous reads of the same source.

use std::time::{Duration, Instant};

use granary_core::placement::mmap::in_flight::{Flight, Piece};
use granary_core::sync::atomic::{AtomicBool, Ordering};
use granary_core::sync::Arc;
use shuttle::thread;

const ITERATIONS: usize = 1000;
const MB: u64 = 1 << 20;

/// The follower (one thread, as in the agent) issues read-ahead pieces while `room` allows and
/// retires them in the order a source serves them; two fetches hold synchronous reads, some
/// much larger than the cap. Whatever the fetches hold, the follower is never refused its
/// first piece (a fetch never starves the readers), and once everything is done nothing is
/// in flight.
#[test]
fn read_ahead_is_never_starved_and_nothing_stays_in_flight() {
    shuttle::check_random(
        || {
            let f = Arc::new(Flight::default());
            let fetches_done = Arc::new(AtomicBool::new(false));
            let fetches: Vec<_> = (0..2u64)
                .map(|k| {
                    let f = f.clone();
                    thread::spawn(move || {
                        for n in [MB / 2, 64 * MB, 3 * MB] {
                            let _read = f.sync_read(n + k);
                            thread::yield_now();
                        }
                    })
                })
                .collect();
            let follower = {
                let (f, fetches_done) = (f.clone(), fetches_done.clone());
                thread::spawn(move || {
                    let t0 = Instant::now();
                    let mut mine: u64 = 0;
                    let mut served = 0u64;
                    let mut off = 0u64;
                    for tick in 0..6u64 {
                        let now = t0 + Duration::from_millis(100 * tick);
                        // The source served the oldest piece since the last tick.
                        let gone = f.retire(now, |p| p.off < served);
                        mine -= gone.iter().map(|p| p.len).sum::<u64>();
                        served = off.min(served + MB);
                        let room = f.room(2);
                        if mine == 0 {
                            assert!(room >= f.piece(), "read-ahead starved: room {room}");
                        }
                        let mut issued = 0;
                        while issued + f.piece() <= room {
                            let len = f.piece();
                            f.issued(Piece {
                                idx: 0,
                                off,
                                len,
                                at: now,
                            });
                            off += len;
                            issued += len;
                            mine += len;
                        }
                    }
                    while !fetches_done.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                    // Everything issued completes.
                    let end = t0 + Duration::from_secs(2);
                    let gone = f.retire(end, |_| true);
                    mine -= gone.iter().map(|p| p.len).sum::<u64>();
                    assert_eq!(mine, 0);
                })
            };
            for t in fetches {
                t.join().unwrap();
            }
            fetches_done.store(true, Ordering::Release);
            follower.join().unwrap();
            assert_eq!(f.in_flight(), 0, "bytes left in flight");
        },
        ITERATIONS,
    );
}
