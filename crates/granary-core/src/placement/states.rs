//! The steps of an entry's lifecycle (`granary_shm::lifecycle`) that also move tier space: a
//! finished copy is published with its reservation committed, and an object dropped gives its
//! space back exactly once, whoever unlinks it. The state transitions themselves are the
//! lifecycle module's; these are written against its `Cell` so `tests/shuttle.rs` runs them over
//! Shuttle's atomics, and the agent over the shared table.

use std::io;
use std::os::fd::OwnedFd;

use granary_shm::lifecycle::{self, Cell, EntryCell};
use granary_shm::{object_name, Table};

use super::space::Space;
use crate::tiers::{Reservation, Tiers};

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
    c: &impl Cell,
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
    if lifecycle::complete(c, tier as u8) {
        return Finish::Placed { charge };
    }
    if unlink() {
        tiers.release(tier, charge);
    }
    Finish::Invalidated
}

/// Withdraws entry `idx`'s complete copy (eviction): PLACED → UNPLACED first, so no new client
/// opens it, then `gone(object dir, object name)` takes the file away and its space comes back
/// (`drop_object`). Clients that opened it keep reading their fd. Returns the tier it was on, or
/// `None` if the entry was not PLACED any more.
pub fn withdraw_copy(
    t: &Table,
    space: &Space,
    idx: u32,
    gone: impl FnOnce(&OwnedFd, &[u8]) -> bool,
) -> Option<usize> {
    let w = t.state(idx);
    let e = t.entry(idx)?;
    if !lifecycle::withdraw(&EntryCell { table: t, idx }, w) {
        return None;
    }
    let tier = w.tier() as usize;
    if let Some(dir) = space.dir(tier) {
        let name = object_name(e.object);
        drop_object(&space.tiers, tier, e.stat.size, || gone(dir, &name));
    }
    Some(tier)
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
