//! The few system calls std does not offer: `statx` into the table's `StatRec`, and `*at` calls
//! relative to a directory fd so nothing in a cache directory is followed through a symlink.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
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

/// These credentials may create files in directory `path` (the kernel decides, ACLs and
/// read-only mounts included).
pub fn may_write_in(path: &Path) -> bool {
    let Ok(c) = cstr(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK | libc::X_OK, 0) == 0 }
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

/// A reference to `path` that opens nothing (`O_PATH`, not following a symlink in its last
/// component): it keeps the kernel's cached inode and name of the entry, for as long as it is
/// held.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: c is NUL-terminated; the returned fd is owned below.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `open_path` of `name` in directory `dir` (an `O_PATH` fd will do).
pub fn open_path_at(dir: &OwnedFd, name: &[u8]) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: dir is an open fd, c is NUL-terminated; the fd is owned below.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates `name` in `dir` exclusively (never through a symlink), read-write (a received copy
/// is written through a shared mapping, which needs both), with `mode`.
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

/// Gives `f` `len` bytes of allocated space (its length becomes `len`): on tmpfs the pages are
/// allocated in one call, far cheaper than one fault each when a mapping is written.
pub fn allocate(f: &File, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on an open file descriptor; no memory involved.
    check(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) }).map(|_| ())
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

/// Opens `name` in `dir` for reading and writing, never through a symlink (a copy of the
/// agent's own, to be reused: `nobody_else_has_open`).
pub fn open_rw_at(dir: &OwnedFd, name: &[u8]) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: as in create_excl_at.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    })?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// True if no open file description other than `f` refers to `f`'s file (no fd of any process,
/// no mapping, however inherited): the kernel grants a write lease only then. The lease is given
/// back at once. `f` must be open for writing, and the file owned by this user. A process that
/// opens the file in between (it would block until the lease is given back) is told apart by the
/// caller (the name it opened by is gone first). The lease-break signal (SIGIO) must be ignored:
/// `ignore_lease_breaks`.
pub fn nobody_else_has_open(f: &File) -> bool {
    // SAFETY: fcntl on an open fd; no memory involved.
    let got = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) } == 0;
    if got {
        // SAFETY: as above: gives the lease back.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
    got
}

/// Ignores SIGIO in this process: a lease taken by `nobody_else_has_open` that another process
/// breaks in the microseconds it is held signals its holder, and SIGIO's default is to die.
pub fn ignore_lease_breaks() {
    // SAFETY: sets a signal's disposition to ignore; no handler runs.
    unsafe {
        libc::signal(libc::SIGIO, libc::SIG_IGN);
    }
}

pub fn rename_at(dir: &OwnedFd, from: &[u8], to: &[u8]) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both names are NUL-terminated and relative to the same open directory.
    check(unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) })?;
    Ok(())
}

/// Moves `name` from directory `from` to directory `to` (the same name; both fds verified
/// directories, so no path is followed). Fails with `EXDEV` across file systems.
pub fn rename_between(from: &OwnedFd, to: &OwnedFd, name: &[u8]) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: the name is NUL-terminated and relative to two open directory fds.
    check(unsafe { libc::renameat(from.as_raw_fd(), c.as_ptr(), to.as_raw_fd(), c.as_ptr()) })?;
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
    /// Owner and bytes allocated (`st_blocks` × 512), for `granary cache`.
    pub uid: u32,
    pub allocated: u64,
    pub mtime_s: i64,
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
        uid: st.st_uid,
        allocated: st.st_blocks as u64 * 512,
        mtime_s: st.st_mtime,
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

/// The size of the file system holding `path`, all of it.
pub fn fs_size(path: &Path) -> io::Result<u64> {
    let c = cstr(path.as_os_str().as_bytes())?;
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path, writable out-buffer.
    check(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    Ok(st.f_blocks as u64 * st.f_frsize as u64)
}

/// The login name of this process's uid (`getpwuid_r`), for default cache directory names;
/// the uid in decimal when the password database has no usable name (a container without the
/// user in /etc/passwd). Never `$USER`: the environment is the caller's to set, and a tier named
/// after another user's name is a directory that user may own.
pub fn user_name() -> String {
    let me = uid();
    // SAFETY: zeroed passwd is a valid out-buffer; getpwuid_r writes into it and `buf`.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: every pointer is valid for the sizes passed; the strings it sets point into `buf`.
    let r = unsafe { libc::getpwuid_r(me, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    let name = (r == 0 && !found.is_null() && !pw.pw_name.is_null())
        // SAFETY: pw_name is a NUL-terminated string inside `buf`, alive for this scope.
        .then(|| {
            unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| !n.is_empty() && !n.contains('/') && n != "." && n != "..");
    name.unwrap_or_else(|| me.to_string())
}

/// This process's credentials as a table's `H_CREDS` records them: `(uid, gid, groups hash)`.
/// The catalog answers permission questions with what these credentials could do.
pub fn creds() -> (u32, u32, u64) {
    let mut groups = groups();
    // SAFETY: geteuid/getegid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid, gid, granary_shm::groups_hash(&mut groups))
}

/// A duplicate of `f` that an exec'd program inherits (no close-on-exec), at the lowest free
/// number at or above `floor`.
pub fn dup_inheritable(f: &impl AsRawFd, floor: i32) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD on a valid fd; the kernel returns a new fd or -1.
    let fd = check(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD, floor) })?;
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The soft limit on open files (`RLIMIT_NOFILE`).
pub fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// Raises the soft limit on open files to the hard one; returns the soft limit now.
pub fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; raising the soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return want.rlim_cur;
        }
    }
    lim.rlim_cur
}

