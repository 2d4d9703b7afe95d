//! fd calls that only matter for fds granary tracks: closing and duplicating keep the fd table
//! honest, `fchdir` into a shadow directory goes to the real directory, and reads are counted.
//! Every one costs an untracked fd a single atomic load.

use core::ffi::{c_char, c_int, c_long, c_uint};

use crate::detour::{self, real, sys};
use crate::fdtable::{self, Kind};
use crate::path::{self, BUF};
use crate::place;
use crate::residency;

type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type CloseRangeFn = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type DupFn = unsafe extern "C" fn(c_int) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type ChdirFn = unsafe extern "C" fn(*const c_char) -> c_int;
type FchdirFn = unsafe extern "C" fn(c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let t = fdtable::get(fd);
    // Forget first: once closed, another thread may get the same number for something else.
    if let Some(t) = t {
        residency::before_close(fd, t);
        fdtable::clear(fd);
    }
    let r = real!(CLOSE as CloseFn, (fd) else detour::raw_close(fd));
    if let Some(t) = t {
        let _keep = detour::KeepErrno::new();
        place::on_close(t);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        let _keep = detour::KeepErrno::new();
        fdtable::clear_range(first, last, place::on_close);
    }
    real!(CLOSE_RANGE as CloseRangeFn, (first, last, flags)
        else sys!(libc::SYS_close_range, first, last, flags) as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = real!(DUP as DupFn, (fd) else sys!(libc::SYS_dup, fd) as c_int);
    if r >= 0 {
        fdtable::copy(fd, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let r = real!(DUP2 as Dup2Fn, (old, new) else raw_dup2(old, new));
    if r >= 0 {
        fdtable::copy(old, r);
    }
    r
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
    let r = real!(DUP3 as Dup3Fn, (old, new, flags) else sys!(libc::SYS_dup3, old, new, flags) as c_int);
    if r >= 0 {
        fdtable::copy(old, r);
    }
    r
}

fn fcntl_impl(fd: c_int, cmd: c_int, r: c_int) -> c_int {
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        fdtable::copy(fd, r);
    }
    r
}

// The argument is taken as a fixed third long (x86-64/aarch64 ABI), like `open`'s mode; every
// fcntl command's argument is an int, a long or a pointer, all passed in that register.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    let r =
        real!(FCNTL as FcntlFn, (fd, cmd, arg) else sys!(libc::SYS_fcntl, fd, cmd, arg) as c_int);
    fcntl_impl(fd, cmd, r)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    let r =
        real!(FCNTL64 as FcntlFn, (fd, cmd, arg) else sys!(libc::SYS_fcntl, fd, cmd, arg) as c_int);
    fcntl_impl(fd, cmd, r)
}

/// A shadow directory fd stands for a source directory: changing into it must land there.
#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let pass = || real!(FCHDIR as FchdirFn, (fd) else sys!(libc::SYS_fchdir, fd) as c_int);
    let Some(t) = fdtable::get(fd) else {
        return pass();
    };
    if t.kind != Kind::Dir {
        return pass();
    }
    let Some(g) = detour::enter() else {
        return pass();
    };
    let mut buf = [0u8; BUF];
    let target = g
        .table
        .entry(t.entry)
        .and_then(|e| g.table.rel_path(&e))
        .and_then(|rel| path::real_path_of(g.table, rel, &mut buf));
    if target.is_none() {
        return pass();
    }
    let p = buf.as_ptr().cast::<c_char>();
    real!(CHDIR as ChdirFn, (p) else sys!(libc::SYS_chdir, p) as c_int)
}
