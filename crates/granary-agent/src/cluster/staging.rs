//! The staging tier: copies of files other ranks hold, received when this node's programs open
//! them. Bounded: when a new copy does not fit, the oldest staged copies are dropped first
//! (every file is read once per epoch in a random order, so no choice does better without the
//! order; a copy still open keeps its bytes, the next open of a dropped one fetches it again).
//!
//! **Recycled pages.** A fresh copy costs more than its transfer: on tmpfs the kernel allocates
//! and zeroes every page (`fallocate`, ~0.23 ns/B here), each page of the mapping MPI writes
//! into faults once (~0.3 ns/B), and a dropped copy frees its pages (~0.16 ns/B) — together
//! several times the copy itself (~0.07 ns/B). So staging files are reused: a dropped copy whose
//! file nobody else has open (the kernel grants a write lease only then:
//! `sys::nobody_else_has_open`) keeps its pages and its mapping, renamed to a free name, and
//! the next copy lands in it. A dropped copy someone still reads is removed as before (the
//! reader keeps its bytes). Before the tier is full (the first epoch), a filler thread keeps a
//! reserve of such free files made ahead, of the sizes copies just needed, so a copy on the
//! program's critical path finds its pages ready. Free files are charged to the staging tier
//! like copies (the tier never holds more than its size), named `.tmp-free-*` (a sweep
//! removes only old ones: those of a killed agent), and removed when the node stops.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use granary_core::placement::peer_copy;
use granary_core::placement::{SourceCtx, Space};
use granary_core::stats::AgentCounters;
use granary_core::sys;
use granary_core::Reservation;
use granary_shm::State;

/// A staging file the agent holds open for reading and writing, with its pages mapped.
pub struct Slot {
    pub file: File,
    pub map: Arc<memmap2::MmapRaw>,
}

/// A free staging file: nobody else has it open, its pages are the agent's to overwrite.
pub struct Free {
    pub slot: Slot,
    /// Its name in the staging tier's object directory.
    pub name: Vec<u8>,
    /// What it is charged to the staging tier while free (0 once handed out).
    charge: u64,
    /// Its inode and length, when read as it was recycled (`Receiving::part_from`).
    pub known: Option<(u64, u64)>,
}

/// A staged copy, and its file and mapping while the node keeps them.
struct Staged {
    idx: u32,
    slot: Option<Slot>,
}

/// Staged copies that keep their file open and mapped (the newest); older ones are opened and
/// mapped again when recycled.
const KEEP_MAPPED: usize = 256;

/// Descriptors the staging tier holds at most — its free files and the staged copies it keeps
/// open (`KEEP_MAPPED`) each — as a share of the open-file limit: the inode pins take half of
/// it, the owner's kept mappings a quarter, the mirrors an eighth (a 1,024 limit and small
/// files left the filler holding 370 free files).
/// Read once: the agent raised its limit at start, and a staged copy's `push` is on a
/// program's critical path.
fn fds_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| (granary_core::sys::open_files_limit() / 32).max(4) as usize)
}

/// Free files the filler keeps ready: at most this many bytes…
const RESERVE_MAX: u64 = 256 << 20;
/// …and at most this share of the staging tier (1/8).
const RESERVE_SHARE: u64 = 8;
/// The name of every free staging file starts with this (the sweep removes old ones).
const FREE_PREFIX: &[u8] = b".tmp-free-";
/// Files larger than this are never made ahead.
const RESERVE_FILE_MAX: u64 = 64 << 20;

#[derive(Default)]
pub struct Staging {
    /// Staged entries, oldest first.
    order: Mutex<VecDeque<Staged>>,
    free: Mutex<FreeFiles>,
    /// Wakes the filler: a free file was taken, or one was missing.
    wanted_cv: Condvar,
    seq: AtomicU64,
    /// Dropped copies whose file was reused.
    recycled: AtomicU64,
    /// Copies that found neither a free file nor a dropped copy's to land in: their pages were
    /// allocated on the program's critical path.
    fresh: AtomicU64,
}

#[derive(Default)]
struct FreeFiles {
    files: Vec<Free>,
    bytes: u64,
    /// Sizes copies just needed (taken or missing), for the filler to make again.
    wanted: VecDeque<u64>,
}

