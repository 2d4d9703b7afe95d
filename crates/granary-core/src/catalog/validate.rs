//! The background validation of an attach: every catalogued entry is checked against the source
//! once per attach — directory by directory, the directories the program is in first — while
//! the program already runs. Nothing is served from the catalog before its own check
//! (`lifecycle::is_validated`); a client that gets ahead of the validator checks the entry
//! itself and points the validator at its directory (`request::VALIDATE`).
//!
//! Cost on the source: one `statx` per directory, plus one per file and symlink unless the source
//! is declared immutable (then a directory whose identity is unchanged vouches for its files).
//! A directory whose names changed is voided (its listing passes through) and its children are
//! checked one by one; the next attach lists it again (`walk` with the earlier table).
//!
//! The threads run at `SCHED_IDLE`: on a local disk they only use a core the program leaves
//! idle, on a network file system they mostly wait for the server.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use granary_shm::lifecycle::{self, Check, Verdict};
use granary_shm::Table;

use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread, Arc, Mutex};
use crate::sys::statx_nofollow;

/// One attach's validation: its progress and the program's hints.
#[derive(Debug, Default)]
pub struct Validation {
    pub epoch: u64,
    pub immutable: bool,
    hints: Mutex<VecDeque<u32>>,
    /// Next entry index the in-order scan looks at.
    cursor: AtomicUsize,
    /// Directories taken by a thread (one bit per entry).
    taken: Vec<AtomicU64>,
    stop: AtomicBool,
    running: AtomicUsize,
    pub dirs_checked: AtomicU64,
    pub files_checked: AtomicU64,
    /// Entries found changed or gone (voided).
    pub changed: AtomicU64,
    pub done: AtomicBool,
}

impl Validation {
    pub fn new(table: &Table, epoch: u64, immutable: bool) -> Validation {
        let words = granary_shm::layout::bitmap_words(table.entry_count() as usize);
        Validation {
            epoch,
            immutable,
            taken: (0..words).map(|_| AtomicU64::new(0)).collect(),
            ..Validation::default()
        }
    }

    /// The program is in directory `dir`: check it next.
    pub fn hint(&self, dir: u32) {
        let mut h = self.hints.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() < 65536 {
            h.push_back(dir);
        }
    }

    /// Stops the threads at their next directory (a new attach or the table retired).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    pub fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Claims directory `idx` for this thread; false if another took it.
    fn take(&self, idx: u32) -> bool {
        let Some(w) = self.taken.get((idx / 64) as usize) else {
            return false;
        };
        let bit = 1u64 << (idx % 64);
        w.fetch_or(bit, Ordering::AcqRel) & bit == 0
    }

    fn next_dir(&self, table: &Table) -> Option<u32> {
        loop {
            let hinted = self
                .hints
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some(d) = hinted else { break };
            if table.entry(d).is_some_and(|e| e.stat.is_dir()) && self.take(d) {
                return Some(d);
            }
        }
        let n = table.entry_count() as usize;
        loop {
            let i = self.cursor.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return None;
            }
            let i = i as u32;
            if table.entry(i).is_some_and(|e| e.stat.is_dir()) && self.take(i) {
                return Some(i);
            }
        }
    }
}

/// What the validation threads of an attach hold while they run (`placement::SourceCtx` is
/// one): a table, the source it describes, and whether the table was withdrawn (they stop).
pub trait Subject: Send + Sync + 'static {
    fn table(&self) -> &Table;
    /// The source root with symlinks resolved.
    fn root(&self) -> &Path;
    fn withdrawn(&self) -> bool;
}

/// Starts validating `ctx`'s table with `threads` threads; returns at once. With 0 threads
/// nothing runs in the background: each entry is checked by the first client that needs it.
pub fn spawn<S: Subject>(ctx: Arc<S>, v: Arc<Validation>, threads: usize) {
    if threads == 0 {
        v.done.store(true, Ordering::Release);
        return;
    }
    v.running.store(threads, Ordering::Release);
    for k in 0..threads {
        let (ctx, vt) = (ctx.clone(), v.clone());
        let spawned = thread::Builder::new()
            .name(format!("validate{k}"))
            .spawn(move || {
                let v = vt;
                crate::sys::sched_idle();
                run(ctx.table(), ctx.root(), || ctx.withdrawn(), &v);
                if v.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                    v.done.store(true, Ordering::Release);
                    tracing::info!(
                        "{}: validation of attach {} done: {} directories, {} files checked, {} changed",
                        ctx.root().display(),
                        v.epoch,
                        v.dirs_checked.load(Ordering::Relaxed),
                        v.files_checked.load(Ordering::Relaxed),
                        v.changed.load(Ordering::Relaxed)
                    );
                }
            });
        if spawned.is_err() && v.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            v.done.store(true, Ordering::Release);
        }
    }
}

