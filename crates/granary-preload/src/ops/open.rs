//! What granary does for the calls that create fds for paths (`open` and friends, `creat`,
//! `fopen`, `freopen`): a read-only open of a placed file gets the copy's fd; a directory gets
//! its real fd, tracked so listings come from the catalog; every other open runs as the real
//! call, and its fd is tracked for what it is (a catalogued file on the source, so the agent
//! places it; anything under the source, counted). An open that may write is the real call, and
//! what it opened is voided (`mutate`).
//!
//! A placed open in one line: `find` the entry (one table lookup), open its copy
//! (`copies::open_copy_unchecked`), track the fd (`fdtable`).

use core::ffi::{c_char, c_int};

use core::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use granary_shm::{
    job, object_name, path_hash, request, CopyHint, EntryRec, FileHit, Found, Locator, State,
};

use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::ops::detour::{self, Bypass, Detour, Guard};
use crate::ops::lookup;
use crate::ops::path::{Buf, Loc};
use crate::sys::{self, KeepErrno};
use crate::{fds::copies, sys::log};

/// Flags under which an open only reads (anything else, e.g. O_DIRECT, O_PATH, O_TMPFILE,
/// passes through). 0o100000 is the kernel's O_LARGEFILE, which glibc's headers call 0.
const READ_FLAGS: c_int = libc::O_CLOEXEC
    | libc::O_NONBLOCK
    | libc::O_LARGEFILE
    | 0o100000
    | libc::O_NOATIME
    | libc::O_NOCTTY
    | libc::O_NOFOLLOW
    | libc::O_DIRECTORY;
const WRITE_FLAGS: c_int =
    libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND;

fn writes(flags: c_int) -> bool {
    flags & WRITE_FLAGS != 0 && flags & libc::O_PATH == 0
}

/// An fd the kernel will hand to an exec'd child may end up sharing its OFD.
fn initial_flags(flags: c_int) -> u64 {
    if flags & libc::O_CLOEXEC == 0 {
        flag::SHARED
    } else {
        0
    }
}

/// How a placed copy's identity is checked: at the open, or at the fd's first use (`open`
/// and `openat` with `O_CLOEXEC`: every later call on the fd reaches a hook that checks first).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum CheckCopy {
    AtOpen,
    AtFirstUse,
}

/// What to do with the fd the real call returns (`Detour::Bypass`).
pub enum Then {
    /// Nothing (an `fopen` mode we do not understand).
    Nothing,
    /// An open that may write: what it opened is voided.
    Written,
    /// Tracked as this, if anything (a catalogued file opened on the source asks the agent for
    /// it). The guard, when there is one, is held across the real call and released after.
    Track(Option<Guard>, Option<Tracked>),
}

/// The open family: `open`, `openat` and their aliases, `creat`. `real` makes the real call
/// (errno set as it sets it): an open that can only go to the source makes it here, and its
/// answer is that call's (`Detour::Answer`, the fd or -1). Without it, the answer is the plan.
pub fn open(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    real: Option<&mut dyn FnMut() -> c_int>,
) -> Detour<c_int, Then> {
    if writes(flags) {
        // A read-only LMDB environment's lock file: node-local while nobody writes.
        if flags & libc::O_ACCMODE == libc::O_RDWR {
            if let Some(fd) = crate::lmdb::lock_open(dirfd, path, flags) {
                return Detour::Answer(fd);
            }
        }
        return Detour::Bypass(Bypass::Writes, Then::Written);
    }
    read_only(dirfd, path, flags, CheckCopy::AtFirstUse, real)
}

/// `fopen`'s open with `mode`: as `open`, but the copy is checked now (stdio reads inside libc,
/// where no hook sees them). The answer is an fd, which the hook hands to `fdopen`.
pub fn fopen(path: *const c_char, mode: *const c_char) -> Detour<c_int, Then> {
    match fopen_flags(crate::ops::path::bytes(mode)) {
        Some((_, true)) => Detour::Bypass(Bypass::Writes, Then::Written),
        Some((flags, false)) => read_only(libc::AT_FDCWD, path, flags, CheckCopy::AtOpen, None),
        None => Detour::Bypass(Bypass::Flags, Then::Nothing),
    }
}

fn read_only(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    check: CheckCopy,
    real: Option<&mut dyn FnMut() -> c_int>,
) -> Detour<c_int, Then> {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, Then::Track(None, None)),
    };
    let mut buf = Buf::new();
    let mut loc = lookup::locate(&g, dirfd, path, &mut buf);
    let hint = match loc.rel {
        Some(rel) if real.is_some() && plain_open(&g, flags) => {
            let h = path_hash(rel);
            loc.hash = Some(h);
            g.table.copy_hint(h)
        }
        _ => CopyHint::Unknown,
    };
    if let (Some(real), CopyHint::NoCopy) = (real, hint) {
        // The source's fd whatever the entry says: made now, while the entry's lines load, then
        // tracked as the entry says — or, for a small file not placed yet, by its hash slot.
        let fd = real();
        let t = if fd < 0 {
            None
        } else if let Some(t) = close_hint(&g, &loc, flags) {
            g.count(job::SOURCE_OPENS, 1);
            g.count(job::OPENS, 1);
            Some(t)
        } else {
            match plan(&g, &loc, flags, None) {
                Detour::Bypass(why, t) => {
                    why.log_path(b"open", path);
                    t
                }
                // Only for a tree on the file system (`plain_open`): never an answer of its own.
                Detour::Answer(_) | Detour::Fail(_) => None,
            }
        };
        opened(Some(&g), fd, t);
        return Detour::Answer(fd);
    }
    // A copy may exist: opened now (the open the lookup would lead to), while the hash slot's
    // line loads, and used only if the lookup then says it is the entry's.
    // A symlink's (`CopyHint::Link`) is not: its copy is named by its target's path, so an
    // early open by the link's name could only fail (and pause early opens for the next four).
    let mut early = match (hint, loc.hash) {
        // A catalogued path's hash is its copy's object id.
        (CopyHint::Maybe, Some(object)) if check == CheckCopy::AtFirstUse => {
            Early::open(&g, object, flags)
        }
        _ => None,
    };
    let d = plan(&g, &loc, flags, Some((check, &mut early)));
    if let Some(e) = early {
        e.unused();
    }
    match d {
        Detour::Answer(fd) => Detour::Answer(fd),
        Detour::Fail(e) => Detour::Fail(e),
        Detour::Bypass(why, t) => Detour::Bypass(why, Then::Track(Some(g), t)),
    }
}

