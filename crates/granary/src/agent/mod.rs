//! The node agent: one per node and user. Owns the catalogs, tier accounting and placement; jobs
//! attach over a Unix socket and then find files through the shared table without round trips.

mod mappings;
pub mod protocol;
mod residency_keeper;
mod ring;
pub(crate) mod server;
mod source;
mod tierwatch;

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::config::{resolve_tiers, Config, DEFAULT_IDLE_TIMEOUT};
use granary_core::placement::residency::{Budget, Residency};
use granary_core::placement::{default_workers, FillHighestFirst, Params, Pool};
use granary_core::runtime::Runtime;
use granary_core::tiers::{TierRegistry, TierSpec};

use crate::cli::AgentArgs;
#[cfg(feature = "mpi")]
pub(crate) use source::Broadcast;
use source::SourceState;

/// How long a starting agent waits for the previous one to let go of `agent.alive`.
const ALIVE_WAIT: Duration = Duration::from_secs(60);

/// What the first job asks of the pool (its flags or configuration); the agent's own
/// configuration wins.
pub struct PoolWishes {
    pub workers: Option<usize>,
    pub block_size: Option<u64>,
    pub max_source_streams: Option<usize>,
    pub page_cache: Option<Budget>,
    pub mmap: Option<granary_core::placement::mapping::MmapConfig>,
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
    pub mmap: granary_core::placement::mapping::MmapParams,
}

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
}

/// A serving rank's part of the agent (crates/granary/src/cluster).
pub struct Serving {
    /// The served source (normalized): jobs may attach to it only, once `node` is set. With
    /// `mount`, where the programs expect the tree that exists only in the pack.
    pub source: std::path::PathBuf,
    /// The pack it is served from (`--pack`, absolute), and whether only the pack exists
    /// (`--mount`): a job attaching to the source is served from it.
    pub pack: Option<std::path::PathBuf>,
    pub mount: bool,
    pub rank: u32,
    pub ranks: u32,
    pub node: OnceLock<Arc<crate::cluster::Node>>,
    /// Why this rank serves nothing (the catalog never arrived): attaching jobs are told.
    pub failed: OnceLock<String>,
}

impl Serving {
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub fn new(
        source: std::path::PathBuf,
        pack: Option<(std::path::PathBuf, bool)>,
        rank: u32,
        ranks: u32,
    ) -> Serving {
        let mount = pack.as_ref().is_some_and(|p| p.1);
        Serving {
            source,
            pack: pack.map(|p| p.0),
            mount,
            rank,
            ranks,
            node: OnceLock::new(),
            failed: OnceLock::new(),
        }
    }
}

/// What `granary serve` changes in an agent.
#[derive(Default)]
pub struct Options {
    pub serving: Option<Serving>,
    /// The agent's tiers, instead of its flags' and configuration's (a serving rank's, with
    /// its staging tier last).
    pub tiers: Option<Vec<TierSpec>>,
    /// Never exit when idle.
    pub no_idle_exit: bool,
    /// Log here unless the configuration says otherwise.
    pub log_file: Option<std::path::PathBuf>,
    /// `[placement] prefetch_min_size` unless the configuration says otherwise.
    pub prefetch_min_size: Option<u64>,
}

/// An agent set up (socket bound, `agent.alive` held), before its threads run.
pub struct Started {
    pub agent: Arc<Agent>,
    listener: UnixListener,
    /// Locked until the process exits.
    _alive: std::fs::File,
}

impl Agent {
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
             record index {}",
            mmap.mode,
            mmap.distance,
            mmap.size,
            mmap.threshold_pct,
            if mmap.lmdb_index { "on" } else { "off" }
        );
        let _ = self.setup.set(Setup {
            pool,
            workers,
            block_size: block,
            memory_limit: limit,
            residency,
            mmap,
        });
        Ok(self.setup.get().expect("set above"))
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
        if socket_is_ours(&self.rt) {
            let _ = std::fs::remove_file(self.rt.socket());
        }
        tracing::info!("agent {} exiting", std::process::id());
    }
}

