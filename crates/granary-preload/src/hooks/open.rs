//! `open` and friends, `creat`, `fopen`, `freopen`, `fclose`: the calls that create fds for
//! paths. Read-only opens of placed files get the cached copy; writes invalidate the entry.

use core::ffi::{c_char, c_int};

use granary_shm::{job, object_name, request, state};

use super::{find, locate, Found};
use crate::detour::{self, real, set_errno, Guard, KeepErrno};
use crate::fdtable::{self, Kind, Tracked};
use crate::path::{Bufs, Loc, BUF};
use crate::{log, perm};

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

enum Plan {
    /// The real call with the caller's arguments, nothing else.
    Pass,
    /// The real call; on success the fd is a catalogued file opened on the source.
    Source { idx: u32, unplaced: bool },
    /// We already have the fd (a tier copy or a shadow directory).
    Done(c_int),
}

fn plan(g: &Guard, loc: &Loc, flags: c_int) -> Plan {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE || flags & libc::O_PATH != 0 {
        return Plan::Pass;
    }
    if flags & WRITE_FLAGS != 0 {
        invalidate(g, loc, flags);
        return Plan::Pass;
    }
    if flags & !READ_FLAGS != 0 {
        return Plan::Pass;
    }
    let Some(Found { idx, entry }) = find(g, loc, flags & libc::O_NOFOLLOW == 0) else {
        return Plan::Pass;
    };
    if entry.stat.is_dir() {
        return open_dir(g, idx, &entry.stat, flags);
    }
    if !entry.stat.is_file() || flags & libc::O_DIRECTORY != 0 {
        return Plan::Pass;
    }
    let word = g.table.state(idx);
    let st = state::state_of(word);
    if st == state::PLACED && perm::certain(&entry.stat, perm::R) {
        let tier = state::tier_of(word);
        if let Some(fd) = open_copy(g, idx, &entry, tier, flags) {
            if fdtable::track(
                fd,
                Tracked {
                    entry: idx,
                    kind: Kind::Tier(tier),
                },
            ) {
                g.count(job::OPENS, 1);
                g.count(job::TIER_FILES + tier as usize, 1);
                report_open(g, idx);
                if log::enabled() {
                    log::line(&[
                        b"open from tier: ",
                        g.table.rel_path(&entry).unwrap_or(b"?"),
                    ]);
                }
                return Plan::Done(fd);
            }
            // Untrackable fd number: fstat could not be answered consistently, use the source.
            let _keep = KeepErrno::new();
            detour::raw_close(fd);
        }
    }
    Plan::Source {
        idx,
        unplaced: st == state::UNPLACED,
    }
}

/// Opens tier `tier`'s copy of entry `idx`, checking it is the complete regular file the
/// catalog describes; reports it damaged otherwise. Never changes errno.
pub(crate) fn open_copy(
    g: &Guard,
    idx: u32,
    entry: &granary_shm::EntryRec,
    tier: u8,
    flags: c_int,
) -> Option<c_int> {
    let _keep = KeepErrno::new();
    let fd = copy_fd(g, entry, tier, flags);
    if fd.is_none() {
        g.table.push_request(request::DAMAGED, idx);
        g.count(job::FALLBACKS, 1);
        if log::enabled() {
            log::line(&[
                b"cached copy unusable, using the source: ",
                g.table.rel_path(entry).unwrap_or(b"?"),
            ]);
        }
    }
    fd
}

