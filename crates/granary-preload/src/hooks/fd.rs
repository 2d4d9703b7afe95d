//! fd calls that only matter for fds granary tracks: closing and duplicating keep the fd table
//! honest (`release`), anything that may share an fd's open file description marks it shared
//! (`dup*`, `F_DUPFD*`, clearing close-on-exec, `SCM_RIGHTS`), `chdir`/`fchdir` keep the
//! working-directory shortcut of `path` right, and `F_GETFL` hides an `O_NOFOLLOW` granary added.
//! Every one costs an untracked fd a single atomic load.

use core::ffi::{c_char, c_int, c_long, c_uint, c_ulong};

use crate::fdtable::{self, flag};
use crate::release;
use crate::sys::{self, real, sys};

type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type CloseRangeFn = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type DupFn = unsafe extern "C" fn(c_int) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int;
type SendmsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> isize;
type ChdirFn = unsafe extern "C" fn(*const c_char) -> c_int;
type FchdirFn = unsafe extern "C" fn(c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if crate::discover::is_table_fd(fd) {
        // The job's table for this process's children: stays open, as the library's own fds.
        return 0;
    }
    let t = release::before(fd);
    let r = real!(CLOSE as CloseFn, (fd) else sys::raw_close(fd));
    release::after(t);
    r
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let keep = crate::discover::table_fd();
    if keep >= 0 && (first..=last).contains(&(keep as c_uint)) {
        // Around the job's table fd, which stays open for this process's children.
        let keep = keep as c_uint;
        let mut r = 0;
        if keep > first {
            r = close_range_impl(first, keep - 1, flags);
        }
        if keep < last && r == 0 {
            r = close_range_impl(keep + 1, last, flags);
        }
        return r;
    }
    close_range_impl(first, last, flags)
}

fn close_range_impl(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        // The fds stay open until an exec: nothing goes away now, but they stop being shared.
        return real!(CLOSE_RANGE as CloseRangeFn, (first, last, flags)
            else sys!(libc::SYS_close_range, first, last, flags) as c_int);
    }
    let _keep = sys::KeepErrno::new();
    crate::copies::forget_range(first, last);
    let mut closed = [None; 64];
    let mut n = 0;
    fdtable::take_range(first, last, |fd, t| {
        crate::pagedrop::before_close(fd, t);
        match closed.get_mut(n) {
            Some(slot) => {
                *slot = Some(t);
                n += 1;
            }
            // More tracked fds than we keep notes of: tell the agent now (a CLOSED request
            // sent a moment early only means the copy starts a moment early).
            None => crate::place::on_release(t),
        }
    });
    drop(_keep);
    let r = real!(CLOSE_RANGE as CloseRangeFn, (first, last, flags)
        else sys!(libc::SYS_close_range, first, last, flags) as c_int);
    for t in closed.into_iter().take(n) {
        release::after(t);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = real!(DUP as DupFn, (fd) else sys!(libc::SYS_dup, fd) as c_int);
    if r >= 0 {
        fdtable::dup(fd, r, crate::tracked::get(fd));
    }
    r
}

/// `dup2`/`dup3` close `new` first when it is open: the release path, then the copy.
fn dup_over(old: c_int, new: c_int, call: impl FnOnce() -> c_int) -> c_int {
    if old == new {
        return call();
    }
    // The program puts its own file at that number: the table fd is gone.
    crate::discover::replaced(new);
    let t = release::before(new);
    let r = call();
    if r >= 0 {
        fdtable::dup(old, r, crate::tracked::get(old));
    }
    release::after(t);
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    dup_over(
        old,
        new,
        || real!(DUP2 as Dup2Fn, (old, new) else raw_dup2(old, new)),
    )
}

fn raw_dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // dup2 on one fd only checks that it is open.
        return if sys!(libc::SYS_fcntl, old, libc::F_GETFD) < 0 {
            -1
        } else {
            new
        };
    }
    sys!(libc::SYS_dup3, old, new, 0) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    dup_over(
        old,
        new,
        || real!(DUP3 as Dup3Fn, (old, new, flags) else sys!(libc::SYS_dup3, old, new, flags) as c_int),
    )
}

