//! The C entry points of the read family (`read`, `pread`, `readv`, `preadv`, `preadv2`, their
//! `64` and fortified aliases), `lseek`, the calls in which the kernel reads an fd itself
//! (`copy_file_range`, `sendfile`, `splice`) and stdio's `fread`. What granary does for them is
//! `ops::read`; here are the caller's buffers (`ReadInto`: where served bytes go), errno and the
//! real calls.

use core::ffi::{c_int, c_void};

use crate::fds::serve::ReadInto;
use crate::ops::detour::Detour;
use crate::ops::read;
use crate::sys::usermem;
use crate::sys::{self, real, sys};

/// A read of `fd`: granary's answer, or the real call, counted.
#[inline]
fn read_at(
    fd: c_int,
    off: Option<i64>,
    len: Option<u64>,
    f: &impl ReadInto,
    real: impl FnOnce() -> isize,
) -> isize {
    match read::read(fd, off, len, f) {
        Detour::Answer(n) => n,
        Detour::Fail(e) => {
            sys::set_errno(e);
            -1
        }
        Detour::Bypass(why, then) => {
            why.log_fd(b"read", fd);
            let n = real();
            read::after_real(fd, off, n, then)
        }
    }
}

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize) -> isize;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t, usize) -> isize;
type ReadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
type PreadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize;
type Preadv2Fn =
    unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t, c_int) -> isize;
type LseekFn = unsafe extern "C" fn(c_int, libc::off_t, c_int) -> libc::off_t;

/// One buffer of the caller's.
struct Buf(*mut c_void);

impl ReadInto for Buf {
    fn read_into(&self, file: c_int, off: u64, want: u64) -> isize {
        pread_all(file, self.0.cast(), want, off)
    }

    fn read_hashed(&self, fd: c_int, len: u64) -> Option<(isize, u64)> {
        let n = sys!(libc::SYS_read, fd, self.0, len) as isize;
        if n <= 0 {
            return Some((n, 0));
        }
        // SAFETY: the kernel has just written these `n` bytes into the caller's buffer, so they
        // are mapped and initialised; they are only read, before the call returns.
        let got = unsafe { core::slice::from_raw_parts(self.0.cast::<u8>(), n as usize) };
        // The same xxh3-64 as the agent's, in SSE2. Not AVX2: hashed alone, 1 KiB takes
        // 45–65 ns with AVX2 against 68–79 ns, but a reader opening, reading and closing
        // placed 1 KiB files ran 0.25 µs a file slower with it (docs/decisions.md, "A small
        // copy's check is hashed without AVX2").
        Some((n, xxhash_rust::xxh3::xxh3_64(got)))
    }
}

/// The caller's iovec, filled segment by segment up to `want` bytes (exactly the range the
/// table vouches for, whatever lies beyond it in the file).
struct Iov<'a>(&'a [libc::iovec]);

impl ReadInto for Iov<'_> {
    fn read_into(&self, file: c_int, off: u64, want: u64) -> isize {
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
                // As the kernel: bytes already delivered are the answer, the error is lost.
                return if done > 0 { done as isize } else { -1 };
            }
            done += r as u64;
            if (r as u64) < n {
                break;
            }
        }
        done as isize
    }
}

