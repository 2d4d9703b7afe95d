//! One source as the agent holds it: its current table, attached jobs and counters.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_core::cache::{adopt, copies, journal as copies_journal};
use granary_core::catalog::{self, Progress};
use granary_core::config::Verify;
use granary_core::placement::residency::Residency;
use granary_core::placement::{self, object_dir, Params, SourceCtx};
use granary_core::stats::AgentCounters;
use granary_core::stats::CatalogStats;
use granary_core::{sys, tierdir, Tiers};
use granary_shm::{job, lifecycle, Mapping, State, Table, TableSpec};

mod pack_conf;
mod packed;
pub mod pins;

pub use pack_conf::{source_key, PackConf};

pub const JOB_SLOTS: u32 = 64;
const RING_CAP: u32 = 16384;
const _: () = assert!(JOB_SLOTS as usize <= granary_core::stats::MAX_JOB_SLOTS);

/// How an attach to an idle source prepares its table: walk threads, the placement parameters
/// the table advertises, how reused copies are verified, and the attach's validation.
pub struct WalkOpts<'a> {
    /// Cluster mode: another rank's catalog to adopt instead of walking (`granary serve`).
    pub image: Option<&'a Broadcast>,
    pub threads: usize,
    pub params: &'a Params,
    pub verify: Verify,
    /// The known-order policy the new table gets (`None`: fill highest first).
    pub order: Option<&'a granary_core::placement::known_order::OrderSpec>,
    pub residency: &'a Arc<Residency>,
    /// Validate by directory only (the dataset is declared immutable).
    pub immutable: bool,
    /// Threads of the background validation.
    pub validate_threads: usize,
    /// Asked before copies are taken from another source id's directories (the same dataset
    /// served another way, `cache::adopt::siblings`): true once no table holds them. `None`:
    /// none are taken (cluster mode).
    pub release: Option<&'a dyn Fn(&str) -> bool>,
}

/// Cluster mode: what rank 0 sends every other rank instead of a walk (`granary serve`).
pub struct Broadcast {
    /// Its table image, made this rank's in place (`catalog::adopt`).
    pub image: Mutex<Vec<u8>>,
    /// A packed source's index header and partition table (`packed_source::Partitions::encode`), so no
    /// other rank reads the index; empty otherwise.
    pub layout: Vec<u8>,
}

/// How the table of an attach came to be (for the log and the job's report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The agent's table, kept since the last job.
    Kept,
    /// The catalog saved beside the cache, loaded.
    Loaded,
    /// A walk of the source (what an earlier table vouched for taken over).
    Walked,
    /// Another rank's catalog, broadcast to this one (cluster mode).
    Adopted,
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
    /// When a job last attached or detached (Unix ns): the last use its records carry.
    pub last_use: std::sync::atomic::AtomicU64,
    /// The job slot the next job's search starts at (`take_job_slot`).
    next_slot: std::sync::atomic::AtomicU32,
    /// The source root's record read when this source became known, for the first attach.
    fresh_root: Mutex<Option<granary_shm::StatRec>>,
    /// The source root's device (major, minor), for what its requests cost
    /// (`placement::whole_file::threshold`).
    dev: (u32, u32),
    /// What every job on the current table is told even with `-q`: tiers refused at the walk
    /// (not the user's, open to other users, …) or lost since (removed, renamed).
    warnings: Mutex<Vec<String>>,
    /// Served from a pack (`granary run --pack`): its catalog is the pack's index.
    pub pack: Option<PackConf>,
    /// What the programs of the jobs that detached read (`served`).
    served_done: Mutex<crate::protocol::Served>,
    /// The source's inodes held while no job uses it (`pins`).
    pub pins: Arc<pins::Pins>,
}

#[derive(Default)]
pub struct Inner {
    pub jobs: usize,
    pub table_path: Option<PathBuf>,
    pub spec: Option<TableSpec>,
    pub catalog: CatalogStats,
    /// The current table's policy, for the jobs that attach to it: the access-order file
    /// (`None`: fill highest first), and what its resolution has to tell them.
    pub order: Option<granary_core::placement::known_order::OrderSpec>,
    pub order_note: Option<String>,
}

