use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use granary_shm::{object_name, state, EntryRec};

use super::{Policy, SourceCtx};
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

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Places one entry (which a request moved to QUEUED). Never leaves a temporary file or a
/// reservation behind, and publishes PLACED only after the copy is complete under its final name.
pub fn place(ctx: &SourceCtx, idx: u32, policy: &dyn Policy, buf: &mut [u8]) -> PlaceOutcome {
    let t = &ctx.table;
    let tiers = &*ctx.tiers;
    let queued = state::word(state::QUEUED, 0);
    if ctx.retired.load(Ordering::Acquire) {
        t.swap_state(idx, queued, state::word(state::UNPLACED, 0));
        return PlaceOutcome::Skipped;
    }
    let placing = state::word(state::PLACING, 0);
    if !t.swap_state(idx, queued, placing) {
        return PlaceOutcome::Skipped;
    }
    let (Some(e), Some(rel)) = (
        t.entry(idx),
        t.entry(idx)
            .and_then(|e| t.rel_path(&e).map(|r| r.to_vec())),
    ) else {
        t.swap_state(idx, placing, state::word(state::SOURCE_ONLY, 0));
        return PlaceOutcome::SourceOnly;
    };
    let path = ctx.source_real.join(std::ffi::OsStr::from_bytes(&rel));
    let c = &ctx.counters;
    let src = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(err) => {
            tracing::debug!("placement: cannot open {}: {err}", path.display());
            AgentCounters::add(&c.failures, 1);
            t.swap_state(idx, placing, state::word(state::SOURCE_ONLY, 0));
            return PlaceOutcome::SourceOnly;
        }
    };
    AgentCounters::add(&c.source_opens, 1);
    if !matches_catalog(&src, &e) {
        tracing::debug!("placement: {} changed since the walk", path.display());
        AgentCounters::add(&c.stale, 1);
        t.swap_state(idx, placing, state::word(state::STALE, 0));
        return PlaceOutcome::Stale;
    }
    let name = object_name(e.object);
    for tier in policy.tiers_for(e.stat.size, tiers) {
        let Some(Some(dir)) = ctx.object_dirs.get(tier) else {
            continue;
        };
        let Some(res) = tiers.reserve(tier, e.stat.size) else {
            continue;
        };
        let tmp = format!(
            ".tmp-{}-{}-{}",
            std::str::from_utf8(&name).unwrap_or("object"),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let copied = copy_to(&src, dir, tmp.as_bytes(), e.stat.size, buf, c);
        let sum = match copied {
            Ok(sum) => sum,
            Err(CopyError::Changed) => {
                let _ = sys::unlink_at(dir, tmp.as_bytes());
                AgentCounters::add(&c.stale, 1);
                t.swap_state(idx, placing, state::word(state::STALE, 0));
                return PlaceOutcome::Stale;
            }
            Err(CopyError::Io(err)) => {
                tracing::debug!(
                    "placement: copying {} to tier {tier} failed: {err}",
                    path.display()
                );
                let _ = sys::unlink_at(dir, tmp.as_bytes());
                continue;
            }
        };
        if !matches_catalog(&src, &e) {
            let _ = sys::unlink_at(dir, tmp.as_bytes());
            AgentCounters::add(&c.stale, 1);
            t.swap_state(idx, placing, state::word(state::STALE, 0));
            return PlaceOutcome::Stale;
        }
        if let Err(err) = sys::rename_at(dir, tmp.as_bytes(), &name) {
            tracing::debug!("placement: rename in tier {tier} failed: {err}");
            let _ = sys::unlink_at(dir, tmp.as_bytes());
            continue;
        }
        let charge = res.commit();
        t.set_checksum(idx, sum);
        if !t.swap_state(idx, placing, state::word(state::PLACED, tier as u8)) {
            // A client invalidated the file while we copied: the copy is void. Whoever unlinks
            // it (we or the INVALIDATE handler) gives the space back.
            if sys::unlink_at(dir, &name).is_ok() {
                tiers.release(tier, charge);
            }
            return PlaceOutcome::Skipped;
        }
        AgentCounters::add(&c.files_placed, 1);
        AgentCounters::add(&c.bytes_placed, e.stat.size);
        AgentCounters::add(&c.tier_files[tier], 1);
        AgentCounters::add(&c.tier_bytes[tier], e.stat.size);
        return PlaceOutcome::Placed {
            tier,
            bytes: e.stat.size,
        };
    }
    AgentCounters::add(&c.failures, 1);
    t.swap_state(idx, placing, state::word(state::SOURCE_ONLY, 0));
    PlaceOutcome::SourceOnly
}

fn matches_catalog(f: &File, e: &EntryRec) -> bool {
    f.metadata().is_ok_and(|m| {
        m.is_file()
            && m.len() == e.stat.size
            && m.mtime() == e.stat.mtime.sec
            && m.mtime_nsec() == e.stat.mtime.nsec as i64
    })
}

enum CopyError {
    Changed,
    Io(std::io::Error),
}

/// Copies the whole source into a new temporary object; returns its xxh3 checksum (never 0,
/// which means "none recorded").
fn copy_to(
    src: &File,
    dir: &std::os::fd::OwnedFd,
    tmp: &[u8],
    size: u64,
    buf: &mut [u8],
    c: &AgentCounters,
) -> Result<u64, CopyError> {
    let mut out = sys::create_excl_at(dir, tmp, 0o600).map_err(CopyError::Io)?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut off = 0u64;
    loop {
        let n = match src.read_at(buf, off) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Io(e)),
        };
        AgentCounters::add(&c.source_reads, 1);
        AgentCounters::add(&c.source_bytes, n as u64);
        if off + n as u64 > size {
            return Err(CopyError::Changed);
        }
        hasher.update(&buf[..n]);
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(CopyError::Io)?;
        off += n as u64;
    }
    if off != size {
        return Err(CopyError::Changed);
    }
    sys::start_writeback(&out, size);
    let _ = out.as_raw_fd();
    Ok(hasher.digest().max(1))
}

/// Where tier `t`'s objects of a source live: `<tier path>/<source id>/objects`.
pub fn object_dir(tier_path: &std::path::Path, source_id: &str) -> PathBuf {
    tier_path.join(source_id).join("objects")
}
