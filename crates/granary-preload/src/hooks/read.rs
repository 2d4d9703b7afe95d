//! The read family, `mmap`, `lseek`, and the calls that read an fd inside the kernel or libc
//! (`copy_file_range`, `sendfile`, `splice`, `fread`): untracked fds pay one atomic load and pass
//! through; tier fds are counted; tracked source fds go through `place` (served from a partial
//! copy or chunk file, switched to a complete copy); a tier fd whose file the program changed in
//! place reads the source. Everything is counted by where the bytes came from.
//!
//! Reads at the fd's offset hold the fd's `BUSY` lock (`fdtable::lock`), so a switch never
//! interleaves with another thread's read of the same fd; served reads claim their range on the
//! fd's offset atomically (`serve::serve`), so every other sharer of it stays in step;
//! positioned reads need no lock.

use core::ffi::{c_int, c_void};

use granary_shm::{job, request, state};

use crate::detour::Guard;
use crate::fdtable::{self, FdKind, Tracked};
use crate::place::{self, Read};
use crate::serve::{self, ReadInto, Serve, Served};
use crate::switch;
use crate::sys::{self, real, sys};
use crate::usermem;

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize) -> isize;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t) -> isize;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, libc::off_t, usize) -> isize;
type ReadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;
type PreadvFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize;
type Preadv2Fn =
    unsafe extern "C" fn(c_int, *const libc::iovec, c_int, libc::off_t, c_int) -> isize;
type MmapFn =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
type LseekFn = unsafe extern "C" fn(c_int, libc::off_t, c_int) -> libc::off_t;

/// One buffer of the caller's.
struct Buf(*mut c_void);

impl ReadInto for Buf {
    fn read_into(&self, file: c_int, off: u64, want: u64) -> isize {
        pread_all(file, self.0.cast(), want, off)
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

/// What a read on a tracked fd returned, counted by where the bytes came from.
#[inline]
fn count(kind: FdKind, n: isize) -> isize {
    if n > 0 {
        if let Some(table) = crate::detour::table() {
            let slot = crate::detour::job_slot();
            match kind {
                FdKind::Source | FdKind::Other => {
                    table.count(slot, job::SOURCE_READS, 1);
                    table.count(slot, job::SOURCE_BYTES, n as u64);
                }
                FdKind::Tier(x) => table.count(slot, job::TIER_BYTES + x as usize, n as u64),
                FdKind::Dir | FdKind::Pack => {}
            }
        }
    }
    n
}

/// True if the entry of tier fd `t` was changed in place by the program, or its copy failed the
/// check after its open (`flag::DAMAGED`): its reads go to the source.
fn stale(t: &Tracked) -> bool {
    matches!(t.kind, FdKind::Tier(_))
        && (t.has(crate::fdtable::flag::DAMAGED)
            || crate::detour::table()
                .is_some_and(|tb| state::state_of(tb.state(t.entry)) == state::STALE))
}

/// True if a read on `t` may be served by granary (and so needs the caller's buffers).
fn may_serve(t: &Tracked) -> bool {
    t.kind == FdKind::Source || stale(t)
}

/// Shared body of the read family. `len` is the request's total length (`None`: unknown, pass
/// through), `off` the explicit offset (`None`: the fd's).
#[inline]
fn read_family(
    fd: c_int,
    off: Option<i64>,
    len: Option<u64>,
    f: &impl ReadInto,
    real: impl FnOnce() -> isize,
) -> isize {
    let Some(t) = crate::tracked::get(fd) else {
        return real();
    };
    if t.kind == FdKind::Dir {
        return real();
    }
    if off.is_some() && !may_serve(&t) {
        // The common case, a positioned read of a copy: count it, note its range.
        return real_read(fd, t.kind, off, real);
    }
    let Some(g) = crate::detour::enter_any_creds() else {
        return count(t.kind, real());
    };
    let locked = off.is_none() && fdtable::lock(fd);
    // Another thread may have switched the fd while we waited.
    let t = crate::tracked::get(fd).unwrap_or(t);
    let out = match (t.kind, len) {
        (FdKind::Source, Some(len)) => place::on_read(&g, fd, t, off, len, f),
        (FdKind::Tier(_), Some(len)) if stale(&t) => stale_read(&g, fd, t, off, len, f),
        (k, _) => Read::Real(k),
    };
    let n = match out {
        Read::Served(n) => n,
        Read::Failed(e) => {
            sys::set_errno(e);
            -1
        }
        Read::Real(kind) => real_read(fd, kind, off, real),
        Read::SourceThenChunk(idx, k) => {
            let n = real_read(fd, FdKind::Source, off, real);
            let _keep = sys::KeepErrno::new();
            g.table.push_request_arg(request::CHUNK, idx, k);
            n
        }
    };
    if locked {
        fdtable::unlock(fd);
    }
    n
}

fn real_read(fd: c_int, kind: FdKind, off: Option<i64>, real: impl FnOnce() -> isize) -> isize {
    let n = real();
    if let (FdKind::Tier(_), Some(o)) = (kind, off) {
        if n > 0 {
            fdtable::note_pread(fd, o as u64, n as u64);
        }
    }
    count(kind, n)
}

/// A read of a copy whose file the program changed in place: from the source, as a direct
/// reader (same inode) would see it. The fd moves to the source when nobody shares its OFD;
/// otherwise this one read is served from the source.
fn stale_read(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    off: Option<i64>,
    len: u64,
    f: &impl ReadInto,
) -> Read {
    let _keep = sys::KeepErrno::new();
    let Some(e) = crate::entries::get(g.table, t.entry) else {
        return Read::Real(t.kind);
    };
    if switch::to_source(g, fd, t, &e) {
        return Read::Real(FdKind::Source);
    }
    let Some(file) = switch::open_source(g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC) else {
        return Read::Real(t.kind);
    };
    let how = Serve {
        base: 0,
        // The source as it is now decides where the file ends.
        size: u64::MAX,
        transient: false,
        covered: &|_, _| true,
        // The fd is on the copy: after its offset moved, only the source may answer.
        fallback: None,
    };
    match serve::serve(fd, file, off, len, &how, f) {
        Served::Bytes(n, _) => Read::Served(count(FdKind::Source, n)),
        Served::Failed(e) => Read::Failed(e),
        Served::No => Read::Real(t.kind),
    }
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
    let Some(t) = crate::tracked::get(fd) else {
        return real();
    };
    if !may_serve(&t) {
        return read_family(fd, off, None, &Iov(&[]), real);
    }
    let mut copy = [libc::iovec {
        iov_base: core::ptr::null_mut(),
        iov_len: 0,
    }; usermem::MAX_IOV];
    match usermem::iovecs(iov, cnt, &mut copy) {
        Some((n, total)) => read_family(fd, off, Some(total), &Iov(&copy[..n]), real),
        None => read_family(fd, off, None, &Iov(&[]), real),
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
                return read_family(fd, at, None, &Iov(&[]), real);
            }
            vector_read(fd, at, iov, cnt, real)
        }
    };
}
preadv2_hook!(preadv2, PREADV2, c"preadv2");
preadv2_hook!(preadv64v2, PREADV64V2, c"preadv64v2");