impl SourceState {
    pub fn new(source: PathBuf) -> Result<SourceState> {
        // The source's own identity, read once: it resolves the path (a directory is its
        // parent's real path and its name; only a symlink needs the full resolution) and
        // validates the catalog's root in the first attach, so that costs no second call.
        let root = granary_core::sys::statx_nofollow(&source)
            .with_context(|| format!("source {}", source.display()))?;
        let source_real = match (source.parent(), source.file_name()) {
            (Some(parent), Some(name)) if root.is_dir() => std::fs::canonicalize(parent)
                .map(|p| p.join(name))
                .with_context(|| format!("source {}", source.display()))?,
            _ => std::fs::canonicalize(&source)
                .with_context(|| format!("source {}", source.display()))?,
        };
        let id = granary_core::source::source_id(&source_real);
        let dev = (root.dev_major, root.dev_minor);
        let root = root.is_dir().then_some(root);
        Ok(SourceState::assemble(
            source,
            source_real,
            id,
            root,
            dev,
            None,
        ))
    }

    fn assemble(
        source: PathBuf,
        source_real: PathBuf,
        id: String,
        fresh_root: Option<granary_shm::StatRec>,
        dev: (u32, u32),
        pack: Option<PackConf>,
    ) -> SourceState {
        SourceState {
            source,
            source_real,
            id,
            counters: Arc::default(),
            inner: Mutex::default(),
            current: RwLock::default(),
            jobs_now: AtomicUsize::new(0),
            last_use: std::sync::atomic::AtomicU64::new(copies::now_ns()),
            next_slot: std::sync::atomic::AtomicU32::new(1),
            fresh_root: Mutex::new(fresh_root),
            dev,
            warnings: Mutex::default(),
            pack,
            served_done: Mutex::default(),
            pins: Arc::default(),
        }
    }

