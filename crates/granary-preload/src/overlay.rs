//! Mappings of catalogued files that are not (yet) entirely local: a file the agent is still
//! fetching, or one cached in chunks (docs/preload-rules.md, "Mappings").
//!
//! The mapping is made at once — never waiting for a copy — of the source, and whatever the
//! tier already holds for its range is mapped over it (`MAP_FIXED`): the chunks of a partially
//! cached file, the part of a file being fetched that the agent's progress covers. Every page
//! the program can touch is then a page of a real file holding the source's bytes, readable by
//! the program and by the kernel alike (a `write(fd, map, n)` works), and stays so when the copy
//! completes (the part is renamed, same inode) or is withdrawn (the inode lives on in the
//! mapping). The library installs no signal handler and never changes a page's protection.
//!
//! The agent is then told which process mapped something (`request::MAPPED`, pid and job slot):
//! it reads `/proc/<pid>/maps`, follows where the program reads in its page tables and reads
//! the source ahead of it into the page cache (`placement::mapping`), so the pages still backed
//! by the source fault in at memory speed. A forked child inherits the mappings: it says so from
//! the fork handler.
//!
//! Overlays never cover a mapping that can write (a private one's copied pages would be lost if
//! `mremap` ever had to put the source back), and — when the mapping starts at the top of the
//! file — only if the file's first two pages are among them: a reader that finds its way
//! through the file from its header (LMDB's meta pages) then always starts from the local
//! version, whose pages no writer of the same node overwrites while that reader holds them.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use granary_shm::{chunk_data_offset, chunks_name, part_name, request, EntryRec, State, StateWord};

use crate::fds::fdtable::Tracked;
use crate::ops::detour::Guard;
use crate::sys::{self, sys, KeepErrno};

/// This process mapped a followed file: a forked child has the same mappings to follow.
static MAPPED_ANY: AtomicBool = AtomicBool::new(false);

/// Where the followed mappings are (`[start, end)` addresses; 0 = free), so that only a
/// `munmap`/`mremap` of one of them asks the agent to look again — not every `munmap` of a
/// program's allocator. Copied with the address space by `fork`, like the mappings themselves;
/// a slot left behind by a raw `munmap` costs at most one needless request. When all are taken,
/// every `munmap` asks.
const SLOTS: usize = 64;
static RANGES: [(AtomicUsize, AtomicUsize); SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SLOTS];
static OVERFLOW: AtomicBool = AtomicBool::new(false);

fn remember(start: usize, end: usize) {
    for (s, e) in &RANGES {
        if s.compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            e.store(end, Ordering::Release);
            return;
        }
    }
    OVERFLOW.store(true, Ordering::Relaxed);
}

