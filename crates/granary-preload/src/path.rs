//! Where a path argument points, decided lexically in stack buffers (no allocation, no syscall
//! except `getcwd` for relative paths).
//!
//! The lexical rules are the ones that are exact without asking the kernel: `.` and empty
//! components vanish; `..` is exact only before any named component (the cwd from `getcwd` and a
//! catalogued directory have no symlinks in them), so a later `..` makes the path "not ours".

use core::ffi::{c_char, c_int, CStr};

use granary_shm::{strip_root, Table};

use crate::detour::sys;
use crate::fdtable::{self, Kind};

pub const BUF: usize = libc::PATH_MAX as usize + 1;

/// Scratch space for one path: the normalised absolute path, and (for `*at` calls relative to
/// one of our shadow directory fds) the real path the call must go to instead.
pub struct Bufs {
    norm: [u8; BUF],
    redirect: [u8; BUF],
}

impl Bufs {
    pub fn new() -> Bufs {
        Bufs {
            norm: [0; BUF],
            redirect: [0; BUF],
        }
    }
}

pub struct Loc<'a> {
    /// Relative to the source root, normalised; `None` when the path is not (provably) inside.
    pub rel: Option<&'a [u8]>,
    /// The path named a directory syntactically (trailing `/`, `.` or `..`).
    pub must_dir: bool,
    /// Set when the caller's dirfd is a shadow directory: pass-through calls must use
    /// `(AT_FDCWD, redirect)` instead of the caller's arguments, which would name the (empty)
    /// shadow directory.
    pub redirect: Option<*const c_char>,
    /// The path named the source root itself through the user's spelling of it, which is a
    /// symlink to the real root: not following it means the link, not the catalog's root.
    pub root_link: bool,
}

impl Loc<'_> {
    pub fn outside() -> Loc<'static> {
        Loc {
            rel: None,
            must_dir: false,
            redirect: None,
            root_link: false,
        }
    }

    /// The arguments a pass-through call must use.
    pub fn pass_args(&self, dirfd: c_int, path: *const c_char) -> (c_int, *const c_char) {
        match self.redirect {
            Some(p) => (libc::AT_FDCWD, p),
            None => (dirfd, path),
        }
    }
}

struct Cursor<'a> {
    buf: &'a mut [u8; BUF],
    len: usize,
}

impl Cursor<'_> {
    fn put(&mut self, s: &[u8]) -> Option<()> {
        let end = self.len.checked_add(s.len())?;
        // Keep one byte for the NUL.
        if end >= BUF {
            return None;
        }
        self.buf.get_mut(self.len..end)?.copy_from_slice(s);
        self.len = end;
        Some(())
    }

    fn pop(&mut self) {
        let cut = self
            .buf
            .get(..self.len)
            .and_then(|b| b.iter().rposition(|&c| c == b'/'))
            .unwrap_or(0);
        self.len = cut;
    }

    /// Appends the components of a relative path; `None` for a `..` after a named component.
    fn push_components(&mut self, path: &[u8]) -> Option<()> {
        let mut seen_name = false;
        for comp in path.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." if !seen_name => self.pop(),
                b".." => return None,
                name => {
                    seen_name = true;
                    self.put(b"/")?;
                    self.put(name)?;
                }
            }
        }
        Some(())
    }
}

/// Bytes of a C string argument; `None` for NULL.
pub fn bytes<'a>(path: *const c_char) -> Option<&'a [u8]> {
    if path.is_null() {
        return None;
    }
    // SAFETY: libc's contract for path arguments: a NUL-terminated string, valid for the call.
    Some(unsafe { CStr::from_ptr(path) }.to_bytes())
}

fn ends_as_dir(p: &[u8]) -> bool {
    p.ends_with(b"/") || p == b"." || p == b".." || p.ends_with(b"/.") || p.ends_with(b"/..")
}

/// Classifies `path` (relative to `dirfd`, `AT_FDCWD` for plain calls).
pub fn locate<'a>(table: &Table, dirfd: c_int, path: *const c_char, bufs: &'a mut Bufs) -> Loc<'a> {
    let Some(p) = bytes(path) else {
        return Loc::outside();
    };
    if p.is_empty() {
        return Loc::outside();
    }
    let Bufs { norm, redirect } = bufs;
    let mut n = Cursor { buf: norm, len: 0 };
    let mut redirect_ptr = None;
    if p.first() == Some(&b'/') {
        // Absolute: taken as is.
    } else if dirfd == libc::AT_FDCWD {
        let r = sys!(libc::SYS_getcwd, n.buf.as_mut_ptr(), BUF);
        // The kernel returns the length including the NUL, and "(unreachable)…" for a cwd
        // outside our root: only an absolute answer is usable.
        if r <= 1 || n.buf.first() != Some(&b'/') {
            return Loc::outside();
        }
        n.len = r as usize - 1;
        if n.len == 1 {
            n.len = 0; // "/" : components add their own separators
        }
    } else {
        match fdtable::get(dirfd) {
            Some(t) if t.kind == Kind::Dir => {
                let Some(base) = dir_base(table, t.entry, &mut n) else {
                    return Loc::outside();
                };
                let mut r = Cursor {
                    buf: redirect,
                    len: 0,
                };
                if r.put(base)
                    .and_then(|_| r.put(b"/"))
                    .and_then(|_| r.put(p))
                    .is_none()
                {
                    return Loc::outside();
                }
                if let Some(z) = r.buf.get_mut(r.len) {
                    *z = 0;
                }
                redirect_ptr = Some(r.buf.as_ptr().cast::<c_char>());
            }
            _ => return Loc::outside(),
        }
    }
    let must_dir = ends_as_dir(p);
    if n.push_components(p).is_none() {
        return Loc {
            rel: None,
            must_dir,
            redirect: redirect_ptr,
            root_link: false,
        };
    }
    let len = n.len;
    let abs: &'a [u8] = match n.buf.get(..len) {
        Some(b) if !b.is_empty() => b,
        _ => b"/",
    };
    let named = strip_root(abs, table.source_root());
    let root_link =
        named.is_some_and(|r| r.is_empty()) && table.source_root() != table.source_real_root();
    let rel = named.or_else(|| strip_root(abs, table.source_real_root()));
    Loc {
        rel,
        must_dir,
        redirect: redirect_ptr,
        root_link,
    }
}

/// Writes `<real source root>/<entry's path>` into `n` and returns it. The real root, because
/// `..` from the catalog's root must go where the kernel would take it.
fn dir_base<'b>(table: &Table, entry: u32, n: &'b mut Cursor<'_>) -> Option<&'b [u8]> {
    let e = table.entry(entry)?;
    let rel = table.rel_path(&e)?;
    let root = table.source_real_root();
    n.len = 0;
    if root != b"/" {
        n.put(root)?;
    }
    if !rel.is_empty() {
        n.put(b"/")?;
        n.put(rel)?;
    }
    n.buf.get(..n.len)
}

/// `<real source root>/<rel>` as a NUL-terminated string in `out` (for `fchdir` and `realpath`).
pub fn real_path_of<'b>(table: &Table, rel: &[u8], out: &'b mut [u8; BUF]) -> Option<&'b [u8]> {
    let mut c = Cursor { buf: out, len: 0 };
    let root = table.source_real_root();
    if root != b"/" {
        c.put(root)?;
    }
    if !rel.is_empty() || c.len == 0 {
        c.put(b"/")?;
        c.put(rel)?;
    }
    let len = c.len;
    *c.buf.get_mut(len)? = 0;
    c.buf.get(..len)
}