    pub fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Adds a warning for the jobs of the current table (once).
    pub fn warn(&self, w: String) {
        let mut ws = self.warnings.lock().unwrap_or_else(|e| e.into_inner());
        if !ws.contains(&w) {
            ws.push(w);
        }
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

    /// Prepares the table for a job attaching to this idle source, on `tiers` (which become its
    /// tiers), and starts the attach's background validation. The cheapest way that is safe:
    /// the table the agent kept, the catalog saved beside the cache, or a walk that lists only
    /// what neither can vouch for. Nothing in a kept or loaded table is served before it is
    /// checked against the source in this attach (`lifecycle::is_validated`). What the
    /// attaching job should be told is added to `notes`.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &self,
        inner: &mut Inner,
        tiers: Arc<Tiers>,
        rt_dir: &granary_core::runtime::Runtime,
        generation: u64,
        opts: &WalkOpts<'_>,
        progress: &Progress,
        notes: &mut Vec<String>,
    ) -> Result<Origin> {
        if self.pack.is_some() {
            return self.prepare_packed(inner, tiers, rt_dir, generation, opts, notes);
        }
        let started = Instant::now();
        let dirs = self.open_tier_dirs(&tiers);
        let spec = self.spec(&tiers, &dirs, opts.params, 0);
        let origin = if let Some(ctx) = self.ctx().filter(|c| self.reusable(&c.table, &spec)) {
            tracing::info!("{}: re-attach with the kept catalog", self.source.display());
            self.set_policy(inner, &ctx, opts)?;
            self.drop_second_copies(&ctx, opts);
            let (files, bytes) = granary_core::placement::copies_now(&ctx.table);
            inner.catalog.walk_s = 0.0;
            inner.catalog.carried = ctx.table.entry_count() as u64;
            inner.catalog.reused_files = files;
            inner.catalog.reused_bytes = bytes;
            inner.catalog.reuse_rejected = 0;
            Origin::Kept
        } else {
            // A table kept for other tiers (or parameters) records its copies for whichever
            // table uses its tiers next, and is withdrawn before this one takes anything over.
            let old = self.ctx();
            if old.is_some() {
                self.retire(inner, true);
            }
            let saved = self.catalog_file(&tiers);
            let table_path = rt_dir.table(&self.id, generation);
            let mut origin = Origin::Walked;
            let mut published = None;
            if let Some(b) = opts.image {
                let mut img = b.image.lock().unwrap_or_else(|e| e.into_inner());
                published = Some(
                    catalog::adopt(&mut img, &spec, &table_path, Some(&saved))
                        .context("adopting rank 0's catalog")?,
                );
                origin = Origin::Adopted;
            } else {
                let expect = catalog::Expect {
                    source_real: self.source_real.as_os_str().as_bytes(),
                    creds: spec.creds,
                    tier_dirs: &spec.tier_dirs,
                    tier_dir_ids: &spec.tier_dir_ids,
                };
                match catalog::load(&saved, &table_path, &expect) {
                    Ok(l) if self.reusable(&l.table, &spec) => {
                        published = Some(l);
                        origin = Origin::Loaded;
                    }
                    Ok(_) => {
                        tracing::info!(
                            "{}: the saved catalog needs listing again",
                            self.source.display()
                        );
                        let _ = std::fs::remove_file(&table_path);
                    }
                    Err(catalog::LoadError::Missing) => {}
                    Err(e) => tracing::info!(
                        "{}: saved catalog {} not used: {e}",
                        self.source.display(),
                        saved.display()
                    ),
                }
            }
            let (mapping, table, stats) = match published {
                Some(l) => {
                    let mut stats = catalog_stats(&l.table);
                    stats.reuse_rejected = l.rejected;
                    (l.mapping, l.table, stats)
                }
                None => self.walk_into(&tiers, &spec, &table_path, old.as_ref(), progress, opts)?,
            };
            if origin != Origin::Adopted {
                self.take_recorded_copies(&table, &tiers, &dirs, opts);
            }
            self.note_tiers_left(old.as_deref(), &tiers, notes);
            drop(old);
            let ctx = self.publish(inner, table, mapping, tiers, dirs, opts)?;
            let (files, bytes) = granary_core::placement::adopt_charges(&ctx.table, &ctx.space);
            let mut stats = stats;
            stats.reused_files = files;
            stats.reused_bytes = bytes;
            stats.walk_s = started.elapsed().as_secs_f64();
            inner.catalog = stats;
            inner.table_path = Some(table_path);
            if origin == Origin::Walked {
                // Saved at once: it holds the room its next saves need on the tier, before the
                // copies can fill it (a tier declared larger than its file system).
                self.persist(inner);
            }
            spawn_sweep(&ctx, opts.verify);
            origin
        };
        let ctx = self.ctx().context("no table published")?;
        let root = self
            .fresh_root
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        start_validation(
            &ctx,
            opts.immutable,
            opts.validate_threads,
            matches!(origin, Origin::Walked | Origin::Adopted),
            root,
        );
        inner.spec = Some(spec);
        tracing::info!(
            "catalog of {} ({origin:?}): {} files, {} dirs, {} bytes; {} copies reused ({:.2} s)",
            self.source.display(),
            inner.catalog.files,
            inner.catalog.dirs,
            inner.catalog.bytes,
            inner.catalog.reused_files,
            started.elapsed().as_secs_f64()
        );
        granary_core::sys::trim_heap();
        Ok(origin)
    }

    /// True if `t` can serve the next attach as it is: the same tiers and placement parameters
    /// (its layout depends on them), and nothing it voided (a voided directory or file is
    /// listed or stat'ed again by a walk first).
    fn reusable(&self, t: &Table, spec: &TableSpec) -> bool {
        let same_tiers = t.tier_count() as usize == spec.tier_dirs.len()
            && (0..t.tier_count()).all(|k| {
                t.tier_dir(k) == spec.tier_dirs.get(k as usize).map(|v| v.as_slice())
                    && t.tier_dir_id(k) == spec.tier_dir_ids.get(k as usize).copied()
            });
        let prefetch = if spec.prefetch_min_size == 0 {
            u64::MAX
        } else {
            spec.prefetch_min_size
        };
        same_tiers
            && t.chunk_size() == spec.chunk_size
            && t.prefetch_min_size() == prefetch
            && t.agent_creds() == spec.creds
            && t.job_slots() == spec.job_slots
            && !(0..t.entry_count()).any(|i| t.state(i).is_void())
    }

