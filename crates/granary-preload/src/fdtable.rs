//! Which fds granary opened, and for what: a static array of atomics indexed by fd, so the
//! fd-taking hooks (`read`, `fstat`, `close`, …) pay one load on the fast path. Fds beyond the
//! array are simply never tracked (their calls pass through).
//!
//! Atomics in static memory survive fork unchanged, which is what a forked child's inherited
//! fds need; nothing here needs a lock.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use crate::detour::sys;

const MAX_FDS: usize = 65536;
/// Directory fds get a listing cursor and a dirent buffer each; more than this pass through.
pub const MAX_DIR_FDS: usize = 4096;

static FDS: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
/// Listing position of each tracked directory fd: 0 = `.`, 1 = `..`, 2 + i = child i.
static DIR_POS: [AtomicU32; MAX_DIR_FDS] = [const { AtomicU32::new(0) }; MAX_DIR_FDS];

/// The range the positioned reads (`pread` family) of each tracked tier fd covered: the highest
/// end in `PREAD_END`, the lowest start stored bitwise-inverted in `PREAD_START_INV`, so both
/// grow with `fetch_max` and zero means "none" (zeroed statics cost nothing until touched).
/// Page-cache residency drops that range of a transient copy at close.
static PREAD_START_INV: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
static PREAD_END: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];

/// The process this table describes. A vfork child (CPython's subprocess, posix_spawn) runs in
/// its parent's memory until exec: its closes and dup2s must not rewrite the parent's table.
/// fork children update it from the atfork handler (which vfork does not run).
static OWNER: AtomicI32 = AtomicI32::new(0);

pub fn set_owner() {
    OWNER.store(sys!(libc::SYS_getpid) as i32, Ordering::Relaxed);
}

/// Called only when a write is about to happen, so untracked fds never pay the syscall.
/// Also guards anything that changes the process's fds on its behalf (the switch to a copy).
pub fn owned() -> bool {
    sys!(libc::SYS_getpid) as i32 == OWNER.load(Ordering::Relaxed)
}

const KIND_SOURCE: u64 = 1;
const KIND_TIER: u64 = 2;
const KIND_DIR: u64 = 3;
/// A source fd whose switch to the complete copy failed once: it stays on the source for good
/// (the switch is tried at most once per fd). Ignored by `decode`.
const PINNED: u64 = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A catalogued regular file opened on the source.
    Source,
    /// A catalogued regular file served from tier `t`'s copy.
    Tier(u8),
    /// The shadow directory standing in for a catalogued directory.
    Dir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    pub entry: u32,
    pub kind: Kind,
}

fn encode(t: Tracked) -> u64 {
    let (kind, tier) = match t.kind {
        Kind::Source => (KIND_SOURCE, 0),
        Kind::Tier(x) => (KIND_TIER, x as u64),
        Kind::Dir => (KIND_DIR, 0),
    };
    (t.entry as u64) << 32 | (tier & 0xff) << 8 | kind
}

fn decode(v: u64) -> Option<Tracked> {
    let kind = match v & 0xff {
        KIND_SOURCE => Kind::Source,
        KIND_TIER => Kind::Tier((v >> 8) as u8),
        KIND_DIR => Kind::Dir,
        _ => return None,
    };
    Some(Tracked {
        entry: (v >> 32) as u32,
        kind,
    })
}

fn cell(fd: i32) -> Option<&'static AtomicU64> {
    FDS.get(usize::try_from(fd).ok()?)
}

#[inline]
pub fn get(fd: i32) -> Option<Tracked> {
    decode(cell(fd)?.load(Ordering::Acquire))
}

/// True if `fd` is a source fd that must stay on the source (see `PINNED`).
pub fn pinned(fd: i32) -> bool {
    cell(fd).is_some_and(|c| c.load(Ordering::Relaxed) & PINNED != 0)
}

/// Marks a tracked source fd as staying on the source.
pub fn pin(fd: i32) {
    if let Some(c) = cell(fd) {
        if c.load(Ordering::Relaxed) & 0xff == KIND_SOURCE && owned() {
            c.fetch_or(PINNED, Ordering::Release);
        }
    }
}

/// Records `fd`; false if it cannot be tracked (out of range, or a directory beyond the
/// cursor array), in which case the caller must not rely on it.
pub fn track(fd: i32, t: Tracked) -> bool {
    let Some(c) = cell(fd) else {
        return false;
    };
    if !owned() {
        return false;
    }
    if t.kind == Kind::Dir {
        let Some(pos) = usize::try_from(fd).ok().and_then(|i| DIR_POS.get(i)) else {
            return false;
        };
        pos.store(0, Ordering::Relaxed);
    }
    if matches!(t.kind, Kind::Tier(_)) {
        if let (Some(a), Some(b)) = (PREAD_START_INV.get(fd as usize), PREAD_END.get(fd as usize)) {
            a.store(0, Ordering::Relaxed);
            b.store(0, Ordering::Relaxed);
        }
    }
    c.store(encode(t), Ordering::Release);
    true
}

/// A positioned read of `n` bytes at `off` on tier fd `fd`.
#[inline]
pub fn note_pread(fd: i32, off: u64, n: u64) {
    let Ok(i) = usize::try_from(fd) else { return };
    if let (Some(a), Some(b)) = (PREAD_START_INV.get(i), PREAD_END.get(i)) {
        a.fetch_max(!off, Ordering::Relaxed);
        b.fetch_max(off.saturating_add(n), Ordering::Relaxed);
    }
}

/// `[start, end)` of the positioned reads on tier fd `fd` since it was opened, if any.
pub fn pread_range(fd: i32) -> Option<(u64, u64)> {
    let i = usize::try_from(fd).ok()?;
    let end = PREAD_END.get(i)?.load(Ordering::Relaxed);
    let start = !PREAD_START_INV.get(i)?.load(Ordering::Relaxed);
    (end > 0 && start < end).then_some((start, end))
}

/// Forgets `fd` (closed, or now naming something granary did not open).
#[inline]
pub fn clear(fd: i32) {
    if let Some(c) = cell(fd) {
        if c.load(Ordering::Relaxed) != 0 && owned() {
            c.store(0, Ordering::Release);
        }
    }
}

/// `new` now names what `old` names (dup family).
pub fn copy(old: i32, new: i32) {
    if old == new {
        return;
    }
    match get(old) {
        Some(t) => {
            if !track(new, t) {
                clear(new);
            }
        }
        None => clear(new),
    }
}

pub fn can_track_dir(fd: i32) -> bool {
    usize::try_from(fd).is_ok_and(|i| i < MAX_DIR_FDS)
}

pub fn dir_pos(fd: i32) -> Option<&'static AtomicU32> {
    DIR_POS.get(usize::try_from(fd).ok()?)
}

/// Forgets the fds `first..=last`, telling `closed` what each tracked one was.
pub fn clear_range(first: u32, last: u32, mut closed: impl FnMut(Tracked)) {
    if !owned() {
        return;
    }
    let end = (last as usize).min(MAX_FDS - 1);
    let mut fd = first as usize;
    while fd <= end {
        if let Some(c) = FDS.get(fd) {
            let v = c.load(Ordering::Relaxed);
            if v != 0 {
                c.store(0, Ordering::Release);
                if let Some(t) = decode(v) {
                    closed(t);
                }
            }
        }
        fd += 1;
    }
}