/// pread until `want` bytes or EOF (a regular file returns short only at EOF, on a signal, or at
/// a buffer that stops being writable). An error after some bytes returns those bytes, as the
/// kernel's read does.
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
            if sys::errno() == libc::EINTR {
                continue;
            }
            return if done > 0 { done as isize } else { -1 };
        }
        if r == 0 {
            break;
        }
        done += r as u64;
    }
    done as isize
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    read_at(
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
            read_at(fd, Some(off), Some(len as u64), &Buf(buf), || {
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

/// The vector read family: the caller's iovec array is copied (`usermem`) only when granary
/// may serve the read; a vector it cannot copy (not readable: the kernel's EFAULT; too long)
/// goes to the real call.
fn vector_read(
    fd: c_int,
    off: Option<i64>,
    iov: *const libc::iovec,
    cnt: c_int,
    real: impl FnOnce() -> isize,
) -> isize {
    match read::needs_buffers(fd) {
        None => real(),
        Some(false) => read_at(fd, off, None, &Iov(&[]), real),
        Some(true) => {
            let mut copy = [libc::iovec {
                iov_base: core::ptr::null_mut(),
                iov_len: 0,
            }; usermem::MAX_IOV];
            match usermem::iovecs(iov, cnt, &mut copy) {
                Some((n, total)) => read_at(fd, off, Some(total), &Iov(&copy[..n]), real),
                None => read_at(fd, off, None, &Iov(&[]), real),
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    vector_read(
        fd,
        None,
        iov,
        cnt,
        || real!(READV as ReadvFn, (fd, iov, cnt) else sys!(libc::SYS_readv, fd, iov, cnt) as isize),
    )
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
            vector_read(fd, Some(off), iov, cnt, || {
                real!($slot as PreadvFn, (fd, iov, cnt, off)
                    else sys!(libc::SYS_preadv, fd, iov, cnt, off, 0) as isize)
            })
        }
    };
}
preadv_hook!(preadv, PREADV);
preadv_hook!(preadv64, PREADV64);

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
            let real = || real!($slot as Preadv2Fn, $cname, (fd, iov, cnt, off, flags) or -1);
            let at = if off == -1 { None } else { Some(off) };
            if flags != 0 {
                return read_at(fd, at, None, &Iov(&[]), real);
            }
            vector_read(fd, at, iov, cnt, real)
        }
    };
}
preadv2_hook!(preadv2, PREADV2, c"preadv2");
preadv2_hook!(preadv64v2, PREADV64V2, c"preadv64v2");

macro_rules! lseek_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: libc::off_t, whence: c_int) -> libc::off_t {
            read::seek(fd);
            real!($slot as LseekFn, (fd, off, whence)
                else sys!(libc::SYS_lseek, fd, off, whence) as libc::off_t)
        }
    };
}
lseek_hook!(lseek, LSEEK);
lseek_hook!(lseek64, LSEEK64);

type CopyFileRangeFn =
    unsafe extern "C" fn(c_int, *mut i64, c_int, *mut i64, usize, libc::c_uint) -> isize;
type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut libc::off_t, usize) -> isize;
type SpliceFn =
    unsafe extern "C" fn(c_int, *mut i64, c_int, *mut i64, usize, libc::c_uint) -> isize;
type FreadFn = unsafe extern "C" fn(*mut c_void, usize, usize, *mut libc::FILE) -> usize;

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: usize,
    flags: libc::c_uint,
) -> isize {
    read::kernel_reads(fd_in, off_in, len, |fd, off| {
        real!(COPY_FILE_RANGE as CopyFileRangeFn, c"copy_file_range",
            (fd, off, fd_out, off_out, len, flags) or -1)
    })
}

macro_rules! sendfile_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            out: c_int,
            fd_in: c_int,
            off: *mut libc::off_t,
            len: usize,
        ) -> isize {
            read::kernel_reads(fd_in, off, len, |fd, off| {
                real!($slot as SendfileFn, $cname, (out, fd, off, len) or -1)
            })
        }
    };
}
sendfile_hook!(sendfile, SENDFILE, c"sendfile");
sendfile_hook!(sendfile64, SENDFILE64, c"sendfile64");

#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: usize,
    flags: libc::c_uint,
) -> isize {
    read::kernel_reads(
        fd_in,
        off_in,
        len,
        |fd, off| real!(SPLICE as SpliceFn, c"splice", (fd, off, fd_out, off_out, len, flags) or -1),
    )
}

fn stream_fd(fp: *mut libc::FILE) -> c_int {
    if fp.is_null() {
        return -1;
    }
    // SAFETY: a non-null FILE* the caller passed to a stdio call; fileno only reads it.
    unsafe { libc::fileno(fp) }
}

macro_rules! fread_hook {
    ($name:ident, $slot:ident, $cname:literal) => {
        /// stdio reads the fd inside libc, where the `read` hook never sees it: the bytes it
        /// hands out are counted here.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buf: *mut c_void,
            size: usize,
            n: usize,
            fp: *mut libc::FILE,
        ) -> usize {
            let got = real!($slot as FreadFn, $cname, (buf, size, n, fp) or 0);
            if got > 0 {
                read::fread(stream_fd(fp), got.saturating_mul(size));
            }
            got
        }
    };
}
fread_hook!(fread, FREAD, c"fread");
fread_hook!(fread_unlocked, FREAD_UNLOCKED, c"fread_unlocked");
