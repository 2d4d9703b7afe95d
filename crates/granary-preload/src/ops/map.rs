//! What granary does for `mmap` of a tracked fd, and for `munmap`/`mremap`: a source fd of a
//! placed file is switched to the copy first (or the mapping is made of the copy through an fd
//! of its own when the source fd is shared); a file not entirely local is mapped at once, from
//! the source with what the tier holds mapped over it (`overlay`); a copy the program changed
//! since maps the source. `munmap`/`mremap` of a mapping the agent follows tell it to look
//! again; an `mremap` that fails on a mapping granary split into several is retried over the
//! source mapped back whole.

use core::ffi::{c_int, c_void};

use granary_shm::{EntryRec, State};

use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::ops::detour::{self, Guard};
use crate::sys::{self, log, KeepErrno};
use crate::wait::{woken_wait, SLEEP_MAX_NS, SLEEP_MIN_NS, STALL_NS};
use crate::{fds::switch, fds::tracked};

use super::read::stale;

/// `mmap` of a tracked fd: a source fd of a placed file is switched to the copy first; a file
/// not entirely local is mapped at once, from the source with what the tier holds mapped over
/// it (`overlay`); a copy the program changed since maps the source.
pub fn map(
    fd: c_int,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: libc::off_t,
    real: impl Fn(c_int) -> *mut c_void,
) -> *mut c_void {
    let Some(t) = tracked::get(fd) else {
        return real(fd);
    };
    let Ok(g) = detour::enter_any_creds() else {
        return real(fd);
    };
    match t.kind {
        FdKind::Source => {
            if fdtable::lock(fd) {
                if let Some(now) = tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
                    on_map(&g, fd, now);
                }
                fdtable::unlock(fd);
            }
            // Still a source fd (its OFD shared, so not switched): a complete copy backs the
            // mapping through an fd of its own (CPython's `mmap` dups the fd it maps).
            if let Some(p) = map_copy(&g, fd, prot, flags, &real) {
                return p;
            }
            let p = real(fd);
            if let Some(now) = tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
                if p != libc::MAP_FAILED {
                    crate::overlay::source_mapped(&g, fd, now, p, len, prot, flags, off);
                }
            }
            p
        }
        FdKind::Tier(_) if stale(&t) => stale_map(&g, fd, t, prot, flags, real),
        _ => real(fd),
    }
}

/// A mapping of source fd `fd` backed by the complete copy through a temporary fd, when the file
/// is placed and the mapping cannot write through to the source (a shared writable mapping must
/// reach the source).
fn map_copy(
    g: &Guard,
    fd: c_int,
    prot: c_int,
    flags: c_int,
    real: &impl Fn(c_int) -> *mut c_void,
) -> Option<*mut c_void> {
    let t = tracked::get(fd).filter(|n| n.kind == FdKind::Source)?;
    if prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0 {
        return None;
    }
    if g.table.state(t.entry).state() != State::Placed {
        return None;
    }
    let e = crate::ops::lookup::entry(g.table, t.entry)?;
    let (copy, _, _) =
        crate::fds::copies::open_copy(g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC)?;
    let p = real(copy);
    let _keep = sys::KeepErrno::new();
    sys::raw_close(copy);
    // Not an open: the fd stays the source's (counted there once, at its open); the agent
    // counts the mapping's bytes by where its pages come from (`job::MAP_LOCAL_BYTES`).
    if p != libc::MAP_FAILED && log::enabled() {
        log::line(&[
            b"mapped from the complete copy: ",
            g.table.name(&e).unwrap_or(b"?"),
        ]);
    }
    Some(p)
}

/// A mapping of a copy whose file the program changed: of the source (the fd moves there when
/// nobody shares its OFD; otherwise a source fd opened for the call backs the mapping).
fn stale_map(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    prot: c_int,
    flags: c_int,
    real: impl Fn(c_int) -> *mut c_void,
) -> *mut c_void {
    let Some(e) = crate::ops::lookup::entry(g.table, t.entry) else {
        return real(fd);
    };
    if fdtable::lock(fd) {
        let moved = switch::to_source(g, fd, t, &e);
        fdtable::unlock(fd);
        if moved {
            return real(fd);
        }
    }
    let writes = prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0;
    let acc = if writes { libc::O_RDWR } else { libc::O_RDONLY };
    match switch::open_source(g, t.entry, &e, acc | libc::O_CLOEXEC) {
        Some(src) => {
            let p = real(src);
            let _keep = sys::KeepErrno::new();
            sys::raw_close(src);
            p
        }
        None => real(fd),
    }
}

/// `mmap` of a tracked source fd: a complete copy is switched to first. A larger file still
/// being fetched is not waited for: it is mapped from the source at once (`overlay`). A
/// mid-size one (`fetched_direct`) is: its fetch is one direct read that shares no pages with a
/// mapping of the source, so mapping the source would read its bytes twice; the wait is that
/// one read, and gives up (mapping the source) as a read's wait does.
fn on_map(g: &Guard, fd: c_int, t: Tracked) {
    let _keep = KeepErrno::new();
    if t.has(flag::PINNED) {
        return;
    }
    let st = g.table.state(t.entry).state();
    if !matches!(
        st,
        State::Placed | State::Unplaced | State::Queued | State::Placing
    ) {
        // No copy, none coming that a mapping waits for: nothing to look up.
        return;
    }
    let Some(entry) = crate::ops::lookup::entry(g.table, t.entry) else {
        return;
    };
    if st != State::Placed
        && !(fetched_direct(g, t.entry, &entry)
            // As a read waits (its naps and stall), woken by the agent's publications.
            && woken_wait(g, t.entry, (SLEEP_MIN_NS, SLEEP_MAX_NS), STALL_NS, false))
    {
        return;
    }
    switch::to_copy(g, fd, t, &entry);
}

/// True if the agent fetches entry `idx` whole in one direct read and has not placed it yet.
fn fetched_direct(g: &Guard, idx: u32, entry: &EntryRec) -> bool {
    let size = entry.stat.size;
    matches!(
        g.table.state(idx).state(),
        State::Unplaced | State::Queued | State::Placing
    ) && size >= g.table.prefetch_min_size()
        && size <= granary_shm::DIRECT_FETCH_MAX
        && g.table.locator(idx).is_none()
}

/// `munmap`/`mremap` moved or removed `[addr, addr + len)` (and, for `mremap`, mapped it at
/// `moved_to`): the agent looks again if a mapping it follows was among them.
pub fn unmapped(addr: usize, len: usize, moved_to: Option<(usize, usize)>) {
    crate::overlay::unmapped(addr, len, moved_to);
}

/// `mremap` of `[addr, addr + len)` failed with EFAULT: true if it was a mapping granary split
/// (the source with tier files over it) and the source is mapped back over all of it now, so
/// the call can be made again. Cold and out of line: `mremap`'s hook keeps a small frame.
#[cold]
#[inline(never)]
pub fn unsplit(addr: usize, len: usize) -> bool {
    let Ok(g) = detour::enter_any_creds() else {
        return false;
    };
    crate::overlay::unsplit(&g, addr, len)
}
