//! What granary does for the read family (`read`, `pread`, `readv`, `preadv`, `preadv2` and
//! their aliases), `lseek`, the calls in which the kernel reads an fd itself (`copy_file_range`,
//! `sendfile`, `splice`) and stdio's `fread`: untracked fds pay one atomic load and pass
//! through; tier fds are read by the real call and counted; a tier fd whose file the program
//! changed in place reads the source; a tracked source fd is the client side of the placement
//! engine (docs/placement.md, "Preload side"):
//!
//! - Large files being fetched (QUEUED/PLACING): reads are served from `<object>.part` once the
//!   agent's `progress` covers them, waiting (bounded, interruptible: `wait`) when it soon will.
//! - Complete copies (PLACED): the fd is switched to the copy when nobody shares its OFD, else
//!   each read is served from the copy (`switch`, `serve`).
//! - Partially cached files (PARTIAL): reads of present chunks come from `<object>.chunks`.
//! - Small files (below the whole-fetch size, `flag::SMALL`): the program reads the source
//!   itself and the agent copies the file after its close; every read is the real call, and
//!   the fd never moves to the copy (its reads take no `BUSY` lock to keep a switch out).
//!
//! Reads at the fd's offset hold the fd's `BUSY` lock (`fdtable::lock`), so a switch never
//! interleaves with another thread's read of the same fd; served reads claim their range on the
//! fd's offset atomically (`serve::serve`), so every other sharer of it stays in step;
//! positioned reads need no lock. Every file opened here is opened, read and closed within the
//! call. On any doubt the real call runs on the source, which is always correct; everything is
//! counted by where the bytes came from.

use core::ffi::c_int;

use granary_shm::{
    chunk_data_offset, chunks_name, job, object_name, part_name, request, EntryRec, State,
    StateWord,
};

use crate::fds::copies::{self, Expect};
use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::fds::serve::{self, range, ReadInto, Serve, Served};
use crate::fds::tracked::FirstRead;
use crate::ops::detour::{self, Bypass, Detour, Guard};
use crate::sys::{self, sys, KeepErrno};
use crate::wait::{wait, Waited};
use crate::{fds::switch, fds::tracked};

/// What to do after the real read (`Detour::Bypass`): count what it returned, note a positioned
/// read's range, ask the agent for a chunk, unlock the fd; the guard is held until then.
#[must_use]
pub struct Then {
    /// Count the bytes as read from this kind of fd (`None`: not ours, nothing to count).
    count: Option<FdKind>,
    /// Note the range of a positioned read of a copy (page-cache residency at close).
    note: bool,
    /// Ask the agent for this chunk of this entry after the read: the agent then finds the
    /// bytes the read brought into the page cache and copies them from there (asked first, it
    /// raced the read to a cold page and read the chunk from the source itself).
    chunk: Option<(u32, u32)>,
    /// The fd's `BUSY` lock is held.
    locked: bool,
    guard: Option<Guard>,
}

const NOTHING: Then = Then {
    count: None,
    note: false,
    chunk: None,
    locked: false,
    guard: None,
};

fn counted(kind: FdKind, note: bool) -> Then {
    Then {
        count: Some(kind),
        note,
        ..NOTHING
    }
}

