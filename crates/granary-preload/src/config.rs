//! The constructor: reads the environment once, maps the table, resolves the real symbols.
//! Hooks only ever read what it stored (no `env::var`, no allocation after this point).

use core::ffi::{c_char, CStr};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use granary_shm::{Mapping, Table};

use crate::detour;
use crate::log;

static TABLE: OnceLock<Table> = OnceLock::new();
static JOB_SLOT: AtomicU32 = AtomicU32::new(0);
/// (st_dev, st_ino) of the shadow directory, to recognise its fds.
static SHADOW_DEV: AtomicU64 = AtomicU64::new(u64::MAX);
static SHADOW_INO: AtomicU64 = AtomicU64::new(u64::MAX);

#[inline]
pub fn table() -> Option<&'static Table> {
    TABLE.get()
}

pub fn job_slot() -> u32 {
    JOB_SLOT.load(Ordering::Relaxed)
}

pub fn is_shadow(st: &libc::stat) -> bool {
    st.st_dev == SHADOW_DEV.load(Ordering::Relaxed)
        && st.st_ino == SHADOW_INO.load(Ordering::Relaxed)
}

extern "C" fn after_fork_in_child() {
    crate::fdtable::set_owner();
}

extern "C" fn init() {
    detour::resolve_all();
    crate::fdtable::set_owner();
    // SAFETY: registers a handler that only stores an atomic; called once, from the constructor.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
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
    match map_table(path) {
        Ok(table) => {
            remember_shadow(&table);
            let _ = TABLE.set(table);
            log::line(&[b"table mapped"]);
        }
        Err(why) => log::line(&[b"table not usable, passing everything through: ", why]),
    }
}

fn map_table(path: *const c_char) -> Result<Table, &'static [u8]> {
    let fd = detour::raw_openat(libc::AT_FDCWD, path, libc::O_RDWR | libc::O_CLOEXEC, 0);
    if fd < 0 {
        return Err(b"cannot open GRANARY_TABLE");
    }
    let mut st = detour::empty_stat();
    let r = detour::raw_fstat(fd, &mut st);
    let len = if r == 0 { st.st_size as usize } else { 0 };
    let mapped = Mapping::map(fd, len);
    detour::raw_close(fd);
    let (mapping, table) = mapped.map_err(|_| &b"invalid table"[..])?;
    mapping.leak();
    if !table.is_valid() {
        return Err(b"table withdrawn by the agent");
    }
    Ok(table)
}

fn remember_shadow(table: &Table) {
    let mut buf = [0u8; granary_shm::layout::PATH_MAX_LEN + 1];
    let dir = table.shadow_dir();
    let Some(dst) = buf.get_mut(..dir.len()) else {
        return;
    };
    dst.copy_from_slice(dir);
    let mut st = detour::empty_stat();
    if !dir.is_empty()
        && detour::raw_newfstatat(
            libc::AT_FDCWD,
            buf.as_ptr().cast(),
            (&mut st as *mut libc::stat).cast(),
            0,
        ) == 0
    {
        SHADOW_DEV.store(st.st_dev, Ordering::Relaxed);
        SHADOW_INO.store(st.st_ino, Ordering::Relaxed);
    }
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