/// How to track the source's fd of a file with no copy (its copy bit clear) that its hash slot
/// says is a small file (`Table::small_file_slot`), not placed yet and validated in this attach:
/// an `Other` fd (every hook passes it through) whose close asks the agent for the copy
/// (`flag::CLOSE_HINT`), counted as a source open. The entry is the slot's, its path not
/// compared: the entry's name and record, and the name-by-name comparison, are what a file not
/// placed yet cost over a placed one. The slot's may be another path's entry (a 32-bit tag matching by
/// chance, or crafted): then that entry's copy is asked for — a request the agent checks like
/// any — and nothing is answered from it. `None`: the lookup decides (`plan`).
fn close_hint(g: &Guard, loc: &Loc, flags: c_int) -> Option<Tracked> {
    let t = g.table;
    if loc.must_dir || loc.root_link || t.reports_opens() {
        return None;
    }
    let idx = t.small_file_slot(loc.hash?)?;
    // (Its lines were loaded during the open: `Table::copy_hint`.) Live as the lookup would
    // find it: not changed or removed by the program, nor below a directory it removed.
    let st = t.state(idx).state();
    if !matches!(st, State::Unplaced | State::Queued)
        || !t.is_validated(idx)
        || t.is_live(idx).is_err()
    {
        return None;
    }
    Some(Tracked::new(
        idx,
        FdKind::Other,
        initial_flags(flags) | flag::CLOSE_HINT,
    ))
}

/// A copy's fd opened before its entry was looked up (`read_only`): `object`'s file in `tier`.
struct Early {
    fd: c_int,
    added: u64,
    tier: u8,
    object: u64,
}

/// The tier this process last opened a copy on: where an early open looks first.
static LAST_TIER: AtomicU8 = AtomicU8::new(0);
/// Early opens that found the copy (up to 16), less four for each that did not (a file placed
/// once and evicted since keeps its bit): while below zero none is tried and each open that
/// could have been counts one up, so a tier smaller than the dataset costs at most one failed
/// open in five.
static EARLY_SCORE: AtomicI32 = AtomicI32::new(0);

/// Whether to open early at `score` (`EARLY_SCORE`), and the score after.
fn early_try(score: i32) -> (bool, i32) {
    if score < 0 {
        (false, score + 1)
    } else {
        (true, score)
    }
}

/// The score after an early open that `found` the entry's copy, or did not.
fn early_scored(score: i32, found: bool) -> i32 {
    if found {
        (score + 1).min(16)
    } else {
        score - 4
    }
}

impl Early {
    fn open(g: &Guard, object: u64, flags: c_int) -> Option<Early> {
        if flags & libc::O_CLOEXEC == 0 {
            return None;
        }
        let (try_now, score) = early_try(EARLY_SCORE.load(Ordering::Relaxed));
        EARLY_SCORE.store(score, Ordering::Relaxed);
        if !try_now {
            return None;
        }
        let tier = LAST_TIER.load(Ordering::Relaxed);
        match copies::open_unchecked(g.table, tier, &object_name(object), flags) {
            Ok((fd, added)) => Some(Early {
                fd,
                added: fdtable::flag::added(added),
                tier,
                object,
            }),
            // No fd to spare, or a vfork child: says nothing of the copy.
            Err(copies::Refused::NoRoom | copies::Refused::NoDir) => None,
            Err(copies::Refused::NotCopy) => {
                Early::scored(false);
                None
            }
        }
    }

    fn scored(found: bool) {
        let s = EARLY_SCORE.load(Ordering::Relaxed);
        EARLY_SCORE.store(early_scored(s, found), Ordering::Relaxed);
    }

    /// The lookup led elsewhere (another tier, no copy, the source): the fd goes, errno kept.
    fn unused(self) {
        let _keep = KeepErrno::new();
        sys::raw_close(self.fd);
        Early::scored(false);
    }
}

/// After the real call returned `fd` (negative: it failed).
pub fn after_real(fd: c_int, then: Then) {
    match then {
        Then::Nothing => {}
        Then::Written => write_open(fd),
        Then::Track(g, t) => opened(g.as_ref(), fd, t),
    }
}

/// Whether a read-only open with `flags` is one the copy bitmap may speed up: of a tree on the
/// file system (not a pack, not cluster mode, where a file is waited for instead), with flags
/// under which the open is either the source's or a copy's, nothing else.
fn plain_open(g: &Guard, flags: c_int) -> bool {
    let t = g.table;
    flags & !READ_FLAGS == 0
        && flags & (libc::O_NOATIME | libc::O_DIRECTORY) == 0
        && !t.is_packed()
        && !t.cluster()
}