/// Validates `table` (of the source at `root`) on the calling thread until every directory is
/// done, `v` is stopped, the table is `withdrawn` or another attach began.
pub fn run(table: &Table, root: &Path, withdrawn: impl Fn() -> bool, v: &Validation) {
    let ctx = Target { table, root };
    while !v.stop.load(Ordering::Acquire) && !withdrawn() {
        if table.epoch() != v.epoch {
            return;
        }
        let Some(d) = v.next_dir(table) else { return };
        check_dir(&ctx, v, d);
    }
}

/// What a validation checks: a table and the source it describes.
struct Target<'a> {
    table: &'a Table,
    root: &'a Path,
}

fn path_of(ctx: &Target<'_>, idx: u32) -> Option<PathBuf> {
    let rel = ctx.table.rel_path_vec(idx)?;
    Some(if rel.is_empty() {
        ctx.root.to_path_buf()
    } else {
        ctx.root.join(OsStr::from_bytes(&rel))
    })
}

fn check(ctx: &Target<'_>, idx: u32) -> Verdict {
    let (Some(e), Some(path)) = (ctx.table.entry(idx), path_of(ctx, idx)) else {
        return Verdict::Unknown;
    };
    let now = statx_nofollow(&path);
    lifecycle::verdict_with(
        &e.stat,
        now.as_ref()
            .map_err(|err| err.raw_os_error().unwrap_or(libc::EIO)),
        || crate::sys::may_list(&path),
    )
}

/// One directory: itself, then (unless it vouches for them) each non-directory child.
fn check_dir(ctx: &Target<'_>, v: &Validation, d: u32) {
    let t = ctx.table;
    let Some(e) = t.entry(d) else { return };
    let void = t.state(d).is_void();
    let mut vouched = false;
    if !void {
        let claim = match lifecycle::claim_check(t, d) {
            Check::Busy => {
                // A client checks it right now: its verdict is ours.
                wait_for_other_check(t, d);
                lifecycle::claim_check(t, d)
            }
            c => c,
        };
        match claim {
            Check::Mine(claim) => {
                let verdict = check(ctx, d);
                v.dirs_checked.fetch_add(1, Ordering::Relaxed);
                if verdict != Verdict::Same && verdict != Verdict::Unknown {
                    v.changed.fetch_add(1, Ordering::Relaxed);
                }
                if verdict == Verdict::Gone {
                    // Everything below passes through now.
                    claim.finish(verdict);
                    return;
                }
                vouched = claim.finish(verdict) && v.immutable;
            }
            Check::Validated => {
                vouched = v.immutable;
                lifecycle::mark_validated(t, d);
            }
            // Still held after the wait (a client stopped mid-check): its children are checked
            // one by one below.
            Check::Busy => {}
        }
    }
    if vouched {
        return;
    }
    for c in e.first_child..e.first_child.saturating_add(e.child_count) {
        if v.stop.load(Ordering::Relaxed) || t.epoch() != v.epoch {
            return;
        }
        let Some(ce) = t.entry(c) else { continue };
        if ce.stat.is_dir() || t.is_validated(c) {
            continue;
        }
        if t.state(c).is_void() {
            continue;
        }
        // A client checking it now makes the entry's one call; one that stopped mid-check
        // leaves it to the next client that needs it.
        let Check::Mine(claim) = lifecycle::claim_check(t, c) else {
            continue;
        };
        let verdict = check(ctx, c);
        v.files_checked.fetch_add(1, Ordering::Relaxed);
        if matches!(verdict, Verdict::Changed | Verdict::Gone) {
            v.changed.fetch_add(1, Ordering::Relaxed);
        }
        claim.finish(verdict);
    }
}

/// How long a directory check a client holds is waited for (a `statx` on a loaded server).
const OTHERS_CHECK: Duration = Duration::from_millis(50);

/// Waits (bounded) until nobody holds entry `idx`'s check.
fn wait_for_other_check(t: &Table, idx: u32) {
    let start = Instant::now();
    while lifecycle::is_being_checked(t, idx) && start.elapsed() < OTHERS_CHECK {
        thread::sleep(Duration::from_micros(20));
    }
}
