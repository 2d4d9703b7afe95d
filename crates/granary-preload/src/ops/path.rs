//! Where a path argument points, decided lexically in a stack buffer (no allocation; no syscall
//! except `getcwd` for relative paths that may lead into the source).
//!
//! The lexical rules are the ones that are exact without asking the kernel: `.` and empty
//! components vanish; `..` is exact only before any named component (the cwd from `getcwd` and a
//! catalogued directory have no symlinks in them), so a later `..` makes the path "not ours".
//!
//! Cost: the buffer is not zeroed, an absolute path whose first component is neither root's is
//! rejected before anything is built, and a relative path is rejected without `getcwd` when the
//! working directory we last saw is outside the source and the path does not climb (`..`).

use core::ffi::{c_char, c_int, CStr};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use granary_shm::layout::PATH_MAX_LEN;
use granary_shm::{strip_root, Table};

use crate::fds::fdtable::{self, FdKind};
use crate::sys::{sys, PATH_BUF};

/// Scratch space for one normalised absolute path. Never zeroed: only written bytes are read.
pub struct Buf(MaybeUninit<[u8; PATH_BUF]>);

impl Buf {
    #[inline]
    pub fn new() -> Buf {
        Buf(MaybeUninit::uninit())
    }
}

pub struct Loc<'a> {
    /// Relative to the source root, normalised; `None` when the path is not (provably) inside.
    pub rel: Option<&'a [u8]>,
    /// The path named a directory syntactically (trailing `/`, `.` or `..`).
    pub must_dir: bool,
    /// The path named the source root itself through the user's spelling of it, which is a
    /// symlink to the real root: not following it means the link, not the catalog's root.
    pub root_link: bool,
    /// `rel`'s `path_hash`, once a caller computed it (the open hook, for the copy bitmap), so
    /// the lookup does not hash the path again.
    pub hash: Option<u64>,
}

impl Loc<'_> {
    pub fn outside() -> Loc<'static> {
        Loc {
            rel: None,
            must_dir: false,
            root_link: false,
            hash: None,
        }
    }
}

struct Cursor<'a> {
    buf: &'a mut [MaybeUninit<u8>; PATH_BUF],
    len: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a mut Buf) -> Cursor<'a> {
        // SAFETY: `[MaybeUninit<u8>; N]` has the layout of `MaybeUninit<[u8; N]>`, and every
        // bit pattern (initialised or not) is valid for it.
        let buf = unsafe { &mut *buf.0.as_mut_ptr().cast::<[MaybeUninit<u8>; PATH_BUF]>() };
        Cursor { buf, len: 0 }
    }

    fn put(&mut self, s: &[u8]) -> Option<()> {
        let end = self.len.checked_add(s.len())?;
        // Keep one byte for the NUL.
        if end >= PATH_BUF {
            return None;
        }
        let dst = self.buf.get_mut(self.len..end)?;
        // SAFETY: `MaybeUninit<u8>` has `u8`'s layout; `dst` has exactly `s.len()` elements.
        unsafe {
            core::ptr::copy_nonoverlapping(s.as_ptr(), dst.as_mut_ptr().cast::<u8>(), s.len())
        };
        self.len = end;
        Some(())
    }

    fn bytes(&self) -> &[u8] {
        let init = &self.buf[..self.len];
        // SAFETY: bytes `..len` were all written by `put` (or by getcwd, which wrote `len` + 1).
        unsafe { &*(init as *const [MaybeUninit<u8>] as *const [u8]) }
    }

    /// Appends entry `idx`'s path relative to the source root.
    fn put_rel(&mut self, table: &Table, idx: u32) -> Option<()> {
        let len = table.rel_path_len(idx)?;
        let base = self.len;
        let end = base.checked_add(len)?;
        if end >= PATH_BUF {
            return None;
        }
        let buf = &mut *self.buf;
        table.rel_path_pieces(idx, len, |at, piece| {
            if let Some(dst) = buf.get_mut(base + at..base + at + piece.len()) {
                // SAFETY: `MaybeUninit<u8>` has `u8`'s layout; `dst` has `piece.len()` elements.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        piece.as_ptr(),
                        dst.as_mut_ptr().cast::<u8>(),
                        piece.len(),
                    )
                };
            }
        })?;
        self.len = end;
        Some(())
    }

    fn pop(&mut self) {
        self.len = self.bytes().iter().rposition(|&c| c == b'/').unwrap_or(0);
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

/// The first component of an absolute path, with its leading `/` (all of "/" for the root).
fn first_component(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .skip(1)
        .position(|&b| b == b'/')
        .map_or(s.len(), |i| i + 1);
    s.get(..n).unwrap_or(s)
}

/// True if absolute path `p` cannot lie under `root`: their first components differ.
fn outside_root(p: &[u8], root: &[u8]) -> bool {
    let r = first_component(root);
    if r.len() <= 1 {
        return root.is_empty();
    }
    let q = first_component(p);
    q != r
}

/// Cheap early exit for absolute paths that cannot be under the source.
pub fn surely_outside_abs(table: &Table, p: &[u8]) -> bool {
    outside_root(p, table.source_root())
        && outside_root(p, table.source_real_root())
        && job_root().is_none_or(|j| outside_root(p, j))
}

/// The job's own spelling of the source root (`GRANARY_SOURCE`, the `--source` it was given)
/// when it is neither of the table's — the table was made for a job that named the source
/// otherwise — and led to the catalogued root when this process started (`set_job_root`).
struct JobRoot {
    buf: [u8; PATH_MAX_LEN],
    len: usize,
}

static JOB_ROOT: OnceLock<JobRoot> = OnceLock::new();

/// The job's spelling of the source root, if this process took it (`set_job_root`).
#[inline]
pub fn job_root() -> Option<&'static [u8]> {
    JOB_ROOT.get().and_then(|r| r.buf.get(..r.len))
}

