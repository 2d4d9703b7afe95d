//! The constructor: reads the environment once, maps the table, resolves the real symbols.
//! Hooks only ever read what it stored (no `env::var`, no allocation after this point).

use core::ffi::{c_char, CStr};
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use granary_shm::{job, Mapping, Table};

use crate::detour;
use crate::log;

static TABLE: OnceLock<Table> = OnceLock::new();
static JOB_SLOT: AtomicU32 = AtomicU32::new(0);

#[inline]
pub fn table() -> Option<&'static Table> {
    TABLE.get()
}

pub fn job_slot() -> u32 {
    JOB_SLOT.load(Ordering::Relaxed)
}

extern "C" fn forked_parent() {
    crate::fdtable::forked(false);
}

extern "C" fn forked_child() {
    crate::fdtable::set_owner();
    crate::fdtable::forked(true);
    crate::mapping::forked_child();
}

extern "C" fn init() {
    detour::resolve_all();
    crate::fdtable::set_owner();
    // SAFETY: registers handlers that only touch atomics; called once, from the constructor.
    unsafe { libc::pthread_atfork(None, Some(forked_parent), Some(forked_child)) };
    if let Some(spec) = env(c"GRANARY_LOG") {
        log::configure(spec);
    }
    if env(c"GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != b"0") {
        log::line(&[b"disabled by GRANARY_DISABLE"]);
        return;
    }
    if let Some(v) = env(c"GRANARY_JOB_SLOT") {
        JOB_SLOT.store(parse_u32(v).unwrap_or(0), Ordering::Relaxed);
    }
    let Some(path) = env_ptr(c"GRANARY_TABLE") else {
        return;
    };
    let table = match map_table(path) {
        Ok(t) => t,
        Err(why) => {
            log::line(&[b"table not usable, passing everything through: ", why]);
            return;
        }
    };
    let slot = job_slot();
    table.count(slot, job::PROCESSES, 1);
    if !crate::creds::check(&table) {
        table.count(slot, job::CREDS_MISMATCH, 1);
        log::line(&[b"credentials differ from the agent's: passing everything through"]);
    }
    let table = TABLE.get_or_init(|| table);
    crate::path::note_cwd(table);
    crate::inherit::adopt(table);
    log::line(&[b"table mapped"]);
}

/// Maps the table named by `GRANARY_TABLE`: a regular file of ours that nobody else may write,
/// never through a symlink — nobody else's table.
fn map_table(path: *const c_char) -> Result<Table, &'static [u8]> {
    let fd = detour::raw_openat(
        libc::AT_FDCWD,
        path,
        libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        0,
    );
    if fd < 0 {
        return Err(b"cannot open GRANARY_TABLE");
    }
    let mut st = detour::empty_stat();
    let r = detour::raw_fstat(fd, &mut st);
    let euid = detour::sys!(libc::SYS_geteuid) as u32;
    let ours = r == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && st.st_uid == euid
        && st.st_mode & 0o022 == 0;
    if !ours {
        detour::raw_close(fd);
        return Err(b"GRANARY_TABLE is not a regular file of ours, closed to others");
    }
    let mapped = Mapping::map(fd, st.st_size as usize);
    detour::raw_close(fd);
    let (mapping, table) = mapped.map_err(|_| &b"invalid table"[..])?;
    mapping.leak();
    if !table.is_valid() {
        return Err(b"table withdrawn by the agent");
    }
    Ok(table)
}

fn env_ptr(name: &CStr) -> Option<*const c_char> {
    // SAFETY: getenv with a NUL-terminated name, in the constructor (no concurrent setenv yet).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    (!p.is_null()).then_some(p.cast_const())
}

fn env(name: &CStr) -> Option<&'static [u8]> {
    let p = env_ptr(name)?;
    // SAFETY: getenv returned a NUL-terminated string that lives in the environment block.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    let mut v: u32 = 0;
    if s.is_empty() {
        return None;
    }
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as u32)?;
    }
    Some(v)
}

// The dynamic loader runs this before `main`, after libc is initialised.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
