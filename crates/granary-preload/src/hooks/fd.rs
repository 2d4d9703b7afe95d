//! The C entry points of the fd calls that only matter for fds granary tracks: `close`,
//! `close_range`, the `dup` family, `fcntl`, `ioctl(FIONCLEX)`, `sendmsg` (`SCM_RIGHTS`),
//! `chdir`/`fchdir`. What granary does for them is `ops::fd`.

use core::ffi::{c_char, c_int, c_long, c_uint, c_ulong};

use crate::ops::fd;
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
    if fd::keeps_open(fd) {
        // The job's table for this process's children: stays open, as the library's own fds.
        return 0;
    }
    let closing = fd::closing(fd);
    let r = real!(CLOSE as CloseFn, (fd) else sys::raw_close(fd));
    fd::closed(closing);
    r
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    fd::close_range(first, last, flags, |first, last, flags| {
        real!(CLOSE_RANGE as CloseRangeFn, (first, last, flags)
            else sys!(libc::SYS_close_range, first, last, flags) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    fd::duplicating(fd);
    let r = real!(DUP as DupFn, (fd) else sys!(libc::SYS_dup, fd) as c_int);
    if r >= 0 {
        fd::duplicated(fd, r);
    }
    r
}

/// `dup2`/`dup3` close `new` first when it is open: the close path, then the copy.
fn dup_over(old: c_int, new: c_int, call: impl FnOnce() -> c_int) -> c_int {
    if old == new {
        return call();
    }
    fd::duplicating(old);
    let closing = fd::replacing(new);
    let r = call();
    if r >= 0 {
        fd::duplicated(old, r);
    }
    fd::closed(closing);
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

// The argument is taken as a fixed third long (x86-64/aarch64 ABI), like `open`'s mode; every
// fcntl command's argument is an int, a long or a pointer, all passed in that register.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fd::fcntl(
        fd,
        cmd,
        arg,
        || real!(FCNTL as FcntlFn, (fd, cmd, arg) else sys!(libc::SYS_fcntl, fd, cmd, arg) as c_int),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    fd::fcntl(
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
        fd::inheritable(fd);
    }
    r
}

/// An fd sent to another process (`SCM_RIGHTS`) shares its OFD with the receiver.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(sock: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    if !msg.is_null() {
        fd::sending(msg);
    }
    real!(SENDMSG as SendmsgFn, (sock, msg, flags)
        else sys!(libc::SYS_sendmsg, sock, msg, flags) as isize)
}

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let r = real!(CHDIR as ChdirFn, (path) else sys!(libc::SYS_chdir, path) as c_int);
    fd::cwd_changed(r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let r = real!(FCHDIR as FchdirFn, (fd) else sys!(libc::SYS_fchdir, fd) as c_int);
    fd::cwd_changed(r);
    r
}
