//! Capacity accounting of the local tiers.
//!
//! One `Tiers` per agent is the only authority over how many bytes each tier may hold, shared by
//! every source and placement worker, so many processes and workers never over-fill a tier. Space
//! is *reserved* before a byte is written (rounded up to the tier's block size) and the
//! reservation is either committed (the copy was renamed into place) or released by `Drop` (any
//! failure path), so an error can never leak capacity.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// A tier as configured: where its cache lives and how much it may hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSpec {
    pub path: PathBuf,
    pub capacity: u64,
    pub block_size: u64,
}

pub const DEFAULT_BLOCK_SIZE: u64 = 4096;

#[derive(Debug)]
pub struct Tier {
    pub spec: TierSpec,
    /// Reserved plus committed bytes; never exceeds `spec.capacity`.
    used: AtomicU64,
    committed: AtomicU64,
}

/// A snapshot for reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierUsage {
    pub path: PathBuf,
    pub capacity: u64,
    pub block_size: u64,
    /// Bytes of complete copies (rounded to blocks).
    pub used: u64,
    /// Bytes reserved by copies in progress.
    pub reserved: u64,
}

#[derive(Debug)]
pub struct Tiers {
    tiers: Vec<Tier>,
}

/// Space held for one copy in progress. Dropping it releases the space; `commit` keeps it.
#[must_use = "dropping a reservation releases it"]
#[derive(Debug)]
pub struct Reservation<'a> {
    tiers: &'a Tiers,
    tier: usize,
    charge: u64,
}

impl Reservation<'_> {
    pub fn tier(&self) -> usize {
        self.tier
    }
    /// Bytes charged (the request rounded up to blocks).
    pub fn charge(&self) -> u64 {
        self.charge
    }
    /// The copy is in place: the space stays used until `Tiers::release`. Returns the charge.
    pub fn commit(self) -> u64 {
        let charge = self.charge;
        self.tiers.tiers[self.tier]
            .committed
            .fetch_add(charge, Ordering::AcqRel);
        std::mem::forget(self);
        charge
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.tiers.tiers[self.tier]
            .used
            .fetch_sub(self.charge, Ordering::AcqRel);
    }
}

