//! Which fds granary opened, and for what: a static array of atomics indexed by fd, so the
//! fd-taking hooks (`read`, `fstat`, `close`, …) pay one load on the fast path. Fds beyond the
//! array are never tracked (their calls pass through).
//!
//! Besides what an fd is, each word says whether its open file description (OFD) may be shared
//! with another fd or process (`SHARED`): after `dup`, `fork`, an `SCM_RIGHTS` send, or while it is
//! inheritable across `exec`. Only an fd whose OFD is ours alone may be switched to another file
//! (`dup3` over it): a sharer would keep the old OFD, and reads alternating between the two would
//! no longer share an offset. `BUSY` keeps, among the threads of this process, a switch apart
//! from the reads of the same fd (a read in flight on the old OFD would move an offset the switch
//! already copied). Served reads need no lock of ours against other sharers: they claim their
//! range on the OFD's offset atomically (`serve::serve`).
//!
//! Atomics in static memory survive fork unchanged, which is what a forked child's inherited fds
//! need; nothing here needs a lock of its own.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use core::ffi::c_int;

use crate::sys::{self, sys, KeepErrno};

const MAX_FDS: usize = 65536;
/// Directory fds get a listing cursor and a dirent buffer each; more than this pass through.
pub const MAX_DIR_FDS: usize = 4096;

static FDS: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
/// One past the highest fd ever tracked: the end of the scans `fork` and `close_range` make.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Listing position of each tracked directory fd: 0 = `.`, 1 = `..`, 2 + i = child i.
static DIR_POS: [AtomicU32; MAX_DIR_FDS] = [const { AtomicU32::new(0) }; MAX_DIR_FDS];

/// The range the positioned reads (`pread` family) of each tracked tier fd covered: the highest
/// end in `PREAD_END`, the lowest start stored bitwise-inverted in `PREAD_START_INV`, so both
/// grow with `fetch_max` and zero means "none" (zeroed statics cost nothing until touched).
/// Page-cache residency drops that range of a transient copy at close.
static PREAD_START_INV: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
static PREAD_END: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];
/// How far the pages of each tracked tier fd's copy were dropped behind a reader reading it in
/// sequence (`pagedrop::behind`): a transient copy's pages then never pile up until its close.
static DROPPED_TO: [AtomicU64; MAX_FDS] = [const { AtomicU64::new(0) }; MAX_FDS];

/// The process this table describes. A vfork child (CPython's subprocess, posix_spawn) runs in
/// its parent's memory until exec: its closes and dup2s must not rewrite the parent's table.
/// fork children update it from the atfork handler (which vfork does not run).
static OWNER: AtomicI32 = AtomicI32::new(0);

pub fn set_owner() {
    OWNER.store(crate::sys::pid::current(), Ordering::Relaxed);
}

/// False only in a child that runs in our memory (a vfork child, `clone(CLONE_VM)`): what this
/// process keeps in memory about its fds (this table, the tier directory fds) is its parent's
/// there, not its own. One load unless such a child may be running. A child with memory of its
/// own (`fork`, raw or not) has its own copy, which describes its fds.
#[inline]
pub fn not_a_vfork_child() -> bool {
    crate::sys::pid::no_memory_sharers() || owned()
}

/// Called only when the table is about to change. No system call unless a vfork child (or
/// another child sharing our memory) may be running (`sys::pid`).
#[inline]
pub fn owned() -> bool {
    crate::sys::pid::current() == OWNER.load(Ordering::Relaxed)
}

const KIND_MASK: u64 = 0xff;
const KIND_SOURCE: u64 = 1;
const KIND_TIER: u64 = 2;
const KIND_DIR: u64 = 3;
const KIND_OTHER: u64 = 4;
const KIND_PACK: u64 = 5;

