//! Placement policies against simple models: capacity never exceeded, fill order, and
//! KnownOrder's rule that only files already read this epoch are evicted.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use granary_core::placement::{reserve_first, FillHighestFirst, KnownOrder, Policy};
use granary_core::tiers::{TierSpec, Tiers};
use proptest::prelude::*;

fn tiers(caps: &[u64]) -> Tiers {
    Tiers::new(
        caps.iter()
            .enumerate()
            .map(|(i, &c)| TierSpec {
                path: PathBuf::from(format!("/t{i}")),
                capacity: c,
                block_size: 1,
                ..Default::default()
            })
            .collect(),
    )
}

proptest! {
    /// Files placed one after another land on the first tier (fastest first) with room for
    /// them, else nowhere; nothing is ever evicted, so a tier's usage only grows.
    #[test]
    fn fill_highest_first_matches_model(caps in proptest::collection::vec(0u64..10_000, 1..4),
                                        sizes in proptest::collection::vec(0u64..3_000, 0..60)) {
        let t = tiers(&caps);
        let mut used = vec![0u64; caps.len()];
        for size in sizes {
            let want = (0..caps.len()).find(|&i| used[i] + size <= caps[i]);
            let got = reserve_first(&FillHighestFirst, &t, size).map(|r| (r.tier(), r.commit()));
            prop_assert_eq!(got.map(|g| g.0), want);
            if let Some((tier, charge)) = got {
                used[tier] += charge;
            }
            prop_assert!(FillHighestFirst.victims(u64::MAX, &|_| true).is_empty());
            for (i, u) in t.usage().iter().enumerate() {
                prop_assert_eq!(u.used, used[i]);
                prop_assert!(u.used <= u.capacity);
            }
        }
    }

    /// A program reads the order for three epochs (every open observed, as OPEN_UNPLACED or
    /// an opened notification would report it); the agent, after each open, places the
    /// policy's prefetch candidates on one tier, evicting the policy's victims when full.
    /// Never over capacity; a victim is always a file read in the current epoch and never one
    /// the prefetch window wants; with a window that fits, every file the program opens after
    /// the first window is already placed once the order is warmed up.
    #[test]
    fn known_order_evicts_only_read_files(sizes in proptest::collection::vec(1u64..1_000, 8..40),
                                          cap_frac in 1u64..4,
                                          jitter in proptest::collection::vec(0usize..3, 120)) {
        known_order_run(&sizes, cap_frac, &jitter)?;
    }
}

/// A case the property found: near the end of an epoch the window wraps to the start of the
/// next, and the first files of the order, read early in this epoch, were evicted to make room
/// for files the program needs after them.
#[test]
fn known_order_keeps_the_wrapped_window() {
    let mut jitter = vec![0; 120];
    jitter[7] = 1;
    jitter[14] = 1;
    jitter[15] = 2;
    known_order_run(&[29, 82, 1, 590, 669, 795, 65, 787, 246], 1, &jitter).unwrap();
}

fn known_order_run(sizes: &[u64], cap_frac: u64, jitter: &[usize]) -> Result<(), TestCaseError> {
    let n = sizes.len();
    let total: u64 = sizes.iter().sum();
    let cap = (total * cap_frac / 4).max(*sizes.iter().max().unwrap());
    let window = cap / 4;
    let order: Vec<(u32, u64)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| (i as u32, s))
        .collect();
    let p = KnownOrder::new(order, window);
    let t = tiers(&[cap]);
    let mut placed: HashSet<u32> = HashSet::new();
    let mut charges = std::collections::HashMap::new();
    let mut step = 0;
    for epoch in 1..=3u64 {
        let mut read: HashSet<u32> = HashSet::new();
        for i in 0..n {
            // DataLoader workers: an open may come a little out of order within the epoch.
            let j = (i + jitter[step % jitter.len()]).min(n - 1);
            step += 1;
            for idx in [j as u32, i as u32] {
                p.observe(idx);
                read.insert(idx);
            }
            prop_assert_eq!(p.state().epoch, epoch);
            let upcoming = p.prefetch(&|e| placed.contains(&e));
            let window_set: HashSet<u32> = upcoming.iter().copied().collect();
            for e in upcoming {
                let size = sizes[e as usize];
                let mut r = t.reserve(0, size);
                if r.is_none() {
                    let victims = p.victims(size, &|e| placed.contains(&e));
                    for v in victims {
                        prop_assert!(
                            read.contains(&v),
                            "evicted {} not read in epoch {}",
                            v,
                            epoch
                        );
                        prop_assert!(!window_set.contains(&v), "evicted {} it wants", v);
                        prop_assert!(placed.remove(&v));
                        t.release(0, charges.remove(&v).unwrap());
                    }
                    r = t.reserve(0, size);
                }
                if let Some(r) = r {
                    charges.insert(e, r.commit());
                    placed.insert(e);
                }
                let u = &t.usage()[0];
                prop_assert!(u.used + u.reserved <= u.capacity);
            }
        }
    }
    Ok(())
}

#[test]
fn known_order_epochs_and_window() {
    let p = KnownOrder::new((0..10).map(|i| (i, 100)).collect(), 250);
    assert_eq!(p.state().epoch, 0);
    // Before any open: the window from the start (two files fit in 250 bytes).
    assert_eq!(p.prefetch(&|_| false), vec![0, 1]);
    p.observe(0);
    p.observe(3);
    p.observe(2); // a straggler: no epoch change
    assert_eq!((p.state().epoch, p.state().pos), (1, Some(3)));
    assert_eq!(p.prefetch(&|e| e == 4), vec![5]);
    // A placed window asks for nothing beyond it (it must never grow to fill the tier).
    assert_eq!(p.prefetch(&|e| e == 4 || e == 5), Vec::<u32>::new());
    // Victims: opened ones, latest first, until the need is met; 1 was never opened.
    assert_eq!(p.victims(150, &|e| e != 2), vec![3, 0]);
    p.observe(9);
    assert_eq!(
        p.prefetch(&|_| false),
        vec![0, 1],
        "wraps into the next epoch"
    );
    p.observe(1); // far behind: the next epoch
    assert_eq!((p.state().epoch, p.state().pos), (2, Some(1)));
    assert_eq!(
        p.victims(10_000, &|_| true),
        vec![1],
        "only this epoch's reads"
    );
}

#[test]
fn listing_relative_absolute_and_unknown() {
    let lookup = |rel: &[u8]| match rel {
        b"a/x.bin" => Some((4, 10)),
        b"b.bin" => Some((7, 20)),
        _ => None,
    };
    let text = "# order\na/x.bin\n\n/pfs/data/b.bin\n./a/x.bin\n/elsewhere/b.bin\nmissing\n";
    let (order, unknown) = KnownOrder::parse_listing(text, Path::new("/pfs/data"), lookup);
    assert_eq!(order, vec![(4, 10), (7, 20), (4, 10)]);
    assert_eq!(unknown, vec!["/elsewhere/b.bin", "missing"]);
    // A repeated entry keeps its first place.
    let p = KnownOrder::new(order, 1000);
    assert_eq!(p.prefetch(&|_| false), vec![4, 7]);
}
