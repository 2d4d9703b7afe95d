//! What granary does for `readlink`/`readlinkat` of catalogued symlinks, and `realpath` of
//! catalogued paths that involve no symlink inside the source.

use core::ffi::{c_char, c_int};

use granary_shm::job;

use crate::detour::{self, Bypass, Detour, Guard};
use crate::lookup;
use crate::path::{self, Buf};
use crate::usermem;

/// `readlink` of `(dirfd, path)` into `buf` (`size` bytes): the link's target, truncated like
/// the kernel's (no NUL, at most `size` bytes). A bypass holds the guard across the real call.
pub fn readlink(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> Detour<isize, Option<Guard>> {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, None),
    };
    let mut pbuf = Buf::new();
    let loc = lookup::locate(&g, dirfd, path, &mut pbuf);
    if loc.rel.is_none() {
        return Detour::Bypass(Bypass::Outside, Some(g));
    }
    let why = if size == 0 || buf.is_null() {
        Bypass::BadBuffer
    } else {
        match lookup::find(&g, &loc, false) {
            Ok(f) => match g.table.link_target(&f.entry) {
                Some(target) => {
                    let n = target.len().min(size);
                    if usermem::write(buf.cast(), target.get(..n).unwrap_or(b"")) {
                        g.count(job::CATALOG_META, 1);
                        return Detour::Answer(n as isize);
                    }
                    Bypass::BadBuffer
                }
                None => Bypass::Link,
            },
            Err(why) => why,
        }
    };
    g.count(job::SOURCE_META, 1);
    Detour::Bypass(why, Some(g))
}

/// `realpath` of `path` into `resolved` (PATH_MAX bytes) when the catalog proves it: the path
/// names an entry through no symlink inside the source. The answer uses the source's real root,
/// since realpath resolves symlinks above the source too.
pub fn realpath(path: *const c_char, resolved: *mut c_char) -> Detour<*mut c_char> {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, ()),
    };
    let mut pbuf = Buf::new();
    let loc = lookup::locate(&g, libc::AT_FDCWD, path, &mut pbuf);
    let Some(rel) = loc.rel else {
        return Detour::Bypass(Bypass::Outside, ());
    };
    if loc.root_link {
        return Detour::Bypass(Bypass::RootLink, ());
    }
    let found = g
        .table
        .find(rel, false, loc.must_dir)
        .map_err(Bypass::Catalog)
        .and_then(|f| {
            if f.entry.stat.is_symlink() {
                Err(Bypass::Link)
            } else if f.validated || crate::validate::check(g.table, f.idx, &f.entry) {
                Ok(())
            } else {
                Err(Bypass::Unconfirmed)
            }
        });
    if let Err(why) = found {
        g.count(job::SOURCE_META, 1);
        return Detour::Bypass(why, ());
    }
    let mut out = Buf::new();
    let Some(with_nul) = path::real_path_of(g.table, rel, &mut out) else {
        return Detour::Bypass(Bypass::BadBuffer, ());
    };
    // realpath's contract: `resolved` has room for PATH_MAX bytes, NUL included.
    if with_nul.len() > libc::PATH_MAX as usize || !usermem::write(resolved.cast(), with_nul) {
        return Detour::Bypass(Bypass::BadBuffer, ());
    }
    g.count(job::CATALOG_META, 1);
    Detour::Answer(resolved)
}
