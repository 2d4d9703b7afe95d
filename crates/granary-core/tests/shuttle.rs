//! Concurrency tests of the placement core under Shuttle: thread interleavings are explored by a
//! randomised scheduler (every operation on a `granary_core::sync` primitive is a scheduling
//! point), and the invariants are checked at every step a thread takes.
//!
//! Run: `cargo test -p granary-core --features shuttle --test shuttle`.
#![cfg(feature = "shuttle")]

#[path = "shuttle/fixture.rs"]
mod fixture;
#[path = "shuttle/in_flight.rs"]
mod in_flight;
#[path = "shuttle/pack_streamer.rs"]
mod pack_streamer;
#[path = "shuttle/pool.rs"]
mod pool;

use std::collections::HashSet;
use std::path::PathBuf;

use granary_core::placement::states::{self, Finish};
use granary_core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use granary_core::sync::{Arc, Mutex};
use granary_core::tiers::{TierSpec, Tiers};
use granary_shm::lifecycle::{self, Cell};
use granary_shm::{State, StateWord};
use shuttle::thread;

const ITERATIONS: usize = 3000;

fn tiers(caps: &[u64], block: u64) -> Tiers {
    Tiers::new(
        caps.iter()
            .enumerate()
            .map(|(i, &c)| TierSpec {
                path: PathBuf::from(format!("/t{i}")),
                capacity: c,
                block_size: block,
                ..Default::default()
            })
            .collect(),
    )
}

/// Every tier's accounting is sane right now: committed bytes never wrap below zero nor exceed
/// the capacity, and committed plus reserved bytes never exceed it either.
fn check_usage(t: &Tiers) {
    for u in t.usage() {
        assert!(
            u.used <= u.capacity,
            "committed {} > capacity {}",
            u.used,
            u.capacity
        );
        assert!(
            u.used + u.reserved <= u.capacity,
            "used {} + reserved {} > capacity {}",
            u.used,
            u.reserved,
            u.capacity
        );
    }
}