/// What dropping the oldest staged copy gave.
pub enum Evicted {
    /// Nothing was staged.
    Nothing,
    /// A copy was dropped (its space given back).
    Dropped,
    /// A copy was dropped and its file is free for reuse (not charged to the tier).
    Recycled(Free),
}

impl Staging {
    /// `idx` was just staged; `slot` is its file and mapping, kept for reuse.
    pub fn push(&self, idx: u32, slot: Option<Slot>) {
        let mut o = self.lock();
        o.push_back(Staged { idx, slot });
        // Only the newest keep theirs (file descriptors and mappings are bounded).
        let n = o.len();
        let keep = KEEP_MAPPED.min(fds_max());
        if n > keep {
            if let Some(old) = o.get_mut(n - 1 - keep) {
                old.slot = None;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Staged>> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn free_lock(&self) -> std::sync::MutexGuard<'_, FreeFiles> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn free_name(&self) -> Vec<u8> {
        // The pid once (`getpid` is a system call each time, once per recycled copy).
        static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!(
            "{}{}-{n}",
            std::str::from_utf8(FREE_PREFIX).unwrap_or_default(),
            PID.get_or_init(std::process::id)
        )
        .into_bytes()
    }

    /// Drops the oldest staged copy that is still there, keeping its file when nobody else has
    /// it open and the caller can use it (`want`: a copy is waiting for a file, and the name
    /// its part will have: the dropped copy is renamed straight to it — one rename instead of
    /// two on the program's critical path; `give_back` renames it to a free name if it is not
    /// used after all).
    pub fn evict_oldest(
        &self,
        ctx: &SourceCtx,
        staging_tier: usize,
        want: Option<&[u8]>,
    ) -> Evicted {
        loop {
            let Some(s) = self.lock().pop_front() else {
                return Evicted::Nothing;
            };
            let w = ctx.table.state(s.idx);
            if w.state() != State::Placed || w.tier() as usize != staging_tier {
                continue; // invalidated or evicted meanwhile
            }
            if want.is_none() {
                if peer_copy::evict(&ctx.table, &ctx.space, s.idx).is_some() {
                    AgentCounters::add(&ctx.counters.staging_evictions, 1);
                    return Evicted::Dropped;
                }
                continue;
            }
            // The identity clients check a copy against, read before it is withdrawn.
            let recorded = ctx.table.copy_identity(s.idx);
            let name = want.map_or_else(|| self.free_name(), <[u8]>::to_vec);
            let Some((_, renamed)) = peer_copy::evict_to(&ctx.table, &ctx.space, s.idx, &name)
            else {
                continue;
            };
            AgentCounters::add(&ctx.counters.staging_evictions, 1);
            if !renamed {
                return Evicted::Dropped;
            }
            let Some(dir) = ctx.space.dir(staging_tier) else {
                return Evicted::Dropped;
            };
            // Its own file and mapping (one open file description), else opened now by the
            // name only this agent knows.
            let slot = match s.slot {
                Some(slot) => Some(slot),
                None => sys::open_rw_at(dir, &name).ok().and_then(|f| {
                    let map = map_populated(&f).ok()?;
                    Some(Slot { file: f, map })
                }),
            };
            let known = slot.as_ref().and_then(|x| unseen(&x.file, recorded));
            match (slot, known) {
                (Some(slot), Some(known)) if sys::nobody_else_has_open(&slot.file) => {
                    self.recycled.fetch_add(1, Ordering::Relaxed);
                    return Evicted::Recycled(Free {
                        slot,
                        name,
                        charge: 0,
                        known: Some(known),
                    });
                }
                _ => {
                    // Someone still reads it: it keeps its bytes, the name goes.
                    let _ = sys::unlink_at(dir, &name);
                    return Evicted::Dropped;
                }
            }
        }
    }

    /// Room for `size` bytes on the staging tier (a copy placed from the source, which makes its
    /// own file), reserved: the oldest staged copies dropped, then free files made ahead, until
    /// it fits. `None` if it does not even then.
    pub fn room<'a>(
        &self,
        ctx: &'a SourceCtx,
        staging_tier: usize,
        size: u64,
    ) -> Option<Reservation<'a>> {
        loop {
            if let Some(res) = ctx.space.reserve_on(&[staging_tier], size) {
                return Some(res);
            }
            match self.evict_oldest(ctx, staging_tier, None) {
                Evicted::Dropped => continue,
                Evicted::Recycled(f) => {
                    remove(&ctx.space, staging_tier, &f.name);
                    continue;
                }
                Evicted::Nothing => {}
            }
            let free = {
                let mut f = self.free_lock();
                let x = f.files.pop();
                if let Some(x) = &x {
                    f.bytes = f.bytes.saturating_sub(x.charge);
                }
                x
            };
            let x = free?;
            ctx.space.tiers.release(staging_tier, x.charge);
            remove(&ctx.space, staging_tier, &x.name);
        }
    }