    /// Each tier's object directory for this source, opened and verified (`None`: unusable).
    fn open_tier_dirs(&self, tiers: &Tiers) -> TierDirs {
        let mut d = TierDirs::default();
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        for t in 0..tiers.len() {
            let root = &tiers.spec(t).path;
            d.paths.push(object_dir(root, &self.id));
            match tierdir::open_source_dirs(root, &self.id) {
                Ok(o) => {
                    d.ids.push(o.objects_id);
                    d.fds.push(Some(o.objects));
                }
                Err(e) => {
                    tracing::warn!("tier {t} unusable for {}: {e}", self.source.display());
                    self.warn(format!("{e}; not using this tier"));
                    d.ids.push((0, 0));
                    d.fds.push(None);
                }
            }
        }
        d
    }

    fn spec(
        &self,
        _tiers: &Tiers,
        dirs: &TierDirs,
        params: &Params,
        root_parent: u64,
    ) -> TableSpec {
        TableSpec {
            source: self.source.as_os_str().as_bytes().to_vec(),
            source_real: self.source_real.as_os_str().as_bytes().to_vec(),
            tier_dirs: dirs
                .paths
                .iter()
                .map(|d| d.as_os_str().as_bytes().to_vec())
                .collect(),
            tier_dir_ids: dirs.ids.clone(),
            creds: sys::creds(),
            root_parent_ino: root_parent,
            agent_pid: std::process::id(),
            ring_cap: RING_CAP,
            job_slots: JOB_SLOTS,
            // The preload library serves the files the agent fetches whole from the partial
            // copy; 0 disables it there too. Lower than configured on a source whose readahead
            // makes the program's own reads cost more requests (placement::SourceRequests).
            prefetch_min_size: params.whole_fetch_from(&self.source_real, self.dev),
            chunk_size: params.chunk_size,
            pack: None,
        }
    }

    /// Walks the source (taking over what the current table or the saved catalog still vouches
    /// for) and writes the new table to `table_path`.
    fn walk_into(
        &self,
        tiers: &Tiers,
        spec: &TableSpec,
        table_path: &std::path::Path,
        old: Option<&Arc<SourceCtx>>,
        progress: &Progress,
        opts: &WalkOpts<'_>,
    ) -> Result<(Mapping, Table, CatalogStats)> {
        // The earlier knowledge: the agent's own last table, else the catalog saved beside the
        // cache (of this source's last first tier, or of the new one).
        let current = old;
        let last_saved = old.map(|c| self.catalog_file(&c.space.tiers));
        let saved = current
            .is_none()
            .then(|| self.saved_catalog(tiers, spec, last_saved.as_deref()))
            .flatten();
        let prev_table = current
            .as_ref()
            .map(|c| c.table)
            .or(saved.as_ref().map(|s| s.1));
        let prev = prev_table.as_ref().map(|t| prev_of(t, spec));
        let walk = catalog::walk(&self.source_real, prev.as_ref(), opts.threads, progress)?;
        drop(saved);
        let mut spec = spec.clone();
        spec.root_parent_ino = walk.root_parent_ino;
        let (mapping, table) = write_table(table_path, &spec, &walk.catalog)?;
        lifecycle::validated_by_walk(&table, &walk.fresh);
        Ok((mapping, table, walk.stats))
    }

    /// The known-order policy of the attach (re-read: the access-order file may have changed).
    fn set_policy(&self, inner: &mut Inner, ctx: &SourceCtx, opts: &WalkOpts<'_>) -> Result<()> {
        if opts.order != inner.order.as_ref() {
            tracing::info!(
                "{}: the placement policy changed; it applies from the next walk",
                self.source.display()
            );
        }
        let _ = ctx;
        Ok(())
    }

