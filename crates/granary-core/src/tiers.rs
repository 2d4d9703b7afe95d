//! Capacity accounting of the local tiers.
//!
//! Each source has its own ordered `Tiers` (fastest first), but a tier *directory* has exactly one
//! `Tier` per agent: the agent's `TierRegistry` hands out the same `Arc<Tier>` to every source
//! that names that directory, so its counter stays the only authority over how many bytes it may
//! hold, and many sources, processes and workers never over-fill it together. Space
//! is *reserved* before a byte is written (rounded up to the tier's block size) and the
//! reservation is either committed (the copy was renamed into place) or released by `Drop` (any
//! failure path), so an error can never leak capacity.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
// Through the `sync` shim so `tests/shuttle.rs` can explore interleavings of the accounting.
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// A tier as configured: where its cache lives and how much it may hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSpec {
    pub path: PathBuf,
    pub capacity: u64,
    pub block_size: u64,
    /// The capacity was not asked for (90 % of the free space when the job started): it never
    /// disagrees with the capacity the agent already has for the directory.
    #[serde(default)]
    pub default_capacity: bool,
    /// A staging tier (cluster mode, `granary serve --staging`): copies of files another node
    /// holds, fetched from it when the program opens them. The placement policy never chooses
    /// it; its oldest copies make room for new ones. Staging tiers come after the others.
    #[serde(default)]
    pub staging: bool,
}

pub const DEFAULT_BLOCK_SIZE: u64 = 4096;

#[derive(Debug)]
pub struct Tier {
    /// As first declared; the capacity in force is `capacity`.
    pub spec: TierSpec,
    /// Bytes it may hold: `spec.capacity`, or what a job declared later while no job used it.
    capacity: AtomicU64,
    /// Reserved plus committed bytes; never exceeds `capacity` (unless it was lowered).
    used: AtomicU64,
    committed: AtomicU64,
    /// A write to the tier failed with ENOSPC or EIO although the accounting had room (the file
    /// system is smaller or fuller than configured, or failing): no new reservations until a
    /// committed copy is released (or the agent restarts).
    full: AtomicBool,
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

/// One source's tiers, fastest first. Indices are this source's tier numbers (the table's
/// `SLOT_TIER0 + t`); the `Tier`s behind them may be shared with other sources.
#[derive(Debug)]
pub struct Tiers {
    tiers: Vec<Arc<Tier>>,
    /// This source's directory in tier `t` was removed or renamed while in use (`mark_gone`):
    /// no more copies go there. Per source: another source's directory in the same tier may
    /// be intact. A new walk starts from fresh `Tiers`.
    gone: Vec<AtomicBool>,
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

    /// The reservation as plain numbers (tier, charge), still held: for a holder that keeps the
    /// `Tiers` itself and outlives any borrow of it (a copy received on one thread and finished
    /// on another). `Tiers::resume` on the same tiers makes it a `Reservation` again; until
    /// then nothing releases it.
    pub(crate) fn set_apart(self) -> (usize, u64) {
        let held = (self.tier, self.charge);
        std::mem::forget(self);
        held
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.tiers.tiers[self.tier]
            .used
            .fetch_sub(self.charge, Ordering::AcqRel);
    }
}

impl Tier {
    /// A tier with nothing charged yet (a block size of 0 means the default).
    pub fn new(mut spec: TierSpec) -> Tier {
        if spec.block_size == 0 {
            spec.block_size = DEFAULT_BLOCK_SIZE;
        }
        Tier {
            capacity: AtomicU64::new(spec.capacity),
            spec,
            used: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            full: AtomicBool::new(false),
        }
    }
}

impl Tiers {
    /// Tiers of their own, shared with nobody (tests, tools).
    pub fn new(specs: Vec<TierSpec>) -> Tiers {
        Tiers::from_shared(specs.into_iter().map(|s| Arc::new(Tier::new(s))).collect())
    }

