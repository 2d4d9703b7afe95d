//! Inodes held between jobs: when the last job of a source detaches, the agent takes an `O_PATH`
//! reference to each catalogued directory and then to each file, as many as its budget allows,
//! and holds them until the table is withdrawn or the agent exits.
//!
//! Why: every job's attach checks the catalog against the source again (one `statx` per
//! directory, and per file unless the dataset is immutable: docs/architecture.md,
//! "Attaching"), and tools such as `ls -l` ask the source for what the catalog does not hold
//! (extended attributes for ACLs and security labels). Each of those needs the entry's inode;
//! once the kernel has dropped it (memory pressure between jobs, `drop_caches`), a local or
//! block-backed file system reads it back from its device — on the emulated PFS a later job's
//! `ls -lR` of 1,500 files cost ~30 device requests and 0.9 s, as much as without granary.
//! A held reference keeps the inode and its name in the kernel's caches: the checks still
//! happen, and see every change (a local file system's cached inode is the inode; a network
//! file system revalidates what it caches as it always does), but they cost no device read.
//!
//! Cost: one `openat` per entry once per table, in the background while no job runs; about
//! 1.6 KiB of kernel memory per entry (inode, name, open file), which the budget keeps under
//! 1/64 of the agent's memory limit, and at most half of its open-file limit. A held
//! directory or file cannot be unmounted under the agent (`EBUSY`) and a removed file keeps its
//! space until the agent lets go (at the next walk of the source or when it exits).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use granary_core::placement::SourceCtx;
use granary_core::sys;
use granary_shm::Table;

/// Kernel memory one held entry keeps from being reclaimed: an ext4 inode (1,128 B), a dentry
/// (192 B) and an open file (192 B) as `/proc/slabinfo` shows them, rounded up.
const ENTRY_COST: u64 = 1600;
/// The share of the memory limit held entries may keep: 1/64.
const MEMORY_SHARE: u64 = 64;
/// Open files left to the agent's own work whatever its limit.
const FD_RESERVE: u64 = 4096;

/// Entries held by every source of this agent (the budget is the agent's).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// What one source holds, for `granary status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub dirs: u64,
    pub files: u64,
}

/// The references one source holds, for one table.
#[derive(Default)]
pub struct Pins {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// The table they were taken for (its address): taken once per table.
    table: usize,
    /// The table a thread is taking them for now (0: none).
    taking: usize,
    fds: Vec<OwnedFd>,
    counts: Counts,
}

impl Pins {
    /// What is held now.
    pub fn counts(&self) -> Counts {
        lock(&self.held).counts
    }

    /// Lets go of everything (the table is withdrawn).
    pub fn clear(&self) {
        let mut h = lock(&self.held);
        let fds = std::mem::take(&mut h.fds);
        HELD.fetch_sub(fds.len(), Ordering::AcqRel);
        h.table = 0;
        h.counts = Counts::default();
    }

    /// Takes the references for `ctx`'s table in the background, unless they are held or
    /// being taken already; `dirs_only`: directories alone (a packed source, whose files come
    /// from the pack).
    pub fn take_in_background(self: &Arc<Self>, ctx: Arc<SourceCtx>, dirs_only: bool) {
        let key = table_key(&ctx);
        {
            let mut h = lock(&self.held);
            if h.table == key || h.taking == key {
                return;
            }
            h.taking = key;
        }
        let pins = self.clone();
        let spawned = std::thread::Builder::new()
            .name("pin".into())
            .spawn(move || {
                sys::sched_idle();
                pins.take(&ctx, dirs_only);
            });
        if let Err(e) = spawned {
            lock(&self.held).taking = 0;
            tracing::debug!("no thread to hold the source's inodes: {e}");
        }
    }

