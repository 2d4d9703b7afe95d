//! What granary does for reading extended attributes: `getxattr`/`lgetxattr` and
//! `listxattr`/`llistxattr` of a dataset path, and `fgetxattr`/`flistxattr` of a copy's fd.
//!
//! From the catalog, only what it proves (`granary_shm::xattr`): for a live entry validated in
//! this attach whose path listed no attribute at the walk, on the device the agent probed this
//! attach, reading one of `xattr::NAMES` fails with the probe's errno (`ENODATA`, or
//! `EOPNOTSUPP` on a file system without ACLs), and its listing is empty (when the agent's
//! listing hid nothing from this caller: `trusted.*` is listed to `CAP_SYS_ADMIN` only). Every
//! other call passes through, its errors the kernel's own.
//!
//! A copy's fd is the tier's file, whose attributes are not the source's: what the catalog
//! cannot answer for it is asked of the source path (as `fstatfs` is).

use core::ffi::{c_char, c_int, c_void};

use granary_shm::job;

use crate::fds::fdtable::{self, FdKind};
use crate::fds::tracked;
use crate::ops::detour::{self, Bypass, Detour, Guard};
use crate::ops::lookup;
use crate::ops::path::{self, Buf};
use crate::sys::{self, sys};

/// `getxattr` (`follow`) or `lgetxattr` of `path`'s attribute `name`: the catalog's failure,
/// or why the real call must answer (the guard held across it).
pub fn get(path: *const c_char, name: *const c_char, follow: bool) -> Detour<isize, Option<Guard>> {
    on_path(path, follow, |g, stat| absent_errno(g, stat, name).map(Err))
}

/// `listxattr` (`follow`) or `llistxattr` of `path`: an empty list from the catalog, or why the
/// real call must answer.
pub fn list(path: *const c_char, follow: bool) -> Detour<isize, Option<Guard>> {
    on_path(path, follow, |g, stat| {
        lists_nothing(g, stat).then_some(Ok(0))
    })
}

/// A read of `path`'s attributes: `catalog`'s answer for a catalogued entry (`Ok`: the value,
/// `Err`: the errno), or why the real call must answer (the guard held across it).
fn on_path(
    path: *const c_char,
    follow: bool,
    catalog: impl FnOnce(&Guard, &granary_shm::StatRec) -> Option<Result<isize, c_int>>,
) -> Detour<isize, Option<Guard>> {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, None),
    };
    let mut buf = Buf::new();
    let loc = lookup::locate(&g, libc::AT_FDCWD, path, &mut buf);
    if loc.rel.is_none() {
        return Detour::Bypass(Bypass::Outside, Some(g));
    }
    let why = match lookup::find(&g, &loc, follow) {
        Ok(f) => match catalog(&g, &f.entry.stat) {
            Some(answer) => {
                g.count(job::CATALOG_META, 1);
                return match answer {
                    Ok(v) => Detour::Answer(v),
                    Err(e) => Detour::Fail(e),
                };
            }
            None => Bypass::Xattrs,
        },
        Err(why) => why,
    };
    g.count(job::SOURCE_META, 1);
    Detour::Bypass(why, Some(g))
}

/// `fgetxattr` of `fd`: for a copy's fd, the catalog's failure or the source path's answer;
/// any other fd is the kernel's.
pub fn fget(fd: c_int, name: *const c_char, value: *mut c_void, size: usize) -> Detour<isize> {
    on_copy(
        fd,
        |g, stat| absent_errno(g, stat, name),
        |p| sys!(libc::SYS_getxattr, p, name, value, size) as isize,
    )
}

/// `flistxattr` of `fd`: as `fget`.
pub fn flist(fd: c_int, list: *mut c_char, size: usize) -> Detour<isize> {
    on_copy(
        fd,
        |g, stat| lists_nothing(g, stat).then_some(0),
        |p| sys!(libc::SYS_listxattr, p, list, size) as isize,
    )
}

/// A read of `fd`'s attributes: when `fd` is a copy, `catalog`'s answer (`Some(0)`: an empty
/// listing, `Some(errno)`: a failure) or else `by_path` on the source path; otherwise the
/// kernel's call on the fd.
fn on_copy(
    fd: c_int,
    catalog: impl FnOnce(&Guard, &granary_shm::StatRec) -> Option<c_int>,
    by_path: impl FnOnce(*const c_char) -> isize,
) -> Detour<isize> {
    let Some(t) = tracked::get(fd) else {
        return Detour::Bypass(Bypass::Untracked, ());
    };
    // The source's own file, a real directory, a file extracted from a pack: the fd describes
    // what the program opened.
    if !matches!(t.kind, FdKind::Tier(_)) {
        return Detour::Bypass(Bypass::OnSource, ());
    }
    let Some(tb) = detour::table() else {
        return Detour::Bypass(Bypass::NoTable, ());
    };
    // Still our copy (not a number closed and reused behind our back)?
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 || st.st_ino != tb.copy_identity(t.entry).0 {
        fdtable::take(fd);
        return Detour::Bypass(Bypass::Untracked, ());
    }
    if let Ok(g) = detour::enter() {
        if let Some(e) = lookup::entry(g.table, t.entry) {
            match catalog(&g, &e.stat) {
                Some(0) => {
                    g.count(job::CATALOG_META, 1);
                    return Detour::Answer(0);
                }
                Some(errno) => {
                    g.count(job::CATALOG_META, 1);
                    return Detour::Fail(errno);
                }
                None => {}
            }
        }
    }
    let mut buf = Buf::new();
    match path::entry_path(tb, t.entry, &mut buf) {
        Some(p) => Detour::Answer(by_path(p)),
        None => Detour::Bypass(Bypass::OnSource, ()),
    }
}