/// Flags, bits 16..32 of the word.
pub mod flag {
    /// A source fd that stays on the source for good (a switch failed, or it holds a lock).
    pub const PINNED: u64 = 1 << 16;
    /// The OFD may be shared with another fd or process: never switch it.
    pub const SHARED: u64 = 1 << 17;
    /// Keeps a switch apart from this process's other reads of the fd.
    pub const BUSY: u64 = 1 << 18;
    /// A tier fd opened with `O_NOFOLLOW` added by granary: hidden
    /// from `fcntl(F_GETFL)`.
    pub const NOFOLLOW_ADDED: u64 = 1 << 19;
    /// A tier fd opened with `O_NONBLOCK` added by granary (so a FIFO planted in place of a
    /// copy never blocks the open): hidden from `fcntl(F_GETFL)` until the program sets the
    /// status flags itself.
    pub const NONBLOCK_ADDED: u64 = 1 << 20;
    /// A tier fd whose copy was opened without its identity check: the check comes with the
    /// fd's first use (`tracked::confirm`), merged into the program's own `fstat` when that is
    /// the first (CPython's open). Only close-on-exec fds, so no other program gets one.
    pub const UNCHECKED: u64 = 1 << 21;
    /// A tier fd whose copy failed that check: its bytes and metadata come from the source, as
    /// for a copy the program changed in place.
    pub const DAMAGED: u64 = 1 << 22;
    /// A tier fd opened with `O_NOATIME` added by granary (a copy's access time is nobody's
    /// business, and skipping it saves every read an access-time check): hidden from
    /// `fcntl(F_GETFL)` until the program sets the status flags itself.
    pub const NOATIME_ADDED: u64 = 1 << 23;
    /// A source fd of a file smaller than the table's whole-fetch size, which the agent copies
    /// only once the program closed it (from the page cache the program's reads filled): no
    /// read of it is ever served by granary, so the read hooks pass it through at once.
    pub const SMALL: u64 = 1 << 24;
    /// An `Other` fd of a small file not placed yet, opened on the source, whose entry
    /// (`Tracked::entry`) its hash slot named without the entry being read (`ops::open`): only
    /// its close uses that entry, to ask the agent for the copy (a request the agent checks).
    /// Every other hook passes it through, as any `Other` fd; an fd-based change looks the path
    /// up as for an untracked fd.
    pub const CLOSE_HINT: u64 = 1 << 25;

    /// The fd flags that record the open flags `copies::open` added.
    pub fn added(open_flags: core::ffi::c_int) -> u64 {
        let mut f = 0;
        if open_flags & libc::O_NOFOLLOW != 0 {
            f |= NOFOLLOW_ADDED;
        }
        if open_flags & libc::O_NONBLOCK != 0 {
            f |= NONBLOCK_ADDED;
        }
        if open_flags & libc::O_NOATIME != 0 {
            f |= NOATIME_ADDED;
        }
        f
    }

    /// The open flags to hide from `F_GETFL` for fd flags `f`.
    pub fn hidden(f: u64) -> core::ffi::c_int {
        let mut o = 0;
        if f & NOFOLLOW_ADDED != 0 {
            o |= libc::O_NOFOLLOW;
        }
        if f & NONBLOCK_ADDED != 0 {
            o |= libc::O_NONBLOCK;
        }
        if f & NOATIME_ADDED != 0 {
            o |= libc::O_NOATIME;
        }
        o
    }
}
const FLAGS_MASK: u64 = 0xffff << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdKind {
    /// A catalogued regular file opened on the source (read-only).
    Source,
    /// A catalogued regular file served from tier `t`'s copy.
    Tier(u8),
    /// A catalogued directory (a real fd of the source directory; listings from the catalog).
    Dir,
    /// Any other file under the source (opened for writing, or not catalogued): only counted.
    Other,
    /// A catalogued regular file extracted from the pack into memory (only the pack exists
    /// and the agent could not place it): `fstat` describes the catalog's file.
    Pack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Catalog entry; `u32::MAX` for `Other` files the catalog does not know.
    pub entry: u32,
    pub kind: FdKind,
    pub flags: u64,
}

impl Tracked {
    pub fn new(entry: u32, kind: FdKind, flags: u64) -> Tracked {
        Tracked { entry, kind, flags }
    }
    pub fn has(&self, f: u64) -> bool {
        self.flags & f != 0
    }
}

