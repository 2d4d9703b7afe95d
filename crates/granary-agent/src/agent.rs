//! The node agent's state: one per node and user. It owns the catalogs (one `SourceState` per
//! source), tier accounting and the placement pool; jobs attach over a Unix socket (`server`)
//! and then find files through the shared table without round trips. The agent's process —
//! start, threads, main loop — is `daemon`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_core::config::Config;
use granary_core::placement::residency::{Budget, Residency};
use granary_core::placement::{default_workers, FillHighestFirst, Params, Pool};
use granary_core::runtime::Runtime;
use granary_core::tiers::{TierRegistry, TierSpec};

use crate::config::AgentConfig;
use crate::serving::Serving;
use crate::source::SourceState;

/// What the first job asks of the pool (its flags or configuration); the agent's own
/// configuration wins.
pub struct PoolWishes {
    pub workers: Option<usize>,
    pub block_size: Option<u64>,
    pub max_source_streams: Option<usize>,
    pub page_cache: Option<Budget>,
    pub mmap: Option<granary_core::placement::mmap::MmapConfig>,
}

/// The placement pool, started by the first job. It serves every source: each job carries its
/// table's tiers, so sources with different tiers need no pool of their own.
pub struct Setup {
    pub pool: Pool,
    pub workers: usize,
    pub block_size: u64,
    /// The memory cgroup limit the copy buffers were sized for.
    pub memory_limit: Option<u64>,
    /// Which copies keep their pages in the page cache, for every source.
    pub residency: Arc<Residency>,
    /// How programs' mappings are followed (`[mmap]`).
    pub mmap: granary_core::placement::mmap::MmapParams,
    /// The pool's settings as asked (the agent's own over the first job's), before a memory
    /// limit shrank them: what a later job's configuration is compared with.
    pub asked: Config,
}

/// Threads of an attach's background validation: enough to keep a network file system's
/// metadata server busy with a few requests in flight, at idle CPU priority.
pub const VALIDATE_THREADS: usize = 4;

pub struct Agent {
    pub rt: Runtime,
    pub started: Instant,
    pub idle_timeout: Duration,
    /// Tiers from the agent's own flags or configuration, for a job that names none.
    pub default_tiers: Vec<TierSpec>,
    /// Workers from the agent's own flags or configuration; else the first job's.
    pub workers: Option<usize>,
    /// The agent's own configuration (placement parameters, reuse verification); for a
    /// placement key it leaves unset, the first job's value counts.
    pub cfg: Config,
    /// One capacity counter per tier directory, whichever sources use it.
    pub registry: TierRegistry,
    pub setup: OnceLock<Setup>,
    setup_lock: Mutex<()>,
    pub sources: Mutex<HashMap<std::path::PathBuf, Arc<SourceState>>>,
    pub jobs: AtomicUsize,
    pub last_active: Mutex<Instant>,
    pub stopping: AtomicBool,
    pub generation: AtomicU64,
    /// Cluster mode (`granary serve`): the one source this agent serves and its node of the
    /// job; `None` for the ordinary agent.
    pub serving: Option<Serving>,
    /// The inode of the control socket this agent bound: a socket at the path with another
    /// inode belongs to an agent that replaced this one.
    pub socket_ino: u64,
}

impl Agent {
    /// An agent of `rt` with `config`, whose control socket (bound by the caller) has inode
    /// `socket_ino`.
    pub fn new(rt: Runtime, config: AgentConfig, socket_ino: u64) -> Agent {
        Agent {
            rt,
            started: Instant::now(),
            idle_timeout: config.idle_timeout.unwrap_or(Duration::MAX),
            default_tiers: config.tiers,
            workers: config.workers,
            cfg: config.cfg,
            registry: TierRegistry::default(),
            setup: OnceLock::new(),
            setup_lock: Mutex::new(()),
            sources: Mutex::default(),
            jobs: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            stopping: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            serving: config.serving,
            socket_ino,
        }
    }

