//! What a tracked fd is, as every fd hook must see it: the fd table's record, with a copy whose
//! identity check was left for the fd's first use (`fdtable::flag::UNCHECKED`, set by an `open`
//! that saves the check's system call) checked first — so no byte or metadata of an unchecked
//! copy reaches the program through libc. A copy that fails is replaced by the source under the
//! fd when nobody shares it (`switch`), or marked `DAMAGED` (its reads then come from the source).

use core::ffi::c_int;

use granary_shm::{job, object_name, State, StateWord};

use crate::fds::copies;
use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::fds::switch::{exclusive, open_source_in, put_under_at, replacement_flags};
use crate::sys::log;
use crate::sys::{self, KeepErrno};

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
        let slot = crate::ops::detour::job_slot();
        tb.uncount(slot, job::TIER_FILES + tier as usize, 1);
        tb.count(slot, job::SOURCE_OPENS, 1);
        tb.count(slot, job::FALLBACKS, 1);
        if word.state() == State::Placed {
            let expect = copies::recorded(tb, t.entry, e);
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
