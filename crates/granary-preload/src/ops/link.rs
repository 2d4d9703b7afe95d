//! What granary does for `readlink`/`readlinkat` of catalogued symlinks, and `realpath` of
//! catalogued paths that involve no symlink inside the source.

use core::ffi::{c_char, c_int};

use granary_shm::job;

use crate::ops::detour::{self, Bypass, Detour, Guard};
use crate::ops::lookup;
use crate::ops::path::{self, Buf};
use crate::sys::usermem;

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
            } else if f.validated || crate::ops::validate::check(g.table, f.idx, &f.entry) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture;

    #[test]
    fn readlink_and_realpath_from_the_catalog() {
        let f = fixture();
        let mut buf = [0 as c_char; 64];
        let l = f.path("link");
        let Detour::Answer(n) = readlink(libc::AT_FDCWD, l.as_ptr(), buf.as_mut_ptr(), 64) else {
            panic!("a catalogued symlink");
        };
        let got: Vec<u8> = buf[..n as usize].iter().map(|&c| c as u8).collect();
        assert_eq!(got, b"a.txt");
        // Truncated as the kernel truncates, without a NUL.
        let Detour::Answer(2) = readlink(libc::AT_FDCWD, l.as_ptr(), buf.as_mut_ptr(), 2) else {
            panic!("truncated to the buffer");
        };
        let a = f.path("a.txt");
        // (A bypass holds the guard until the real call is made: dropped at once here.)
        assert!(matches!(
            readlink(libc::AT_FDCWD, a.as_ptr(), buf.as_mut_ptr(), 64),
            Detour::Bypass(Bypass::Link, Some(_))
        ));

        let mut out = [0 as c_char; libc::PATH_MAX as usize];
        let p = f.path(".//a.txt");
        let r = match realpath(p.as_ptr(), out.as_mut_ptr()) {
            Detour::Answer(r) => r,
            Detour::Bypass(why, ()) => panic!("a catalogued path passed through: {why:?}"),
            Detour::Fail(e) => panic!("a catalogued path failed: {e}"),
        };
        // SAFETY: realpath's answer is a NUL-terminated string in `out`.
        let got = unsafe { core::ffi::CStr::from_ptr(r) };
        assert_eq!(got.to_bytes(), f.path("a.txt").as_bytes());
        // Through a symlink inside the source: the kernel's to resolve.
        assert!(matches!(
            realpath(l.as_ptr(), out.as_mut_ptr()),
            Detour::Bypass(Bypass::Link, ())
        ));
    }
}