fn encode(t: Tracked) -> u64 {
    let (kind, tier) = match t.kind {
        FdKind::Source => (KIND_SOURCE, 0),
        FdKind::Tier(x) => (KIND_TIER, x as u64),
        FdKind::Dir => (KIND_DIR, 0),
        FdKind::Other => (KIND_OTHER, 0),
        FdKind::Pack => (KIND_PACK, 0),
    };
    (t.entry as u64) << 32 | (t.flags & FLAGS_MASK) | (tier & 0xff) << 8 | kind
}

fn decode(v: u64) -> Option<Tracked> {
    let kind = match v & KIND_MASK {
        KIND_SOURCE => FdKind::Source,
        KIND_TIER => FdKind::Tier((v >> 8) as u8),
        KIND_DIR => FdKind::Dir,
        KIND_OTHER => FdKind::Other,
        KIND_PACK => FdKind::Pack,
        _ => return None,
    };
    Some(Tracked {
        entry: (v >> 32) as u32,
        kind,
        flags: v & FLAGS_MASK,
    })
}

fn cell(fd: i32) -> Option<&'static AtomicU64> {
    FDS.get(usize::try_from(fd).ok()?)
}

/// What `fd` is, as recorded (an `UNCHECKED` copy stays unchecked: hooks ask `tracked::get`).
/// In a vfork child the table describes its parent's fds, and a number the child closed and
/// opened again names another file there (its reads were served from the parent's file's copy,
/// its `*at` calls resolved against the parent's directory): there a record holds only if the
/// child's fd is still the file it names (`same_file_in_child`, one `fstat`). An
/// unchecked copy is always shown, so that the child checks it before it hands it on (`dup2`
/// onto 0, then `exec`) — against the copy's name only (`copies::could_be_copy`), so a file of
/// its own is never taken for a damaged copy. A child with memory of its own (`fork`, raw or
/// not) has a copy of the table that describes its fds (`not_a_vfork_child`).
#[inline]
pub fn peek(fd: i32) -> Option<Tracked> {
    decode(cell(fd)?.load(Ordering::Acquire)).filter(|t| {
        crate::sys::pid::no_memory_sharers()
            || matches!(t.kind, FdKind::Tier(_)) && t.has(flag::UNCHECKED)
            || owned()
            || same_file_in_child(fd, t)
    })
}

/// In a vfork child (`fdtable::peek`): the child's `fd` is still the file its parent's table
/// records under that number — the same device and inode as the entry's copy (a tier fd) or
/// its source file or directory. Not for any other kind.
#[inline(never)]
fn same_file_in_child(fd: c_int, t: &Tracked) -> bool {
    let Some(table) = crate::attached::table() else {
        return false;
    };
    let _keep = KeepErrno::new();
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 {
        return false;
    }
    match t.kind {
        FdKind::Tier(tier) => {
            let (ino, _) = table.copy_identity(t.entry);
            ino != 0
                && st.st_ino == ino
                && table
                    .tier_dir_id(tier as u32)
                    .is_some_and(|(dev, _)| dev == st.st_dev)
        }
        FdKind::Source | FdKind::Dir => table.entry(t.entry).is_some_and(|e| {
            e.stat.ino == st.st_ino
                && libc::makedev(e.stat.dev_major, e.stat.dev_minor) == st.st_dev
        }),
        _ => false,
    }
}

/// Records `fd` (keeping a `BUSY` bit its holder will clear); false if it cannot be tracked
/// (out of range, a directory beyond the cursor array, or not our table: a vfork child), in
/// which case the caller must not rely on it.
pub fn track(fd: i32, t: Tracked) -> bool {
    owned() && store(fd, t)
}