/// Many threads reserve, commit, drop and release on two small tiers (room for a few blocks
/// each). At every step the tiers stay within capacity; at the end the committed bytes are
/// exactly what the threads kept.
#[test]
fn reservations_never_overfill() {
    shuttle::check_random(
        || {
            let t = Arc::new(tiers(&[3 * 512, 2 * 512], 512));
            let kept = Arc::new(AtomicU64::new(0));
            let handles: Vec<_> = (0..4u64)
                .map(|i| {
                    let t = t.clone();
                    let kept = kept.clone();
                    thread::spawn(move || {
                        let mut mine: Vec<(usize, u64)> = Vec::new();
                        for j in 0..4u64 {
                            let tier = ((i + j) % 2) as usize;
                            // 1..=1024 bytes: one or two blocks.
                            let bytes = 1 + (i * 331 + j * 577) % 1024;
                            if let Some(r) = t.reserve(tier, bytes) {
                                check_usage(&t);
                                match (i + j) % 3 {
                                    0 => drop(r),
                                    _ => mine.push((tier, r.commit())),
                                }
                            }
                            check_usage(&t);
                            if j % 2 == 1 {
                                if let Some((tier, c)) = mine.pop() {
                                    t.release(tier, c);
                                    check_usage(&t);
                                }
                            }
                        }
                        kept.fetch_add(mine.iter().map(|m| m.1).sum::<u64>(), Ordering::AcqRel);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let u = t.usage();
            assert_eq!(u.iter().map(|u| u.reserved).sum::<u64>(), 0);
            assert_eq!(
                u.iter().map(|u| u.used).sum::<u64>(),
                kept.load(Ordering::Acquire)
            );
        },
        ITERATIONS,
    );
}

/// A tier directory as the race sees it: which names exist. `unlink` succeeds for one caller.
#[derive(Default)]
struct Dir {
    names: Mutex<HashSet<&'static str>>,
}

impl Dir {
    fn create(&self, name: &'static str) {
        self.names.lock().unwrap().insert(name);
    }
    fn rename(&self, from: &'static str, to: &'static str) -> std::io::Result<()> {
        let mut n = self.names.lock().unwrap();
        if !n.remove(from) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        n.insert(to);
        Ok(())
    }
    fn unlink(&self, name: &'static str) -> bool {
        self.names.lock().unwrap().remove(name)
    }
    fn exists(&self, name: &'static str) -> bool {
        self.names.lock().unwrap().contains(name)
    }
}

const SIZE: u64 = 1000;

/// One entry's state word behind a Shuttle lock (each operation one step, as the table's atomic
/// is): the lifecycle's own transitions run on it.
#[derive(Default)]
struct Word(Mutex<StateWord>);

impl Cell for Word {
    fn load(&self) -> StateWord {
        *granary_core::sync::lock(&self.0)
    }
    fn cas(&self, from: StateWord, to: StateWord) -> bool {
        let mut w = granary_core::sync::lock(&self.0);
        let swapped = *w == from;
        if swapped {
            *w = to;
        }
        swapped
    }
    fn store(&self, word: StateWord) {
        *granary_core::sync::lock(&self.0) = word
    }
}

/// One entry, several clients opening it (each OPEN_UNPLACED that wins the claim starts a worker,
/// as the ring consumer hands it to the pool), one client seeing the source change (stores
/// STALE, then the agent's INVALIDATE handler drops the copy), and an observer. Invariants: at
/// most one copy is ever made; the state is never PLACED once it was STALE; at the end, a
/// PLACED entry has its object and exactly its charge, anything else has neither.
#[test]
fn opens_and_invalidation_race() {
    shuttle::check_random(
        || {
            // Unplaced, as a regular file starts.
            let cell = Arc::new(Word::default());
            let t = Arc::new(tiers(&[4096], 512));
            let dir = Arc::new(Dir::default());
            let copies = Arc::new(AtomicUsize::new(0));
            let stale_seen = Arc::new(AtomicUsize::new(0));
            let done = Arc::new(AtomicUsize::new(0));

            let worker = {
                let (cell, t, dir, copies) = (cell.clone(), t.clone(), dir.clone(), copies.clone());
                move || {
                    let queued = cell.load();
                    if queued.state() != State::Queued || !lifecycle::begin(&*cell, queued, 0) {
                        return;
                    }
                    assert_eq!(copies.fetch_add(1, Ordering::AcqRel), 0, "a second copy");
                    let Some(res) = t.reserve(0, SIZE) else {
                        lifecycle::give_up(&*cell, State::SourceOnly);
                        return;
                    };
                    dir.create("tmp");
                    check_usage(&t);
                    let out = states::finish(
                        &*cell,
                        &t,
                        res,
                        || dir.rename("tmp", "obj"),
                        || dir.unlink("obj"),
                    );
                    assert_ne!(out, Finish::RenameFailed);
                    check_usage(&t);
                }
            };

            let mut handles = Vec::new();
            for _ in 0..3 {
                let (cell, worker) = (cell.clone(), worker.clone());
                handles.push(thread::spawn(move || {
                    if lifecycle::claim(&*cell) {
                        // The pool runs the job on another thread.
                        thread::spawn(worker).join().unwrap();
                    }
                }));
            }
            {
                let (cell, t, dir) = (cell.clone(), t.clone(), dir.clone());
                handles.push(thread::spawn(move || {
                    thread::yield_now();
                    lifecycle::void(&*cell, lifecycle::Void::Stale);
                    // The agent's INVALIDATE handler, later, on the ring consumer.
                    thread::yield_now();
                    lifecycle::invalidate_placed(&*cell);
                    states::drop_object(&t, 0, SIZE, || dir.unlink("obj"));
                    check_usage(&t);
                }));
            }
            {
                let (cell, stale_seen, done) = (cell.clone(), stale_seen.clone(), done.clone());
                let n = handles.len();
                handles.push(thread::spawn(move || {
                    while done.load(Ordering::Acquire) < n {
                        let s = cell.load().state();
                        if s == State::Stale {
                            stale_seen.store(1, Ordering::Release);
                        }
                        if stale_seen.load(Ordering::Acquire) == 1 {
                            assert_ne!(s, State::Placed, "PLACED after STALE");
                        }
                        thread::yield_now();
                    }
                }));
            }
            let observer = handles.pop().unwrap();
            for h in handles {
                h.join().unwrap();
                done.fetch_add(1, Ordering::AcqRel);
            }
            observer.join().unwrap();

            // The client's invalidation always happens, so the entry ends STALE, with no
            // object, no temporary file, and no bytes charged.
            assert_eq!(cell.load().state(), State::Stale);
            assert!(!dir.exists("obj") && !dir.exists("tmp"));
            let u = &t.usage()[0];
            assert_eq!(
                (u.used, u.reserved),
                (0, 0),
                "space leaked or over-released"
            );
            assert!(copies.load(Ordering::Acquire) <= 1);
        },
        ITERATIONS,
    );
}

/// One entry's validation bits over Shuttle's atomics, and how many times its source was asked.
struct ModelBits {
    validated: Arc<AtomicU64>,
    checking: Arc<AtomicU64>,
}

impl lifecycle::CheckBits for ModelBits {
    fn validated(&self) -> bool {
        self.validated.load(Ordering::Acquire) != 0
    }
    fn try_claim(&self) -> bool {
        self.checking.fetch_or(1, Ordering::AcqRel) == 0
    }
    fn release(&self) {
        self.checking.store(0, Ordering::Release);
    }
    fn apply(&self, v: lifecycle::Verdict) -> bool {
        let same = v == lifecycle::Verdict::Same;
        if same {
            self.validated.store(1, Ordering::Release);
        }
        same
    }
}

/// The program (two threads) and two validator threads reach one unchecked entry at once,
/// through the production claim (`lifecycle::claim_check_of`): the source is asked exactly
/// once, and every party ends up seeing the entry validated. (Waits are unbounded here; in
/// production a waiter gives up after its bound and asks itself.)
#[test]
fn an_entry_is_checked_once_however_parties_race() {
    shuttle::check_random(
        || {
            let validated = Arc::new(AtomicU64::new(0));
            let checking = Arc::new(AtomicU64::new(0));
            let asked = Arc::new(AtomicUsize::new(0));
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let (validated, checking, asked) =
                        (validated.clone(), checking.clone(), asked.clone());
                    thread::spawn(move || {
                        let bits = ModelBits {
                            validated: validated.clone(),
                            checking: checking.clone(),
                        };
                        match lifecycle::claim_check_of(bits) {
                            lifecycle::Check::Validated => {}
                            lifecycle::Check::Mine(claim) => {
                                asked.fetch_add(1, Ordering::AcqRel);
                                assert!(claim.finish(lifecycle::Verdict::Same));
                            }
                            lifecycle::Check::Busy => {
                                while checking.load(Ordering::Acquire) != 0 {
                                    thread::yield_now();
                                }
                            }
                        }
                        assert_eq!(validated.load(Ordering::Acquire), 1, "seen unvalidated");
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(asked.load(Ordering::Acquire), 1, "the source asked twice");
            assert_eq!(checking.load(Ordering::Acquire), 0, "a claim left behind");
        },
        ITERATIONS,
    );
}
