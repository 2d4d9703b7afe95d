//! The library's own way to the kernel and to libc, never through a hook of ours: raw system
//! calls (`sys!`), the real libc functions behind our interposed symbols (`real!`), and errno.
//!
//! Real symbols are resolved once, in the constructor (`init`). A hook that runs before that
//! (another library's constructor) must not call `dlsym` — it can allocate and deadlock — so the
//! `real!` wrappers fall back to the raw system call where one exists.

use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicUsize, Ordering};

pub mod env;
pub mod log;
pub mod mounts;
pub mod pid;
pub mod procmaps;
pub mod statbuf;
pub mod usermem;

/// Room for one path and its NUL: the buffers paths are built in (on the stack).
pub const PATH_BUF: usize = libc::PATH_MAX as usize + 1;

pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Restores errno when dropped: our own extra calls must not change what the caller sees.
pub struct KeepErrno(c_int);

impl KeepErrno {
    pub fn new() -> KeepErrno {
        KeepErrno(errno())
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        set_errno(self.0);
    }
}

/// A raw syscall with libc's convention (-1 and errno on failure).
/// `syscall` is variadic and reads every argument as a long: callers pass `c_long`s only.
macro_rules! sys {
    ($nr:expr $(, $a:expr)*) => {
        // SAFETY: a plain system call; the kernel validates every argument and pointer.
        unsafe { libc::syscall($nr $(, $a as libc::c_long)*) }
    };
}
pub(crate) use sys;

/// Slots for the real functions, filled by `resolve_all` in the constructor.
macro_rules! real_slots {
    ($($slot:ident = $name:literal;)*) => {
        $(pub static $slot: AtomicUsize = AtomicUsize::new(0);)*
        static SLOTS: &[(&AtomicUsize, &CStr)] = &[$((&$slot, $name)),*];
    };
}

real_slots! {
    OPEN = c"open"; OPEN64 = c"open64"; OPEN_2 = c"__open_2"; OPEN64_2 = c"__open64_2";
    OPENAT = c"openat"; OPENAT64 = c"openat64"; OPENAT_2 = c"__openat_2";
    OPENAT64_2 = c"__openat64_2"; CREAT = c"creat"; CREAT64 = c"creat64";
    FOPEN = c"fopen"; FOPEN64 = c"fopen64"; FREOPEN = c"freopen"; FREOPEN64 = c"freopen64";
    FDOPEN = c"fdopen"; FCLOSE = c"fclose";
    STAT = c"stat"; STAT64 = c"stat64"; LSTAT = c"lstat"; LSTAT64 = c"lstat64";
    FSTATAT = c"fstatat"; FSTATAT64 = c"fstatat64"; STATX = c"statx";
    FSTAT = c"fstat"; FSTAT64 = c"fstat64";
    XSTAT = c"__xstat"; XSTAT64 = c"__xstat64"; LXSTAT = c"__lxstat"; LXSTAT64 = c"__lxstat64";
    FXSTATAT = c"__fxstatat"; FXSTATAT64 = c"__fxstatat64"; FXSTAT = c"__fxstat";
    FXSTAT64 = c"__fxstat64";
    ACCESS = c"access"; FACCESSAT = c"faccessat";
    OPENDIR = c"opendir"; READDIR = c"readdir"; READDIR64 = c"readdir64";
    CLOSEDIR = c"closedir"; REWINDDIR = c"rewinddir"; TELLDIR = c"telldir"; SEEKDIR = c"seekdir";
    READLINK = c"readlink"; READLINKAT = c"readlinkat"; REALPATH = c"realpath";
    REALPATH_CHK = c"__realpath_chk";
    CLOSE = c"close"; CLOSE_RANGE = c"close_range"; DUP = c"dup"; DUP2 = c"dup2";
    DUP3 = c"dup3"; FCNTL = c"fcntl"; FCNTL64 = c"fcntl64"; CHDIR = c"chdir";
    FCHDIR = c"fchdir"; READ = c"read"; PREAD = c"pread"; PREAD64 = c"pread64"; READV = c"readv";
    PREADV = c"preadv"; PREADV64 = c"preadv64"; PREADV2 = c"preadv2";
    PREADV64V2 = c"preadv64v2"; READ_CHK = c"__read_chk";
    PREAD_CHK = c"__pread_chk"; PREAD64_CHK = c"__pread64_chk";
    MMAP = c"mmap"; MMAP64 = c"mmap64"; MREMAP = c"mremap"; MUNMAP = c"munmap"; LSEEK = c"lseek"; LSEEK64 = c"lseek64";
    UNLINK = c"unlink"; UNLINKAT = c"unlinkat"; RMDIR = c"rmdir"; RENAME = c"rename";
    RENAMEAT = c"renameat"; RENAMEAT2 = c"renameat2"; MKDIR = c"mkdir"; MKDIRAT = c"mkdirat";
    LINK = c"link"; LINKAT = c"linkat"; SYMLINK = c"symlink"; SYMLINKAT = c"symlinkat";
    TRUNCATE = c"truncate"; TRUNCATE64 = c"truncate64"; CHMOD = c"chmod";
    FCHMODAT = c"fchmodat"; CHOWN = c"chown"; LCHOWN = c"lchown"; FCHOWNAT = c"fchownat";
    UTIME = c"utime"; UTIMES = c"utimes"; LUTIMES = c"lutimes"; FUTIMESAT = c"futimesat";
    UTIMENSAT = c"utimensat"; SETXATTR = c"setxattr"; LSETXATTR = c"lsetxattr";
    REMOVEXATTR = c"removexattr"; LREMOVEXATTR = c"lremovexattr"; MKNOD = c"mknod";
    MKNODAT = c"mknodat"; FCHMOD = c"fchmod"; FCHOWN = c"fchown"; FUTIMENS = c"futimens";
    FUTIMES = c"futimes"; FSETXATTR = c"fsetxattr"; FREMOVEXATTR = c"fremovexattr";
    GETXATTR = c"getxattr"; LGETXATTR = c"lgetxattr"; FGETXATTR = c"fgetxattr";
    LISTXATTR = c"listxattr"; LLISTXATTR = c"llistxattr"; FLISTXATTR = c"flistxattr";
    FLOCK = c"flock"; LOCKF = c"lockf"; LOCKF64 = c"lockf64"; FSTATFS = c"fstatfs";
    FSTATFS64 = c"fstatfs64"; IOCTL = c"ioctl"; SENDMSG = c"sendmsg";
    COPY_FILE_RANGE = c"copy_file_range"; SENDFILE = c"sendfile"; SENDFILE64 = c"sendfile64";
    SPLICE = c"splice";
    FREAD = c"fread"; FREAD_UNLOCKED = c"fread_unlocked";
    SETUID = c"setuid"; SETEUID = c"seteuid"; SETREUID = c"setreuid"; SETRESUID = c"setresuid";
    SETGID = c"setgid"; SETEGID = c"setegid"; SETREGID = c"setregid"; SETRESGID = c"setresgid";
    SETGROUPS = c"setgroups"; INITGROUPS = c"initgroups"; SETFSUID = c"setfsuid";
    SETFSGID = c"setfsgid";
    EXECVE = c"execve"; EXECV = c"execv"; EXECVP = c"execvp"; EXECVPE = c"execvpe";
    FEXECVE = c"fexecve"; POSIX_SPAWN = c"posix_spawn"; POSIX_SPAWNP = c"posix_spawnp";
}

