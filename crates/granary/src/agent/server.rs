//! The control socket: one thread per connection, JSON lines. An `Attach` connection is the
//! job's lease: when it closes (the job ended or died), the job is detached.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use granary_core::catalog::Progress;

use super::protocol::{AgentStatus, Reply, Request, SourceStatus};
use super::source::SourceState;
use super::Agent;

pub fn accept_loop(agent: Arc<Agent>, listener: UnixListener) {
    for conn in listener.incoming() {
        if agent.stopping.load(Ordering::Acquire) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                continue;
            }
        };
        match granary_core::sys::peer_uid(&stream) {
            Ok(uid) if uid == granary_core::sys::uid() => {}
            Ok(uid) => {
                tracing::warn!("rejected a connection from uid {uid}");
                continue;
            }
            Err(e) => {
                tracing::warn!("rejected a connection (SO_PEERCRED: {e})");
                continue;
            }
        }
        let a = agent.clone();
        let _ = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || {
                if let Err(e) = serve(&a, stream) {
                    tracing::debug!("connection: {e:#}");
                }
            });
    }
}

fn send(w: &mut UnixStream, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    w.write_all(&line).context("writing a reply")
}

struct Lease {
    source: Arc<SourceState>,
    slot: u32,
}

fn serve(agent: &Arc<Agent>, stream: UnixStream) -> Result<()> {
    let reader = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let mut lease: Option<Lease> = None;
    let result = (|| -> Result<()> {
        for line in reader.lines() {
            let line = line?;
            let req: Request = match serde_json::from_str(&line) {
                Ok(r) => r,
                Err(e) => {
                    send(
                        &mut w,
                        &Reply::Error {
                            message: format!("bad request: {e}"),
                        },
                    )?;
                    continue;
                }
            };
            match req {
                Request::Attach {
                    source,
                    pid,
                    tiers,
                    workers,
                } => {
                    if lease.is_some() {
                        send(
                            &mut w,
                            &Reply::Error {
                                message: "already attached".into(),
                            },
                        )?;
                        continue;
                    }
                    match attach(agent, &mut w, &source, pid, &tiers, workers) {
                        Ok((reply, l)) => {
                            lease = Some(l);
                            send(&mut w, &reply)?;
                        }
                        Err(e) => send(
                            &mut w,
                            &Reply::Error {
                                message: format!("{e:#}"),
                            },
                        )?,
                    }
                }
                Request::Stats { source } => {
                    let reply = match find_source(agent, &source) {
                        Some(s) => Reply::Stats {
                            placement: s.counters.snapshot(),
                            tiers: tier_usage(agent),
                        },
                        None => Reply::Error {
                            message: format!("no such source: {}", source.display()),
                        },
                    };
                    send(&mut w, &reply)?;
                }
                Request::Status => send(&mut w, &Reply::Status(status(agent)))?,
                Request::Stop => {
                    tracing::info!("stop requested");
                    send(&mut w, &Reply::Stopping)?;
                    agent.stopping.store(true, Ordering::Release);
                }
            }
        }
        Ok(())
    })();
    if let Some(l) = lease {
        detach(agent, l);
    }
    result
}

fn tier_usage(agent: &Agent) -> Vec<granary_core::tiers::TierUsage> {
    agent
        .setup
        .get()
        .map(|s| s.tiers.usage())
        .unwrap_or_default()
}

fn find_source(agent: &Agent, source: &std::path::Path) -> Option<Arc<SourceState>> {
    let key = granary_core::source::normalize(source).ok()?;
    agent
        .sources
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned()
}

