//! The client side of page-cache residency (docs/placement.md, "Page-cache residency"): when the
//! program closes a tier fd of a *transient* copy it has read, the copy's pages are dropped, so
//! they never push the resident copies' pages out of a page cache too small for the dataset.
//!
//! Only when the program is done with the file as far as a close can tell: a small file (data
//! loaders read those whole), or a large one whose offset reached its end (read through). A
//! large file read at random and closed midway keeps its pages to the kernel's LRU, as without
//! granary, so reopening it soon costs nothing extra.

use core::ffi::c_int;

use granary_shm::job;

use crate::detour::{self, sys, KeepErrno};
use crate::fdtable::{Kind, Tracked};

/// Called before the real close of a tracked fd. Advisory: errno is kept, failures ignored.
pub fn before_close(fd: c_int, t: Tracked) {
    if !matches!(t.kind, Kind::Tier(_)) {
        return;
    }
    let Some(g) = detour::enter() else {
        return;
    };
    if !g.table.is_transient(t.entry) {
        return;
    }
    let Some(size) = g.table.entry(t.entry).map(|e| e.stat.size) else {
        return;
    };
    let _keep = KeepErrno::new();
    if size >= g.table.prefetch_min_size() {
        let pos = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
        if pos < 0 || (pos as u64) < size {
            return;
        }
    }
    if sys!(libc::SYS_fadvise64, fd, 0, 0, libc::POSIX_FADV_DONTNEED) == 0 {
        g.count(job::TRANSIENT_DROPS, 1);
    }
}
