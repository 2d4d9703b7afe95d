//! Moving an fd's reads to another file: the complete copy of a file it has open on the source,
//! or the source of a copy the program has since changed.
//!
//! Two ways, and the rule that picks one (docs/preload-rules.md, "Shared offsets"):
//! - **switch**: open the other file and `dup3` it over the fd's number, at the same offset. The
//!   fd then has a new open file description (OFD): only done when the OFD is this fd's alone
//!   (`exclusive`), or a `dup`, a forked child or an `exec`'d child sharing it would keep reading
//!   the old file at an offset no longer shared.
//! - **serve**: keep the fd, and answer each read from the other file opened for the call: the
//!   range is claimed on the fd's own offset first (`lseek(SEEK_CUR)`, atomic in the kernel), then
//!   delivered (`serve`). Sharers keep sharing the offset; nothing about the fd changes.

use core::ffi::c_int;

use granary_shm::{job, object_name, state, EntryRec, Table};

use crate::copies::{self, Expect};
use crate::detour::Guard;
use crate::fdtable::{self, flag, FdKind, Tracked};
use crate::log;
use crate::path::{self, Buf};
use crate::sys::{self, sys, KeepErrno};

/// Reads `want` bytes (fewer only at a short read) from `file` at `off` into the caller's
/// buffers; -1 on error. The hook supplies it: `pread` into one buffer, or over an iovec.
pub trait ReadInto {
    fn read_into(&self, file: c_int, off: u64, want: u64) -> isize;
}

/// True if `t`'s open file description is this fd's alone, so switching it changes nothing for
/// anybody else.
pub fn exclusive(t: &Tracked) -> bool {
    !t.has(flag::SHARED) && !t.has(flag::PINNED) && fdtable::owned()
}

/// The entry's complete copy, opened read-only with `flags`, if it is exactly what the agent
/// placed. Reports a damaged copy. Never changes errno.
pub fn open_copy(g: &Guard, idx: u32, e: &EntryRec, flags: c_int) -> Option<(c_int, u8, u64)> {
    let word = g.table.state(idx);
    if state::state_of(word) != state::PLACED {
        return None;
    }
    let tier = state::tier_of(word);
    let expect = recorded(g.table, idx, e);
    let opened = copies::open(g.table, tier, &object_name(e.object), flags, &expect);
    if opened.is_none() {
        // Gone, damaged, replaced: the agent drops it and places it again.
        g.table.push_request(granary_shm::request::DAMAGED, idx);
        g.count(job::FALLBACKS, 1);
        if log::enabled() {
            log::line(&[
                b"cached copy unusable, using the source: ",
                g.table.name(e).unwrap_or(b"?"),
            ]);
        }
    }
    opened.map(|(fd, added)| (fd, tier, flag::added(added)))
}

/// What the agent recorded when it placed entry `idx`'s complete copy.
fn recorded(table: &Table, idx: u32, e: &EntryRec) -> Expect {
    let (ino, ctime_ns) = table.copy_identity(idx);
    Expect {
        ino,
        ctime_ns,
        size: Some(e.stat.size),
    }
}

/// `open_copy` for an fd tracked at once and closed on exec, with the identity check left to
/// the fd's first use (`confirm`): CPython's `open` calls `fstat` next, which then makes the
/// check (one system call instead of two). The fd's flags carry `UNCHECKED`.
pub fn open_copy_unchecked(
    g: &Guard,
    idx: u32,
    e: &EntryRec,
    flags: c_int,
) -> Option<(c_int, u8, u64)> {
    let word = g.table.state(idx);
    if state::state_of(word) != state::PLACED || flags & libc::O_CLOEXEC == 0 {
        return open_copy(g, idx, e, flags);
    }
    let tier = state::tier_of(word);
    match copies::open_unchecked(g.table, tier, &object_name(e.object), flags) {
        Some((fd, added)) => Some((fd, tier, flag::added(added) | flag::UNCHECKED)),
        // Gone: the checked open reports it.
        None => open_copy(g, idx, e, flags),
    }
}

/// The deferred check of tier fd `fd` (`flag::UNCHECKED`): its `fstat`, then `confirm_with`.
/// `None` if the number is not open any more (closed behind our back): it is forgotten.
pub fn confirm(fd: c_int, t: Tracked) -> Option<Tracked> {
    let _keep = KeepErrno::new();
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 {
        fdtable::take(fd);
        return None;
    }
    confirm_with(fd, t, &st)
}

