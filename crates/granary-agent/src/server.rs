//! The control socket: one thread per connection, JSON lines. An `Attach` connection is the
//! job's lease: when it closes (the job ended or died), the job is detached.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use granary_core::catalog::Progress;

use crate::agent::{Agent, PoolWishes, VALIDATE_THREADS};
use crate::protocol::{AgentStatus, PageCacheStatus, PoolStatus, Reply, Request, SourceStatus};
use crate::serving::Serving;
use crate::source::{Broadcast, SourceState};

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

/// The connection's writing half, shared by the request loop and its keepalive.
type Writer = Mutex<UnixStream>;

fn send(w: &Writer, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    w.lock()
        .unwrap_or_else(|e| e.into_inner())
        .write_all(&line)
        .context("writing a reply")
}

/// How often a connection waiting on a long request (a walk, another job's walk of the same
/// source) says it is alive: clients treat `protocol::SILENCE_LIMIT` without a line as an agent
/// that does not answer.
const KEEPALIVE: Duration = Duration::from_millis(100);

/// Runs `f` while a thread sends `progress` every `KEEPALIVE`, so the client can tell a busy
/// agent from a stopped one.
fn with_keepalive<T>(w: &Writer, progress: &Progress, f: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut waited = Duration::ZERO;
            while !done.load(Ordering::Acquire) {
                // Short naps so a quick request is not held up by this thread.
                std::thread::sleep(Duration::from_millis(10));
                waited += Duration::from_millis(10);
                if waited < KEEPALIVE {
                    continue;
                }
                waited = Duration::ZERO;
                let p = Reply::Progress {
                    files: progress.files.load(Ordering::Relaxed),
                    dirs: progress.dirs.load(Ordering::Relaxed),
                    bytes: progress.bytes.load(Ordering::Relaxed),
                };
                if done.load(Ordering::Acquire) || send(w, &p).is_err() {
                    break;
                }
            }
        });
        let r = f();
        done.store(true, Ordering::Release);
        r
    })
}

/// What the first job attaching to an idle source decides for it (later jobs share it).
struct SourceWishes<'a> {
    tiers: &'a [granary_core::tiers::TierSpec],
    order: Option<&'a granary_core::placement::known_order::OrderSpec>,
    immutable: bool,
    /// The pack to serve, and whether only the pack exists.
    pack: Option<&'a std::path::Path>,
    mount: bool,
    /// Cluster mode: rank 0's catalog, adopted instead of a walk (`granary serve`).
    image: Option<&'a Broadcast>,
}

pub(crate) struct Lease {
    pub source: Arc<SourceState>,
    slot: u32,
}

/// `granary serve`'s own attach to its source, before any job: rank 0 walks (or loads) it,
/// or loads the pack's index, the other ranks adopt rank 0's `image`. Never detached.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn attach_serving(
    agent: &Arc<Agent>,
    source: &std::path::Path,
    immutable: bool,
    image: Option<&Broadcast>,
    progress: &Progress,
) -> Result<Lease> {
    let serving = agent.serving.as_ref().context("not a serving agent")?;
    let wishes = SourceWishes {
        tiers: &[],
        order: None,
        immutable,
        pack: serving.pack.as_deref(),
        mount: serving.mount,
        image,
    };
    let pool = PoolWishes {
        workers: None,
        block_size: None,
        max_source_streams: None,
        page_cache: None,
        mmap: None,
    };
    attach(agent, progress, source, std::process::id(), &wishes, &pool).map(|(_, l)| l)
}

