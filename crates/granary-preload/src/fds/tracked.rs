//! What a tracked fd is, as every fd hook must see it: the fd table's record, with a copy whose
//! identity check was left for the fd's first use (`fdtable::flag::UNCHECKED`, set by an `open`
//! that saves the check's system call) checked first — so no byte or metadata of an unchecked
//! copy reaches the program through libc. A copy that fails is replaced by the source under the
//! fd when nobody shares it (`switch`), or marked `DAMAGED` (its reads then come from the source).

use core::ffi::c_int;

use granary_shm::{job, object_name, State, StateWord};

use crate::fds::copies;
use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::fds::serve::ReadInto;
use crate::fds::switch::{exclusive, open_source_in, put_under_at, replacement_flags};
use crate::sys::log;
use crate::sys::{self, sys, KeepErrno};

/// What `fd` is, its copy checked first if that was left for its first use: every hook that
/// acts on a tracked fd asks this.
#[inline]
pub fn get(fd: c_int) -> Option<Tracked> {
    let t = fdtable::peek(fd)?;
    if t.flags & flag::UNCHECKED != 0 {
        return confirm(fd, t);
    }
    Some(t)
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
    let now = Tracked {
        flags: t.flags & !flag::UNCHECKED,
        ..t
    };
    let FdKind::Tier(tier) = t.kind else {
        return Some(now);
    };
    let table = crate::ops::detour::table();
    let word = table.map_or(StateWord::default(), |tb| tb.state(t.entry));
    // The entry the open just found (the thread's last one), not decoded again.
    let entry = table.and_then(|tb| crate::ops::lookup::entry(tb, t.entry));
    let ok = match (table, &entry) {
        (Some(tb), Some(e)) => {
            word.state() == State::Placed
                && word.tier() == tier
                && copies::is_copy(tb, tier, st, &copies::recorded(tb, t.entry, e))
        }
        _ => false,
    };
    if ok {
        fdtable::clear_file_flag(fd, flag::UNCHECKED);
        return Some(now);
    }
    failed(fd, t, st)
}

/// The deferred check of tier fd `fd` failed (`st`: its `fstat` now): see `confirm_with`.
fn failed(fd: c_int, t: Tracked, st: &libc::stat) -> Option<Tracked> {
    // Nothing was read through the fd yet, so its offset is 0 — even where the opened thing
    // (a FIFO planted in place of the copy) has none.
    failed_at(fd, t, st, 0)
}

