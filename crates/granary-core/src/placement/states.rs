//! The state transitions that decide who copies a file and who gives its space back.
//!
//! Several parties move an entry's state word at once: clients (the preload library marks an
//! entry STALE when it sees the source change), the ring consumer (OPEN_UNPLACED, INVALIDATE,
//! DAMAGED), the placement workers, and table retirement. Each transition here is one
//! compare-and-swap from an exact expected word, so exactly one party wins each step:
//!
//! ```text
//!   UNPLACED ──claim──▶ QUEUED ──begin──▶ PLACING ──finish──▶ PLACED
//!       ▲                 │ unqueue          │ abandon            │ withdraw (DAMAGED)
//!       └─────────────────┘                  ▼                    ▼
//!                                   SOURCE_ONLY / STALE        UNPLACED
//!   any ──client store──▶ STALE    (nothing ever moves STALE on: no CAS starts from it)
//! ```
//!
//! The logic is written against `StateCell` so `tests/shuttle.rs` can run it over the `sync`
//! shim's atomics and explore interleavings; the agent runs it over the shared table.

use std::io;

use granary_shm::{state, Table};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::tiers::{Reservation, Tiers};

/// One entry's state word.
pub trait StateCell {
    fn load(&self) -> u64;
    /// Compare-and-swap; false if the word was not `from`.
    fn cas(&self, from: u64, to: u64) -> bool;
    fn store(&self, word: u64);
}

/// An entry of a published table.
#[derive(Clone, Copy)]
pub struct EntryState<'a> {
    pub table: &'a Table,
    pub idx: u32,
}

impl StateCell for EntryState<'_> {
    fn load(&self) -> u64 {
        self.table.state(self.idx)
    }
    fn cas(&self, from: u64, to: u64) -> bool {
        self.table.swap_state(self.idx, from, to)
    }
    fn store(&self, word: u64) {
        self.table.set_state(self.idx, word)
    }
}

impl StateCell for AtomicU64 {
    fn load(&self) -> u64 {
        AtomicU64::load(self, Ordering::Acquire)
    }
    fn cas(&self, from: u64, to: u64) -> bool {
        self.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    fn store(&self, word: u64) {
        AtomicU64::store(self, word, Ordering::Release)
    }
}

const fn w(s: u8) -> u64 {
    state::word(s, 0)
}

/// OPEN_UNPLACED: true if the caller is the one to enqueue the (single) job for this entry.
pub fn claim(c: &impl StateCell) -> bool {
    c.cas(w(state::UNPLACED), w(state::QUEUED))
}

/// A worker takes its job: false if the entry moved meanwhile (invalidated): nothing to do.
pub fn begin(c: &impl StateCell) -> bool {
    c.cas(w(state::QUEUED), w(state::PLACING))
}

/// A queued job is dropped (its table retired): the entry may be requested again.
pub fn unqueue(c: &impl StateCell) -> bool {
    c.cas(w(state::QUEUED), w(state::UNPLACED))
}

/// The worker gives up (`to` = SOURCE_ONLY, STALE). False if a client invalidated meanwhile.
pub fn abandon(c: &impl StateCell, to: u8) -> bool {
    c.cas(w(state::PLACING), w(to))
}

/// What the preload library does when it sees the source differ from the catalog: a plain
/// store, whatever the state was (it cannot wait for anyone).
pub fn invalidate_by_client(c: &impl StateCell) {
    c.store(w(state::STALE))
}

/// The agent's INVALIDATE handler: a placed copy is withdrawn. A CAS rather than "if PLACED then
/// store", so it can never overwrite a state someone else set in between.
pub fn invalidate_by_agent(c: &impl StateCell) -> bool {
    let cur = c.load();
    state::state_of(cur) == state::PLACED && c.cas(cur, w(state::STALE))
}

/// DAMAGED: a placed copy on a tier turned out wrong; only the party that moves `placed` (the
/// word it inspected) back to UNPLACED deletes the copy and releases its space.
pub fn withdraw(c: &impl StateCell, placed: u64) -> bool {
    state::state_of(placed) == state::PLACED && c.cas(placed, w(state::UNPLACED))
}

/// How a finished copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// PLACED on the reservation's tier; the space stays charged (`charge` bytes).
    Placed { charge: u64 },
    /// Renaming into place failed: nothing is charged; the caller may try another tier.
    RenameFailed,
    /// A client invalidated the entry while we copied: the copy is void and its space is back.
    Invalidated,
}

/// Publishes a complete copy: `rename` moves it from its temporary name to the object name,
/// `unlink` deletes the object name (true if it removed a file).
///
/// Ordering: the reservation is committed *before* the rename, because from the moment the
/// object name exists an INVALIDATE handler may unlink it and release its charge as a committed
/// one; committing afterwards would let that release run first and drive the committed counter
/// below zero. Whoever unlinks the object (this function or the handler; the file system lets
/// only one succeed) releases its charge, so it is given back exactly once.
pub fn finish(
    c: &impl StateCell,
    tiers: &Tiers,
    res: Reservation<'_>,
    rename: impl FnOnce() -> io::Result<()>,
    unlink: impl FnOnce() -> bool,
) -> Finish {
    let tier = res.tier();
    let charge = res.commit();
    if rename().is_err() {
        tiers.release(tier, charge);
        return Finish::RenameFailed;
    }
    // The worker announced `PLACING | tier` (a large file's part names its tier); any PLACING
    // word is ours, anything else means a client took the entry away.
    let cur = c.load();
    if state::state_of(cur) == state::PLACING && c.cas(cur, state::word(state::PLACED, tier as u8))
    {
        return Finish::Placed { charge };
    }
    if unlink() {
        tiers.release(tier, charge);
    }
    Finish::Invalidated
}

/// Drops an entry's object from one tier (INVALIDATE, eviction): the space comes back only if
/// this call removed the file, so racing with `finish` releases it once.
pub fn drop_object(tiers: &Tiers, tier: usize, size: u64, unlink: impl FnOnce() -> bool) -> bool {
    let removed = unlink();
    if removed {
        tiers.release(tier, tiers.charge(tier, size));
    }
    removed
}