/// The agent usually lives in the job's memory cgroup (a Slurm job's, or the one `granary run`
/// was started in), and its copy buffers (a block per worker) are memory the job did not budget
/// for. If that cgroup runs out, the OOM killer must take the agent, not the job: jobs survive the
/// agent's death (they read the source), and granary may make a job slower, never failed. Raising
/// one's own `oom_score_adj` needs no privilege; `granary run` leaves the program's value alone.
fn volunteer_for_oom() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "1000") {
        tracing::warn!("could not raise the agent's oom_score_adj: {e}");
    }
}

pub fn main(args: AgentArgs) -> Result<i32> {
    let started = start(Runtime::open()?, &args.tiers, Options::default())?;
    spawn_threads(&started)?;
    main_loop(&started.agent);
    started.agent.shutdown();
    Ok(0)
}

/// Sets an agent up in `rt`: waits for a previous one to let go of `agent.alive`, reads the
/// configuration, binds the socket. Its threads start with `spawn_threads`.
pub fn start(rt: Runtime, tiers: &crate::cli::TierArgs, opts: Options) -> Result<Started> {
    // Wait for a previous agent to finish its shutdown (it saves catalogs this agent reuses);
    // kept until this process exits. Bounded: `granary run` replaces a previous agent that does
    // not exit before starting this one, so a long wait here means something else holds it.
    let alive = rt
        .open_alive()
        .with_context(|| format!("opening {}", rt.alive().display()))?;
    if !granary_core::sys::flock_exclusive_within(&alive, ALIVE_WAIT)
        .with_context(|| format!("locking {}", rt.alive().display()))?
    {
        bail!(
            "another agent still holds {} after {} s",
            rt.alive().display(),
            ALIVE_WAIT.as_secs()
        );
    }
    // Who holds it, for the commands that must end an agent that does not answer.
    {
        use std::io::Write;
        let mut f = &alive;
        let _ = f
            .set_len(0)
            .and_then(|()| writeln!(f, "{}", std::process::id()));
    }
    let mut cfg = crate::run::load_config(tiers)?;
    crate::logging::init(
        Some(cfg.log_level.as_deref().unwrap_or("info")),
        cfg.log_file.clone().or(opts.log_file),
    );
    let idle_timeout = match &tiers.idle_timeout {
        _ if opts.no_idle_exit => Duration::MAX,
        Some(s) => granary_core::size::parse_duration(s)
            .with_context(|| format!("bad --idle-timeout `{s}`"))?,
        None => cfg.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
    };
    cfg.prefetch_min_size = cfg.prefetch_min_size.or(opts.prefetch_min_size);
    volunteer_for_oom();
    let default_tiers: Vec<_> = match opts.tiers {
        Some(t) => t,
        None => {
            let tier_cfg = crate::run::tier_configs(tiers, &cfg)?;
            resolve_tiers(&tier_cfg)?.into_iter().map(|t| t.0).collect()
        }
    };
    let listener = bind(&rt)?;
    remove_stale_tables(&rt);
    let agent = Arc::new(Agent {
        rt,
        started: Instant::now(),
        idle_timeout,
        default_tiers,
        workers: tiers.workers.or(cfg.workers),
        cfg: cfg.clone(),
        registry: TierRegistry::default(),
        setup: OnceLock::new(),
        setup_lock: Mutex::new(()),
        sources: Mutex::default(),
        jobs: AtomicUsize::new(0),
        last_active: Mutex::new(Instant::now()),
        stopping: AtomicBool::new(false),
        generation: AtomicU64::new(0),
        serving: opts.serving,
    });
    tracing::info!(
        "agent {} listening on {} (idle timeout {:?})",
        std::process::id(),
        agent.rt.socket().display(),
        idle_timeout
    );
    Ok(Started {
        agent,
        listener,
        _alive: alive,
    })
}