/// Takes `spelling` as a name of the source root for this process's life: the constructor,
/// once it proved the spelling leads to the catalogued root. Only a normal absolute path (no
/// `.`, `..` or empty component, so that the lexical rules stay exact) other than the table's
/// two; false otherwise.
pub fn set_job_root(table: &Table, spelling: &[u8]) -> bool {
    if !is_normal_abs(spelling)
        || spelling == table.source_root()
        || spelling == table.source_real_root()
        || spelling.len() > PATH_MAX_LEN
    {
        return false;
    }
    let mut r = JobRoot {
        buf: [0; PATH_MAX_LEN],
        len: spelling.len(),
    };
    r.buf[..spelling.len()].copy_from_slice(spelling);
    JOB_ROOT.set(r).is_ok()
}

/// Whether the working directory we last saw (`getcwd` in the constructor and after every
/// `chdir`/`fchdir` we see) was outside the source: 0 unknown, 1 outside, 2 maybe inside. Only
/// ever used to skip `getcwd` for a relative path that does not climb; a working directory
/// changed behind our back then makes us pass a call through, never answer it wrongly.
static CWD_OUTSIDE: AtomicU8 = AtomicU8::new(0);

/// Re-reads the working directory (constructor, `chdir`, `fchdir`).
pub fn note_cwd(table: &Table) {
    let mut b = Buf::new();
    let mut c = Cursor::new(&mut b);
    let v = match getcwd(&mut c) {
        Some(()) if surely_outside_abs(table, c.bytes()) => 1,
        _ => 2,
    };
    CWD_OUTSIDE.store(v, Ordering::Relaxed);
}

fn getcwd(c: &mut Cursor<'_>) -> Option<()> {
    let r = sys!(libc::SYS_getcwd, c.buf.as_mut_ptr(), PATH_BUF);
    // The kernel returns the length including the NUL, and "(unreachable)…" for a cwd outside
    // our root: only an absolute answer is usable.
    if r <= 1 {
        return None;
    }
    c.len = r as usize - 1;
    if c.bytes().first() != Some(&b'/') {
        return None;
    }
    if c.len == 1 {
        c.len = 0; // "/" : components add their own separators
    }
    Some(())
}

/// Classifies `path` (relative to `dirfd`, `AT_FDCWD` for plain calls).
pub fn locate<'a>(table: &Table, dirfd: c_int, path: *const c_char, buf: &'a mut Buf) -> Loc<'a> {
    let Some(p) = bytes(path) else {
        return Loc::outside();
    };
    let Some(&first) = p.first() else {
        return Loc::outside();
    };
    if first == b'/' {
        if let Some(loc) = classify_clean(table, p) {
            // The common case: under a root, already normal, nothing to build.
            return loc;
        }
        if surely_outside_abs(table, p) {
            return Loc::outside();
        }
        if is_clean_abs(p) {
            return classify(table, p, false);
        }
    }
    let mut n = Cursor::new(buf);
    if first != b'/' {
        if dirfd == libc::AT_FDCWD {
            if CWD_OUTSIDE.load(Ordering::Relaxed) == 1 && !p.starts_with(b"..") {
                return Loc::outside();
            }
            if getcwd(&mut n).is_none() {
                return Loc::outside();
            }
        } else {
            match fdtable::peek(dirfd) {
                Some(t) if t.kind == FdKind::Dir => {
                    if dir_base(table, t.entry, &mut n).is_none() {
                        return Loc::outside();
                    }
                }
                _ => return Loc::outside(),
            }
        }
    }
    let must_dir = ends_as_dir(p);
    if n.push_components(p).is_none() {
        return Loc {
            rel: None,
            must_dir,
            root_link: false,
            hash: None,
        };
    }
    let len = n.len;
    let Cursor { buf, .. } = n;
    let abs: &'a [u8] = if len == 0 {
        b"/"
    } else {
        let init = &buf[..len];
        // SAFETY: bytes `..len` were written (see `Cursor::bytes`).
        unsafe { &*(init as *const [MaybeUninit<u8>] as *const [u8]) }
    };
    classify(table, abs, must_dir)
}

