//! What granary does for the calls that start programs (`exec*`, `posix_spawn*`): the call
//! runs with the caller's arguments, and the new program gets granary whenever it can.
//!
//! A program started with an environment cleared of granary's variables (CPython's
//! `subprocess.run(..., env={...})`, `ctypes.util.find_library`'s `ldconfig -p`, `env -i`, a
//! launcher's clean environment) is given them back — `LD_PRELOAD`'s entry for this library and
//! the `GRANARY_*` variables this process got (`init::jobvars`) — in an environment built on the
//! hook's stack: the job asked for its programs to be served. `GRANARY_DISABLE=1` in a child's
//! environment keeps granary out of it, as it does for any process. Not for programs the
//! dynamic loader cannot give the library: a static program has no loader, and a setuid,
//! setgid or file-capability program runs in secure mode, which ignores `LD_PRELOAD`.
//!
//! Such a program, one whose cleared environment has no room for the variables, is served
//! nothing. It is named in the job's report only when its arguments named a path of the
//! dataset (`Table::record_unserved`): `ldconfig`, `uname` or a compiler the program runs read
//! nothing of it, and a warning about them would be false. A program that will be served is
//! counted in `EXECS`, so `granary run` can tell when fewer processes attached than were
//! started with the library (it did not load, or the table was out of reach).
//!
//! Called from the `exec`/`posix_spawn` hooks, possibly in a vfork child that shares its
//! parent's memory: raw system calls, stack buffers and atomics only, no guard (a guard set here
//! would stay set in the parent after a successful `exec`).

use core::ffi::{c_char, c_int, CStr};

use granary_shm::{job, seen, Table};

use crate::init::jobvars::{self, NAMES};
use crate::ops::path::{self, Buf};
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

/// What the real call is given: the caller's environment or, with granary's variables put
/// back, one in the hook's `EnvBuf`; and whether the start was counted.
pub struct Start {
    pub counted: Option<Counted>,
    pub envp: *const *const c_char,
}

/// Variables an environment with granary's put back may hold (the caller's and ours), and the
/// room for an `LD_PRELOAD` that had to have this library added in front. A larger one cannot
/// be given them.
const ENV_MAX: usize = 1024;
const PRELOAD_MAX: usize = 4096;

/// Room for the environment of a start that gets granary's variables back, in the hook's frame
/// (12 KiB of stack, no allocation: the hook may run in a vfork child).
pub struct EnvBuf {
    ptrs: [*const c_char; ENV_MAX],
    preload: [u8; PRELOAD_MAX],
}

impl EnvBuf {
    pub fn new() -> EnvBuf {
        EnvBuf {
            ptrs: [core::ptr::null(); ENV_MAX],
            preload: [0; PRELOAD_MAX],
        }
    }
}

extern "C" {
    static environ: *const *const c_char;
}

/// The current environment (what `execv`/`execvp` pass on).
pub fn current_env() -> *const *const c_char {
    // SAFETY: reads the pointer glibc keeps in `environ`; no allocation, no lock.
    unsafe { environ }
}

/// Looks at a start before the real call: the environment to give it (`envp`, or one in `buf`
/// with granary's variables put back), and the start counted when the program should attach.
/// Nothing changes when the table is not mapped in this process or the environment turns
/// granary off or names another job.
pub fn before(
    target: Target,
    argv: *const *const c_char,
    envp: *const *const c_char,
    buf: &mut EnvBuf,
) -> Start {
    let mut start = Start {
        counted: None,
        envp,
    };
    let Some(table) = crate::ops::detour::table() else {
        return start;
    };
    let slot = crate::ops::detour::job_slot();
    let env = Env::scan(envp);
    if env.disabled || env.other_job {
        return start;
    }
    let why = match loader_of(target) {
        Loader::Static => seen::EXEC_STATIC,
        Loader::Secure => seen::EXEC_SECURE,
        Loader::Dynamic => {
            if !env.preload || !env.table {
                match put_back(envp, buf) {
                    Some(p) => start.envp = p,
                    None => {
                        unserved(table, slot, seen::EXEC_ENV_CLEARED, target, argv);
                        return start;
                    }
                }
            }
            if let Some(fd) = env.table_fd {
                if !table_fd_usable(fd) {
                    table.mark(slot, job::SEEN, seen::FD_LOST);
                }
            }
            table.count(slot, job::EXECS, 1);
            start.counted = Some(Counted { slot });
            return start;
        }
    };
    unserved(table, slot, why, target, argv);
    start
}

