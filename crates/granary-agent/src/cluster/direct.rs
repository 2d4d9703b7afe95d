//! Same-host reads: a rank copies a file another rank on the same host holds straight from that
//! rank's kept mapping of its copy (`maps`), with one `process_vm_readv` per slice, in the thread
//! that took the program's request — no MPI message, no other thread on either side.
//!
//! Why: on one host an MPI transfer of a file is the same kernel copy (OpenMPI's shared-memory
//! transport reads the sender's pages with `process_vm_readv`), wrapped in a request, a reply,
//! a rendezvous per piece, and four thread wake-ups across two processes (the requester's
//! communication thread, the owner's, and back); and the checksum is a second pass over the
//! copy once it landed. Here each slice is hashed right after it is copied, while it is in the
//! core's cache, and the owner does nothing per file.
//!
//! How: at start every rank tells every other where it runs (`Msg::Near`: a key of its host's
//! boot, PID namespace and host name, and its process id). A rank whose warming pass kept
//! mappings of its copies on tiers in memory tells the ranks on its host where they are
//! (`Msg::Mapped`: entry, object id, size, address, the copy's checksum). A program's remote
//! read of such a file then reads the owner's pages into the staging file's mapping, slice by
//! slice, and checks the whole against the owner's checksum before publishing the copy, as for
//! a copy received over MPI (a packed file against the pack index's).
//!
//! Nothing here is trusted beyond what the checksum proves: a mapping the owner dropped (its
//! address now unmapped, or mapping another file), an owner gone (its process id unused, or
//! another process's), a changed copy — each gives an error or a checksum that does not match,
//! and the read goes the MPI way (`fetch`), which reads the source if it must. A stopped owner
//! costs nothing: its pages are read all the same. The kernel allows the read only for a
//! process of the same user that may trace the owner (`ptrace` access mode); when it refuses,
//! this rank stops trying. An entry invalidated anywhere is forgotten here before its new copy
//! is announced (`Node::control`). Ranks on different hosts — or in different PID or UTS
//! namespaces, as the Slurm test's "nodes" are — never read each other this way.
//!
//! **Mirrors.** `process_vm_readv` pins each of the owner's pages for the copy (walking the
//! owner's page tables, a page at a time) and copies in the kernel: 18–24 µs for 128 KiB here,
//! against 10–12 µs for a copy between two mappings of one process (`memcpy`). So the first read
//! of an owner's copy also takes the owner's file itself (`pidfd_getfd`: the kernel asks the
//! same right to trace the owner as `process_vm_readv` does) and maps it read-only here; the
//! copy is then a plain memory copy, and the mapping is kept (`Mirror`) for the next read of the
//! file, the next epoch's. Mirrors are also made ahead, with their pages mapped, as copies are
//! announced (`Direct::warm`, at idle priority): a first read then maps no page either. A mirror
//! is only a faster way to the same bytes: what it gives is checked against the owner's checksum
//! like the rest. Its file is looked at (`fstat`) before
//! every use: a copy its owner dropped (unlinked) or cut short is not read through it (a mapping
//! read past the file's end would fault) and the mirror goes. Nor is a file that is not the copy
//! announced (its inode and change time, `Mapped`): an owner that let go of a copy closed its
//! descriptor, and the number may name any file it opened since — a source file a user may cut
//! short, a staging file it reuses for a smaller copy. A mirror never used again is found
//! so by the check each new mirror makes of the oldest one, so dropped copies' pages are not
//! held for long.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use granary_core::placement::peer_copy::{ReceiveError, Receiving};

use super::transport::Landing;
use super::wire::{Mapped, Msg};