/// `failed`, the source put under the fd at offset `pos` (where the program's reads of it got
/// to, none of whose bytes it was given).
fn failed_at(fd: c_int, t: Tracked, st: &libc::stat, pos: libc::c_long) -> Option<Tracked> {
    let mut now = Tracked {
        flags: t.flags & !flag::UNCHECKED,
        ..t
    };
    let FdKind::Tier(tier) = t.kind else {
        return Some(now);
    };
    let table = crate::ops::detour::table();
    let word = table.map_or(StateWord::default(), |tb| tb.state(t.entry));
    let entry = table.and_then(|tb| tb.entry(t.entry));
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
        // The source goes under it now, at `pos`. The flags granary added at the open stay on
        // the replacement (`replacement_flags`), hidden from `F_GETFL` as before.
        let added = t.flags & (flag::NONBLOCK_ADDED | flag::NOFOLLOW_ADDED);
        let to = Tracked::new(t.entry, FdKind::Source, flag::PINNED | added);
        // A shared fd keeps its file so its sharers keep one offset — unless what was opened is
        // no regular file (a FIFO): no offset to share, and no byte of it may be read.
        let not_a_file = st.st_mode & libc::S_IFMT != libc::S_IFREG;
        // A child that runs in our memory (vfork) has a table of fds of its own: the source
        // under its number changes nothing for its parent, whose fd is checked at its own
        // first use — and the child is about to hand its fd to the program it starts (`dup2`
        // onto 0, then `exec`), which would read the damaged copy raw.
        let own_fds_only = !fdtable::owned() && !now.has(flag::SHARED) && !now.has(flag::PINNED);
        let may_move = exclusive(&now) || (not_a_file && fdtable::owned()) || own_fds_only;
        let moved = may_move
            && replacement_flags(fd, t.flags)
                .and_then(|fl| open_source_in(tb, t.entry, e, fl))
                .is_some_and(|new| put_under_at(fd, new, to, pos));
        if moved {
            now = to;
        }
        // Counted as a tier file at the open; its bytes come from the source.
        let slot = crate::ops::detour::job_slot();
        tb.uncount(slot, job::TIER_FILES + tier as usize, 1);
        tb.count(slot, job::SOURCE_OPENS, 1);
        tb.count(slot, job::FALLBACKS, 1);
        if word.state() == State::Placed {
            let expect = copies::recorded(tb, t.entry, e);
            match copies::open_or_why(
                tb,
                tier,
                &object_name(e.object),
                libc::O_RDONLY | libc::O_CLOEXEC,
                &expect,
            ) {
                Ok((cfd, _)) => {
                    sys::raw_close(cfd);
                }
                // No fd to spare, or a vfork child: nothing is known of the copy.
                Err(copies::Refused::NoRoom | copies::Refused::NoDir) => {}
                Err(copies::Refused::NotCopy) => {
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

/// Copies at most this large are checked at their first plain read by their bytes instead of an
/// `fstat`: hashing them costs less than the system call it replaces (an `fstat` of an open fd
/// takes 0.40 µs on the bench machine; xxh3 of 4 KiB in cache well under that).
pub const CONTENT_CHECK_MAX: u64 = 4096;

/// What `first_read` did.
pub enum FirstRead {
    /// Not applicable: the caller goes on as usual (the check at first use, then the read).
    No,
    /// The caller's read returned exactly the copy's bytes: the whole file, to its end, with the
    /// checksum the agent recorded when it wrote the copy. The fd is checked now.
    Verified(isize),
    /// The read's answer is the program's own: the fd's number no longer names a copy (closed
    /// behind our back and reused by the program), or its buffer was bad (`EFAULT`).
    NotOurs(isize),
    /// The copy is not what the agent wrote: the read's bytes are discarded, the source is put
    /// under the fd at offset 0 (or the fd marked `DAMAGED`); the caller reads again.
    Damaged,
}

/// The first use of an `UNCHECKED` small copy, when it is a plain `read` into one buffer larger
/// than the file (a reader that reads whole files: `open`, `read` to the end, `close`), checked
/// by what the read returned instead of an `fstat` before it: the read is made, and its bytes
/// are the copy's only if there are exactly as many as the file has — a buffer larger than the
/// file, so a longer file would have shown more — and their xxh3-64 is the checksum the agent
/// recorded for the complete copy. Whatever damage was done to the copy (bytes changed,
/// truncated, extended, replaced by another file, a FIFO, a directory) changes what the read
/// returns, and any such answer goes the way of a failed check before it reaches the program.
/// Only for an fd nobody shares (`switch::exclusive`), so the offset the read moved is ours to
/// rewind; the fd's `BUSY` bit keeps the program's other threads out meanwhile, and the
/// re-entrancy guard, held from before the lock is taken, this thread's signal handlers: a
/// handler that reads the fd meanwhile finds the guard taken and its read passes through (after
/// the check at first use, `get`) instead of waiting for a lock only this thread can release.
/// Such a read moves the offset under this one: the rewind goes back by what this read took,
/// not to 0.
pub fn first_read(fd: c_int, t: Tracked, len: Option<u64>, f: &impl ReadInto) -> FirstRead {
    let FdKind::Tier(tier) = t.kind else {
        return FirstRead::No;
    };
    let (Some(len), Some(table)) = (len, crate::ops::detour::table()) else {
        return FirstRead::No;
    };
    if !exclusive(&t) {
        return FirstRead::No;
    }
    let word = table.state(t.entry);
    if word.state() != State::Placed || word.tier() != tier {
        return FirstRead::No;
    }
    // (The entry's object id and size: read from its record, not decoded.)
    let Some((object, size, _)) = table.file_fields(t.entry) else {
        return FirstRead::No;
    };
    let sum = table.checksum(t.entry);
    // An empty file's bytes prove nothing (a FIFO reads as empty too); 0 is no checksum.
    if size == 0 || size > CONTENT_CHECK_MAX || len <= size || sum == 0 {
        return FirstRead::No;
    }
    // Inside a hook of this thread already (a signal handler's read, say, of this very fd,
    // whose `BUSY` bit the interrupted read may hold): the usual way, without waiting.
    let Ok(_guard) = crate::ops::detour::enter_any_creds() else {
        return FirstRead::No;
    };
    if !fdtable::lock(fd) {
        return FirstRead::No;
    }
    // Another thread may have checked or switched it while we waited.
    let same = fdtable::peek(fd)
        .is_some_and(|now| now.kind == t.kind && now.entry == t.entry && now.has(flag::UNCHECKED));
    let Some((n, h)) = same.then(|| f.read_hashed(fd, len)).flatten() else {
        fdtable::unlock(fd);
        return FirstRead::No;
    };
    if n >= 0 && n as u64 == size && h == sum {
        fdtable::clear_file_flag_and_unlock(fd, flag::UNCHECKED);
        return FirstRead::Verified(n);
    }
    if n < 0 && sys::errno() == libc::EFAULT {
        // The program's buffer, not the copy: the kernel's answer, as directly (nothing was
        // read); the check waits for the fd's next use.
        fdtable::unlock(fd);
        return FirstRead::NotOurs(n);
    }
    // Not the copy's bytes: what is under the fd decides.
    let _keep = KeepErrno::new();
    let mut st = sys::empty_stat();
    let object = object_name(object);
    if sys::raw_fstat(fd, &mut st) != 0 || !copies::could_be_copy(table, tier, &object, &st) {
        fdtable::take(fd);
        return FirstRead::NotOurs(n);
    }
    // Whatever the read took goes back (a FIFO has no offset: nothing to give back, and the
    // source goes under it at 0). Back by what it took rather than to 0: a read that a signal
    // handler of this thread made of the fd before this one (passed through: see above) moved
    // the offset first, and keeps what it read.
    let back = n.max(0) as libc::c_long;
    let pos = sys!(libc::SYS_lseek, fd, -back, libc::SEEK_CUR).max(0);
    // Its bytes were not the copy's, whatever its identity says: a failed check (the source
    // put under the fd while its lock is held; an fd it forgets has no lock left to release).
    if failed_at(fd, t, &st, pos).is_some() {
        fdtable::unlock(fd);
    }
    FirstRead::Damaged
}
