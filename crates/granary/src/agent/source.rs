//! One source as the agent holds it: its current table, attached jobs and counters.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_core::catalog::{self, Progress};
use granary_core::config::Verify;
use granary_core::placement::residency::Residency;
use granary_core::placement::{object_dir, Params, SourceCtx};
use granary_core::stats::{AgentCounters, CatalogStats};
use granary_core::{sys, tierdir, Tiers};
use granary_shm::{job, state, Mapping, TableSpec};

pub const JOB_SLOTS: u32 = 64;
const RING_CAP: u32 = 16384;

/// How a (re)walk runs: its threads, the placement parameters the new table advertises, and how
/// reused copies are verified (with `hashers` threads).
pub struct WalkOpts<'a> {
    pub threads: usize,
    pub params: &'a Params,
    pub verify: Verify,
    pub hashers: usize,
    /// The known-order policy the new table gets (`None`: fill highest first).
    pub order: Option<&'a granary_core::placement::prefetch::OrderSpec>,
    pub residency: &'a Arc<Residency>,
}

pub struct SourceState {
    pub source: PathBuf,
    pub source_real: PathBuf,
    pub id: String,
    pub counters: Arc<AgentCounters>,
    pub inner: Mutex<Inner>,
    /// The table requests are consumed from; swapped only under `inner`.
    pub current: RwLock<Option<Arc<SourceCtx>>>,
    /// `inner.jobs`, readable without the lock (another source's attach asks whether a tier
    /// is in use while this one may hold its lock for a long walk).
    pub jobs_now: AtomicUsize,
}

#[derive(Default)]
pub struct Inner {
    pub jobs: usize,
    pub table_path: Option<PathBuf>,
    pub spec: Option<TableSpec>,
    pub catalog: CatalogStats,
    /// The current table's policy, for the jobs that attach to it: the access-order file
    /// (`None`: fill highest first), and what its resolution has to tell them.
    pub order: Option<granary_core::placement::prefetch::OrderSpec>,
    pub order_note: Option<String>,
    /// Tiers refused at the last walk (not ours, open to other users, …), for the jobs.
    pub tier_notes: Vec<String>,
}

impl SourceState {
    pub fn new(source: PathBuf) -> Result<SourceState> {
        let source_real = std::fs::canonicalize(&source)
            .with_context(|| format!("source {}", source.display()))?;
        let id = granary_core::source::source_id(&source_real);
        Ok(SourceState {
            source,
            source_real,
            id,
            counters: Arc::default(),
            inner: Mutex::default(),
            current: RwLock::default(),
            jobs_now: AtomicUsize::new(0),
        })
    }

    pub fn ctx(&self) -> Option<Arc<SourceCtx>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn catalog_file(&self, tiers: &Tiers) -> PathBuf {
        tiers.spec(0).path.join(&self.id).join("catalog.table")
    }

