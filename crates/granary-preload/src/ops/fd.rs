//! What granary does for the fd calls that only matter for fds it tracks: closing and
//! duplicating keep the fd table honest, anything that may share an fd's open file description
//! marks it shared (`dup*`, `F_DUPFD*`, clearing close-on-exec, `SCM_RIGHTS`), `chdir`/`fchdir`
//! keep the working-directory shortcut of `path` right, and `F_GETFL` hides the status flags
//! granary added to a copy's fd. Every one costs an untracked fd a single atomic load.
//!
//! Every way an fd goes away — `close`, `fclose`, `closedir`, `close_range`, `dup2`/`dup3` over
//! a tracked fd, `freopen` — takes one path (`closing`, then the real call, then `closed`), so
//! that each does what a close means: the fd is forgotten before the kernel can hand its number
//! out again, a transient copy's pages are dropped while the fd still names it, and the agent
//! hears of a small source file the program has read. In a vfork child (which shares its
//! parent's memory until `exec`) nothing happens: its closes are not the parent's, and dropping
//! pages there would drop the parent's.

use core::ffi::{c_int, c_long, c_uint};

use granary_shm::{request, State};

use crate::fds::fdtable::{self, flag, FdKind, Tracked};
use crate::fds::tracked;
use crate::ops::detour;
use crate::sys::KeepErrno;

/// A tracked fd on its way out: what it was, for `closed`.
#[must_use]
pub struct Closing(Option<Tracked>);

/// Before the real call that closes `fd`: forgets it (and drops a transient copy's pages).
#[inline]
pub fn closing(fd: c_int) -> Closing {
    crate::fds::copies::forget(fd);
    let Some(t) = fdtable::take(fd) else {
        return Closing(None);
    };
    crate::fds::pagedrop::before_close(fd, t);
    Closing(Some(t))
}

/// After the real call: what the agent should learn from it.
pub fn closed(c: Closing) {
    if let Some(t) = c.0 {
        let _keep = KeepErrno::new();
        released(t);
    }
}

/// A tracked fd went away: a small source file still waiting for placement has its pages in
/// the page cache now, so the agent should copy it from there.
fn released(t: Tracked) {
    let hinted = t.kind == FdKind::Other && t.has(flag::CLOSE_HINT);
    if t.kind != FdKind::Source && !hinted {
        return;
    }
    let Some(table) = detour::table() else {
        return;
    };
    if !table.is_valid() {
        return;
    }
    let st = table.state(t.entry).state();
    if st != State::Unplaced && st != State::Queued {
        return;
    }
    // Marked at its open (`flag::SMALL`); an fd that was not (O_NOATIME) is judged by its size.
    let small = hinted
        || t.has(flag::SMALL)
        || crate::ops::lookup::entry(table, t.entry)
            .is_some_and(|e| e.stat.size < table.prefetch_min_size());
    if small {
        let slot = detour::job_slot();
        // Nobody waits for this copy: no wake-up of the agent (`push_hint_arg`).
        table.push_hint_arg(request::CLOSED, t.entry, slot);
    }
}

/// True for the fd that carries the table to this process's children: a program's close of it
/// leaves it open (`attach`).
#[inline]
pub fn keeps_open(fd: c_int) -> bool {
    crate::init::attach::is_table_fd(fd)
}

/// `close_range(first, last, flags)` around the table fd this process keeps for its children;
/// `real` makes the real call for a range.
pub fn close_range(
    first: c_uint,
    last: c_uint,
    flags: c_int,
    real: impl Fn(c_uint, c_uint, c_int) -> c_int,
) -> c_int {
    let keep = crate::init::attach::table_fd();
    if keep >= 0 && (first..=last).contains(&(keep as c_uint)) {
        let keep = keep as c_uint;
        let mut r = 0;
        if keep > first {
            r = close_fds(first, keep - 1, flags, &real);
        }
        if keep < last && r == 0 {
            r = close_fds(keep + 1, last, flags, &real);
        }
        return r;
    }
    close_fds(first, last, flags, &real)
}

fn close_fds(
    first: c_uint,
    last: c_uint,
    flags: c_int,
    real: &impl Fn(c_uint, c_uint, c_int) -> c_int,
) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        // The fds stay open until an exec: nothing goes away now, but they stop being shared.
        return real(first, last, flags);
    }
    let keep = KeepErrno::new();
    crate::fds::copies::forget_range(first, last);
    let mut closed = [None; 64];
    let mut n = 0;
    fdtable::take_range(first, last, |fd, t| {
        crate::fds::pagedrop::before_close(fd, t);
        match closed.get_mut(n) {
            Some(slot) => {
                *slot = Some(t);
                n += 1;
            }
            // More tracked fds than we keep notes of: tell the agent now (a CLOSED request
            // sent a moment early only means the copy starts a moment early).
            None => released(t),
        }
    });
    drop(keep);
    let r = real(first, last, flags);
    for t in closed.into_iter().take(n) {
        self::closed(Closing(t));
    }
    r
}

