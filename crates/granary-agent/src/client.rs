//! Talking to the agent: connecting (starting it, or replacing one that does not answer),
//! `stop`, `status`.
//!
//! Every wait on the agent is bounded by `patience()`: a connection that stays silent that long
//! (an attach gets a progress line every 100 ms while the agent works on it) belongs to an agent
//! that is stopped (SIGSTOP, a debugger) or stuck (a hung file system under it). Such an agent
//! is replaced: it is killed (it is the same user's, and jobs survive it: they read the source)
//! and a new one started. If it cannot be killed (blocked in the kernel) the job runs without
//! granary and says so.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::runtime::Runtime;

use crate::protocol::{AgentStatus, CacheInUse, CacheRefused, CacheTaken, Reply, Request};

/// How long the agent may stay silent: `$GRANARY_AGENT_TIMEOUT` (seconds, or a duration like
/// `500ms`), default 5 s, at least 0.5 s (five keepalives). Starting an agent and waiting for one
/// that is shutting down are allowed a few times this.
pub fn patience() -> Duration {
    std::env::var("GRANARY_AGENT_TIMEOUT")
        .ok()
        .and_then(|v| granary_core::size::parse_duration(&v))
        .unwrap_or(Duration::from_secs(5))
        .max(Duration::from_millis(500))
}

/// The agent did not answer within `patience()`.
#[derive(Debug)]
pub struct Silent {
    /// The agent's pid, when known (the listener of the socket, or the holder of `alive`).
    pub pid: Option<u32>,
}

impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(p) => write!(
                f,
                "the granary agent (pid {p}, {}) did not answer within {} s",
                describe_state(p),
                patience().as_secs_f64()
            ),
            None => write!(
                f,
                "the granary agent did not answer within {} s",
                patience().as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for Silent {}

/// The pid of a silent agent, if `e` says the agent did not answer.
pub fn silent_pid(e: &anyhow::Error) -> Option<Option<u32>> {
    e.downcast_ref::<Silent>().map(|s| s.pid)
}

fn describe_state(pid: u32) -> &'static str {
    match granary_core::sys::process_state(pid) {
        Some('T') => "stopped",
        Some('t') => "stopped by a debugger",
        Some('D') => "blocked in the kernel, e.g. on a hung file system",
        Some('Z') | None => "exited",
        Some(_) => "running",
    }
}

pub struct Conn {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// The agent's pid (`SO_PEERCRED` of the connection).
    pub agent_pid: Option<u32>,
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

impl Conn {
    pub fn new(stream: UnixStream) -> Result<Conn> {
        stream.set_read_timeout(Some(patience()))?;
        stream.set_write_timeout(Some(patience()))?;
        let agent_pid = granary_core::sys::peer_pid(&stream)
            .ok()
            .filter(|p| *p != 0);
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Conn {
            stream,
            reader,
            agent_pid,
        })
    }

    fn silent(&self) -> anyhow::Error {
        Silent {
            pid: self.agent_pid,
        }
        .into()
    }

    pub fn send(&mut self, req: &Request) -> Result<()> {
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        match self.stream.write_all(&line) {
            Err(e) if is_timeout(&e) => Err(self.silent()),
            r => r.context("sending to the granary agent"),
        }
    }

    /// The next line from the agent; `Silent` after `patience()` without one.
    pub fn recv(&mut self) -> Result<Reply> {
        let mut line = String::new();
        let n = match self.reader.read_line(&mut line) {
            Err(e) if is_timeout(&e) => return Err(self.silent()),
            r => r.context("reading from the granary agent")?,
        };
        if n == 0 {
            bail!("the granary agent closed the connection (see its log)");
        }
        serde_json::from_str(&line).with_context(|| format!("bad reply from the agent: {line}"))
    }

    /// Ends the connection and waits (at most `patience()`) until the agent has closed its
    /// side: for a job's lease, the agent counts the job as ended before it closes, so whatever
    /// runs after `granary run` returns (`granary cache clean`) finds it ended.
    pub fn leave(&mut self) {
        if self.stream.shutdown(std::net::Shutdown::Write).is_err() {
            return;
        }
        let mut rest = Vec::new();
        let _ = self.reader.read_to_end(&mut rest);
    }

    /// Sends `req` and returns the first reply that is not a keepalive.
    pub fn ask(&mut self, req: &Request) -> Result<Reply> {
        self.send(req)?;
        loop {
            match self.recv()? {
                Reply::Progress { .. } => continue,
                r => return Ok(r),
            }
        }
    }
}

