//! The catalog beside the cache: the live table image, saved at `<first tier>/<source id>/
//! catalog.table` (temporary file, then rename) when the last job detaches and when the agent
//! exits, and loaded back by the next agent without a walk.
//!
//! A saved image is the table itself with its per-run words cleared (`sanitize`): requests,
//! counters, heartbeat, validation and transient bits, copies in progress. Loading it trusts
//! nothing it cannot check cheaply: the header (version, layout), the agent's credentials, the
//! source path and the tiers' object directories (paths and identities) must be the ones of the
//! new table. Whether each source file is unchanged is then checked per file in the background
//! (`validate`), and each copy's identity on every open (the preload library).

use crate::sync::atomic::Ordering;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use granary_shm::{job, layout, lifecycle, Mapping, State, Table};

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

fn tmp_name(path: &Path) -> std::path::PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    dir.join(format!(".tmp-{name}-{}", std::process::id()))
}

/// `write_atomic` with the contents written by `fill` (which may also map and edit the file).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = tmp_name(path);
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        fill(&mut f)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Saves the live `table` at `path`.
///
/// The space it needs is held in between by `.catalog-room` beside it (allocated, never
/// written): a tier whose copies filled its file system (one declared larger than it, or shared
/// with other users' files) still has room for the catalog that says which copies are valid —
/// without it, every copy would be thrown away at the next job.
pub fn save(path: &Path, table: &Table) -> std::io::Result<()> {
    let room = path.with_file_name(".catalog-room");
    let _ = std::fs::remove_file(&room);
    let len = table.region().len();
    let res = write_atomic_with(path, |f| {
        copy_region(table, f)?;
        let (_m, copy) =
            Mapping::map(f.as_raw_fd(), len).map_err(|e| std::io::Error::other(e.to_string()))?;
        sanitize(&copy);
        seal_partials(&copy);
        Ok(())
    });
    // Room for the next save: this image's size and an eighth more (the catalog may grow).
    hold_room(&room, len as u64 + len as u64 / 8);
    res
}

/// Copies the live table's bytes into `f` a word at a time: other processes update its
/// atomics meanwhile, and a torn word is fixed by `sanitize` or is an immutable byte anyway.
fn copy_region(table: &Table, f: &mut std::fs::File) -> std::io::Result<()> {
    let region = table.region();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < region.len() {
        let n = buf.len().min(region.len() - off);
        for (k, chunk) in buf[..n].chunks_exact_mut(8).enumerate() {
            let w = region.u64_at(off + k * 8).unwrap_or(0);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        f.write_all(&buf[..n])?;
        off += n;
    }
    Ok(())
}

/// Clears a table's per-run words: what the next agent starts from
/// (`lifecycle::forget_run`).
pub fn sanitize(t: &Table) {
    clear_run_words(t);
    t.set_immutable(false);
    t.set_cluster(false);
    lifecycle::forget_run(t);
}

/// The header's and job slots' per-run words: heartbeat, flags an agent sets, the ring, the
/// counters. Entry words are `lifecycle`'s to clear.
fn clear_run_words(t: &Table) {
    if let Some(h) = t.region().atomic_u64(layout::H_HEARTBEAT) {
        h.store(0, Ordering::Relaxed);
    }
    t.set_reports_opens(false);
    t.set_xattr_absent(None);
    t.set_valid(true);
    t.reset_ring();
    for slot in 0..t.job_slots() {
        t.clear_job(slot);
        if let Some(c) = t.counter(slot, job::OWNER) {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// The identity of a PARTIAL entry's chunk file (inode, ctime ns), looked up by path.
fn chunk_file_identity(t: &Table, idx: u32) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let w = t.state(idx);
    let dir = t.tier_dir(w.tier() as u32)?;
    let e = t.entry(idx)?;
    let path = Path::new(std::ffi::OsStr::from_bytes(dir)).join(std::ffi::OsStr::from_bytes(
        &granary_shm::chunks_name(e.object),
    ));
    let m = std::fs::symlink_metadata(path).ok()?;
    m.file_type().is_file().then(|| {
        (
            m.ino(),
            m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64,
        )
    })
}

/// A saved catalog records each chunk file's ctime as it is when saved (no fetch writes to it
/// any more): the next agent trusts the chunk bits only if the file was not written since.
fn seal_partials(t: &Table) {
    for i in 0..t.entry_count() {
        if t.state(i).state() != State::Partial {
            continue;
        }
        let w = t.state(i);
        let (ino, _) = t.copy_identity(i);
        match chunk_file_identity(t, i) {
            Some((now_ino, ctime)) if now_ino == ino => lifecycle::seal_partial(t, i, ctime),
            _ => {
                lifecycle::unplace_partial(t, i, w);
            }
        }
    }
}

/// A loaded catalog keeps a chunk file's bits only if the file is the one sealed at save:
/// written since (damaged, replaced), its chunks are fetched again. While the file is in use
/// its ctime moves with every chunk written, so clients check only its inode.
fn unseal_partials(t: &Table) -> u64 {
    let mut rejected = 0;
    for i in 0..t.entry_count() {
        if t.state(i).state() != State::Partial {
            continue;
        }
        let sealed = t.copy_identity(i);
        if chunk_file_identity(t, i) == Some(sealed) && sealed.1 != 0 {
            lifecycle::seal_partial(t, i, 0);
        } else if lifecycle::unplace_partial(t, i, t.state(i)) {
            tracing::warn!(
                "chunk file of {} was written while no agent ran: dropped, fetched again on demand",
                crate::catalog::walk::rel_display(&t.rel_path_vec(i).unwrap_or_default()).display()
            );
            rejected += 1;
        }
    }
    rejected
}

/// Allocates `len` bytes to a file of nothing (`fallocate`), so they stay free for the catalog.
fn hold_room(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let ok = f.is_ok_and(|f| {
        // SAFETY: fallocate on an open file; no memory involved.
        unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as i64) == 0 }
    });
    if !ok {
        tracing::debug!(
            "cannot hold {len} bytes for the catalog at {}",
            path.display()
        );
    }
}

/// Why a saved catalog is not loaded (the agent then walks the source).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no saved catalog")]
    Missing,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a usable table: {0}")]
    Table(granary_shm::MapError),
    #[error("saved by another user or with other groups")]
    Creds,
    #[error("saved for another source ({0})")]
    Source(String),
    #[error("saved with other tiers")]
    Tiers,
    #[error("{0}")]
    Foreign(granary_shm::BuildError),
}