    /// The placement pool; the agent's configured workers and placement parameters, else the
    /// first caller's, size it.
    pub fn setup(&self, job: &PoolWishes) -> Result<&Setup> {
        if let Some(s) = self.setup.get() {
            return Ok(s);
        }
        let _g = self.setup_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.setup.get() {
            return Ok(s);
        }
        let workers = self.workers.or(job.workers).unwrap_or_else(default_workers);
        let mut cfg = self.cfg.clone();
        cfg.block_size = cfg.block_size.or(job.block_size);
        cfg.max_source_streams = cfg.max_source_streams.or(job.max_source_streams);
        cfg.workers = Some(workers);
        cfg.page_cache = self.cfg.page_cache.or(job.page_cache);
        cfg.mmap = Some(
            self.cfg
                .mmap
                .unwrap_or_default()
                .or(job.mmap.unwrap_or_default()),
        );
        let mut params = Params::from_config(&cfg);
        // Under a memory limit the copy buffers are the job's memory too: keep them small.
        let limit = granary_core::memlimit::cgroup_limit();
        let asked = (workers, params.block_size);
        let (workers, block) = granary_core::memlimit::fit(workers, params.block_size, limit);
        if (workers, block) != asked {
            tracing::info!(
                "memory cgroup limit of {} bytes: {} workers x {} byte blocks shrunk to {workers} \
                 x {block}, 1/{} of the limit at most",
                limit.unwrap_or(0),
                asked.0,
                asked.1,
                granary_core::memlimit::BUDGET_SHARE
            );
        }
        params.block_size = block;
        tracing::info!(
            "{workers} placement workers, {} source streams, blocks of {} bytes, whole-file \
             fetch from {} bytes",
            params.max_source_streams,
            params.block_size,
            params.prefetch_min_size
        );
        let pool = Pool::new(workers, Arc::new(FillHighestFirst), params)
            .context("starting placement workers")?;
        let residency = Arc::new(Residency::new(
            self.cfg.page_cache.or(job.page_cache).unwrap_or_default(),
        ));
        tracing::info!(
            "page-cache residency {}: {} bytes of copies may stay cached",
            residency.budget(),
            residency.target()
        );
        let mmap = self
            .cfg
            .mmap
            .unwrap_or_default()
            .or(job.mmap.unwrap_or_default())
            .resolve();
        tracing::info!(
            "mappings: {:?}, distance {} bytes, read-ahead {} bytes, threshold {} %, LMDB \
             record index {}, sequential advice {}",
            mmap.mode,
            mmap.distance,
            mmap.size,
            mmap.threshold_pct,
            if mmap.lmdb_index { "on" } else { "off" },
            if mmap.sequential_advice { "on" } else { "off" }
        );
        let _ = self.setup.set(Setup {
            pool,
            workers,
            block_size: block,
            memory_limit: limit,
            residency,
            mmap,
            asked: cfg,
        });
        Ok(self.setup.get().expect("set above"))
    }

    /// The agent-wide settings as this agent applies them, defaults filled in
    /// (`granary_core::config::agent_wide`); the pool's once it has one.
    pub fn settings(&self) -> Vec<granary_core::config::agent_wide::Setting> {
        use granary_core::config::agent_wide;
        let mut c = match self.setup.get() {
            Some(s) => s.asked.clone(),
            None => self.cfg.clone(),
        };
        let d = Params::default();
        c.block_size.get_or_insert(d.block_size);
        c.max_source_streams.get_or_insert(d.max_source_streams);
        c.prefetch_min_size.get_or_insert(d.prefetch_min_size);
        c.chunk_size.get_or_insert(d.chunk_size);
        c.small_copy_delay.get_or_insert(d.small_copy_delay);
        c.page_cache.get_or_insert(Budget::default());
        c.verify.get_or_insert(Default::default());
        c.validate_threads.get_or_insert(VALIDATE_THREADS);
        c.pin_inodes.get_or_insert(true);
        c.mmap = Some(agent_wide::mmap_resolved(c.mmap));
        // A serving rank has none (it serves until stopped): nothing to compare.
        c.idle_timeout = (self.idle_timeout != Duration::MAX).then_some(self.idle_timeout);
        c.log_level.get_or_insert_with(|| "info".into());
        let mut all = agent_wide::set_in(&c);
        if self.setup.get().is_none() {
            // The first job's values will size the pool.
            all.retain(|(k, _)| !k.starts_with("[placement]") && !k.starts_with("[mmap]"));
        }
        if c.log_file.is_none() {
            all.push(("[agent] log_file".into(), "none".into()));
        }
        all
    }

    /// Every source's current table.
    pub fn tables(&self) -> Vec<Arc<granary_core::placement::SourceCtx>> {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|s| s.ctx())
            .collect()
    }

    /// Every source the agent knows, taken out of the map's lock.
    pub fn source_states(&self) -> Vec<Arc<SourceState>> {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// True while the control socket at the runtime directory's path is the one this agent
    /// bound (someone may have removed it, or a new agent replaced it).
    pub fn owns_socket(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(self.rt.socket()).is_ok_and(|md| md.ino() == self.socket_ino)
    }

    /// Copies queued for every source's current table and not finished (requests in its ring,
    /// taken or running): what an agent no job uses stays on for (`daemon::main_loop`).
    pub fn queued_copies(&self) -> u64 {
        let sources: Vec<_> = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        sources
            .iter()
            .filter_map(|s| s.ctx())
            .map(|c| c.pending(0))
            .sum()
    }

    pub fn touch(&self) {
        *self.last_active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Saves every catalog, removes tables and the socket. The cache on disk stays consistent:
    /// only complete copies have object names, and the saved catalogs describe them.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        for s in self.source_states() {
            let mut inner = s.inner.lock().unwrap_or_else(|e| e.into_inner());
            s.retire(&mut inner, true);
        }
        // Last: a socket that is gone means the agent's tables are gone too (tests and
        // `granary stop` wait on it).
        // Only our own: a newer agent may already listen on this path (it replaced a socket it
        // found dead); removing its socket would cut every job off that agent.
        if self.owns_socket() {
            let _ = std::fs::remove_file(self.rt.socket());
        }
        tracing::info!("agent {} exiting", std::process::id());
    }
}
