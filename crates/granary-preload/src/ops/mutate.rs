//! What granary does for the path calls that change the source (`unlink`, `rename`, `mkdir`,
//! `link`, `symlink`, `truncate`, `chmod`, `chown`, `utime*`, `*xattr`, `mknod`, and opens for
//! writing): the real call runs, and whatever it changed stops being answered from the catalog,
//! for every process of the job, so the program reads back exactly what it wrote.
//!
//! What changed is decided by the kernel, not lexically: the path is opened `O_PATH` (following
//! the last component only where the call does) and `/proc/self/fd/N` tells its canonical place.
//! So `a/../b`, a symlink inside the source, or another path leading into the source (a symlink
//! from elsewhere) all invalidate the right entry. Only a path that reaches the source through
//! another mount of it (a bind mount) is not recognised — a documented limit.
//!
//! - the entry itself: `STALE` when its contents or attributes changed (it then passes through),
//!   `GONE` when the name no longer leads to it (unlink, rename away, rmdir; also a directory
//!   whose permissions changed): everything under it passes through too;
//! - its parent directory: `STALE` when the call added or removed a name (its listing and times
//!   changed); the other children stay served.

use core::ffi::{c_char, c_int};

use granary_shm::{strip_root, Table};

use crate::fds::fdtable::flag;
use crate::ops::detour::Guard;
use crate::sys::PATH_BUF;
use crate::sys::{self, sys, KeepErrno};

pub use granary_shm::lifecycle::Void;

/// Marks entry `idx` void (`lifecycle::void_entry`: never making a `GONE` entry merely `STALE`
/// again) and tells the agent, which drops a copy of it.
pub fn void(table: &Table, idx: u32, how: Void) {
    if granary_shm::lifecycle::void_entry(table, idx, how) && crate::sys::log::enabled() {
        let name = table.entry(idx).and_then(|e| table.name(&e));
        crate::sys::log::line(&[
            b"changed by the program, not served: ",
            name.unwrap_or(b"?"),
        ]);
    }
}

/// The canonical path of what `fd` is open on, relative to the source; written into `out`.
fn rel_of_fd<'a>(table: &Table, fd: c_int, out: &'a mut [u8; PATH_BUF]) -> Option<&'a [u8]> {
    let mut link = [0u8; 40];
    link[..14].copy_from_slice(b"/proc/self/fd/");
    let mut d = [0u8; 20];
    let digits = crate::sys::log::num(fd as u64, &mut d);
    link.get_mut(14..14 + digits.len())?.copy_from_slice(digits);
    let n = sys!(
        libc::SYS_readlinkat,
        libc::AT_FDCWD,
        link.as_ptr(),
        out.as_mut_ptr(),
        out.len() - 1
    );
    let n = usize::try_from(n).ok().filter(|&n| n > 0)?;
    strip_root(out.get(..n)?, table.source_real_root())
}

/// The catalog entry `(dirfd, path)` names as the kernel resolves it now (`follow`: through a
/// final symlink), if it lies in the source.
pub fn entry_at(table: &Table, dirfd: c_int, path: *const c_char, follow: bool) -> Option<u32> {
    let flags = libc::O_PATH | libc::O_CLOEXEC | if follow { 0 } else { libc::O_NOFOLLOW };
    let fd = sys::raw_openat(dirfd, path, flags, 0);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; PATH_BUF];
    let idx = rel_of_fd(table, fd, &mut buf).and_then(|rel| table.lookup(rel));
    sys::raw_close(fd);
    idx
}

/// The catalogued directory the last component of `(dirfd, path)` lives in, as the kernel
/// resolves the components before it.
pub fn parent_at(table: &Table, dirfd: c_int, path: *const c_char) -> Option<u32> {
    let p = crate::ops::path::bytes(path)?;
    let mut end = p.len();
    while end > 1 && p.get(end - 1) == Some(&b'/') {
        end -= 1;
    }
    let trimmed = p.get(..end)?;
    // Mutations are rare: a zeroed scratch buffer costs nothing that matters here.
    let mut dir = [0u8; PATH_BUF];
    let dir_path: *const c_char = match trimmed.iter().rposition(|&b| b == b'/') {
        None => c".".as_ptr(),
        Some(0) => c"/".as_ptr(),
        Some(i) => {
            dir.get_mut(..i)?.copy_from_slice(trimmed.get(..i)?);
            dir.as_ptr().cast()
        }
    };
    let fd = sys::raw_openat(
        dirfd,
        dir_path,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; PATH_BUF];
    let idx = rel_of_fd(table, fd, &mut buf).and_then(|rel| table.lookup(rel));
    sys::raw_close(fd);
    idx
}

/// What a path call does, for `mutating`.
pub struct Effect {
    /// The entry the path names: before the call (it may vanish), following a final symlink
    /// or not, and how it is left.
    pub target: Option<(bool, Void)>,
    /// The call adds or removes the path's name: its directory's listing changes.
    pub names: bool,
    /// The call changes permissions (mode, owner, ACLs): on a directory, what lies below it.
    pub perms: bool,
}

/// A path a call changes, and how.
pub struct Target {
    pub dirfd: c_int,
    pub path: *const c_char,
    pub effect: Effect,
}