fn fcntl_impl(fd: c_int, cmd: c_int, arg: c_long, call: impl FnOnce() -> c_int) -> c_int {
    let Some(t) = crate::tracked::get(fd) else {
        return call();
    };
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = call();
            if r >= 0 {
                fdtable::dup(fd, r, crate::tracked::get(fd));
            }
            r
        }
        libc::F_SETFD => {
            let r = call();
            if r == 0 && arg as c_int & libc::FD_CLOEXEC == 0 {
                // Inheritable from now on: an exec'd child may share the OFD.
                fdtable::set_flag(fd, flag::SHARED);
            }
            r
        }
        libc::F_GETFL => {
            let r = call();
            if r >= 0 {
                return r & !flag::hidden(t.flags);
            }
            r
        }
        libc::F_SETFL => {
            let r = call();
            if r == 0 && t.has(flag::NONBLOCK_ADDED) {
                // The program chose its status flags: O_NONBLOCK is now its own (or gone).
                fdtable::clear_flag(fd, flag::NONBLOCK_ADDED);
            }
            r
        }
        _ if super::lock::is_lock(cmd) => super::lock::locking(fd, t, call),
        _ => call(),
    }
}

// The argument is taken as a fixed third long (x86-64/aarch64 ABI), like `open`'s mode; every
// fcntl command's argument is an int, a long or a pointer, all passed in that register.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_impl(
        fd,
        cmd,
        arg,
        || real!(FCNTL as FcntlFn, (fd, cmd, arg) else sys!(libc::SYS_fcntl, fd, cmd, arg) as c_int),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fcntl_impl(
        fd,
        cmd,
        arg,
        || real!(FCNTL64 as FcntlFn, (fd, cmd, arg) else sys!(libc::SYS_fcntl, fd, cmd, arg) as c_int),
    )
}

/// `ioctl(FIONCLEX)` is how Python's `os.set_inheritable` clears close-on-exec.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_long) -> c_int {
    let r =
        real!(IOCTL as IoctlFn, (fd, req, arg) else sys!(libc::SYS_ioctl, fd, req, arg) as c_int);
    if r == 0 && req == libc::FIONCLEX as c_ulong {
        fdtable::set_flag(fd, flag::SHARED);
    }
    r
}

/// An fd sent to another process (`SCM_RIGHTS`) shares its OFD with the receiver.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(sock: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    if !msg.is_null() {
        mark_sent(msg);
    }
    real!(SENDMSG as SendmsgFn, (sock, msg, flags)
        else sys!(libc::SYS_sendmsg, sock, msg, flags) as isize)
}

/// Marks every fd passed in `msg`'s `SCM_RIGHTS` control messages as shared. Reads the header
/// and control buffer only through `usermem` (a bad pointer is the kernel's to report).
fn mark_sent(msg: *const libc::msghdr) {
    let mut hdr = [0u8; core::mem::size_of::<libc::msghdr>()];
    if !crate::usermem::read(msg.cast(), &mut hdr) {
        return;
    }
    // SAFETY: `hdr` holds a copy of a `msghdr` (plain integers and pointers).
    let h: libc::msghdr = unsafe { core::ptr::read_unaligned(hdr.as_ptr().cast()) };
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return;
    }
    let mut ctl = [0u8; 1024];
    let len = (h.msg_controllen as usize).min(ctl.len());
    if !crate::usermem::read(h.msg_control, &mut ctl[..len]) {
        return;
    }
    let hdr_len = core::mem::size_of::<libc::cmsghdr>();
    let mut off = 0usize;
    while off + hdr_len <= len {
        // SAFETY: `ctl[off..off + hdr_len]` is a copied `cmsghdr` (plain integers).
        let c: libc::cmsghdr = unsafe { core::ptr::read_unaligned(ctl.as_ptr().add(off).cast()) };
        let clen = c.cmsg_len as usize;
        if clen < hdr_len || off + clen > len {
            break;
        }
        if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_RIGHTS {
            let data = &ctl[off + hdr_len..off + clen];
            for fd in data.chunks_exact(4) {
                let fd = c_int::from_ne_bytes([fd[0], fd[1], fd[2], fd[3]]);
                // A copy not yet checked is checked before it leaves (`get`): the receiver's
                // reads are out of our sight.
                let _ = crate::tracked::get(fd);
                fdtable::set_flag(fd, flag::SHARED);
            }
        }
        off += (clen + 7) & !7;
    }
}

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let r = real!(CHDIR as ChdirFn, (path) else sys!(libc::SYS_chdir, path) as c_int);
    cwd_changed(r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let r = real!(FCHDIR as FchdirFn, (fd) else sys!(libc::SYS_fchdir, fd) as c_int);
    cwd_changed(r);
    r
}

fn cwd_changed(r: c_int) {
    if r == 0 {
        if let Some(t) = crate::detour::table() {
            let _keep = sys::KeepErrno::new();
            crate::path::note_cwd(t);
        }
    }
}