/// An absolute path with nothing to normalise: no empty, `.` or `..` component (no `/` followed
/// by `/` or `.`; a name starting with a dot takes the general path) and no trailing `/`.
///
/// Every path call asks this of its path: eight bytes at a time (a byte-by-byte loop took ~650
/// instructions for a 50-byte dataset path, more than half of what locating it costs).
fn is_clean_abs(p: &[u8]) -> bool {
    if p.len() < 2 || p.last() == Some(&b'/') {
        return false;
    }
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const SLASHES: u64 = ONES * b'/' as u64;
    /// The high bit of each zero byte of `x`, exactly (no carry crosses a byte).
    fn zero_bytes(x: u64) -> u64 {
        !(((x & !HIGH) + !HIGH) | x) & HIGH
    }
    // Whether word `w` is clean, `carry` saying the byte before it was a `/`; and whether its
    // last byte is one.
    fn clean(w: u64, carry: bool) -> (bool, bool) {
        let slash = zero_bytes(w ^ SLASHES);
        // `/` is 0x2f and `.` 0x2e: a byte is either exactly when it is 0x2f with bit 0 set.
        let slash_or_dot = zero_bytes((w | ONES) ^ SLASHES);
        // Little-endian: byte i + 1 follows byte i, 8 bits up.
        let ok = (slash << 8) & slash_or_dot == 0 && !(carry && slash_or_dot & 0x80 != 0);
        (ok, slash >> 63 != 0)
    }
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    // The previous word ended with a `/`.
    let mut carry = false;
    let mut words = p.chunks_exact(8);
    for c in &mut words {
        let (ok, last) = clean(word(c), carry);
        if !ok {
            return false;
        }
        carry = last;
    }
    let rest = words.remainder();
    if rest.is_empty() {
        return true;
    }
    if p.len() >= 8 {
        // The last eight bytes, overlapping bytes already checked: each pair of neighbours in
        // them is a pair of the path, and the pair before them was checked with the words.
        return clean(word(&p[p.len() - 8..]), false).0;
    }
    // The last bytes, padded with zeros (neither `/` nor `.`), without a call to `memcpy`.
    let mut w = 0u64;
    for (i, &c) in rest.iter().enumerate() {
        w |= (c as u64) << (8 * i);
    }
    clean(w, carry).0
}

/// An absolute path of named components only (no empty, `.` or `..` one, no trailing `/`), other
/// than `/`: `is_clean_abs` without its shortcut (names starting with a dot, `~/.cache`, pass).
fn is_normal_abs(p: &[u8]) -> bool {
    p.len() > 1
        && p.first() == Some(&b'/')
        && p[1..]
            .split(|&b| b == b'/')
            .all(|c| !matches!(c, b"" | b"." | b".."))
}

/// Where a normal absolute path lies relative to the source: under one of its spellings —
/// the table's (unless this process forgot it: `Table::forget_spelling`), the real root's, the
/// job's (`job_root`).
fn classify<'a>(table: &Table, abs: &'a [u8], must_dir: bool) -> Loc<'a> {
    let spelled = table.source_root();
    let real = table.source_real_root();
    // `root_link`: the root itself, named through a symlink to it.
    let (rel, root_link) = if let Some(r) = strip_root(abs, spelled) {
        (Some(r), r.is_empty() && spelled != real)
    } else if let Some(r) = strip_root(abs, real) {
        (Some(r), false)
    } else if let Some(r) = job_root().and_then(|j| strip_root(abs, j)) {
        (Some(r), r.is_empty())
    } else {
        (None, false)
    };
    Loc {
        rel,
        must_dir,
        root_link,
        hash: None,
    }
}

/// `classify(table, p, false)` of absolute path `p` when `p` is normal as it stands (what
/// `locate` would normalise it to is `p` itself): under one of the roots, all of them normal
/// (`Table::roots_normal`; the job's is by `set_job_root`), with nothing to normalise after
/// the root (`is_clean_abs` of the rest, from the `/` that joins it). Then only the rest is
/// scanned, not the whole path. `None`: the caller decides the long way.
#[inline]
fn classify_clean<'a>(table: &Table, p: &'a [u8]) -> Option<Loc<'a>> {
    if !table.roots_normal() {
        return None;
    }
    let spelled = table.source_root();
    let real = table.source_real_root();
    let (rel, root_link) = if let Some(r) = strip_root(p, spelled) {
        (r, r.is_empty() && spelled != real)
    } else if let Some(r) = strip_root(p, real) {
        (r, false)
    } else if let Some(r) = job_root().and_then(|j| strip_root(p, j)) {
        (r, r.is_empty())
    } else {
        return None;
    };
    // `p` is a root, or a root, one `/` and `rel`: the root is normal, so `p` is exactly when
    // `/rel` is (no empty, `.` or `..` component and no trailing `/` in it).
    if !rel.is_empty() && !is_clean_abs(&p[p.len() - rel.len() - 1..]) {
        return None;
    }
    Some(Loc {
        rel: Some(rel),
        must_dir: false,
        root_link,
        hash: None,
    })
}