/// This process's supplementary groups.
pub fn groups() -> Vec<u32> {
    // SAFETY: getgroups with a zero size only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0) as usize;
    let mut groups = vec![0 as libc::gid_t; n];
    // SAFETY: `groups` has room for `n` ids.
    let got = unsafe { libc::getgroups(n as libc::c_int, groups.as_mut_ptr()) }.max(0) as usize;
    groups.truncate(got);
    groups
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

/// The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`): for a
/// client, those of the process that was listening.
fn peer_cred(sock: &impl AsRawFd) -> io::Result<libc::ucred> {
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
    Ok(cred)
}

/// uid of the process at the other end of a Unix socket.
pub fn peer_uid(sock: &impl AsRawFd) -> io::Result<u32> {
    Ok(peer_cred(sock)?.uid)
}

/// pid of the process at the other end of a Unix socket.
pub fn peer_pid(sock: &impl AsRawFd) -> io::Result<u32> {
    Ok(peer_cred(sock)?.pid as u32)
}

/// Connects to a Unix stream socket, giving up after `limit` (`TimedOut`). A listener that does
/// not accept (a stopped process) lets connections queue until its backlog is full; after that
/// a blocking `connect` would wait for ever, so the connect is non-blocking and retried.
pub fn connect_unix(path: &Path, limit: std::time::Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: zeroed sockaddr_un is valid (AF_UNSPEC, empty path) before we fill it in.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    let deadline = std::time::Instant::now() + limit;
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = check(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: fd was just created and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    loop {
        // SAFETY: addr is an initialised sockaddr_un and len does not exceed its size.
        let r = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                len,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // The backlog is full: nobody is accepting right now.
            Some(libc::EAGAIN) if std::time::Instant::now() < deadline => {
                crate::sync::thread::sleep(std::time::Duration::from_millis(20))
            }
            Some(libc::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the socket's listener accepts no connection",
                ))
            }
            _ => return Err(e),
        }
    }
    let stream = UnixStream::from(sock);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `D`, `T` stopped, `t` traced, `Z`, …),
/// `None` when there is no such process.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself contain ") ".
    stat.rsplit_once(") ")?.1.chars().next()
}

/// True once every thread of process `pid` has exited: no such process, or a zombie whose
/// other threads are gone too. A group leader turns zombie while its other threads may still
/// run — holding the process's fds (an agent's listening socket) open.
pub fn process_gone(pid: u32) -> bool {
    match process_state(pid) {
        None => true,
        Some('Z') | Some('X') => std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count() <= 1)
            .unwrap_or(true),
        Some(_) => false,
    }
}

/// uid owning process `pid` (that of `/proc/<pid>`), `None` when there is no such process.
pub fn process_uid(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill(2) with a positive pid; no memory involved.
    check(unsafe { libc::kill(pid as libc::pid_t, sig) })?;
    Ok(())
}

/// Exclusive `flock` on `f`, waiting at most `limit`; false if it is still held by someone else
/// then.
pub fn flock_exclusive_within(f: &File, limit: std::time::Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        // SAFETY: flock on an open fd.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) | Some(libc::EINTR) => {}
            _ => return Err(e),
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        crate::sync::thread::sleep(std::time::Duration::from_millis(20));
    }
}

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

/// Asks the kernel to back the whole `huge`-sized pages inside `buf` with transparent huge
/// pages from their next fault on (`MADV_HUGEPAGE`); advisory, ignored where THP is off.
pub fn hugepage_hint(buf: &mut [u8], huge: usize) {
    let start = (buf.as_mut_ptr() as usize).div_ceil(huge) * huge;
    let end = (buf.as_mut_ptr() as usize + buf.len()) / huge * huge;
    if end > start {
        // SAFETY: [start, end) lies inside `buf`, which we borrow mutably; MADV_HUGEPAGE only
        // changes how later faults in the range are backed, never its contents or mapping.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
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

/// CPUs online on the node.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system value; no memory is touched.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// CPU time the calling thread has used (zero if the clock cannot be read).
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec we own.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// CPUs the calling thread may run on.
fn cpus_allowed() -> io::Result<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `set` is a cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `set` was filled by sched_getaffinity.
    Ok(unsafe { libc::CPU_COUNT(&set) } as usize)
}

/// Lets the calling thread, and the threads it starts from now on, run on every CPU the
/// system allows it (the kernel keeps a cpuset's limit); returns the CPUs before and after.
/// For a service started by an MPI launcher, which binds each rank to one core or socket as
/// it would a compute process.
pub fn unbind() -> io::Result<(usize, usize)> {
    let before = cpus_allowed()?;
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's size in bits.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, cpus_allowed()?))
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
pub struct CachedPages {
    map: memmap2::Mmap,
}

impl CachedPages {
    pub fn of(f: &File) -> io::Result<CachedPages> {
        // SAFETY: the mapping is only ever passed to mincore, never dereferenced, so a file
        // that shrinks or changes under it cannot fault or mislead us.
        let map = unsafe { memmap2::MmapOptions::new().map(f) }?;
        Ok(CachedPages { map })
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
