//! The catalog beside the cache: saved as a table image (the `granary_shm::build` format, via a
//! temporary file and rename) at `<first tier>/<source id>/catalog.table` after each walk and when
//! the agent exits. The next walk reuses a copy only when
//! - the source file is the same version: device, inode, type, size, mtime and ctime all match
//!   the saved entry (`StatRec::same_version`; `cp -p` restores mtime, nothing restores ctime);
//! - the copy was complete (PLACED, checksum recorded) and is the very file the agent wrote:
//!   its inode, ctime and size are the ones recorded at placement (a copy written to, truncated
//!   or replaced since has another ctime or inode);
//! - the saved catalog was made with this agent's credentials (what it could read is what the
//!   catalog lets a job read);
//! - and, with `verify = "checksum"`, its contents hash to the recorded checksum.
//!
//! Everything else in the object directories is deleted.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use granary_shm::{object_id, object_name, state, CatalogEntry, Mapping, TableSpec};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::config::Verify;
use crate::sys;
use crate::tiers::Tiers;

/// Writes `entries` as a table image to `path` atomically.
///
/// The space it needs is held in between by `.catalog-room` beside it (allocated, never
/// written): a tier whose copies filled its file system (one declared larger than it, or shared
/// with other users' files) still has room for the catalog that says which copies are valid —
/// without it, every copy would be thrown away at the next job.
pub fn save(path: &Path, spec: &TableSpec, entries: &[CatalogEntry]) -> std::io::Result<()> {
    let img = granary_shm::build(spec, entries)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let room = path.with_file_name(".catalog-room");
    let _ = std::fs::remove_file(&room);
    let res = write_atomic(path, &img);
    // Room for the next save: this image's size and an eighth more (the catalog may grow).
    hold_room(&room, img.len() as u64 + img.len() as u64 / 8);
    res
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
        unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, len as i64) == 0 }
    });
    if !ok {
        tracing::debug!(
            "cannot hold {len} bytes for the catalog at {}",
            path.display()
        );
    }
}

/// Temporary file in the same directory, then rename: readers see the old or the new file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".tmp-{name}-{}", std::process::id()));
    let res = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// A saved entry's identity and placement.
#[derive(Clone, Copy, Debug)]
pub struct Prev {
    pub stat: granary_shm::StatRec,
    pub state: u64,
    pub checksum: u64,
    /// The copy's identity as recorded at placement: inode, ctime ns.
    pub copy_ino: u64,
    pub copy_ctime: u64,
}

pub struct Persisted {
    pub entries: HashMap<Vec<u8>, Prev>,
    /// Object directory of each tier index, as the saved table names them.
    pub tier_dirs: Vec<PathBuf>,
    /// The credentials of the agent that saved it (`Table::agent_creds`).
    pub creds: (u32, u32, u64),
}

/// The tier a saved entry's copy lives in, if that tier is still one of this source's tiers and
/// usable: its index in the new table and its object directory.
fn saved_tier<'a>(
    prev: &Persisted,
    p: &Prev,
    object_dirs: &[PathBuf],
    dir_fds: &'a [Option<OwnedFd>],
) -> Option<(usize, &'a OwnedFd)> {
    let old_dir = prev.tier_dirs.get(state::tier_of(p.state) as usize)?;
    let t = object_dirs.iter().position(|d| d == old_dir)?;
    Some((t, dir_fds.get(t)?.as_ref()?))
}

