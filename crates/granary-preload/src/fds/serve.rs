//! Answering one read of an fd from another file while the fd keeps its open file description
//! (docs/preload-rules.md, "Shared offsets"): the range is claimed on the fd's own offset first
//! (`lseek(SEEK_CUR)`, atomic in the kernel), then delivered from the other file. Sharers of the
//! fd (a `dup`, a forked or exec'd child) keep one offset with it; nothing about the fd changes.
//! Used where the fd cannot be switched (`switch`): a complete copy behind a shared source fd, a
//! partial copy or chunk file, the source behind a copy the program changed.

use core::ffi::c_int;

use crate::sys::{self, sys};

/// Reads `want` bytes (fewer only at a short read) from `file` at `off` into the caller's
/// buffers; -1 on error. The hook supplies it: `pread` into one buffer, or over an iovec.
pub trait ReadInto {
    fn read_into(&self, file: c_int, off: u64, want: u64) -> isize;

    /// The caller's own read: `read(fd, buffer, len)` into its single buffer, and the xxh3-64
    /// of the bytes it returned (0 when it returned none). `None` (nothing read) when the
    /// caller's buffers are not one buffer.
    fn read_hashed(&self, _fd: c_int, _len: u64) -> Option<(isize, u64)> {
        None
    }
}

/// The kernel never moves more than this in one read (`MAX_RW_COUNT`).
const MAX_RW: u64 = 0x7fff_f000;

/// `[pos, end)`: the part of a read of `len` bytes at `off` (`None`: the fd's offset, as it is
/// now) that lies inside a file of `size` bytes; `None` when nothing does (EOF, bad offset: the
/// real call answers that).
pub fn range(fd: c_int, off: Option<i64>, len: u64, size: u64) -> Option<(u64, u64)> {
    let pos = match off {
        Some(o) => o,
        None => sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR) as i64,
    };
    let pos = u64::try_from(pos).ok()?;
    let want = len.min(MAX_RW);
    if pos >= size || want == 0 {
        return None;
    }
    Some((pos, pos.saturating_add(want).min(size)))
}

/// How `serve` reads.
pub struct Serve<'a> {
    /// Byte `p` of the file lies at `base + p` in the file read from.
    pub base: u64,
    /// The file's size as served: nothing at or beyond it is read (`u64::MAX`: the file read
    /// from decides, and fewer bytes than asked are an answer, not a failure).
    pub size: u64,
    /// Drop the pages read (page-cache residency).
    pub transient: bool,
    /// Whether the file read from holds `[p, end)` now (a partial copy's progress, present
    /// chunks).
    pub covered: &'a dyn Fn(u64, u64) -> bool,
    /// What to read a range from when the file cannot give it after the fd's offset moved for
    /// it: the fd itself when it is on the source; `None` (an fd on a copy): the read fails.
    pub fallback: Option<c_int>,
}

/// What `serve` did.
pub enum Served {
    /// Bytes for the caller, from the file (`false`) or from the fallback (`true`).
    Bytes(isize, bool),
    /// The read failed with this errno after the fd's offset had moved: the caller returns -1.
    Failed(c_int),
    /// Nothing happened: the caller runs the real call.
    No,
}

/// Serves a read of `len` bytes at `off` (`None`: at the fd's offset) from `file`, and closes
/// `file`.
///
/// A read at the fd's offset claims its range first, in one atomic step of the kernel's own
/// position: `lseek(fd, len, SEEK_CUR)` under the open file description's position lock. Every
/// other reader of that description — this fd in another thread, a `dup`, a forked or exec'd
/// process, a real `read` — then reads after it, as with real reads; what the claim took beyond
/// the bytes delivered (at the end of the file) is given back the same way. Once the offset
/// moved, the range is delivered from `file`, else from the fallback, or the read fails: it is
/// never left to a real read at the moved offset.
pub fn serve(
    fd: c_int,
    file: c_int,
    off: Option<i64>,
    len: u64,
    how: &Serve,
    f: &impl ReadInto,
) -> Served {
    let want = len.min(MAX_RW);
    let size = how.size;
    let exact = size != u64::MAX;
    let from_file = |p: u64, end: u64| -> isize {
        if end <= p {
            return 0;
        }
        if !(how.covered)(p, end) {
            return -1;
        }
        let n = f.read_into(file, how.base + p, end - p);
        if how.transient && n > 0 {
            crate::fds::pagedrop::drop_pages(file, how.base + p, n as u64);
        }
        if exact && n >= 0 && n as u64 != end - p {
            return -1;
        }
        n
    };
    let out = match off {
        Some(o) => match u64::try_from(o) {
            Ok(p) if p < size && want > 0 => match from_file(p, p.saturating_add(want).min(size)) {
                n if n >= 0 => Served::Bytes(n, false),
                _ => Served::No,
            },
            _ => Served::No,
        },
        None => at_offset(fd, want, size, from_file, how.fallback, f),
    };
    sys::raw_close(file);
    out
}

fn at_offset(
    fd: c_int,
    want: u64,
    size: u64,
    from_file: impl Fn(u64, u64) -> isize,
    fallback: Option<c_int>,
    f: &impl ReadInto,
) -> Served {
    let now = sys!(libc::SYS_lseek, fd, 0, libc::SEEK_CUR);
    if want == 0 || now < 0 || now as u64 >= size {
        // End of file (or no offset): the real call answers and leaves the offset alone.
        return Served::No;
    }
    let moved = sys!(libc::SYS_lseek, fd, want, libc::SEEK_CUR);
    if moved < 0 {
        return Served::No;
    }
    let p = moved as u64 - want;
    // Another reader may have taken what was left meanwhile: then `end == p`, nothing to read.
    let end = p.saturating_add(want).min(size).max(p);
    let mut n = from_file(p, end);
    let mut fell_back = false;
    if n < 0 {
        n = match fallback {
            Some(src) => f.read_into(src, p, end - p),
            None => -1,
        };
        fell_back = true;
    }
    let errno = sys::errno();
    let delivered = u64::try_from(n).unwrap_or(0);
    if delivered < want {
        let back = (want - delivered) as i64;
        sys!(libc::SYS_lseek, fd, -back, libc::SEEK_CUR);
    }
    if n < 0 {
        return Served::Failed(if errno == 0 { libc::EIO } else { errno });
    }
    Served::Bytes(n, fell_back)
}