/// The answer for a read-only open of `loc` with `flags`: the placed copy's fd (opened now, or
/// taken from an early open if that is its file), or the real call (and how to track its fd).
/// With `copy` `None`: how to track an fd the real call opened on the source already (no
/// copy, no wait: the bypass this would give if the file had no copy).
fn plan(
    g: &Guard,
    loc: &Loc,
    flags: c_int,
    copy: Option<(CheckCopy, &mut Option<Early>)>,
) -> Detour<c_int, Option<Tracked>> {
    let (check, mut early) = match copy {
        Some((c, e)) => (Some(c), Some(e)),
        None => (None, None),
    };
    if loc.rel.is_none() {
        return Detour::Bypass(Bypass::Outside, None);
    }
    // Any other file under the source: only counted.
    let other = || Some(Tracked::new(u32::MAX, FdKind::Other, initial_flags(flags)));
    if flags & libc::O_TMPFILE == libc::O_TMPFILE || flags & libc::O_PATH != 0 {
        return Detour::Bypass(Bypass::Flags, None);
    }
    if flags & !READ_FLAGS != 0 {
        return Detour::Bypass(Bypass::Flags, other());
    }
    if let Some(c) = check {
        // Nearly every open: a placed file, answered without decoding its entry.
        if let Some(hit) = lookup::find_file(g, loc, flags & libc::O_NOFOLLOW == 0) {
            if let Some(d) = placed_file(g, &hit, flags, c, early.as_deref_mut()) {
                return d;
            }
        }
    }
    let Found { idx, entry, .. } = match lookup::find(g, loc, flags & libc::O_NOFOLLOW == 0) {
        Ok(f) => f,
        Err(why) => return Detour::Bypass(why, other()),
    };
    let fl = initial_flags(flags);
    let mount = g.table.pack_mount();
    if entry.stat.is_dir() {
        if mount && check.is_some() {
            return packed_dir(g, idx, flags);
        }
        return Detour::Bypass(Bypass::OnSource, Some(Tracked::new(idx, FdKind::Dir, fl)));
    }
    if !entry.stat.is_file() || flags & libc::O_DIRECTORY != 0 {
        return Detour::Bypass(Bypass::NotAFile, None);
    }
    if flags & libc::O_NOATIME != 0 && entry.stat.uid != g.table.agent_creds().0 {
        // Only the file's owner (or CAP_FOWNER) may open it with O_NOATIME; a copy, which this
        // process owns, would grant it to anyone. The kernel decides, on the source.
        return Detour::Bypass(Bypass::Flags, Some(Tracked::new(idx, FdKind::Source, fl)));
    }
    let loc = g.table.locator(idx).filter(|_| check.is_some());
    if loc.is_some() && g.table.state(idx).state() != State::Placed {
        // Its bytes come from the pack: wait for the copy the agent streams now.
        crate::pack::wait(g, idx);
    }
    let st = g.table.state(idx).state();
    let mut why = Bypass::NotPlaced;
    // (A packed file was waited for just now, in cluster mode too: no second wait.)
    let copy =
        check.filter(|_| st == State::Placed || loc.is_none() && cluster_wait(g, idx, &entry, st));
    if let Some(check) = copy {
        // A tree that exists only in the pack has no file to put under a damaged copy's fd: the
        // copy is checked now, and the pack serves it otherwise.
        let check = if mount { CheckCopy::AtOpen } else { check };
        match copy_fd(g, idx, entry.object, Some(&entry), flags, check, early) {
            Some(fd) => return Detour::Answer(fd),
            None => why = Bypass::CopyUnusable,
        }
    }
    match (mount, loc) {
        (true, Some(loc)) => extracted(g, idx, &entry, &loc, flags),
        _ => Detour::Bypass(why, Some(source_fd(g, idx, entry.stat.size, fl))),
    }
}

/// `plan`'s answer for a placed regular file that `lookup::find_file` found (no symlink,
/// validated), from what that lookup read — the same answer `plan` gives after the whole
/// lookup: the copy's fd, or the source's open when the copy is unusable. `None` before
/// anything was opened or closed where the whole lookup must decide (not a plain file, not
/// placed, a pack, `O_NOATIME` on another user's file).
fn placed_file(
    g: &Guard,
    hit: &FileHit,
    flags: c_int,
    check: CheckCopy,
    early: Option<&mut Option<Early>>,
) -> Option<Detour<c_int, Option<Tracked>>> {
    let t = g.table;
    if !hit.is_file() || flags & libc::O_DIRECTORY != 0 {
        return None;
    }
    if flags & libc::O_NOATIME != 0 && hit.uid != t.agent_creds().0 {
        return None;
    }
    if t.pack_mount() || t.locator(hit.idx).is_some() || t.state(hit.idx).state() != State::Placed {
        return None;
    }
    Some(
        match copy_fd(g, hit.idx, hit.object, None, flags, check, early) {
            Some(fd) => Detour::Answer(fd),
            None => Detour::Bypass(
                Bypass::CopyUnusable,
                Some(source_fd(g, hit.idx, hit.size, initial_flags(flags))),
            ),
        },
    )
}