fn store(fd: i32, t: Tracked) -> bool {
    let Some(c) = cell(fd) else {
        return false;
    };
    if t.kind == FdKind::Dir {
        let Some(pos) = usize::try_from(fd).ok().and_then(|i| DIR_POS.get(i)) else {
            return false;
        };
        pos.store(0, Ordering::Relaxed);
    }
    if matches!(t.kind, FdKind::Tier(_)) {
        let i = fd as usize;
        if let (Some(a), Some(b), Some(d)) =
            (PREAD_START_INV.get(i), PREAD_END.get(i), DROPPED_TO.get(i))
        {
            a.store(0, Ordering::Relaxed);
            b.store(0, Ordering::Relaxed);
            d.store(0, Ordering::Relaxed);
        }
    }
    // A read first: the high mark rarely moves, and a locked read-modify-write per open is not
    // free. A racing raise is kept by `fetch_max`.
    if HIGH.load(Ordering::Relaxed) <= fd as usize {
        HIGH.fetch_max(fd as usize + 1, Ordering::Relaxed);
    }
    let mut cur = c.load(Ordering::Relaxed);
    loop {
        let new = encode(t) | (cur & flag::BUSY);
        match c.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(v) => cur = v,
        }
    }
}

/// Clears `f` on a tracked fd, whichever process's table it is: for a fact about the open file
/// itself (its copy passed the check), true for every fd that shares it.
pub fn clear_file_flag(fd: i32, f: u64) {
    if let Some(c) = cell(fd) {
        if c.load(Ordering::Relaxed) & KIND_MASK != 0 {
            c.fetch_and(!f, Ordering::AcqRel);
        }
    }
}

/// Sets `f` on a tracked fd (no-op for untracked ones or in a vfork child).
pub fn set_flag(fd: i32, f: u64) {
    if let Some(c) = cell(fd) {
        if c.load(Ordering::Relaxed) & KIND_MASK != 0 && owned() {
            c.fetch_or(f, Ordering::AcqRel);
        }
    }
}

/// Clears `f` on a tracked fd (no-op for untracked ones or in a vfork child).
pub fn clear_flag(fd: i32, f: u64) {
    if let Some(c) = cell(fd) {
        if c.load(Ordering::Relaxed) & KIND_MASK != 0 && owned() {
            c.fetch_and(!f, Ordering::AcqRel);
        }
    }
}

/// Takes the fd's `BUSY` bit, waiting (briefly sleeping) while another thread holds it. The
/// holder's work is bounded (a read, or a wait on the agent that gives up within seconds), so
/// is this wait; false if the fd is not tracked any more.
pub fn lock(fd: i32) -> bool {
    let Some(c) = cell(fd) else { return false };
    let mut spins = 0u32;
    loop {
        let cur = c.load(Ordering::Relaxed);
        if cur & KIND_MASK == 0 {
            return false;
        }
        if cur & flag::BUSY == 0
            && c.compare_exchange_weak(cur, cur | flag::BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return true;
        }
        spins += 1;
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 50_000,
            };
            sys!(libc::SYS_nanosleep, &ts as *const libc::timespec, 0usize);
        }
    }
}

pub fn unlock(fd: i32) {
    if let Some(c) = cell(fd) {
        c.fetch_and(!flag::BUSY, Ordering::Release);
    }
}

/// `clear_file_flag(fd, f)` and `unlock(fd)` in one atomic operation, for the holder of the
/// fd's `BUSY` bit.
pub fn clear_file_flag_and_unlock(fd: i32, f: u64) {
    if let Some(c) = cell(fd) {
        c.fetch_and(!(f | flag::BUSY), Ordering::AcqRel);
    }
}

/// A positioned read of `n` bytes at `off` on tier fd `fd`; true if it continues the fd's
/// positioned reads in sequence (it starts where the furthest one ended: a stream, not a seek).
#[inline]
pub fn note_pread(fd: i32, off: u64, n: u64) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    if let (Some(a), Some(b)) = (PREAD_START_INV.get(i), PREAD_END.get(i)) {
        a.fetch_max(!off, Ordering::Relaxed);
        return b.fetch_max(off.saturating_add(n), Ordering::Relaxed) == off;
    }
    false
}

/// How far tier fd `fd`'s copy was dropped behind its reader (0: not at all).
#[inline]
pub fn dropped_to(fd: i32) -> u64 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| DROPPED_TO.get(i))
        .map_or(u64::MAX, |d| d.load(Ordering::Relaxed))
}