/// What a saved catalog must match to be loaded.
pub struct Expect<'a> {
    pub source_real: &'a [u8],
    pub creds: (u32, u32, u64),
    pub tier_dirs: &'a [Vec<u8>],
    pub tier_dir_ids: &'a [(u64, u64)],
}

/// A loaded catalog.
pub struct Loaded {
    pub mapping: Mapping,
    pub table: Table,
    /// Chunk files dropped because they were written while no agent ran.
    pub rejected: u64,
}

/// Copies the saved catalog at `saved` to `dest` (the runtime table file) and maps it, if it
/// matches `expect`; its per-run words are cleared and its header names this agent.
pub fn load(saved: &Path, dest: &Path, expect: &Expect<'_>) -> Result<Loaded, LoadError> {
    let mut src = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(saved)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::Missing),
        Err(e) => return Err(e.into()),
    };
    let len = src.metadata()?.len() as usize;
    write_atomic_with(dest, |f| {
        std::io::copy(&mut src, f)?;
        Ok(())
    })?;
    take_over(dest, len, |t| {
        if t.agent_creds() != expect.creds {
            return Err(LoadError::Creds);
        }
        if t.source_real_root() != expect.source_real {
            return Err(LoadError::Source(
                String::from_utf8_lossy(t.source_real_root()).into_owned(),
            ));
        }
        let same_tiers = t.tier_count() as usize == expect.tier_dirs.len()
            && (0..t.tier_count()).all(|k| {
                t.tier_dir(k) == expect.tier_dirs.get(k as usize).map(|v| v.as_slice())
                    && t.tier_dir_id(k) == expect.tier_dir_ids.get(k as usize).copied()
            });
        if !same_tiers {
            return Err(LoadError::Tiers);
        }
        sanitize(t);
        let rejected = unseal_partials(t);
        t.set_agent_pid(std::process::id());
        Ok(rejected)
    })
}

/// Maps the table just written to `dest` (`len` bytes, opened read-write, never through a
/// link) and makes it this agent's with `ready`, which returns the chunk files it rejected;
/// `dest` is removed if either fails, so no half-taken table is left for clients.
fn take_over(
    dest: &Path,
    len: usize,
    ready: impl FnOnce(&Table) -> Result<u64, LoadError>,
) -> Result<Loaded, LoadError> {
    let res = (|| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dest)?;
        let (m, t) = Mapping::map(f.as_raw_fd(), len).map_err(LoadError::Table)?;
        let rejected = ready(&t)?;
        Ok(Loaded {
            mapping: m,
            table: t,
            rejected,
        })
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(dest);
    }
    res
}

