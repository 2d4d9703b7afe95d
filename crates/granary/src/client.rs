//! Talking to the agent: connecting (starting it when needed), `stop`, `status`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::runtime::Runtime;
use granary_core::size::format_size;

use crate::agent::protocol::{Reply, Request};

pub struct Conn {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Conn {
    pub fn new(stream: UnixStream) -> Result<Conn> {
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Conn { stream, reader })
    }

    pub fn send(&mut self, req: &Request) -> Result<()> {
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        self.stream
            .write_all(&line)
            .context("sending to the granary agent")
    }

    pub fn recv(&mut self) -> Result<Reply> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .context("reading from the granary agent")?;
        if n == 0 {
            bail!("the granary agent closed the connection (see its log)");
        }
        serde_json::from_str(&line).with_context(|| format!("bad reply from the agent: {line}"))
    }
}

/// Connects to a live agent; `None` when there is none (no socket, or a stale one).
pub fn connect(rt: &Runtime) -> Result<Option<Conn>> {
    match UnixStream::connect(rt.socket()) {
        Ok(s) => Ok(Some(Conn::new(s)?)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("connecting to {}", rt.socket().display())),
    }
}

/// Connects to the agent, starting one if none is alive. Spawning is serialised by a lock so
/// concurrent `granary run`s start exactly one agent.
pub fn connect_or_spawn(rt: &Runtime, agent_args: &[String]) -> Result<Conn> {
    if let Some(c) = connect(rt)? {
        return Ok(c);
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(rt.lock())
        .with_context(|| format!("opening {}", rt.lock().display()))?;
    granary_core::sys::flock_exclusive(&lock)
        .with_context(|| format!("locking {}", rt.lock().display()))?;
    if let Some(c) = connect(rt)? {
        return Ok(c);
    }
    // Nobody answers: whatever socket file is there is stale.
    let _ = std::fs::remove_file(rt.socket());
    let exe = std::env::current_exe().context("finding the granary executable")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(rt.log())
        .with_context(|| format!("opening {}", rt.log().display()))?;
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
    let deadline = Instant::now() + Duration::from_secs(30);
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
            bail!(
                "the granary agent did not start within 30 s; see {}",
                rt.log().display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stop() -> Result<i32> {
    let rt = Runtime::open()?;
    let Some(mut c) = connect(&rt)? else {
        eprintln!("granary: no agent running");
        return Ok(0);
    };
    c.send(&Request::Stop)?;
    let _ = c.recv();
    drop(c);
    wait_gone(&rt, Duration::from_secs(120))?;
    eprintln!("granary: agent stopped");
    Ok(0)
}

/// Until the agent is gone: its socket refuses, then its `alive` lock is free (it has saved its
/// catalogs and exited).
fn wait_gone(rt: &Runtime, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let alive = rt.open_alive().ok();
    while UnixStream::connect(rt.socket()).is_ok()
        || alive
            .as_ref()
            .is_some_and(|f| !granary_core::sys::flock_free(f))
    {
        if Instant::now() > deadline {
            bail!("the agent is still running after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

pub fn status(json: bool) -> Result<i32> {
    let rt = Runtime::open()?;
    let Some(mut c) = connect(&rt)? else {
        if json {
            println!("null");
        } else {
            println!("granary: no agent running");
        }
        return Ok(0);
    };
    c.send(&Request::Status)?;
    let Reply::Status(s) = c.recv()? else {
        bail!("unexpected reply to status");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(0);
    }
    println!(
        "agent pid {}, up {:.0} s, {} job(s) attached, idle timeout {:.0} s, runtime {}",
        s.pid,
        s.uptime_s,
        s.jobs,
        s.idle_timeout_s,
        s.runtime_dir.display()
    );
    if let Some(p) = &s.placement {
        println!(
            "placement: {} workers, source reads of {}{}",
            p.workers,
            format_size(p.block_size),
            p.memory_limit
                .map(|l| format!(" (sized for a memory cgroup limit of {})", format_size(l)))
                .unwrap_or_default()
        );
        if let Some(pc) = &p.page_cache {
            println!(
                "page cache ({}): {} of copies resident, {}{}; {} demoted, {} promoted",
                pc.budget,
                format_size(pc.resident),
                pc.target
                    .map(|t| format!("{} may be", format_size(t)))
                    .unwrap_or_else(|| "no limit".into()),
                if pc.room > 0 {
                    format!(" ({} of room for file pages)", format_size(pc.room))
                } else {
                    String::new()
                },
                pc.demoted,
                pc.promoted
            );
        }
    }
    for (i, t) in s.tiers.iter().enumerate() {
        println!(
            "tier {i}: {} — {} used of {} ({} reserved)",
            t.path.display(),
            format_size(t.used),
            format_size(t.capacity),
            format_size(t.reserved)
        );
    }
    for src in &s.sources {
        println!(
            "source {} ({}): {} files, {}; {} placed ({}), {} pending; {} job(s)",
            src.source.display(),
            src.id,
            src.catalog.files,
            format_size(src.catalog.bytes),
            src.files_placed_now,
            format_size(src.bytes_placed_now),
            src.pending,
            src.jobs
        );
        for (i, t) in src.tiers.iter().enumerate() {
            println!("  tier {i}: {}", t.path.display());
        }
    }
    Ok(0)
}