/// Starts the agent's threads: ring consumer, heartbeat, page-cache residency, tier watch, and
/// the control socket's accept loop.
pub fn spawn_threads(started: &Started) -> Result<()> {
    let agent = &started.agent;
    let listener = started.listener.try_clone()?;
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("ring".into())
            .spawn(move || ring::consume(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || heartbeat(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("residency".into())
            .spawn(move || residency_keeper::keep(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("tierwatch".into())
            .spawn(move || tierwatch::watch(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("mappings".into())
            .spawn(move || mappings::follow(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || server::accept_loop(a, listener))?;
    }
    Ok(())
}

/// Until the agent stops (asked to, idle, or its socket taken over).
pub fn main_loop(agent: &Agent) {
    let idle_timeout = agent.idle_timeout;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if agent.stopping.load(Ordering::Acquire) {
            break;
        }
        let idle = agent.jobs.load(Ordering::Acquire) == 0
            && agent
                .last_active
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
                >= idle_timeout;
        if idle {
            tracing::info!("no job for {idle_timeout:?}: exiting");
            break;
        }
        // Someone removed or replaced our socket (a new agent took over): leave quietly.
        if !socket_is_ours(&agent.rt) {
            tracing::warn!(
                "socket {} is gone or replaced: exiting",
                agent.rt.socket().display()
            );
            break;
        }
    }
}

/// Beats on every current table so clients waiting on a fetch know the agent is alive; a
/// client gives up waiting (and reads the source) when the beat is older than
/// `HEARTBEAT_STALE_MS`. Its own thread, so a busy ring consumer or pool never delays it.
fn heartbeat(agent: Arc<Agent>) {
    let period = Duration::from_millis(granary_shm::layout::HEARTBEAT_PERIOD_MS);
    while !agent.stopping.load(Ordering::Acquire) {
        let ctxs = agent.tables();
        let now = granary_core::sys::monotonic_ns();
        for ctx in &ctxs {
            ctx.table.beat(now);
        }
        drop(ctxs);
        std::thread::sleep(period);
    }
}

/// Deletes tables left in the runtime directory by agents that are gone (killed: a clean exit
/// removes its own). Their pid is in the table header; a table of a live process is left alone.
fn remove_stale_tables(rt: &Runtime) {
    let Ok(rd) = std::fs::read_dir(&rt.dir) else {
        return;
    };
    let mut removed = 0;
    for de in rd.flatten() {
        let path = de.path();
        if path.extension().and_then(|e| e.to_str()) != Some("table") {
            continue;
        }
        let pid = table_agent_pid(&path);
        if pid.is_some_and(|p| p != std::process::id() && !granary_core::sys::pid_alive(p))
            && std::fs::remove_file(&path).is_ok()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!("removed {removed} tables of agents that are gone");
    }
}

/// The agent pid recorded in a table file's header (`None` if it is not a table).
fn table_agent_pid(path: &std::path::Path) -> Option<u32> {
    use granary_shm::layout::{H_AGENT_PID, H_MAGIC, MAGIC};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut hdr = [0u8; H_AGENT_PID + 4];
    f.read_exact_at(&mut hdr, 0).ok()?;
    let magic = u64::from_le_bytes(hdr[H_MAGIC..H_MAGIC + 8].try_into().ok()?);
    if magic != MAGIC {
        return None;
    }
    Some(u32::from_le_bytes(
        hdr[H_AGENT_PID..H_AGENT_PID + 4].try_into().ok()?,
    ))
}

fn socket_is_ours(rt: &Runtime) -> bool {
    use std::os::unix::fs::MetadataExt;
    static INO: OnceLock<u64> = OnceLock::new();
    let Ok(md) = std::fs::symlink_metadata(rt.socket()) else {
        return false;
    };
    *INO.get_or_init(|| md.ino()) == md.ino()
}

/// Binds the control socket; a leftover socket nobody answers on is replaced, a live agent is
/// an error.
fn bind(rt: &Runtime) -> Result<UnixListener> {
    let path = rt.socket();
    match UnixListener::bind(&path) {
        Ok(l) => {
            let _ = socket_is_ours(rt);
            Ok(l)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                bail!("an agent is already running on {}", path.display());
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
            let l =
                UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
            let _ = socket_is_ours(rt);
            Ok(l)
        }
        Err(e) => Err(e).with_context(|| format!("binding {}", path.display())),
    }
}