/// Maps a saved catalog read-only in spirit (a private copy-free view for taking over what it
/// knows at a walk): `None` when missing or unusable.
pub fn open_saved(saved: &Path) -> Option<(Mapping, Table)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(saved)
        .ok()?;
    let len = f.metadata().ok()?.len() as usize;
    match Mapping::map(f.as_raw_fd(), len) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!("ignoring saved catalog {}: {e}", saved.display());
            None
        }
    }
}

/// The live table's bytes as they are (a word at a time: other processes update its atomics
/// meanwhile), for another node of a cluster-mode job (`adopt`).
pub fn image_bytes(table: &Table) -> Vec<u8> {
    let region = table.region();
    let mut out = vec![0u8; region.len()];
    for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
        let w = region.u64_at(k * 8).unwrap_or(0);
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    out
}

/// Makes another node's table image (`image_bytes` of rank 0's table, broadcast) this agent's
/// table at `dest`: the header gets this node's tiers and pid (`granary_shm::rebase`, which
/// refuses an image of another layout, source or user), then the per-run words and everything
/// about copies are cleared (`lifecycle::forget_placement`). The entries and their validation
/// are kept: the node that sent it checked them against the source in this attach, so this one
/// makes no call on the source for them.
///
/// This node's own copies from its last serve are kept where they are still good
/// (`carry_copies`, from the catalog it saved at `saved` when it stopped): a restarted serve
/// reuses every rank's tiers, not only those of the rank that catalogs the source.
pub fn adopt(
    img: &mut [u8],
    spec: &granary_shm::TableSpec,
    dest: &Path,
    saved: Option<&Path>,
) -> Result<Loaded, LoadError> {
    granary_shm::rebase(img, spec).map_err(LoadError::Foreign)?;
    write_atomic(dest, img)?;
    take_over(dest, img.len(), |t| {
        clear_run_words(t);
        lifecycle::forget_placement(t);
        if let Some(saved) = saved {
            let n = carry_copies(t, saved);
            if n > 0 {
                tracing::info!("{n} copies of the last serve kept ({})", saved.display());
            }
        }
        Ok(0)
    })
}

/// Copies this node placed in an earlier serve, recorded in the catalog it saved then
/// (`saved`), made this adopted table's again: a complete copy (with its checksum) of the same
/// version of the same file — same path, object id and source identity (`same_version`: device,
/// inode, size, mtime, ctime), which the node that sent the table checked against the source
/// in this attach — on a tier directory this table still has (same path and identity). Its
/// copy identity comes along: a client checks it at every open, and the attach's sweep
/// withdraws copies that are gone from their tier. A catalog of another user or source is
/// ignored. Returns the copies kept.
fn carry_copies(t: &Table, saved: &Path) -> u64 {
    let Some((_m, prev)) = open_saved(saved) else {
        return 0;
    };
    if prev.agent_creds() != t.agent_creds() || prev.source_real_root() != t.source_real_root() {
        return 0;
    }
    let tier_map: Vec<Option<u8>> = (0..prev.tier_count())
        .map(|k| {
            (0..t.tier_count())
                .find(|&j| {
                    prev.tier_dir(k).is_some()
                        && prev.tier_dir(k) == t.tier_dir(j)
                        && prev.tier_dir_id(k) == t.tier_dir_id(j)
                })
                .map(|j| j as u8)
        })
        .collect();
    let mut kept = 0;
    for i in 0..t.entry_count() {
        let Some(e) = t.entry(i) else { continue };
        if !e.stat.is_file() || t.state(i).state() != State::Unplaced {
            continue;
        }
        let Some(pi) = t.rel_path_vec(i).and_then(|rel| prev.lookup(&rel)) else {
            continue;
        };
        let Some(pe) = prev.entry(pi) else { continue };
        let w = prev.state(pi);
        let same = pe.object == e.object && pe.stat.same_version(&e.stat);
        if !same || w.state() != State::Placed || prev.checksum(pi) == 0 {
            continue;
        }
        let Some(Some(tier)) = tier_map.get(w.tier() as usize) else {
            continue;
        };
        let (ino, ctime) = prev.copy_identity(pi);
        if lifecycle::adopt_placed(t, i, *tier, prev.checksum(pi), ino, ctime) {
            kept += 1;
        }
    }
    kept
}