/// A read of fd `fd`: `len` is the request's total length (`None`: unknown, pass through), `off`
/// the explicit offset (`None`: the fd's); `f` puts bytes served into the caller's buffers.
#[inline]
pub fn read(
    fd: c_int,
    off: Option<i64>,
    len: Option<u64>,
    f: &impl ReadInto,
) -> Detour<isize, Then> {
    let Some(peeked) = fdtable::peek(fd) else {
        return Detour::Bypass(Bypass::Untracked, NOTHING);
    };
    if peeked.kind == FdKind::Source && peeked.has(flag::SMALL) || peeked.has(flag::CLOSE_HINT) {
        // The source's own bytes, always right: nothing to wait for, switch to or serve (a copy
        // the agent completed since the open is for the file's next open).
        return Detour::Bypass(Bypass::ByFd, counted(peeked.kind, false));
    }
    if peeked.has(flag::UNCHECKED) && off.is_none() {
        // A whole small copy read at once: checked by what the read returns (no `fstat`).
        match tracked::first_read(fd, peeked, len, f) {
            FirstRead::No | FirstRead::Damaged => {}
            FirstRead::Verified(n) => return Detour::Answer(count(peeked.kind, n)),
            FirstRead::NotOurs(n) => return Detour::Answer(n),
        }
    }
    // What the fd is now: as peeked, unless it was left for its first use (`tracked::get`
    // checks it; `first_read` may have checked or switched it already).
    let t = if peeked.has(flag::UNCHECKED) {
        tracked::get(fd)
    } else {
        Some(peeked)
    };
    let Some(t) = t else {
        return Detour::Bypass(Bypass::Untracked, NOTHING);
    };
    if t.kind == FdKind::Dir {
        return Detour::Bypass(Bypass::ByFd, NOTHING);
    }
    if off.is_some() && !may_serve(&t) {
        // The common case, a positioned read of a copy: count it, note its range.
        return Detour::Bypass(Bypass::ByFd, counted(t.kind, true));
    }
    tracked_read(fd, t, off, len, f)
}

fn tracked_read(
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: Option<u64>,
    f: &impl ReadInto,
) -> Detour<isize, Then> {
    let g = match detour::enter_any_creds() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, counted(t.kind, false)),
    };
    let locked = off.is_none() && fdtable::lock(fd);
    // Another thread may have switched the fd while we waited.
    let t = tracked::get(fd).unwrap_or(t);
    let out = match (t.kind, len) {
        (FdKind::Source, Some(len)) => source_read(&g, fd, t, off, len, f),
        (FdKind::Tier(_), Some(len)) if stale(&t) => stale_read(&g, fd, t, off, len, f),
        (k, _) => Read::Real(k),
    };
    let (why, then) = match out {
        Read::Served(n) => {
            unlock(fd, locked);
            return Detour::Answer(n);
        }
        Read::Failed(e) => {
            unlock(fd, locked);
            return Detour::Fail(e);
        }
        Read::Real(kind) => (Bypass::ByFd, counted(kind, true)),
        Read::SourceThenChunk(idx, k) => (
            Bypass::NotPlaced,
            Then {
                chunk: Some((idx, k)),
                ..counted(FdKind::Source, true)
            },
        ),
    };
    Detour::Bypass(
        why,
        Then {
            locked,
            guard: Some(g),
            ..then
        },
    )
}

fn unlock(fd: c_int, locked: bool) {
    if locked {
        fdtable::unlock(fd);
    }
}

/// After the real read of `fd` (at `off`) returned `n`.
#[inline]
pub fn after_real(fd: c_int, off: Option<i64>, n: isize, then: Then) -> isize {
    let Some(kind) = then.count else {
        return n;
    };
    let mut in_sequence = None;
    if then.note {
        if let (FdKind::Tier(_), Some(o)) = (kind, off) {
            if n > 0 && fdtable::note_pread(fd, o as u64, n as u64) {
                in_sequence = Some(o as u64);
            }
        }
    }
    count(kind, n);
    if let (Some((idx, k)), Some(g)) = (then.chunk, &then.guard) {
        let _keep = KeepErrno::new();
        g.table.push_request_arg(request::CHUNK, idx, k);
    }
    unlock(fd, then.locked);
    drop(then.guard);
    if let Some(o) = in_sequence {
        crate::fds::pagedrop::behind(fd, o);
    }
    n
}