/// `mmap` of a tracked fd: a source fd of a placed file is switched to the copy first; a file
/// not entirely local is mapped at once, from the source with what the tier holds mapped over
/// it (`mapping`); a copy the program changed since maps the source.
fn map(
    fd: c_int,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: libc::off_t,
    real: impl Fn(c_int) -> *mut c_void,
) -> *mut c_void {
    let Some(t) = crate::tracked::get(fd) else {
        return real(fd);
    };
    let Some(g) = crate::detour::enter_any_creds() else {
        return real(fd);
    };
    match t.kind {
        FdKind::Source => {
            if fdtable::lock(fd) {
                if let Some(now) = crate::tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
                    place::on_map(&g, fd, now);
                }
                fdtable::unlock(fd);
            }
            // Still a source fd (its OFD shared, so not switched): a complete copy backs the
            // mapping through an fd of its own (CPython's `mmap` dups the fd it maps).
            if let Some(p) = map_copy(&g, fd, prot, flags, &real) {
                return p;
            }
            let p = real(fd);
            if let Some(now) = crate::tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
                if p != libc::MAP_FAILED {
                    crate::mapping::source_mapped(&g, fd, now, p, len, prot, flags, off);
                }
            }
            p
        }
        FdKind::Tier(_) if stale(&t) => stale_map(&g, fd, t, prot, flags, real),
        _ => real(fd),
    }
}

/// A mapping of source fd `fd` backed by the complete copy through a temporary fd, when the file
/// is placed and the mapping cannot write through to the source (a shared writable mapping must
/// reach the source).
fn map_copy(
    g: &Guard,
    fd: c_int,
    prot: c_int,
    flags: c_int,
    real: &impl Fn(c_int) -> *mut c_void,
) -> Option<*mut c_void> {
    let t = crate::tracked::get(fd).filter(|n| n.kind == FdKind::Source)?;
    if prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0 {
        return None;
    }
    if state::state_of(g.table.state(t.entry)) != state::PLACED {
        return None;
    }
    let e = crate::entries::get(g.table, t.entry)?;
    let (copy, tier, _) =
        crate::copies::open_copy(g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC)?;
    let p = real(copy);
    let _keep = sys::KeepErrno::new();
    sys::raw_close(copy);
    if p != libc::MAP_FAILED {
        g.count(job::TIER_FILES + tier as usize, 1);
    }
    Some(p)
}