    fn take(&self, ctx: &SourceCtx, dirs_only: bool) {
        let key = table_key(ctx);
        // The earlier table's references go first: they count against the budget.
        self.clear();
        let budget = budget().saturating_sub(HELD.load(Ordering::Acquire));
        let retired = || ctx.work.is_retired();
        let (fds, counts) = hold(&ctx.table, &ctx.source_real, budget, dirs_only, &retired);
        let mut h = lock(&self.held);
        h.taking = 0;
        // Withdrawn meanwhile (or cleared for another table): let go at once.
        if retired() {
            return;
        }
        HELD.fetch_add(fds.len(), Ordering::AcqRel);
        tracing::info!(
            "{}: {} directories and {} files held in the kernel's cache until the next walk \
             (budget {budget} entries)",
            ctx.source_real.display(),
            counts.dirs,
            counts.files
        );
        h.table = key;
        h.counts = counts;
        let replaced = std::mem::replace(&mut h.fds, fds);
        HELD.fetch_sub(replaced.len(), Ordering::AcqRel);
    }
}

fn table_key(ctx: &SourceCtx) -> usize {
    &ctx.table as *const Table as usize
}

/// How many entries this agent may hold: 1/64 of its memory limit, half its open files.
fn budget() -> usize {
    let files = sys::raise_open_files_limit().saturating_sub(FD_RESERVE) / 2;
    let memory = granary_core::memlimit::Probe::find()
        .sample()
        .map_or(0, |r| r.limit / MEMORY_SHARE / ENTRY_COST);
    usize::try_from(files.min(memory)).unwrap_or(usize::MAX)
}

/// References to the live directories of `table` (breadth first from the root at `root`),
/// then to their other entries, at most `budget` in all; stops early when `stop` says so.
/// An entry that cannot be opened (gone, not searchable) is left out.
pub fn hold(
    table: &Table,
    root: &Path,
    budget: usize,
    dirs_only: bool,
    stop: &dyn Fn() -> bool,
) -> (Vec<OwnedFd>, Counts) {
    let mut counts = Counts::default();
    let live = |i: u32| !table.state(i).is_void();
    if budget == 0 || !live(0) {
        return (Vec::new(), counts);
    }
    let Ok(root_fd) = sys::open_path(root) else {
        return (Vec::new(), counts);
    };
    // Directories first: each is needed for every lookup below it, and with an immutable
    // dataset they are all a later attach checks.
    let mut dirs: Vec<(u32, OwnedFd)> = vec![(0, root_fd)];
    let mut k = 0;
    while k < dirs.len() && dirs.len() < budget && !stop() {
        let found: Vec<(u32, OwnedFd)> = children(table, dirs[k].0)
            .filter(|(c, e)| e.stat.is_dir() && live(*c))
            .take(budget - dirs.len())
            .filter_map(|(c, e)| {
                let fd = sys::open_path_at(&dirs[k].1, table.name(&e)?).ok()?;
                Some((c, fd))
            })
            .collect();
        dirs.extend(found);
        k += 1;
    }
    counts.dirs = dirs.len() as u64;
    let mut others = Vec::new();
    if !dirs_only {
        'dirs: for (d, dfd) in &dirs {
            for (c, e) in children(table, *d) {
                if dirs.len() + others.len() >= budget || stop() {
                    break 'dirs;
                }
                if e.stat.is_dir() || !live(c) {
                    continue;
                }
                if let Some(fd) = table.name(&e).and_then(|n| sys::open_path_at(dfd, n).ok()) {
                    others.push(fd);
                }
            }
        }
    }
    counts.files = others.len() as u64;
    let mut fds: Vec<OwnedFd> = dirs.into_iter().map(|(_, fd)| fd).collect();
    fds.extend(others);
    (fds, counts)
}

/// The catalog's children of directory `dir`, with their indices.
fn children(table: &Table, dir: u32) -> impl Iterator<Item = (u32, granary_shm::EntryRec)> + '_ {
    let (first, n) = table
        .entry(dir)
        .filter(|e| e.stat.is_dir())
        .map_or((0, 0), |e| (e.first_child, e.child_count));
    (first..first.saturating_add(n)).filter_map(move |c| Some((c, table.entry(c)?)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