/// `new` now names `old`'s open file description (`dup`, `F_DUPFD*`, a successful `dup2`).
/// Before the dup family copies `old`: a copy whose check was left for its first use is
/// checked now, while `old` is still its only fd — one that fails gets the source under it
/// before the new fd shares it (a copy found damaged after the `dup2` onto 0 stayed under 0,
/// and the program `exec`'d next read it raw).
#[inline]
pub fn duplicating(old: c_int) {
    let _ = tracked::get(old);
}

pub fn duplicated(old: c_int, new: c_int) {
    fdtable::dup(old, new, tracked::get(old));
}

/// Before `dup2`/`dup3` put `old`'s file at `new` (`old != new`): `new` is closed first.
pub fn replacing(new: c_int) -> Closing {
    // The program puts its own file at that number: the table fd is gone.
    crate::init::attach::replaced(new);
    closing(new)
}

/// `fcntl(fd, cmd, arg)` on a tracked fd; `real` makes the call.
pub fn fcntl(fd: c_int, cmd: c_int, arg: c_long, real: impl FnOnce() -> c_int) -> c_int {
    let Some(t) = tracked::get(fd) else {
        return real();
    };
    match cmd {
        // (`get` above made the check, before the copy is shared.)
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = real();
            if r >= 0 {
                duplicated(fd, r);
            }
            r
        }
        libc::F_SETFD => {
            let r = real();
            if r == 0 && arg as c_int & libc::FD_CLOEXEC == 0 {
                // Inheritable from now on: an exec'd child may share the OFD.
                fdtable::set_flag(fd, flag::SHARED);
            }
            r
        }
        libc::F_GETFL => {
            let r = real();
            if r >= 0 {
                return r & !flag::hidden(t.flags);
            }
            r
        }
        libc::F_SETFL => {
            if arg as c_int & libc::O_NOATIME != 0 && noatime_refused(fd, t) {
                crate::sys::set_errno(libc::EPERM);
                return -1;
            }
            let r = real();
            let added = flag::NONBLOCK_ADDED | flag::NOATIME_ADDED;
            if r == 0 && t.flags & added != 0 {
                // The program chose its status flags: O_NONBLOCK and O_NOATIME are now its own
                // (or gone), on this fd and on every other that shares its open file
                // description (a dup). A forked sharer's table is its own: out of reach.
                // `kcmp` only where no seccomp filter may refuse it or kill for it (asked
                // once, at the first candidate).
                fdtable::clear_flag(fd, added);
                let mut kcmp = None;
                fdtable::each(|other, o| {
                    if other != fd
                        && o.entry == t.entry
                        && o.kind == t.kind
                        && o.flags & added != 0
                        && *kcmp.get_or_insert_with(crate::sys::kcmp_allowed)
                        && crate::sys::same_file(fd, other) == Some(true)
                    {
                        fdtable::clear_flag(other, added);
                    }
                });
            }
            r
        }
        _ if super::lock::is_lock(cmd) => super::lock::locking(fd, t, real),
        _ => real(),
    }
}

/// `F_SETFL` may not add `O_NOATIME` to a copy's fd `fd`: the kernel refuses it on the source to
/// anyone but the file's owner (or `CAP_FOWNER`) unless it is set already, and the copy, which
/// this process owns, would not.
fn noatime_refused(fd: c_int, t: Tracked) -> bool {
    if !matches!(t.kind, FdKind::Tier(_)) {
        return false;
    }
    let _keep = KeepErrno::new();
    let fl = crate::sys::sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
    if fl < 0 || fl as c_int & !flag::hidden(t.flags) & libc::O_NOATIME != 0 {
        return false;
    }
    let Some(table) = detour::table() else {
        return false;
    };
    let Some(e) = table.entry(t.entry) else {
        return false;
    };
    // setfsuid with an invalid id only reports the current one (the kernel judges by it).
    let fsuid = crate::sys::sys!(libc::SYS_setfsuid, -1i64) as u32;
    const CAP_FOWNER: u32 = 3;
    e.stat.uid != fsuid && !crate::sys::has_cap(CAP_FOWNER)
}

/// `fd` lost close-on-exec (`ioctl(FIONCLEX)`, how Python's `os.set_inheritable` clears it).
pub fn inheritable(fd: c_int) {
    fdtable::set_flag(fd, flag::SHARED);
}

/// `fd`s sent to another process (`sendmsg` with `SCM_RIGHTS`) share their open file
/// descriptions with the receiver.
pub fn sending(msg: *const libc::msghdr) {
    crate::sys::usermem::sent_fds(msg, |fd| {
        // A copy not yet checked is checked before it leaves (`get`): the receiver's reads are
        // out of our sight.
        let _ = tracked::get(fd);
        fdtable::set_flag(fd, flag::SHARED);
    });
}

/// `chdir`/`fchdir` returned `r`: the working directory `path` remembers is read again.
pub fn cwd_changed(r: c_int) {
    // A vfork child's working directory is its own, the remembered one its parent's (shared
    // memory): a child started with another directory (`subprocess.run(cwd=...)`) made the
    // parent take its relative paths for outside the source for the rest of the job. Left as
    // it is, it only costs the child a `getcwd` or a pass-through.
    if r == 0 && fdtable::not_a_vfork_child() {
        if let Some(t) = detour::table() {
            let _keep = KeepErrno::new();
            crate::ops::path::note_cwd(t);
        }
    }
}
