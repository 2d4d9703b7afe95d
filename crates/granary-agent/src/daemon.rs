//! The agent's process: `start` waits for a previous agent to let go of the runtime
//! directory and binds the control socket, `spawn_threads` starts the agent's threads (request
//! ring, heartbeat, page-cache residency, tier watch, mapping follower, the socket's accept
//! loop), and `main_loop` runs until the agent is asked to stop, is idle, or loses its socket.

use std::os::unix::net::UnixListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::runtime::Runtime;

use crate::agent::Agent;
use crate::config::AgentConfig;

/// How long a starting agent waits for the previous one to let go of `agent.alive`.
const ALIVE_WAIT: Duration = Duration::from_secs(60);

/// An agent set up (socket bound, `agent.alive` held), before its threads run.
pub struct Started {
    pub agent: Arc<Agent>,
    listener: UnixListener,
    /// Locked until the process exits.
    _alive: std::fs::File,
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

/// `granary agent`: an agent in the foreground, until it stops.
pub fn run(rt: Runtime, config: AgentConfig) -> Result<()> {
    let started = start(rt, config)?;
    spawn_threads(&started)?;
    main_loop(&started.agent);
    started.agent.shutdown();
    Ok(())
}

/// Sets an agent up in `rt`: waits for a previous one to let go of `agent.alive`, binds the
/// socket. Its threads start with `spawn_threads`.
pub fn start(rt: Runtime, config: AgentConfig) -> Result<Started> {
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
    volunteer_for_oom();
    // What holds descriptors is budgeted in shares of the open-file limit (kept mappings, mirrors,
    // inode pins): a soft limit of 1,024 under a hard one of a million would cut them for nothing.
    granary_core::sys::raise_open_files_limit();
    let listener = bind(&rt)?;
    let socket_ino = {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(rt.socket())
            .with_context(|| format!("the socket {} just bound", rt.socket().display()))?
            .ino()
    };
    // This agent holds `alive`: every other table here is a dead agent's.
    let removed = rt.remove_dead_tables(&alive, Some(std::process::id()));
    if removed > 0 {
        tracing::info!("removed {removed} tables of agents that are gone");
    }
    let agent = Arc::new(Agent::new(rt, config, socket_ino));
    tracing::info!(
        "agent {} listening on {} (idle timeout {:?})",
        std::process::id(),
        agent.rt.socket().display(),
        agent.idle_timeout
    );
    Ok(Started {
        agent,
        listener,
        _alive: alive,
    })
}

/// Starts the agent's threads: ring consumer, heartbeat, journal of copies, page-cache residency,
/// tier watch, and the control socket's accept loop.
pub fn spawn_threads(started: &Started) -> Result<()> {
    let agent = &started.agent;
    let listener = started.listener.try_clone()?;
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("ring".into())
            .spawn(move || crate::ring::consume(a))?;
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
            .name("journal".into())
            .spawn(move || journal(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("residency".into())
            .spawn(move || crate::residency_keeper::keep(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("tierwatch".into())
            .spawn(move || crate::tierwatch::watch(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("mappings".into())
            .spawn(move || crate::follower::follow(a))?;
    }
    {
        let a = agent.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || crate::server::accept_loop(a, listener))?;
    }
    Ok(())
}

/// How long an agent no job uses stays on to finish the copies its last jobs queued. They are
/// mostly small files the programs read and closed (copied from the page cache, no source
/// read), placed at idle priority and only while the node has a free core: on a busy node the
/// last job's files may still be queued when the idle timeout expires, and an agent that left
/// then would make the next job read them from the source again.
pub const MAX_FINISHING: Duration = Duration::from_secs(600);

/// Until the agent stops (asked to, idle with no copies queued, or its socket taken over).
pub fn main_loop(agent: &Agent) {
    let idle_timeout = agent.idle_timeout;
    // Since when the agent, unused for `idle_timeout`, has waited for its queued copies.
    let mut finishing: Option<Instant> = None;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if agent.stopping.load(Ordering::Acquire) {
            break;
        }
        let unused = agent.jobs.load(Ordering::Acquire) == 0
            && agent
                .last_active
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
                >= idle_timeout;
        if unused {
            let queued = agent.queued_copies();
            if queued == 0 {
                tracing::info!("no job for {idle_timeout:?}: exiting");
                break;
            }
            let lingered = *finishing.get_or_insert_with(Instant::now);
            if lingered.elapsed() >= MAX_FINISHING {
                tracing::info!(
                    "no job for {idle_timeout:?}, {queued} copies still queued after \
                     {MAX_FINISHING:?} more: exiting without them"
                );
                break;
            }
        } else {
            finishing = None;
        }
        // Someone removed or replaced our socket (a new agent took over): leave quietly.
        if !agent.owns_socket() {
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

/// Writes what the sources' journals of copies buffered for long (`journal::FLUSH_AFTER`) and
/// folds a journal grown large (`SourceState::tend_journal`). Its own thread: a tier slow to
/// write never delays the heartbeat.
fn journal(agent: Arc<Agent>) {
    let period = granary_core::cache::journal::FLUSH_AFTER / 4;
    while !agent.stopping.load(Ordering::Acquire) {
        for s in agent.source_states() {
            s.tend_journal();
        }
        std::thread::sleep(period);
    }
}

/// Binds the control socket; a leftover socket nobody answers on is replaced, a live agent is
/// an error.
fn bind(rt: &Runtime) -> Result<UnixListener> {
    let path = rt.socket();
    match UnixListener::bind(&path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                bail!("an agent is already running on {}", path.display());
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
            UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("binding {}", path.display())),
    }
}