/// Bytes copied and hashed at a time: small enough to be hashed from the core's cache right
/// after the copy, large enough that a system call per slice costs little. On this machine the
/// checksum ran at 0.029–0.032 ns/B with 128 KiB slices and 0.043–0.053 with 512 KiB ones: the
/// kernel's copy of a larger slice does not leave it all in the cache (docs/cluster.md, "Where a
/// same-host read's time goes").
const SLICE: usize = 128 << 10;
/// Files larger than this go the MPI way: the thread that copies is the one that takes every
/// program's requests.
pub const MAX: u64 = 64 << 20;
/// Mirrors kept at most (each one mapping: the kernel's default limit is 65,530 per process,
/// and the owner's kept mappings are bounded the same way, `maps`), whatever the open-file limit
/// (`mirrors_max`).
const MIRRORS_MAX: usize = 16384;

/// The most `Direct::warm` maps ahead, in bytes.
const WARM_BYTES_MAX: u64 = 64 << 30;
/// Mirrors kept at most here: each holds a descriptor, and placement and the inode pins need
/// theirs (the pins take half of the open-file limit).
fn mirrors_max() -> usize {
    (granary_core::sys::open_files_limit() / 8).min(MIRRORS_MAX as u64) as usize
}

/// An owner's mapping this rank may read.
#[derive(Clone, Copy)]
pub struct Source {
    pub rank: u32,
    pub pid: u32,
    pub m: Mapped,
}

pub struct Direct {
    /// Where this process runs (`host_key`) and its process id.
    host: u64,
    pid: u32,
    /// Used at all: not `--no-direct`, and the kernel did not refuse.
    on: AtomicBool,
    /// The process id of every rank on this host (`None`: elsewhere, or not heard yet).
    near: Mutex<Vec<Option<u32>>>,
    /// Owners' mappings announced to this rank, by entry.
    sources: Mutex<HashMap<u32, Source>>,
    /// A rank on this host was learned: the next warming pass announces every kept mapping.
    announce_all: AtomicBool,
    /// Owners' files are taken and mapped here (`Mirror`): not refused by the kernel.
    mirror_on: AtomicBool,
    mirrors: Mutex<Mirrors>,
    /// Entries announced since the last `warm` pass, to mirror ahead.
    unwarmed: Mutex<VecDeque<u32>>,
    /// Copies read this way: files and bytes.
    pub files: AtomicU64,
    pub bytes: AtomicU64,
}