    /// Tiers over existing `Tier`s, normally from a `TierRegistry`.
    pub fn from_shared(tiers: Vec<Arc<Tier>>) -> Tiers {
        let gone = tiers.iter().map(|_| AtomicBool::new(false)).collect();
        Tiers { tiers, gone }
    }

    /// True if tier `t` here is the very same accounting object as `other` (not merely the
    /// same path).
    pub fn shares(&self, t: usize, other: &Arc<Tier>) -> bool {
        self.tiers.get(t).is_some_and(|x| Arc::ptr_eq(x, other))
    }

    pub fn len(&self) -> usize {
        self.tiers.len()
    }

    /// The tiers the placement policy chooses from: those before the first staging tier.
    pub fn placeable(&self) -> usize {
        self.tiers
            .iter()
            .position(|t| t.spec.staging)
            .unwrap_or(self.tiers.len())
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
        if t.full.load(Ordering::Acquire) || self.gone[tier].load(Ordering::Acquire) {
            return None;
        }
        let charge = self.charge(tier, bytes);
        let mut cur = t.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(charge)?;
            if next > t.capacity.load(Ordering::Acquire) {
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

    /// A reservation `Reservation::set_apart` made of one of these tiers, held again.
    pub(crate) fn resume(&self, (tier, charge): (usize, u64)) -> Reservation<'_> {
        Reservation {
            tiers: self,
            tier,
            charge,
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
        if charge > 0 {
            // Space came back: the file system may take new copies again.
            t.full.store(false, Ordering::Release);
        }
    }

    /// Marks `tier` full after a write failed (ENOSPC, EIO): `reserve` refuses it until a copy is
    /// released. True if it was not marked already (the caller logs once).
    pub fn mark_full(&self, tier: usize) -> bool {
        self.tiers
            .get(tier)
            .is_some_and(|t| !t.full.swap(true, Ordering::AcqRel))
    }

    /// Marks this source's directory in `tier` as gone: `reserve` refuses it from now on. True
    /// if it was not marked already (the caller says so once).
    pub fn mark_gone(&self, tier: usize) -> bool {
        self.gone
            .get(tier)
            .is_some_and(|g| !g.swap(true, Ordering::AcqRel))
    }

    pub fn is_gone(&self, tier: usize) -> bool {
        self.gone
            .get(tier)
            .is_some_and(|g| g.load(Ordering::Acquire))
    }

    pub fn is_full(&self, tier: usize) -> bool {
        self.tiers
            .get(tier)
            .is_some_and(|t| t.full.load(Ordering::Acquire))
    }

    pub fn usage(&self) -> Vec<TierUsage> {
        self.tiers
            .iter()
            .map(|t| {
                let committed = t.committed.load(Ordering::Acquire);
                let used = t.used.load(Ordering::Acquire);
                TierUsage {
                    path: t.spec.path.clone(),
                    capacity: t.capacity.load(Ordering::Acquire),
                    block_size: t.spec.block_size,
                    used: committed,
                    reserved: used.saturating_sub(committed),
                }
            })
            .collect()
    }
}

/// The agent's tiers by canonical directory: the first source to name a directory creates its
/// `Tier` (its capacity and block size win); later sources naming the same directory, under any
/// spelling, get the same `Tier`, so the directory has one capacity counter. Entries live as long
/// as the agent: a source that stops using a tier still holds charges on it until its table is
/// retired, so forgetting or replacing a `Tier` early would split the authority.
#[derive(Debug, Default)]
pub struct TierRegistry {
    tiers: Mutex<HashMap<PathBuf, Arc<Tier>>>,
    /// Conflict notes already given (each is said once).
    noted: Mutex<std::collections::HashSet<String>>,
}

impl TierRegistry {
    /// The key a directory is registered under: its canonical path (symlinks resolved), or the
    /// path as given if it cannot be resolved (it does not exist yet).
    pub fn key(path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
    }

    /// The registered tier of this directory, if any.
    pub fn get(&self, path: &Path) -> Option<Arc<Tier>> {
        self.lock().get(&Self::key(path)).cloned()
    }

    /// `specs` as `Tiers`, registering directories not seen before. A directory already known
    /// with another capacity takes the asked one when `in_use` says no attached job uses it
    /// (its copies stay; a smaller capacity only stops new ones); otherwise it keeps its
    /// capacity, and the second value says so — once per directory and asked capacity. Block
    /// sizes never change (every copy is charged in them). A default capacity (not asked for)
    /// never disagrees.
    pub fn resolve(
        &self,
        specs: &[TierSpec],
        in_use: impl Fn(&Arc<Tier>) -> bool,
    ) -> (Tiers, Vec<String>) {
        let mut map = self.lock();
        let mut notes = Vec::new();
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            let t = map
                .entry(Self::key(&spec.path))
                .or_insert_with(|| Arc::new(Tier::new(spec.clone())))
                .clone();
            let asked = spec.capacity;
            let now = t.capacity.load(Ordering::Acquire);
            if !spec.default_capacity && asked != now && !in_use(&t) {
                tracing::info!(
                    "tier {}: capacity {asked} bytes from now on (was {now})",
                    spec.path.display()
                );
                t.capacity.store(asked, Ordering::Release);
            }
            if let Some(n) = conflict(&t, spec).filter(|n| self.first_time(n)) {
                notes.push(n);
            }
            out.push(t);
        }
        (Tiers::from_shared(out), notes)
    }

    /// The conflicts `resolve` would report for `specs` (each said once), registering nothing.
    pub fn conflicts(&self, specs: &[TierSpec]) -> Vec<String> {
        let map = self.lock();
        specs
            .iter()
            .filter_map(|s| conflict(map.get(&Self::key(&s.path))?, s))
            .filter(|n| self.first_time(n))
            .collect()
    }

    /// True the first time `note` is given.
    fn first_time(&self, note: &str) -> bool {
        self.noted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(note.to_string())
    }

    /// Every registered tier's usage, ordered by path.
    pub fn usage(&self) -> Vec<TierUsage> {
        let tiers: Vec<Arc<Tier>> = self.lock().values().cloned().collect();
        let mut u = Tiers::from_shared(tiers).usage();
        u.sort_by(|a, b| a.path.cmp(&b.path));
        u
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, Arc<Tier>>> {
        self.tiers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn conflict(t: &Tier, asked: &TierSpec) -> Option<String> {
    let block = if asked.block_size == 0 {
        DEFAULT_BLOCK_SIZE
    } else {
        asked.block_size
    };
    let capacity = t.capacity.load(Ordering::Acquire);
    let cap_differs = !asked.default_capacity && capacity != asked.capacity;
    (cap_differs || t.spec.block_size != block).then(|| {
        format!(
            "tier {} is in use by another job with capacity {} bytes (block {}), not {} (block \
             {}); keeping it until no job uses it",
            asked.path.display(),
            capacity,
            t.spec.block_size,
            asked.capacity,
            block
        )
    })
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
                    ..Default::default()
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
        assert!(t.mark_gone(0) && !t.mark_gone(0), "said once");
        assert!(
            t.reserve(0, 1).is_none(),
            "a gone directory takes no copies"
        );
        assert!(t.is_gone(0));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Reserve(usize, u64),
        Commit(usize),
        Drop(usize),
        Release(usize),
        MarkFull(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..3, 0u64..50_000).prop_map(|(t, b)| Op::Reserve(t, b)),
            (0usize..16).prop_map(Op::Commit),
            (0usize..16).prop_map(Op::Drop),
            (0usize..16).prop_map(Op::Release),
            (0usize..3).prop_map(Op::MarkFull),
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
            // The model of the full flag: set by a failed write, cleared by a release that
            // gives back space.
            let mut full = [false; 3];
            for op in ops {
                match op {
                    Op::Reserve(tier, bytes) => {
                        let charge = bytes.div_ceil(block) * block;
                        let in_use: u64 = open.iter().filter(|r| r.tier() == tier).map(|r| r.charge()).sum::<u64>()
                            + committed.iter().filter(|c| c.0 == tier).map(|c| c.1).sum::<u64>();
                        let fits = in_use + charge <= caps[tier] && !full[tier];
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
                        if c > 0 {
                            full[tier] = false;
                        }
                    }
                    Op::MarkFull(tier) => {
                        prop_assert_eq!(t.mark_full(tier), !full[tier], "newly marked");
                        full[tier] = true;
                    }
                    _ => {}
                }
                for (tier, u) in t.usage().iter().enumerate() {
                    let model_committed: u64 = committed.iter().filter(|c| c.0 == tier).map(|c| c.1).sum();
                    let model_reserved: u64 = open.iter().filter(|r| r.tier() == tier).map(|r| r.charge()).sum();
                    prop_assert_eq!(u.used, model_committed);
                    prop_assert_eq!(u.reserved, model_reserved);
                    prop_assert!(u.used + u.reserved <= u.capacity);
                    prop_assert_eq!(t.is_full(tier), full[tier]);
                }
            }
        }
    }

    #[test]
    fn registry_shares_one_counter_per_directory() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::os::unix::fs::symlink(&a, d.path().join("link")).unwrap();
        let spec = |p: PathBuf, capacity| TierSpec {
            path: p,
            capacity,
            block_size: 4096,
            ..Default::default()
        };
        let reg = TierRegistry::default();
        let in_use = |_: &Arc<Tier>| true;
        let (one, notes) = reg.resolve(&[spec(a.clone(), 8192), spec(b.clone(), 1 << 20)], in_use);
        assert!(notes.is_empty(), "{notes:?}");
        // Another source names `a` through a symlink, with another capacity, and `b` first,
        // while a job uses `a`: the capacity in force stays, and that is said once.
        let other = [
            spec(b.clone(), 1 << 20),
            spec(d.path().join("link"), 1 << 30),
        ];
        let (two, notes) = reg.resolve(&other, in_use);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("8192"), "{notes:?}");
        assert!(reg.resolve(&other, in_use).1.is_empty(), "said once");
        assert_eq!(two.usage()[1].capacity, 8192, "kept while in use");
        assert!(two.shares(1, &reg.get(&a).unwrap()));
        assert!(one.shares(0, &reg.get(&a).unwrap()));
        let r = one.reserve(0, 4096).unwrap();
        let r2 = two.reserve(1, 4096).unwrap();
        assert!(
            two.reserve(1, 1).is_none(),
            "the two sources share a's 8192 bytes"
        );
        assert!(one.reserve(0, 1).is_none());
        drop(r);
        assert!(two.reserve(1, 1).is_some());
        drop(r2);
        assert_eq!(reg.usage().len(), 2);
        assert_eq!(
            reg.conflicts(&[spec(b.clone(), 1 << 20)]),
            Vec::<String>::new()
        );
        assert_eq!(reg.conflicts(&[spec(b.clone(), 1)]).len(), 1);
        assert!(reg.conflicts(&[spec(b.clone(), 1)]).is_empty(), "said once");
        // A default capacity never disagrees.
        let defaulted = TierSpec {
            default_capacity: true,
            ..spec(b.clone(), 7)
        };
        assert!(reg.conflicts(std::slice::from_ref(&defaulted)).is_empty());
        assert!(reg.resolve(&[defaulted], |_| false).1.is_empty());
        assert_eq!(reg.usage()[1].capacity, 1 << 20);
        // Nobody uses `a` any more: the asked capacity is applied.
        let (three, notes) = reg.resolve(&[spec(a.clone(), 1 << 16)], |_| false);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(three.usage()[0].capacity, 1 << 16);
        assert!(
            one.reserve(0, 60_000).is_some(),
            "one shares the new capacity"
        );
    }

    #[test]
    fn concurrent_reservations_never_overfill() {
        let t = crate::sync::Arc::new(tiers(&[1 << 20], 4096));
        let granted = crate::sync::atomic::AtomicU64::new(0);
        crate::sync::thread::scope(|s| {
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