/// Runs a path call that changes the source: resolves what it touches before (`Effect`), runs
/// it, and on success voids what it changed. Every process must learn of a change, so this
/// runs whatever the credentials (`enter_any_creds`).
pub fn mutating(
    dirfd: c_int,
    path: *const c_char,
    effect: Effect,
    call: impl FnOnce() -> c_int,
) -> c_int {
    mutating_all(
        &[Target {
            dirfd,
            path,
            effect,
        }],
        call,
    )
}

/// `mutating` for a call that changes several paths (`rename`, `link`).
pub fn mutating_all(targets: &[Target], call: impl FnOnce() -> c_int) -> c_int {
    let Ok(g) = crate::ops::detour::enter_any_creds() else {
        return call();
    };
    let mut before = [None; 2];
    for (b, t) in before.iter_mut().zip(targets) {
        *b = t
            .effect
            .target
            .and_then(|(follow, _)| entry_at(g.table, t.dirfd, t.path, follow));
    }
    let r = call();
    if r < 0 {
        return r;
    }
    let _keep = KeepErrno::new();
    for (b, t) in before.iter().zip(targets) {
        after(&g, t.dirfd, t.path, &t.effect, *b);
    }
    r
}

fn after(g: &Guard, dirfd: c_int, path: *const c_char, effect: &Effect, before: Option<u32>) {
    if let (Some(idx), Some((_, how))) = (before, effect.target) {
        let how = match how {
            // A directory's permissions decide what lies below it.
            Void::Stale if effect.perms && is_dir(g.table, idx) => Void::Gone,
            h => h,
        };
        void(g.table, idx, how);
    }
    if effect.names {
        // The name now exists (created, renamed to) or not (removed): its directory changed,
        // and a catalogued entry of that name was replaced.
        if let Some(now) = entry_at(g.table, dirfd, path, false) {
            if Some(now) != before {
                void(g.table, now, Void::Gone);
            }
        }
        if let Some(parent) = parent_at(g.table, dirfd, path) {
            void(g.table, parent, Void::Stale);
        }
    }
}

fn is_dir(table: &Table, idx: u32) -> bool {
    table.entry(idx).is_some_and(|e| e.stat.is_dir())
}

/// An fd-based change (`fchmod`, `fchown`, `futimens`, `fsetxattr`, …) of what `fd` is open on;
/// `perms`: a permission change (a directory's subtree then passes through too).
pub fn fd_changed(fd: c_int, perms: bool) {
    let Ok(g) = crate::ops::detour::enter_any_creds() else {
        return;
    };
    let _keep = KeepErrno::new();
    let idx = match crate::fds::tracked::get(fd) {
        // (A close hint's entry is its hash slot's, unverified: the path is looked up instead.)
        Some(t) if t.has(flag::CLOSE_HINT) => {
            let mut buf = [0u8; PATH_BUF];
            rel_of_fd(g.table, fd, &mut buf).and_then(|rel| g.table.lookup(rel))
        }
        Some(t) if t.entry != u32::MAX => Some(t.entry),
        Some(_) => None,
        None => {
            let mut buf = [0u8; PATH_BUF];
            rel_of_fd(g.table, fd, &mut buf).and_then(|rel| g.table.lookup(rel))
        }
    };
    if let Some(idx) = idx {
        let how = if perms && is_dir(g.table, idx) {
            Void::Gone
        } else {
            Void::Stale
        };
        void(g.table, idx, how);
    }
}

/// An open that may write (or create): what it opened, seen through the new fd. Returns the
/// entry it opened (`u32::MAX`: a file under the source the catalog does not know), or `None`
/// when it is not under the source.
pub fn opened_for_writing(g: &Guard, fd: c_int) -> Option<u32> {
    let _keep = KeepErrno::new();
    let mut buf = [0u8; PATH_BUF];
    let rel = rel_of_fd(g.table, fd, &mut buf)?;
    match g.table.lookup(rel) {
        Some(idx) => {
            void(g.table, idx, Void::Stale);
            Some(idx)
        }
        None => {
            // A new file: its directory's listing changed.
            let parent = rel
                .iter()
                .rposition(|&b| b == b'/')
                .map_or(&b""[..], |i| &rel[..i]);
            if let Some(p) = g.table.lookup(parent) {
                void(g.table, p, Void::Stale);
            }
            Some(u32::MAX)
        }
    }
}

// ---- what each call changes ----

pub const CONTENT: Option<(bool, Void)> = Some((true, Void::Stale));
pub const CONTENT_NOFOLLOW: Option<(bool, Void)> = Some((false, Void::Stale));
pub const REMOVED: Option<(bool, Void)> = Some((false, Void::Gone));

pub fn names(target: Option<(bool, Void)>) -> Effect {
    Effect {
        target,
        names: true,
        perms: false,
    }
}

pub fn attrs(target: Option<(bool, Void)>) -> Effect {
    Effect {
        target,
        names: false,
        perms: false,
    }
}

pub fn perms(target: Option<(bool, Void)>) -> Effect {
    Effect {
        target,
        names: false,
        perms: true,
    }
}

pub fn at_follow(flags: c_int) -> Option<(bool, Void)> {
    if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        CONTENT_NOFOLLOW
    } else {
        CONTENT
    }
}
