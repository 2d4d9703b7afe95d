//! The few system calls std does not offer: `statx` into the table's `StatRec`, and `*at` calls
//! relative to a directory fd so nothing in a cache directory is followed through a symlink.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use granary_shm::StatRec;

fn cstr(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn uid() -> u32 {
    // SAFETY: getuid cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// `statx(path, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS | STATX_BTIME)`.
pub fn statx_nofollow(path: &Path) -> io::Result<StatRec> {
    let c = cstr(path.as_os_str().as_bytes())?;
    statx_at(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)
}

/// These credentials may list and search directory `path` (POSIX ACLs and all: the kernel
/// decides).
pub fn may_list(path: &Path) -> bool {
    let Ok(c) = cstr(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::R_OK | libc::X_OK, 0) == 0 }
}

/// The same record for an open file: what the fd holds (to compare with the catalog).
pub fn statx_fd(f: &impl AsRawFd) -> io::Result<StatRec> {
    statx_at(f.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

fn statx_at(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<StatRec> {
    // SAFETY: zeroed statx is a valid out-buffer; the kernel writes into it.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and sx is a valid, writable struct statx.
    check(unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            flags,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut sx,
        )
    })?;
    Ok(StatRec::from_statx(&sx))
}

/// Opens a directory without following a symlink in its last component.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: c is NUL-terminated; the returned fd is owned below.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates `name` in `dir` exclusively (never through a symlink), write-only, with `mode`.
pub fn create_excl_at(dir: &OwnedFd, name: &[u8], mode: u32) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: dir is an open directory fd, c is NUL-terminated; the fd is owned below.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens `name` in `dir` for reading, never through a symlink.
pub fn open_read_at(dir: &OwnedFd, name: &[u8]) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: as in create_excl_at.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

pub fn rename_at(dir: &OwnedFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated and relative to the same open directory.
    check(unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) })?;
    Ok(())
}

pub fn unlink_at(dir: &OwnedFd, name: &[u8]) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: c is NUL-terminated, dir is an open directory fd.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) })?;
    Ok(())
}