fn serve(agent: &Arc<Agent>, stream: UnixStream) -> Result<()> {
    let reader = BufReader::new(stream.try_clone()?);
    let w: Writer = Mutex::new(stream);
    let mut lease: Option<Lease> = None;
    let result = (|| -> Result<()> {
        for line in reader.lines() {
            let line = line?;
            let req: Request = match serde_json::from_str(&line) {
                Ok(r) => r,
                Err(e) => {
                    send(
                        &w,
                        &Reply::Error {
                            message: format!("bad request: {e}"),
                            pack_damage: None,
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
                    block_size,
                    max_source_streams,
                    page_cache,
                    order,
                    immutable,
                    pack,
                    mount,
                    mmap,
                    settings,
                } => {
                    if lease.is_some() {
                        send(
                            &w,
                            &Reply::Error {
                                message: "already attached".into(),
                                pack_damage: None,
                            },
                        )?;
                        continue;
                    }
                    let progress = Progress::default();
                    let pack_dir = pack
                        .as_deref()
                        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()));
                    let res = with_keepalive(&w, &progress, || {
                        attach(
                            agent,
                            &progress,
                            &source,
                            pid,
                            &SourceWishes {
                                tiers: &tiers,
                                order: order.as_ref(),
                                immutable,
                                pack: pack.as_deref(),
                                mount,
                                image: None,
                            },
                            &PoolWishes {
                                workers,
                                block_size,
                                max_source_streams,
                                page_cache,
                                mmap,
                            },
                        )
                    });
                    match res {
                        Ok((mut reply, l)) => {
                            if let Reply::Attached { notes, .. } = &mut reply {
                                let agent_has = agent.settings();
                                notes.extend(
                                    granary_core::config::agent_wide::unapplied(
                                        &settings, &agent_has,
                                    )
                                    .into_iter()
                                    .map(|n| {
                                        format!(
                                            "{n} (set when the agent, pid {}, started; \
                                             `granary stop` between jobs applies it)",
                                            std::process::id()
                                        )
                                    }),
                                );
                            }
                            lease = Some(l);
                            send(&w, &reply)?;
                        }
                        Err(e) => send(
                            &w,
                            &Reply::Error {
                                message: format!("{e:#}"),
                                pack_damage: pack_dir.as_deref().and_then(|dir| {
                                    let pe = e.chain().find_map(|c| c.downcast_ref())?;
                                    granary_core::packed_source::damage::of_open_error(dir, pe)
                                }),
                            },
                        )?,
                    }
                }
                Request::Stats { source, slot, pack } => {
                    let reply = match find_source(agent, &source, pack.as_deref()) {
                        Some(s) => {
                            let snap = s.snapshot();
                            Reply::Stats {
                                placement: s.counters.snapshot(),
                                tiers: s.ctx().map(|c| c.space.tiers.usage()).unwrap_or_default(),
                                warnings: s.warnings(),
                                job: s.counters.jobs.get(slot),
                                cluster: agent.serving.as_ref().map(|c| {
                                    granary_core::stats::ClusterReport {
                                        rank: c.rank,
                                        ranks: c.ranks,
                                    }
                                }),
                                pending: snap.pending,
                                placing: snap.placing,
                                pack_damage: s
                                    .ctx()
                                    .and_then(|c| c.pack.get().and_then(|st| st.damage())),
                            }
                        }
                        None => Reply::Error {
                            message: format!("no such source: {}", source.display()),
                            pack_damage: None,
                        },
                    };
                    send(&w, &reply)?;
                }
                Request::Status => send(&w, &Reply::Status(status(agent)))?,
                Request::Cache { clean } => {
                    // Withdrawing an idle table waits for its copies in flight: keep talking.
                    let reply = with_keepalive(&w, &Progress::default(), || {
                        crate::cache::serve(agent, &clean)
                    });
                    send(&w, &reply)?
                }
                Request::Stop => {
                    tracing::info!("stop requested");
                    // A serving rank stops the whole job's serve: every rank leaves together.
                    if let Some(n) = agent.serving.as_ref().and_then(|c| c.node.get()) {
                        n.stop_all();
                    }
                    send(&w, &Reply::Stopping)?;
                    agent.stopping.store(true, Ordering::Release);
                }
            }
        }
        Ok(())
    })();
    if let Some(l) = lease {
        detach(agent, l, &w);
    }
    result
}

/// The source known as `key` was named through a symlink that leads elsewhere now (retargeted
/// since, `ln -sfn`): its state — catalog, table, copies — is the old directory's, and a job
/// given it would read the old directory's copies under the new one's paths. It is set aside
/// under its spelling and real path (kept for when the link leads there again), and the
/// spelling's state becomes the one of the directory it names now (set aside before, or new).
/// Refused while a job still uses the old directory through it.
fn aside_if_retargeted(
    map: &mut std::collections::HashMap<PathBuf, Arc<SourceState>>,
    key: &std::path::Path,
) -> Result<()> {
    let Some(s) = map.get(key) else {
        return Ok(());
    };
    let now = match std::fs::canonicalize(&s.source) {
        Ok(now) if now != s.source_real => now,
        // The same directory, or none (the attach reports that).
        _ => return Ok(()),
    };
    if s.jobs_now.load(Ordering::Acquire) > 0 {
        bail!(
            "{} leads to {} now, but a job still reads {} through it",
            s.source.display(),
            now.display(),
            s.source_real.display()
        );
    }
    tracing::info!(
        "{} leads to {} now (was {}): served as that directory",
        s.source.display(),
        now.display(),
        s.source_real.display()
    );
    // Two NULs: no key of a packed source (`source_key`: one NUL, then the pack) is one of these.
    let aside = |real: &std::path::Path| {
        let mut k = key.as_os_str().as_bytes().to_vec();
        k.extend_from_slice(&[0, 0]);
        k.extend_from_slice(real.as_os_str().as_bytes());
        PathBuf::from(std::ffi::OsString::from_vec(k))
    };
    let old = map.remove(key);
    if let Some(old) = old {
        map.insert(aside(&old.source_real), old);
    }
    if let Some(back) = map.remove(&aside(&now)) {
        map.insert(key.to_path_buf(), back);
    }
    Ok(())
}

