//! The owner's side of a transfer's copy: mappings of this rank's own copies, kept with their
//! pages mapped. With a single-copy transport (OpenMPI's shared memory: `process_vm_readv`; an
//! RDMA NIC registering the pages) the receiver reads straight from the owner's mapping, and
//! every page not mapped yet is faulted in on the transfer's critical path: a fresh mapping of
//! 2 MiB cost +0.05 ms, of 8 MiB +0.31 ms (`bench/floor/mpi_source_map.c`), and unmapping it
//! after the send costs a TLB shootdown per transfer. So a copy's mapping is made once and kept
//! (its pages stay mapped after the first transfer), and on tiers in memory (tmpfs: populating
//! reads no device) a warming pass maps and populates the copies this rank places before anyone
//! asks for them, a slice per call at idle priority.
//!
//! Bounded: at most `MAX_MAPS` mappings (a mapping is one VMA; the kernel's default limit is
//! 65,530 per process) and a quarter of the open-file limit (each holds a descriptor); a
//! warming pass also drops the mappings of copies that are gone (a mapping of a removed file
//! would keep its pages).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use granary_shm::{State, Table};

use super::wire::Mapped;

/// Mappings kept at most, whatever the open-file limit (`max_maps`).
const MAX_MAPS: usize = 16384;

/// Mappings kept at most here: each holds its copy's descriptor, and placement needs its own
/// (under `ulimit -n 1024` ~750 kept copies a rank left placement none: every copy it received
/// failed with "Too many open files"). A quarter of the open-file limit; with the mirrors of
/// other ranks' copies (`direct`, an eighth) and the inode pins (half of what exceeds 4,096)
/// at most seven eighths, less 2,048.
fn max_maps() -> usize {
    (granary_core::sys::open_files_limit() / 4).min(MAX_MAPS as u64) as usize
}
/// The most a call of `populate` maps: a thread at idle priority is not
/// preempted inside a system call.
const SLICE: usize = 64 << 10;

struct Kept {
    object: u64,
    tier: usize,
    file: File,
    map: Arc<memmap2::MmapRaw>,
    /// Told to the ranks on this host (`direct`).
    announced: bool,
}

#[derive(Default)]
pub struct Maps {
    kept: Mutex<HashMap<u32, Kept>>,
}

impl Maps {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Kept>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mapping of the complete copy of `idx` (`size` bytes, object `object`) on `tier`, for
    /// sending from: the kept one while it is still that copy, else the copy opened, checked
    /// (`open`) and mapped now, and kept unless `transient` (a copy in the staging tier, soon
    /// dropped: a kept mapping would hold its pages until the next warming pass).
    #[allow(clippy::too_many_arguments)]
    pub fn get(
        &self,
        t: &Table,
        idx: u32,
        tier: usize,
        object: u64,
        size: u64,
        transient: bool,
        open: impl FnOnce() -> Option<File>,
    ) -> Option<Arc<memmap2::MmapRaw>> {
        if let Some(k) = self.lock().get(&idx) {
            if k.object == object && k.tier == tier && current(t, idx, k) {
                return Some(k.map.clone());
            }
        }
        let file = open()?;
        let map = Arc::new(
            memmap2::MmapOptions::new()
                .len(size as usize)
                .map_raw_read_only(&file)
                .ok()?,
        );
        if !transient {
            self.keep(
                idx,
                Kept {
                    object,
                    tier,
                    file,
                    map: map.clone(),
                    announced: false,
                },
            );
        }
        Some(map)
    }

    fn keep(&self, idx: u32, k: Kept) {
        let mut kept = self.lock();
        if kept.len() < max_maps() || kept.contains_key(&idx) {
            kept.insert(idx, k);
        }
    }

    /// The kept mappings of copies on tiers in memory (`memory[tier]`: reading them never
    /// waits for a device) not announced yet to the ranks on this host (`all`: every one),
    /// marked announced (`direct`).
    pub fn to_announce(&self, t: &Table, memory: &[bool], all: bool) -> Vec<Mapped> {
        let mut kept = self.lock();
        let mut out = Vec::new();
        for (&idx, k) in kept.iter_mut() {
            let sum = t.checksum(idx);
            // No checksum recorded: nothing would prove a direct read right.
            if (k.announced && !all) || !memory.get(k.tier).copied().unwrap_or(false) || sum == 0 {
                continue;
            }
            let Ok((ino, ctime)) = granary_core::sys::copy_identity(&k.file) else {
                continue;
            };
            k.announced = true;
            out.push(Mapped {
                idx,
                object: k.object,
                size: k.map.len() as u64,
                addr: k.map.as_ptr() as usize as u64,
                fd: k.file.as_raw_fd() as u32,
                sum,
                ino,
                ctime,
            });
        }
        out
    }

    /// Mappings kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// One warming pass: drops the mappings of copies that are gone, then maps and populates
    /// the copies `own(idx)` says this rank serves from its tiers in memory (`memory[tier]`),
    /// up to `max_maps()`. `open(idx, tier, object, size)` opens and checks a copy.
    pub fn warm(
        &self,
        t: &Table,
        memory: &[bool],
        own: impl Fn(u32) -> bool,
        open: impl Fn(u32, usize, u64, u64) -> Option<File>,
        stopping: &dyn Fn() -> bool,
    ) {
        self.lock().retain(|&idx, k| current(t, idx, k));
        let max = max_maps();
        for idx in 0..t.entry_count() {
            if stopping() || self.len() >= max {
                return;
            }
            let w = t.state(idx);
            let tier = w.tier() as usize;
            if w.state() != State::Placed
                || !memory.get(tier).copied().unwrap_or(false)
                || !own(idx)
                || self.lock().contains_key(&idx)
            {
                continue;
            }
            let Some(e) = t.entry(idx).filter(|e| e.stat.size > 0) else {
                continue;
            };
            let Some(file) = open(idx, tier, e.object, e.stat.size) else {
                continue;
            };
            let Ok(map) = memmap2::MmapOptions::new()
                .len(e.stat.size as usize)
                .map_raw_read_only(&file)
            else {
                continue;
            };
            populate(&map, memmap2::Advice::PopulateRead);
            self.keep(
                idx,
                Kept {
                    object: e.object,
                    tier,
                    file,
                    map: Arc::new(map),
                    announced: false,
                },
            );
        }
    }
}

/// Maps every page of `map` (`how`: `PopulateRead` or `PopulateWrite`), `SLICE` bytes per call
/// (a thread at idle priority is not preempted inside a system call). False before Linux 5.14,
/// which has neither: the first copy maps them.
pub fn populate(map: &memmap2::MmapRaw, how: memmap2::Advice) -> bool {
    let mut off = 0;
    while off < map.len() {
        let n = (map.len() - off).min(SLICE);
        if map.advise_range(how, off, n).is_err() {
            return false;
        }
        off += n;
    }
    true
}

/// True while `k` is still the complete copy of `idx` the table knows: PLACED on its tier, and
/// the file it maps has the identity recorded at placement (a copy dropped and placed again
/// under the same name is another file).
fn current(t: &Table, idx: u32, k: &Kept) -> bool {
    let w = t.state(idx);
    w.state() == State::Placed
        && w.tier() as usize == k.tier
        && t.entry(idx).is_some_and(|e| e.object == k.object)
        && granary_core::sys::copy_identity(&k.file).ok() == Some(t.copy_identity(idx))
}