/// The real call returned an error: the program did not start.
pub fn failed(c: Option<Counted>) {
    if let (Some(c), Some(table)) = (c, crate::ops::detour::table()) {
        table.uncount(c.slot, job::EXECS, 1);
    }
}

/// `fd` is this process's table fd, open and inherited across `exec`.
fn table_fd_usable(fd: c_int) -> bool {
    fd >= 0
        && crate::init::attach::table_fd() == fd
        && sys!(libc::SYS_fcntl, fd, libc::F_GETFD) == 0
}

/// `envp` with granary's variables put back, in `buf`: the caller's variables in their order
/// (an `LD_PRELOAD` without this library gets it in front), then each of ours it lacks (the
/// table fd only while it is open for the child). `None` when nothing was saved at start, the
/// library is not visible here (a launcher that cleared the environment may have entered
/// another mount namespace, where the loader would print an error for it), or there is no
/// room.
fn put_back(envp: *const *const c_char, buf: &mut EnvBuf) -> Option<*const *const c_char> {
    let saved = jobvars::saved()?;
    let ours = saved.preload()?;
    // `LD_PRELOAD=<path>`, and the NUL after it.
    let lib = ours.get(b"LD_PRELOAD=".len()..)?;
    let visible = sys!(
        libc::SYS_faccessat,
        libc::AT_FDCWD,
        lib.as_ptr(),
        libc::R_OK,
        0
    ) == 0;
    if !visible {
        return None;
    }
    // Room kept for ours and the terminating NULL.
    let limit = ENV_MAX - 2 - NAMES.len();
    let mut n = 0;
    let mut has = [false; NAMES.len()];
    let mut has_preload = false;
    for i in 0..=limit {
        let p = if envp.is_null() {
            core::ptr::null()
        } else {
            // SAFETY: `envp` is a NULL-terminated array of C strings, as exec requires; we stop
            // at its NULL.
            unsafe { *envp.add(i) }
        };
        if p.is_null() {
            break;
        }
        if i == limit {
            return None;
        }
        // SAFETY: each element is a NUL-terminated string.
        let var = unsafe { CStr::from_ptr(p) }.to_bytes();
        let mut give = p;
        if let Some(v) = var.strip_prefix(b"LD_PRELOAD=") {
            if !has_preload && jobvars::preload_entry(v).is_none() {
                give = in_front(ours, v, &mut buf.preload)?;
            }
            has_preload = true;
        } else if let Some(k) = NAMES.iter().position(|name| {
            var.strip_prefix(*name)
                .is_some_and(|rest| rest.first() == Some(&b'='))
        }) {
            has[k] = true;
        }
        *buf.ptrs.get_mut(n)? = give;
        n += 1;
    }
    if !has_preload {
        *buf.ptrs.get_mut(n)? = ours.as_ptr().cast();
        n += 1;
    }
    for (k, had) in has.iter().enumerate() {
        let Some(v) = saved.var(k).filter(|_| !had) else {
            continue;
        };
        if k == jobvars::TABLE_FD && !table_fd_usable(saved.table_fd) {
            continue;
        }
        *buf.ptrs.get_mut(n)? = v.as_ptr().cast();
        n += 1;
    }
    *buf.ptrs.get_mut(n)? = core::ptr::null();
    Some(buf.ptrs.as_ptr())
}

/// `LD_PRELOAD=<this library>:<theirs>` (NUL-terminated) in `out`, from `ours`
/// (`LD_PRELOAD=<this library>`) and their value.
fn in_front(ours: &[u8], theirs: &[u8], out: &mut [u8; PRELOAD_MAX]) -> Option<*const c_char> {
    let sep = usize::from(!theirs.is_empty());
    let len = ours.len() + sep + theirs.len();
    let dst = out.get_mut(..len + 1)?;
    dst[..ours.len()].copy_from_slice(ours);
    if sep == 1 {
        dst[ours.len()] = b':';
    }
    dst[ours.len() + sep..len].copy_from_slice(theirs);
    dst[len] = 0;
    Some(out.as_ptr().cast())
}

