//! The client side of the placement engine (docs/placement.md, "Preload side"): what a read,
//! `mmap` or `lseek` of a tracked *source* fd does while the agent places the file.
//!
//! - Large files being fetched (QUEUED/PLACING): reads are served from `<object>.part` once the
//!   agent's `progress` covers them, waiting (bounded) when it soon will.
//! - Complete copies (PLACED): the fd is switched to the copy (`dup3` onto the same number).
//! - Partially cached files (PARTIAL): reads of present chunks come from `<object>.chunks`.
//!
//! Every file this module opens is opened, read and closed within the call: no hidden fds, no
//! state outside the shared table and the fd table. On any doubt the caller's real call runs on
//! the source, which is always correct.

use core::ffi::c_int;

use granary_shm::{chunk_data_offset, chunks_name, job, part_name, request, state, EntryRec};

use crate::detour::{self, sys, Guard, KeepErrno};
use crate::fdtable::{self, Kind, Tracked};
use crate::hooks::open::open_copy;
use crate::log;
use crate::path::BUF;

/// The kernel never moves more than this in one read (`MAX_RW_COUNT`).
pub const MAX_RW: u64 = 0x7fff_f000;
/// A waiting read gives up when progress stood still this long…
const STALL_NS: u64 = 2_000_000_000;
/// …or when it waited this long in all.
const WAIT_MAX_NS: u64 = 60_000_000_000;
const SLEEP_MIN_NS: i64 = 200_000;
const SLEEP_MAX_NS: i64 = 1_000_000;

/// Reads `want` bytes (fewer only at a short read) from `file` at `off` into the caller's
/// buffers; -1 on error. The hook supplies it: `pread` into one buffer, or over an iovec.
pub trait Fill {
    fn fill(&self, file: c_int, off: u64, want: u64) -> isize;
}

/// Outcome of `on_read`: served (bytes), or run the real call and count it as this kind.
pub enum Read {
    Served(isize),
    Real(Kind),
}

/// A read of `len` bytes at `off` (`None`: the fd's offset, which a served read then moves) on
/// a tracked source fd.
pub fn on_read(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: u64,
    f: &impl Fill,
) -> Read {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let Some(entry) = g.table.entry(idx) else {
        return Read::Real(Kind::Source);
    };
    let word = g.table.state(idx);
    match state::state_of(word) {
        state::PLACED => return Read::Real(switch_kind(g, fd, idx, &entry, word)),
        state::PARTIAL => return partial(g, fd, idx, &entry, word, off, len, f),
        // UNPLACED too: our open asked the agent for it, which claims it within a ring poll.
        state::UNPLACED | state::QUEUED | state::PLACING
            if entry.stat.size >= g.table.prefetch_min_size() => {}
        _ => return Read::Real(Kind::Source),
    }
    let Some((pos, end)) = range(fd, off, len, entry.stat.size) else {
        return Read::Real(Kind::Source);
    };
    let tier = match wait(g, idx, Some(end)) {
        Waited::Covered(tier) => tier,
        Waited::Placed(w) => return Read::Real(switch_kind(g, fd, idx, &entry, w)),
        Waited::GiveUp => return Read::Real(Kind::Source),
    };
    let name = part_name(entry.object);
    let transient = g.table.is_transient(idx);
    match serve_from(
        g,
        fd,
        tier,
        &name,
        pos,
        pos,
        end,
        off.is_none(),
        transient,
        f,
    ) {
        Some(n) => Read::Served(n),
        None => {
            // The copy may have completed (renamed) between our look at progress and the open.
            let w = g.table.state(idx);
            if state::state_of(w) == state::PLACED {
                return Read::Real(switch_kind(g, fd, idx, &entry, w));
            }
            g.count(job::FALLBACKS, 1);
            Read::Real(Kind::Source)
        }
    }
}

/// `[pos, end)`: the part of the requested range that lies inside the file; `None` when
/// nothing does (EOF, bad offset: the real call answers that).
fn range(fd: c_int, off: Option<i64>, len: u64, size: u64) -> Option<(u64, u64)> {
    let pos = match off {
        Some(o) => o,
        None => sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR) as i64,
    };
    let pos = u64::try_from(pos).ok()?;
    let want = len.min(MAX_RW);
    if pos >= size || want == 0 {
        return None;
    }
    Some((pos, pos.saturating_add(want).min(size)))
}