    /// A free file for a copy of `size` bytes (its charge given back to the tier: the copy's
    /// reservation takes it again), if one whose mapping is large enough but at most twice the
    /// size is ready: the same size first, else the smallest larger one. The filler is told
    /// either way.
    pub fn take(&self, space: &Space, staging_tier: usize, size: u64) -> Option<Free> {
        let mut f = self.free_lock();
        let best = f
            .files
            .iter()
            .enumerate()
            // At most twice its size: a small copy must not take (and cut) a large file.
            .filter(|(_, x)| {
                let len = x.slot.map.len() as u64;
                len >= size && len <= size.saturating_mul(2)
            })
            .min_by_key(|(_, x)| x.slot.map.len())
            .map(|(k, _)| k);
        let got = best.map(|k| f.files.swap_remove(k));
        // One made again per copy that asked (taken or missing): the reserve follows the sizes
        // in demand without the filler doing more than the copies it stands in for.
        if size <= RESERVE_FILE_MAX {
            f.wanted.push_back(size);
            while f.wanted.len() > 64 {
                f.wanted.pop_front();
            }
        }
        let mut got = got?;
        f.bytes = f.bytes.saturating_sub(got.charge);
        drop(f);
        self.wanted_cv.notify_one();
        space
            .tiers
            .release(staging_tier, std::mem::take(&mut got.charge));
        Some(got)
    }

    /// A free file that was not used after all: kept (charged again) if the tier has room for
    /// it, else removed.
    pub fn give_back(&self, space: &Space, staging_tier: usize, mut free: Free) {
        if !free.name.starts_with(FREE_PREFIX) {
            // Renamed to a copy's part name (`evict_oldest`) but not used for it.
            let name = self.free_name();
            let renamed = space
                .dir(staging_tier)
                .is_some_and(|dir| sys::rename_at(dir, &free.name, &name).is_ok());
            if !renamed {
                remove(space, staging_tier, &free.name);
                return;
            }
            free.name = name;
        }
        let len = free.slot.map.len() as u64;
        let fits = free.charge > 0 || space.tiers.adopt(staging_tier, len);
        if !fits {
            remove(space, staging_tier, &free.name);
            return;
        }
        if free.charge == 0 {
            free.charge = space.tiers.charge(staging_tier, len);
        }
        let mut f = self.free_lock();
        f.bytes += free.charge;
        f.files.push(free);
    }

    /// Dropped copies whose file was reused, so far.
    pub fn recycled(&self) -> u64 {
        self.recycled.load(Ordering::Relaxed)
    }

    /// A copy is to land in a new file (no free file, no dropped copy's).
    pub fn count_fresh(&self) {
        self.fresh.fetch_add(1, Ordering::Relaxed);
    }

    /// Copies that landed in new files, so far.
    pub fn fresh(&self) -> u64 {
        self.fresh.load(Ordering::Relaxed)
    }

    /// Free files ready now, and their bytes.
    pub fn free(&self) -> (u64, u64) {
        let f = self.free_lock();
        (f.files.len() as u64, f.bytes)
    }

    /// Bytes of copies in the staging tier now.
    pub fn bytes(&self, space: &Space, staging_tier: usize) -> u64 {
        space.tiers.usage().get(staging_tier).map_or(0, |u| u.used)
    }