fn copy_fd(g: &Guard, entry: &granary_shm::EntryRec, tier: u8, flags: c_int) -> Option<c_int> {
    let dir = g.table.tier_dir(tier as u32)?;
    let name = object_name(entry.object);
    let mut buf = [0u8; BUF];
    let end = dir.len() + 1 + name.len();
    buf.get_mut(..dir.len())?.copy_from_slice(dir);
    *buf.get_mut(dir.len())? = b'/';
    buf.get_mut(dir.len() + 1..end)?.copy_from_slice(&name);
    *buf.get_mut(end)? = 0;
    // Nothing in a cache directory is followed through a symlink.
    let fd = detour::raw_openat(
        libc::AT_FDCWD,
        buf.as_ptr().cast(),
        flags | libc::O_NOFOLLOW,
        0,
    );
    if fd < 0 {
        return None;
    }
    let mut st = detour::empty_stat();
    let ok = detour::raw_fstat(fd, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_size as u64 == entry.stat.size;
    if !ok {
        detour::raw_close(fd);
        return None;
    }
    Some(fd)
}

/// A catalogued directory opened for reading: a real fd of the shadow directory, tracked as it.
fn open_dir(g: &Guard, idx: u32, st: &granary_shm::StatRec, flags: c_int) -> Plan {
    if !perm::certain(st, perm::R) {
        return Plan::Pass;
    }
    match shadow_fd(g, idx, flags & libc::O_CLOEXEC) {
        Some(fd) => {
            g.count(job::CATALOG_META, 1);
            Plan::Done(fd)
        }
        None => Plan::Pass,
    }
}

/// Opens and tracks the shadow directory for entry `idx`. Never changes errno.
pub fn shadow_fd(g: &Guard, idx: u32, cloexec: c_int) -> Option<c_int> {
    let _keep = KeepErrno::new();
    let dir = g.table.shadow_dir();
    let mut buf = [0u8; BUF];
    buf.get_mut(..dir.len())?.copy_from_slice(dir);
    *buf.get_mut(dir.len())? = 0;
    if dir.is_empty() {
        return None;
    }
    let fd = detour::raw_openat(
        libc::AT_FDCWD,
        buf.as_ptr().cast(),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | cloexec,
        0,
    );
    if fd < 0 {
        return None;
    }
    let tracked = fdtable::can_track_dir(fd)
        && fdtable::track(
            fd,
            Tracked {
                entry: idx,
                kind: Kind::Dir,
            },
        );
    if !tracked {
        detour::raw_close(fd);
        return None;
    }
    Some(fd)
}

/// The caller is about to write a catalogued path (or create a name in a catalogued
/// directory): from now on every call on it passes through, and the agent re-checks it.
fn invalidate(g: &Guard, loc: &Loc, flags: c_int) {
    let target = find_any(g, loc, flags & libc::O_NOFOLLOW == 0).or_else(|| {
        // A new name changes its directory's listing.
        if flags & libc::O_CREAT == 0 {
            return None;
        }
        let rel = loc.rel?;
        let parent = rel
            .iter()
            .rposition(|&b| b == b'/')
            .map_or(&b""[..], |i| rel.get(..i).unwrap_or(b""));
        g.table
            .lookup(parent)
            .filter(|&i| g.table.entry(i).is_some_and(|e| e.stat.is_dir()))
    });
    if let Some(idx) = target {
        g.table.set_state(idx, state::word(state::STALE, 0));
        g.table.push_request(request::INVALIDATE, idx);
        if log::enabled() {
            log::line(&[
                b"opened for writing, entry invalidated: ",
                loc.rel.unwrap_or(b"?"),
            ]);
        }
    }
}

/// Like `find`, but regardless of state and permissions (a write makes any entry stale).
fn find_any(g: &Guard, loc: &Loc, follow: bool) -> Option<u32> {
    if loc.root_link && !follow {
        return None;
    }
    match granary_shm::resolve(g.table, loc.rel?, follow || loc.must_dir) {
        granary_shm::Resolved::Entry(i) => Some(i),
        granary_shm::Resolved::PassThrough => None,
    }
}

fn source_opened(g: &Guard, fd: c_int, idx: u32, unplaced: bool) {
    if !fdtable::track(
        fd,
        Tracked {
            entry: idx,
            kind: Kind::Source,
        },
    ) {
        fdtable::clear(fd);
    }
    g.count(job::OPENS, 1);
    g.count(job::SOURCE_OPENS, 1);
    if unplaced {
        // OPEN_UNPLACED tells a known-order agent where the program is as well.
        g.table.push_request(request::OPEN_UNPLACED, idx);
    } else {
        report_open(g, idx);
    }
}

/// A known-order agent follows the program's position through every open, placed files
/// included (it never sees those otherwise). Without the header flag this is one relaxed load;
/// a full ring drops the hint (never blocks): the agent catches up at the next open.
fn report_open(g: &Guard, idx: u32) {
    if g.table.reports_opens() {
        g.table.push_request(request::OPENED, idx);
    }
}

/// The whole open family. `pass` makes the real call for the given (dirfd, path).
fn open_impl(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    pass: impl FnOnce(c_int, *const c_char) -> c_int,
) -> c_int {
    let Some(g) = detour::enter() else {
        return pass(dirfd, path);
    };
    let mut bufs = Bufs::new();
    let loc = locate(&g, dirfd, path, &mut bufs);
    let (d, p) = loc.pass_args(dirfd, path);
    let plan = if loc.rel.is_some() {
        plan(&g, &loc, flags)
    } else {
        Plan::Pass
    };
    match plan {
        Plan::Pass => {
            let fd = pass(d, p);
            fdtable::clear(fd);
            fd
        }
        Plan::Source { idx, unplaced } => {
            let fd = pass(d, p);
            if fd >= 0 {
                let _keep = KeepErrno::new();
                source_opened(&g, fd, idx, unplaced);
            }
            fd
        }
        Plan::Done(fd) => fd,
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
            open_impl(libc::AT_FDCWD, path, flags, |d, p| {
                if d == libc::AT_FDCWD && p == path {
                    real!($slot as OpenFn, (p, flags, mode) else detour::raw_openat(d, p, flags, mode))
                } else {
                    real!(OPENAT as OpenatFn, (d, p, flags, mode) else detour::raw_openat(d, p, flags, mode))
                }
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
            open_impl(libc::AT_FDCWD, path, flags, |d, p| {
                real!($slot as Open2Fn, (p, flags) else detour::raw_openat(d, p, flags, 0))
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
            open_impl(dirfd, path, flags, |d, p| {
                real!($slot as OpenatFn, (d, p, flags, mode) else detour::raw_openat(d, p, flags, mode))
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
            open_impl(dirfd, path, flags, |d, p| {
                real!($slot as Openat2Fn, (d, p, flags) else detour::raw_openat(d, p, flags, 0))
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
            open_impl(libc::AT_FDCWD, path, flags, |d, p| {
                real!($slot as CreatFn, (p, mode) else detour::raw_openat(d, p, flags, mode))
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
    let Some(g) = detour::enter() else {
        return pass();
    };
    let Some((flags, _)) = fopen_flags(mode) else {
        return pass();
    };
    let mut bufs = Bufs::new();
    let loc = locate(&g, libc::AT_FDCWD, path, &mut bufs);
    let plan = if loc.rel.is_some() {
        plan(&g, &loc, flags)
    } else {
        Plan::Pass
    };
    match plan {
        Plan::Pass => {
            let fp = pass();
            fdtable::clear(stream_fd(fp));
            fp
        }
        Plan::Source { idx, unplaced } => {
            let fp = pass();
            if !fp.is_null() {
                let _keep = KeepErrno::new();
                source_opened(&g, stream_fd(fp), idx, unplaced);
            }
            fp
        }
        Plan::Done(fd) => {
            let fp = real!(FDOPEN as FdopenFn, c"fdopen", (fd, mode) or core::ptr::null_mut());
            if fp.is_null() {
                let e = detour::errno();
                fdtable::clear(fd);
                detour::raw_close(fd);
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
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
    pass: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // freopen closes the stream's fd inside libc, where we cannot see it.
    fdtable::clear(stream_fd(stream));
    if let Some(g) = detour::enter() {
        if let Some((flags, true)) = fopen_flags(mode) {
            let mut bufs = Bufs::new();
            let loc = locate(&g, libc::AT_FDCWD, path, &mut bufs);
            if loc.rel.is_some() {
                invalidate(&g, &loc, flags);
            }
        }
    }
    let fp = pass();
    fdtable::clear(stream_fd(fp));
    fp
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    freopen_impl(
        path,
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
        path,
        mode,
        stream,
        || real!(FREOPEN64 as FreopenFn, c"freopen64", (path, mode, stream) or core::ptr::null_mut()),
    )
}

/// fclose closes its fd inside libc: forget it first, or a later fd with the same number
/// would be taken for a catalogued file.
#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut libc::FILE) -> c_int {
    let fd = stream_fd(fp);
    let t = fdtable::get(fd);
    fdtable::clear(fd);
    let r = real!(FCLOSE as FcloseFn, c"fclose", (fp) or libc::EOF);
    if let Some(t) = t {
        let _keep = KeepErrno::new();
        crate::place::on_close(t);
    }
    r
}
