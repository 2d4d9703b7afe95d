//! The client side of the placement engine (docs/placement.md, "Preload side"): what a read,
//! `mmap` or `lseek` of a tracked *source* fd does while the agent places the file.
//!
//! - Large files being fetched (QUEUED/PLACING): reads are served from `<object>.part` once the
//!   agent's `progress` covers them, waiting (bounded, interruptible) when it soon will.
//! - Complete copies (PLACED): the fd is switched to the copy when nobody shares its OFD, else
//!   each read is served from the copy (`switch`).
//! - Partially cached files (PARTIAL): reads of present chunks come from `<object>.chunks`.
//!
//! Every file this module opens is opened, read and closed within the call: no hidden fds, no
//! state outside the shared table and the fd table. On any doubt the caller's real call runs on
//! the source, which is always correct.

use core::ffi::c_int;

use granary_shm::{
    chunk_data_offset, chunks_name, job, object_name, part_name, request, state, EntryRec,
};

use crate::copies::{self, Expect};
use crate::detour::Guard;
use crate::fdtable::{flag, FdKind, Tracked};
use crate::serve::{self, range, ReadInto, Serve, Served};
use crate::switch;
use crate::sys::KeepErrno;
use crate::wait::{wait, woken_wait, Waited, SLEEP_MAX_NS, SLEEP_MIN_NS, STALL_NS};

/// Outcome of `on_read`: served (bytes), failed after the fd's offset moved (errno), run the
/// real call and count it as this kind, or run it on the source and then ask the agent for a
/// missing chunk.
pub enum Read {
    Served(isize),
    Failed(c_int),
    Real(FdKind),
    /// Entry and chunk. The request follows the read so that the agent finds the bytes this read
    /// brought into the page cache and copies them from there: asked first, it raced the read to
    /// a cold page and read the chunk from the source itself.
    SourceThenChunk(u32, u32),
}

/// What `serve::serve` did, counted: tier bytes, or source bytes when it had to read the source.
fn served(g: &Guard, tier: u8, s: Served) -> Option<Read> {
    match s {
        Served::Bytes(n, false) => {
            g.count(job::TIER_BYTES + tier as usize, n as u64);
            Some(Read::Served(n))
        }
        Served::Bytes(n, true) => {
            g.count(job::SOURCE_READS, 1);
            g.count(job::SOURCE_BYTES, n as u64);
            g.count(job::FALLBACKS, 1);
            Some(Read::Served(n))
        }
        Served::Failed(e) => Some(Read::Failed(e)),
        Served::No => None,
    }
}

/// A read of `len` bytes at `off` (`None`: the fd's offset, which a served read then moves) on
/// a tracked source fd. The caller holds the fd's `BUSY` lock for offset reads.
pub fn on_read(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let Some(entry) = crate::entries::get(g.table, idx) else {
        return Read::Real(FdKind::Source);
    };
    let word = g.table.state(idx);
    match state::state_of(word) {
        state::PLACED => return placed(g, fd, t, &entry, off, len, f),
        state::PARTIAL => return partial(g, fd, idx, &entry, word, off, len, f),
        // UNPLACED too: our open asked the agent for it, which claims it within a ring poll.
        // (A packed file is never copied through a partial copy: its open already waited.)
        state::UNPLACED | state::QUEUED | state::PLACING
            if entry.stat.size >= g.table.prefetch_min_size() && g.table.locator(idx).is_none() => {
        }
        _ => return Read::Real(FdKind::Source),
    }
    let Some((_, end)) = range(fd, off, len, entry.stat.size) else {
        return Read::Real(FdKind::Source);
    };
    let tier = match wait(g, idx, Some(end)) {
        Waited::Covered(tier) => tier,
        Waited::Placed => return placed(g, fd, t, &entry, off, len, f),
        Waited::GiveUp => return Read::Real(FdKind::Source),
    };
    let (ino, _) = g.table.copy_identity(idx);
    let expect = Expect {
        ino,
        ctime_ns: 0,
        size: None,
    };
    // The part file opened holds `[p, end)` while it is still the tier's current copy and the
    // agent's progress covers it (or the copy completed: the part renamed into place).
    let covered = |_: u64, end: u64| {
        let w = g.table.state(idx);
        let s = state::state_of(w);
        (s == state::PLACED || s == state::PLACING && g.table.progress(idx) >= end)
            && state::tier_of(w) == tier
            && g.table.copy_identity(idx).0 == ino
    };
    let how = Serve {
        base: 0,
        size: entry.stat.size,
        transient: g.table.is_transient(idx),
        covered: &covered,
        fallback: Some(fd),
    };
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    // Between the agent's rename of the part into place and its PLACED, the part's name is gone
    // but the same inode is the object: the identity check makes either name safe to read.
    let result = copies::open(g.table, tier, &part_name(entry.object), flags, &expect)
        .or_else(|| copies::open(g.table, tier, &object_name(entry.object), flags, &expect))
        .map(|(file, _)| serve::serve(fd, file, off, len, &how, f));
    match result.and_then(|s| served(g, tier, s)) {
        Some(r) => r,
        None => {
            // The copy may have completed (renamed) between our look at progress and the open.
            if state::state_of(g.table.state(idx)) == state::PLACED {
                return placed(g, fd, t, &entry, off, len, f);
            }
            g.count(job::FALLBACKS, 1);
            Read::Real(FdKind::Source)
        }
    }
}