/// The placed copy opened (or taken from `early`, if that is its file) and tracked, or `None`
/// (the source is opened instead). `object`: the entry's object id; `entry`: the entry, if the
/// caller decoded it (decoded here only if needed).
fn copy_fd(
    g: &Guard,
    idx: u32,
    object: u64,
    entry: Option<&EntryRec>,
    flags: c_int,
    check: CheckCopy,
    early: Option<&mut Option<Early>>,
) -> Option<c_int> {
    let word = g.table.state(idx);
    let taken = early.and_then(|e| {
        let taken = e.take_if(|e| {
            check == CheckCopy::AtFirstUse
                && e.object == object
                && word.state() == State::Placed
                && word.tier() == e.tier
        });
        // Not the entry's copy: closed before the copy's open below, so that the program gets
        // the fd number its open would have got.
        if let Some(other) = e.take() {
            other.unused();
        }
        taken
    });
    let (fd, tier, added) = match (taken, check) {
        (Some(e), _) => {
            Early::scored(true);
            (e.fd, e.tier, e.added | flag::UNCHECKED)
        }
        (None, CheckCopy::AtOpen) => {
            let e = entry.copied().or_else(|| lookup::entry(g.table, idx))?;
            copies::open_copy(g, idx, &e, flags)?
        }
        (None, CheckCopy::AtFirstUse) => copies::open_copy_unchecked(g, idx, object, entry, flags)?,
    };
    LAST_TIER.store(tier, Ordering::Relaxed);
    let fl = initial_flags(flags) | added;
    // Never in a vfork child's name (`fdtable::owned`): its fd table is not ours, and a number
    // it closed and opened again may name another file of ours here — an UNCHECKED entry
    // over it had the parent's fd found "damaged" at its next use and the other file's source
    // put under it.
    if !fdtable::track(fd, Tracked::new(idx, FdKind::Tier(tier), fl)) {
        // Untrackable fd number (beyond the table, or a vfork child's): fstat could not be
        // answered consistently, use the source.
        let _keep = KeepErrno::new();
        sys::raw_close(fd);
        return None;
    }
    g.count(job::OPENS, 1);
    g.count(job::TIER_FILES + tier as usize, 1);
    report_open(g, idx);
    if log::enabled() {
        let e = entry.copied().or_else(|| lookup::entry(g.table, idx));
        let name = e.as_ref().and_then(|e| g.table.name(e));
        log::line(&[b"open from tier: ", name.unwrap_or(b"?")]);
    }
    Some(fd)
}

/// A directory of a tree that exists only in the pack: an fd of the table's empty directory,
/// tracked as this entry.
fn packed_dir(g: &Guard, idx: u32, flags: c_int) -> Detour<c_int, Option<Tracked>> {
    let fd = crate::pack::dir_fd(g, flags);
    if fd < 0 {
        return Detour::Fail(libc::EIO);
    }
    if !track_dir(fd, idx, flags) {
        let _keep = KeepErrno::new();
        sys::raw_close(fd);
        return Detour::Fail(libc::EMFILE);
    }
    g.count(job::CATALOG_META, 1);
    Detour::Answer(fd)
}

/// A file of a tree that exists only in the pack, which the agent did not place: extracted.
fn extracted(
    g: &Guard,
    idx: u32,
    entry: &EntryRec,
    loc: &Locator,
    flags: c_int,
) -> Detour<c_int, Option<Tracked>> {
    match crate::pack::extract(g, entry, loc, flags) {
        Ok(fd) => {
            let _keep = KeepErrno::new();
            fdtable::take(fd);
            copies::forget(fd);
            // Untrackable (a vfork child, an fd beyond the table): the bytes are still right,
            // only its `fstat` is the memory file's. Nothing else could serve the open.
            fdtable::track(fd, Tracked::new(idx, FdKind::Pack, initial_flags(flags)));
            // In the report's row of "the source or the pack": an open the tiers did not serve.
            g.count(job::OPENS, 1);
            g.count(job::SOURCE_OPENS, 1);
            g.count(job::FALLBACKS, 1);
            Detour::Answer(fd)
        }
        Err(e) => Detour::Fail(e),
    }
}

/// Cluster mode (`Table::cluster`): some node of the job holds every file, so an open of one
/// not placed here asks the agent for it and waits (as a read waits on a fetch: bounded, the
/// agent alive and the copy progressing, a signal ends it) until it is, rather than opening the
/// source — once per file on every node, the metadata load a cluster's shared file system
/// must be spared. True if the copy is there now; false: open the source as usual.
fn cluster_wait(g: &Guard, idx: u32, entry: &EntryRec, st: State) -> bool {
    if !g.table.cluster() || entry.stat.size < g.table.prefetch_min_size() {
        return false;
    }
    if !matches!(st, State::Unplaced | State::Queued | State::Placing) {
        return false;
    }
    // Pushed: the agent claims it when it gets to it, however loaded the node (never refused
    // for an UNPLACED file); not pushed (a full ring): only a short grace.
    let asked = st == State::Unplaced
        && g.table
            .push_request_arg(request::OPEN_UNPLACED, idx, g.slot);
    crate::wait::wait_placed(g, idx, asked)
}

/// The source's fd of entry `idx` (`size` bytes), tracked with flags `fl`, marked
/// `flag::SMALL` below the whole-fetch size.
fn source_fd(g: &Guard, idx: u32, size: u64, fl: u64) -> Tracked {
    let small = if size < g.table.prefetch_min_size() {
        flag::SMALL
    } else {
        0
    };
    Tracked::new(idx, FdKind::Source, fl | small)
}