/// Reads `[pos, end)` of the file from `<tier_dir>/<name>` at `file_off`, checking the read
/// returned all of it; moves the fd's offset for `read`-style calls. `None`: not served. The
/// pages of a `transient` copy are dropped once read (page-cache residency).
#[allow(clippy::too_many_arguments)]
fn serve_from(
    g: &Guard,
    fd: c_int,
    tier: u8,
    name: &[u8],
    pos: u64,
    file_off: u64,
    end: u64,
    move_offset: bool,
    transient: bool,
    f: &impl Fill,
) -> Option<isize> {
    let mut buf = [0u8; BUF];
    let path = tier_path(g, tier, name, &mut buf)?;
    let file = detour::raw_openat(
        libc::AT_FDCWD,
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    );
    if file < 0 {
        return None;
    }
    let want = end - pos;
    let n = f.fill(file, file_off, want);
    if transient && n > 0 {
        crate::residency::drop_pages(file, file_off, n as u64);
    }
    detour::raw_close(file);
    if n < 0 || n as u64 != want {
        return None;
    }
    if move_offset && sys!(libc::SYS_lseek, fd, end, libc::SEEK_SET) < 0 {
        // The bytes are in the buffer but the offset did not move: let the source answer.
        return None;
    }
    g.count(job::TIER_BYTES + tier as usize, n as u64);
    Some(n)
}

/// `<tier_dir(tier)>/<name>` NUL-terminated in `buf`.
fn tier_path(g: &Guard, tier: u8, name: &[u8], buf: &mut [u8; BUF]) -> Option<*const libc::c_char> {
    let dir = g.table.tier_dir(tier as u32)?;
    let end = dir.len() + 1 + name.len();
    buf.get_mut(..dir.len())?.copy_from_slice(dir);
    *buf.get_mut(dir.len())? = b'/';
    buf.get_mut(dir.len() + 1..end)?.copy_from_slice(name);
    *buf.get_mut(end)? = 0;
    Some(buf.as_ptr().cast())
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
    f: &impl Fill,
) -> Read {
    let cs = g.table.chunk_size();
    let size = entry.stat.size;
    if cs == 0 {
        return Read::Real(Kind::Source);
    }
    let Some((pos, end)) = range(fd, off, len, size) else {
        return Read::Real(Kind::Source);
    };
    for k in pos / cs..=(end - 1) / cs {
        if !g.table.chunk_present(idx, k) {
            if k <= request::ARG_MAX as u64 {
                g.table.push_request_arg(request::CHUNK, idx, k as u32);
            }
            return Read::Real(Kind::Source);
        }
    }
    let name = chunks_name(entry.object);
    let data = chunk_data_offset(size, cs);
    let tier = state::tier_of(word);
    match serve_from(
        g,
        fd,
        tier,
        &name,
        pos,
        data + pos,
        end,
        off.is_none(),
        false,
        f,
    ) {
        Some(n) => Read::Served(n),
        None => {
            g.count(job::FALLBACKS, 1);
            Read::Real(Kind::Source)
        }
    }
}

enum Waited {
    /// Progress covers the range; the partial copy lives in this tier.
    Covered(u8),
    /// The copy is complete (state word).
    Placed(u64),
    /// Not worth waiting (agent gone, no progress, not being fetched): use the source.
    GiveUp,
}

