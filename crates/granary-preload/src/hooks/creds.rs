//! The C entry points of the credential calls: `setuid`, `seteuid`, `setreuid`, `setresuid`,
//! their gid forms, `setgroups`, `initgroups`, `setfsuid`, `setfsgid`. Each runs as the real
//! call; `ops::creds` then checks whether the catalog may still answer for this process.

use core::ffi::c_int;

use crate::ops::creds::changed;
use crate::sys::real;

macro_rules! id_hook {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            type F = unsafe extern "C" fn($($ty),*) -> c_int;
            changed(real!($slot as F, stringify_c!($name), ($($arg),*) or -1))
        }
    };
}

macro_rules! stringify_c {
    ($n:ident) => {
        // SAFETY: concat! yields a NUL-terminated literal without interior NULs.
        unsafe {
            core::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($n), "\0").as_bytes())
        }
    };
}

id_hook!(setuid, SETUID, (uid: libc::uid_t));
id_hook!(seteuid, SETEUID, (uid: libc::uid_t));
id_hook!(setreuid, SETREUID, (r: libc::uid_t, e: libc::uid_t));
id_hook!(setresuid, SETRESUID, (r: libc::uid_t, e: libc::uid_t, s: libc::uid_t));
id_hook!(setgid, SETGID, (gid: libc::gid_t));
id_hook!(setegid, SETEGID, (gid: libc::gid_t));
id_hook!(setregid, SETREGID, (r: libc::gid_t, e: libc::gid_t));
id_hook!(setresgid, SETRESGID, (r: libc::gid_t, e: libc::gid_t, s: libc::gid_t));
id_hook!(setgroups, SETGROUPS, (n: usize, list: *const libc::gid_t));
id_hook!(initgroups, INITGROUPS, (user: *const libc::c_char, group: libc::gid_t));

/// `setfsuid`/`setfsgid` return the previous id, not a status: re-check after any call.
#[no_mangle]
pub unsafe extern "C" fn setfsuid(uid: libc::uid_t) -> c_int {
    type F = unsafe extern "C" fn(libc::uid_t) -> c_int;
    let r = real!(SETFSUID as F, c"setfsuid", (uid) or -1);
    changed(0);
    r
}

#[no_mangle]
pub unsafe extern "C" fn setfsgid(gid: libc::gid_t) -> c_int {
    type F = unsafe extern "C" fn(libc::gid_t) -> c_int;
    let r = real!(SETFSGID as F, c"setfsgid", (gid) or -1);
    changed(0);
    r
}