/// What `copy_stat_at` reports of a file in a tier.
#[derive(Debug, Clone, Copy)]
pub struct CopyStat {
    pub is_regular: bool,
    pub size: u64,
    pub ino: u64,
    pub ctime_ns: u64,
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` of a copy: type, size and identity.
pub fn copy_stat_at(dir: &OwnedFd, name: &[u8]) -> io::Result<CopyStat> {
    let c = cstr(name)?;
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dir fd, NUL-terminated name, writable out-buffer.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(CopyStat {
        is_regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
        size: st.st_size as u64,
        ino: st.st_ino,
        ctime_ns: (st.st_ctime as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(st.st_ctime_nsec as u64),
    })
}

/// Free bytes available to an unprivileged user on the file system holding `path`.
pub fn free_space(path: &Path) -> io::Result<u64> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path, writable out-buffer.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The user's login name, for default cache directory names (superseded by the uid-derived name
/// in `config::default_tier`).
pub fn user_name() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty() && !u.contains('/'))
        .unwrap_or_else(|| uid().to_string())
}

/// This process's credentials as a table's `H_CREDS` records them: `(uid, gid, groups hash)`.
/// The catalog answers permission questions with what these credentials could do.
pub fn creds() -> (u32, u32, u64) {
    // SAFETY: getgroups with a zero size only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0) as usize;
    let mut groups = vec![0 as libc::gid_t; n];
    // SAFETY: `groups` has room for `n` ids.
    let got = unsafe { libc::getgroups(n as libc::c_int, groups.as_mut_ptr()) }.max(0) as usize;
    groups.truncate(got);
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid, gid, granary_shm::groups_hash(&mut groups))
}

/// `(st_dev, st_ino)` of an open file or directory.
pub fn dev_ino(f: &impl AsRawFd) -> io::Result<(u64, u64)> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, writable out-buffer.
    check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
    Ok((st.st_dev, st.st_ino))
}

/// A copy's identity as clients check it: `(inode, ctime in ns)` of the open file.
pub fn copy_identity(f: &impl AsRawFd) -> io::Result<(u64, u64)> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, writable out-buffer.
    check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
    let ctime = (st.st_ctime as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(st.st_ctime_nsec as u64);
    Ok((st.st_ino, ctime))
}

/// The data extents of a file, as `lseek(SEEK_DATA/SEEK_HOLE)` reports them: `[start, end)`
/// pairs covering `[0, size)`'s data. A file system that cannot tell reports one extent, the
/// whole file (dense), which is also the answer on any error.
pub fn data_extents(f: &impl AsRawFd, size: u64) -> Vec<(u64, u64)> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < size {
        // SAFETY: lseek on an open fd; no memory involved.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole from `pos` to the end
            }
            return vec![(0, size)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return vec![(0, size)];
        }
        let (start, end) = (data as u64, (hole as u64).min(size));
        if end <= start {
            break;
        }
        out.push((start, end));
        pos = end;
    }
    out
}

/// uid of the process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_uid(sock: &impl AsRawFd) -> io::Result<u32> {
    // SAFETY: zeroed ucred is a valid out-buffer of the size we pass.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket fd, out-buffer and length describe `cred`.
    check(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(cred.uid)
}

/// Exclusive `flock` on an open file, released when the file is closed.
/// True if nobody holds an exclusive `flock` on `f` right now (takes and drops it at once).
pub fn flock_free(f: &File) -> bool {
    // SAFETY: flock on an open fd; the lock is released right away.
    unsafe {
        if libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 {
            libc::flock(f.as_raw_fd(), libc::LOCK_UN);
            return true;
        }
    }
    false
}

pub fn flock_exclusive(f: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock on an open fd.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `posix_fadvise`; advisory, so failures are ignored (the copy is correct either way).
pub fn fadvise(file: &impl AsRawFd, offset: u64, len: u64, advice: libc::c_int) {
    // SAFETY: advisory call on an open fd; touches no memory of ours.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            advice,
        );
    }
}

/// `sync_file_range(fd, offset, len, flags)`; errors are ignored: write-back pacing is an
/// optimisation, and a real write error shows up in `write` or the final checks.
pub fn sync_range(file: &impl AsRawFd, offset: u64, len: u64, flags: libc::c_uint) {
    // SAFETY: advisory call on an open fd; touches no memory of ours.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            flags,
        );
    }
}

/// True if `file` lives in memory (tmpfs, ramfs): there is no write-back to pace there, and
/// dropping its pages would drop the data.
pub fn is_memory_fs(file: &impl AsRawFd) -> bool {
    // SAFETY: zeroed statfs is a valid out-buffer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, writable out-buffer.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // `f_type`'s and the constant's C types differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    let t = st.f_type as i64;
    #[allow(clippy::unnecessary_cast)]
    let tmpfs = libc::TMPFS_MAGIC as i64;
    t == tmpfs || t == RAMFS_MAGIC
}

/// `preadv2(fd, buf, offset, RWF_NOWAIT)`: bytes already in the page cache, never a device read.
/// `EAGAIN` (nothing cached at `offset`) and `EOPNOTSUPP` (the file system cannot tell) come
/// back as errors; a short count means the cached run ends there.
pub fn pread_nowait(file: &impl AsRawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one iovec describing `buf`, which is valid and writable for its length.
    let n = unsafe {
        libc::preadv2(
            file.as_raw_fd(),
            &iov,
            1,
            offset as libc::off_t,
            libc::RWF_NOWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the table's heartbeat.
pub fn monotonic_ns() -> u64 {
    // SAFETY: zeroed timespec is a valid out-buffer.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid clock id and out-buffer; cannot fail for CLOCK_MONOTONIC.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// False only when no process `pid` exists (`kill(pid, 0)` fails with ESRCH); a process of
/// another user (EPERM) counts as alive.
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence; nothing is delivered.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Sets or clears `O_DIRECT` on an open file (`fcntl(F_SETFL)`): reads then go straight to the
/// device, past the page cache, in exactly the requests asked for (no readahead). `EINVAL`
/// when the file system does not support direct I/O.
pub fn set_direct(file: &impl AsRawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL on an open fd reads its status flags; touches no memory of ours.
    let fl = check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
    let want = if on {
        fl | libc::O_DIRECT
    } else {
        fl & !libc::O_DIRECT
    };
    if want != fl {
        // SAFETY: F_SETFL on an open fd with flags derived from its own; no memory involved.
        check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, want) })?;
    }
    Ok(())
}

/// Sets or clears `O_NONBLOCK` on an open file.
pub fn set_nonblock(file: &impl AsRawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an open fd with flags derived from its own; no memory involved.
    let fl = check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) })?;
    let want = if on {
        fl | libc::O_NONBLOCK
    } else {
        fl & !libc::O_NONBLOCK
    };
    if want != fl {
        // SAFETY: as above.
        check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, want) })?;
    }
    Ok(())
}

/// Gives the heap's free memory back to the kernel (`malloc_trim`). The agent runs in the job's
/// memory cgroup; after a catalog walk its walker threads' arenas hold megabytes of freed path
/// buffers that would otherwise stay resident, charged to the job, for the agent's life.
pub fn trim_heap() {
    // SAFETY: malloc_trim only returns unused heap pages to the kernel; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Returns the physical pages of a scratch buffer to the kernel (`MADV_DONTNEED` on the whole
/// pages inside it): its resident size drops to nearly nothing, and the next touch of each page
/// gets a fresh zero page. The contents are lost, which is what a scratch buffer allows.
pub fn release_pages(buf: &mut [u8]) {
    let page = 4096usize;
    let start = (buf.as_mut_ptr() as usize).div_ceil(page) * page;
    let end = (buf.as_mut_ptr() as usize + buf.len()) / page * page;
    if end > start {
        // SAFETY: [start, end) lies inside `buf`, which we borrow mutably (no one else reads
        // it); the memory is private anonymous memory from the allocator, for which
        // MADV_DONTNEED means "zero on next touch" and never touches allocator metadata outside
        // the range.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// Moves the calling thread to `SCHED_IDLE`: it runs only when a core would otherwise be idle
/// (background validation and hashing must never slow the program down).
pub fn sched_idle() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        tracing::debug!("SCHED_IDLE refused: {}", std::io::Error::last_os_error());
    }
}

/// Maps a file this process just created under a private name, read-write, to fill it in place
/// (a table image of a million entries never needs a second copy on the heap).
pub fn map_new_file(f: &File) -> io::Result<memmap2::MmapMut> {
    // SAFETY: the caller created `f` under a temporary name nobody else opens; nobody truncates
    // or remaps it while the mapping lives.
    unsafe { memmap2::MmapMut::map_mut(f) }
}

/// A read-only shared mapping of a file, never read through: `resident` asks the kernel which of
/// its pages are in the page cache (`mincore`), so the agent reads ahead only what is missing.
#[derive(Debug)]
pub struct Residency {
    map: memmap2::Mmap,
}

impl Residency {
    pub fn of(f: &File) -> io::Result<Residency> {
        // SAFETY: the mapping is only ever passed to mincore, never dereferenced, so a file
        // that shrinks or changes under it cannot fault or mislead us.
        let map = unsafe { memmap2::MmapOptions::new().map(f) }?;
        Ok(Residency { map })
    }

    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// One byte per 4 KiB page of `[off, off + len)` (clipped to the file) into `out`: bit 0
    /// set when the page is cached. `off` must be page-aligned.
    pub fn resident(&self, off: u64, len: u64, out: &mut Vec<u8>) -> io::Result<()> {
        let end = (off.saturating_add(len)).min(self.len());
        out.clear();
        if off >= end || off % 4096 != 0 {
            return Ok(());
        }
        let pages = (end - off).div_ceil(4096) as usize;
        out.resize(pages, 0);
        // SAFETY: `off..end` lies inside our mapping (page-aligned start), `out` holds one byte
        // per page of it; mincore only writes `out`.
        let r = unsafe {
            libc::mincore(
                self.map.as_ptr().add(off as usize) as *mut libc::c_void,
                (end - off) as usize,
                out.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// `readahead(2)`: the kernel reads `[off, off + len)` of `f` into the page cache in large
/// requests and returns once they are issued (pages already cached are skipped).
pub fn readahead(f: &impl AsRawFd, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: advisory call on an open fd; touches no memory of ours.
    let r = unsafe { libc::readahead(f.as_raw_fd(), off as libc::off64_t, len as usize) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