fn attach(
    agent: &Arc<Agent>,
    w: &mut UnixStream,
    source: &std::path::Path,
    pid: u32,
    tiers: &[granary_core::tiers::TierSpec],
    workers: Option<usize>,
) -> Result<(Reply, Lease)> {
    agent.touch();
    let setup = agent.setup(tiers, workers)?;
    let in_use = setup.tiers.specs();
    let note = (!tiers.is_empty() && in_use != tiers).then(|| {
        format!(
            "the agent already runs with tiers {}; using them (`granary stop` to change)",
            in_use
                .iter()
                .map(|t| t.path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    let key = granary_core::source::normalize(source)?;
    let src = {
        let mut map = agent.sources.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(SourceState::new(key.clone())?);
                map.insert(key, s.clone());
                s
            }
        }
    };
    let mut inner = src.inner.lock().unwrap_or_else(|e| e.into_inner());
    if inner.jobs == 0 || src.ctx().is_none() {
        // First job on this source (again): walk, so changes since the last job are seen.
        let progress = Progress::default();
        let generation = agent.generation.fetch_add(1, Ordering::AcqRel);
        let walk_threads = (setup.workers * 2).clamp(4, 32);
        let done = std::sync::atomic::AtomicBool::new(false);
        let res = std::thread::scope(|s| {
            let mut pw = w.try_clone()?;
            let (progress, done) = (&progress, &done);
            s.spawn(move || {
                let mut ticks = 0u32;
                while !done.load(Ordering::Acquire) {
                    // Short naps so a quick walk is not held up waiting for this thread.
                    std::thread::sleep(Duration::from_millis(10));
                    ticks += 1;
                    if ticks % 25 != 0 {
                        continue;
                    }
                    let p = Reply::Progress {
                        files: progress.files.load(Ordering::Relaxed),
                        dirs: progress.dirs.load(Ordering::Relaxed),
                        bytes: progress.bytes.load(Ordering::Relaxed),
                    };
                    if done.load(Ordering::Acquire) || send(&mut pw, &p).is_err() {
                        break;
                    }
                }
            });
            let r = src.rewalk(
                &mut inner,
                &setup.tiers,
                &agent.rt,
                generation,
                walk_threads,
                progress,
            );
            done.store(true, Ordering::Release);
            r
        });
        res?;
    }
    let slot = src.claim_slot(pid);
    inner.jobs += 1;
    agent.jobs.fetch_add(1, Ordering::AcqRel);
    tracing::info!(
        "job {pid} attached to {} (slot {slot}, {} job(s))",
        src.source.display(),
        inner.jobs
    );
    let reply = Reply::Attached {
        table: inner.table_path.clone().context("no table published")?,
        job_slot: slot,
        source_id: src.id.clone(),
        tiers: setup.tiers.usage(),
        note,
        catalog: inner.catalog.clone(),
        placement: src.counters.snapshot(),
    };
    drop(inner);
    Ok((reply, Lease { source: src, slot }))
}

fn detach(agent: &Agent, l: Lease) {
    l.source.free_slot(l.slot);
    let mut inner = l.source.inner.lock().unwrap_or_else(|e| e.into_inner());
    inner.jobs = inner.jobs.saturating_sub(1);
    agent.jobs.fetch_sub(1, Ordering::AcqRel);
    agent.touch();
    tracing::info!(
        "job detached from {} ({} job(s) left)",
        l.source.source.display(),
        inner.jobs
    );
    if inner.jobs == 0 {
        if let Some(setup) = agent.setup.get() {
            l.source.persist(&inner, &setup.tiers);
        }
    }
}

fn status(agent: &Agent) -> AgentStatus {
    let sources = agent
        .sources
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect::<Vec<_>>();
    AgentStatus {
        pid: std::process::id(),
        uptime_s: agent.started.elapsed().as_secs_f64(),
        jobs: agent.jobs.load(Ordering::Acquire),
        idle_timeout_s: agent.idle_timeout.as_secs_f64(),
        runtime_dir: agent.rt.dir.clone(),
        tiers: tier_usage(agent),
        sources: sources
            .iter()
            .map(|s| {
                let (files, bytes) = s.placed_now();
                let (jobs, table, catalog) = match s.inner.try_lock() {
                    Ok(i) => (i.jobs, i.table_path.clone(), i.catalog.clone()),
                    Err(_) => (0, None, Default::default()),
                };
                SourceStatus {
                    source: s.source.clone(),
                    id: s.id.clone(),
                    table,
                    jobs,
                    catalog,
                    files_placed_now: files,
                    bytes_placed_now: bytes,
                    placement: s.counters.snapshot(),
                }
            })
            .collect(),
    }
}
