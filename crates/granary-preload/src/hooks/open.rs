//! `open` and friends, `creat`, `fopen`, `freopen`, `fclose`: the calls that create fds for
//! paths. Read-only opens of placed files get the verified copy; directories get their real fd,
//! tracked so listings come from the catalog; opens that may write pass through and void what
//! they open (`mutate`).

use core::ffi::{c_char, c_int};

use granary_shm::{job, request, state};

use super::{find, locate, mutate, Found};
use crate::detour::Guard;
use crate::fdtable::{self, flag, FdKind, Tracked};
use crate::path::{Buf, Loc};
use crate::sys::{self, real, set_errno, KeepErrno};
use crate::{log, release};

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

enum Plan {
    /// The real call with the caller's arguments; a new fd is tracked as this, if anything.
    Real(Option<Tracked>),
    /// We already have the fd (a verified tier copy), tracked.
    Done(c_int),
    /// The open fails with this errno (a tree that exists only in a damaged pack).
    Failed(c_int),
}

/// How a placed copy's identity is checked: at the open, or at the fd's first use (`open`
/// and `openat` with `O_CLOEXEC`: every later call on the fd reaches a hook that checks first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CheckCopy {
    AtOpen,
    AtFirstUse,
}

fn plan(g: &Guard, loc: &Loc, flags: c_int, check: CheckCopy) -> Plan {
    let other = Tracked::new(u32::MAX, FdKind::Other, initial_flags(flags));
    if flags & libc::O_TMPFILE == libc::O_TMPFILE || flags & libc::O_PATH != 0 {
        return Plan::Real(None);
    }
    if flags & !READ_FLAGS != 0 {
        return Plan::Real(Some(other));
    }
    let Some(Found { idx, entry }) = find(g, loc, flags & libc::O_NOFOLLOW == 0) else {
        return Plan::Real(Some(other));
    };
    let fl = initial_flags(flags);
    let mount = g.table.pack_mount();
    if entry.stat.is_dir() {
        if mount {
            return packed_dir(g, idx, flags);
        }
        return Plan::Real(Some(Tracked::new(idx, FdKind::Dir, fl)));
    }
    if !entry.stat.is_file() || flags & libc::O_DIRECTORY != 0 {
        return Plan::Real(None);
    }
    let loc = g.table.locator(idx);
    if loc.is_some() && state::state_of(g.table.state(idx)) != state::PLACED {
        // Its bytes come from the pack: wait for the copy the agent streams now.
        crate::packed::wait(g, idx);
    }
    let st = state::state_of(g.table.state(idx));
    // (A packed file was waited for just now, in cluster mode too: no second wait.)
    if st == state::PLACED || loc.is_none() && cluster_wait(g, idx, &entry, st) {
        // A tree that exists only in the pack has no file to put under a damaged copy's fd: the
        // copy is checked now, and the pack serves it otherwise.
        let check = if mount { CheckCopy::AtOpen } else { check };
        if let Some(fd) = copy_fd(g, idx, &entry, flags, check) {
            return Plan::Done(fd);
        }
    }
    match (mount, loc) {
        (true, Some(loc)) => extracted(g, idx, &entry, &loc, flags),
        _ => Plan::Real(Some(Tracked::new(idx, FdKind::Source, fl))),
    }
}

/// A directory of a tree that exists only in the pack: an fd of the table's empty directory,
/// tracked as this entry.
fn packed_dir(g: &Guard, idx: u32, flags: c_int) -> Plan {
    let fd = crate::packed::dir_fd(g, flags);
    if fd < 0 {
        return Plan::Failed(libc::EIO);
    }
    if !track_dir(fd, idx, flags) {
        let _keep = KeepErrno::new();
        sys::raw_close(fd);
        return Plan::Failed(libc::EMFILE);
    }
    g.count(job::CATALOG_META, 1);
    Plan::Done(fd)
}

/// A file of a tree that exists only in the pack, which the agent did not place: extracted.
fn extracted(
    g: &Guard,
    idx: u32,
    entry: &granary_shm::EntryRec,
    loc: &granary_shm::Locator,
    flags: c_int,
) -> Plan {
    match crate::packed::extract(g, entry, loc, flags) {
        Ok(fd) => {
            let _keep = KeepErrno::new();
            fdtable::take(fd);
            crate::copies::forget(fd);
            // Untrackable (a vfork child, an fd beyond the table): the bytes are still right,
            // only its `fstat` is the memory file's. Nothing else could serve the open.
            fdtable::track(fd, Tracked::new(idx, FdKind::Pack, initial_flags(flags)));
            g.count(job::OPENS, 1);
            g.count(job::FALLBACKS, 1);
            Plan::Done(fd)
        }
        Err(e) => Plan::Failed(e),
    }
}

