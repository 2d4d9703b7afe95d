//! A client ahead of the agent's background validation checks an entry against the source
//! itself before the catalog answers for it (`lifecycle`): one `statx` of the entry — or, where
//! the source is declared immutable, of its directory, which then vouches for its files — the
//! same call the validator would have made, so the source sees no more than one per entry and
//! attach. The agent is told which directory the program is in, to validate it next. A party
//! that finds the entry being checked by another (`lifecycle::claim_check`) waits for that check
//! rather than making a second call.

use granary_shm::lifecycle::{self, Check, Verdict};
use granary_shm::{request, EntryRec, StatRec, Table};

use crate::ops::path::{self, Buf};
use crate::sys::{self, sys, KeepErrno};

/// `statx(AT_SYMLINK_NOFOLLOW)` of entry `idx`'s path on the source, compared with the catalog.
fn verdict(table: &Table, idx: u32, e: &EntryRec) -> Verdict {
    let mut buf = Buf::new();
    let Some(p) = path::entry_path(table, idx, &mut buf) else {
        return Verdict::Unknown;
    };
    let mut sx = sys::empty_statx();
    let r = sys!(
        libc::SYS_statx,
        libc::AT_FDCWD,
        p,
        libc::AT_SYMLINK_NOFOLLOW,
        libc::STATX_BASIC_STATS | libc::STATX_BTIME,
        &mut sx as *mut libc::statx
    );
    let now = if r == 0 {
        Ok(StatRec::from_statx(&sx))
    } else {
        Err(sys::errno())
    };
    lifecycle::verdict_with(&e.stat, now.as_ref().map_err(|e| *e), || {
        // A directory that changed: may these credentials still list and search it?
        sys!(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            p,
            libc::R_OK | libc::X_OK
        ) == 0
    })
}

/// True if the catalog may now answer for entry `idx` (checked just now, or vouched for by its
/// directory); false if it changed (it is voided and passes through from now on) or the source
/// could not say. Never changes errno.
pub fn check(table: &Table, idx: u32, e: &EntryRec) -> bool {
    let _keep = KeepErrno::new();
    if table.immutable() && !e.stat.is_dir() && e.parent != idx {
        if !lifecycle::is_validated(table, e.parent) {
            if let Some(d) = table.entry(e.parent) {
                if d.stat.is_dir() && !table.state(e.parent).is_void() {
                    check_once(table, e.parent, &d);
                }
            }
        }
        if lifecycle::is_validated(table, idx) {
            return true;
        }
    }
    let ok = check_once(table, idx, e);
    // The validator has not reached this directory: point it there.
    let dir = if e.stat.is_dir() { idx } else { e.parent };
    table.push_request(request::VALIDATE, dir);
    ok
}

/// How long a check another party holds is waited for: a `statx` on a local disk or a healthy
/// network file system. Past it this process asks itself — the holder may be a validator thread
/// at `SCHED_IDLE` that the program's own load preempted mid-check (it then costs the source a
/// second call, never the program more than this wait), or a process stopped or killed.
const OTHERS_CHECK_NS: u64 = 1_000_000;

/// Entry `idx` checked once in this attach, by whoever claims it first; true if the catalog
/// may answer for it.
fn check_once(table: &Table, idx: u32, e: &EntryRec) -> bool {
    match lifecycle::claim_check(table, idx) {
        Check::Validated => true,
        Check::Mine(claim) => claim.finish(verdict(table, idx, e)),
        Check::Busy => {
            if wait_for_other_check(table, idx) {
                if lifecycle::is_validated(table, idx) {
                    return true;
                }
                if table.state(idx).is_void() {
                    return false;
                }
            }
            // The other party's source could not say, or it never finished: ask ourselves.
            lifecycle::apply(table, idx, verdict(table, idx, e))
        }
    }
}

/// Waits (bounded, a signal ends it) until nobody holds entry `idx`'s check; false if it is
/// still held.
fn wait_for_other_check(table: &Table, idx: u32) -> bool {
    let start = crate::wait::now_ns();
    let mut sleep = 2_000;
    let gate = crate::wait::Gate::hold();
    while lifecycle::is_being_checked(table, idx) {
        if crate::wait::now_ns() - start > OTHERS_CHECK_NS || !gate.nap(&mut sleep, 200_000) {
            return false;
        }
    }
    true
}