/// Resolves every real symbol with `dlsym(RTLD_NEXT)`. Constructor only.
pub fn resolve_all() {
    for (slot, name) in SLOTS {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips our own definitions.
        let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        if p == 0 {
            p = versioned(name);
        }
        slot.store(p, Ordering::Release);
    }
}

/// The `__xstat` family survives only as compat symbols in glibc >= 2.33, which unversioned
/// `dlsym` does not return.
fn versioned(name: &CStr) -> usize {
    #[cfg(target_arch = "x86_64")]
    const BASE: &CStr = c"GLIBC_2.2.5";
    #[cfg(target_arch = "aarch64")]
    const BASE: &CStr = c"GLIBC_2.17";
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const BASE: &CStr = c"GLIBC_2.0";
    // SAFETY: dlvsym with NUL-terminated strings.
    unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), BASE.as_ptr()) as usize }
}

/// The function in `slot`, if resolved. Hooks only call this for functions without a system
/// call of their own after the constructor has run (or lazily, for stdio/dirent calls that
/// cannot happen before libc is initialised).
pub fn lookup(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // SAFETY: as in `resolve_all`. Reached only for library functions (no syscall exists), and
    // only when a hook runs before our constructor.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if p == 0 {
        p = versioned(name);
    }
    slot.store(p, Ordering::Release);
    p
}