impl Direct {
    pub fn new(ranks: u32, on: bool) -> Direct {
        let host = host_key();
        Direct {
            host: host.unwrap_or(0),
            pid: std::process::id(),
            on: AtomicBool::new(on && host.is_some()),
            near: Mutex::new(vec![None; ranks as usize]),
            sources: Mutex::default(),
            announce_all: AtomicBool::new(false),
            mirror_on: AtomicBool::new(true),
            mirrors: Mutex::default(),
            unwarmed: Mutex::default(),
            files: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// This rank's `Msg::Near`, for every other rank.
    pub fn card(&self) -> Msg {
        Msg::Near {
            host: self.host,
            pid: self.pid,
        }
    }

    fn near_lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<u32>>> {
        self.near.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sources_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Source>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `from` says where it runs.
    pub fn learn(&self, from: u32, host: u64, pid: u32) {
        let same = host == self.host && pid != self.pid && self.on();
        if let Some(slot) = self.near_lock().get_mut(from as usize) {
            *slot = same.then_some(pid);
        }
        if same {
            self.announce_all.store(true, Ordering::Release);
        }
    }

    /// The ranks on this host.
    pub fn near_ranks(&self) -> Vec<u32> {
        if !self.on() {
            return Vec::new();
        }
        let near = self.near_lock();
        (0..near.len() as u32)
            .filter(|&r| near[r as usize].is_some())
            .collect()
    }

    /// True once after a rank on this host was learned (announce every kept mapping again).
    pub fn take_announce_all(&self) -> bool {
        self.announce_all.swap(false, Ordering::AcqRel)
    }

    /// `from` announced mappings of its copies.
    pub fn learn_mapped(&self, from: u32, v: Vec<Mapped>) {
        let Some(pid) = self.near_lock().get(from as usize).copied().flatten() else {
            return;
        };
        let mut s = self.sources_lock();
        let mut q = self.unwarmed.lock().unwrap_or_else(|e| e.into_inner());
        let ahead = self.mirror_on.load(Ordering::Relaxed);
        for m in v {
            if ahead {
                q.push_back(m.idx);
            }
            s.insert(m.idx, Source { rank: from, pid, m });
        }
    }

    /// Mirrors ahead, at idle priority (the caller's thread), the copies announced since the
    /// last pass, their pages mapped a slice per call (`maps::populate`): a first read then
    /// copies from a mapping whose pages are there. Made on the first read instead, a mirror
    /// costs that read the mapping of every page (~0.3 µs per 4 KiB here: 0.15 ms of a 2 MiB
    /// read, whose copy takes 0.33 ms). At most `WARM_BYTES_MAX` bytes mapped so (their page
    /// tables: 2 MiB per GiB), and within the mirrors' own bound.
    pub fn warm(&self, stopping: &dyn Fn() -> bool) {
        loop {
            if !self.mirror_on.load(Ordering::Relaxed) {
                // Refused by the kernel: nothing will be mirrored.
                self.unwarmed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                return;
            }
            if stopping() {
                return;
            }
            let next = self
                .unwarmed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some(idx) = next else { return };
            let Some(src) = self.sources_lock().get(&idx).copied() else {
                continue; // forgotten since
            };
            {
                let m = self.mirrors_lock();
                if m.map.contains_key(&idx) {
                    continue;
                }
                if m.map.len() >= mirrors_max() || m.warmed_bytes + src.m.size > WARM_BYTES_MAX {
                    // Full: what is announced meanwhile is mirrored by its first read.
                    self.unwarmed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    return;
                }
            }
            self.mirror_with(&src, true);
        }
    }

    /// Other ranks' mappings known now.
    pub fn known(&self) -> usize {
        self.sources_lock().len()
    }

    /// Entry `idx`'s announced mapping is not to be used (invalidated, or it failed once).
    pub fn forget(&self, idx: u32) {
        self.sources_lock().remove(&idx);
        self.mirrors_lock().remove(idx);
    }

    fn mirrors_lock(&self) -> std::sync::MutexGuard<'_, Mirrors> {
        self.mirrors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This rank's own mapping of `src`'s file (`Mirror`), kept or made now; `None`: read it
    /// with `process_vm_readv` (mirrors refused, the file not what was announced, gone).
    fn mirror(&self, src: &Source) -> Option<Arc<memmap2::MmapRaw>> {
        self.mirror_with(src, false)
    }

    /// `mirror`; `ahead`: made by `warm`, its pages mapped now a slice per call at idle
    /// priority; else in one call, on the read's critical path. `bench/floor/copy_paths.c`
    /// here (2 / 8 MiB, out of the caches): a copy through a mapping made for it 0.67 / 2.69 ms
    /// (0.69 / 2.68 with its pages faulted by the copy instead), through one made ahead 0.41 /
    /// 1.81 ms.
    fn mirror_with(&self, src: &Source, ahead: bool) -> Option<Arc<memmap2::MmapRaw>> {
        if !self.mirror_on.load(Ordering::Relaxed) {
            return None;
        }
        let kept = self.mirrors_lock().map.get(&src.m.idx).and_then(|m| {
            (m.of == (src.rank, src.pid, src.m)).then(|| (m.file.clone(), m.map.clone()))
        });
        if let Some((file, map)) = kept {
            if whole(&file, &src.m) {
                return Some(map);
            }
            self.mirrors_lock().remove(src.m.idx);
            return None;
        }
        let file = match self.mirrors_lock().take_fd(src.pid, src.m.fd) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EPERM | libc::ENOSYS | libc::EINVAL)
                ) {
                    tracing::info!(
                        "mapping other ranks' copies here: {e}; copying with process_vm_readv"
                    );
                    self.mirror_on.store(false, Ordering::Relaxed);
                }
                return None;
            }
        };
        if !whole(&file, &src.m) {
            return None;
        }
        let mut opts = memmap2::MmapOptions::new();
        opts.len(src.m.size as usize);
        if !ahead {
            opts.populate();
        }
        let map = opts.map_raw_read_only(&*file).ok()?;
        if ahead {
            super::maps::populate(&map, memmap2::Advice::PopulateRead);
        }
        let map = Arc::new(map);
        let mut m = self.mirrors_lock();
        m.keep(
            src.m.idx,
            Mirror {
                of: (src.rank, src.pid, src.m),
                file,
                map: map.clone(),
                seq: 0,
                ahead,
            },
            mirrors_max(),
        );
        Some(map)
    }

    /// Where to read entry `idx` (object id `object`, `size` bytes) from, if one of `owners`
    /// (live, in the order to ask them) announced a mapping of it.
    pub fn source(&self, idx: u32, object: u64, size: u64, owners: &[u32]) -> Option<Source> {
        if !self.on() || size == 0 || size > MAX {
            return None;
        }
        let s = *self.sources_lock().get(&idx)?;
        let pid = self.near_lock().get(s.rank as usize).copied().flatten()?;
        (s.m.object == object && s.m.size == size && s.pid == pid && owners.contains(&s.rank))
            .then_some(s)
    }

    /// Copies `src`'s bytes into `landing` (the part file's mapping, at least `src.m.size`
    /// long) slice by slice, each handed to `rx` (hashed, progress published) right after its
    /// copy. `Err`: not all of it came; the caller abandons the copy.
    pub fn copy(
        &self,
        src: &Source,
        landing: &Landing,
        rx: &mut Receiving,
    ) -> Result<(), ReceiveError> {
        self.fill(src, landing, |bytes| rx.landed(bytes))
    }

    /// `copy`, each slice handed to `landed` as it is copied.
    fn fill(
        &self,
        src: &Source,
        landing: &Landing,
        mut landed: impl FnMut(&[u8]) -> Result<(), ReceiveError>,
    ) -> Result<(), ReceiveError> {
        let size = src.m.size as usize;
        let mirror = self.mirror(src);
        if mirror.is_some() {
            landing.map_pages();
        }
        let mut off = 0;
        while off < size {
            let n = SLICE.min(size - off);
            let dst = landing.dest(off, n).ok_or(ReceiveError::Mismatch("size"))?;
            if let Some(map) = &mirror {
                // SAFETY: `map` maps `size` bytes of the owner's file, live while held here, and
                // the file was checked to be at least that long just now (`whole`: a mapping
                // read past the file's end faults); the owner never writes or truncates a
                // placed copy (a changed one fails the checksum). `dst` has room for `n` bytes
                // (`Landing::dest`), in a mapping of our own staging file that nothing else
                // writes, so the ranges do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(map.as_ptr().add(off), dst, n) };
            } else if let Err(e) = read_from(src.pid, src.m.addr + off as u64, dst, n) {
                if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOSYS)) {
                    tracing::info!("reading other ranks' copies directly: {e}; using MPI only");
                    self.on.store(false, Ordering::Relaxed);
                }
                tracing::debug!(
                    "direct read of entry {} from rank {}: {e}",
                    src.m.idx,
                    src.rank
                );
                return Err(ReceiveError::Mismatch("sender"));
            }
            landed(landing.landed(off, n))?;
            off += n;
        }
        Ok(())
    }

    /// A copy read this way was checked and published.
    pub fn count(&self, bytes: u64) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// This rank's mappings of other ranks' copies (`Mirror`), by entry, and the order they were