    /// Walks the source and publishes a new table on `tiers` (which become this source's tiers),
    /// reusing valid copies from the last table (or from the catalog saved by an earlier agent).
    /// Called with no job attached.
    pub fn rewalk(
        &self,
        inner: &mut Inner,
        tiers: Arc<Tiers>,
        rt_dir: &granary_core::runtime::Runtime,
        generation: u64,
        opts: &WalkOpts<'_>,
        progress: &Progress,
    ) -> Result<()> {
        let &WalkOpts {
            threads: workers,
            params,
            verify,
            hashers,
            order: order_spec,
            residency,
        } = opts;
        let started = Instant::now();
        // The last table's catalog is the newest record of this source's copies even when its
        // first tier (where it is saved) is not the new first tier; copies on tiers no longer
        // listed are simply not matched, and their files are left alone.
        let last_file = self.ctx().map(|c| self.catalog_file(&c.tiers));
        let last_tiers: Vec<PathBuf> = self
            .ctx()
            .map(|c| c.tiers.specs().into_iter().map(|t| t.path).collect())
            .unwrap_or_default();
        self.retire(inner);
        let catalog_file = self.catalog_file(&tiers);
        let prev = last_file
            .as_deref()
            .and_then(catalog::load_persisted)
            .or_else(|| catalog::load_persisted(&catalog_file));
        let walk = catalog::walk(&self.source_real, workers, progress)?;
        let mut entries = walk.entries;
        let mut object_dirs = Vec::new();
        let mut dir_fds = Vec::new();
        let mut dir_ids = Vec::new();
        inner.tier_notes.clear();
        for t in 0..tiers.len() {
            let root = &tiers.spec(t).path;
            object_dirs.push(object_dir(root, &self.id));
            match tierdir::open_source_dirs(root, &self.id) {
                Ok(d) => {
                    dir_ids.push(d.objects_id);
                    dir_fds.push(Some(d.objects));
                }
                Err(e) => {
                    tracing::warn!("tier {t} unusable for {}: {e}", self.source.display());
                    inner.tier_notes.push(format!("{e}; not using this tier"));
                    dir_ids.push((0, 0));
                    dir_fds.push(None);
                }
            }
        }
        self.forget_tiers(&last_tiers, &tiers, inner);
        let reused = catalog::reuse_chunked(
            &mut entries,
            prev.as_ref(),
            &object_dirs,
            &dir_fds,
            &tiers,
            verify,
            hashers,
            params.chunk_size,
        );
        let spec = TableSpec {
            source: self.source.as_os_str().as_bytes().to_vec(),
            source_real: self.source_real.as_os_str().as_bytes().to_vec(),
            tier_dirs: object_dirs
                .iter()
                .map(|d| d.as_os_str().as_bytes().to_vec())
                .collect(),
            tier_dir_ids: dir_ids,
            creds: sys::creds(),
            root_parent_ino: walk.root_parent_ino,
            agent_pid: std::process::id(),
            ring_cap: RING_CAP,
            job_slots: JOB_SLOTS,
            // The preload library serves the files the agent fetches whole from the partial
            // copy; 0 disables it there too. Lower than configured on a source whose readahead
            // makes the program's own reads cost more requests (placement::SourceRequests).
            prefetch_min_size: params.whole_fetch_from(&self.source_real),
            chunk_size: params.chunk_size,
        };
        let image = granary_shm::build(&spec, &entries).context("building the catalog table")?;
        let table_path = rt_dir.table(&self.id, generation);
        catalog::write_atomic(&table_path, &image)
            .with_context(|| format!("writing {}", table_path.display()))?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&table_path)
            .with_context(|| format!("opening {}", table_path.display()))?;
        let (mapping, table) = Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), image.len())
            .with_context(|| format!("mapping {}", table_path.display()))?;
        // Alive from the start: a client finding no beat yet takes the agent for dead and reads
        // the source itself, a file the agent then fetches too (the heartbeat thread's first
        // beat can be 100 ms away).
        table.beat(granary_core::sys::monotonic_ns());
        let order = match order_spec {
            Some(o) => {
                let pf = granary_core::placement::prefetch::Prefetcher::build(
                    o,
                    &table,
                    &self.source,
                    &self.source_real,
                    tiers.spec(0).capacity,
                )?;
                let mut note = format!(
                    "known-order placement: {} files in the access order, window {}",
                    pf.listed,
                    granary_core::size::format_size(pf.window)
                );
                if !pf.unknown.is_empty() {
                    note.push_str(&format!(
                        "; {} line(s) name no file of the source, ignored (first: {})",
                        pf.unknown.len(),
                        pf.unknown[0]
                    ));
                }
                tracing::info!("{}: {note}", self.source.display());
                inner.order_note = Some(note);
                Some(Arc::new(pf))
            }
            None => {
                inner.order_note = None;
                None
            }
        };
        inner.order = order_spec.cloned();
        let ctx = Arc::new(SourceCtx {
            table,
            mapping,
            source_real: self.source_real.clone(),
            tiers,
            object_dirs: dir_fds,
            counters: self.counters.clone(),
            retired: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            order,
            partials: Default::default(),
            program: Default::default(),
            residency: residency.clone(),
            lost: Default::default(),
        });
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(ctx);
        let mut stats = walk.stats;
        stats.reused_files = reused.files;
        stats.reused_bytes = reused.bytes;
        stats.reuse_rejected = reused.rejected;
        stats.walk_s = started.elapsed().as_secs_f64();
        tracing::info!(
            "catalog of {}: {} files, {} dirs, {} bytes; {} copies reused, {} rejected, {} stale objects removed ({:.2} s)",
            self.source.display(),
            stats.files,
            stats.dirs,
            stats.bytes,
            reused.files,
            reused.rejected,
            reused.removed,
            stats.walk_s
        );
        inner.catalog = stats;
        inner.table_path = Some(table_path);
        inner.spec = Some(spec);
        self.persist(inner);
        granary_core::sys::trim_heap();
        Ok(())
    }

    /// Tiers this source used before and does not any more (a job asked for others): their
    /// copies could never be reused (the next walk only looks in the source's tiers), so they
    /// are removed rather than left on disk, uncounted. Only this source's own directory, and
    /// only in a tier root that is still ours.
    fn forget_tiers(&self, old: &[PathBuf], now: &Tiers, inner: &mut Inner) {
        let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
        let current: Vec<PathBuf> = (0..now.len()).map(|t| canon(&now.spec(t).path)).collect();
        for root in old {
            if current.contains(&canon(root)) || tierdir::open_root(root).is_err() {
                continue;
            }
            let dir = root.join(&self.id);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(
                        "{}: copies in {} removed",
                        self.source.display(),
                        dir.display()
                    );
                    inner.tier_notes.push(format!(
                        "{} no longer uses tier {}: its copies there were removed",
                        self.source.display(),
                        root.display()
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("cannot remove {}: {e}", dir.display()),
            }
        }
    }

    /// Saves the current table's state beside the cache, in its first tier.
    pub fn persist(&self, inner: &Inner) {
        let (Some(ctx), Some(spec)) = (self.ctx(), &inner.spec) else {
            return;
        };
        let entries = catalog::snapshot(&ctx.table);
        let file = self.catalog_file(&ctx.tiers);
        match catalog::save(&file, spec, &entries) {
            Ok(()) => tracing::debug!("saved catalog {}", file.display()),
            Err(e) => tracing::warn!("cannot save catalog {}: {e}", file.display()),
        }
    }

    /// Withdraws the current table: queued copies are dropped, running ones finish, its state is
    /// saved, its space is given back (the next walk re-adopts what is still valid), and the table
    /// file is removed.
    pub fn retire(&self, inner: &mut Inner) {
        let Some(ctx) = self.ctx() else { return };
        let tiers = &*ctx.tiers;
        ctx.retired.store(true, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(120);
        while ctx.inflight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.persist(inner);
        let t = &ctx.table;
        for i in 0..t.entry_count() {
            let w = t.state(i);
            if state::state_of(w) == state::PLACED {
                if let Some(e) = t.entry(i) {
                    let tier = state::tier_of(w) as usize;
                    if tier < tiers.len() {
                        tiers.release(tier, tiers.charge(tier, e.stat.size));
                    }
                }
            }
        }
        // Chunk files are charged per present chunk; the next walk re-adopts what it keeps.
        granary_core::placement::release_partial_charges(&ctx);
        t.set_valid(false);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(p) = inner.table_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// A free job slot (1..), its counters zeroed, owned by `pid`.
    pub fn claim_slot(&self, pid: u32) -> u32 {
        let Some(ctx) = self.ctx() else { return 0 };
        let t = &ctx.table;
        for slot in 1..t.job_slots() {
            let Some(owner) = t.counter(slot, job::OWNER) else {
                break;
            };
            if owner
                .compare_exchange(0, pid.max(1) as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for w in 1..job::WORDS {
                    if let Some(c) = t.counter(slot, w) {
                        c.store(0, Ordering::Relaxed);
                    }
                }
                return slot;
            }
        }
        0
    }

    pub fn free_slot(&self, slot: u32) {
        if slot == 0 {
            return;
        }
        if let Some(ctx) = self.ctx() {
            if let Some(owner) = ctx.table.counter(slot, job::OWNER) {
                owner.store(0, Ordering::Release);
            }
        }
    }

    /// The current table at a glance, in one pass over its state words.
    pub fn snapshot(&self) -> Snapshot {
        let Some(ctx) = self.ctx() else {
            return Snapshot::default();
        };
        let t = &ctx.table;
        let mut s = Snapshot {
            tiers: ctx.tiers.usage(),
            ..Snapshot::default()
        };
        let mut busy = 0;
        for i in 0..t.entry_count() {
            match state::state_of(t.state(i)) {
                state::PLACED => {
                    s.files_placed += 1;
                    s.bytes_placed += t.entry(i).map_or(0, |e| e.stat.size);
                }
                state::QUEUED | state::PLACING => busy += 1,
                _ => {}
            }
        }
        s.pending = ctx.pending(busy);
        s
    }
}

/// See `SourceState::snapshot`.
#[derive(Default)]
pub struct Snapshot {
    /// Complete copies: files and bytes.
    pub files_placed: u64,
    pub bytes_placed: u64,
    /// `SourceCtx::pending`.
    pub pending: u64,
    /// Usage of this source's tiers (shared counters: another source on the same directory
    /// counts too).
    pub tiers: Vec<granary_core::tiers::TierUsage>,
}
