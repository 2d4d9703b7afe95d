//! Page-cache residency against a model: `rebalance` keeps resident copies within the budget,
//! moves only what it must, and is stable; admission never overshoots a fixed budget.

use std::cell::{Cell, RefCell};

use granary_core::memlimit::Room;
use granary_core::placement::residency::{
    rebalance, target_for, Budget, Copies, CopyView, Residency, MIN_RESERVE,
};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

/// One table: per entry, its copy (if any) and its transient bit.
#[derive(Debug)]
struct Set {
    copies: Vec<Option<CopyView>>,
    transient: RefCell<Vec<bool>>,
    writes: Cell<usize>,
}

impl Copies for Set {
    fn count(&self) -> u32 {
        self.copies.len() as u32
    }
    fn copy(&self, i: u32) -> Option<CopyView> {
        self.copies[i as usize]
    }
    fn is_transient(&self, i: u32) -> bool {
        self.transient.borrow()[i as usize]
    }
    fn set_transient(&self, i: u32, transient: bool) {
        self.writes.set(self.writes.get() + 1);
        self.transient.borrow_mut()[i as usize] = transient;
    }
}

fn resident(sets: &[Set]) -> u64 {
    sets.iter()
        .flat_map(|s| {
            s.copies
                .iter()
                .zip(s.transient.borrow().iter())
                .filter_map(|(c, t)| c.filter(|_| !t).map(|c| c.size))
                .collect::<Vec<_>>()
        })
        .sum()
}

fn bits(sets: &[Set]) -> Vec<Vec<bool>> {
    sets.iter().map(|s| s.transient.borrow().clone()).collect()
}