/// made in (the oldest is checked as each new one is made).
#[derive(Default)]
struct Mirrors {
    map: HashMap<u32, Mirror>,
    order: VecDeque<(u32, u64)>,
    seq: u64,
    /// A process descriptor of each owner (by process id), opened once.
    pidfds: HashMap<u32, OwnedFd>,
    /// Bytes mirrored ahead (`Direct::warm`) so far.
    warmed_bytes: u64,
}

/// The owner's file of an announced mapping, taken (`pidfd_getfd`) and mapped read-only here.
struct Mirror {
    /// The announcement it was made from: a new copy is announced anew (another address or
    /// descriptor), and its mirror is made again.
    of: (u32, u32, Mapped),
    file: Arc<File>,
    map: Arc<memmap2::MmapRaw>,
    /// Its place in `Mirrors::order`.
    seq: u64,
    /// Made ahead (`Direct::warm`): counted in `Mirrors::warmed_bytes`.
    ahead: bool,
}

impl Mirrors {
    /// The open file `fd` of process `pid`, duplicated into this one.
    fn take_fd(&mut self, pid: u32, fd: u32) -> std::io::Result<File> {
        use std::os::fd::AsRawFd;
        if let std::collections::hash_map::Entry::Vacant(e) = self.pidfds.entry(pid) {
            // SAFETY: a plain system call on integers; the result is checked before it is
            // used as a descriptor.
            let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if pidfd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `pidfd` was just returned by the kernel and is owned by nobody else.
            e.insert(unsafe { OwnedFd::from_raw_fd(pidfd as i32) });
        }
        let pidfd = self.pidfds.get(&pid).map_or(-1, |p| p.as_raw_fd());
        // SAFETY: a plain system call on integers; the result is checked before it is used.
        let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd as libc::c_int, 0) };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                // That process is gone (its process id may be another's by now).
                self.pidfds.remove(&pid);
            }
            return Err(e);
        }
        // SAFETY: a new descriptor from the kernel (close-on-exec), owned by nobody else.
        Ok(unsafe { File::from_raw_fd(got as i32) })
    }

    fn keep(&mut self, idx: u32, mut m: Mirror, max: usize) {
        // The oldest mirror is looked at once per new one: a copy its owner dropped and this
        // rank never reads again does not hold its pages for good.
        while let Some((old, seq)) = self.order.pop_front() {
            let Some(o) = self.map.get(&old).filter(|o| o.seq == seq) else {
                continue; // made again or forgotten since
            };
            if whole(&o.file, &o.of.2) {
                self.order.push_back((old, seq));
            } else {
                self.remove(old);
            }
            break;
        }
        if self.map.len() >= max && !self.map.contains_key(&idx) {
            return;
        }
        self.seq += 1;
        m.seq = self.seq;
        self.order.push_back((idx, m.seq));
        self.remove(idx);
        if m.ahead {
            self.warmed_bytes += m.of.2.size;
        }
        self.map.insert(idx, m);
    }

    fn remove(&mut self, idx: u32) {
        if let Some(m) = self.map.remove(&idx) {
            if m.ahead {
                self.warmed_bytes -= m.of.2.size;
            }
        }
    }
}