/// A start granary cannot serve (`why`, a `seen::EXEC_*` bit): recorded, with the program's
/// name, when one of its arguments names a path of the dataset; nothing otherwise.
fn unserved(table: &Table, slot: u32, why: u64, target: Target, argv: *const *const c_char) {
    let Some(arg) = dataset_arg(table, argv) else {
        return;
    };
    let program = match target {
        Target::Path(p) | Target::Search(p) => path::bytes(p),
        Target::Fd(_) => arg_at(argv, 0).and_then(path::bytes),
    };
    table.record_unserved(slot, why, program.unwrap_or(b"?"), arg);
}

/// Argument `i` of `argv`, if there are that many.
fn arg_at(argv: *const *const c_char, i: usize) -> Option<*const c_char> {
    if argv.is_null() {
        return None;
    }
    // SAFETY: `argv` is a NULL-terminated array, as exec requires; callers stop at its NULL.
    let p = unsafe { *argv.add(i) };
    (!p.is_null()).then_some(p)
}

/// The first argument that names a path of the dataset, itself or after an `=`
/// (`--data=/pfs/set`): an absolute path under the source, or a relative one (from the
/// working directory) that names a catalogued entry. Bounded: the first 4,096 arguments.
fn dataset_arg<'a>(table: &Table, argv: *const *const c_char) -> Option<&'a [u8]> {
    for i in 0..4096 {
        let p = arg_at(argv, i)?;
        let arg = path::bytes(p)?;
        if names_dataset(table, p) {
            return Some(arg);
        }
        if let Some(eq) = arg.iter().position(|&b| b == b'=') {
            // SAFETY: `eq + 1` is within the string or its NUL: the rest is a C string too.
            let rest = unsafe { p.add(eq + 1) };
            if names_dataset(table, rest) {
                return Some(arg);
            }
        }
    }
    None
}

fn names_dataset(table: &Table, p: *const c_char) -> bool {
    let Some(&first) = path::bytes(p).and_then(|b| b.first()) else {
        return false;
    };
    let mut buf = Buf::new();
    let loc = path::locate(table, libc::AT_FDCWD, p, &mut buf);
    loc.rel
        .is_some_and(|rel| first == b'/' || table.lookup(rel).is_some())
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
                e.preload = jobvars::preload_entry(v).is_some();
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
    if (setuid || setgid || caps) && !nosuid(fd) {
        return Loader::Secure;
    }
    match has_interp(fd) {
        Some(false) => Loader::Static,
        _ => Loader::Dynamic,
    }
}

