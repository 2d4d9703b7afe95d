//! What large-file fetches and small-file copies share: claiming the entry, opening the source,
//! trying the policy's tiers with a reservation each, and publishing a finished copy.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use granary_shm::{object_name, state, EntryRec};

use super::SourceCtx;
use crate::stats::AgentCounters;
use crate::sys;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlaceOutcome {
    Placed {
        tier: usize,
        bytes: u64,
    },
    /// Not ours to place (someone else moved the state, or the table was retired).
    Skipped,
    /// The source no longer matches the catalog: the entry is STALE.
    Stale,
    /// No tier could take it (full, unwritable) or the source was unreadable: SOURCE_ONLY.
    SourceOnly,
}

/// Why one attempt to write a copy failed.
pub(super) enum CopyError {
    /// The source changed (size, mtime) while we read it: the entry becomes STALE.
    Changed,
    /// Reading the source failed: no tier will do better, the entry stays on the source.
    Source(std::io::Error),
    /// Writing the tier failed: release, maybe mark the tier full, try the next one.
    Tier(std::io::Error),
    /// Someone else moved the entry's state (a client invalidated it): stop, publish nothing.
    Lost,
}

/// An entry this worker owns (moved QUEUED → PLACING), with its source open.
pub(super) struct Claimed {
    pub idx: u32,
    pub entry: EntryRec,
    pub path: PathBuf,
    pub src: File,
}

/// Moves `idx` QUEUED → PLACING and opens its source, checking it still matches the catalog.
/// `None` when there is nothing to do (the outcome says why; the state is already final).
pub(super) fn claim(ctx: &SourceCtx, idx: u32) -> Result<Claimed, PlaceOutcome> {
    let t = &ctx.table;
    let queued = state::word(state::QUEUED, 0);
    if ctx.retired.load(Ordering::Acquire) {
        t.swap_state(idx, queued, state::word(state::UNPLACED, 0));
        return Err(PlaceOutcome::Skipped);
    }
    // A progress left from an earlier attempt must never be read against a new partial copy:
    // reset before the entry says PLACING.
    t.reset_progress(idx);
    let placing = state::word(state::PLACING, 0);
    if !t.swap_state(idx, queued, placing) {
        return Err(PlaceOutcome::Skipped);
    }
    let Some((entry, rel)) = t
        .entry(idx)
        .and_then(|e| t.rel_path(&e).map(|r| (e, r.to_vec())))
    else {
        t.swap_state(idx, placing, state::word(state::SOURCE_ONLY, 0));
        return Err(PlaceOutcome::SourceOnly);
    };
    let path = ctx.source_real.join(std::ffi::OsStr::from_bytes(&rel));
    let c = &ctx.counters;
    let src = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(err) => {
            tracing::debug!("placement: cannot open {}: {err}", path.display());
            AgentCounters::add(&c.failures, 1);
            t.swap_state(idx, placing, state::word(state::SOURCE_ONLY, 0));
            return Err(PlaceOutcome::SourceOnly);
        }
    };
    AgentCounters::add(&c.source_opens, 1);
    if !matches_catalog(&src, &entry) {
        tracing::debug!("placement: {} changed since the walk", path.display());
        return Err(stale(ctx, idx));
    }
    Ok(Claimed {
        idx,
        entry,
        path,
        src,
    })
}

/// The entry's state is whatever PLACING word this copy announced last; any other word means
/// a client took it away (INVALIDATE).
pub(super) fn still_ours(ctx: &SourceCtx, idx: u32) -> bool {
    state::state_of(ctx.table.state(idx)) == state::PLACING
}

pub(super) fn stale(ctx: &SourceCtx, idx: u32) -> PlaceOutcome {
    AgentCounters::add(&ctx.counters.stale, 1);
    let w = ctx.table.state(idx);
    if state::state_of(w) == state::PLACING {
        ctx.table.swap_state(idx, w, state::word(state::STALE, 0));
    }
    PlaceOutcome::Stale
}

pub(super) fn source_only(ctx: &SourceCtx, idx: u32) -> PlaceOutcome {
    AgentCounters::add(&ctx.counters.failures, 1);
    let w = ctx.table.state(idx);
    if state::state_of(w) == state::PLACING {
        ctx.table
            .swap_state(idx, w, state::word(state::SOURCE_ONLY, 0));
    }
    PlaceOutcome::SourceOnly
}

