//! What granary does for directory listings: `opendir` opens the real directory (so the fd is
//! the directory for every other call: `*at`, `fchdir`, `fstat`, `fsync`, `flock`) and tracks
//! its fd when the catalog lists it; `readdir` on a stream whose fd is tracked walks the entry's
//! children instead of reading the source, with the position kept per fd (`telldir`,
//! `seekdir`, `rewinddir`). Streams on any other fd are libc's.

use core::ffi::{c_char, c_int, c_long};
use core::sync::atomic::{AtomicU32, Ordering};

use granary_shm::job;

use crate::fds::fdtable::{self, FdKind};
use crate::ops::detour::{self, Bypass, Detour};
use crate::ops::lookup;
use crate::ops::path::Buf;
use crate::sys::KeepErrno;

/// `opendir(path)`; `real` opens a directory stream (on `path`, or on the stand-in directory
/// of a tree that exists only in the pack).
pub fn opendir(
    path: *const c_char,
    real: impl Fn(*const c_char) -> *mut libc::DIR,
    stream_fd: impl Fn(*mut libc::DIR) -> c_int,
) -> *mut libc::DIR {
    let g = match detour::enter() {
        Ok(g) => g,
        Err(why) => {
            why.log_path(b"opendir", path);
            return real(path);
        }
    };
    let mut buf = Buf::new();
    let loc = lookup::locate(&g, libc::AT_FDCWD, path, &mut buf);
    let found = match loc.rel {
        Some(_) => lookup::find(&g, &loc, true),
        None => Err(Bypass::Outside),
    };
    let d = match &found {
        // A tree that exists only in the pack: a stream on the stand-in directory.
        Ok(f) if f.entry.stat.is_dir() && g.table.pack_mount() => {
            crate::pack::with_empty_dir(&g, &real).unwrap_or(core::ptr::null_mut())
        }
        _ => real(path),
    };
    let fd = stream_fd(d);
    match found {
        Ok(f) if f.entry.stat.is_dir() && fd >= 0 => {
            let _keep = KeepErrno::new();
            if super::open::track_dir(fd, f.idx, libc::O_CLOEXEC) {
                g.count(job::CATALOG_META, 1);
            } else {
                fdtable::take(fd);
            }
        }
        found => {
            if let Some(rel) = loc.rel {
                g.count(job::SOURCE_META, 1);
                let why = match found {
                    Ok(_) => Bypass::NotAFile,
                    Err(why) => why,
                };
                why.log(b"opendir", rel);
            }
            fdtable::take(fd);
        }
    }
    d
}

/// One listing entry, for the hook to put in its `struct dirent64`.
pub struct Listed {
    pub name: &'static [u8],
    pub ino: u64,
    /// Where the next entry is (`telldir`'s value after this one).
    pub off: i64,
    pub dtype: u8,
}

/// `readdir` of the stream on `fd`: the next catalog entry (`None`: the end of the listing).
pub fn readdir(fd: c_int) -> Detour<Option<Listed>> {
    let Some(t) = crate::fds::tracked::get(fd) else {
        return Detour::Bypass(Bypass::Untracked, ());
    };
    if t.kind != FdKind::Dir {
        return Detour::Bypass(Bypass::Untracked, ());
    }
    let g = match detour::enter_any_creds() {
        Ok(g) => g,
        Err(why) => return Detour::Bypass(why, ()),
    };
    // At the start of a listing, the catalog answers only for a directory the program has not
    // changed (once a listing started, it goes on from the catalog: POSIX leaves names added
    // or removed since opendir unspecified).
    if fdtable::dir_pos(fd).is_some_and(|p| p.load(Ordering::Relaxed) == 0) {
        if let Err(miss) = g.table.is_live(t.entry) {
            fdtable::take(fd);
            return Detour::Bypass(Bypass::Catalog(miss), ());
        }
    }
    Detour::Answer(next_entry(fd, t.entry))
}

/// The next catalog entry of the stream on tracked fd `fd`, or `None` at the end.
fn next_entry(fd: c_int, dir_entry: u32) -> Option<Listed> {
    let table = detour::table()?;
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
    pos_cell.store(pos + 1, Ordering::Relaxed);
    Some(Listed {
        name,
        ino,
        off: pos as i64 + 1,
        dtype,
    })
}

/// The listing position of the stream on `fd`, if granary lists it.
fn position(fd: c_int) -> Option<&'static AtomicU32> {
    if crate::fds::tracked::get(fd)?.kind != FdKind::Dir {
        return None;
    }
    fdtable::dir_pos(fd)
}

/// `rewinddir`: the listing starts again (the real call runs too, for libc's own buffer).
pub fn rewind(fd: c_int) {
    if let Some(p) = position(fd) {
        p.store(0, Ordering::Relaxed);
    }
}

/// `telldir`: granary's position, if it lists the stream.
pub fn tell(fd: c_int) -> Option<c_long> {
    position(fd).map(|p| p.load(Ordering::Relaxed) as c_long)
}

/// `seekdir`: true if granary lists the stream (the position is its own).
pub fn seek(fd: c_int, loc: c_long) -> bool {
    let Some(p) = position(fd) else {
        return false;
    };
    if let Ok(v) = u32::try_from(loc) {
        p.store(v, Ordering::Relaxed);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture;

    #[test]
    fn a_tracked_directory_is_listed_from_the_catalog() {
        let f = fixture();
        let p = f.path("train");
        let fd = crate::sys::raw_openat(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        );
        assert!(fd >= 0);
        assert!(matches!(readdir(fd), Detour::Bypass(Bypass::Untracked, ())));
        assert!(super::super::open::track_dir(
            fd,
            f.idx("train"),
            libc::O_CLOEXEC
        ));
        let mut names = vec![];
        while let Detour::Answer(Some(l)) = readdir(fd) {
            names.push((String::from_utf8_lossy(l.name).into_owned(), l.off));
        }
        let want = [".", "..", "big.bin", "cls0", "small.txt"];
        let got: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(got, want);
        assert_eq!(tell(fd), Some(want.len() as c_long));
        assert!(seek(fd, 2));
        let Detour::Answer(Some(l)) = readdir(fd) else {
            panic!("positioned at the first child");
        };
        assert_eq!(l.name, b"big.bin");
        rewind(fd);
        assert_eq!(tell(fd), Some(0));
        fdtable::take(fd);
        crate::sys::raw_close(fd);
    }
}
