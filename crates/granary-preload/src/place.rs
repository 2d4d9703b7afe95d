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
use crate::log;
use crate::switch::{self, range, ReadInto, Serve, Served};
use crate::sys::{self, sys, KeepErrno};

/// A waiting read gives up when progress stood still this long…
const STALL_NS: u64 = 2_000_000_000;
/// …or when it waited this long in all.
const WAIT_MAX_NS: u64 = 60_000_000_000;
const SLEEP_MIN_NS: i64 = 200_000;
const SLEEP_MAX_NS: i64 = 1_000_000;
/// An open waiting for a cluster copy polls faster: the whole file arrives in about a
/// millisecond, and the open is on the program's critical path.
const OPEN_SLEEP_MIN_NS: i64 = 50_000;
const OPEN_SLEEP_MAX_NS: i64 = 250_000;
/// …and it waits longer for the copy to start moving: the agent bounds its own waits on other
/// nodes (it reads the source when one is silent), its own death or stop ends the wait at once
/// (heartbeat), and a loaded node can take a few seconds before the copy's first byte.
const OPEN_STALL_NS: u64 = 10_000_000_000;

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

/// What `switch::serve` did, counted: tier bytes, or source bytes when it had to read the source.
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
        .map(|(file, _)| switch::serve(fd, file, off, len, &how, f));
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
    let Some((file, tier, _)) = switch::open_copy(g, t.entry, e, libc::O_RDONLY | libc::O_CLOEXEC)
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
    served(g, tier, switch::serve(fd, file, off, len, &how, f))
        .unwrap_or(Read::Real(FdKind::Source))
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
        open_chunks(g, idx, entry, tier).map(|file| switch::serve(fd, file, off, len, &how, f));
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
    open_recorded(g, idx, tier, &chunks_name(entry.object))
}

/// The tier file `name` (the entry's chunk file or part) in `tier`, read-only, if it is the one
/// the agent recorded for entry `idx`.
pub fn open_recorded(g: &Guard, idx: u32, tier: u8, name: &[u8]) -> Option<c_int> {
    let (ino, _) = g.table.copy_identity(idx);
    let expect = Expect {
        ino,
        ctime_ns: 0,
        size: None,
    };
    let flags = libc::O_RDONLY | libc::O_CLOEXEC;
    copies::open(g.table, tier, name, flags, &expect).map(|(fd, _)| fd)
}

enum Waited {
    /// Progress covers the range; the partial copy lives in this tier.
    Covered(u8),
    /// The copy is complete.
    Placed,
    /// Not worth waiting (agent gone or stopped, no progress, not being fetched, a signal):
    /// use the source.
    GiveUp,
}

/// How long a large file may stay UNPLACED after our open asked the agent to fetch it: the
/// agent polls its ring every millisecond, so this only runs out when the request was lost.
const UNCLAIMED_NS: u64 = 100_000_000;

