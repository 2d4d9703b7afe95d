//! The read family, `mmap` and `lseek`: untracked fds pay one atomic load and pass through;
//! tier fds are counted; tracked source fds go through `place` (served from a partial copy or
//! chunk file, switched to a complete copy) and are counted by where the bytes came from.

use core::ffi::{c_int, c_void};

use granary_shm::job;

use crate::detour::{self, real, sys};
use crate::fdtable::{self, Kind, Tracked};
use crate::place::{self, Fill, Read};

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize) -> isize;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t, usize) -> isize;
type ReadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
type PreadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize;
type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
type LseekFn = unsafe extern "C" fn(c_int, libc::off_t, c_int) -> libc::off_t;

/// One buffer of the caller's.
struct Buf(*mut c_void);

impl Fill for Buf {
    fn fill(&self, file: c_int, off: u64, want: u64) -> isize {
        pread_all(file, self.0.cast(), want, off)
    }
}

/// The caller's iovec, filled segment by segment up to `want` bytes (exactly the range the
/// table vouches for, whatever lies beyond it in the file).
struct Iov<'a>(&'a [libc::iovec]);

impl Fill for Iov<'_> {
    fn fill(&self, file: c_int, off: u64, want: u64) -> isize {
        let mut done = 0u64;
        for v in self.0 {
            let n = (v.iov_len as u64).min(want - done);
            if n == 0 {
                if done == want {
                    break;
                }
                continue;
            }
            let r = pread_all(file, v.iov_base.cast(), n, off + done);
            if r < 0 {
                return -1;
            }
            done += r as u64;
            if (r as u64) < n {
                break;
            }
        }
        done as isize
    }
}

/// pread until `want` bytes or EOF (a regular file returns short only at EOF or on a signal).
fn pread_all(file: c_int, buf: *mut u8, want: u64, off: u64) -> isize {
    let mut done = 0u64;
    while done < want {
        let r = sys!(
            libc::SYS_pread64,
            file,
            buf.wrapping_add(done as usize),
            want - done,
            off + done
        );
        if r < 0 {
            if detour::errno() == libc::EINTR {
                continue;
            }
            return -1;
        }
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    done as isize
}

/// What a read on a tracked fd returned, counted by where the bytes came from.
#[inline]
fn count(kind: Kind, n: isize) -> isize {
    if n > 0 {
        if let Some(table) = crate::config::table() {
            let slot = crate::config::job_slot();
            match kind {
                Kind::Source => {
                    table.count(slot, job::SOURCE_READS, 1);
                    table.count(slot, job::SOURCE_BYTES, n as u64);
                }
                Kind::Tier(x) => table.count(slot, job::TIER_BYTES + x as usize, n as u64),
                Kind::Dir => {}
            }
        }
    }
    n
}

/// Shared body of the read family. `len` is the request's total length (`None`: unknown, pass
/// through), `off` the explicit offset (`None`: the fd's).
#[inline]
fn read_family(
    fd: c_int,
    off: Option<i64>,
    len: Option<u64>,
    f: &impl Fill,
    real: impl FnOnce() -> isize,
) -> isize {
    let Some(t) = fdtable::get(fd) else {
        return real();
    };
    let kind = match (t.kind, len) {
        (Kind::Source, Some(len)) => match source_read(fd, t, off, len, f) {
            Read::Served(n) => return n,
            Read::Real(k) => k,
        },
        (k, _) => k,
    };
    let n = real();
    if let (Kind::Tier(_), Some(o)) = (kind, off) {
        if n > 0 {
            fdtable::note_pread(fd, o as u64, n as u64);
        }
    }
    count(kind, n)
}

fn source_read(fd: c_int, t: Tracked, off: Option<i64>, len: u64, f: &impl Fill) -> Read {
    if fdtable::pinned(fd) {
        return Read::Real(Kind::Source);
    }
    match detour::enter() {
        Some(g) => place::on_read(&g, fd, t, off, len, f),
        None => Read::Real(Kind::Source),
    }
}

/// The caller's iovec as a slice; `None` when the kernel would refuse it (the real call then
/// reports the error).
fn iov_slice<'a>(iov: *const libc::iovec, cnt: c_int) -> Option<(&'a [libc::iovec], u64)> {
    if iov.is_null() || !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return None;
    }
    // SAFETY: the caller passed `cnt` iovecs at `iov` (readv's contract); non-null, bounded.
    let v = unsafe { core::slice::from_raw_parts(iov, cnt as usize) };
    let mut total = 0u64;
    for s in v {
        total = total.checked_add(s.iov_len as u64)?;
    }
    Some((v, total))
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    read_family(
        fd,
        None,
        Some(len as u64),
        &Buf(buf),
        || real!(READ as ReadFn, (fd, buf, len) else sys!(libc::SYS_read, fd, buf, len) as isize),
    )
}

/// Fortified `read` (`_FORTIFY_SOURCE`): glibc calls its internal read, which we cannot see.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    buflen: usize,
) -> isize {
    if len > buflen {
        // The real one reports the overflow (and aborts).
        return real!(READ_CHK as ReadChkFn, c"__read_chk", (fd, buf, len, buflen) or -1);
    }
    read(fd, buf, len)
}

