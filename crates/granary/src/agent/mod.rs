//! The node agent: one per node and user. Owns the catalogs, tier accounting and placement; jobs
//! attach over a Unix socket and then find files through the shared table without round trips.

pub mod protocol;
mod ring;
mod server;
mod source;

use std::collections::HashMap;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::config::{resolve_tiers, DEFAULT_IDLE_TIMEOUT};
use granary_core::placement::{default_workers, FillHighestFirst, Pool};
use granary_core::runtime::Runtime;
use granary_core::tiers::{TierRegistry, TierSpec};

use crate::cli::AgentArgs;
use source::SourceState;

/// The placement pool, started by the first job. It serves every source: each job carries its
/// table's tiers, so sources with different tiers need no pool of their own.
pub struct Setup {
    pub pool: Pool,
    pub workers: usize,
}

pub struct Agent {
    pub rt: Runtime,
    pub started: Instant,
    pub idle_timeout: Duration,
    /// Tiers from the agent's own flags or configuration, for a job that names none.
    pub default_tiers: Vec<TierSpec>,
    /// Workers from the agent's own flags or configuration; else the first job's.
    pub workers: Option<usize>,
    /// One capacity counter per tier directory, whichever sources use it.
    pub registry: TierRegistry,
    pub setup: OnceLock<Setup>,
    setup_lock: Mutex<()>,
    pub sources: Mutex<HashMap<std::path::PathBuf, Arc<SourceState>>>,
    pub jobs: AtomicUsize,
    pub last_active: Mutex<Instant>,
    pub stopping: AtomicBool,
    pub generation: AtomicU64,
}

impl Agent {
    /// The placement pool; the agent's configured workers, else the first caller's, size it.
    pub fn setup(&self, workers: Option<usize>) -> Result<&Setup> {
        if let Some(s) = self.setup.get() {
            return Ok(s);
        }
        let _g = self.setup_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.setup.get() {
            return Ok(s);
        }
        let workers = self.workers.or(workers).unwrap_or_else(default_workers);
        let pool =
            Pool::new(workers, Arc::new(FillHighestFirst)).context("starting placement workers")?;
        tracing::info!("{workers} placement workers");
        let _ = self.setup.set(Setup { pool, workers });
        Ok(self.setup.get().expect("set above"))
    }

    pub fn touch(&self) {
        *self.last_active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Saves every catalog, removes tables and the socket. The cache on disk stays consistent:
    /// only complete copies have object names, and the saved catalogs describe them.
    fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        let _ = std::fs::remove_file(self.rt.socket());
        let sources: Vec<_> = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for s in sources {
            let mut inner = s.inner.lock().unwrap_or_else(|e| e.into_inner());
            s.retire(&mut inner);
        }
        tracing::info!("agent {} exiting", std::process::id());
    }
}

pub fn main(args: AgentArgs) -> Result<i32> {
    let rt = Runtime::open()?;
    let cfg = crate::run::load_config(&args.tiers)?;
    crate::logging::init(
        Some(cfg.log_level.as_deref().unwrap_or("info")),
        cfg.log_file.clone(),
    );
    let idle_timeout = match &args.tiers.idle_timeout {
        Some(s) => granary_core::size::parse_duration(s)
            .with_context(|| format!("bad --idle-timeout `{s}`"))?,
        None => cfg.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
    };
    let tier_cfg = crate::run::tier_configs(&args.tiers, &cfg)?;
    let default_tiers: Vec<_> = resolve_tiers(&tier_cfg)?.into_iter().map(|t| t.0).collect();
    let listener = bind(&rt)?;
    let agent = Arc::new(Agent {
        rt,
        started: Instant::now(),
        idle_timeout,
        default_tiers,
        workers: args.tiers.workers.or(cfg.workers),
        registry: TierRegistry::default(),
        setup: OnceLock::new(),
        setup_lock: Mutex::new(()),
        sources: Mutex::default(),
        jobs: AtomicUsize::new(0),
        last_active: Mutex::new(Instant::now()),
        stopping: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    });
    tracing::info!(
        "agent {} listening on {} (idle timeout {:?})",
        std::process::id(),
        agent.rt.socket().display(),
        idle_timeout
    );
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("ring".into())
            .spawn(move || ring::consume(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || server::accept_loop(a, listener))?;
    }
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
    agent.shutdown();
    Ok(0)
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
