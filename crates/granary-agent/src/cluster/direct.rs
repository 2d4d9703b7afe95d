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

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

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
        for m in v {
            s.insert(m.idx, Source { rank: from, pid, m });
        }
    }

    /// Other ranks' mappings known now.
    pub fn known(&self) -> usize {
        self.sources_lock().len()
    }

    /// Entry `idx`'s announced mapping is not to be used (invalidated, or it failed once).
    pub fn forget(&self, idx: u32) {
        self.sources_lock().remove(&idx);
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
        let size = src.m.size as usize;
        let mut off = 0;
        while off < size {
            let n = SLICE.min(size - off);
            let dst = landing.dest(off, n).ok_or(ReceiveError::Mismatch("size"))?;
            if let Err(e) = read_from(src.pid, src.m.addr + off as u64, dst, n) {
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
            rx.landed(landing.landed(off, n))?;
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