/// How long a large file may stay UNPLACED after our open asked the agent to fetch it: the
/// agent polls its ring every millisecond, so this only runs out when the request was lost.
const UNCLAIMED_NS: u64 = 100_000_000;

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    sys!(
        libc::SYS_clock_gettime,
        libc::CLOCK_MONOTONIC,
        &mut ts as *mut libc::timespec
    );
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits until `progress ≥ end` (or, with `end == None`, until the copy is complete), as long as
/// the file is being fetched, the agent's heartbeat is fresh and progress keeps moving.
fn wait(g: &Guard, idx: u32, end: Option<u64>) -> Waited {
    let mut start = 0;
    let mut moved = 0;
    let mut last = 0;
    let mut sleep = SLEEP_MIN_NS;
    loop {
        let word = g.table.state(idx);
        let st = state::state_of(word);
        if st == state::PLACED {
            return Waited::Placed(word);
        }
        if st != state::UNPLACED && st != state::QUEUED && st != state::PLACING {
            return Waited::GiveUp;
        }
        // Progress is only meaningful while PLACING (a QUEUED entry may carry an old one).
        let p = if st == state::PLACING {
            g.table.progress(idx)
        } else {
            0
        };
        if let Some(e) = end {
            if st == state::PLACING && p >= e {
                return Waited::Covered(state::tier_of(word));
            }
        }
        let now = now_ns();
        if !g.table.agent_alive(now) {
            return Waited::GiveUp;
        }
        if start == 0 {
            (start, moved, last) = (now, now, p);
        } else if p != last {
            (moved, last) = (now, p);
        }
        // Still UNPLACED after a grace period: our request was lost (ring full) or refused.
        let unclaimed = st == state::UNPLACED && now - start > UNCLAIMED_NS;
        if unclaimed || now - moved > STALL_NS || now - start > WAIT_MAX_NS {
            if log::enabled() {
                log::line(&[b"gave up waiting for the agent, reading the source"]);
            }
            return Waited::GiveUp;
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: sleep,
        };
        sys!(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize);
        sleep = (sleep * 2).min(SLEEP_MAX_NS);
    }
}

/// `mmap` of a tracked source fd: a complete copy is switched to first; a large file being
/// fetched is waited for (bounded), so the mapping is of the copy.
pub fn on_map(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let Some(entry) = g.table.entry(idx) else {
        return;
    };
    let word = g.table.state(idx);
    match state::state_of(word) {
        state::PLACED => {
            switch(g, fd, idx, &entry, word);
        }
        state::UNPLACED | state::QUEUED | state::PLACING
            if entry.stat.size >= g.table.prefetch_min_size() =>
        {
            if let Waited::Placed(w) = wait(g, idx, None) {
                switch(g, fd, idx, &entry, w);
            }
        }
        _ => {}
    }
}

