//! The C entry points of directory streams: `opendir`, `readdir`, `readdir64`, `closedir`,
//! `rewinddir`, `telldir`, `seekdir`. What granary does for them is `ops::dir`; here is the
//! `struct dirent64` a listing from the catalog is handed out in.

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_long};

use crate::fds::fdtable::MAX_DIR_FDS;
use crate::ops::detour::Detour;
use crate::ops::{dir, fd};
use crate::sys::real;

type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut libc::DIR;
type ReaddirFn = unsafe extern "C" fn(*mut libc::DIR) -> *mut libc::dirent64;
type ClosedirFn = unsafe extern "C" fn(*mut libc::DIR) -> c_int;
type RewinddirFn = unsafe extern "C" fn(*mut libc::DIR);
type TelldirFn = unsafe extern "C" fn(*mut libc::DIR) -> c_long;
type SeekdirFn = unsafe extern "C" fn(*mut libc::DIR, c_long);

/// One `struct dirent64` per trackable directory fd: `readdir` returns a pointer that stays
/// valid until the next `readdir` on the same stream, which is all POSIX promises.
struct Dirents(UnsafeCell<[libc::dirent64; MAX_DIR_FDS]>);

// SAFETY: slot `fd` is only written by `readdir` on the stream owning `fd`; concurrent readdir
// on one stream is undefined behaviour for the caller already.
unsafe impl Sync for Dirents {}

const EMPTY: libc::dirent64 = libc::dirent64 {
    d_ino: 0,
    d_off: 0,
    d_reclen: 0,
    d_type: 0,
    d_name: [0; 256],
};
static DIRENTS: Dirents = Dirents(UnsafeCell::new([EMPTY; MAX_DIR_FDS]));

fn stream_fd(dirp: *mut libc::DIR) -> c_int {
    if dirp.is_null() {
        return -1;
    }
    // SAFETY: a non-null DIR* owned by the caller; dirfd only reads it.
    unsafe { libc::dirfd(dirp) }
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    dir::opendir(
        path,
        |p| real!(OPENDIR as OpendirFn, c"opendir", (p) or core::ptr::null_mut()),
        stream_fd,
    )
}

/// `l` in fd `fd`'s `struct dirent64`, as the kernel's `getdents64` fills one.
fn dirent(fd: c_int, l: &dir::Listed) -> *mut libc::dirent64 {
    let Some(slot) = usize::try_from(fd).ok().filter(|&i| i < MAX_DIR_FDS) else {
        return core::ptr::null_mut();
    };
    // SAFETY: in bounds; see `Dirents` for why no one else writes this slot now.
    let d = unsafe { &mut (*DIRENTS.0.get())[slot] };
    let n = l.name.len().min(255);
    d.d_name = [0; 256];
    for (dst, &b) in d.d_name.iter_mut().zip(l.name.iter().take(n)) {
        *dst = b as c_char;
    }
    d.d_ino = l.ino;
    d.d_off = l.off;
    // Offset of d_name (19) + name + NUL, rounded up to 8, as the kernel's getdents64 does.
    d.d_reclen = ((19 + n + 1 + 7) & !7) as u16;
    d.d_type = l.dtype;
    d as *mut libc::dirent64
}

fn readdir_of(
    dirp: *mut libc::DIR,
    real: impl FnOnce() -> *mut libc::dirent64,
) -> *mut libc::dirent64 {
    let fd = stream_fd(dirp);
    match dir::readdir(fd) {
        Detour::Answer(Some(l)) => dirent(fd, &l),
        // The end of a listing leaves errno alone, as readdir does.
        Detour::Answer(None) | Detour::Fail(_) => core::ptr::null_mut(),
        Detour::Bypass(why, ()) => {
            why.log_fd(b"readdir", fd);
            real()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn readdir(dirp: *mut libc::DIR) -> *mut libc::dirent {
    readdir_of(
        dirp,
        || real!(READDIR as ReaddirFn, c"readdir", (dirp) or core::ptr::null_mut()),
    )
    .cast()
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(dirp: *mut libc::DIR) -> *mut libc::dirent64 {
    readdir_of(
        dirp,
        || real!(READDIR64 as ReaddirFn, c"readdir64", (dirp) or core::ptr::null_mut()),
    )
}

// dirent and dirent64 are the same record on our 64-bit targets.
const _: () =
    assert!(core::mem::size_of::<libc::dirent>() == core::mem::size_of::<libc::dirent64>());

#[no_mangle]
pub unsafe extern "C" fn closedir(dirp: *mut libc::DIR) -> c_int {
    // closedir closes its fd inside libc, where we cannot see it.
    let closing = fd::closing(stream_fd(dirp));
    let r = real!(CLOSEDIR as ClosedirFn, c"closedir", (dirp) or -1);
    fd::closed(closing);
    r
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(dirp: *mut libc::DIR) {
    dir::rewind(stream_fd(dirp));
    real!(REWINDDIR as RewinddirFn, c"rewinddir", (dirp) or ())
}

#[no_mangle]
pub unsafe extern "C" fn telldir(dirp: *mut libc::DIR) -> c_long {
    if let Some(pos) = dir::tell(stream_fd(dirp)) {
        return pos;
    }
    real!(TELLDIR as TelldirFn, c"telldir", (dirp) or -1)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(dirp: *mut libc::DIR, loc: c_long) {
    if dir::seek(stream_fd(dirp), loc) {
        return;
    }
    real!(SEEKDIR as SeekdirFn, c"seekdir", (dirp, loc) or ())
}