    /// Makes `table` the source's current table.
    fn publish(
        &self,
        inner: &mut Inner,
        table: Table,
        mapping: Mapping,
        tiers: Arc<Tiers>,
        dirs: TierDirs,
        opts: &WalkOpts<'_>,
    ) -> Result<Arc<SourceCtx>> {
        // Alive from the start: a client finding no beat yet takes the agent for dead and reads
        // the source itself, a file the agent then fetches too (the heartbeat thread's first
        // beat can be 100 ms away).
        table.beat(granary_core::sys::monotonic_ns());
        let order = match opts.order {
            Some(o) => {
                let pf = granary_core::placement::known_order::Prefetcher::build(
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
        inner.order = opts.order.cloned();
        let journal = copies_journal::Journal::new(
            (0..tiers.len())
                .map(|t| {
                    dirs.fds.get(t)?.as_ref()?;
                    Some(tiers.spec(t).path.join(&self.id))
                })
                .collect(),
        );
        let ctx = SourceCtx::new(
            (mapping, table),
            self.source_real.clone(),
            tiers,
            dirs.fds,
            self.counters.clone(),
            opts.residency.clone(),
        );
        let ctx = ctx.with_order(order);
        // Before any work is held: every copy this table publishes is journaled.
        let _ = ctx.work.journal.set(Arc::new(journal));
        let ctx = Arc::new(ctx);
        // Beaten before any job has it: a client never takes a new table's agent for dead.
        ctx.table.beat(granary_core::sys::monotonic_ns());
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(ctx.clone());
        Ok(ctx)
    }

    /// A job attaches to the table other jobs hold: the source may have changed since their
    /// attach (`cp -p`, a file replaced, a `chmod`), so everything is checked again — in the
    /// background, ahead of the programs, as for a first job; the source's immutability stays
    /// what the first job decided.
    pub fn revalidate_for_new_job(&self, validate_threads: usize) {
        if self.pack.is_some() {
            self.recheck_packed();
            return;
        }
        if let Some(ctx) = self.ctx() {
            let immutable = ctx.table.immutable();
            start_validation(&ctx, immutable, validate_threads, false, None);
        }
    }

    /// Takes over the copies recorded in this source's directories of the new tiers, then
    /// those of the same dataset served another way (`granary_core::cache::adopt`), into
    /// `table` before it is published.
    fn take_recorded_copies(
        &self,
        table: &Table,
        tiers: &Tiers,
        dirs: &TierDirs,
        opts: &WalkOpts<'_>,
    ) {
        let stores = self.stores(tiers, &dirs.fds);
        let own = adopt::own(table, &stores);
        let other = opts
            .release
            .map(|r| adopt::siblings(table, &self.id, &stores, r, true))
            .unwrap_or_default();
        tracing::info!(
            "{}: {} recorded copies taken over ({} bytes; {} of them journaled since the last \
             save), {} moved from the same dataset served another way ({} bytes), {} second \
             copies of it removed",
            self.source.display(),
            own.files,
            own.bytes,
            own.journaled,
            other.files,
            other.bytes,
            other.duplicates
        );
    }

    /// This source's directory in each usable tier, with its verified `objects` fd.
    fn stores<'a>(
        &self,
        tiers: &Tiers,
        objects: &'a [Option<std::os::fd::OwnedFd>],
    ) -> Vec<adopt::Store<'a>> {
        objects
            .iter()
            .enumerate()
            .filter_map(|(t, fd)| {
                Some(adopt::Store {
                    tier: t as u8,
                    dir: tiers.spec(t).path.join(&self.id),
                    objects: fd.as_ref()?,
                })
            })
            .collect()
    }

    /// A kept table's files that another way of serving the dataset also placed in the same
    /// tier roots while this one was in use (two jobs at once): their second copies go.
    fn drop_second_copies(&self, ctx: &SourceCtx, opts: &WalkOpts<'_>) {
        let Some(release) = opts.release else { return };
        let stores = self.stores(&ctx.space.tiers, ctx.space.dirs());
        let d = adopt::siblings(&ctx.table, &self.id, &stores, release, false).duplicates;
        if d > 0 {
            tracing::info!(
                "{}: {d} second copies removed (the same files, placed by another way of \
                 serving the dataset)",
                self.source.display()
            );
        }
    }

    /// The source moved to other tiers: its copies in the ones it left stay, for a later job
    /// there (or `granary cache clean`); the job is told once.
    fn note_tiers_left(&self, old: Option<&SourceCtx>, now: &Tiers, notes: &mut Vec<String>) {
        let Some(old) = old else { return };
        let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
        let current: Vec<PathBuf> = (0..now.len()).map(|t| canon(&now.spec(t).path)).collect();
        for t in 0..old.space.tiers.len() {
            let root = old.space.tiers.spec(t).path.clone();
            if current.contains(&canon(&root)) {
                continue;
            }
            let (files, bytes) = (0..old.table.entry_count())
                .filter(|&i| {
                    let w = old.table.state(i);
                    w.state() == State::Placed && w.tier() as usize == t
                })
                .fold((0u64, 0u64), |(f, b), i| {
                    (f + 1, b + old.table.entry(i).map_or(0, |e| e.stat.size))
                });
            if files > 0 {
                notes.push(format!(
                    "{} moved from tier {}: its {files} copies there ({}) are kept for a later \
                     job on that tier (`granary cache` lists them, `granary cache clean` removes \
                     them)",
                    self.source.display(),
                    root.display(),
                    granary_core::size::format_size(bytes)
                ));
            }
        }
    }

    /// Saves the current table beside the cache, in its first tier.
    pub fn persist(&self, _inner: &Inner) {
        let Some(ctx) = self.ctx() else {
            return;
        };
        let file = self.catalog_file(&ctx.space.tiers);
        match catalog::save(&file, &ctx.table) {
            Ok(()) => tracing::debug!("saved catalog {}", file.display()),
            Err(e) => tracing::warn!("cannot save catalog {}: {e}", file.display()),
        }
        self.save_records(&ctx);
    }

    /// Records the current table's copies beside them, in each of its tiers
    /// (`granary_core::cache::copies`): whatever table uses a tier next takes them over. The
    /// journal of each tier is folded into its record (`granary_core::cache::journal`).
    pub fn save_records(&self, ctx: &SourceCtx) {
        for t in 0..ctx.space.tiers.len() {
            if ctx.space.dir(t).is_none() {
                continue;
            }
            let dir = ctx.space.tiers.spec(t).path.join(&self.id);
            let used = match self.jobs_now.load(Ordering::Acquire) {
                0 => self.last_use.load(Ordering::Relaxed),
                _ => copies::now_ns(),
            };
            let mut n = 0;
            // The table is read inside: after the journal is written up to now.
            let mut save = || {
                let rec = copies::Copies::of_table(&ctx.table, t as u32, used);
                n = rec.records.len();
                copies::save(&dir, &rec)
            };
            let res = match ctx.work.journal.get() {
                Some(j) => j.save(t, save),
                None => save(),
            };
            match res {
                Ok(()) => tracing::debug!("recorded {n} copies in {}", dir.display()),
                Err(e) => tracing::warn!("cannot record the copies in {}: {e}", dir.display()),
            }
        }
    }

    /// The journal thread's pass (`daemon::journal`): buffered records older than
    /// `journal::FLUSH_AFTER` are written, and a journal grown past what a fold is worth is
    /// folded into the record.
    pub fn tend_journal(&self) {
        let Some(ctx) = self.ctx() else { return };
        let Some(j) = ctx.work.journal.get() else {
            return;
        };
        j.flush_older(copies_journal::FLUSH_AFTER);
        if j.wants_fold(ctx.table.entry_count()) {
            tracing::info!(
                "{}: the journal of copies is folded into the record",
                self.source.display()
            );
            self.save_records(&ctx);
        }
    }

    /// Withdraws the current table: queued copies are dropped, running ones finish, its state is
    /// saved, its space is given back (the next walk re-adopts what is still valid), and the table
    /// file is removed.
    pub fn retire(&self, inner: &mut Inner, persist: bool) {
        let Some(ctx) = self.ctx() else { return };
        if let Some(v) = ctx
            .validation
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            v.stop();
        }
        let tiers = &*ctx.space.tiers;
        ctx.retire();
        let deadline = Instant::now() + Duration::from_secs(120);
        while ctx.work.held() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if persist {
            self.persist(inner);
        }
        // A later table of these tiers has the journals now.
        if let Some(j) = ctx.work.journal.get() {
            j.close();
        }
        let t = &ctx.table;
        for i in 0..t.entry_count() {
            let w = t.state(i);
            if w.state() == State::Placed {
                if let Some(e) = t.entry(i) {
                    let tier = w.tier() as usize;
                    if tier < tiers.len() {
                        tiers.release(tier, tiers.charge(tier, e.stat.size));
                    }
                }
            }
        }
        // Chunk files are charged per present chunk; the next walk re-adopts what it keeps.
        granary_core::placement::release_partial_charges(&ctx.table, &ctx.space.tiers);
        t.set_valid(false);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.pins.clear();
        if let Some(p) = inner.table_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// The last job detached: the current table's directories and files are held in the
    /// kernel's cache for the next job (`pins`). A pack's tree: its directories only (its
    /// files come from the pack).
    pub fn hold_inodes(&self) {
        if let Some(ctx) = self.ctx() {
            self.pins.take_in_background(ctx, self.pack.is_some());
        }
    }

    /// A job attaches or detaches now (the last use the records carry).
    pub fn used_now(&self) {
        self.last_use.store(copies::now_ns(), Ordering::Relaxed);
    }

    /// A free job slot (1..), its counters zeroed, owned by `pid`. Slots are taken in turn (the
    /// search starts after the slot taken last): a process a job left behind (started in the
    /// background, daemonized) still counts in that job's slot, which the next job would
    /// otherwise take, its report counting what the straggler read.
    pub fn take_job_slot(&self, pid: u32) -> u32 {
        let Some(ctx) = self.ctx() else { return 0 };
        let t = &ctx.table;
        let slots = t.job_slots();
        if slots < 2 {
            return 0;
        }
        let start = self.next_slot.load(Ordering::Relaxed);
        for k in 0..slots - 1 {
            let slot = 1 + (start.wrapping_sub(1).wrapping_add(k)) % (slots - 1);
            let Some(owner) = t.counter(slot, job::OWNER) else {
                break;
            };
            if owner
                .compare_exchange(0, pid.max(1) as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                t.clear_job(slot);
                self.counters.jobs.reset(slot);
                self.next_slot.store(slot + 1, Ordering::Relaxed);
                return slot;
            }
        }
        0
    }

    pub fn free_job_slot(&self, slot: u32) {
        if slot == 0 {
            return;
        }
        if let Some(ctx) = self.ctx() {
            if let Some(owner) = ctx.table.counter(slot, job::OWNER) {
                let done = crate::protocol::Served::of_slot(&ctx.table, slot);
                self.served_done
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add(&done);
                owner.store(0, Ordering::Release);
            }
        }
    }

    /// What the programs of every job on this source read: the jobs gone, and those attached.
    pub fn served(&self) -> crate::protocol::Served {
        let mut s = *self.served_done.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ctx) = self.ctx() {
            let t = &ctx.table;
            for slot in 1..t.job_slots() {
                let owned = t
                    .counter(slot, job::OWNER)
                    .is_some_and(|o| o.load(Ordering::Acquire) != 0);
                if owned {
                    s.add(&crate::protocol::Served::of_slot(t, slot));
                }
            }
        }
        s
    }