/// Writes `<real source root>/<entry's path>`. The real root, because `..` from the catalog's
/// root must go where the kernel would take it.
fn dir_base(table: &Table, entry: u32, n: &mut Cursor<'_>) -> Option<()> {
    let root = table.source_real_root();
    n.len = 0;
    if root != b"/" {
        n.put(root)?;
    }
    if entry != 0 {
        n.put(b"/")?;
        n.put_rel(table, entry)?;
    }
    Some(())
}

/// `<real source root>/<rel>` as a NUL-terminated string in `buf`; returns its bytes with the
/// NUL (`realpath`'s answer).
pub fn real_path_of<'b>(table: &Table, rel: &[u8], buf: &'b mut Buf) -> Option<&'b [u8]> {
    let mut c = Cursor::new(buf);
    let root = table.source_real_root();
    if root != b"/" {
        c.put(root)?;
    }
    if !rel.is_empty() || c.len == 0 {
        c.put(b"/")?;
        c.put(rel)?;
    }
    let len = c.len;
    let Cursor { buf, .. } = c;
    buf.get_mut(len)?.write(0);
    let init = &buf[..=len];
    // SAFETY: bytes `..=len` were written just above.
    Some(unsafe { &*(init as *const [MaybeUninit<u8>] as *const [u8]) })
}

/// The path of catalog entry `idx` on the source, NUL-terminated in `buf`, as a pointer for a
/// system call.
pub fn entry_path(table: &Table, idx: u32, buf: &mut Buf) -> Option<*const c_char> {
    let mut c = Cursor::new(buf);
    dir_base(table, idx, &mut c)?;
    if c.len == 0 {
        c.put(b"/")?;
    }
    let len = c.len;
    let Cursor { buf, .. } = c;
    buf.get_mut(len)?.write(0);
    Some(buf.as_ptr().cast())
}

#[cfg(test)]
mod tests {
    use super::{is_clean_abs, is_normal_abs};

    #[test]
    fn a_job_root_is_a_normal_absolute_path() {
        for p in [
            "/data/ds",
            "/home/u/.cache/huggingface/hub",
            "/a",
            "/a/..b/.c.",
        ] {
            assert!(is_normal_abs(p.as_bytes()), "{p}");
        }
        for p in [
            "",
            "/",
            "data/ds",
            "/data/",
            "/data//ds",
            "/data/./ds",
            "/data/../ds",
            "/..",
        ] {
            assert!(!is_normal_abs(p.as_bytes()), "{p}");
        }
    }

    /// The rule, byte by byte.
    fn clean_by_bytes(p: &[u8]) -> bool {
        if p.len() < 2 || p.last() == Some(&b'/') {
            return false;
        }
        !p.windows(2)
            .any(|w| w[0] == b'/' && (w[1] == b'/' || w[1] == b'.'))
    }

    #[test]
    fn clean_paths_word_at_a_time_as_byte_by_byte() {
        for p in [
            &b"/var/tmp/granary-openread/ds-1k-100000/d0000/f0000000.bin"[..],
            b"/a",
            b"/",
            b"//",
            b"/a/",
            b"/a/.b",
            b"/a/b.c/d..e",
            b"/abcdefg/.",
            b"/abcdef//x",
            b"/abcdefgh/..",
            b"/abcdefghijklmno/",
        ] {
            assert_eq!(
                is_clean_abs(p),
                clean_by_bytes(p),
                "{}",
                String::from_utf8_lossy(p)
            );
        }
        // Every path of up to 19 bytes over `/`, `.`, `a`, 0x2d and 0xaf (one bit off `/` and
        // `.`) at a few hundred thousand pseudo-random draws, each position of a word covered.
        let alphabet = [b'/', b'.', b'a', 0x2d, 0xaf, 0x2f ^ 0x80];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 19) as usize;
            let mut p = vec![b'/'];
            let mut y = x >> 8;
            for _ in 1..len {
                p.push(alphabet[(y % alphabet.len() as u64) as usize]);
                y = (y / alphabet.len() as u64) ^ x.rotate_left(29);
            }
            assert_eq!(is_clean_abs(&p), clean_by_bytes(&p), "{p:?}");
        }
    }
}