/// The deferred check of tier fd `fd`, given `st`, its `fstat` just now: the same check
/// `copies::open` makes. A copy that fails it is `DAMAGED`: its reads, mappings and `fstat`
/// come from the source from now on (as for a copy changed in place), and the agent is told
/// unless the copy under that name now passes (the agent replaced the file since the open).
/// `None` if the fd's number names something no copy can be (closed behind our back and
/// reused): it is forgotten, the kernel's to describe.
pub fn confirm_with(fd: c_int, t: Tracked, st: &libc::stat) -> Option<Tracked> {
    let _keep = KeepErrno::new();
    let mut now = Tracked {
        flags: t.flags & !flag::UNCHECKED,
        ..t
    };
    let FdKind::Tier(tier) = t.kind else {
        return Some(now);
    };
    let table = crate::detour::table();
    let word = table.map_or(0, |tb| tb.state(t.entry));
    let entry = table.and_then(|tb| tb.entry(t.entry));
    let ok = match (table, &entry) {
        (Some(tb), Some(e)) => {
            state::state_of(word) == state::PLACED
                && state::tier_of(word) == tier
                && copies::is_copy(tb, tier, st, &recorded(tb, t.entry, e))
        }
        _ => false,
    };
    if ok {
        fdtable::clear_file_flag(fd, flag::UNCHECKED);
        return Some(now);
    }
    let copy_like = match (table, &entry) {
        (Some(tb), Some(e)) => copies::could_be_copy(tb, tier, &object_name(e.object), st),
        _ => false,
    };
    if !copy_like {
        fdtable::take(fd);
        return None;
    }
    now.flags |= flag::DAMAGED;
    fdtable::set_flag(fd, flag::DAMAGED);
    fdtable::clear_flag(fd, flag::UNCHECKED);
    if let (Some(tb), Some(e)) = (table, &entry) {
        // Nothing was read through the fd yet, so its offset is 0 — even where the opened
        // thing (a FIFO planted in place of the copy) has none: the source goes under it now.
        // The flags granary added at the open stay on the replacement (`replacement_flags`),
        // hidden from `F_GETFL` as before.
        let added = t.flags & (flag::NONBLOCK_ADDED | flag::NOFOLLOW_ADDED);
        let to = Tracked::new(t.entry, FdKind::Source, flag::PINNED | added);
        // A shared fd keeps its file so its sharers keep one offset — unless what was opened is
        // no regular file (a FIFO): no offset to share, and no byte of it may be read.
        let not_a_file = st.st_mode & libc::S_IFMT != libc::S_IFREG;
        let may_move = exclusive(&now) || (not_a_file && fdtable::owned());
        let moved = may_move
            && replacement_flags(fd)
                .and_then(|fl| open_source_in(tb, t.entry, e, fl))
                .is_some_and(|new| put_under_at(fd, new, to, 0));
        if moved {
            now = to;
        }
        // Counted as a tier file at the open; its bytes come from the source.
        let slot = crate::detour::job_slot();
        tb.uncount(slot, job::TIER_FILES + tier as usize, 1);
        tb.count(slot, job::SOURCE_OPENS, 1);
        tb.count(slot, job::FALLBACKS, 1);
        if state::state_of(word) == state::PLACED {
            let expect = recorded(tb, t.entry, e);
            match copies::open(
                tb,
                tier,
                &object_name(e.object),
                libc::O_RDONLY | libc::O_CLOEXEC,
                &expect,
            ) {
                Some((cfd, _)) => {
                    sys::raw_close(cfd);
                }
                None => {
                    // As an open that finds the copy damaged: withdrawn, then placed again.
                    tb.push_request(granary_shm::request::DAMAGED, t.entry);
                    tb.push_request_arg(granary_shm::request::OPEN_UNPLACED, t.entry, slot);
                }
            }
        }
        if log::enabled() {
            log::line(&[
                b"cached copy unusable after its open, using the source: ",
                tb.name(e).unwrap_or(b"?"),
            ]);
        }
    }
    Some(now)
}

/// Opens the entry's file on the source, read-only with `flags`, if it is still the inode the
/// catalog describes (a program that changed the file in place keeps its inode). Never changes
/// errno.
pub fn open_source(g: &Guard, idx: u32, e: &EntryRec, flags: c_int) -> Option<c_int> {
    open_source_in(g.table, idx, e, flags)
}