pub fn now_ns() -> u64 {
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
/// the file is being fetched, the agent's heartbeat is fresh and progress keeps moving. A signal
/// delivered meanwhile ends the wait at once (the read then goes to the source), so the program's
/// handler runs as promptly as without granary.
fn wait(g: &Guard, idx: u32, end: Option<u64>) -> Waited {
    wait_with(g, idx, end, (SLEEP_MIN_NS, SLEEP_MAX_NS), STALL_NS, false)
}

/// `wait`, napping from `naps.0` doubling up to `naps.1` nanoseconds, giving up when progress
/// stood still for `stall` nanoseconds.
fn wait_with(
    g: &Guard,
    idx: u32,
    end: Option<u64>,
    naps: (i64, i64),
    stall: u64,
    woken: bool,
) -> Waited {
    let mut start = 0;
    let mut moved = 0;
    let mut last = 0;
    let mut sleep = naps.0;
    // Signals are held back while the wait looks at the table. A nap lets them in atomically
    // (`ppoll`); a futex sleep cannot, so the woken wait sleeps with them held and looks for
    // one pending before each sleep (each at most `naps.1`).
    let gate = Gate::hold();
    loop {
        let seen = g.table.placed_count();
        let word = g.table.state(idx);
        let st = state::state_of(word);
        if st == state::PLACED {
            return Waited::Placed;
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
            return give_up(b"the agent does not answer");
        }
        if start == 0 {
            (start, moved, last) = (now, now, p);
        } else if p != last {
            (moved, last) = (now, p);
        }
        // Still UNPLACED after a grace period: our request was lost (ring full) or refused.
        let unclaimed = st == state::UNPLACED && now - start > UNCLAIMED_NS;
        if unclaimed || now - moved > stall || now - start > WAIT_MAX_NS {
            return give_up(b"the copy does not progress");
        }
        let interrupted = if woken && gate.holds() {
            let t = core::time::Duration::from_nanos(sleep as u64);
            sleep = (sleep * 2).min(naps.1);
            gate.pending() || g.table.wait_placed(seen, t)
        } else if woken {
            let t = core::time::Duration::from_nanos(sleep as u64);
            sleep = (sleep * 2).min(naps.1);
            g.table.wait_placed(seen, t)
        } else {
            !gate.nap(&mut sleep, naps.1)
        };
        if interrupted {
            return give_up(b"a signal arrived");
        }
    }
}

/// A wait's hold on the program's signals: held back while the wait looks at the table, let
/// in only while it sleeps (`ppoll` swaps the mask for the sleep atomically). A signal that
/// arrives between two naps is then not handled unseen — the wait going on for seconds while
/// the program's Ctrl-C handler already ran — but interrupts the next nap at once. Faults
/// (`SIGSEGV`, `SIGBUS`, …) and glibc's internal signals are never held. The program's own
/// mask comes back when the gate is dropped.
pub struct Gate {
    /// The thread's mask before the gate (a kernel `sigset_t`, 64 signals); `None`: the mask
    /// could not be changed, naps are plain sleeps.
    orig: Option<u64>,
}

/// Signals a wait never holds back: synchronous faults (blocked, the kernel kills the
/// process), the two that cannot be blocked, and glibc's cancellation and set*id signals (32,
/// 33: another thread's `setuid` waits for every thread to take one).
const NEVER_HELD: u64 = sig_bit(libc::SIGSEGV)
    | sig_bit(libc::SIGBUS)
    | sig_bit(libc::SIGFPE)
    | sig_bit(libc::SIGILL)
    | sig_bit(libc::SIGTRAP)
    | sig_bit(libc::SIGSYS)
    | sig_bit(libc::SIGKILL)
    | sig_bit(libc::SIGSTOP)
    | sig_bit(32)
    | sig_bit(33);

const fn sig_bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

impl Gate {
    pub fn hold() -> Gate {
        let block: u64 = !NEVER_HELD;
        let mut orig: u64 = 0;
        let r = sys!(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &block as *const u64,
            &mut orig as *mut u64,
            8usize
        );
        Gate {
            orig: (r == 0).then_some(orig),
        }
    }

    /// True if the program's signals are held back (the mask could be changed).
    pub fn holds(&self) -> bool {
        self.orig.is_some()
    }

    /// True if a signal the gate holds back is pending and the program handles it (a handler
    /// of its own, or a default that ends or stops it): the wait must end so that it runs.
    /// Signals it ignores (`SIG_IGN`, or ignored by default: a child's `SIGCHLD`, `SIGWINCH`,
    /// `SIGURG`, `SIGCONT`) do not end it.
    pub fn pending(&self) -> bool {
        let Some(orig) = self.orig else {
            return false;
        };
        let mut set: u64 = 0;
        if sys!(libc::SYS_rt_sigpending, &mut set as *mut u64, 8usize) != 0 {
            return false;
        }
        let held = set & !orig & !NEVER_HELD;
        (1..=64).filter(|&sig| held & sig_bit(sig) != 0).any(|sig| {
            // The kernel's `struct sigaction` starts with the handler on every architecture;
            // 4 words hold it whole (handler, flags, restorer, mask on x86-64).
            let mut act = [0u64; 4];
            let r = sys!(
                libc::SYS_rt_sigaction,
                sig,
                core::ptr::null::<u64>(),
                act.as_mut_ptr(),
                8usize
            );
            let ignored_by_default = matches!(
                sig,
                libc::SIGCHLD | libc::SIGWINCH | libc::SIGURG | libc::SIGCONT
            );
            r != 0
                || !(act[0] == libc::SIG_IGN as u64
                    || act[0] == libc::SIG_DFL as u64 && ignored_by_default)
        })
    }

    /// Sleeps `sleep` ns with the program's signals let in, then doubles `sleep` up to `max`;
    /// false if a signal came (now, or while the wait looked at the table).
    pub fn nap(&self, sleep: &mut i64, max: i64) -> bool {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: *sleep,
        };
        let r = match &self.orig {
            Some(orig) => sys!(
                libc::SYS_ppoll,
                core::ptr::null_mut::<libc::pollfd>(),
                0usize,
                &ts as *const libc::timespec,
                orig as *const u64,
                8usize
            ),
            None => sys!(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize),
        };
        let interrupted = r < 0 && sys::errno() == libc::EINTR;
        *sleep = (*sleep * 2).min(max);
        !interrupted
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if let Some(orig) = &self.orig {
            let _keep = KeepErrno::new();
            sys!(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                orig as *const u64,
                core::ptr::null_mut::<u64>(),
                8usize
            );
        }
    }
}

/// Waits (as `wait` does) until the copy of `idx` is complete; false when it gave up. Between
/// looks it sleeps on the table's count of published copies (the agent wakes it when it
/// publishes one), each sleep bounded as `wait`'s naps are.
pub fn wait_placed(g: &Guard, idx: u32) -> bool {
    woken_wait(
        g,
        idx,
        (OPEN_SLEEP_MIN_NS, OPEN_SLEEP_MAX_NS),
        OPEN_STALL_NS,
    )
}

/// Waits for the complete copy of `idx`, woken when the agent publishes a copy; false when it
/// gave up.
fn woken_wait(g: &Guard, idx: u32, naps: (i64, i64), stall: u64) -> bool {
    matches!(wait_with(g, idx, None, naps, stall, true), Waited::Placed)
}

fn give_up(why: &[u8]) -> Waited {
    if log::enabled() {
        log::line(&[
            b"stopped waiting for the agent (",
            why,
            b"), reading the source",
        ]);
    }
    Waited::GiveUp
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
