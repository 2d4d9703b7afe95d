//! The constructor: resolves the real symbols, reads the environment once, finds and maps the
//! job's table (`attach`) and attaches to it (`detour::attach`), saves granary's variables for
//! children started without them (`jobvars`), adopts the fds an exec'd program inherited
//! (`inherit`). Hooks only ever read what it stored (no `env::var`, no
//! allocation after this point).

use granary_shm::{job, seen};

pub mod attach;
pub mod inherit;
pub mod jobvars;

use crate::sys::env::{parse_u32, var as env};
use crate::{ops::detour, sys, sys::log};

extern "C" fn forked_parent() {
    crate::fds::fdtable::forked(false);
}

extern "C" fn forked_child() {
    crate::fds::fdtable::set_owner();
    count_apart();
    crate::fds::fdtable::forked(true);
    crate::overlay::forked_child();
}

/// This process adds to its own shard of the job counters: a loader's fork workers would
/// otherwise pass the counters' cache line between cores at every open and read.
fn count_apart() {
    granary_shm::set_counter_shard(sys::pid::current() as u32);
}

extern "C" fn init() {
    sys::resolve_all();
    sys::pid::init();
    crate::fds::fdtable::set_owner();
    count_apart();
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
        detour::set_job_slot(parse_u32(v).unwrap_or(0));
    }
    let found = match crate::init::attach::table() {
        Ok(f) => f,
        Err(why) => {
            log::line(&[b"table not usable, passing everything through: ", why]);
            return;
        }
    };
    let mut table = found.table;
    crate::init::attach::check_spellings(&mut table);
    let slot = detour::job_slot();
    table.count(slot, job::PROCESSES, 1);
    if found.fd_lost {
        table.mark(slot, job::SEEN, seen::FD_LOST);
    }
    if !crate::init::attach::same_mount_ns() {
        if !crate::init::attach::sees_source(&table, slot) {
            log::line(&[b"the source is not at its catalogued path here: passing through"]);
            return;
        }
        crate::init::attach::check_tiers(&table, slot);
    }
    if !crate::ops::creds::check(&table) {
        table.count(slot, job::CREDS_MISMATCH, 1);
        log::line(&[b"credentials differ from the agent's: passing everything through"]);
    }
    // Before the table is attached: a start that finds it attached may put them back.
    crate::init::jobvars::save();
    let table = detour::attach(table);
    crate::ops::path::note_cwd(table);
    crate::init::inherit::adopt(table);
    log::line(&[b"table mapped"]);
}

// The dynamic loader runs this before `main`, after libc is initialised.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