macro_rules! pread_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *mut c_void,
            len: usize,
            off: libc::off_t,
        ) -> isize {
            read_family(fd, Some(off), Some(len as u64), &Buf(buf), || {
                real!($slot as PreadFn, (fd, buf, len, off)
                    else sys!(libc::SYS_pread64, fd, buf, len, off) as isize)
            })
        }
    };
}
pread_hook!(pread, PREAD);
pread_hook!(pread64, PREAD64);

macro_rules! pread_chk_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            buf: *mut c_void,
            len: usize,
            off: libc::off_t,
            buflen: usize,
        ) -> isize {
            if len > buflen {
                return real!($slot as PreadChkFn, $cname, (fd, buf, len, off, buflen) or -1);
            }
            pread64(fd, buf, len, off)
        }
    };
}
pread_chk_hook!(__pread_chk, PREAD_CHK, c"__pread_chk");
pread_chk_hook!(__pread64_chk, PREAD64_CHK, c"__pread64_chk");

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    let real = || real!(READV as ReadvFn, (fd, iov, cnt) else sys!(libc::SYS_readv, fd, iov, cnt) as isize);
    if fdtable::get(fd).is_none() {
        return real();
    }
    match iov_slice(iov, cnt) {
        Some((v, total)) => read_family(fd, None, Some(total), &Iov(v), real),
        None => read_family(fd, None, None, &Iov(&[]), real),
    }
}

macro_rules! preadv_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const libc::iovec,
            cnt: c_int,
            off: libc::off_t,
        ) -> isize {
            // 64-bit kernels take the offset in the first of the two position arguments.
            let real = || {
                real!($slot as PreadvFn, (fd, iov, cnt, off)
                    else sys!(libc::SYS_preadv, fd, iov, cnt, off, 0) as isize)
            };
            if fdtable::get(fd).is_none() {
                return real();
            }
            match iov_slice(iov, cnt) {
                Some((v, total)) => read_family(fd, Some(off), Some(total), &Iov(v), real),
                None => read_family(fd, Some(off), None, &Iov(&[]), real),
            }
        }
    };
}
preadv_hook!(preadv, PREADV);
preadv_hook!(preadv64, PREADV64);

type Preadv2Fn =
    unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t, c_int) -> isize;

macro_rules! preadv2_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        /// Offset -1 reads at the fd's offset (like `readv`); with flags (RWF_NOWAIT, …) the
        /// kernel's semantics are kept: the real call, counted.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const libc::iovec,
            cnt: c_int,
            off: libc::off_t,
            flags: c_int,
        ) -> isize {
            let real = || {
                real!($slot as Preadv2Fn, $cname, (fd, iov, cnt, off, flags) or -1)
            };
            if fdtable::get(fd).is_none() {
                return real();
            }
            let at = if off == -1 { None } else { Some(off) };
            match iov_slice(iov, cnt) {
                Some((v, total)) if flags == 0 => read_family(fd, at, Some(total), &Iov(v), real),
                _ => read_family(fd, at, None, &Iov(&[]), real),
            }
        }
    };
}
preadv2_hook!(preadv2, PREADV2, c"preadv2");
preadv2_hook!(preadv64v2, PREADV64V2, c"preadv64v2");

macro_rules! mmap_hook {
    ($name:ident, $slot:ident) => {
        /// Anonymous mappings (fd -1) and untracked fds cost one bounds check or one load.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: libc::off_t,
        ) -> *mut c_void {
            let tracked = fdtable::get(fd).filter(|t| t.kind == Kind::Source && !fdtable::pinned(fd));
            if let Some(t) = tracked {
                if let Some(g) = detour::enter() {
                    place::on_map(&g, fd, t);
                }
            }
            let p = real!($slot as MmapFn, (addr, len, prot, flags, fd, off)
                else sys!(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void);
            // Still a source fd after on_map (not switched to a complete copy): a PARTIAL
            // file's cached chunks are mapped over the source's pages.
            if let Some(t) = tracked.and_then(|_| fdtable::get(fd)).filter(|t| t.kind == Kind::Source) {
                if p != libc::MAP_FAILED {
                    if let Some(g) = detour::enter() {
                        place::on_mapped(&g, fd, t, p, len, prot, flags, off);
                    }
                }
            }
            p
        }
    };
}
mmap_hook!(mmap, MMAP);
mmap_hook!(mmap64, MMAP64);

macro_rules! lseek_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: libc::off_t, whence: c_int) -> libc::off_t {
            if let Some(t) = fdtable::get(fd) {
                if t.kind == Kind::Source && !fdtable::pinned(fd) {
                    if let Some(g) = detour::enter() {
                        place::on_seek(&g, fd, t);
                    }
                }
            }
            real!($slot as LseekFn, (fd, off, whence)
                else sys!(libc::SYS_lseek, fd, off, whence) as libc::off_t)
        }
    };
}
lseek_hook!(lseek, LSEEK);
lseek_hook!(lseek64, LSEEK64);