/// Calls the real function in `$slot` (type `$ty`), or evaluates `$fallback` when it is not
/// resolved yet.
macro_rules! real {
    ($slot:ident as $ty:ty, ($($arg:expr),*) else $fallback:expr) => {{
        let p = $crate::sys::$slot.load(core::sync::atomic::Ordering::Acquire);
        if p == 0 {
            $fallback
        } else {
            // SAFETY: `p` is the address dlsym returned for this symbol, whose C prototype is
            // `$ty`; the arguments are the caller's own (or ours, valid for the call).
            unsafe { core::mem::transmute::<usize, $ty>(p)($($arg),*) }
        }
    }};
    ($slot:ident as $ty:ty, $name:expr, ($($arg:expr),*) or $fail:expr) => {{
        let p = $crate::sys::lookup(&$crate::sys::$slot, $name);
        if p == 0 {
            $crate::sys::set_errno(libc::ENOSYS);
            $fail
        } else {
            // SAFETY: as above.
            unsafe { core::mem::transmute::<usize, $ty>(p)($($arg),*) }
        }
    }};
}
pub(crate) use real;

/// Raw-syscall pieces the library needs for its own work (never hooked, never allocating).
pub fn raw_openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    sys!(libc::SYS_openat, dirfd, path, flags, mode) as c_int
}

pub fn raw_close(fd: c_int) -> c_int {
    sys!(libc::SYS_close, fd) as c_int
}

pub fn raw_fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    sys!(libc::SYS_fstat, fd, st) as c_int
}

pub fn raw_newfstatat(dirfd: c_int, path: *const c_char, st: *mut c_void, flags: c_int) -> c_int {
    sys!(libc::SYS_newfstatat, dirfd, path, st, flags) as c_int
}

pub fn raw_stat(dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int {
    raw_newfstatat(dirfd, path, st.cast(), flags)
}

pub fn raw_write(fd: c_int, buf: &[u8]) {
    let _ = sys!(libc::SYS_write, fd, buf.as_ptr(), buf.len());
}

/// Whether fds `a` and `b` of this process name one open file description (`kcmp(2)`,
/// `KCMP_FILE`); `None` when the kernel cannot say (no `kcmp`, or a seccomp filter refuses it).
///
/// Only where `kcmp_allowed()` said yes (the caller asks once for all its pairs): the
/// program never calls `kcmp`, so a seccomp filter written for it may refuse it or kill the
/// process for it (systemd's `SystemCallFilter=` kills by default).
pub fn same_file(a: c_int, b: c_int) -> Option<bool> {
    const KCMP_FILE: c_int = 0;
    let _keep = KeepErrno::new();
    let pid = pid::current();
    match sys!(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) {
        0 => Some(true),
        r if r > 0 => Some(false),
        _ => None,
    }
}

/// Whether `same_file` may call `kcmp`: true if `/proc/thread-self/status` says this thread
/// runs under no seccomp filter (`Seccomp:\t0`); false under one, or when it cannot be read.
/// Asked anew each time: a filter may be installed at any moment, never removed. Out of line
/// and cold: its 8 KiB buffer stays out of the callers' frames.
#[cold]
#[inline(never)]
pub fn kcmp_allowed() -> bool {
    let _keep = KeepErrno::new();
    let fd = raw_openat(
        libc::AT_FDCWD,
        c"/proc/thread-self/status".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 8192];
    let mut have = 0usize;
    while let Some(room) = buf.get_mut(have..).filter(|r| !r.is_empty()) {
        let n = sys!(libc::SYS_read, fd, room.as_mut_ptr(), room.len());
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        have += n as usize;
    }
    raw_close(fd);
    const FIELD: &[u8] = b"\nSeccomp:\t";
    let text = buf.get(..have).unwrap_or(&[]);
    text.windows(FIELD.len())
        .position(|w| w == FIELD)
        .and_then(|at| text.get(at + FIELD.len()))
        == Some(&b'0')
}

/// True if this thread may have `CAP_SYS_ADMIN` in its effective set (`capget`; true when the
/// kernel will not say). Never changes errno.
pub fn has_cap_sys_admin() -> bool {
    has_cap(21)
}

/// True if this thread may have capability `cap` (0–31) in its effective set (`capget`; true
/// when the kernel will not say). Never changes errno.
pub fn has_cap(cap: u32) -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    /// `_LINUX_CAPABILITY_VERSION_3`: two `Data` words, capabilities 0–31 in the first.
    const VERSION_3: u32 = 0x2008_0522;
    let _keep = KeepErrno::new();
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    let r = sys!(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr());
    r != 0 || d[0].effective & (1u32.checked_shl(cap).unwrap_or(0)) != 0
}

pub fn empty_stat() -> libc::stat {
    // SAFETY: `struct stat` is plain integers; all-zero is a valid value.
    unsafe { core::mem::zeroed() }
}

pub fn empty_statx() -> libc::statx {
    // SAFETY: `struct statx` is plain integers; all-zero is what the kernel leaves unfilled.
    unsafe { core::mem::zeroed() }
}

pub fn empty_flock() -> libc::flock {
    // SAFETY: `struct flock` is plain integers; all-zero is a valid value.
    unsafe { core::mem::zeroed() }
}