/// A catalogued file opened on the source: counted, and the agent asked to place it. `small`:
/// its fd is marked `flag::SMALL` (below the whole-fetch size: the program reads it itself).
fn source_opened(g: &Guard, idx: u32, small: bool) {
    let st = g.table.state(idx).state();
    // (An fd opened with O_NOATIME by another user is not marked: its size decides.)
    let small = small
        || crate::ops::lookup::entry(g.table, idx)
            .is_some_and(|e| e.stat.size < g.table.prefetch_min_size());
    // PLACED here means its copy was just found unusable (DAMAGED is on the ring before this):
    // the agent withdraws it first, then places the file again.
    if st == State::Unplaced && small && !g.table.reports_opens() && !g.table.is_packed() {
        // A small file is copied from the page cache once the program closed it, and its close
        // says so (`fd::released`, CLOSED): the open need not, one request per file instead of
        // two. Unless the agent follows the program's opens (known order, read-ahead in name
        // order), or the bytes come from a pack; a process that exits with the file still open
        // leaves it unplaced until a read of it is closed.
    } else if matches!(st, State::Unplaced | State::Placed) {
        // OPEN_UNPLACED tells a known-order agent where the program is as well. A file the agent
        // fetches whole may be waited for (its reads follow the fetch): that wakes the agent; a
        // small one is copied after its close, so the agent takes it at its next look.
        if small {
            g.table.push_hint_arg(request::OPEN_UNPLACED, idx, g.slot);
        } else {
            g.table
                .push_request_arg(request::OPEN_UNPLACED, idx, g.slot);
        }
    } else {
        report_open(g, idx);
    }
    g.count(job::SOURCE_OPENS, 1);
    g.count(job::OPENS, 1);
}

/// Tracks `fd`, a real fd of catalogued directory `idx`; false if it cannot be (the listing
/// then comes from the source).
pub fn track_dir(fd: c_int, idx: u32, flags: c_int) -> bool {
    fdtable::can_track_dir(fd)
        && fdtable::track(fd, Tracked::new(idx, FdKind::Dir, initial_flags(flags)))
}

/// A known-order agent follows the program's position through every open, placed files
/// included (it never sees those otherwise). Without the header flag this is one relaxed load;
/// a full ring drops the hint (never blocks): the agent catches up at the next open.
fn report_open(g: &Guard, idx: u32) {
    if g.table.reports_opens() {
        g.table.push_request(request::OPENED, idx);
    }
}

/// A new fd from the real call: any earlier tracking of its number is stale; track it as `t`.
pub fn opened(g: Option<&Guard>, fd: c_int, t: Option<Tracked>) {
    if fd < 0 {
        return;
    }
    let _keep = KeepErrno::new();
    fdtable::take(fd);
    copies::forget(fd);
    if let (Some(g), Some(t)) = (g, t) {
        if t.kind == FdKind::Source {
            source_opened(g, t.entry, t.has(flag::SMALL));
        }
    }
    if let Some(t) = t {
        let ok = match t.kind {
            FdKind::Dir => fdtable::can_track_dir(fd) && fdtable::track(fd, t),
            _ => fdtable::track(fd, t),
        };
        if !ok {
            fdtable::take(fd);
        }
    }
}

/// An open that may write: the real call, then what it opened is voided (and its fd counted as
/// an `Other` file of the source). Runs whatever this process's credentials: every process of
/// the job must learn of the change.
pub fn write_open(fd: c_int) {
    if fd < 0 {
        return;
    }
    let _keep = KeepErrno::new();
    fdtable::take(fd);
    copies::forget(fd);
    let Ok(g) = detour::enter_any_creds() else {
        return;
    };
    if let Some(entry) = crate::ops::mutate::opened_for_writing(&g, fd) {
        fdtable::track(fd, Tracked::new(entry, FdKind::Other, flag::SHARED));
    }
}

/// `fdopen` of an fd `fopen` got from the copy failed: the fd is closed, errno kept.
pub fn fdopen_failed(fd: c_int) {
    let e = sys::errno();
    fdtable::take(fd);
    sys::raw_close(fd);
    sys::set_errno(e);
}

/// `freopen` reopened a stream as `fd` (negative: it failed) with `mode`.
pub fn reopened(fd: c_int, mode: *const c_char) {
    match fopen_flags(crate::ops::path::bytes(mode)) {
        Some((_, true)) => write_open(fd),
        _ => opened(None, fd, None),
    }
}

