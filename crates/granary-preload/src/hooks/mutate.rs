//! The C entry points of the path calls that change the source: `unlink`, `rename`, `mkdir`,
//! `link`, `symlink`, `truncate`, `chmod`, `chown`, `utime*`, `*xattr`, `mknod` and their `*at`
//! forms. What granary does for them is `ops::mutate`: the real call runs, and whatever it
//! changed stops being answered from the catalog.

use core::ffi::{c_char, c_int, c_uint, c_void};

use crate::ops::mutate::{
    at_follow, attrs, fd_changed, mutating, mutating_all, names, perms, Target, Void, CONTENT,
    CONTENT_NOFOLLOW, REMOVED,
};
use crate::sys::{real, sys};

type P1 = unsafe extern "C" fn(*const c_char) -> c_int;
type P2 = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;
type AtP = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        names(REMOVED),
        || real!(UNLINK as P1, (path) else sys!(libc::SYS_unlinkat, libc::AT_FDCWD, path, 0) as c_int),
    )
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    mutating(dirfd, path, names(REMOVED), || {
        real!(UNLINKAT as AtP, (dirfd, path, flags)
            else sys!(libc::SYS_unlinkat, dirfd, path, flags) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    mutating(libc::AT_FDCWD, path, names(REMOVED), || {
        real!(RMDIR as P1, (path)
            else sys!(libc::SYS_unlinkat, libc::AT_FDCWD, path, libc::AT_REMOVEDIR) as c_int)
    })
}

/// `rename` family: the old name is removed (its entry and everything below it gone), the new
/// one replaced.
fn rename_impl(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let targets = [
        Target {
            dirfd: olddir,
            path: old,
            effect: names(REMOVED),
        },
        Target {
            dirfd: newdir,
            path: new,
            effect: names(REMOVED),
        },
    ];
    mutating_all(&targets, call)
}

#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    rename_impl(libc::AT_FDCWD, old, libc::AT_FDCWD, new, || {
        real!(RENAME as P2, (old, new)
            else sys!(libc::SYS_renameat2, libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) as c_int)
    })
}

type RenameatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char) -> c_int;
type Renameat2Fn =
    unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn renameat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> c_int {
    rename_impl(olddir, old, newdir, new, || {
        real!(RENAMEAT as RenameatFn, (olddir, old, newdir, new)
            else sys!(libc::SYS_renameat2, olddir, old, newdir, new, 0) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_uint,
) -> c_int {
    rename_impl(olddir, old, newdir, new, || {
        real!(RENAMEAT2 as Renameat2Fn, (olddir, old, newdir, new, flags)
            else sys!(libc::SYS_renameat2, olddir, old, newdir, new, flags) as c_int)
    })
}

type MkdirFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type MkdiratFn = unsafe extern "C" fn(c_int, *const c_char, libc::mode_t) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: libc::mode_t) -> c_int {
    mutating(libc::AT_FDCWD, path, names(None), || {
        real!(MKDIR as MkdirFn, (path, mode)
            else sys!(libc::SYS_mkdirat, libc::AT_FDCWD, path, mode) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: libc::mode_t) -> c_int {
    mutating(dirfd, path, names(None), || {
        real!(MKDIRAT as MkdiratFn, (dirfd, path, mode)
            else sys!(libc::SYS_mkdirat, dirfd, path, mode) as c_int)
    })
}

type MknodFn = unsafe extern "C" fn(*const c_char, libc::mode_t, libc::dev_t) -> c_int;
type MknodatFn = unsafe extern "C" fn(c_int, *const c_char, libc::mode_t, libc::dev_t) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: libc::mode_t, dev: libc::dev_t) -> c_int {
    mutating(libc::AT_FDCWD, path, names(None), || {
        real!(MKNOD as MknodFn, (path, mode, dev)
            else sys!(libc::SYS_mknodat, libc::AT_FDCWD, path, mode, dev) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: libc::mode_t,
    dev: libc::dev_t,
) -> c_int {
    mutating(dirfd, path, names(None), || {
        real!(MKNODAT as MknodatFn, (dirfd, path, mode, dev)
            else sys!(libc::SYS_mknodat, dirfd, path, mode, dev) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    mutating(libc::AT_FDCWD, path, names(None), || {
        real!(SYMLINK as P2, (target, path)
            else sys!(libc::SYS_symlinkat, target, libc::AT_FDCWD, path) as c_int)
    })
}

type SymlinkatFn = unsafe extern "C" fn(*const c_char, c_int, *const c_char) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    mutating(dirfd, path, names(None), || {
        real!(SYMLINKAT as SymlinkatFn, (target, dirfd, path)
            else sys!(libc::SYS_symlinkat, target, dirfd, path) as c_int)
    })
}

/// `link` also changes the linked file (its link count and ctime).
fn link_impl(
    olddir: c_int,
    old: *const c_char,
    follow_old: bool,
    newdir: c_int,
    new: *const c_char,
    call: impl FnOnce() -> c_int,
) -> c_int {
    let targets = [
        Target {
            dirfd: olddir,
            path: old,
            effect: attrs(Some((follow_old, Void::Stale))),
        },
        Target {
            dirfd: newdir,
            path: new,
            effect: names(None),
        },
    ];
    mutating_all(&targets, call)
}

#[no_mangle]
pub unsafe extern "C" fn link(old: *const c_char, new: *const c_char) -> c_int {
    link_impl(libc::AT_FDCWD, old, false, libc::AT_FDCWD, new, || {
        real!(LINK as P2, (old, new)
            else sys!(libc::SYS_linkat, libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) as c_int)
    })
}

type LinkatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn linkat(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
    link_impl(olddir, old, follow, newdir, new, || {
        real!(LINKAT as LinkatFn, (olddir, old, newdir, new, flags)
            else sys!(libc::SYS_linkat, olddir, old, newdir, new, flags) as c_int)
    })
}

type TruncateFn = unsafe extern "C" fn(*const c_char, libc::off_t) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: libc::off_t) -> c_int {
    mutating(libc::AT_FDCWD, path, attrs(CONTENT), || {
        real!(TRUNCATE as TruncateFn, (path, len)
            else sys!(libc::SYS_truncate, path, len) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: libc::off_t) -> c_int {
    mutating(libc::AT_FDCWD, path, attrs(CONTENT), || {
        real!(TRUNCATE64 as TruncateFn, (path, len)
            else sys!(libc::SYS_truncate, path, len) as c_int)
    })
}

type ChmodFn = unsafe extern "C" fn(*const c_char, libc::mode_t) -> c_int;
type FchmodatFn = unsafe extern "C" fn(c_int, *const c_char, libc::mode_t, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: libc::mode_t) -> c_int {
    mutating(libc::AT_FDCWD, path, perms(CONTENT), || {
        real!(CHMOD as ChmodFn, (path, mode)
            else sys!(libc::SYS_fchmodat, libc::AT_FDCWD, path, mode) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: libc::mode_t,
    flags: c_int,
) -> c_int {
    mutating(dirfd, path, perms(at_follow(flags)), || {
        real!(FCHMODAT as FchmodatFn, (dirfd, path, mode, flags)
            else sys!(libc::SYS_fchmodat, dirfd, path, mode) as c_int)
    })
}

type ChownFn = unsafe extern "C" fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int;
type FchownatFn =
    unsafe extern "C" fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    mutating(libc::AT_FDCWD, path, perms(CONTENT), || {
        real!(CHOWN as ChownFn, (path, uid, gid)
            else sys!(libc::SYS_fchownat, libc::AT_FDCWD, path, uid, gid, 0) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    mutating(libc::AT_FDCWD, path, perms(CONTENT_NOFOLLOW), || {
        real!(LCHOWN as ChownFn, (path, uid, gid)
            else sys!(libc::SYS_fchownat, libc::AT_FDCWD, path, uid, gid,
                      libc::AT_SYMLINK_NOFOLLOW) as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    mutating(dirfd, path, perms(at_follow(flags)), || {
        real!(FCHOWNAT as FchownatFn, (dirfd, path, uid, gid, flags)
            else sys!(libc::SYS_fchownat, dirfd, path, uid, gid, flags) as c_int)
    })
}

type UtimeFn = unsafe extern "C" fn(*const c_char, *const c_void) -> c_int;
type FutimesatFn = unsafe extern "C" fn(c_int, *const c_char, *const c_void) -> c_int;
type UtimensatFn = unsafe extern "C" fn(c_int, *const c_char, *const c_void, c_int) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const c_void) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        attrs(CONTENT),
        || real!(UTIME as UtimeFn, c"utime", (path, times) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, times: *const c_void) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        attrs(CONTENT),
        || real!(UTIMES as UtimeFn, c"utimes", (path, times) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, times: *const c_void) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        attrs(CONTENT_NOFOLLOW),
        || real!(LUTIMES as UtimeFn, c"lutimes", (path, times) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimesat(
    dirfd: c_int,
    path: *const c_char,
    times: *const c_void,
) -> c_int {
    if path.is_null() {
        // futimesat(fd, NULL, …) changes the fd's file.
        let r = real!(FUTIMESAT as FutimesatFn, c"futimesat", (dirfd, path, times) or -1);
        if r == 0 {
            fd_changed(dirfd, false);
        }
        return r;
    }
    mutating(
        dirfd,
        path,
        attrs(CONTENT),
        || real!(FUTIMESAT as FutimesatFn, c"futimesat", (dirfd, path, times) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const c_void,
    flags: c_int,
) -> c_int {
    let call = || {
        real!(UTIMENSAT as UtimensatFn, (dirfd, path, times, flags)
            else sys!(libc::SYS_utimensat, dirfd, path, times, flags) as c_int)
    };
    if path.is_null() || crate::ops::path::bytes(path).is_some_and(|p| p.is_empty()) {
        // utimensat(fd, NULL or "" with AT_EMPTY_PATH, …) is futimens.
        let r = call();
        if r == 0 {
            fd_changed(dirfd, false);
        }
        return r;
    }
    mutating(dirfd, path, attrs(at_follow(flags)), call)
}

type SetxattrFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const c_void, usize, c_int) -> c_int;
type RemovexattrFn = unsafe extern "C" fn(*const c_char, *const c_char) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn setxattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        perms(CONTENT),
        || real!(SETXATTR as SetxattrFn, c"setxattr", (path, name, value, size, flags) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn lsetxattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        perms(CONTENT_NOFOLLOW),
        || real!(LSETXATTR as SetxattrFn, c"lsetxattr", (path, name, value, size, flags) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn removexattr(path: *const c_char, name: *const c_char) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        perms(CONTENT),
        || real!(REMOVEXATTR as RemovexattrFn, c"removexattr", (path, name) or -1),
    )
}

#[no_mangle]
pub unsafe extern "C" fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int {
    mutating(
        libc::AT_FDCWD,
        path,
        perms(CONTENT_NOFOLLOW),
        || real!(LREMOVEXATTR as RemovexattrFn, c"lremovexattr", (path, name) or -1),
    )
}
