//! The client side of page-cache residency (docs/placement.md, "Page-cache residency"): when the
//! program closes a tier fd of a *transient* copy it has read, the copy's pages are dropped, so
//! they never push the resident copies' pages out of a page cache too small for the dataset.
//!
//! Only what the program is done with, as far as a close can tell: a small file whole (data
//! loaders read those whole), a large one whole if its offset reached its end (read through),
//! else the range its `pread`s covered (a TFRecord reader's whole shard; a per-sample open of
//! an HDF5 file just that sample, so the readahead beyond it stays for the next open). A large
//! file read neither way (`mmap`, `read` closed midway) keeps its pages to the kernel's LRU, as
//! without granary.
//!
//! A large copy read in sequence by `pread`s is also dropped *behind its reader* as it goes
//! (`behind`), a `BEHIND_STEP` at a time and a step back from where it reads: waiting for the
//! close let a 48 MB shard's pages pile up while it was read, two readers' shards outgrew the
//! page cache's reserve, and the kernel made room by evicting resident copies — which the next
//! epoch then read from the tier again (6 × 48 MB shards under a 128 MiB cap: 230–330 MB of tier
//! reads per epoch for 289 MB of shards, as many as without a resident set).

use core::ffi::c_int;

use granary_shm::job;

use crate::fds::fdtable::{self, FdKind, Tracked};
use crate::sys::{sys, KeepErrno};

/// Called before the real close of a tracked fd. Advisory: errno is kept, failures ignored.
pub fn before_close(fd: c_int, t: Tracked) {
    let Some(g) = transient_copy(t) else { return };
    let Some(size) = crate::ops::lookup::entry(g.table, t.entry).map(|e| e.stat.size) else {
        return;
    };
    let _keep = KeepErrno::new();
    let (start, len) = if size < g.table.prefetch_min_size() {
        (0, 0)
    } else {
        let pos = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
        if pos >= 0 && pos as u64 >= size {
            (0, 0)
        } else if let Some((start, end)) = fdtable::pread_range(fd) {
            (start, end - start)
        } else {
            return;
        }
    };
    if drop_pages(fd, start, len) {
        g.count(job::TRANSIENT_DROPS, 1);
    }
}

/// The detour's guard when `t` is a tier copy the page-cache budget made transient (its pages
/// are dropped once read); `None` for anything else, or when the table cannot be entered.
fn transient_copy(t: Tracked) -> Option<crate::ops::detour::Guard> {
    if !matches!(t.kind, FdKind::Tier(_)) {
        return None;
    }
    // The bit first (no guard taken for a copy that is not transient: nearly every one).
    if !crate::ops::detour::table().is_some_and(|tb| tb.is_transient(t.entry)) {
        return None;
    }
    crate::ops::detour::enter_any_creds().ok()
}

/// How much of a transient copy a sequential reader leaves cached behind it before it is
/// dropped: between one and two steps (a `fadvise` call per step).
pub const BEHIND_STEP: u64 = 4 << 20;

/// After a positioned read at `off` that continued tier fd `fd`'s reads in sequence: if the
/// copy is transient and the reader has moved a step past what was dropped, drop what lies more
/// than a step behind it. A read that is not in sequence (a seek, a scattered reader) drops
/// nothing here: what it read stays until the close, as before.
#[inline]
pub fn behind(fd: c_int, off: u64) {
    let upto = (off / BEHIND_STEP).saturating_sub(1) * BEHIND_STEP;
    if upto == 0 || fdtable::dropped_to(fd) >= upto {
        return;
    }
    behind_cold(fd, upto);
}

#[cold]
fn behind_cold(fd: c_int, upto: u64) {
    let Some(t) = fdtable::peek(fd) else { return };
    if transient_copy(t).is_none() {
        return;
    }
    if let Some(from) = fdtable::claim_dropped(fd, upto) {
        drop_pages(fd, from, upto - from);
    }
}

/// `posix_fadvise(DONTNEED)` of `[off, off + len)` (`len` 0: to the end of the file); true if
/// the kernel took it. Advisory: the caller's errno is kept.
pub fn drop_pages(fd: c_int, off: u64, len: u64) -> bool {
    let _keep = KeepErrno::new();
    sys!(libc::SYS_fadvise64, fd, off, len, libc::POSIX_FADV_DONTNEED) == 0
}