fn open_source_in(table: &Table, idx: u32, e: &EntryRec, flags: c_int) -> Option<c_int> {
    let _keep = KeepErrno::new();
    let mut buf = Buf::new();
    let p = path::entry_path(table, idx, &mut buf)?;
    let fd = sys::raw_openat(
        libc::AT_FDCWD,
        p,
        flags | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        return None;
    }
    let mut st = sys::empty_stat();
    let same = sys::raw_fstat(fd, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_ino == e.stat.ino
        && st.st_dev == libc::makedev(e.stat.dev_major, e.stat.dev_minor);
    let restored = flags & libc::O_NONBLOCK != 0 || {
        let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
        fl >= 0
            && sys!(
                libc::SYS_fcntl,
                fd,
                libc::F_SETFL,
                fl & !(libc::O_NONBLOCK as i64)
            ) == 0
    };
    if !same || !restored {
        sys::raw_close(fd);
        return None;
    }
    Some(fd)
}

/// The status flags to open a replacement with: the fd's own, without creation flags; the
/// replacement is close-on-exec until `dup3` gives it the fd's own FD_CLOEXEC.
fn replacement_flags(fd: c_int) -> Option<c_int> {
    let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
    if fl < 0 || fl as c_int & libc::O_ACCMODE != libc::O_RDONLY {
        return None;
    }
    let creation = libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC;
    Some((fl as c_int & !creation) | libc::O_CLOEXEC)
}

/// Puts `new` (a freshly opened fd) under `fd`'s number at `fd`'s offset, keeping its
/// FD_CLOEXEC, and tracks it as `to`. The caller holds `fd`'s `BUSY` lock and checked
/// `exclusive`. `new` is always closed.
fn put_under(fd: c_int, new: c_int, to: Tracked) -> bool {
    let pos = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
    put_under_at(fd, new, to, pos)
}

/// `put_under` at offset `pos`.
fn put_under_at(fd: c_int, new: c_int, to: Tracked, pos: libc::c_long) -> bool {
    let fdfl = sys!(libc::SYS_fcntl, fd, libc::F_GETFD);
    let cloexec = if fdfl >= 0 && fdfl as c_int & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    // Position first: dup3 shares the OFD, offset included, so nothing can fail after the fd
    // has been replaced.
    let ok = fdfl >= 0
        && pos >= 0
        && sys!(libc::SYS_lseek, new, pos, libc::SEEK_SET) == pos
        && sys!(libc::SYS_dup3, new, fd, cloexec) == fd as libc::c_long;
    sys::raw_close(new);
    if ok {
        fdtable::track(fd, to);
    }
    ok
}

/// A source fd whose file is now placed: switched to the complete copy when the fd is
/// `exclusive`. Tried once: a failure (or a shared fd) pins it to the source, whose reads are
/// then served from the copy call by call (`serve`).
pub fn to_copy(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec) -> Option<u8> {
    let _keep = KeepErrno::new();
    if !exclusive(&t) {
        if log::enabled() {
            let why: &[u8] = if t.has(flag::SHARED) {
                b"shared"
            } else if t.has(flag::PINNED) {
                b"pinned"
            } else {
                b"not ours"
            };
            let mut d = [0u8; 20];
            let n = log::num(fd as u64, &mut d);
            log::line(&[
                why,
                b" fd ",
                n,
                b", served from the copy call by call: ",
                rel(g, e),
            ]);
        }
        return None;
    }
    let switched = replacement_flags(fd)
        .and_then(|fl| open_copy(g, t.entry, e, fl))
        .and_then(|(new, tier, added)| {
            put_under(fd, new, Tracked::new(t.entry, FdKind::Tier(tier), added)).then_some(tier)
        });
    match switched {
        Some(tier) => {
            g.count(job::TIER_FILES + tier as usize, 1);
            if log::enabled() {
                let mut d = [0u8; 20];
                let n = log::num(fd as u64, &mut d);
                log::line(&[b"switched fd ", n, b" to the complete copy: ", rel(g, e)]);
            }
        }
        None => {
            fdtable::set_flag(fd, flag::PINNED);
            if log::enabled() {
                log::line(&[
                    b"could not switch to the copy, staying on the source: ",
                    rel(g, e),
                ]);
            }
        }
    }
    switched
}

/// A tier fd whose entry the program changed in place (or that takes a lock, or changes the
/// file's attributes): switched to the source when the fd is `exclusive`. Returns false when it
/// stays on the copy (its reads are then served from the source call by call).
pub fn to_source(g: &Guard, fd: c_int, t: Tracked, e: &EntryRec) -> bool {
    let _keep = KeepErrno::new();
    if !exclusive(&t) {
        return false;
    }
    let ok = replacement_flags(fd)
        .and_then(|fl| open_source(g, t.entry, e, fl))
        .is_some_and(|new| put_under(fd, new, Tracked::new(t.entry, FdKind::Source, flag::PINNED)));
    if ok && log::enabled() {
        log::line(&[b"moved to the source: ", rel(g, e)]);
    }
    ok
}

fn rel<'a>(g: &'a Guard, e: &EntryRec) -> &'a [u8] {
    g.table.name(e).unwrap_or(b"?")
}