/// Loads a saved catalog; `None` (after a debug log) when missing or unreadable: the cache is
/// then rebuilt from nothing, never trusted blindly.
pub fn load_persisted(path: &Path) -> Option<Persisted> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!("no saved catalog at {}: {e}", path.display());
            return None;
        }
    };
    let len = f.metadata().ok()?.len() as usize;
    let (_map, table) = match Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("ignoring saved catalog {}: {e}", path.display());
            return None;
        }
    };
    let tier_dirs = (0..table.tier_count())
        .filter_map(|t| table.tier_dir(t))
        .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
        .collect();
    let mut entries = HashMap::with_capacity(table.entry_count() as usize);
    for i in 0..table.entry_count() {
        let Some(e) = table.entry(i) else { continue };
        if !e.stat.is_file() {
            continue;
        }
        let Some(rel) = table.rel_path(&e) else {
            continue;
        };
        let (copy_ino, copy_ctime) = table.copy_identity(i);
        entries.insert(
            rel.to_vec(),
            Prev {
                stat: e.stat,
                state: table.state(i),
                checksum: table.checksum(i),
                copy_ino,
                copy_ctime,
            },
        );
    }
    Some(Persisted {
        entries,
        tier_dirs,
        creds: table.agent_creds(),
    })
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReuseOutcome {
    pub files: u64,
    pub bytes: u64,
    /// Files removed from the object directories (stale, unreferenced, temporaries, parts).
    pub removed: u64,
    /// Copies the saved catalog called complete whose object had the wrong size or (with
    /// `Verify::Checksum`) the wrong contents: deleted, never served.
    pub rejected: u64,
}

/// Marks entries whose copy from an earlier run is still valid as PLACED (accounting their space
/// in `tiers`), and deletes every other file in this source's object directories (including
/// `.part` and `.tmp-*` files a killed agent left). `object_dirs[t]` is tier `t`'s object
/// directory for this source and `dir_fds[t]` its fd. With `Verify::Checksum` every candidate
/// is re-hashed (xxh3, `threads` at once) against the checksum recorded when it was placed.
pub fn reuse(
    entries: &mut [CatalogEntry],
    prev: Option<&Persisted>,
    object_dirs: &[PathBuf],
    dir_fds: &[Option<OwnedFd>],
    tiers: &Tiers,
    verify: Verify,
    threads: usize,
) -> ReuseOutcome {
    reuse_chunked(
        entries,
        prev,
        object_dirs,
        dir_fds,
        tiers,
        verify,
        threads,
        0,
    )
}