/// A mapping of a copy whose file the program changed: of the source (the fd moves there when
/// nobody shares its OFD; otherwise a source fd opened for the call backs the mapping).
fn stale_map(
    g: &Guard,
    fd: c_int,
    t: Tracked,
    prot: c_int,
    flags: c_int,
    real: impl Fn(c_int) -> *mut c_void,
) -> *mut c_void {
    let Some(e) = crate::entries::get(g.table, t.entry) else {
        return real(fd);
    };
    if fdtable::lock(fd) {
        let moved = switch::to_source(g, fd, t, &e);
        fdtable::unlock(fd);
        if moved {
            return real(fd);
        }
    }
    let writes = prot & libc::PROT_WRITE != 0 && flags & libc::MAP_SHARED != 0;
    let acc = if writes { libc::O_RDWR } else { libc::O_RDONLY };
    match switch::open_source(g, t.entry, &e, acc | libc::O_CLOEXEC) {
        Some(src) => {
            let p = real(src);
            let _keep = sys::KeepErrno::new();
            sys::raw_close(src);
            p
        }
        None => real(fd),
    }
}

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
            map(fd, len, prot, flags, off, |fd| {
                real!($slot as MmapFn, (addr, len, prot, flags, fd, off)
                    else sys!(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void)
            })
        }
    };
}
mmap_hook!(mmap, MMAP);
mmap_hook!(mmap64, MMAP64);

/// `lseek` of a source fd whose file is placed: the fd moves to the copy first (once nobody
/// shares it), so later reads need no hook work.
fn seek(fd: c_int) {
    let Some(t) = crate::tracked::get(fd).filter(|t| t.kind == FdKind::Source) else {
        return;
    };
    let Some(g) = crate::detour::enter_any_creds() else {
        return;
    };
    if switch::exclusive(&t) && fdtable::lock(fd) {
        if let Some(now) = crate::tracked::get(fd).filter(|n| n.kind == FdKind::Source) {
            place::on_seek(&g, fd, now);
        }
        fdtable::unlock(fd);
    }
}

macro_rules! lseek_hook {
    ($name:ident, $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: libc::off_t, whence: c_int) -> libc::off_t {
            seek(fd);
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

/// The calls in which the kernel reads `fd_in` itself (`copy_file_range`, `sendfile`, `splice`):
/// counted like a read of it. A copy whose file the program changed since must not be read: the
/// fd moves to the source when nobody shares it; otherwise the call reads the source, opened
/// for it, at `*off` or — with no `off` — at the fd's offset, claimed first as `serve::serve`
/// claims it, and what was not read given back. `call(fd, off)` makes the real call.
fn kernel_reads(
    fd_in: c_int,
    off: *mut i64,
    len: usize,
    call: impl Fn(c_int, *mut i64) -> isize,
) -> isize {
    let Some(t) = crate::tracked::get(fd_in) else {
        return call(fd_in, off);
    };
    if !stale(&t) {
        return count(t.kind, call(fd_in, off));
    }
    let Some(g) = crate::detour::enter_any_creds() else {
        return count(t.kind, call(fd_in, off));
    };
    let Some(e) = crate::entries::get(g.table, t.entry) else {
        return count(t.kind, call(fd_in, off));
    };
    let src = {
        let _keep = sys::KeepErrno::new();
        let moved = fdtable::lock(fd_in) && {
            let now = crate::tracked::get(fd_in).unwrap_or(t);
            let m = now.kind == FdKind::Source || switch::to_source(&g, fd_in, now, &e);
            fdtable::unlock(fd_in);
            m
        };
        if moved {
            None
        } else {
            switch::open_source(&g, t.entry, &e, libc::O_RDONLY | libc::O_CLOEXEC)
        }
    };
    let Some(src) = src else {
        // On the source now (or the source cannot be opened: the real call, as it would be).
        return count(FdKind::Source, call(fd_in, off));
    };
    let n = if off.is_null() {
        let want = len.min(0x7fff_f000) as i64;
        let moved = sys!(libc::SYS_lseek, fd_in, want, libc::SEEK_CUR);
        if moved < 0 {
            -1
        } else {
            let mut pos = moved - want;
            let n = call(src, &mut pos);
            let _keep = sys::KeepErrno::new();
            let back = want - n.max(0) as i64;
            if back > 0 {
                sys!(libc::SYS_lseek, fd_in, -back, libc::SEEK_CUR);
            }
            n
        }
    } else {
        call(src, off)
    };
    let _keep = sys::KeepErrno::new();
    sys::raw_close(src);
    count(FdKind::Source, n)
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: usize,
    flags: libc::c_uint,
) -> isize {
    kernel_reads(fd_in, off_in, len, |fd, off| {
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
            kernel_reads(fd_in, off, len, |fd, off| {
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
    kernel_reads(
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
                if let Some(t) = crate::tracked::get(stream_fd(fp)) {
                    let _keep = sys::KeepErrno::new();
                    count(t.kind, got.saturating_mul(size) as isize);
                }
            }
            got
        }
    };
}
fread_hook!(fread, FREAD, c"fread");
fread_hook!(fread_unlocked, FREAD_UNLOCKED, c"fread_unlocked");