/// The kernel never moves more than this in one read (`MAX_RW_COUNT`).
const MAX_RW: u64 = 0x7fff_f000;

/// `[pos, end)`: the part of a read of `len` bytes at `off` (`None`: the fd's offset, as it is
/// now) that lies inside a file of `size` bytes; `None` when nothing does (EOF, bad offset: the
/// real call answers that).
pub fn range(fd: c_int, off: Option<i64>, len: u64, size: u64) -> Option<(u64, u64)> {
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

/// How `serve` reads.
pub struct Serve<'a> {
    /// Byte `p` of the file lies at `base + p` in the file read from.
    pub base: u64,
    /// The file's size as served: nothing at or beyond it is read (`u64::MAX`: the file read
    /// from decides, and fewer bytes than asked are an answer, not a failure).
    pub size: u64,
    /// Drop the pages read (page-cache residency).
    pub transient: bool,
    /// Whether the file read from holds `[p, end)` now (a partial copy's progress, present
    /// chunks).
    pub covered: &'a dyn Fn(u64, u64) -> bool,
    /// What to read a range from when the file cannot give it after the fd's offset moved for
    /// it: the fd itself when it is on the source; `None` (an fd on a copy): the read fails.
    pub fallback: Option<c_int>,
}

/// What `serve` did.
pub enum Served {
    /// Bytes for the caller, from the file (`false`) or from the fallback (`true`).
    Bytes(isize, bool),
    /// The read failed with this errno after the fd's offset had moved: the caller returns -1.
    Failed(c_int),
    /// Nothing happened: the caller runs the real call.
    No,
}

/// Serves a read of `len` bytes at `off` (`None`: at the fd's offset) from `file`, and closes
/// `file`.
///
/// A read at the fd's offset claims its range first, in one atomic step of the kernel's own
/// position: `lseek(fd, len, SEEK_CUR)` under the open file description's position lock. Every
/// other reader of that description — this fd in another thread, a `dup`, a forked or exec'd
/// process, a real `read` — then reads after it, as with real reads; what the claim took beyond
/// the bytes delivered (at the end of the file) is given back the same way. Once the offset
/// moved, the range is delivered from `file`, else from the fallback, or the read fails: it is
/// never left to a real read at the moved offset.
pub fn serve(
    fd: c_int,
    file: c_int,
    off: Option<i64>,
    len: u64,
    how: &Serve,
    f: &impl ReadInto,
) -> Served {
    let want = len.min(MAX_RW);
    let size = how.size;
    let exact = size != u64::MAX;
    let from_file = |p: u64, end: u64| -> isize {
        if end <= p {
            return 0;
        }
        if !(how.covered)(p, end) {
            return -1;
        }
        let n = f.read_into(file, how.base + p, end - p);
        if how.transient && n > 0 {
            crate::pagedrop::drop_pages(file, how.base + p, n as u64);
        }
        if exact && n >= 0 && n as u64 != end - p {
            return -1;
        }
        n
    };
    let out = match off {
        Some(o) => match u64::try_from(o) {
            Ok(p) if p < size && want > 0 => match from_file(p, p.saturating_add(want).min(size)) {
                n if n >= 0 => Served::Bytes(n, false),
                _ => Served::No,
            },
            _ => Served::No,
        },
        None => at_offset(fd, want, size, from_file, how.fallback, f),
    };
    sys::raw_close(file);
    out
}

fn at_offset(
    fd: c_int,
    want: u64,
    size: u64,
    from_file: impl Fn(u64, u64) -> isize,
    fallback: Option<c_int>,
    f: &impl ReadInto,
) -> Served {
    let now = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
    if want == 0 || now < 0 || now as u64 >= size {
        // End of file (or no offset): the real call answers and leaves the offset alone.
        return Served::No;
    }
    let moved = sys!(libc::SYS_lseek, fd, want, libc::SEEK_CUR);
    if moved < 0 {
        return Served::No;
    }
    let p = moved as u64 - want;
    // Another reader may have taken what was left meanwhile: then `end == p`, nothing to read.
    let end = p.saturating_add(want).min(size).max(p);
    let mut n = from_file(p, end);
    let mut fell_back = false;
    if n < 0 {
        n = match fallback {
            Some(src) => f.read_into(src, p, end - p),
            None => -1,
        };
        fell_back = true;
    }
    let errno = sys::errno();
    let delivered = u64::try_from(n).unwrap_or(0);
    if delivered < want {
        let back = (want - delivered) as i64;
        sys!(libc::SYS_lseek, fd, -back, libc::SEEK_CUR);
    }
    if n < 0 {
        return Served::Failed(if errno == 0 { libc::EIO } else { errno });
    }
    Served::Bytes(n, fell_back)
}