    /// The current table at a glance, in one pass over its state words.
    pub fn snapshot(&self) -> Snapshot {
        let Some(ctx) = self.ctx() else {
            return Snapshot::default();
        };
        let t = &ctx.table;
        let mut s = Snapshot {
            tiers: ctx.space.tiers.usage(),
            ..Snapshot::default()
        };
        let mut busy = 0;
        for i in 0..t.entry_count() {
            match t.state(i).state() {
                State::Placed => {
                    s.files_placed += 1;
                    s.bytes_placed += t.entry(i).map_or(0, |e| e.stat.size);
                }
                State::Queued | State::Placing => busy += 1,
                _ => {}
            }
        }
        s.pending = ctx.pending(busy);
        s.placing = busy;
        s
    }
}

impl SourceState {
    /// The catalog saved beside the cache (of this source's last first tier, or of the new
    /// one), if the same user saved it for the same source.
    fn saved_catalog(
        &self,
        tiers: &Tiers,
        spec: &TableSpec,
        last_saved: Option<&std::path::Path>,
    ) -> Option<(Mapping, Table)> {
        last_saved
            .and_then(catalog::open_saved)
            .or_else(|| catalog::open_saved(&self.catalog_file(tiers)))
            .filter(|(_, t)| {
                t.agent_creds() == spec.creds && t.source_real_root() == spec.source_real.as_slice()
            })
    }
}