/// True while `file` is the copy `m` announced (its identity: a descriptor the owner closed
/// may name another file by the time it is taken, one it will cut short or a person may change),
/// linked (its owner has not dropped it) and at least `m.size` bytes long.
fn whole(file: &File, m: &Mapped) -> bool {
    // One `fstat`; the identity as `granary_core::sys::copy_identity` computes it.
    file.metadata().is_ok_and(|s| {
        let ctime = (s.ctime() as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(s.ctime_nsec() as u64);
        (s.ino(), ctime) == (m.ino, m.ctime) && s.is_file() && s.nlink() > 0 && s.len() >= m.size
    })
}

/// `n` bytes at `addr` in process `pid` into `dst`, all of them or an error.
fn read_from(pid: u32, addr: u64, dst: *mut u8, n: usize) -> std::io::Result<()> {
    let local = libc::iovec {
        iov_base: dst.cast(),
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: n,
    };
    // SAFETY: `dst` has room for `n` bytes (`Landing::dest` checked the range against its live
    // mapping, which the caller holds and nothing else writes while the copy is received); the
    // remote range is only read, and the kernel checks it against the other process's mappings
    // and our right to read them.
    let got = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if got as usize != n {
        return Err(std::io::Error::other("short read"));
    }
    Ok(())
}

/// This host as a process sees it: its boot, its PID namespace (process ids mean the same) and
/// its host name (the Slurm test's "nodes" differ in it). `None` if any is unknown: then no
/// rank is taken for a neighbour.
fn host_key() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut h = std::hash::DefaultHasher::new();
    std::fs::read("/proc/sys/kernel/random/boot_id")
        .ok()?
        .hash(&mut h);
    let ns = std::fs::metadata("/proc/self/ns/pid").ok()?;
    (ns.dev(), ns.ino()).hash(&mut h);
    std::fs::read("/proc/sys/kernel/hostname")
        .ok()?
        .hash(&mut h);
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A file of `len` bytes (none repeating within 4 KiB) in `dir`, open, and a read-only
    /// mapping of it in this process: an owner's kept copy and mapping, as `maps` keeps them.
    fn owner_copy(
        dir: &std::path::Path,
        name: &str,
        len: usize,
    ) -> (File, memmap2::MmapRaw, Vec<u8>) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let path = dir.join(name);
        File::create(&path).unwrap().write_all(&data).unwrap();
        let file = File::open(&path).unwrap();
        let map = memmap2::MmapOptions::new()
            .map_raw_read_only(&file)
            .unwrap();
        (file, map, data)
    }

    fn source(idx: u32, file: &File, map: &memmap2::MmapRaw) -> Source {
        let (ino, ctime) = granary_core::sys::copy_identity(file).unwrap();
        Source {
            rank: 0,
            pid: std::process::id(),
            m: Mapped {
                idx,
                object: idx as u64 + 100,
                size: map.len() as u64,
                addr: map.as_ptr() as usize as u64,
                fd: file.as_raw_fd() as u32,
                sum: 0,
                ino,
                ctime,
            },
        }
    }

    /// Copies `src` into a fresh landing in `dir`: the landing's bytes, and the slices as
    /// `fill` handed them on (in order).
    fn copy_out(d: &Direct, dir: &std::path::Path, src: &Source) -> (Vec<u8>, Vec<u8>) {
        let part = tempfile::tempfile_in(dir).unwrap();
        part.set_len(src.m.size).unwrap();
        let landing = Landing::over(&part).unwrap();
        let mut handed = Vec::new();
        d.fill(src, &landing, |b| {
            handed.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        (landing.landed(0, src.m.size as usize).to_vec(), handed)
    }

    #[test]
    fn a_copy_through_a_mirror_is_every_byte_and_the_mirror_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        // Not a whole number of slices: the last one is short.
        let (file, map, data) = owner_copy(dir.path(), "a", 3 * SLICE + 1000);
        let d = Direct::new(1, true);
        let src = source(7, &file, &map);
        for _ in 0..2 {
            let (landed, handed) = copy_out(&d, dir.path(), &src);
            assert!(landed == data && handed == data);
            assert!(
                d.mirror_on.load(Ordering::Relaxed),
                "the kernel refused pidfd_getfd"
            );
            assert_eq!(d.mirrors_lock().map.len(), 1);
        }
        // Another announcement for the entry (a new copy): its mirror is made again.
        let (file2, map2, data2) = owner_copy(dir.path(), "a2", SLICE);
        let src2 = source(7, &file2, &map2);
        let (landed, _) = copy_out(&d, dir.path(), &src2);
        assert!(landed == data2);
        let m = d.mirrors_lock();
        assert!(m.map.get(&7).is_some_and(|k| k.of.2 == src2.m));
    }

    #[test]
    fn a_copy_its_owner_dropped_is_not_read_through_its_mirror() {
        let dir = tempfile::tempdir().unwrap();
        let (file, map, data) = owner_copy(dir.path(), "a", 2 * SLICE);
        let d = Direct::new(1, true);
        let src = source(3, &file, &map);
        copy_out(&d, dir.path(), &src);
        assert_eq!(d.mirrors_lock().map.len(), 1);
        // Dropped by its owner: the mirror goes, the bytes come from the owner's mapping.
        std::fs::remove_file(dir.path().join("a")).unwrap();
        let (landed, handed) = copy_out(&d, dir.path(), &src);
        assert!(landed == data && handed == data);
        assert!(d.mirrors_lock().map.is_empty());
        // Forgotten: its mirror too.
        let (file2, map2, _) = owner_copy(dir.path(), "b", SLICE);
        copy_out(&d, dir.path(), &source(4, &file2, &map2));
        assert_eq!(d.mirrors_lock().map.len(), 1);
        d.forget(4);
        assert!(d.mirrors_lock().map.is_empty());
    }

    #[test]
    fn announced_copies_are_mirrored_ahead_and_counted_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let d = Direct::new(1, true);
        let copies: Vec<_> = (0..3)
            .map(|i| owner_copy(dir.path(), &format!("w{i}"), (i + 1) * SLICE))
            .collect();
        for (i, (file, map, _)) in copies.iter().enumerate() {
            let src = source(i as u32, file, map);
            d.sources_lock().insert(src.m.idx, src);
            d.unwarmed.lock().unwrap().push_back(src.m.idx);
        }
        // Dropped by its owner before the pass: not mirrored.
        std::fs::remove_file(dir.path().join("w2")).unwrap();
        d.warm(&|| false);
        let (kept, bytes) = {
            let m = d.mirrors_lock();
            let mut k: Vec<u32> = m.map.keys().copied().collect();
            k.sort();
            (k, m.warmed_bytes)
        };
        assert_eq!(kept, vec![0, 1]);
        assert_eq!(bytes, 3 * SLICE as u64);
        // A read through a mirror made ahead: every byte.
        let (landed, _) = copy_out(&d, dir.path(), &source(1, &copies[1].0, &copies[1].1));
        assert!(landed == copies[1].2);
        d.forget(0);
        assert_eq!(d.mirrors_lock().warmed_bytes, 2 * SLICE as u64);
        // Nothing new announced: a pass does nothing.
        d.warm(&|| false);
        assert_eq!(d.mirrors_lock().map.len(), 1);
    }

    #[test]
    fn a_descriptor_number_the_owner_reused_for_another_file_is_never_mirrored() {
        let dir = tempfile::tempdir().unwrap();
        let (file, map, data) = owner_copy(dir.path(), "a", 2 * SLICE);
        let src = source(5, &file, &map);
        // The owner closed the copy's descriptor and its number went to another file (a source
        // file it pins, a staging file it will cut short): it is not the copy announced.
        let (other, _other_map, _) = owner_copy(dir.path(), "b", 3 * SLICE);
        // SAFETY: both are descriptors this test owns; `file`'s number now names `other`'s file.
        assert!(unsafe { libc::dup2(other.as_raw_fd(), file.as_raw_fd()) } >= 0);
        let d = Direct::new(1, true);
        let (landed, handed) = copy_out(&d, dir.path(), &src);
        assert!(
            landed == data && handed == data,
            "read another file's bytes"
        );
        assert!(d.mirrors_lock().map.is_empty(), "another file was mirrored");
    }

    #[test]
    fn each_new_mirror_checks_the_oldest_so_dropped_copies_are_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let d = Direct::new(1, true);
        let copies: Vec<_> = (0..3)
            .map(|i| owner_copy(dir.path(), &format!("f{i}"), SLICE))
            .collect();
        for (i, (file, map, _)) in copies.iter().enumerate().take(2) {
            copy_out(&d, dir.path(), &source(i as u32, file, map));
        }
        // The oldest mirror's copy is dropped and never read again: the next new mirror finds
        // it gone. The other one stays.
        std::fs::remove_file(dir.path().join("f0")).unwrap();
        let (file, map, _) = &copies[2];
        copy_out(&d, dir.path(), &source(2, file, map));
        let mut kept: Vec<u32> = d.mirrors_lock().map.keys().copied().collect();
        kept.sort();
        assert_eq!(kept, vec![1, 2]);
    }
}
