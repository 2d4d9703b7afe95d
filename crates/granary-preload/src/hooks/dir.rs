//! Listings of catalogued directories from the catalog: `opendir` opens the real directory (so
//! the fd is the directory for every other call: `*at`, `fchdir`, `fstat`, `fsync`, `flock`),
//! tracks its fd, and `readdir` on a stream whose fd we track walks the entry's children
//! instead of reading the source. Streams on any other fd are libc's.

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_long};
use core::sync::atomic::Ordering;

use granary_shm::{job, state};

use super::{find, locate};
use crate::fdtable::{self, FdKind, MAX_DIR_FDS};
use crate::path::Buf;
use crate::sys::{real, KeepErrno};

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
    let pass = || real!(OPENDIR as OpendirFn, c"opendir", (path) or core::ptr::null_mut());
    let Some(g) = crate::detour::enter() else {
        return pass();
    };
    let mut buf = Buf::new();
    let loc = locate(&g, libc::AT_FDCWD, path, &mut buf);
    let found = loc.rel.and_then(|_| find(&g, &loc, true));
    let d = match &found {
        // A tree that exists only in the pack: a stream on the stand-in directory.
        Some(f) if f.entry.stat.is_dir() && g.table.pack_mount() => crate::packed::with_empty_dir(
            &g,
            |p| real!(OPENDIR as OpendirFn, c"opendir", (p) or core::ptr::null_mut()),
        )
        .unwrap_or(core::ptr::null_mut()),
        _ => pass(),
    };
    let fd = stream_fd(d);
    match found {
        Some(f) if f.entry.stat.is_dir() && fd >= 0 => {
            let _keep = KeepErrno::new();
            if super::open::track_dir(fd, f.idx, libc::O_CLOEXEC) {
                g.count(job::CATALOG_META, 1);
            } else {
                fdtable::take(fd);
            }
        }
        _ => {
            if loc.rel.is_some() {
                super::source_meta(&g, b"opendir", &loc);
            }
            fdtable::take(fd);
        }
    }
    d
}

/// The next catalog entry of the stream on tracked fd `fd`, or `None` at the end.
fn next_entry(fd: c_int, dir_entry: u32) -> Option<*mut libc::dirent64> {
    let table = crate::detour::table()?;
    let pos_cell = fdtable::dir_pos(fd)?;
    let pos = pos_cell.load(Ordering::Relaxed);
    let e = table.entry(dir_entry)?;
    let (name, ino, dtype): (&[u8], u64, u8) = match pos {
        0 => (b".", e.stat.ino, libc::DT_DIR),
        1 => {
            let ino = if dir_entry == 0 {
                table.root_parent_ino()
            } else {
                table.entry(e.parent)?.stat.ino
            };
            (b"..", ino, libc::DT_DIR)
        }
        _ => {
            let i = pos - 2;
            if i >= e.child_count {
                return None;
            }
            let c = table.entry(e.first_child.checked_add(i)?)?;
            (table.name(&c)?, c.stat.ino, c.stat.dirent_type())
        }
    };
    let slot = usize::try_from(fd).ok().filter(|&i| i < MAX_DIR_FDS)?;
    // SAFETY: in bounds; see `Dirents` for why no one else writes this slot now.
    let d = unsafe { &mut (*DIRENTS.0.get())[slot] };
    let n = name.len().min(255);
    d.d_name = [0; 256];
    for (dst, &b) in d.d_name.iter_mut().zip(name.iter().take(n)) {
        *dst = b as c_char;
    }
    d.d_ino = ino;
    d.d_off = pos as i64 + 1;
    // Offset of d_name (19) + name + NUL, rounded up to 8, as the kernel's getdents64 does.
    d.d_reclen = ((19 + n + 1 + 7) & !7) as u16;
    d.d_type = dtype;
    pos_cell.store(pos + 1, Ordering::Relaxed);
    Some(d as *mut libc::dirent64)
}

fn readdir_impl(
    dirp: *mut libc::DIR,
    pass: impl FnOnce() -> *mut libc::dirent64,
) -> *mut libc::dirent64 {
    let fd = stream_fd(dirp);
    let Some(t) = crate::tracked::get(fd) else {
        return pass();
    };
    if t.kind != FdKind::Dir {
        return pass();
    }
    let Some(g) = crate::detour::enter_any_creds() else {
        return pass();
    };
    // At the start of a listing, the catalog answers only for a directory the program has not
    // changed (once a listing started, it goes on from the catalog: POSIX leaves names added
    // or removed since opendir unspecified).
    if fdtable::dir_pos(fd).is_some_and(|p| p.load(Ordering::Relaxed) == 0) {
        let live = !state::is_void(state::state_of(g.table.state(t.entry)))
            && super::ancestors_live(g.table, t.entry);
        if !live {
            fdtable::take(fd);
            return pass();
        }
    }
    // The end of a listing leaves errno alone, as readdir does.
    next_entry(fd, t.entry).unwrap_or(core::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn readdir(dirp: *mut libc::DIR) -> *mut libc::dirent {
    readdir_impl(
        dirp,
        || real!(READDIR as ReaddirFn, c"readdir", (dirp) or core::ptr::null_mut()),
    )
    .cast()
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(dirp: *mut libc::DIR) -> *mut libc::dirent64 {
    readdir_impl(
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
    let t = crate::release::before(stream_fd(dirp));
    let r = real!(CLOSEDIR as ClosedirFn, c"closedir", (dirp) or -1);
    crate::release::after(t);
    r
}

fn tracked_dir(dirp: *mut libc::DIR) -> Option<c_int> {
    let fd = stream_fd(dirp);
    (crate::tracked::get(fd)?.kind == FdKind::Dir).then_some(fd)
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(dirp: *mut libc::DIR) {
    if let Some(p) = tracked_dir(dirp).and_then(fdtable::dir_pos) {
        p.store(0, Ordering::Relaxed);
    }
    real!(REWINDDIR as RewinddirFn, c"rewinddir", (dirp) or ())
}

#[no_mangle]
pub unsafe extern "C" fn telldir(dirp: *mut libc::DIR) -> c_long {
    if let Some(p) = tracked_dir(dirp).and_then(fdtable::dir_pos) {
        return p.load(Ordering::Relaxed) as c_long;
    }
    real!(TELLDIR as TelldirFn, c"telldir", (dirp) or -1)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(dirp: *mut libc::DIR, loc: c_long) {
    if let Some(p) = tracked_dir(dirp).and_then(fdtable::dir_pos) {
        if let Ok(v) = u32::try_from(loc) {
            p.store(v, Ordering::Relaxed);
        }
        return;
    }
    real!(SEEKDIR as SeekdirFn, c"seekdir", (dirp, loc) or ())
}
