//! What granary does for the calls that start programs (`exec*`, `posix_spawn*`): nothing to
//! the call, which runs with the caller's arguments; it notes, for the job's report, whether the
//! new program will get granary. Its environment must still name the preload library and the
//! table (`env -i`, a launcher's clean environment drop them), and the dynamic loader must
//! honour `LD_PRELOAD` for it (a static program has no loader; a
//! setuid, setgid or file-capability program runs in secure mode, which ignores it). A program
//! that will not get granary is recorded in the job's `SEEN` word, the reason in its bits; one
//! that should is counted in `EXECS`, so `granary run` can tell when fewer processes attached
//! than were started with the library (it did not load, or the table was out of reach).
//!
//! Called from the `exec`/`posix_spawn` hooks, possibly in a vfork child that shares its
//! parent's memory: raw system calls, stack buffers and atomics only, no guard (a guard set here
//! would stay set in the parent after a successful `exec`).

use core::ffi::{c_char, c_int, CStr};

use granary_shm::{job, seen};

use crate::sys::PATH_BUF;
use crate::sys::{self, sys};

/// The program to be started, as the call names it.
#[derive(Clone, Copy)]
pub enum Target {
    /// A path, used as is (`execve`, `posix_spawn`).
    Path(*const c_char),
    /// A name looked up in `PATH` unless it has a slash (`execvp`, `posix_spawnp`).
    Search(*const c_char),
    /// An open file (`fexecve`).
    Fd(c_int),
}

/// A start counted in `EXECS`; taken back with `failed` when the call returns an error.
pub struct Counted {
    slot: u32,
}

extern "C" {
    static environ: *const *const c_char;
}

/// The current environment (what `execv`/`execvp` pass on).
pub fn current_env() -> *const *const c_char {
    // SAFETY: reads the pointer glibc keeps in `environ`; no allocation, no lock.
    unsafe { environ }
}

/// Looks at a start before the real call. `None` when the table is not mapped in this process
/// or the program is not expected to attach.
pub fn before(target: Target, envp: *const *const c_char) -> Option<Counted> {
    let table = crate::ops::detour::table()?;
    let slot = crate::ops::detour::job_slot();
    let env = Env::scan(envp);
    if env.disabled || env.other_job {
        return None;
    }
    if !env.preload || !env.table {
        table.mark(slot, job::SEEN, seen::EXEC_ENV_CLEARED);
        return None;
    }
    if let Some(fd) = env.table_fd {
        let fd_ok =
            crate::init::attach::table_fd() == fd && sys!(libc::SYS_fcntl, fd, libc::F_GETFD) == 0;
        if !fd_ok {
            table.mark(slot, job::SEEN, seen::FD_LOST);
        }
    }
    match loader_of(target) {
        Loader::Static => {
            table.mark(slot, job::SEEN, seen::EXEC_STATIC);
            None
        }
        Loader::Secure => {
            table.mark(slot, job::SEEN, seen::EXEC_SECURE);
            None
        }
        Loader::Dynamic => {
            table.count(slot, job::EXECS, 1);
            Some(Counted { slot })
        }
    }
}

/// The real call returned an error: the program did not start.
pub fn failed(c: Option<Counted>) {
    if let (Some(c), Some(table)) = (c, crate::ops::detour::table()) {
        table.uncount(c.slot, job::EXECS, 1);
    }
}

/// What an environment says about granary.
#[derive(Default)]
struct Env {
    /// `LD_PRELOAD` names a `libgranary_preload*` library.
    preload: bool,
    /// `GRANARY_TABLE` or `GRANARY_TABLE_FD` is set.
    table: bool,
    table_fd: Option<c_int>,
    /// `GRANARY_DISABLE` turns granary off on purpose.
    disabled: bool,
    /// `GRANARY_TABLE_ID` names another job's table.
    other_job: bool,
}

impl Env {
    fn scan(envp: *const *const c_char) -> Env {
        let mut e = Env::default();
        if envp.is_null() {
            return e;
        }
        // Bounded: an environment larger than this is not searched further.
        for i in 0..65536 {
            // SAFETY: `envp` is a NULL-terminated array of C strings, as exec requires; we stop
            // at its NULL.
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: each element is a NUL-terminated string.
            let var = unsafe { CStr::from_ptr(p) }.to_bytes();
            if let Some(v) = var.strip_prefix(b"LD_PRELOAD=") {
                e.preload = v
                    .split(|&b| b == b':' || b == b' ')
                    .any(|lib| base_name(lib).starts_with(b"libgranary_preload"));
            } else if let Some(v) = var.strip_prefix(b"GRANARY_TABLE_FD=") {
                e.table = true;
                e.table_fd = crate::sys::env::parse_u32(v).map(|v| v as c_int);
            } else if let Some(v) = var.strip_prefix(b"GRANARY_TABLE_ID=") {
                e.other_job = crate::init::attach::names_another_table(v);
            } else if var.starts_with(b"GRANARY_TABLE=") {
                e.table = true;
            } else if let Some(v) = var.strip_prefix(b"GRANARY_DISABLE=") {
                e.disabled = !v.is_empty() && v != b"0";
            }
        }
        e
    }
}