/// Tries the policy's tiers in order: `write` makes the copy under a temporary name in the
/// tier's object directory and returns (that name, xxh3 of the bytes). Publishes the first that
/// succeeds; a tier write error (ENOSPC, EIO, EDQUOT) marks that tier full. No error reaches a
/// client: the worst outcome is SOURCE_ONLY.
pub(super) fn place_on_tiers(
    ctx: &SourceCtx,
    cl: &mut Claimed,
    policy: &dyn super::Policy,
    mut write: impl FnMut(&mut Claimed, usize, &OwnedFd) -> Result<(Vec<u8>, u64), CopyError>,
) -> PlaceOutcome {
    let t = &ctx.table;
    let tiers = &*ctx.tiers;
    let c = &ctx.counters;
    let idx = cl.idx;
    let size = cl.entry.stat.size;
    let name = object_name(cl.entry.object);
    for tier in policy.tiers_for(size, tiers) {
        let Some(Some(dir)) = ctx.object_dirs.get(tier) else {
            continue;
        };
        let Some(res) = tiers.reserve(tier, size) else {
            continue;
        };
        let (tmp, sum) = match write(cl, tier, dir) {
            Ok(x) => x,
            Err(CopyError::Changed) => return stale(ctx, idx),
            Err(CopyError::Lost) => return PlaceOutcome::Skipped,
            Err(CopyError::Source(err)) => {
                tracing::debug!("placement: reading {} failed: {err}", cl.path.display());
                return source_only(ctx, idx);
            }
            Err(CopyError::Tier(err)) => {
                drop(res);
                tier_failed(ctx, tier, &err);
                continue;
            }
        };
        // The bytes we copied are the catalog's only if the source is still what it described.
        if !matches_catalog(&cl.src, &cl.entry) {
            let _ = sys::unlink_at(dir, &tmp);
            return stale(ctx, idx);
        }
        // Commit before the rename (as `states::finish` argues): once the object name exists an
        // INVALIDATE handler may unlink it and release its charge as a committed one.
        let charge = res.commit();
        if let Err(err) = sys::rename_at(dir, &tmp, &name) {
            tracing::debug!("placement: rename in tier {tier} failed: {err}");
            let _ = sys::unlink_at(dir, &tmp);
            tiers.release(tier, charge);
            continue;
        }
        t.set_checksum(idx, sum);
        let placing = t.state(idx);
        if state::state_of(placing) != state::PLACING
            || !t.swap_state(idx, placing, state::word(state::PLACED, tier as u8))
        {
            // A client invalidated the file while we copied: the copy is void. Whoever unlinks
            // it (we or the INVALIDATE handler) gives the space back.
            if sys::unlink_at(dir, &name).is_ok() {
                tiers.release(tier, charge);
            }
            return PlaceOutcome::Skipped;
        }
        AgentCounters::add(&c.files_placed, 1);
        AgentCounters::add(&c.bytes_placed, size);
        AgentCounters::add(&c.tier_files[tier], 1);
        AgentCounters::add(&c.tier_bytes[tier], size);
        return PlaceOutcome::Placed { tier, bytes: size };
    }
    source_only(ctx, idx)
}

/// A write to `tier` failed: ENOSPC/EDQUOT/EIO mean the tier cannot take more now, whatever
/// the accounting says (a tier configured larger than its file system, a failing disk).
fn tier_failed(ctx: &SourceCtx, tier: usize, err: &std::io::Error) {
    let full = matches!(
        err.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EIO) | Some(libc::EFBIG)
    );
    if full && ctx.tiers.mark_full(tier) {
        tracing::warn!(
            "tier {} ({}): {err}; no new copies there until space is freed",
            tier,
            ctx.tiers.spec(tier).path.display()
        );
    } else {
        tracing::debug!("placement: writing tier {tier} failed: {err}");
    }
}

pub(super) fn matches_catalog(f: &File, e: &EntryRec) -> bool {
    f.metadata().is_ok_and(|m| {
        m.is_file()
            && m.len() == e.stat.size
            && m.mtime() == e.stat.mtime.sec
            && m.mtime_nsec() == e.stat.mtime.nsec as i64
    })
}

/// `write(2)` all of `buf`, retrying on EINTR; a short write of 0 is reported as ENOSPC.
pub(super) fn write_all(out: &mut File, buf: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut rest = buf;
    while !rest.is_empty() {
        match out.write(rest) {
            Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where tier `t`'s objects of a source live: `<tier path>/<source id>/objects`.
pub fn object_dir(tier_path: &std::path::Path, source_id: &str) -> PathBuf {
    tier_path.join(source_id).join("objects")
}