fn arb_sets() -> impl Strategy<Value = Vec<Set>> {
    let entry = (0u8..4, 1u64..64, any::<bool>()).prop_map(|(kind, kib, t)| {
        let copy = match kind {
            0 => None,
            1 => Some(CopyView {
                size: kib << 10,
                placed: false,
            }),
            _ => Some(CopyView {
                size: kib << 10,
                placed: true,
            }),
        };
        (copy, t)
    });
    prop::collection::vec(prop::collection::vec(entry, 0..40), 1..4).prop_map(|sets| {
        sets.into_iter()
            .map(|es| Set {
                copies: es.iter().map(|e| e.0).collect(),
                transient: RefCell::new(es.iter().map(|e| e.1).collect()),
                writes: Cell::new(0),
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn rebalance_against_the_model(sets in arb_sets(), target_kib in 0u64..1500,
                                   slack_kib in 0u64..64) {
        let (target, slack) = (target_kib << 10, slack_kib << 10);
        let before = bits(&sets);
        let r0 = resident(&sets);
        let mut dropped = Vec::new();
        let m = rebalance(&sets, target, slack, |k, i| dropped.push((k, i)));
        let after = bits(&sets);
        prop_assert_eq!(m.resident, resident(&sets), "the returned count is the real one");
        let mut demoted = Vec::new();
        let mut promoted = Vec::new();
        for (k, s) in sets.iter().enumerate() {
            for (i, c) in s.copies.iter().enumerate() {
                let (b, a) = (before[k][i], after[k][i]);
                if c.is_none() {
                    prop_assert_eq!(b, a, "an entry without a copy is never touched");
                }
                if !b && a { demoted.push((k, i as u32, c.unwrap())); }
                if b && !a { promoted.push((k, i as u32, c.unwrap())); }
            }
        }
        prop_assert_eq!(m.demoted as usize, demoted.len());
        prop_assert_eq!(m.promoted as usize, promoted.len());
        let want_dropped: Vec<_> = demoted.iter().filter(|d| d.2.placed).map(|d| (d.0, d.1)).collect();
        let mut got = dropped.clone();
        got.sort();
        prop_assert_eq!(got, want_dropped, "pages dropped for exactly the demoted PLACED copies");
        if r0 > target {
            prop_assert!(m.resident <= target, "over budget: demoted down to it");
        }
        if r0 <= target && r0 + slack >= target {
            prop_assert_eq!(&after, &before, "inside the band nothing moves");
        }
        if r0 <= target {
            prop_assert!(demoted.is_empty(), "within budget nothing is demoted");
        }
        prop_assert!(promoted.iter().all(|p| p.2.placed), "only complete copies are promoted");
        // Filled: either inside the band, or every transient complete copy left out does not fit.
        if m.resident + slack < target {
            for (k, s) in sets.iter().enumerate() {
                for (i, c) in s.copies.iter().enumerate() {
                    if let Some(c) = c {
                        if c.placed && after[k][i] {
                            prop_assert!(m.resident + c.size > target - slack,
                                "a copy that fits was left transient");
                        }
                    }
                }
            }
        }
        // Stable: the same budget again changes nothing.
        for s in &sets { s.writes.set(0); }
        let again = rebalance(&sets, target, slack, |_, _| panic!("nothing to drop"));
        prop_assert_eq!(again.demoted + again.promoted, 0);
        prop_assert!(sets.iter().all(|s| s.writes.get() == 0));
        prop_assert_eq!(again.resident, m.resident);
    }

    #[test]
    fn admission_never_overshoots_a_fixed_budget(budget_kib in 0u64..4096,
                                                  sizes in prop::collection::vec(1u64..512, 0..64)) {
        let r = Residency::new(Budget::Fixed(budget_kib << 10));
        let mut model = 0u64;
        for (n, kib) in sizes.iter().enumerate() {
            let size = kib << 10;
            let ok = r.admit(size);
            prop_assert_eq!(ok, model + size <= budget_kib << 10);
            if ok { model += size; }
            if n % 5 == 4 && ok {
                r.forget(size);
                model -= size;
            }
            prop_assert_eq!(r.resident(), model);
        }
    }
}

#[test]
fn demotion_runs_from_the_end_and_promotion_from_the_start() {
    let placed = |kib: u64| {
        Some(CopyView {
            size: kib << 10,
            placed: true,
        })
    };
    let set = Set {
        copies: vec![placed(10), None, placed(10), placed(10), placed(10)],
        transient: RefCell::new(vec![false; 5]),
        writes: Cell::new(0),
    };
    let sets = [set];
    let m = rebalance(&sets, 25 << 10, 0, |_, _| {});
    assert_eq!((m.resident, m.demoted), (20 << 10, 2));
    assert_eq!(bits(&sets)[0], [false, false, false, true, true]);
    let m = rebalance(&sets, 100 << 10, 10 << 10, |_, _| {});
    assert_eq!((m.resident, m.promoted), (40 << 10, 2));
    assert_eq!(bits(&sets)[0], [false; 5]);
}

#[test]
fn off_and_fixed_budgets() {
    let off = Residency::new(Budget::Off);
    assert_eq!(off.target(), u64::MAX);
    assert!(
        off.admit(u64::MAX / 2) && off.admit(u64::MAX / 2),
        "no limit, ever"
    );
    let fixed = Residency::new(Budget::Fixed(3 * MIB));
    assert_eq!(fixed.target(), 3 * MIB);
    assert!(fixed.admit(2 * MIB));
    assert!(!fixed.admit(2 * MIB));
    assert!(fixed.admit(MIB));
}

#[test]
fn the_target_leaves_a_reserve() {
    // The benchmark's 256 MiB cgroup with ~20 MB that is not file pages.
    let room = Room {
        limit: 256 * MIB,
        non_file: 20 * MIB,
    };
    assert_eq!(target_for(room), 236 * MIB - MIN_RESERVE);
    // A node: 1/16 of the room stays free for everything else.
    let node = Room {
        limit: 256 << 30,
        non_file: 16 << 30,
    };
    assert_eq!(target_for(node), (240 << 30) - (15 << 30));
    // Nothing left for files: nothing resident.
    let full = Room {
        limit: 64 * MIB,
        non_file: 80 * MIB,
    };
    assert_eq!(target_for(full), 0);
}

#[test]
fn an_auto_budget_measures_this_process() {
    // Wherever the tests run there is some memory: the target is a real number below it.
    let r = Residency::new(Budget::Auto);
    let t = r.target();
    assert!(t < u64::MAX, "measured");
    assert!(r.room() > 0 && t <= r.room());
}