fn base_name(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => p.get(i + 1..).unwrap_or(b""),
        None => p,
    }
}

enum Loader {
    /// `LD_PRELOAD` applies (or the start fails anyway, or we cannot tell: assume it applies).
    Dynamic,
    Static,
    Secure,
}

fn loader_of(target: Target) -> Loader {
    let fd = match target {
        Target::Fd(fd) => return inspect(fd),
        Target::Path(p) => open_exe(p),
        Target::Search(name) => {
            // SAFETY: the caller's NUL-terminated program name.
            let n = unsafe { CStr::from_ptr(name) }.to_bytes();
            if n.contains(&b'/') {
                open_exe(name)
            } else {
                search(n)
            }
        }
    };
    if fd < 0 {
        return Loader::Dynamic;
    }
    let l = inspect(fd);
    sys::raw_close(fd);
    l
}

fn open_exe(path: *const c_char) -> c_int {
    sys::raw_openat(
        libc::AT_FDCWD,
        path,
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        0,
    )
}

/// The first executable `name` in `PATH` (glibc's default search path without one), opened.
fn search(name: &[u8]) -> c_int {
    let env = current_env();
    let mut path: &[u8] = b"/bin:/usr/bin";
    if !env.is_null() {
        for i in 0..65536 {
            // SAFETY: as in `Env::scan`.
            let p = unsafe { *env.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: as in `Env::scan`.
            let var = unsafe { CStr::from_ptr(p) }.to_bytes();
            if let Some(v) = var.strip_prefix(b"PATH=") {
                path = v;
                break;
            }
        }
    }
    let mut buf = [0u8; PATH_BUF];
    for dir in path.split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let len = dir.len() + 1 + name.len();
        let Some(dst) = buf.get_mut(..len + 1) else {
            continue;
        };
        dst[..dir.len()].copy_from_slice(dir);
        dst[dir.len()] = b'/';
        dst[dir.len() + 1..len].copy_from_slice(name);
        dst[len] = 0;
        let ok = sys!(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            buf.as_ptr(),
            libc::X_OK,
            0
        ) == 0;
        if ok {
            let fd = open_exe(buf.as_ptr().cast());
            if fd >= 0 {
                return fd;
            }
        }
    }
    -1
}

/// How the dynamic loader will treat the program open at `fd`.
fn inspect(fd: c_int) -> Loader {
    let mut st = sys::empty_stat();
    if sys::raw_fstat(fd, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Loader::Dynamic;
    }
    let euid = sys!(libc::SYS_geteuid) as u32;
    let egid = sys!(libc::SYS_getegid) as u32;
    let setuid = st.st_mode & libc::S_ISUID != 0 && st.st_uid != euid;
    let setgid = st.st_mode & libc::S_ISGID != 0 && st.st_gid != egid;
    let caps = euid != 0
        && sys!(
            libc::SYS_fgetxattr,
            fd,
            c"security.capability".as_ptr(),
            core::ptr::null_mut::<u8>(),
            0
        ) > 0;
    if setuid || setgid || caps {
        return Loader::Secure;
    }
    match has_interp(fd) {
        Some(false) => Loader::Static,
        _ => Loader::Dynamic,
    }
}

/// `Some(true)` for a 64-bit ELF program with a `PT_INTERP` header (it names its dynamic
/// loader), `Some(false)` for one without (static), `None` for anything else (a script, whose
/// interpreter loads the library; another format).
fn has_interp(fd: c_int) -> Option<bool> {
    let mut h = [0u8; 64];
    if pread(fd, &mut h, 0)? < 64 || h.get(..4)? != b"\x7fELF" || h[4] != 2 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_ne_bytes([*h.get(o)?, *h.get(o + 1)?]));
    let phoff = u64::from_ne_bytes(h.get(0x20..0x28)?.try_into().ok()?);
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    if phentsize < 4 || phnum == 0 {
        return None;
    }
    let mut ph = [0u8; 4096];
    let len = phentsize.checked_mul(phnum)?.min(ph.len());
    let got = pread(fd, ph.get_mut(..len)?, phoff)?;
    for i in 0..got / phentsize {
        let t = ph.get(i * phentsize..i * phentsize + 4)?;
        if u32::from_ne_bytes(t.try_into().ok()?) == libc::PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

fn pread(fd: c_int, buf: &mut [u8], off: u64) -> Option<usize> {
    let n = sys!(libc::SYS_pread64, fd, buf.as_mut_ptr(), buf.len(), off);
    usize::try_from(n).ok()
}