/// The errno reading attribute `name` of the file `stat` describes gives, if the catalog
/// proves it.
fn absent_errno(g: &Guard, stat: &granary_shm::StatRec, name: *const c_char) -> Option<c_int> {
    let name = path::bytes(name)?;
    g.table.xattr_absent()?.errno_for(stat, name)
}

/// True if the file `stat` describes lists no attribute for this caller, as the catalog proves.
fn lists_nothing(g: &Guard, stat: &granary_shm::StatRec) -> bool {
    match g.table.xattr_absent() {
        Some(a) if a.lists_nothing(stat) => a.privileged || !sys::has_cap_sys_admin(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture, PLACED, TAGGED, UNPLACED};
    use granary_shm::Miss;

    /// The kernel's own answer for `(path, name)`: `Err(errno)` or the value's length.
    fn kernel(
        path: &core::ffi::CStr,
        name: &core::ffi::CStr,
        follow: bool,
    ) -> Result<isize, c_int> {
        let nr = if follow {
            libc::SYS_getxattr
        } else {
            libc::SYS_lgetxattr
        };
        let r = sys!(nr, path.as_ptr(), name.as_ptr(), 0usize, 0usize) as isize;
        if r < 0 {
            Err(sys::errno())
        } else {
            Ok(r)
        }
    }

    fn tagged_on_source() -> bool {
        let f = fixture();
        kernel(&f.path(TAGGED), c"user.granary", false) == Ok(3)
    }

    #[test]
    fn absent_attributes_are_the_kernels_answer_from_the_catalog() {
        let f = fixture();
        for (rel, follow) in [
            (UNPLACED, true),
            ("train", true),
            ("link", false),
            ("link", true),
        ] {
            let p = f.path(rel);
            for name in granary_shm::xattr::NAMES {
                let n = std::ffi::CString::new(name).unwrap();
                let want = kernel(&p, &n, follow);
                match get(p.as_ptr(), n.as_ptr(), follow) {
                    Detour::Fail(e) => assert_eq!(Err(e), want, "{rel} {n:?}"),
                    Detour::Bypass(why, _) => {
                        // Only a name the probe found no failure for passes through.
                        assert_eq!(why, Bypass::Xattrs, "{rel} {n:?}");
                        assert!(want.is_ok() || !matches!(want, Err(libc::ENODATA)));
                    }
                    Detour::Answer(r) => panic!("{rel} {n:?}: answered {r}"),
                }
            }
            if crate::sys::has_cap_sys_admin() == f.table.xattr_absent().unwrap().privileged {
                assert!(
                    matches!(list(p.as_ptr(), follow), Detour::Answer(0)),
                    "{rel}"
                );
            }
        }
    }

    #[test]
    fn what_the_catalog_does_not_prove_passes_through() {
        let f = fixture();
        let why = |rel: &str, name: &core::ffi::CStr| match get(
            f.path(rel).as_ptr(),
            name.as_ptr(),
            true,
        ) {
            Detour::Bypass(why, _) => why,
            _ => panic!("{rel} {name:?} answered"),
        };
        // A name the catalog does not answer, on a file without attributes.
        assert_eq!(why(UNPLACED, c"user.granary"), Bypass::Xattrs);
        // A file changed by the program, a missing one.
        let acl = c"system.posix_acl_access";
        assert_eq!(why("changed.txt", acl), Bypass::Catalog(Miss::Void));
        assert_eq!(why("train/none", acl), Bypass::Catalog(Miss::NotCatalogued));
        if tagged_on_source() {
            // A file with attributes: every question is the kernel's.
            assert_eq!(why(TAGGED, acl), Bypass::Xattrs);
            let p = f.path(TAGGED);
            assert!(matches!(
                list(p.as_ptr(), true),
                Detour::Bypass(Bypass::Xattrs, _)
            ));
        }
    }

    #[test]
    fn a_copys_fd_reads_the_sources_attributes() {
        let f = fixture();
        let open = |rel: &str| {
            let p = f.path(rel);
            match crate::ops::open::open(
                libc::AT_FDCWD,
                p.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
                None,
            ) {
                Detour::Answer(fd) => fd,
                _ => panic!("{rel}: a placed file opens its copy"),
            }
        };
        let fd = open(PLACED);
        assert!(matches!(fdtable::peek(fd).unwrap().kind, FdKind::Tier(_)));
        let acl = c"system.posix_acl_access";
        let want = kernel(&f.path(PLACED), acl, true);
        match fget(fd, acl.as_ptr(), core::ptr::null_mut(), 0) {
            Detour::Fail(e) => assert_eq!(Err(e), want),
            Detour::Answer(r) => assert_eq!(Ok(r), want),
            Detour::Bypass(why, ()) => panic!("passed through: {why:?}"),
        }
        fdtable::take(fd);
        sys::raw_close(fd);
        if !tagged_on_source() {
            return;
        }
        // The copy has no attribute; the source has one, which the fd must show.
        let fd = open(TAGGED);
        let mut v = [0u8; 8];
        let got = fget(fd, c"user.granary".as_ptr(), v.as_mut_ptr().cast(), v.len());
        assert!(matches!(got, Detour::Answer(3)));
        assert_eq!(&v[..3], b"yes");
        let mut names = [0u8; 64];
        let Detour::Answer(n) = flist(fd, names.as_mut_ptr().cast(), names.len()) else {
            panic!("a copy's listing is the source's");
        };
        assert!(names[..n as usize].starts_with(b"user.granary\0"));
        fdtable::take(fd);
        sys::raw_close(fd);
    }
}