/// The file at `fd` is on a `nosuid` mount, where the kernel ignores its setuid and setgid
/// bits and file capabilities (the loader then honours `LD_PRELOAD`).
fn nosuid(fd: c_int) -> bool {
    // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite (the 64-bit
    // kernel's `struct statfs` is libc's `statfs64`, which names `f_flags`).
    let mut st: libc::statfs64 = unsafe { core::mem::zeroed() };
    sys!(libc::SYS_fstatfs, fd, &mut st as *mut libc::statfs64) == 0
        && st.f_flags as u64 & libc::ST_NOSUID != 0
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture;
    use std::ffi::CString;

    /// What this process would have saved at start under `granary run` (the test binary's
    /// constructor found no table, so saved nothing).
    fn saved_as_in_a_job() -> &'static str {
        static LIB: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
        let lib = *LIB.get_or_init(|| {
            // The library must be visible for a child to be given it.
            let dir = tempfile::tempdir().unwrap().keep();
            let lib = dir.join("libgranary_preload.so");
            std::fs::write(&lib, b"").unwrap();
            String::leak(lib.to_str().unwrap().to_string())
        });
        let preload: &'static str = String::leak(format!("/opt/a.so {lib}"));
        jobvars::save_from(|name| match name {
            b"LD_PRELOAD" => Some(preload.as_bytes()),
            b"GRANARY_TABLE" => Some(b"/run/g/t"),
            b"GRANARY_JOB_SLOT" => Some(b"3"),
            b"GRANARY_TABLE_FD" => Some(b"999"),
            _ => None,
        });
        lib
    }

    /// A NULL-terminated array of C strings, and what keeps them alive.
    fn c_array(items: &[&str]) -> (Vec<CString>, Vec<*const c_char>) {
        let owned: Vec<CString> = items.iter().map(|s| CString::new(*s).unwrap()).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        ptrs.push(core::ptr::null());
        (owned, ptrs)
    }

    fn strings(p: *const *const c_char) -> Vec<String> {
        let mut out = vec![];
        for i in 0.. {
            // SAFETY: a NULL-terminated array built by `put_back`.
            let s = unsafe { *p.add(i) };
            if s.is_null() {
                break;
            }
            // SAFETY: each element is a NUL-terminated string.
            out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
        }
        out
    }

    #[test]
    fn a_cleared_environment_gets_granarys_variables_back() {
        let lib = saved_as_in_a_job();
        let mut buf = EnvBuf::new();
        let (_keep, env) = c_array(&["LC_ALL=C", "LANG=C"]);
        let out = put_back(env.as_ptr(), &mut buf).unwrap();
        // The table fd is not this process's (none is): not given.
        assert_eq!(
            strings(out),
            [
                "LC_ALL=C".to_string(),
                "LANG=C".into(),
                format!("LD_PRELOAD={lib}"),
                "GRANARY_TABLE=/run/g/t".into(),
                "GRANARY_JOB_SLOT=3".into()
            ]
        );
        // Theirs kept: ours goes in front of their LD_PRELOAD, their table stays.
        let (_keep, env) = c_array(&["LD_PRELOAD=/x/y.so", "GRANARY_TABLE=/mine"]);
        let out = put_back(env.as_ptr(), &mut buf).unwrap();
        assert_eq!(
            strings(out),
            [
                format!("LD_PRELOAD={lib}:/x/y.so"),
                "GRANARY_TABLE=/mine".into(),
                "GRANARY_JOB_SLOT=3".into()
            ]
        );
        // An empty environment, and none at all.
        let (_keep, env) = c_array(&[]);
        assert_eq!(strings(put_back(env.as_ptr(), &mut buf).unwrap()).len(), 3);
        assert_eq!(
            strings(put_back(core::ptr::null(), &mut buf).unwrap()).len(),
            3
        );
        // No room: nothing made.
        let many: Vec<String> = (0..ENV_MAX).map(|i| format!("V{i}=1")).collect();
        let many: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
        let (_keep, env) = c_array(&many);
        assert!(put_back(env.as_ptr(), &mut buf).is_none());
    }

    #[test]
    fn a_start_is_named_only_for_an_argument_in_the_dataset() {
        let f = fixture();
        let src = f.src.to_str().unwrap();
        let named = |args: &[&str]| {
            let (_keep, argv) = c_array(args);
            dataset_arg(f.table, argv.as_ptr()).map(|a| String::from_utf8_lossy(a).into_owned())
        };
        assert_eq!(named(&["/sbin/ldconfig", "-p"]), None);
        assert_eq!(named(&["uname", "-a"]), None);
        assert_eq!(named(&["cat", "/etc/hostname"]), None);
        let file = format!("{src}/a.txt");
        assert_eq!(named(&["cat", "-n", &file]), Some(file.clone()));
        let opt = format!("--data={src}/train");
        assert_eq!(named(&["tool", &opt]), Some(opt.clone()));
        // Under the source but not (yet) catalogued: still the dataset's path.
        let new = format!("{src}/new/file");
        assert_eq!(named(&["tool", &new]), Some(new.clone()));
    }

    #[test]
    fn a_dynamic_program_with_a_cleared_environment_is_served_and_counted() {
        let f = fixture();
        saved_as_in_a_job();
        let slot = crate::ops::detour::job_slot();
        let execs = || {
            f.table
                .counter(slot, job::EXECS)
                .unwrap()
                .load(core::sync::atomic::Ordering::Relaxed)
        };
        let before_count = execs();
        let (_keep, argv) = c_array(&["true"]);
        let (_keep_env, env) = c_array(&["LC_ALL=C"]);
        let mut buf = EnvBuf::new();
        let s = before(
            Target::Path(c"/bin/true".as_ptr()),
            argv.as_ptr(),
            env.as_ptr(),
            &mut buf,
        );
        assert!(s.envp != env.as_ptr());
        assert!(strings(s.envp).contains(&"GRANARY_TABLE=/run/g/t".to_string()));
        assert_eq!(execs(), before_count + 1);
        failed(s.counted);
        assert_eq!(execs(), before_count);
        // GRANARY_DISABLE keeps granary out of it.
        let (_keep_env, env) = c_array(&["GRANARY_DISABLE=1"]);
        let s = before(
            Target::Path(c"/bin/true".as_ptr()),
            argv.as_ptr(),
            env.as_ptr(),
            &mut buf,
        );
        assert!(s.envp == env.as_ptr() && s.counted.is_none());
    }
}
