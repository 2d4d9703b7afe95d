//! Where a table's copies go (`Space`): the tiers, this source's object directory in each, the
//! tiers lost while in use, and the reservation steps every kind of copy shares.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use granary_shm::Table;

use crate::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use crate::sync::Arc;
use crate::tiers::{Reservation, Tiers};

/// Where a table's copies go: the tiers it was published with (its `SLOT_TIER0 + t`; placement
/// reserves on them, so one pool serves sources with different tiers) and this source's object
/// directory in each.
pub struct Space {
    pub tiers: Arc<Tiers>,
    /// Tier `t`'s object directory for this source (`None`: unusable, never placed on).
    dirs: Vec<Option<OwnedFd>>,
    /// Per tier, the object directory as the table records it: clients open copies by its path.
    recorded: Vec<RecordedDir>,
    /// Tiers whose object directory is no longer where the table says (removed or renamed
    /// while the agent ran), one bit each: nothing is placed there any more.
    lost: AtomicU8,
}

/// A tier's object directory found where the table says is not looked up again for this long
/// (`Space::is_lost`): it was a `statx` of the path at every copy's reservation, one of the ~10
/// system calls a remote read of 128 KiB costs its agent in a later epoch. Within it a copy may
/// still land in a directory just removed; no client finds it by that path, so it is never
/// served (docs/reliability.md: a lost tier is noticed within ~1 s).
pub const LOST_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Space {
    pub(super) fn new(table: &Table, tiers: Arc<Tiers>, dirs: Vec<Option<OwnedFd>>) -> Space {
        let recorded = (0..dirs.len() as u32)
            .map(|t| {
                let path = table
                    .tier_dir(t)
                    .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)));
                RecordedDir {
                    path,
                    id: table.tier_dir_id(t),
                    found_ns: AtomicU64::new(0),
                }
            })
            .collect();
        Space {
            tiers,
            dirs,
            recorded,
            lost: AtomicU8::new(0),
        }
    }

    /// Tier `tier`'s object directory (`None`: unusable, never placed on).
    pub fn dir(&self, tier: usize) -> Option<&OwnedFd> {
        self.dirs.get(tier)?.as_ref()
    }

    /// The object directories, tier by tier (`None`: unusable).
    pub fn dirs(&self) -> &[Option<OwnedFd>] {
        &self.dirs
    }

    /// Tier `tier`'s object directory's path as the table records it.
    pub fn recorded_path(&self, tier: usize) -> Option<&Path> {
        self.recorded.get(tier)?.path.as_deref()
    }

    /// True if tier `tier`'s object directory is gone from its path (removed, renamed,
    /// replaced): clients open copies by that path, so a copy placed in the orphan could never
    /// be served. Noticed once (a warning), then remembered.
    pub fn is_lost(&self, tier: usize) -> bool {
        let bit = 1u8 << (tier as u32 & 7);
        if self.lost.load(Ordering::Acquire) & bit != 0 {
            return true;
        }
        let rec = self.recorded.get(tier);
        let now = super::clock::mono_ns();
        if let Some(r) = rec {
            let found = r.found_ns.load(Ordering::Relaxed);
            if found != 0 && now.saturating_sub(found) < LOST_CHECK_EVERY.as_nanos() as u64 {
                return false;
            }
        }
        let path = rec.and_then(|r| r.path.as_deref());
        let here = path
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .map(|m| (m.dev(), m.ino()));
        let lost = here.is_none() || here != rec.and_then(|r| r.id);
        if let (false, Some(r)) = (lost, rec) {
            r.found_ns.store(now, Ordering::Relaxed);
        }
        if lost && self.lost.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            tracing::warn!(
                "tier {tier} ({}) was removed or renamed while in use: no more copies there",
                path.unwrap_or(Path::new("?")).display()
            );
        }
        lost
    }

    /// The first of the policy's tiers with room for `size` (reserved), in the policy's order.
    pub fn reserve_on(&self, tiers_order: &[usize], size: u64) -> Option<Reservation<'_>> {
        // The lost check (a `statx` of the directory's path) only once a tier has room: a full
        // tier costs no system call (a staging tier making room asks again after each drop).
        tiers_order.iter().find_map(|&t| {
            self.dir(t)?;
            let res = self.tiers.reserve(t, size)?;
            (!self.is_lost(t)).then_some(res)
        })
    }

    /// A reservation on a tier after `failed` in the policy's order.
    pub fn reserve_after(
        &self,
        order: &[usize],
        failed: usize,
        size: u64,
    ) -> Option<Reservation<'_>> {
        let at = order.iter().position(|&t| t == failed)?;
        self.reserve_on(&order[at + 1..], size)
    }

    /// A write to `tier` failed: ENOSPC/EDQUOT/EIO mean the tier cannot take more now,
    /// whatever the accounting says (a tier configured larger than its file system, a failing
    /// disk).
    pub fn tier_failed(&self, tier: usize, err: &std::io::Error) {
        let full = matches!(
            err.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EIO) | Some(libc::EFBIG)
        );
        if full && self.tiers.mark_full(tier) {
            tracing::warn!(
                "tier {} ({}): {err}; no new copies there until space is freed",
                tier,
                self.tiers.spec(tier).path.display()
            );
        } else {
            tracing::debug!("placement: writing tier {tier} failed: {err}");
        }
    }
}

/// A tier's object directory as the table records it.
struct RecordedDir {
    path: Option<PathBuf>,
    /// Device and inode.
    id: Option<(u64, u64)>,
    /// When the directory was last found where the table says (`mono_ns`; 0: never).
    found_ns: AtomicU64,
}
