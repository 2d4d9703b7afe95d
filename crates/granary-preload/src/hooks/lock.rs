//! The C entry points of the lock calls: `flock`, `lockf`, `lockf64` (`fcntl`'s locks reach
//! `ops::lock` from `hooks::fd`). What granary does for them is `ops::lock`.

use core::ffi::c_int;

use crate::ops::lock::lock;
use crate::sys::{real, sys};

type FlockFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type LockfFn = unsafe extern "C" fn(c_int, c_int, libc::off_t) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    let call = || real!(FLOCK as FlockFn, (fd, op) else sys!(libc::SYS_flock, fd, op) as c_int);
    lock(fd, call)
}

macro_rules! lockf_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        /// glibc's `lockf` calls its internal `fcntl`, which we never see.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int {
            let call = || real!($slot as LockfFn, $cname, (fd, cmd, len) or -1);
            lock(fd, call)
        }
    };
}
lockf_hook!(lockf, LOCKF, c"lockf");
lockf_hook!(lockf64, LOCKF64, c"lockf64");