/// What a read on a tracked fd returned, counted by where the bytes came from.
#[inline]
pub fn count(kind: FdKind, n: isize) -> isize {
    if n > 0 {
        if let Some(table) = crate::ops::detour::table() {
            let slot = crate::ops::detour::job_slot();
            match kind {
                FdKind::Source | FdKind::Other => {
                    table.count(slot, job::SOURCE_READS, 1);
                    table.count(slot, job::SOURCE_BYTES, n as u64);
                }
                FdKind::Tier(x) => table.count(slot, job::TIER_BYTES + x as usize, n as u64),
                FdKind::Dir | FdKind::Pack => {}
            }
        }
    }
    n
}

/// True if the entry of tier fd `t` was changed in place by the program, or its copy failed the
/// check after its open (`flag::DAMAGED`): its reads go to the source.
pub fn stale(t: &Tracked) -> bool {
    matches!(t.kind, FdKind::Tier(_))
        && (t.has(flag::DAMAGED)
            || crate::ops::detour::table()
                .is_some_and(|tb| tb.state(t.entry).state() == State::Stale))
}

/// True if a read on `t` may be served by granary (and so needs the caller's buffers).
fn may_serve(t: &Tracked) -> bool {
    t.kind == FdKind::Source || stale(t)
}

/// A read of a copy whose file the program changed in place: from the source, as a direct
/// reader (same inode) would see it. The fd moves to the source when nobody shares its OFD;
/// otherwise this one read is served from the source.
fn stale_read(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    let _keep = sys::KeepErrno::new();
    let Some(e) = crate::ops::lookup::entry(g.table, t.entry) else {
        return Read::Real(t.kind);
    };
    if switch::to_source(g, fd, t, &e) {
        return Read::Real(FdKind::Source);
    }
    let Some(file) = switch::open_source(g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC) else {
        return Read::Real(t.kind);
    };
    let how = Serve {
        base: 0,
        // The source as it is now decides where the file ends.
        size: u64::MAX,
        transient: false,
        covered: &|_, _| true,
        // The fd is on the copy: after its offset moved, only the source may answer.
        fallback: None,
    };
    match serve::serve(fd, file, off, len, &how, f) {
        Served::Bytes(n, _) => Read::Served(count(FdKind::Source, n)),
        Served::Failed(e) => Read::Failed(e),
        Served::No => Read::Real(t.kind),
    }
}