/// True if `[start, end)` touches a followed mapping; slots it covers whole are freed.
fn forget_overlapping(start: usize, end: usize) -> bool {
    let mut hit = OVERFLOW.load(Ordering::Relaxed);
    for (s, e) in &RANGES {
        let a = s.load(Ordering::Acquire);
        if a == 0 {
            continue;
        }
        let b = e.load(Ordering::Acquire);
        if a < end && start < b {
            hit = true;
            if start <= a && b <= end {
                let _ = s.compare_exchange(a, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
    hit
}

const PAGE: u64 = 4096;

/// A successful `mmap` of tracked source fd `fd` at `addr`: overlays what the tier holds, then
/// tells the agent. Never changes errno.
#[allow(clippy::too_many_arguments)]
pub fn source_mapped(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: i64,
) {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let Some(entry) = g.table.entry(idx) else {
        return;
    };
    let word = g.table.state(idx);
    let st = word.state();
    // Worth following: a file large enough to be fetched, not complete locally.
    let followed = matches!(
        st,
        State::Unplaced | State::Queued | State::Placing | State::Partial | State::SourceOnly
    ) && entry.stat.size >= g.table.prefetch_min_size().max(1);
    if followed {
        // Before the overlays: the tier files mapped over parts of it are mappings of their
        // own, not advised (their pages are local).
        crate::map_advice::followed_mapping(fd, addr, len, prot);
    }
    if off >= 0 && prot & libc::PROT_WRITE == 0 {
        let range = Range {
            addr: addr as usize,
            start: off as u64,
            end: (off as u64).saturating_add(len as u64),
            prot,
            flags,
        };
        match st {
            State::Partial => overlay_chunks(g, fd, idx, &entry, word, &range),
            State::Placing => overlay_part(g, fd, idx, &entry, word, &range),
            _ => {}
        }
    }
    if followed {
        remember(addr as usize, (addr as usize).saturating_add(len));
        notify(g);
    }
}

/// Tells the agent that this process has mappings to follow.
fn notify(g: &Guard) {
    MAPPED_ANY.store(true, Ordering::Relaxed);
    let pid = sys!(libc::SYS_getpid) as u32;
    g.table.push_request_arg(request::MAPPED, pid, g.slot);
}

/// In a forked child (from the fork handler): the mappings it inherited are followed too.
pub fn forked_child() {
    changed();
}

/// `munmap`/`mremap` of `[addr, addr + len)` (and, for `mremap`, the new range): if a followed
/// mapping is among them, the agent looks at this process's mappings again now. One load in a
/// process that maps nothing followed.
pub fn unmapped(addr: usize, len: usize, moved_to: Option<(usize, usize)>) {
    if !MAPPED_ANY.load(Ordering::Relaxed) {
        return;
    }
    if forget_overlapping(addr, addr.saturating_add(len)) {
        if let Some((a, n)) = moved_to {
            remember(a, a.saturating_add(n));
        }
        changed();
    }
}

/// The agent should look at this process's mappings again (a forked child's, or after an
/// unmap). One load in a process that maps nothing followed; errno kept.
pub fn changed() {
    if !MAPPED_ANY.load(Ordering::Relaxed) {
        return;
    }
    let Some(table) = crate::ops::detour::table() else {
        return;
    };
    if table.is_valid() {
        let _keep = KeepErrno::new();
        let pid = sys!(libc::SYS_getpid) as u32;
        table.push_request_arg(request::MAPPED, pid, crate::ops::detour::job_slot());
    }
}

/// The program's mapping: `addr` maps file bytes `[start, end)` (end may lie past the file).
struct Range {
    addr: usize,
    start: u64,
    end: u64,
    prot: c_int,
    flags: c_int,
}

impl Range {
    /// The file's first two pages must be local if the mapping shows the file's top (see the
    /// module comment).
    fn top_ok(&self, local_from_zero: u64) -> bool {
        self.start > 0 || local_from_zero >= 2 * PAGE
    }

    /// Maps file bytes `[s, e)` (page-aligned, inside the range) from `file` at `base + s`; on
    /// failure puts the source back over them. False if it failed.
    fn put(&self, file: c_int, base: u64, s: u64, e: u64, src: c_int) -> bool {
        let fixed = (self.flags & !libc::MAP_FIXED_NOREPLACE) | libc::MAP_FIXED;
        let at = self.addr.wrapping_add((s - self.start) as usize);
        let r = sys!(libc::SYS_mmap, at, e - s, self.prot, fixed, file, base + s);
        if r < 0 {
            // A failed MAP_FIXED may leave the range unmapped: the source goes back there.
            sys!(libc::SYS_mmap, at, e - s, self.prot, fixed, src, s);
            return false;
        }
        true
    }
}

/// PARTIAL: every present chunk inside the mapping is mapped from the chunk file, so the cached
/// part faults in locally.
fn overlay_chunks(g: &Guard, fd: c_int, idx: u32, entry: &EntryRec, word: StateWord, r: &Range) {
    let cs = g.table.chunk_size();
    let size = entry.stat.size;
    if cs == 0 {
        return;
    }
    let data = chunk_data_offset(size, cs);
    let end = r.end.min(size);
    // Bytes present from the top of the file on, as far as the top rule looks.
    let mut top = 0;
    while top < 2 * PAGE && g.table.chunk_present(idx, top / cs) {
        top += cs;
    }
    if r.start >= end || !r.top_ok(top) {
        return;
    }
    let Some(file) = open_tier_file(g, idx, entry, word.tier(), true) else {
        return;
    };
    let mut st = sys::empty_stat();
    // A chunk file shorter than its geometry would SIGBUS the program on access: never map it.
    let whole = sys::raw_fstat(file, &mut st) == 0 && st.st_size as u64 >= data + size;
    let mut k = r.start / cs;
    while whole && k * cs < end {
        let (s, e) = ((k * cs).max(r.start), ((k + 1) * cs).min(end));
        if g.table.chunk_present(idx, k) && !r.put(file, data, s, e, fd) {
            break;
        }
        k += 1;
    }
    sys::raw_close(file);
}

/// PLACING: the part of the partial copy the agent's progress covers (whole pages, or up to the
/// end of the file once it is all written) is mapped from `<object>.part`.
fn overlay_part(g: &Guard, fd: c_int, idx: u32, entry: &EntryRec, word: StateWord, r: &Range) {
    let size = entry.stat.size;
    let tier = word.tier();
    let (ino, _) = g.table.copy_identity(idx);
    let progress = g.table.progress(idx);
    // Whole pages written, or all of the last one once the whole file is.
    let covered = if progress >= size {
        size.div_ceil(PAGE) * PAGE
    } else {
        progress / PAGE * PAGE
    };
    let end = (r.end.div_ceil(PAGE) * PAGE).min(covered);
    if r.start >= end || !r.top_ok(covered) {
        return;
    }
    let Some(file) = open_tier_file(g, idx, entry, tier, false) else {
        return;
    };
    // What we opened is that part, still the tier's current copy (or completed: renamed, same
    // inode), and its bytes up to `covered` were written before we looked.
    let w = g.table.state(idx);
    let still =
        (w == word || w.parts() == (State::Placed, tier)) && g.table.copy_identity(idx).0 == ino;
    let mut st = sys::empty_stat();
    let long_enough = sys::raw_fstat(file, &mut st) == 0 && st.st_size as u64 >= end.min(size);
    if still && long_enough {
        r.put(file, 0, r.start, end, fd);
    }
    sys::raw_close(file);
}

/// The entry's chunk file (`chunks`) or part in `tier`, if it is the one the agent recorded.
fn open_tier_file(g: &Guard, idx: u32, entry: &EntryRec, tier: u8, chunks: bool) -> Option<c_int> {
    if chunks {
        crate::fds::copies::open_recorded(g, idx, tier, &chunks_name(entry.object))
    } else {
        crate::fds::copies::open_recorded(g, idx, tier, &part_name(entry.object))
    }
}

/// `mremap` failed with EFAULT on `[addr, addr + len)`: if the range is one mapping of a
/// catalogued file that granary split into several (the source with tier files over it), the
/// source is mapped back over all of it — the same bytes — so the program's call, retried, does
/// what it does without granary. Only for mappings that cannot write (nothing of the program's
/// is lost). True if the range was put back.
pub fn unsplit(g: &Guard, addr: usize, len: usize) -> bool {
    let _keep = KeepErrno::new();
    let end = addr.saturating_add(len).div_ceil(PAGE as usize) * PAGE as usize;
    if addr % PAGE as usize != 0 || end <= addr {
        return false;
    }
    // The mapping granary made: contiguous, one entry, one file offset per address, read-only.
    struct Seen {
        idx: u32,
        delta: usize,
        at: usize,
        pieces: u32,
        read: bool,
        exec: bool,
        shared: bool,
        ok: bool,
    }
    let mut s = Seen {
        idx: u32::MAX,
        delta: 0,
        at: addr,
        pieces: 0,
        read: false,
        exec: false,
        shared: false,
        ok: true,
    };
    let read_all = crate::sys::procmaps::for_each(|v| {
        if v.end <= addr {
            return true;
        }
        if v.start >= end {
            return false;
        }
        let Some((idx, file_off)) = vma_entry(g, v) else {
            s.ok = false;
            return false;
        };
        let delta = v.start.wrapping_sub(file_off as usize);
        let first = s.pieces == 0;
        s.ok &= v.start <= s.at
            && !v.write
            && (first
                || (idx, delta, v.read, v.exec, v.shared)
                    == (s.idx, s.delta, s.read, s.exec, s.shared));
        if first {
            (s.idx, s.delta, s.read, s.exec, s.shared) = (idx, delta, v.read, v.exec, v.shared);
        }
        s.pieces += 1;
        s.at = v.end;
        s.ok
    });
    if !read_all || !s.ok || s.pieces < 2 || s.at < end {
        return false;
    }
    let Some(e) = g.table.entry(s.idx) else {
        return false;
    };
    let Some(src) = crate::fds::switch::open_source(g, s.idx, &e, libc::O_RDONLY | libc::O_CLOEXEC)
    else {
        return false;
    };
    let prot = if s.read { libc::PROT_READ } else { 0 } | if s.exec { libc::PROT_EXEC } else { 0 };
    let share = if s.shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    let r = sys!(
        libc::SYS_mmap,
        addr,
        end - addr,
        prot,
        share | libc::MAP_FIXED,
        src,
        addr.wrapping_sub(s.delta)
    );
    sys::raw_close(src);
    r >= 0
}

/// The catalog entry a mapped file belongs to, and the file offset of the VMA's first byte:
/// the source file itself (its device and inode), or a tier file granary wrote for it (a copy,
/// its part, its chunk file).
fn vma_entry(g: &Guard, v: &crate::sys::procmaps::Vma) -> Option<(u32, u64)> {
    if v.ino == 0 || v.path.first() != Some(&b'/') {
        return None;
    }
    for t in 0..granary_shm::layout::MAX_TIERS as u32 {
        let Some(dir) = g.table.tier_dir(t) else {
            break;
        };
        let Some(name) = v
            .path
            .strip_prefix(dir)
            .and_then(|r| r.strip_prefix(b"/".as_slice()))
        else {
            continue;
        };
        let (stem, suffix) = name.split_at(name.len().min(16));
        let idx = g
            .table
            .lookup_object(granary_shm::parse_object_name(stem)?)?;
        let e = g.table.entry(idx)?;
        let base = match suffix {
            b"" | b".part" => 0,
            b".chunks" => chunk_data_offset(e.stat.size, g.table.chunk_size()),
            _ => return None,
        };
        return Some((idx, v.off.checked_sub(base)?));
    }
    let mut cpath = [0u8; crate::sys::PATH_BUF];
    cpath.get_mut(..v.path.len())?.copy_from_slice(v.path);
    *cpath.get_mut(v.path.len())? = 0;
    let mut buf = crate::ops::path::Buf::new();
    let loc = crate::ops::lookup::locate(g, libc::AT_FDCWD, cpath.as_ptr().cast(), &mut buf);
    let found = crate::ops::lookup::find(g, &loc, false).ok()?;
    let st = &found.entry.stat;
    let same = st.ino == v.ino && (st.dev_major, st.dev_minor) == (v.dev_major, v.dev_minor);
    same.then_some((found.idx, v.off))
}