/// Cluster mode (`Table::cluster`): some node of the job holds every file, so an open of one
/// not placed here asks the agent for it and waits (as a read waits on a fetch: bounded, the
/// agent alive and the copy progressing, a signal ends it) until it is, rather than opening the
/// source — once per file on every node, the metadata load a cluster's shared file system
/// must be spared. True if the copy is there now; false: open the source as usual.
fn cluster_wait(g: &Guard, idx: u32, entry: &granary_shm::EntryRec, st: u8) -> bool {
    if !g.table.cluster() || entry.stat.size < g.table.prefetch_min_size() {
        return false;
    }
    if !matches!(st, state::UNPLACED | state::QUEUED | state::PLACING) {
        return false;
    }
    if st == state::UNPLACED {
        g.table
            .push_request_arg(request::OPEN_UNPLACED, idx, g.slot);
    }
    crate::wait::wait_placed(g, idx)
}

/// A catalogued file opened on the source: counted, and the agent asked to place it.
fn source_opened(g: &Guard, idx: u32) {
    // PLACED here means its copy was just found unusable (DAMAGED is on the ring before this):
    // the agent withdraws it first, then places the file again.
    if matches!(
        state::state_of(g.table.state(idx)),
        state::UNPLACED | state::PLACED
    ) {
        // OPEN_UNPLACED tells a known-order agent where the program is as well.
        g.table
            .push_request_arg(request::OPEN_UNPLACED, idx, g.slot);
    } else {
        report_open(g, idx);
    }
    g.count(job::SOURCE_OPENS, 1);
    g.count(job::OPENS, 1);
}

/// The placed copy opened and tracked, or `None` (the source is opened instead).
fn copy_fd(
    g: &Guard,
    idx: u32,
    entry: &granary_shm::EntryRec,
    flags: c_int,
    check: CheckCopy,
) -> Option<c_int> {
    let (fd, tier, added) = match check {
        CheckCopy::AtOpen => crate::copies::open_copy(g, idx, entry, flags)?,
        CheckCopy::AtFirstUse => crate::copies::open_copy_unchecked(g, idx, entry, flags)?,
    };
    let fl = initial_flags(flags) | added;
    if !fdtable::track_unchecked_copy(fd, Tracked::new(idx, FdKind::Tier(tier), fl)) {
        // Untrackable fd number: fstat could not be answered consistently, use the source.
        let _keep = KeepErrno::new();
        sys::raw_close(fd);
        return None;
    }
    g.count(job::OPENS, 1);
    g.count(job::TIER_FILES + tier as usize, 1);
    report_open(g, idx);
    if log::enabled() {
        log::line(&[b"open from tier: ", g.table.name(entry).unwrap_or(b"?")]);
    }
    Some(fd)
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
fn opened(g: Option<&Guard>, fd: c_int, t: Option<Tracked>) {
    if fd < 0 {
        return;
    }
    let _keep = KeepErrno::new();
    fdtable::take(fd);
    crate::copies::forget(fd);
    if let (Some(g), Some(t)) = (g, t) {
        if t.kind == FdKind::Source {
            source_opened(g, t.entry);
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
fn write_open(fd: c_int) {
    if fd < 0 {
        return;
    }
    let _keep = KeepErrno::new();
    fdtable::take(fd);
    crate::copies::forget(fd);
    let Some(g) = crate::detour::enter_any_creds() else {
        return;
    };
    if let Some(entry) = mutate::opened_for_writing(&g, fd) {
        fdtable::track(fd, Tracked::new(entry, FdKind::Other, flag::SHARED));
    }
}

/// The whole open family. `pass` makes the real call.
fn open_impl(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    pass: impl FnOnce() -> c_int,
) -> c_int {
    if writes(flags) {
        // A read-only LMDB environment's lock file: node-local while nobody writes.
        if flags & libc::O_ACCMODE == libc::O_RDWR {
            if let Some(fd) = crate::lmdb::lock_open(dirfd, path, flags) {
                return fd;
            }
        }
        let fd = pass();
        write_open(fd);
        return fd;
    }
    let Some(g) = crate::detour::enter() else {
        let fd = pass();
        opened(None, fd, None);
        return fd;
    };
    let mut buf = Buf::new();
    let loc = locate(&g, dirfd, path, &mut buf);
    let plan = if loc.rel.is_some() {
        plan(&g, &loc, flags, CheckCopy::AtFirstUse)
    } else {
        Plan::Real(None)
    };
    match plan {
        Plan::Real(t) => {
            let fd = pass();
            opened(Some(&g), fd, t);
            fd
        }
        Plan::Done(fd) => fd,
        Plan::Failed(e) => {
            set_errno(e);
            -1
        }
    }
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;

fn wants_mode(flags: c_int) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

macro_rules! open_hook {
    ($name:ident, $slot:ident) => {
        // The mode is taken as a fixed third argument (x86-64/aarch64 ABI) and read only when
        // the flags say it exists.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
            let mode = if wants_mode(flags) { mode } else { 0 };
            open_impl(libc::AT_FDCWD, path, flags, || {
                real!($slot as OpenFn, (path, flags, mode)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, mode))
            })
        }
    };
}
open_hook!(open, OPEN);
open_hook!(open64, OPEN64);

macro_rules! open2_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            open_impl(libc::AT_FDCWD, path, flags, || {
                real!($slot as Open2Fn, (path, flags)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, 0))
            })
        }
    };
}
open2_hook!(__open_2, OPEN_2);
open2_hook!(__open64_2, OPEN64_2);