/// `reuse`, and PARTIAL entries keep their chunk file when its header matches the file and
/// `chunk_size` (the new table's) and at least one chunk survives `ChunkFile::validate` (every
/// recorded chunk re-hashed, whatever `verify` says: a chunk file has no other check). The
/// entry's bits are the validated chunks; the tier is charged for them. A chunk file with a
/// chunk that failed its checksum counts once in `rejected`.
#[allow(clippy::too_many_arguments)]
pub fn reuse_chunked(
    entries: &mut [CatalogEntry],
    prev: Option<&Persisted>,
    object_dirs: &[PathBuf],
    dir_fds: &[Option<OwnedFd>],
    tiers: &Tiers,
    verify: Verify,
    threads: usize,
    chunk_size: u64,
) -> ReuseOutcome {
    let mut out = ReuseOutcome::default();
    let mut keep: Vec<HashSet<Vec<u8>>> = vec![HashSet::new(); object_dirs.len()];
    let creds = crate::sys::creds();
    let prev = prev.filter(|p| {
        let same = p.creds == creds;
        if !same {
            tracing::warn!(
                "saved catalog made with other credentials (uid, gid, groups) than this agent's: \
                 its copies are not reused"
            );
        }
        same
    });
    if let Some(prev) = prev {
        reuse_partial(
            entries,
            prev,
            object_dirs,
            dir_fds,
            tiers,
            chunk_size,
            &mut keep,
            &mut out,
        );
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    if let Some(prev) = prev {
        for (i, e) in entries.iter().enumerate().filter(|(_, e)| e.stat.is_file()) {
            let Some(p) = prev.entries.get(&e.rel_path) else {
                continue;
            };
            if !p.stat.same_version(&e.stat)
                || state::state_of(p.state) != state::PLACED
                || p.checksum == 0
            {
                continue;
            }
            let Some((t, fd)) = saved_tier(prev, p, object_dirs, dir_fds) else {
                continue;
            };
            let name = object_name(object_id(&e.rel_path));
            match sys::copy_stat_at(fd, &name) {
                Ok(c)
                    if c.is_regular
                        && c.size == e.stat.size
                        && (c.ino, c.ctime_ns) == (p.copy_ino, p.copy_ctime) => {}
                Ok(_) => {
                    // Written to, truncated, replaced or not a file since it was placed: it
                    // would be served wrong.
                    out.rejected += 1;
                    continue;
                }
                Err(_) => continue,
            }
            candidates.push((i, t, name, p.checksum, (p.copy_ino, p.copy_ctime)));
        }
    }
    let verified: Vec<bool> = match verify {
        Verify::Size => vec![true; candidates.len()],
        Verify::Checksum => verify_all(&candidates, dir_fds, threads),
    };
    for ((i, t, name, sum, (copy_ino, copy_ctime)), ok) in candidates.into_iter().zip(verified) {
        let e = &mut entries[i];
        if !ok {
            tracing::warn!(
                "cached copy of {} failed its checksum: dropped, placed again on demand",
                super::walk::rel_display(&e.rel_path).display()
            );
            out.rejected += 1;
            continue;
        }
        if !tiers.adopt(t, e.stat.size) {
            continue;
        }
        e.state = state::word(state::PLACED, t as u8);
        e.checksum = sum;
        e.copy_ino = copy_ino;
        e.copy_ctime = copy_ctime;
        keep[t].insert(name.to_vec());
        out.files += 1;
        out.bytes += e.stat.size;
    }
    for (t, dir) in object_dirs.iter().enumerate() {
        let (Ok(rd), Some(fd)) = (std::fs::read_dir(dir), &dir_fds[t]) else {
            continue;
        };
        for de in rd.flatten() {
            let name = de.file_name();
            let b = name.as_bytes();
            let kept = keep[t].contains(b);
            if !kept {
                match sys::unlink_at(fd, b) {
                    Ok(()) => out.removed += 1,
                    Err(e) => tracing::debug!("cannot remove {}: {e}", de.path().display()),
                }
            }
        }
    }
    out
}

/// A copy that may be reused: (entry index, tier, object name, recorded checksum, recorded copy
/// identity).
type Candidate = (usize, usize, [u8; 16], u64, (u64, u64));

/// The PARTIAL half of `reuse_chunked`.
#[allow(clippy::too_many_arguments)]
fn reuse_partial(
    entries: &mut [CatalogEntry],
    prev: &Persisted,
    object_dirs: &[PathBuf],
    dir_fds: &[Option<OwnedFd>],
    tiers: &Tiers,
    chunk_size: u64,
    keep: &mut [HashSet<Vec<u8>>],
    out: &mut ReuseOutcome,
) {
    use crate::placement::chunks::{present_bytes, ChunkFile, ChunkGeometry};
    if chunk_size == 0 {
        return;
    }
    for e in entries.iter_mut().filter(|e| e.stat.is_file()) {
        let Some(p) = prev.entries.get(&e.rel_path) else {
            continue;
        };
        // Only files that get a chunk bitmap in the new table (larger than one chunk).
        if !p.stat.same_version(&e.stat)
            || state::state_of(p.state) != state::PARTIAL
            || e.stat.size <= chunk_size
        {
            continue;
        }
        let Some((t, fd)) = saved_tier(prev, p, object_dirs, dir_fds) else {
            continue;
        };
        let name = granary_shm::chunks_name(object_id(&e.rel_path));
        let geo = ChunkGeometry::of(&e.stat, chunk_size);
        let Ok(Some(cf)) = ChunkFile::open_matching(fd, &name, geo) else {
            continue;
        };
        let recorded = (0..geo.count())
            .filter(|&k| cf.recorded(k).is_ok_and(|s| s != 0))
            .count() as u64;
        let Ok(words) = cf.validate() else { continue };
        let valid: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
        if valid < recorded {
            tracing::warn!(
                "{} of {} cached chunks of {} failed their checksum: dropped, fetched again on demand",
                recorded - valid,
                recorded,
                super::walk::rel_display(&e.rel_path).display()
            );
            out.rejected += 1;
        }
        if valid == 0 {
            continue;
        }
        // Charged as placement charges them: each chunk rounded to the tier's blocks.
        let charge: u64 = (0..geo.count())
            .filter(|&k| words[(k / 64) as usize] & (1 << (k % 64)) != 0)
            .map(|k| tiers.charge(t, geo.range(k).1))
            .sum();
        if !tiers.adopt(t, charge) {
            continue;
        }
        e.state = state::word(state::PARTIAL, t as u8);
        e.chunks = words;
        e.copy_ino = cf.ino();
        keep[t].insert(name.to_vec());
        out.files += 1;
        out.bytes += present_bytes(&geo, &e.chunks);
    }
}

/// Re-hashes each candidate's object with `threads` threads; true where it matches.
fn verify_all(candidates: &[Candidate], dir_fds: &[Option<OwnedFd>], threads: usize) -> Vec<bool> {
    let next = AtomicUsize::new(0);
    let results: Vec<AtomicBool> = candidates.iter().map(|_| AtomicBool::new(false)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 64).min(candidates.len().max(1)) {
            s.spawn(|| {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((_, t, name, sum, _)) = candidates.get(k) else {
                        break;
                    };
                    let ok = dir_fds[*t]
                        .as_ref()
                        .and_then(|fd| hash_object(fd, name, &mut buf).ok())
                        .is_some_and(|h| h == *sum);
                    results[k].store(ok, Ordering::Relaxed);
                }
            });
        }
    });
    results.into_iter().map(AtomicBool::into_inner).collect()
}