/// `fopen` mode → (open flags, writes?); `None` for a mode we do not understand.
pub fn fopen_flags(mode: Option<&[u8]>) -> Option<(c_int, bool)> {
    let m = mode?;
    let (mut flags, mut write) = match m.first()? {
        b'r' => (libc::O_RDONLY, false),
        b'w' => (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, true),
        b'a' => (libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND, true),
        _ => return None,
    };
    for &c in m.get(1..).unwrap_or(b"") {
        match c {
            b'+' => {
                flags = (flags & !libc::O_WRONLY) | libc::O_RDWR;
                write = true;
            }
            b'e' => flags |= libc::O_CLOEXEC,
            b'x' => flags |= libc::O_EXCL,
            b'b' | b't' | b'm' | b'c' => {}
            b',' => break,
            _ => return None,
        }
    }
    Some((flags, write))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture, pattern, LATE, MOVED, PLACED, UNPLACED};
    use granary_shm::Miss;

    fn close(fd: c_int) {
        fdtable::take(fd);
        sys::raw_close(fd);
    }

    /// The open's decision; an fd opened by the real call (here: none) is not tracked.
    fn decide(rel: &str, flags: c_int) -> Detour<c_int, Then> {
        open(libc::AT_FDCWD, fixture().path(rel).as_ptr(), flags, None)
    }

    fn bypass(d: Detour<c_int, Then>) -> (Bypass, Option<Tracked>) {
        match d {
            Detour::Bypass(why, Then::Track(_, t)) => (why, t),
            Detour::Bypass(why, _) => (why, None),
            Detour::Answer(fd) => {
                close(fd);
                panic!("answered with an fd")
            }
            Detour::Fail(e) => panic!("failed with errno {e}"),
        }
    }

    #[test]
    fn a_placed_file_opens_its_copy_and_tracks_the_fd() {
        let f = fixture();
        let Detour::Answer(fd) = decide(PLACED, libc::O_RDONLY | libc::O_CLOEXEC) else {
            panic!("a placed file opens its copy");
        };
        let t = fdtable::peek(fd).unwrap();
        assert_eq!((t.entry, t.kind), (f.idx(PLACED), FdKind::Tier(0)));
        // Close-on-exec: its check is left for the fd's first use.
        assert!(t.has(flag::UNCHECKED));
        let mut st = sys::empty_stat();
        assert_eq!(sys::raw_fstat(fd, &mut st), 0);
        assert_eq!(
            st.st_ino,
            std::fs::metadata(f.object(PLACED)).unwrap().ino()
        );
        let mut buf = vec![0u8; 64 * 1024];
        let n = sys::sys!(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), 0);
        assert_eq!(n as usize, buf.len());
        assert_eq!(buf, pattern(64 * 1024, 7));
        close(fd);
        // Without O_CLOEXEC (an exec'd child may get it) the copy is checked at the open.
        let Detour::Answer(fd) = decide(PLACED, libc::O_RDONLY) else {
            panic!("a placed file opens its copy");
        };
        let t = fdtable::peek(fd).unwrap();
        assert!(!t.has(flag::UNCHECKED) && t.has(flag::SHARED));
        close(fd);
    }

    /// `open` as the hooks call it: `real` opens `rel` on the source when granary does not answer
    /// first; the answer, and how many real calls were made.
    fn open_as_hook(rel: &str, flags: c_int) -> (Detour<c_int, Then>, u32) {
        let p = fixture().path(rel);
        let mut calls = 0;
        let mut real = || {
            calls += 1;
            sys::raw_openat(libc::AT_FDCWD, p.as_ptr(), flags, 0)
        };
        let d = open(libc::AT_FDCWD, p.as_ptr(), flags, Some(&mut real));
        (d, calls)
    }

    #[test]
    fn a_file_never_placed_is_opened_on_the_source_before_its_entry_is_read() {
        let f = fixture();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(f.table.no_copy_yet(UNPLACED.as_bytes()));
        let (Detour::Answer(fd), 1) = open_as_hook(UNPLACED, ro) else {
            panic!("a file never placed: the real call's fd");
        };
        // A small file not placed yet: tracked by what its hash slot says, without its entry
        // being read — an fd every hook passes through, whose close asks for the copy.
        let t = fdtable::peek(fd).unwrap();
        assert_eq!((t.entry, t.kind), (f.idx(UNPLACED), FdKind::Other));
        assert!(t.has(flag::CLOSE_HINT) && !t.has(flag::SMALL));
        let mut st = sys::empty_stat();
        assert_eq!(sys::raw_fstat(fd, &mut st), 0);
        assert_eq!(
            st.st_ino,
            std::fs::metadata(f.src.join(UNPLACED)).unwrap().ino()
        );
        close(fd);
        // The real call's failure is the answer, errno as it set it.
        let (Detour::Answer(-1), 1) = open_as_hook("nothing.here", ro) else {
            panic!("a missing file: the real call's failure");
        };
        assert_eq!(sys::errno(), libc::ENOENT);
        // A changed file: the source's fd, counted only.
        let (Detour::Answer(fd), 1) = open_as_hook("changed.txt", ro) else {
            panic!("a changed file: the real call's fd");
        };
        let t = fdtable::peek(fd).unwrap();
        assert_eq!((t.entry, t.kind), (u32::MAX, FdKind::Other));
        assert!(
            !t.has(flag::CLOSE_HINT),
            "a changed file's close asks for nothing"
        );
        close(fd);
        // Below a directory the program removed: the lookup's answer, counted only.
        let (Detour::Answer(fd), 1) = open_as_hook("gone/inner/f.txt", ro) else {
            panic!("below a removed directory: the real call's fd");
        };
        let t = fdtable::peek(fd).unwrap();
        assert_eq!((t.entry, t.kind), (u32::MAX, FdKind::Other));
        assert!(!t.has(flag::CLOSE_HINT));
        close(fd);
        // A placed file, and a symlink to one, never reach the real call: their copy — for the
        // placed file the one opened before the lookup; the link's own name has no copy, so its
        // early open finds nothing, and the next four opens try none.
        let wants: Vec<Vec<u8>> = [PLACED, "link"]
            .iter()
            .map(|r| std::fs::read(f.src.join(r)).unwrap())
            .collect();
        for (rel, want) in [PLACED, "link", PLACED].into_iter().zip([0, 1, 0]) {
            assert!(!f.table.no_copy_yet(rel.as_bytes()), "{rel}");
            let (Detour::Answer(fd), 0) = open_as_hook(rel, ro) else {
                panic!("{rel}: the copy, not the real call");
            };
            let t = fdtable::peek(fd).unwrap();
            assert!(matches!(t.kind, FdKind::Tier(0)) && t.has(flag::UNCHECKED));
            let mut buf = vec![0u8; 70 * 1024];
            let n = sys::sys!(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), 0);
            assert_eq!(&buf[..n as usize], &wants[want][..], "{rel}");
            close(fd);
        }
        // Without O_CLOEXEC the copy is checked at the open: nothing opened early.
        let (Detour::Answer(fd), 0) = open_as_hook(PLACED, libc::O_RDONLY) else {
            panic!("the copy, checked");
        };
        assert!(!fdtable::peek(fd).unwrap().has(flag::UNCHECKED));
        close(fd);
        // Flags that could take another path: the plan decides, no real call made here.
        let (d, 0) = open_as_hook(UNPLACED, ro | libc::O_NOATIME) else {
            panic!("O_NOATIME: the plan's bypass");
        };
        assert_eq!(bypass(d).1.map(|t| t.kind), Some(FdKind::Source));
    }

    #[test]
    fn an_early_open_the_lookup_does_not_take_leaves_the_copy_its_fd_number() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let f = fixture();
        // A copy moving from tier 0 to tier 1: both files there, the entry says tier 1. An open
        // after one on tier 0 opens tier 0's file early, then the lookup leads to tier 1's.
        let tier1 = f.tier.parent().unwrap().join("tier1");
        let name = object_name(granary_shm::object_id(MOVED.as_bytes()));
        let name = std::str::from_utf8(&name).unwrap();
        for t in [&f.tier, &tier1] {
            std::fs::copy(f.src.join(MOVED), t.join(name)).unwrap();
            std::fs::set_permissions(t.join(name), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let m = std::fs::metadata(tier1.join(name)).unwrap();
        let ctime = m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64;
        assert!(granary_shm::lifecycle::adopt_placed(
            f.table,
            f.idx(MOVED),
            1,
            1,
            m.ino(),
            ctime
        ));
        // In a child of one thread, so no other test's fd takes the number in between.
        // SAFETY: the child makes system calls and this crate's opens only, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            LAST_TIER.store(0, Ordering::Relaxed);
            EARLY_SCORE.store(0, Ordering::Relaxed);
            let lowest = sys::raw_openat(libc::AT_FDCWD, c"/dev/null".as_ptr(), libc::O_RDONLY, 0);
            sys::raw_close(lowest);
            let (d, _) = open_as_hook(MOVED, libc::O_RDONLY | libc::O_CLOEXEC);
            let code = match d {
                Detour::Answer(fd) if fd == lowest => 0,
                Detour::Answer(fd) if fd > lowest => 10 + (fd - lowest).min(100),
                _ => 1,
            };
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the copy's fd is not the number the program's open would get (10 + how far off)"
        );
    }

    /// Runs `f` in a forked child of one thread (no other test's fd or count in between),
    /// counting in job slot 3 (no other test's); its exit code (99: it panicked).
    fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child makes system calls and this crate's calls only, then _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            detour::set_job_slot(3);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(99);
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status));
        libc::WEXITSTATUS(status)
    }

    fn counts(f: &crate::testing::Fixture) -> [u64; 4] {
        [
            job::OPENS,
            job::SOURCE_OPENS,
            job::TIER_FILES,
            job::FALLBACKS,
        ]
        .map(|w| f.table.job_value(3, w))
    }

    fn inode_of(fd: c_int) -> u64 {
        let mut st = sys::empty_stat();
        assert_eq!(sys::raw_fstat(fd, &mut st), 0);
        st.st_ino
    }

    fn pread_all(fd: c_int) -> Vec<u8> {
        let mut buf = vec![0u8; 128 * 1024];
        let n = sys::sys!(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), 0);
        buf.truncate(n.max(0) as usize);
        buf
    }

    #[test]
    fn a_file_placed_between_its_hint_and_its_lookup_keeps_the_sources_fd_counted_once() {
        let f = fixture();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        assert!(f.table.no_copy_yet(LATE.as_bytes()));
        let code = in_child(|| {
            let before = counts(f);
            // The bit read clear; the agent places the file (bit, then PLACED) while the real
            // call opens the source, before the lookup reads the entry.
            let p = f.path(LATE);
            let mut calls = 0;
            let mut real = || {
                calls += 1;
                crate::testing::place(f, LATE);
                sys::raw_openat(libc::AT_FDCWD, p.as_ptr(), ro, 0)
            };
            let Detour::Answer(fd) = open(libc::AT_FDCWD, p.as_ptr(), ro, Some(&mut real)) else {
                return 1;
            };
            if calls != 1 || fd < 0 || f.table.state(f.idx(LATE)).state() != State::Placed {
                return 2;
            }
            // The source's fd, the source's bytes, tracked as the entry's source fd.
            if inode_of(fd) != std::fs::metadata(f.src.join(LATE)).unwrap().ino()
                || pread_all(fd) != pattern(2500, 11)
            {
                return 3;
            }
            match fdtable::peek(fd) {
                Some(t) if t.kind == FdKind::Source && t.entry == f.idx(LATE) => {}
                _ => return 4,
            }
            // One open, from the source; nothing from a tier, no copy found unusable.
            let after = counts(f);
            if after != [before[0] + 1, before[1] + 1, before[2], before[3]] {
                return 5;
            }
            close(fd);
            // The next open finds the bit set and gets the copy.
            let (Detour::Answer(fd), 0) = open_as_hook(LATE, ro) else {
                return 6;
            };
            let t = fdtable::peek(fd).unwrap();
            if t.kind != FdKind::Tier(0)
                || pread_all(fd) != pattern(2500, 11)
                || counts(f)[2] != before[2] + 1
            {
                return 7;
            }
            close(fd);
            0
        });
        assert_eq!(code, 0, "step {code} of the child failed");
    }

    #[test]
    fn at_the_fd_limit_an_open_of_a_placed_file_gets_the_last_slot_and_reports_no_damage() {
        let f = fixture();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        let want = std::fs::read(f.src.join(PLACED)).unwrap();
        let code = in_child(|| {
            // A process whose first copy open comes at its fd limit, one slot free.
            copies::close_dirs();
            LAST_TIER.store(0, Ordering::Relaxed);
            EARLY_SCORE.store(0, Ordering::Relaxed);
            let null = c"/dev/null".as_ptr();
            let lowest = sys::raw_openat(libc::AT_FDCWD, null, libc::O_RDONLY, 0);
            sys::raw_close(lowest);
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: plain getters and setters of this process's limit.
            unsafe {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                lim.rlim_cur = lowest as u64 + 8;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return 1;
                }
            }
            let mut last = -1;
            loop {
                let fd = sys::raw_openat(libc::AT_FDCWD, null, libc::O_RDONLY, 0);
                if fd < 0 {
                    break;
                }
                last = fd;
            }
            sys::raw_close(last);
            let before = counts(f);
            // The open as the hook makes it: granary's fd, or the real call's.
            let p = f.path(PLACED);
            let open_placed = || {
                let (d, _) = open_as_hook(PLACED, ro);
                match d {
                    Detour::Answer(fd) => fd,
                    Detour::Fail(_) => -2,
                    Detour::Bypass(..) => sys::raw_openat(libc::AT_FDCWD, p.as_ptr(), ro, 0),
                }
            };
            let fd = open_placed();
            if fd != last {
                return 2;
            }
            if pread_all(fd) != want {
                return 3;
            }
            // No slot: EMFILE, as the real call says.
            sys::set_errno(0);
            if open_placed() != -1 || sys::errno() != libc::EMFILE {
                return 4;
            }
            close(fd);
            // A slot again.
            let fd = open_placed();
            if fd != last || pread_all(fd) != want {
                return 5;
            }
            close(fd);
            // No copy was taken for damaged.
            if counts(f)[3] != before[3] {
                return 6;
            }
            0
        });
        assert_eq!(code, 0, "step {code} of the child failed");
    }

    #[test]
    fn early_opens_that_miss_pause_them_for_four_opens() {
        // Found twice, then a miss (an evicted copy's bit): four opens without, then again.
        let mut s = 0;
        let mut tried = vec![];
        for found in [true, true, false, true, true, true, true, true, true] {
            let (t, next) = early_try(s);
            s = next;
            tried.push(t);
            if t {
                s = early_scored(s, found);
            }
        }
        assert_eq!(
            tried,
            [true, true, true, false, false, true, true, true, true]
        );
        // A run of misses: one try in five.
        let mut s = 0;
        let tries = (0..50)
            .filter(|_| {
                let (t, next) = early_try(s);
                s = if t { early_scored(next, false) } else { next };
                t
            })
            .count();
        assert_eq!(tries, 10);
        // Successes saturate, so a long good run does not buy a long bad one.
        let s = (0..100).fold(0, |s, _| early_scored(s, true));
        assert_eq!(s, 16);
    }

    #[test]
    fn every_other_open_passes_through_and_says_why() {
        let f = fixture();
        let ro = libc::O_RDONLY | libc::O_CLOEXEC;
        let (why, t) = bypass(decide(UNPLACED, ro));
        assert_eq!(why, Bypass::NotPlaced);
        assert_eq!(
            t.map(|t| (t.entry, t.kind)),
            Some((f.idx(UNPLACED), FdKind::Source))
        );
        let (why, t) = bypass(decide("train", ro));
        assert_eq!(
            (why, t.map(|t| t.kind)),
            (Bypass::OnSource, Some(FdKind::Dir))
        );
        assert_eq!(bypass(decide(PLACED, libc::O_RDWR)).0, Bypass::Writes);
        assert_eq!(
            bypass(decide(PLACED, ro | libc::O_PATH)),
            (Bypass::Flags, None)
        );
        assert_eq!(bypass(decide(PLACED, ro | libc::O_DIRECT)).0, Bypass::Flags);
        assert_eq!(
            bypass(decide(PLACED, ro | libc::O_DIRECTORY)),
            (Bypass::NotAFile, None)
        );
        assert_eq!(
            bypass(decide("nothing.here", ro)).0,
            Bypass::Catalog(Miss::NotCatalogued)
        );
        assert_eq!(
            bypass(decide("changed.txt", ro)).0,
            Bypass::Catalog(Miss::Void)
        );
        assert_eq!(
            bypass(decide("gone/inner/f.txt", ro)).0,
            Bypass::Catalog(Miss::AncestorGone)
        );
        assert_eq!(
            bypass(decide("outward", ro)).0,
            Bypass::Catalog(Miss::Unprovable)
        );
        assert_eq!(
            bypass(decide("link", ro | libc::O_NOFOLLOW)),
            (Bypass::NotAFile, None)
        );
        let outside = CString::new("/proc/self/status").unwrap();
        let (why, _) = bypass(open(libc::AT_FDCWD, outside.as_ptr(), ro, None));
        assert_eq!(why, Bypass::Outside);
    }

    #[test]
    fn a_symlink_to_a_placed_file_opens_the_copy() {
        let f = fixture();
        let Detour::Answer(fd) = decide("link", libc::O_RDONLY | libc::O_CLOEXEC) else {
            panic!("the link's target is placed");
        };
        assert_eq!(fdtable::peek(fd).unwrap().entry, f.idx("a.txt"));
        close(fd);
    }

    #[test]
    fn fopen_modes() {
        let m = |s: &[u8]| fopen_flags(Some(s));
        assert_eq!(m(b"r"), Some((libc::O_RDONLY, false)));
        assert_eq!(m(b"rbe"), Some((libc::O_RDONLY | libc::O_CLOEXEC, false)));
        assert_eq!(m(b"r+"), Some((libc::O_RDWR, true)));
        assert_eq!(
            m(b"w"),
            Some((libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, true))
        );
        assert_eq!(
            m(b"ax"),
            Some((
                libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_EXCL,
                true
            ))
        );
        assert_eq!(m(b"r,ccs=UTF-8"), Some((libc::O_RDONLY, false)));
        assert_eq!(m(b"rq"), None);
        assert_eq!(m(b""), None);
        assert_eq!(fopen_flags(None), None);
    }

    use std::ffi::CString;
    use std::os::unix::fs::MetadataExt;
}
