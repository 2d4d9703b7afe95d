//! The constructor: reads the environment once, maps the table, resolves the real symbols.
//! Hooks only ever read what it stored (no `env::var`, no allocation after this point).

use core::ffi::{c_char, CStr};
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use granary_shm::{job, seen, Table};

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
    let found = match crate::discover::table() {
        Ok(f) => f,
        Err(why) => {
            log::line(&[b"table not usable, passing everything through: ", why]);
            return;
        }
    };
    let table = found.table;
    let slot = job_slot();
    table.count(slot, job::PROCESSES, 1);
    if found.fd_lost {
        table.mark(slot, job::SEEN, seen::FD_LOST);
    }
    if !crate::discover::same_mount_ns() {
        if !crate::discover::sees_source(&table, slot) {
            log::line(&[b"the source is not at its catalogued path here: passing through"]);
            return;
        }
        crate::discover::check_tiers(&table, slot);
    }
    if !crate::creds::check(&table) {
        table.count(slot, job::CREDS_MISMATCH, 1);
        log::line(&[b"credentials differ from the agent's: passing everything through"]);
    }
    let table = TABLE.get_or_init(|| table);
    crate::path::note_cwd(table);
    crate::inherit::adopt(table);
    log::line(&[b"table mapped"]);
}

pub(crate) fn env_ptr(name: &CStr) -> Option<*const c_char> {
    // SAFETY: getenv with a NUL-terminated name, in the constructor (no concurrent setenv yet).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    (!p.is_null()).then_some(p.cast_const())
}

pub(crate) fn env(name: &CStr) -> Option<&'static [u8]> {
    let p = env_ptr(name)?;
    // SAFETY: getenv returned a NUL-terminated string that lives in the environment block.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

pub(crate) fn parse_u32(s: &[u8]) -> Option<u32> {
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