/// A complete copy exists: switch the fd to it, or serve this read from it.
fn placed(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    e: &EntryRec,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    if !t.has(flag::PINNED) {
        if let Some(tier) = switch::to_copy(g, fd, t, e) {
            return Read::Real(FdKind::Tier(tier));
        }
    }
    if range(fd, off, len, e.stat.size).is_none() {
        return Read::Real(FdKind::Source);
    }
    let Some((file, tier, _)) =
        crate::copies::open_copy(g, t.entry, e, libc::O_RDONLY | libc::O_CLOEXEC)
    else {
        return Read::Real(FdKind::Source);
    };
    let covered = |_: u64, _: u64| state::state_of(g.table.state(t.entry)) == state::PLACED;
    let how = Serve {
        base: 0,
        size: e.stat.size,
        transient: g.table.is_transient(t.entry),
        covered: &covered,
        fallback: Some(fd),
    };
    served(g, tier, serve::serve(fd, file, off, len, &how, f)).unwrap_or(Read::Real(FdKind::Source))
}

/// PARTIAL: the chunk file when every chunk of the range is present; else the source, and the
/// agent is asked for the first missing chunk.
#[allow(clippy::too_many_arguments)]
fn partial(
    g: &Guard,
    fd: c_int,
    idx: u32,
    entry: &EntryRec,
    word: u64,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    let cs = g.table.chunk_size();
    let size = entry.stat.size;
    if cs == 0 {
        return Read::Real(FdKind::Source);
    }
    let Some((pos, end)) = range(fd, off, len, size) else {
        return Read::Real(FdKind::Source);
    };
    for k in pos / cs..=(end - 1) / cs {
        if !g.table.chunk_present(idx, k) {
            if k <= request::ARG_MAX as u64 {
                return Read::SourceThenChunk(idx, k as u32);
            }
            return Read::Real(FdKind::Source);
        }
    }
    let tier = state::tier_of(word);
    let covered = |p: u64, end: u64| {
        state::state_of(g.table.state(idx)) == state::PARTIAL
            && (p / cs..=(end - 1) / cs).all(|k| g.table.chunk_present(idx, k))
    };
    let how = Serve {
        base: chunk_data_offset(size, cs),
        size,
        transient: false,
        covered: &covered,
        fallback: Some(fd),
    };
    let result =
        open_chunks(g, idx, entry, tier).map(|file| serve::serve(fd, file, off, len, &how, f));
    match result.and_then(|s| served(g, tier, s)) {
        Some(r) => r,
        None => {
            g.count(job::FALLBACKS, 1);
            Read::Real(FdKind::Source)
        }
    }
}

/// The entry's chunk file in `tier`, if it is the one the agent recorded.
fn open_chunks(g: &Guard, idx: u32, entry: &EntryRec, tier: u8) -> Option<c_int> {
    copies::open_recorded(g, idx, tier, &chunks_name(entry.object))
}

/// `mmap` of a tracked source fd: a complete copy is switched to first. A larger file still
/// being fetched is not waited for: it is mapped from the source at once (`mapping`). A
/// mid-size one (`fetched_direct`) is: its fetch is one direct read that shares no pages with a
/// mapping of the source, so mapping the source would read its bytes twice; the wait is that
/// one read, and gives up (mapping the source) as a read's wait does.
pub fn on_map(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    if t.has(flag::PINNED) {
        return;
    }
    let st = state::state_of(g.table.state(t.entry));
    if !matches!(
        st,
        state::PLACED | state::UNPLACED | state::QUEUED | state::PLACING
    ) {
        // No copy, none coming that a mapping waits for: nothing to look up.
        return;
    }
    let Some(entry) = crate::entries::get(g.table, t.entry) else {
        return;
    };
    if st != state::PLACED
        && !(fetched_direct(g, t.entry, &entry)
            // As a read waits (its naps and stall), woken by the agent's publications.
            && woken_wait(g, t.entry, (SLEEP_MIN_NS, SLEEP_MAX_NS), STALL_NS))
    {
        return;
    }
    switch::to_copy(g, fd, t, &entry);
}

/// True if the agent fetches entry `idx` whole in one direct read and has not placed it yet.
fn fetched_direct(g: &Guard, idx: u32, entry: &EntryRec) -> bool {
    let size = entry.stat.size;
    matches!(
        state::state_of(g.table.state(idx)),
        state::UNPLACED | state::QUEUED | state::PLACING
    ) && size >= g.table.prefetch_min_size()
        && size <= granary_shm::DIRECT_FETCH_MAX
        && g.table.locator(idx).is_none()
}

/// `lseek` (and anything else that only needs the fd on the copy once there is one).
pub fn on_seek(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    if t.has(flag::PINNED) {
        return;
    }
    let word = g.table.state(t.entry);
    if state::state_of(word) == state::PLACED {
        if let Some(entry) = crate::entries::get(g.table, t.entry) {
            switch::to_copy(g, fd, t, &entry);
        }
    }
}

/// A tracked fd went away (`release`): a small source file still waiting for placement has its
/// pages in the page cache now, so the agent should copy it from there.
pub fn on_release(t: Tracked) {
    if t.kind != FdKind::Source {
        return;
    }
    let Some(table) = crate::detour::table() else {
        return;
    };
    if !table.is_valid() {
        return;
    }
    let Some(entry) = crate::entries::get(table, t.entry) else {
        return;
    };
    let st = state::state_of(table.state(t.entry));
    if entry.stat.size < table.prefetch_min_size() && (st == state::UNPLACED || st == state::QUEUED)
    {
        let slot = crate::detour::job_slot();
        table.push_request_arg(request::CLOSED, t.entry, slot);
    }
}