/// Claims the drop of tier fd `fd`'s copy up to `upto`: the offset it was dropped to before, if
/// that was below (so two threads reading one fd never drop the same range twice).
pub fn claim_dropped(fd: i32, upto: u64) -> Option<u64> {
    let d = DROPPED_TO.get(usize::try_from(fd).ok()?)?;
    let before = d.fetch_max(upto, Ordering::Relaxed);
    (before < upto).then_some(before)
}

/// `[start, end)` of the positioned reads on tier fd `fd` since it was opened, if any.
pub fn pread_range(fd: i32) -> Option<(u64, u64)> {
    let i = usize::try_from(fd).ok()?;
    let end = PREAD_END.get(i)?.load(Ordering::Relaxed);
    let start = !PREAD_START_INV.get(i)?.load(Ordering::Relaxed);
    (end > 0 && start < end).then_some((start, end))
}

/// Forgets `fd` and returns what it was (closed, or now naming something granary did not open).
/// `None` in a vfork child, whose closes are not the parent's.
#[inline]
pub fn take(fd: i32) -> Option<Tracked> {
    let c = cell(fd)?;
    if c.load(Ordering::Relaxed) == 0 || !owned() {
        return None;
    }
    decode(c.swap(0, Ordering::AcqRel))
}

/// `new` now names `old`'s OFD (the dup family), `old` being `t` (as `tracked::get` saw it):
/// both are marked shared.
pub fn dup(old: i32, new: i32, t: Option<Tracked>) {
    if old == new {
        return;
    }
    match t {
        Some(mut t) => {
            set_flag(old, flag::SHARED);
            t.flags = (t.flags | flag::SHARED) & !flag::BUSY;
            if !track(new, t) {
                take(new);
            }
        }
        None => {
            take(new);
        }
    }
}

pub fn can_track_dir(fd: i32) -> bool {
    usize::try_from(fd).is_ok_and(|i| i < MAX_DIR_FDS)
}

pub fn dir_pos(fd: i32) -> Option<&'static AtomicU32> {
    DIR_POS.get(usize::try_from(fd).ok()?)
}

/// Forgets the fds `first..=last`, telling `closed` what each tracked one was.
pub fn take_range(first: u32, last: u32, mut closed: impl FnMut(i32, Tracked)) {
    if !owned() {
        return;
    }
    let end = (last as usize).min(HIGH.load(Ordering::Relaxed).saturating_sub(1));
    let mut fd = first as usize;
    while fd <= end {
        if let Some(c) = FDS.get(fd) {
            if c.load(Ordering::Relaxed) != 0 {
                if let Some(t) = decode(c.swap(0, Ordering::AcqRel)) {
                    closed(fd as i32, t);
                }
            }
        }
        fd += 1;
    }
}

/// Every fd this process tracks, with what it is (not in a vfork child: its table is the
/// parent's).
pub fn each(mut f: impl FnMut(i32, Tracked)) {
    if !owned() {
        return;
    }
    let end = HIGH.load(Ordering::Relaxed).min(MAX_FDS);
    for (fd, c) in FDS.iter().take(end).enumerate() {
        if let Some(t) = decode(c.load(Ordering::Acquire)) {
            f(fd as i32, t);
        }
    }
}

/// After `fork`, in parent and child: every tracked OFD is now shared by two processes, and no
/// thread of the child holds a `BUSY` bit (only the forking thread exists there).
pub fn forked(in_child: bool) {
    let end = HIGH.load(Ordering::Relaxed).min(MAX_FDS);
    for c in FDS.iter().take(end) {
        let v = c.load(Ordering::Relaxed);
        if v == 0 {
            continue;
        }
        if in_child {
            // The child has one thread: plain stores race with nobody.
            c.store((v | flag::SHARED) & !flag::BUSY, Ordering::Release);
        } else {
            c.fetch_or(flag::SHARED, Ordering::AcqRel);
        }
    }
}