    /// The filler: keeps free files ready (up to `RESERVE_MAX` bytes or an eighth of the tier)
    /// while the tier has room: at start, of the sizes of the files other ranks hold (drawn by
    /// bytes), then one again of the size of each copy that asked for one (taken or missing),
    /// while the reserve has room (free files are never dropped to make room: the reserve keeps
    /// the dataset's mix of sizes). Removes every free file when the node stops.
    pub fn fill(
        &self,
        space: &Space,
        staging_tier: usize,
        mut sample: impl FnMut() -> Option<u64>,
        stopping: &dyn Fn() -> bool,
    ) {
        let cap = space
            .tiers
            .usage()
            .get(staging_tier)
            .map_or(0, |u| u.capacity);
        let target = (cap / RESERVE_SHARE).min(RESERVE_MAX);
        let mut started = false;
        while !stopping() {
            let size = {
                let mut f = self.free_lock();
                let next = f.wanted.pop_front();
                let size = match next {
                    Some(s) => Some(s),
                    None if !started => sample(),
                    None => None,
                };
                match size {
                    Some(s) if f.bytes + s <= target && f.files.len() < fds_max() => Some(s),
                    _ => {
                        started = true;
                        let _ = self
                            .wanted_cv
                            .wait_timeout(f, Duration::from_millis(50))
                            .unwrap_or_else(|e| e.into_inner());
                        None
                    }
                }
            };
            let Some(size) = size.filter(|&s| s > 0 && s <= RESERVE_FILE_MAX) else {
                continue;
            };
            if !space.tiers.adopt(staging_tier, size) {
                // The tier is full: dropped copies are recycled from now on.
                started = true;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let charge = space.tiers.charge(staging_tier, size);
            let name = self.free_name();
            match make(space, staging_tier, &name, size) {
                Ok(slot) => {
                    let mut f = self.free_lock();
                    f.bytes += charge;
                    f.files.push(Free {
                        slot,
                        name,
                        charge,
                        known: None,
                    });
                }
                Err(e) => {
                    tracing::debug!("making a staging file ahead: {e}");
                    space.tiers.release(staging_tier, charge);
                    remove(space, staging_tier, &name);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        let files = std::mem::take(&mut self.free_lock().files);
        for x in files {
            space.tiers.release(staging_tier, x.charge);
            remove(space, staging_tier, &x.name);
        }
    }
}

/// A new free file of `size` bytes in the staging tier: written (pages allocated, cheaper than
/// `fallocate` and a fault per page) and mapped with its pages. In slices of `SLICE` bytes, each
/// its own system call: the filler runs at idle priority, but the kernel does not preempt a
/// thread inside a call, and one call allocating or mapping megabytes kept a program woken on
/// the same core waiting ~1 ms, once per remote read, right after its copy was published (the
/// reserve is refilled then).
fn make(space: &Space, staging_tier: usize, name: &[u8], size: u64) -> std::io::Result<Slot> {
    use std::os::unix::fs::FileExt;
    let dir = space
        .dir(staging_tier)
        .ok_or_else(|| std::io::Error::other("no staging directory"))?;
    let file = sys::create_excl_at(dir, name, 0o600)?;
    let zeros = vec![0u8; SLICE.min(size as usize)];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], off)?;
        off += n as u64;
    }
    let map = memmap2::MmapOptions::new().map_raw(&file)?;
    if !super::maps::populate(&map, memmap2::Advice::PopulateWrite) {
        // A kernel without MADV_POPULATE_WRITE (before 5.14): all at once.
        return Ok(Slot {
            map: map_populated(&file)?,
            file,
        });
    }
    Ok(Slot {
        file,
        map: Arc::new(map),
    })
}

/// The most a filler's system call allocates or maps (`make`): ~30 µs of kernel work here.
const SLICE: usize = 64 << 10;

/// Its inode and length (one `statx`, kept for `Receiving::part_from`) if a client that opened
/// the staged copy's old name in the instant of its rename (its open completing after the
/// lease check) would reject the file: the rename moved its ctime off the one recorded at
/// placement, which every client checks a copy against. With coarse timestamps a rename in the
/// same clock tick as the placement leaves the ctime as it was: such a copy is removed, not
/// recycled (`None`).
fn unseen(file: &File, recorded: (u64, u64)) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let md = file.metadata().ok()?;
    let ctime = (md.ctime() as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(md.ctime_nsec() as u64);
    (md.ino() == recorded.0 && ctime != recorded.1).then_some((md.ino(), md.len()))
}

/// `file` mapped shared, its pages mapped at once.
fn map_populated(file: &File) -> std::io::Result<Arc<memmap2::MmapRaw>> {
    Ok(Arc::new(
        memmap2::MmapOptions::new().populate().map_raw(file)?,
    ))
}

fn remove(space: &Space, staging_tier: usize, name: &[u8]) {
    if let Some(dir) = space.dir(staging_tier) {
        let _ = sys::unlink_at(dir, name);
    }
}