/// After a successful `mmap` of a tracked source fd of a PARTIAL file: every present chunk
/// inside the mapping is mapped over it from the chunk file (`MAP_FIXED`), so a reader that maps
/// a file half-cached (an LMDB larger than the tier) faults the cached half in locally. Only for
/// mappings that cannot write through (no `PROT_WRITE`, or `MAP_PRIVATE`): a shared writable
/// mapping must keep reaching the source.
#[allow(clippy::too_many_arguments)]
pub fn on_mapped(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    addr: *mut core::ffi::c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: i64,
) {
    let _keep = KeepErrno::new();
    let idx = t.entry;
    let word = g.table.state(idx);
    let cs = g.table.chunk_size();
    let shared_writable = prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0;
    if state::state_of(word) != state::PARTIAL || cs == 0 || shared_writable || off < 0 {
        return;
    }
    let Some(entry) = g.table.entry(idx) else {
        return;
    };
    let size = entry.stat.size;
    let data = chunk_data_offset(size, cs);
    let (map_start, map_end) = (
        off as u64,
        (off as u64).saturating_add(len as u64).min(size),
    );
    if map_start >= map_end {
        return;
    }
    let mut buf = [0u8; BUF];
    let Some(path) = tier_path(
        g,
        state::tier_of(word),
        &chunks_name(entry.object),
        &mut buf,
    ) else {
        return;
    };
    let file = detour::raw_openat(
        libc::AT_FDCWD,
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    );
    if file < 0 {
        return;
    }
    // SAFETY: plain old data, fully written by fstat before it is read.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // A chunk file shorter than its geometry would SIGBUS the program on access: never map it.
    let whole = detour::raw_fstat(file, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_size as u64 >= data + size;
    let fixed = (flags & !libc::MAP_FIXED_NOREPLACE) | libc::MAP_FIXED;
    let mut k = map_start / cs;
    while whole && k * cs < map_end {
        let (start, end) = ((k * cs).max(map_start), ((k + 1) * cs).min(map_end));
        if g.table.chunk_present(idx, k) {
            let at = (addr as usize).wrapping_add((start - map_start) as usize);
            let r = sys!(
                libc::SYS_mmap,
                at,
                end - start,
                prot,
                fixed,
                file,
                data + start
            );
            if r < 0 {
                // A failed MAP_FIXED may leave the range unmapped: put the source back there.
                sys!(libc::SYS_mmap, at, end - start, prot, fixed, fd, start);
                break;
            }
        }
        k += 1;
    }
    detour::raw_close(file);
}

/// `lseek` (and anything else that only needs the fd on the copy once there is one).
pub fn on_seek(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    let word = g.table.state(t.entry);
    if state::state_of(word) == state::PLACED {
        if let Some(entry) = g.table.entry(t.entry) {
            switch(g, fd, t.entry, &entry, word);
        }
    }
}

fn switch_kind(g: &Guard, fd: c_int, idx: u32, entry: &EntryRec, word: u64) -> Kind {
    if switch(g, fd, idx, entry, word) {
        Kind::Tier(state::tier_of(word))
    } else {
        Kind::Source
    }
}

/// Puts the complete copy under the fd's number: opened with the fd's status flags, checked
/// like an open of a placed file, positioned at the fd's offset, `dup3`'d over the fd with the
/// same FD_CLOEXEC. Tried once per fd: a failure pins the fd to the source.
fn switch(g: &Guard, fd: c_int, idx: u32, entry: &EntryRec, word: u64) -> bool {
    if fdtable::pinned(fd) || !fdtable::owned() {
        return false;
    }
    let ok = try_switch(g, fd, idx, entry, state::tier_of(word));
    if !ok {
        fdtable::pin(fd);
    }
    if log::enabled() {
        let what: &[u8] = if ok {
            b"switched to the complete copy: "
        } else {
            b"could not switch to the copy, staying on the source: "
        };
        log::line(&[what, g.table.rel_path(entry).unwrap_or(b"?")]);
    }
    ok
}

fn try_switch(g: &Guard, fd: c_int, idx: u32, entry: &EntryRec, tier: u8) -> bool {
    let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
    let fdfl = sys!(libc::SYS_fcntl, fd, libc::F_GETFD);
    let pos = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
    if fl < 0 || fdfl < 0 || pos < 0 || fl as c_int & libc::O_ACCMODE != libc::O_RDONLY {
        return false;
    }
    let creation = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC;
    // The temporary fd is close-on-exec; the fd's own flag is restored by dup3.
    let flags = (fl as c_int & !creation) | libc::O_CLOEXEC;
    let Some(copy) = open_copy(g, idx, entry, tier, flags) else {
        return false;
    };
    // Position the copy first: dup3 shares the open file description, offset included, so
    // nothing can fail after the fd has been replaced.
    let cloexec = if fdfl as c_int & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    let ok = sys!(libc::SYS_lseek, copy, pos, libc::SEEK_SET) == pos
        && sys!(libc::SYS_dup3, copy, fd, cloexec) == fd as libc::c_long;
    detour::raw_close(copy);
    if !ok {
        return false;
    }
    fdtable::track(
        fd,
        Tracked {
            entry: idx,
            kind: Kind::Tier(tier),
        },
    );
    g.count(job::TIER_FILES + tier as usize, 1);
    true
}

/// A tracked source fd was closed: a small file still waiting for placement has its pages in the
/// page cache now, so the agent should copy it from there.
pub fn on_close(t: Tracked) {
    if t.kind != Kind::Source {
        return;
    }
    let Some(table) = crate::config::table() else {
        return;
    };
    if !table.is_valid() {
        return;
    }
    let Some(entry) = table.entry(t.entry) else {
        return;
    };
    let st = state::state_of(table.state(t.entry));
    if entry.stat.size < table.prefetch_min_size() && (st == state::UNPLACED || st == state::QUEUED)
    {
        table.push_request(request::CLOSED, t.entry);
    }
}