fn find_source(
    agent: &Agent,
    source: &std::path::Path,
    pack: Option<&std::path::Path>,
) -> Option<Arc<SourceState>> {
    let (pack, _) = served_pack(agent, pack, false);
    let key = crate::source::source_key(&granary_core::source::normalize(source).ok()?, pack);
    agent
        .sources
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned()
}

/// The pack a job's source is served from: a serving rank's own (a job attaching to it names
/// none), else the job's.
fn served_pack<'a>(
    agent: &'a Agent,
    pack: Option<&'a std::path::Path>,
    mount: bool,
) -> (Option<&'a std::path::Path>, bool) {
    match &agent.serving {
        Some(c) => (c.pack.as_deref(), c.mount),
        None => (pack, mount),
    }
}

fn attach(
    agent: &Arc<Agent>,
    progress: &Progress,
    source: &std::path::Path,
    pid: u32,
    source_wishes: &SourceWishes<'_>,
    wishes: &PoolWishes,
) -> Result<(Reply, Lease)> {
    let &SourceWishes {
        tiers,
        order,
        immutable,
        pack,
        mount,
        image,
    } = source_wishes;
    agent.touch();
    let setup = agent.setup(wishes)?;
    let path = granary_core::source::normalize(source)?;
    if let Some(c) = &agent.serving {
        c.admit(&agent.stopping, &path, pid)?;
    }
    let (pack, mount) = served_pack(agent, pack, mount);
    let key = crate::source::source_key(&path, pack);
    let src = {
        let mut map = agent.sources.lock().unwrap_or_else(|e| e.into_inner());
        if pack.is_none() {
            aside_if_retargeted(&mut map, &key)?;
        }
        match map.get(&key) {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(match pack {
                    Some(p) => {
                        // Adopting rank 0's table: the tree as rank 0 resolved it.
                        let known = image.and_then(|b| {
                            let img = b.image.lock().unwrap_or_else(|e| e.into_inner());
                            granary_shm::image_source_real(&img)
                                .map(|r| PathBuf::from(std::ffi::OsString::from_vec(r)))
                        });
                        SourceState::new_packed(path, p, mount, known)?
                    }
                    None => SourceState::new(path)?,
                });
                map.insert(key, s.clone());
                s
            }
        }
    };
    let mut inner = src.inner.lock().unwrap_or_else(|e| e.into_inner());
    src.used_now();
    let mut notes = Vec::new();
    if inner.jobs == 0 || src.ctx().is_none() {
        // First job on this source (again): its tiers become the source's, and walk, so changes
        // since the last job are seen.
        let specs = if tiers.is_empty() {
            &agent.default_tiers[..]
        } else {
            tiers
        };
        if specs.is_empty() {
            bail!("no tiers configured");
        }
        refuse_tiers_inside(&src, specs)?;
        let in_use = |t: &Arc<granary_core::tiers::Tier>| {
            let sources = agent.sources.lock().unwrap_or_else(|e| e.into_inner());
            sources.values().any(|s| {
                !Arc::ptr_eq(s, &src)
                    && s.jobs_now.load(Ordering::Acquire) > 0
                    && s.ctx().is_some_and(|c| {
                        (0..c.space.tiers.len()).any(|i| c.space.tiers.shares(i, t))
                    })
            })
        };
        let (src_tiers, conflicts) = agent.registry.resolve(specs, in_use);
        notes.extend(conflicts);
        for i in 0..src_tiers.len() {
            let s = src_tiers.spec(i);
            tracing::info!(
                "{} tier {i}: {} ({} bytes, block {})",
                src.source.display(),
                s.path.display(),
                s.capacity,
                s.block_size
            );
        }
        let src_tiers = Arc::new(src_tiers);
        remember_tiers(&src_tiers);
        let generation = agent.generation.fetch_add(1, Ordering::AcqRel);
        let release = |id: &str| crate::cache::release(agent, &src, id);
        let walk_threads = (setup.workers * 2).clamp(4, 32);
        let origin = src.prepare(
            &mut inner,
            src_tiers,
            &agent.rt,
            generation,
            &crate::source::WalkOpts {
                image,
                threads: walk_threads,
                params: setup.pool.params(),
                verify: agent.cfg.verify.unwrap_or_default(),
                order,
                residency: &setup.residency,
                immutable: immutable || agent.cfg.immutable.unwrap_or(false),
                validate_threads: agent.cfg.validate_threads.unwrap_or(VALIDATE_THREADS),
                // A serving rank's copies are dealt out by the job (cluster mode).
                release: agent
                    .serving
                    .is_none()
                    .then_some(&release as &dyn Fn(&str) -> bool),
            },
            progress,
            &mut notes,
        )?;
        crate::residency_keeper::rebalance(agent);
        // A kept table keeps its known-order thread; a new one gets its own (and a packed
        // one its partition streamers).
        if origin != crate::source::Origin::Kept {
            if let Some(ctx) = src.ctx() {
                granary_core::placement::known_order::spawn(
                    ctx.clone(),
                    setup.pool.engine().clone(),
                )?;
                // A serving rank streams only its share of a pack: its node starts the
                // streamers once the pack is dealt out (`cluster::Node::start`).
                if agent.serving.is_none() {
                    granary_core::placement::pack_streamer::spawn(
                        ctx,
                        setup.pool.engine().clone(),
                    )?;
                }
            }
        }
    } else if agent.serving.is_none() {
        src.revalidate_for_new_job(agent.cfg.validate_threads.unwrap_or(VALIDATE_THREADS));
    }
    // The preload learns `[mmap] sequential_advice` from the table's header, set at every attach
    // (a table saved by an agent with other settings is this agent's now).
    if let Some(ctx) = src.ctx() {
        ctx.table
            .set_sequential_advice(setup.mmap.sequential_advice);
    }
    // (A serving rank's catalog was checked against the source once, at the serve's start, by
    // rank 0 for every rank: a job attaching later costs the source no metadata call.)
    if inner.jobs > 0 && !tiers.is_empty() {
        // Jobs already share this source's table, and with it its tiers.
        let ctx = src.ctx().context("no table published")?;
        let same = tiers.len() == ctx.space.tiers.len()
            && tiers.iter().enumerate().all(|(i, s)| {
                agent
                    .registry
                    .get(&s.path)
                    .is_some_and(|t| ctx.space.tiers.shares(i, &t))
            });
        if same {
            notes.extend(agent.registry.conflicts(tiers));
        } else {
            notes.push(format!(
                "{} is in use by another job with tiers {}; using them",
                src.source.display(),
                ctx.space
                    .tiers
                    .specs()
                    .iter()
                    .map(|t| t.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if inner.jobs > 0 && inner.order.as_ref() != order {
        // The policy is the source's, decided when the first job attached (like its tiers).
        notes.push(format!(
            "{} is in use by another job with placement policy {}; using it",
            src.source.display(),
            match &inner.order {
                Some(o) => format!("known-order ({})", o.access_order.display()),
                None => "fill-highest-first".into(),
            }
        ));
    }
    notes.extend(inner.order_note.clone());
    let slot = src.take_job_slot(pid);
    inner.jobs += 1;
    src.jobs_now.store(inner.jobs, Ordering::Release);
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
        tiers: src.ctx().map(|c| c.space.tiers.usage()).unwrap_or_default(),
        notes,
        warnings: src.warnings(),
        catalog: inner.catalog.clone(),
        placement: src.counters.snapshot(),
    };
    drop(inner);
    Ok((reply, Lease { source: src, slot }))
}

/// Adds the tiers' roots to the user's list of tiers used (`granary cache` finds copies there
/// when no flag names them), off the attach's path: the list is in the home directory.
fn remember_tiers(tiers: &granary_core::Tiers) {
    let roots: Vec<PathBuf> = tiers.specs().into_iter().map(|t| t.path).collect();
    let _ = std::thread::Builder::new()
        .name("tier-list".into())
        .spawn(move || granary_core::cache::registry::record(&roots));
}

/// A tier inside the source would put the cache into the dataset's own listings (and copies
/// of copies): refused, with the fix.
fn refuse_tiers_inside(src: &SourceState, specs: &[granary_core::tiers::TierSpec]) -> Result<()> {
    for t in specs {
        if granary_core::source::contains(&src.source, &src.source_real, &t.path) {
            bail!(
                "tier {} is inside the source {}: choose a tier outside the dataset",
                t.path.display(),
                src.source.display()
            );
        }
    }
    Ok(())
}

/// Ends the job of lease `l`; its connection `w` is closed once the job is counted out (the
/// job's `Conn::leave` waits for that), before the catalog is saved.
fn detach(agent: &Agent, l: Lease, w: &Writer) {
    l.source.free_job_slot(l.slot);
    let mut inner = l.source.inner.lock().unwrap_or_else(|e| e.into_inner());
    inner.jobs = inner.jobs.saturating_sub(1);
    l.source.jobs_now.store(inner.jobs, Ordering::Release);
    l.source.used_now();
    agent.jobs.fetch_sub(1, Ordering::AcqRel);
    let _ = w
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .shutdown(std::net::Shutdown::Both);
    agent.touch();
    tracing::info!(
        "job detached from {} ({} job(s) left)",
        l.source.source.display(),
        inner.jobs
    );
    if inner.jobs == 0 {
        l.source.persist(&inner);
        if agent.cfg.pin_inodes.unwrap_or(true) {
            l.source.hold_inodes();
        }
    }
}

fn status(agent: &Agent) -> AgentStatus {
    let sources = agent.source_states();
    AgentStatus {
        pid: std::process::id(),
        uptime_s: agent.started.elapsed().as_secs_f64(),
        jobs: agent.jobs.load(Ordering::Acquire),
        idle_timeout_s: agent.idle_timeout.as_secs_f64(),
        runtime_dir: agent.rt.dir.clone(),
        placement: agent.setup.get().map(|s| PoolStatus {
            workers: s.workers,
            block_size: s.block_size,
            memory_limit: s.memory_limit,
            page_cache: Some(page_cache_status(&s.residency)),
        }),
        tiers: agent.registry.usage(),
        cluster: agent.serving.as_ref().map(Serving::status),
        sources: sources
            .iter()
            .map(|s| {
                let snap = s.snapshot();
                // Not waited for: a walk holds it for as long as the source takes to list.
                let (busy, jobs, table, catalog) = match s.inner.try_lock() {
                    Ok(i) => (false, i.jobs, i.table_path.clone(), i.catalog.clone()),
                    Err(_) => (true, 0, None, Default::default()),
                };
                SourceStatus {
                    source: s.source.clone(),
                    id: s.id.clone(),
                    pack: s.pack.as_ref().map(|p| p.dir.clone()),
                    busy,
                    table,
                    jobs,
                    catalog,
                    tiers: snap.tiers,
                    files_placed_now: snap.files_placed,
                    bytes_placed_now: snap.bytes_placed,
                    pending: snap.pending,
                    placement: s.counters.snapshot(),
                    validation: s.ctx().and_then(|c| {
                        let v = c.validation.read().unwrap_or_else(|e| e.into_inner());
                        v.as_ref().map(|v| {
                            use std::sync::atomic::Ordering::Relaxed;
                            crate::protocol::ValidationStatus {
                                epoch: v.epoch,
                                immutable: v.immutable,
                                dirs_checked: v.dirs_checked.load(Relaxed),
                                files_checked: v.files_checked.load(Relaxed),
                                changed: v.changed.load(Relaxed),
                                done: v.finished(),
                            }
                        })
                    }),
                    warnings: s.warnings(),
                    held_dirs: s.pins.counts().dirs,
                    held_files: s.pins.counts().files,
                    served: s.served(),
                }
            })
            .collect(),
    }
}

fn page_cache_status(r: &granary_core::placement::residency::Residency) -> PageCacheStatus {
    PageCacheStatus {
        budget: r.budget().to_string(),
        target: Some(r.target()).filter(|t| *t != u64::MAX),
        room: r.room(),
        resident: r.resident(),
        demoted: r.demoted.load(Ordering::Relaxed),
        promoted: r.promoted.load(Ordering::Relaxed),
    }
}