impl Tiers {
    pub fn new(specs: Vec<TierSpec>) -> Tiers {
        Tiers {
            tiers: specs
                .into_iter()
                .map(|mut spec| {
                    if spec.block_size == 0 {
                        spec.block_size = DEFAULT_BLOCK_SIZE;
                    }
                    Tier {
                        spec,
                        used: AtomicU64::new(0),
                        committed: AtomicU64::new(0),
                    }
                })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    pub fn spec(&self, tier: usize) -> &TierSpec {
        &self.tiers[tier].spec
    }

    pub fn specs(&self) -> Vec<TierSpec> {
        self.tiers.iter().map(|t| t.spec.clone()).collect()
    }

    /// What a file of `bytes` costs on `tier`: whole blocks (an empty file costs nothing).
    pub fn charge(&self, tier: usize, bytes: u64) -> u64 {
        let b = self.tiers[tier].spec.block_size;
        bytes.div_ceil(b).saturating_mul(b)
    }

    /// Reserves room for `bytes` on `tier`, or `None` if it would exceed the capacity.
    pub fn reserve(&self, tier: usize, bytes: u64) -> Option<Reservation<'_>> {
        let t = self.tiers.get(tier)?;
        let charge = self.charge(tier, bytes);
        let mut cur = t.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(charge)?;
            if next > t.spec.capacity {
                return None;
            }
            match t
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Reservation {
                        tiers: self,
                        tier,
                        charge,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Accounts an existing copy (reused from an earlier run); false if it does not fit.
    pub fn adopt(&self, tier: usize, bytes: u64) -> bool {
        self.reserve(tier, bytes).map(|r| r.commit()).is_some()
    }

    /// Gives back the space of a committed copy that was deleted (`charge` as `commit` returned).
    pub fn release(&self, tier: usize, charge: u64) {
        let t = &self.tiers[tier];
        t.committed.fetch_sub(charge, Ordering::AcqRel);
        t.used.fetch_sub(charge, Ordering::AcqRel);
    }

    pub fn usage(&self) -> Vec<TierUsage> {
        self.tiers
            .iter()
            .map(|t| {
                let committed = t.committed.load(Ordering::Acquire);
                let used = t.used.load(Ordering::Acquire);
                TierUsage {
                    path: t.spec.path.clone(),
                    capacity: t.spec.capacity,
                    block_size: t.spec.block_size,
                    used: committed,
                    reserved: used.saturating_sub(committed),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tiers(caps: &[u64], block: u64) -> Tiers {
        Tiers::new(
            caps.iter()
                .enumerate()
                .map(|(i, &c)| TierSpec {
                    path: PathBuf::from(format!("/t{i}")),
                    capacity: c,
                    block_size: block,
                })
                .collect(),
        )
    }

    #[test]
    fn rounding_and_limits() {
        let t = tiers(&[14_000], 4096);
        let a = t.reserve(0, 1).unwrap();
        assert_eq!(a.charge(), 4096);
        let b = t.reserve(0, 4097).unwrap();
        assert_eq!(b.charge(), 8192);
        assert!(t.reserve(0, 4096).is_none(), "would exceed capacity");
        drop(a);
        assert_eq!(t.reserve(0, 0).unwrap().charge(), 0);
        let c = b.commit();
        assert_eq!(t.usage()[0].used, 8192);
        t.release(0, c);
        assert_eq!(t.usage()[0].used, 0);
        assert_eq!(t.usage()[0].reserved, 0);
        assert!(t.reserve(1, 1).is_none(), "no such tier");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Reserve(usize, u64),
        Commit(usize),
        Drop(usize),
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..3, 0u64..50_000).prop_map(|(t, b)| Op::Reserve(t, b)),
            (0usize..16).prop_map(Op::Commit),
            (0usize..16).prop_map(Op::Drop),
            (0usize..16).prop_map(Op::Release),
        ]
    }

    proptest! {
        /// The accounting against a model: a list of outstanding reservations and committed
        /// charges per tier. Used never exceeds capacity and always equals the model's sums.
        #[test]
        fn matches_model(caps in proptest::collection::vec(0u64..200_000, 3),
                         block in prop_oneof![Just(1u64), Just(512), Just(4096)],
                         ops in proptest::collection::vec(op(), 0..200)) {
            let t = tiers(&caps, block);
            let mut open: Vec<Reservation> = Vec::new();
            let mut committed: Vec<(usize, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Reserve(tier, bytes) => {
                        let charge = bytes.div_ceil(block) * block;
                        let in_use: u64 = open.iter().filter(|r| r.tier() == tier).map(|r| r.charge()).sum::<u64>()
                            + committed.iter().filter(|c| c.0 == tier).map(|c| c.1).sum::<u64>();
                        let fits = in_use + charge <= caps[tier];
                        match t.reserve(tier, bytes) {
                            Some(r) => { prop_assert!(fits); prop_assert_eq!(r.charge(), charge); open.push(r) }
                            None => prop_assert!(!fits),
                        }
                    }
                    Op::Commit(i) if !open.is_empty() => {
                        let r = open.swap_remove(i % open.len());
                        let tier = r.tier();
                        committed.push((tier, r.commit()));
                    }
                    Op::Drop(i) if !open.is_empty() => { drop(open.swap_remove(i % open.len())); }
                    Op::Release(i) if !committed.is_empty() => {
                        let (tier, c) = committed.swap_remove(i % committed.len());
                        t.release(tier, c);
                    }
                    _ => {}
                }
                for (tier, u) in t.usage().iter().enumerate() {
                    let model_committed: u64 = committed.iter().filter(|c| c.0 == tier).map(|c| c.1).sum();
                    let model_reserved: u64 = open.iter().filter(|r| r.tier() == tier).map(|r| r.charge()).sum();
                    prop_assert_eq!(u.used, model_committed);
                    prop_assert_eq!(u.reserved, model_reserved);
                    prop_assert!(u.used + u.reserved <= u.capacity);
                }
            }
        }
    }

    #[test]
    fn concurrent_reservations_never_overfill() {
        let t = std::sync::Arc::new(tiers(&[1 << 20], 4096));
        let granted = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for i in 0..8u64 {
                let t = &t;
                let granted = &granted;
                s.spawn(move || {
                    for j in 0..2000u64 {
                        let size = (i * 7919 + j * 104_729) % 60_000;
                        if let Some(r) = t.reserve(0, size) {
                            let u = t.usage()[0].clone();
                            assert!(u.used + u.reserved <= u.capacity);
                            if j % 3 == 0 {
                                granted.fetch_add(r.commit(), Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        let u = t.usage()[0].clone();
        assert_eq!(u.reserved, 0);
        assert_eq!(u.used, granted.load(Ordering::Relaxed));
        assert!(u.used <= u.capacity);
    }
}