/// An earlier table as what a new catalog may take over: its tier `t` is tier `tier_map[t]`
/// of the new table when the directory and its identity are the same.
fn prev_of<'a>(t: &'a Table, spec: &TableSpec) -> catalog::Prev<'a> {
    catalog::Prev {
        table: t,
        tier_map: (0..t.tier_count())
            .map(|k| {
                let dir = t.tier_dir(k)?;
                let id = t.tier_dir_id(k)?;
                let n = spec.tier_dirs.iter().position(|d| d.as_slice() == dir)?;
                (spec.tier_dir_ids.get(n) == Some(&id) && id.1 != 0).then_some(n as u8)
            })
            .collect(),
        chunk_size: spec.chunk_size,
    }
}

/// Writes the table image of `cat` to `path` (under a temporary name, renamed: no client ever
/// sees a half-built table) and maps it.
fn write_table(
    path: &std::path::Path,
    spec: &TableSpec,
    cat: &granary_shm::Catalog,
) -> Result<(Mapping, Table)> {
    let len = granary_shm::image_len(spec, cat).context("sizing the table")?;
    catalog::persist::write_atomic_with(path, |f| {
        f.set_len(len as u64)?;
        let mut map = granary_core::sys::map_new_file(f)?;
        granary_shm::build_into(spec, cat, &mut map)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
    })
    .with_context(|| format!("writing {}", path.display()))?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let (mapping, table) = Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len)
        .with_context(|| format!("mapping {}", path.display()))?;
    Ok((mapping, table))
}