/// Connects to a live agent; `None` when there is none (no socket, or a stale one); `Silent`
/// when its listener accepts nothing for `patience()`. Only a socket of this uid's, never
/// reached through a symlink: anything else at `agent.sock` counts as stale (`connect_or_spawn`
/// removes it and starts an agent).
pub fn connect(rt: &Runtime) -> Result<Option<Conn>> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(rt.socket()) {
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{}", rt.socket().display())),
    }
    let stream = match granary_core::sys::connect_unix(&rt.socket(), patience()) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) if is_timeout(&e) => {
            return Err(Silent {
                pid: alive_holder(rt),
            }
            .into())
        }
        Err(e) => {
            return Err(e).with_context(|| format!("connecting to {}", rt.socket().display()))
        }
    };
    match granary_core::sys::peer_uid(&stream) {
        Ok(uid) if uid == granary_core::sys::uid() => Ok(Some(Conn::new(stream)?)),
        Ok(uid) => bail!(
            "{} is served by uid {uid}, not by you; refusing to use it",
            rt.socket().display()
        ),
        Err(e) => Err(e).context("SO_PEERCRED of the agent's socket"),
    }
}

/// The pid an agent wrote into `agent.alive`, if an agent holds its lock now.
fn alive_holder(rt: &Runtime) -> Option<u32> {
    use std::io::Read;
    let mut f = rt.open_alive().ok()?;
    if granary_core::sys::flock_free(&f) {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// True if `pid` is a `granary agent` process of this user: a pid read from a file or a socket
/// is killed only after this check.
fn is_our_agent(pid: u32) -> bool {
    if granary_core::sys::process_uid(pid) != Some(granary_core::sys::uid()) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut args = cmdline.split(|b| *b == 0);
    let exe = args.next().unwrap_or_default();
    exe.rsplit(|b| *b == b'/').next() == Some(b"granary".as_slice())
        && args.next() == Some(b"agent".as_slice())
}

/// With no agent alive (`alive` free, taken here for the while), removes the tables a killed
/// agent left in the runtime directory (`Runtime::remove_dead_tables`); returns how many.
pub fn remove_dead_tables(rt: &Runtime) -> usize {
    let Ok(alive) = rt.open_alive() else { return 0 };
    match granary_core::sys::flock_exclusive_within(&alive, Duration::ZERO) {
        Ok(true) => rt.remove_dead_tables(&alive, None),
        _ => 0,
    }
}

/// Ends an agent that does not answer (see the module comment): kills it and waits until the
/// process is gone. `pid`: the agent as the caller knows it; else the holder of `alive`. The
/// socket file is left to `connect_or_spawn`, which removes it under `agent.lock` once nothing
/// answers on it (another command may already have started the next agent on that path).
pub fn replace_unresponsive(rt: &Runtime, pid: Option<u32>) -> Result<()> {
    let Some(pid) = pid.or_else(|| alive_holder(rt)) else {
        bail!("the granary agent does not answer and its pid is unknown");
    };
    let gone = granary_core::sys::process_gone;
    if gone(pid) {
        return Ok(());
    }
    if !is_our_agent(pid) {
        bail!("the granary agent does not answer, and pid {pid} is not one of your granary agents");
    }
    let state = describe_state(pid);
    match granary_core::sys::signal(pid, libc::SIGKILL) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("killing the granary agent (pid {pid})")),
    }
    // On stderr, errors ignored: a job's command must not fail for its messages.
    let _ = writeln!(
        std::io::stderr(),
        "granary: the granary agent (pid {pid}, {state}) did not answer within {} s; killed it",
        patience().as_secs_f64()
    );
    let deadline = Instant::now() + patience();
    while !gone(pid) {
        if Instant::now() > deadline {
            bail!(
                "the granary agent (pid {pid}, {}) was killed but has not exited",
                describe_state(pid)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Waits until no agent holds `alive` (one shutting down saves its catalogs, which the next
/// agent reuses); a stopped one is replaced at once. Gives up after `limit`.
fn wait_previous(rt: &Runtime, limit: Duration) -> Result<()> {
    let alive = rt
        .open_alive()
        .with_context(|| format!("opening {}", rt.alive().display()))?;
    let deadline = Instant::now() + limit;
    while !granary_core::sys::flock_free(&alive) {
        let holder = alive_holder(rt);
        if let Some(p) = holder.filter(|p| is_stopped(*p)) {
            replace_unresponsive(rt, Some(p))?;
            continue;
        }
        if Instant::now() > deadline {
            bail!(
                "the previous granary agent{} is still running ({}) after {} s and does not \
                 answer; see {}",
                holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                holder.map(describe_state).unwrap_or("shutting down?"),
                limit.as_secs_f64(),
                rt.log().display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn is_stopped(pid: u32) -> bool {
    matches!(granary_core::sys::process_state(pid), Some('T' | 't'))
}

/// Connects to the agent, starting one if none is alive. Spawning is serialised by a lock so
/// concurrent `granary run`s start exactly one agent. Every step is bounded.
pub fn connect_or_spawn(rt: &Runtime, agent_args: &[String]) -> Result<Conn> {
    if let Some(c) = connect(rt)? {
        return Ok(c);
    }
    let lock = rt
        .open_lock()
        .with_context(|| format!("opening {}", rt.lock().display()))?;
    // Its holder waits at most for a previous agent and for a new one to start.
    let limit = patience() * 5;
    if !granary_core::sys::flock_exclusive_within(&lock, limit)
        .with_context(|| format!("locking {}", rt.lock().display()))?
    {
        bail!(
            "another granary command has been starting the agent for {} s (it holds {})",
            limit.as_secs_f64(),
            rt.lock().display()
        );
    }
    if let Some(c) = connect(rt)? {
        return Ok(c);
    }
    // Nobody answers on the socket: whatever socket file is there is stale, but the agent
    // that made it may still be saving its catalogs.
    wait_previous(rt, patience() * 2)?;
    let _ = std::fs::remove_file(rt.socket());
    let exe = std::env::current_exe().context("finding the granary executable")?;
    let log = rt.open_log().context("the agent's log")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("agent")
        .args(agent_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // The program's environment is not the agent's business.
        .env_remove("LD_PRELOAD");
    // SAFETY: setsid is async-signal-safe; it detaches the agent from our session so a ^C to the
    // job does not kill the node's shared agent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {} agent", exe.display()))?;
    let limit = patience() * 2;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(c) = connect(rt)? {
            // Reap it later without blocking: it outlives us by design.
            std::thread::spawn(move || child.wait());
            return Ok(c);
        }
        if let Some(st) = child.try_wait()? {
            bail!(
                "the granary agent exited at start ({st}); see {}",
                rt.log().display()
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            std::thread::spawn(move || child.wait());
            bail!(
                "the granary agent did not start within {} s; see {}",
                limit.as_secs_f64(),
                rt.log().display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `stop` found.
pub enum Stopped {
    /// No agent was running.
    NotRunning,
    /// The agent stopped (it saved its catalogs), or one that did not answer was killed.
    Stopped,
}

/// Asks the running agent to save its catalogs and exit, and waits until it is gone; an agent
/// that does not answer is killed.
pub fn stop(rt: &Runtime) -> Result<Stopped> {
    let conn = match connect(rt) {
        Ok(c) => c,
        Err(e) if silent_pid(&e).is_some() => {
            replace_unresponsive(rt, silent_pid(&e).flatten())?;
            return Ok(Stopped::Stopped);
        }
        Err(e) => return Err(e),
    };
    let Some(mut c) = conn else {
        if alive_holder(rt).is_none() {
            return Ok(Stopped::NotRunning);
        }
        // No socket, but an agent holds `alive`: it is shutting down (or stopped doing so).
        wait_previous(rt, Duration::from_secs(120))?;
        return Ok(Stopped::Stopped);
    };
    match c.ask(&Request::Stop) {
        Ok(_) => {}
        Err(e) if silent_pid(&e).is_some() => {
            replace_unresponsive(rt, c.agent_pid)?;
            return Ok(Stopped::Stopped);
        }
        Err(e) => return Err(e),
    }
    let pid = c.agent_pid;
    drop(c);
    wait_gone(rt, pid, Duration::from_secs(120))?;
    Ok(Stopped::Stopped)
}

/// Until the agent is gone: its socket refuses, then its `alive` lock is free (it has saved its
/// catalogs and exited). It said it stops, so it is given time to save; if it is stopped while
/// doing so, it is killed.
fn wait_gone(rt: &Runtime, pid: Option<u32>, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let alive = rt.open_alive().ok();
    while granary_core::sys::connect_unix(&rt.socket(), Duration::ZERO).is_ok()
        || alive
            .as_ref()
            .is_some_and(|f| !granary_core::sys::flock_free(f))
    {
        if let Some(p) =
            pid.filter(|p| matches!(granary_core::sys::process_state(*p), Some('T' | 't')))
        {
            return replace_unresponsive(rt, Some(p));
        }
        if Instant::now() > deadline {
            bail!("the agent is still running after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The running agent's status; `None` when no agent runs. An agent that does not answer is
/// a `Silent` error (`silent_pid`).
pub fn status(rt: &Runtime) -> Result<Option<AgentStatus>> {
    let Some(mut c) = connect(rt)? else {
        return Ok(None);
    };
    match c.ask(&Request::Status)? {
        Reply::Status(s) => Ok(Some(s)),
        other => bail!("unexpected reply to status: {other:?}"),
    }
}

/// The running agent's answer to `granary cache`.
pub struct CacheAnswer {
    pub in_use: Vec<CacheInUse>,
    pub taken: Vec<CacheTaken>,
    pub refused: Vec<CacheRefused>,
    /// The tier directories its sources use.
    pub tiers: Vec<std::path::PathBuf>,
}

/// Asks the running agent to record every source's copies and to take away the source
/// directories in `clean` no job uses (`Request::Cache`); `None` when no agent runs. An agent
/// that does not answer is a `Silent` error.
pub fn cache(rt: &Runtime, clean: Vec<std::path::PathBuf>) -> Result<Option<CacheAnswer>> {
    let Some(mut c) = connect(rt)? else {
        return Ok(None);
    };
    match c.ask(&Request::Cache { clean })? {
        Reply::Cache {
            in_use,
            taken,
            refused,
            tiers,
        } => Ok(Some(CacheAnswer {
            in_use,
            taken,
            refused,
            tiers,
        })),
        Reply::Error { message, .. } => bail!("the agent: {message}"),
        other => bail!("unexpected reply to cache: {other:?}"),
    }
}
