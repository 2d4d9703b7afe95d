//! `readlink`/`readlinkat` of catalogued symlinks, and `realpath` of catalogued paths that
//! involve no symlink inside the source.

use core::ffi::{c_char, c_int};

use granary_shm::{job, resolve, state, Resolved};

use super::{find, locate};
use crate::path::{self, Buf};
use crate::sys::{real, sys};
use crate::usermem;

type ReadlinkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> isize;
type ReadlinkatFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_char, usize) -> isize;
type RealpathFn = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
type RealpathChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> *mut c_char;

fn readlink_impl(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
    pass: impl FnOnce(c_int, *const c_char) -> isize,
) -> isize {
    let Some(g) = crate::detour::enter() else {
        return pass(dirfd, path);
    };
    let mut pbuf = Buf::new();
    let loc = locate(&g, dirfd, path, &mut pbuf);
    if loc.rel.is_none() {
        return pass(dirfd, path);
    }
    if size > 0 && !buf.is_null() {
        if let Some(f) = find(&g, &loc, false) {
            if let Some(target) = g.table.link_target(&f.entry) {
                // Truncated like the kernel's: no NUL, at most `size` bytes.
                let n = target.len().min(size);
                if usermem::write(buf.cast(), target.get(..n).unwrap_or(b"")) {
                    g.count(job::CATALOG_META, 1);
                    return n as isize;
                }
            }
        }
    }
    super::source_meta(&g, b"readlink", &loc);
    pass(dirfd, path)
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: usize) -> isize {
    readlink_impl(libc::AT_FDCWD, path, buf, size, |d, p| {
        if d == libc::AT_FDCWD && p == path {
            real!(READLINK as ReadlinkFn, (p, buf, size)
                else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
        } else {
            real!(READLINKAT as ReadlinkatFn, (d, p, buf, size)
                else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> isize {
    readlink_impl(dirfd, path, buf, size, |d, p| {
        real!(READLINKAT as ReadlinkatFn, (d, p, buf, size)
            else sys!(libc::SYS_readlinkat, d, p, buf, size) as isize)
    })
}

/// Writes the canonical path into `resolved` (PATH_MAX bytes) when the catalog proves it:
/// the path names an entry through no symlink inside the source. The answer uses the source's
/// real root, since realpath resolves symlinks above the source too.
fn realpath_answer(path: *const c_char, resolved: *mut c_char) -> Option<*mut c_char> {
    let g = crate::detour::enter()?;
    let mut pbuf = Buf::new();
    let loc = locate(&g, libc::AT_FDCWD, path, &mut pbuf);
    let rel = loc.rel?;
    if loc.root_link {
        return None;
    }
    let Resolved::Entry(idx, e) = resolve(g.table, rel, false) else {
        super::source_meta(&g, b"realpath", &loc);
        return None;
    };
    let fine = !e.stat.is_symlink()
        && (!loc.must_dir || e.stat.is_dir())
        && !state::is_void(state::state_of(g.table.state(idx)))
        && super::ancestors_live(g.table, idx)
        && (granary_shm::lifecycle::is_validated(g.table, idx)
            || crate::validate::check(g.table, idx, &e));
    if !fine {
        super::source_meta(&g, b"realpath", &loc);
        return None;
    }
    let mut out = Buf::new();
    let p = path::real_path_of(g.table, rel, &mut out)?;
    // realpath's contract: `resolved` has room for PATH_MAX bytes, NUL included.
    if p.len() >= libc::PATH_MAX as usize {
        return None;
    }
    // SAFETY: `real_path_of` wrote a NUL right after the `p.len()` bytes it returned.
    let with_nul = unsafe { core::slice::from_raw_parts(p.as_ptr(), p.len() + 1) };
    if !usermem::write(resolved.cast(), with_nul) {
        return None;
    }
    g.count(job::CATALOG_META, 1);
    Some(resolved)
}

#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // A NULL buffer means realpath allocates: that is libc's job, not a hook's.
    if !resolved.is_null() {
        if let Some(r) = realpath_answer(path, resolved) {
            return r;
        }
    }
    real!(REALPATH as RealpathFn, c"realpath", (path, resolved) or core::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    resolved_len: usize,
) -> *mut c_char {
    if !resolved.is_null() && resolved_len >= libc::PATH_MAX as usize {
        if let Some(r) = realpath_answer(path, resolved) {
            return r;
        }
    }
    real!(REALPATH_CHK as RealpathChkFn, c"__realpath_chk", (path, resolved, resolved_len)
        or core::ptr::null_mut())
}
