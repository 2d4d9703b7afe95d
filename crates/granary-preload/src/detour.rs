//! Whether a hooked call may consult the job's table: the table this process attached to (set
//! once, by the constructor), whether its credentials are the agent's, and the re-entrancy
//! guard. Every hook that might answer from the table starts here; when `enter` says no, the
//! real function runs with the caller's arguments.

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use granary_shm::Table;

/// The job's table, once the constructor mapped and accepted it; never unset (a withdrawn table
/// says so itself: `Table::is_valid`).
static TABLE: OnceLock<Table> = OnceLock::new();
/// The job slot this process counts in (`GRANARY_JOB_SLOT`).
static JOB_SLOT: AtomicU32 = AtomicU32::new(0);
/// True while this process's credentials are the agent's (`creds`): only then may the catalog
/// answer for what the kernel would let the process see.
static CREDS_MATCH: AtomicBool = AtomicBool::new(false);

thread_local! {
    // const-initialised and destructor-free: usable from any hook, including in a vfork child.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// The table hooks consult from now on. Constructor only.
pub fn attach(table: Table) -> &'static Table {
    TABLE.get_or_init(|| table)
}

/// The attached table, if any.
#[inline]
pub fn table() -> Option<&'static Table> {
    TABLE.get()
}

pub fn set_job_slot(slot: u32) {
    JOB_SLOT.store(slot, Ordering::Relaxed);
}

pub fn job_slot() -> u32 {
    JOB_SLOT.load(Ordering::Relaxed)
}

/// Records whether this process's credentials are the agent's (checked by `creds`).
pub fn set_creds_match(same: bool) {
    CREDS_MATCH.store(same, Ordering::Relaxed);
}

/// True while this process's credentials are the agent's (the catalog may answer for it).
#[inline]
pub fn creds_match() -> bool {
    CREDS_MATCH.load(Ordering::Relaxed)
}

/// Proof that the current call may consult the catalog; clears the guard when dropped.
pub struct Guard {
    pub table: &'static Table,
    pub slot: u32,
}

impl Drop for Guard {
    fn drop(&mut self) {
        IN_HOOK.with(|g| g.set(false));
    }
}

/// Sets the guard for this thread: `None` if it is already set (the call comes from inside a
/// hook of ours).
#[inline]
fn guard(table: &'static Table) -> Option<Guard> {
    let entered = IN_HOOK.with(|g| {
        if g.get() {
            false
        } else {
            g.set(true);
            true
        }
    });
    entered.then(|| Guard {
        table,
        slot: job_slot(),
    })
}

/// `Some` when granary is active and this thread is not already inside a hook; otherwise the
/// caller must pass the call through untouched.
#[inline]
pub fn enter() -> Option<Guard> {
    let guard = guard(table()?)?;
    if !guard.table.is_valid() || !creds_match() {
        return None; // dropping the guard clears the flag
    }
    Some(guard)
}

/// Like `enter`, but whatever this process's credentials, for what does not depend on them: the
/// hooks that tell the table the program changed the source (every process of the job must
/// learn of it), and calls on fds granary already tracks (what an open fd reads or describes is
/// the same whoever asks: the kernel checked access when it was opened).
#[inline]
pub fn enter_any_creds() -> Option<Guard> {
    let guard = guard(table()?)?;
    guard.table.is_valid().then_some(guard)
}

impl Guard {
    pub fn count(&self, word: usize, n: u64) {
        self.table.count(self.slot, word, n);
    }
}