/// Files nobody names any more, copies the tiers lost, and (verify = "checksum") copies whose
/// bytes changed: found in the background.
fn spawn_sweep(ctx: &Arc<SourceCtx>, verify: Verify) {
    let c = ctx.clone();
    let _ = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            granary_core::sys::sched_idle();
            let s = placement::sweep::sweep(&c.table, &c.space, &c.work);
            let v = if verify == Verify::Checksum {
                placement::sweep::verify_copies(&c.table, &c.space, &c.work)
            } else {
                Default::default()
            };
            tracing::info!(
                "{}: sweep removed {} files, {} copies missing, {} failed their checksum",
                c.source_real.display(),
                s.removed,
                s.missing,
                v.rejected
            );
        });
}

/// A new attach epoch on `ctx`'s table and its validation in the background: everything is
/// checked against the source again, except what a walk just read (`fresh_walk`: its bits stay)
/// and the root when its record was just read (`root`).
fn start_validation(
    ctx: &Arc<SourceCtx>,
    immutable: bool,
    threads: usize,
    fresh_walk: bool,
    root: Option<granary_shm::StatRec>,
) {
    let t = &ctx.table;
    if let Some(old) = ctx
        .validation
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        old.stop();
    }
    // What an absent attribute answers may have changed since the last attach (a remount
    // without ACLs): probed again before the programs of this attach ask.
    catalog::xattr::probe(t, &ctx.source_real);
    let epoch = if fresh_walk {
        t.set_immutable(immutable);
        t.bump_epoch()
    } else {
        lifecycle::new_attach(t, immutable)
    };
    if let (Some(now), Some(e)) = (root, t.entry(0)) {
        lifecycle::apply(t, 0, lifecycle::verdict(&e.stat, Ok(&now)));
    }
    let v = Arc::new(catalog::Validation::new(t, epoch, immutable));
    *ctx.validation.write().unwrap_or_else(|e| e.into_inner()) = Some(v.clone());
    catalog::validate::spawn(ctx.clone(), v, threads);
}

/// The object directories of a table's tiers: paths, identities, verified fds.
#[derive(Default)]
struct TierDirs {
    paths: Vec<PathBuf>,
    ids: Vec<(u64, u64)>,
    fds: Vec<Option<std::os::fd::OwnedFd>>,
}

/// Counts of a loaded table, for the report (one pass over its entries).
fn catalog_stats(t: &Table) -> CatalogStats {
    let mut s = CatalogStats::default();
    for i in 0..t.entry_count() {
        let Some(e) = t.entry(i) else { continue };
        match e.stat.file_type() {
            libc::S_IFREG => {
                s.files += 1;
                s.bytes += e.stat.size;
            }
            libc::S_IFDIR => s.dirs += 1,
            libc::S_IFLNK => s.symlinks += 1,
            _ => {}
        }
    }
    s.carried = t.entry_count() as u64;
    s
}

/// See `SourceState::snapshot`.
#[derive(Default)]
pub struct Snapshot {
    /// Complete copies: files and bytes.
    pub files_placed: u64,
    pub bytes_placed: u64,
    /// `SourceCtx::pending`.
    pub pending: u64,
    /// Files queued or being copied (entries QUEUED or PLACING).
    pub placing: u64,
    /// Usage of this source's tiers (shared counters: another source on the same directory
    /// counts too).
    pub tiers: Vec<granary_core::tiers::TierUsage>,
}