/// xxh3 of an object as placement computes it (never 0).
fn hash_object(dir: &OwnedFd, name: &[u8], buf: &mut [u8]) -> std::io::Result<u64> {
    let f = sys::open_read_at(dir, name)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut off = 0u64;
    loop {
        match std::os::unix::fs::FileExt::read_at(&f, buf, off) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // Reading the copy should not evict the program's working set.
    sys::fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
    Ok(h.digest().max(1))
}

/// The live state of a table as catalog entries (table order, children by index), for saving:
/// copies in progress are saved as UNPLACED, complete ones with their tier and checksum.
pub fn snapshot(table: &granary_shm::Table) -> Vec<CatalogEntry> {
    let n = table.entry_count();
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let Some(e) = table.entry(i) else { break };
        let w = table.state(i);
        let st = state::state_of(w);
        let word = if e.stat.is_file() && matches!(st, state::QUEUED | state::PLACING) {
            state::word(state::UNPLACED, 0)
        } else {
            w
        };
        let children = if e.stat.is_dir() && e.child_count > 0 {
            (e.first_child as usize..(e.first_child + e.child_count) as usize).collect()
        } else {
            Vec::new()
        };
        let (copy_ino, copy_ctime) = match st {
            state::PLACED | state::PARTIAL => table.copy_identity(i),
            _ => (0, 0),
        };
        out.push(CatalogEntry {
            rel_path: table.rel_path(&e).unwrap_or_default().to_vec(),
            stat: e.stat,
            link_target: table.link_target(&e).unwrap_or_default().to_vec(),
            children,
            state: word,
            checksum: if st == state::PLACED {
                table.checksum(i)
            } else {
                0
            },
            chunks: chunk_bitmap(table, i),
            copy_ino,
            copy_ctime,
        });
    }
    out
}

/// The entry's chunk bitmap as words (empty when it has none or no chunk is present).
fn chunk_bitmap(table: &granary_shm::Table, idx: u32) -> Vec<u64> {
    let n = table.chunk_count(idx);
    let mut words = vec![0u64; n.div_ceil(64) as usize];
    for k in 0..n {
        if table.chunk_present(idx, k) {
            words[(k / 64) as usize] |= 1 << (k % 64);
        }
    }
    if words.iter().all(|w| *w == 0) {
        words.clear();
    }
    words
}