/// Outcome of `source_read`: served (bytes), failed after the fd's offset moved (errno), run the
/// real call and count it as this kind, or run it on the source and then ask the agent for a
/// missing chunk.
enum Read {
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
fn source_read(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let Some(entry) = crate::ops::lookup::entry(g.table, idx) else {
        return Read::Real(FdKind::Source);
    };
    let word = g.table.state(idx);
    match word.state() {
        State::Placed => return placed(g, fd, t, &entry, off, len, f),
        State::Partial => return partial(g, fd, idx, &entry, word, off, len, f),
        // UNPLACED too: our open asked the agent for it, which claims it within a ring poll.
        // (A packed file is never copied through a partial copy: its open already waited.)
        State::Unplaced | State::Queued | State::Placing
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
        let s = w.state();
        (s == State::Placed || s == State::Placing && g.table.progress(idx) >= end)
            && w.tier() == tier
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
            if g.table.state(idx).state() == State::Placed {
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
        crate::fds::copies::open_copy(g, t.entry, e, libc::O_RDONLY | libc::O_CLOEXEC)
    else {
        return Read::Real(FdKind::Source);
    };
    let covered = |_: u64, _: u64| g.table.state(t.entry).state() == State::Placed;
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
    word: StateWord,
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
    let tier = word.tier();
    let covered = |p: u64, end: u64| {
        g.table.state(idx).state() == State::Partial
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

/// `lseek` of a source fd whose file is placed: the fd moves to the copy first (once nobody
/// shares it), so later reads need no hook work.
pub fn seek(fd: c_int) {
    let Some(t) = tracked::get(fd).filter(|t| t.kind == FdKind::Source) else {
        return;
    };
    let Ok(g) = detour::enter_any_creds() else {
        return;
    };
    if switch::exclusive(&t) && fdtable::lock(fd) {
        if let Some(now) = tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
            to_copy_if_placed(&g, fd, now);
        }
        fdtable::unlock(fd);
    }
}

/// A source fd whose file is placed now: on the copy.
fn to_copy_if_placed(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    if t.has(flag::PINNED) {
        return;
    }
    let word = g.table.state(t.entry);
    if word.state() == State::Placed {
        if let Some(entry) = crate::ops::lookup::entry(g.table, t.entry) {
            switch::to_copy(g, fd, t, &entry);
        }
    }
}

/// The calls in which the kernel reads `fd_in` itself (`copy_file_range`, `sendfile`, `splice`):
/// counted like a read of it. A copy whose file the program changed since must not be read: the
/// fd moves to the source when nobody shares it; otherwise the call reads the source, opened
/// for it, at `*off` or — with no `off` — at the fd's offset, claimed first as `serve::serve`
/// claims it, and what was not read given back. `call(fd, off)` makes the real call.
pub fn kernel_reads(
    fd_in: c_int,
    off: *mut i64,
    len: usize,
    call: impl Fn(c_int, *mut i64) -> isize,
) -> isize {
    let Some(t) = tracked::get(fd_in) else {
        return call(fd_in, off);
    };
    if !stale(&t) {
        return count(t.kind, call(fd_in, off));
    }
    let Ok(g) = detour::enter_any_creds() else {
        return count(t.kind, call(fd_in, off));
    };
    let Some(e) = crate::ops::lookup::entry(g.table, t.entry) else {
        return count(t.kind, call(fd_in, off));
    };
    let src = {
        let _keep = sys::KeepErrno::new();
        let moved = fdtable::lock(fd_in) && {
            let now = tracked::get(fd_in).unwrap_or(t);
            let m = now.kind == FdKind::Source || switch::to_source(&g, fd_in, now, &e);
            fdtable::unlock(fd_in);
            m
        };
        if moved {
            None
        } else {
            switch::open_source(&g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC)
        }
    };
    let Some(src) = src else {
        // On the source now (or the source cannot be opened: the real call, as it would be).
        return count(FdKind::Source, call(fd_in, off));
    };
    let n = if off.is_null() {
        let want = len.min(0x7fff_f000) as i64;
        let moved = sys!(libc::SYS_lseek, fd_in, want, libc::SEEK_CUR);
        if moved < 0 {
            -1
        } else {
            let mut pos = moved - want;
            let n = call(src, &mut pos);
            let _keep = sys::KeepErrno::new();
            let back = want - n.max(0) as i64;
            if back > 0 {
                sys!(libc::SYS_lseek, fd_in, -back, libc::SEEK_CUR);
            }
            n
        }
    } else {
        call(src, off)
    };
    let _keep = sys::KeepErrno::new();
    sys::raw_close(src);
    count(FdKind::Source, n)
}

/// For a vector read of `fd`: `None` when granary does not track it (the real call, nothing to
/// count), else whether it may serve the read (and so needs the caller's iovec copied).
#[inline]
pub fn needs_buffers(fd: c_int) -> Option<bool> {
    tracked::get(fd).map(|t| may_serve(&t))
}

/// stdio's `fread` handed out `bytes` read from `fd` inside libc, where the `read` hook never
/// sees them: counted here.
pub fn fread(fd: c_int, bytes: usize) {
    if let Some(t) = tracked::get(fd) {
        let _keep = KeepErrno::new();
        count(t.kind, bytes as isize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture, pattern, PLACED};

    /// The caller's buffer.
    struct Into(*mut u8);

    impl ReadInto for Into {
        fn read_into(&self, file: c_int, off: u64, want: u64) -> isize {
            sys!(libc::SYS_pread64, file, self.0, want, off) as isize
        }
    }

    /// The source file `rel` opened on the source and tracked as a source fd with `flags`.
    fn source_fd(rel: &str, flags: u64) -> c_int {
        let f = fixture();
        let p = f.path(rel);
        let fd = sys::raw_openat(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        );
        assert!(fd >= 0);
        assert!(fdtable::track(
            fd,
            Tracked::new(f.idx(rel), FdKind::Source, flags)
        ));
        fd
    }

    fn close(fd: c_int) {
        fdtable::take(fd);
        sys::raw_close(fd);
    }

    /// The read the hook makes: granary's answer, or the real `read` and what follows it.
    fn hook_read(fd: c_int, buf: &mut [u8]) -> isize {
        match read(fd, None, Some(buf.len() as u64), &Into(buf.as_mut_ptr())) {
            Detour::Answer(n) => n,
            Detour::Fail(e) => panic!("failed with errno {e}"),
            Detour::Bypass(_, then) => {
                let n = sys!(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) as isize;
                after_real(fd, None, n, then)
            }
        }
    }

    #[test]
    fn untracked_fds_pass_through() {
        let mut b = [0u8; 8];
        assert!(matches!(
            read(0, None, Some(8), &Into(b.as_mut_ptr())),
            Detour::Bypass(Bypass::Untracked, Then { count: None, .. })
        ));
    }

    #[test]
    fn a_source_fd_of_a_placed_file_moves_to_the_copy() {
        let f = fixture();
        let fd = source_fd(PLACED, 0);
        let mut buf = vec![0u8; 4096];
        assert_eq!(hook_read(fd, &mut buf), 4096);
        assert_eq!(buf, pattern(64 * 1024, 7)[..4096]);
        // The fd is the copy's now, at the same offset.
        assert_eq!(fdtable::peek(fd).unwrap().kind, FdKind::Tier(0));
        let mut st = sys::empty_stat();
        assert_eq!(sys::raw_fstat(fd, &mut st), 0);
        assert_eq!(
            st.st_ino,
            std::fs::metadata(f.object(PLACED)).unwrap().ino()
        );
        assert_eq!(hook_read(fd, &mut buf), 4096);
        assert_eq!(buf, pattern(64 * 1024, 7)[4096..8192]);
        close(fd);
    }

    #[test]
    fn a_shared_source_fd_is_served_from_the_copy_call_by_call() {
        let fd = source_fd(PLACED, flag::SHARED);
        let mut buf = vec![0u8; 1000];
        let n = match read(fd, None, Some(1000), &Into(buf.as_mut_ptr())) {
            Detour::Answer(n) => n,
            _ => panic!("served from the copy"),
        };
        assert_eq!(n, 1000);
        assert_eq!(buf, pattern(64 * 1024, 7)[..1000]);
        // The fd stays the source's (its sharers keep its file), its offset moved for the read.
        assert_eq!(fdtable::peek(fd).unwrap().kind, FdKind::Source);
        assert_eq!(sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR), 1000);
        close(fd);
    }

    #[test]
    fn positioned_reads_of_a_copy_note_their_range() {
        let f = fixture();
        let p = f.path(PLACED);
        let Detour::Answer(fd) = super::super::open::open(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            None,
        ) else {
            panic!("a placed file opens its copy");
        };
        let mut buf = vec![0u8; 100];
        let Detour::Bypass(Bypass::ByFd, then) =
            read(fd, Some(300), Some(100), &Into(buf.as_mut_ptr()))
        else {
            panic!("a copy's positioned read is the real call's");
        };
        let n = sys!(libc::SYS_pread64, fd, buf.as_mut_ptr(), 100, 300) as isize;
        assert_eq!(after_real(fd, Some(300), n, then), 100);
        assert_eq!(fdtable::pread_range(fd), Some((300, 400)));
        close(fd);
    }

    use std::os::unix::fs::MetadataExt;
}