macro_rules! openat_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: *const c_char,
            flags: c_int,
            mode: libc::mode_t,
        ) -> c_int {
            let mode = if wants_mode(flags) { mode } else { 0 };
            open_impl(dirfd, path, flags, || {
                real!($slot as OpenatFn, (dirfd, path, flags, mode)
                    else sys::raw_openat(dirfd, path, flags, mode))
            })
        }
    };
}
openat_hook!(openat, OPENAT);
openat_hook!(openat64, OPENAT64);

macro_rules! openat2_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
            open_impl(dirfd, path, flags, || {
                real!($slot as Openat2Fn, (dirfd, path, flags)
                    else sys::raw_openat(dirfd, path, flags, 0))
            })
        }
    };
}
openat2_hook!(__openat_2, OPENAT_2);
openat2_hook!(__openat64_2, OPENAT64_2);

macro_rules! creat_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: libc::mode_t) -> c_int {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            open_impl(libc::AT_FDCWD, path, flags, || {
                real!($slot as CreatFn, (path, mode)
                    else sys::raw_openat(libc::AT_FDCWD, path, flags, mode))
            })
        }
    };
}
creat_hook!(creat, CREAT);
creat_hook!(creat64, CREAT64);

/// `fopen` mode → (open flags, writes?); `None` for a mode we do not understand.
fn fopen_flags(mode: *const c_char) -> Option<(c_int, bool)> {
    let m = crate::path::bytes(mode)?;
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

type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type FdopenFn = unsafe extern "C" fn(c_int, *const c_char) -> *mut libc::FILE;
type FreopenFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *mut libc::FILE) -> *mut libc::FILE;
type FcloseFn = unsafe extern "C" fn(*mut libc::FILE) -> c_int;

fn stream_fd(fp: *mut libc::FILE) -> c_int {
    if fp.is_null() {
        return -1;
    }
    // SAFETY: a non-null FILE* the caller owns; fileno only reads it.
    unsafe { libc::fileno(fp) }
}

fn fopen_impl(
    path: *const c_char,
    mode: *const c_char,
    pass: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    let flags = match fopen_flags(mode) {
        Some((_, true)) => {
            let fp = pass();
            write_open(stream_fd(fp));
            return fp;
        }
        Some((flags, false)) => flags,
        None => return pass(),
    };
    let Some(g) = crate::detour::enter() else {
        let fp = pass();
        opened(None, stream_fd(fp), None);
        return fp;
    };
    let mut buf = Buf::new();
    let loc = locate(&g, libc::AT_FDCWD, path, &mut buf);
    // stdio reads inside libc, where no hook sees them: the copy is checked now.
    let plan = if loc.rel.is_some() {
        plan(&g, &loc, flags, CheckCopy::AtOpen)
    } else {
        Plan::Real(None)
    };
    match plan {
        Plan::Real(t) => {
            let fp = pass();
            opened(Some(&g), stream_fd(fp), t);
            fp
        }
        Plan::Failed(e) => {
            set_errno(e);
            core::ptr::null_mut()
        }
        Plan::Done(fd) => {
            let fp = real!(FDOPEN as FdopenFn, c"fdopen", (fd, mode) or core::ptr::null_mut());
            if fp.is_null() {
                let e = sys::errno();
                fdtable::take(fd);
                sys::raw_close(fd);
                set_errno(e);
            }
            fp
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    fopen_impl(
        path,
        mode,
        || real!(FOPEN as FopenFn, c"fopen", (path, mode) or core::ptr::null_mut()),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    fopen_impl(
        path,
        mode,
        || real!(FOPEN64 as FopenFn, c"fopen64", (path, mode) or core::ptr::null_mut()),
    )
}

fn freopen_impl(
    mode: *const c_char,
    stream: *mut libc::FILE,
    pass: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // freopen closes the stream's fd inside libc, where we cannot see it.
    let t = release::before(stream_fd(stream));
    let fp = pass();
    release::after(t);
    let fd = stream_fd(fp);
    match fopen_flags(mode) {
        Some((_, true)) => write_open(fd),
        _ => opened(None, fd, None),
    }
    fp
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    freopen_impl(
        mode,
        stream,
        || real!(FREOPEN as FreopenFn, c"freopen", (path, mode, stream) or core::ptr::null_mut()),
    )
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    freopen_impl(
        mode,
        stream,
        || real!(FREOPEN64 as FreopenFn, c"freopen64", (path, mode, stream) or core::ptr::null_mut()),
    )
}

/// fclose closes its fd inside libc: the release path around it.
#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut libc::FILE) -> c_int {
    let t = release::before(stream_fd(fp));
    let r = real!(FCLOSE as FcloseFn, c"fclose", (fp) or libc::EOF);
    release::after(t);
    r
}
