//! `granary serve`: one rank of the serving job (module comment of `cluster`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use granary_core::runtime::Runtime;
use granary_core::size::format_size;

use super::config::{for_rank, path_for_rank, ServeConfig};
use super::mpi;
use super::node::{Node, Setup};
use super::transport::{Comm, Inbox};

use crate::config::{resolve_job_tiers, AgentConfig};
use crate::daemon::{self, Started};
use crate::server::{attach_serving, Lease};
use crate::serving::Serving;
use crate::source::Broadcast;

/// `eprintln!` in one `write(2)`: the ranks of a job share one log (mpirun's, a batch job's
/// output), and std's unbuffered stderr writes each formatted piece separately, so two ranks'
/// lines interleaved mid-line ("granary serve: rank granary serve: rank 1: …").
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

/// Placement workers of a serving rank when not configured: its pool reads the files it owns
/// for every rank (the source-stream cap still bounds the reads in flight).
const SERVE_WORKERS: usize = 8;

pub fn serve(config: ServeConfig) -> Result<()> {
    let mpi = mpi::init()?;
    let (rank, ranks) = (mpi.rank, mpi.ranks);
    // The launcher binds each rank as it would a compute process (OpenMPI: one core when it
    // starts two ranks or fewer, else a socket): every thread of this node's agent would share
    // it, and a program woken on that core waits for them. This agent is the node's service.
    if !config.keep_binding {
        match granary_core::sys::unbind() {
            Ok((before, after)) if before != after => {
                tracing::info!(
                    "rank {rank}: runs on {after} CPUs (the launcher bound it to {before})"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("rank {rank}: keeps the launcher's binding: {e}"),
        }
    }
    let prepared = prepare(&config, rank, ranks);
    let (started, lease0, image, layout) = match prepared {
        Ok(p) => p,
        Err(e) => {
            // Every rank takes part in the broadcasts whatever happened here.
            let _ = mpi.broadcast(Vec::new());
            let _ = mpi.broadcast(Vec::new());
            return Err(e);
        }
    };
    let agent = started.agent.clone();
    let serving = agent.serving.as_ref().context("serving agent")?;
    let image = mpi.broadcast(image)?;
    // A pack's partition table (rank 0 read its index): no other rank reads it.
    let layout = mpi.broadcast(layout)?;
    if image.is_empty() {
        let why = "rank 0 could not catalog the source (see its agent.log)".to_string();
        let _ = serving.failed.set(why.clone());
        agent.shutdown();
        bail!(why);
    }
    let lease = match lease0 {
        Some(l) => l,
        None => {
            let b = Broadcast {
                image: Mutex::new(image),
                layout,
            };
            let none = granary_core::catalog::Progress::default();
            attach_serving(&agent, &config.source, config.immutable, Some(&b), &none)
                .context("adopting rank 0's catalog")?
        }
    };
    let ctx = lease.source.ctx().context("no table published")?;
    // Doorbells wake the communication threads when a message comes (`doorbell`); without
    // one this rank polls MPI on a timer, as its peers do for it.
    let door = match super::doorbell::Door::open(rank, ranks) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            tracing::info!("rank {rank}: no doorbell ({e}): polling MPI on a timer");
            None
        }
    };
    let (comm, cmds) = Comm::new(door);
    let node = Node::start(
        agent.clone(),
        ctx.clone(),
        Setup {
            rank,
            ranks,
            replicas: config.replicas.min(ranks),
            replicate: config.replicate.clone(),
            replicate_set: config.replicate_set.clone(),
            timeout: config.peer_timeout,
            direct: config.direct,
        },
        comm.clone(),
    )?;
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    {
        let inbox: Arc<dyn Inbox> = node.clone();
        let (bell, bufs, budget, pulse) = (
            comm.bell.clone(),
            comm.bufs.clone(),
            comm.budget.clone(),
            comm.pulse.clone(),
        );
        std::thread::Builder::new()
            .name("mpi".into())
            .spawn(move || {
                mpi.serve(inbox, cmds, bell, bufs, budget, pulse);
                let _ = done_tx.send(());
            })?;
    }
    let _ = serving.node.set(node.clone());
    let st = serving.status();
    let line =
        format!(
        "granary serve: rank {rank} of {ranks} ready: {} files ({}) in the catalog, {} of them \
         ({}) this rank's share; runtime {}",
        lease.source.inner.lock().map(|i| i.catalog.files).unwrap_or(0),
        format_size(lease.source.inner.lock().map(|i| i.catalog.bytes).unwrap_or(0)),
        st.files_owned,
        format_size(st.bytes_owned),
        agent.rt.dir.display()
    );
    tracing::info!("{line}");
    say!("{line}");
    if let Some(every) = config.progress_every {
        let (agent, node) = (agent.clone(), node.clone());
        std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || report_progress(&agent, &node, rank, every))?;
    }
    daemon::main_loop(&agent);
    agent.shutdown();
    comm.stop();
    if done_rx.recv_timeout(Duration::from_secs(15)).is_err() {
        tracing::warn!("MPI did not finish in time (another rank is stopped or gone)");
    }
    drop(lease);
    Ok(())
}

/// Says every `every` how much of its share this rank holds (its own copies, copies of other
/// ranks' files still to make, bytes read from the source), while that changes; once it holds
/// its share, says so and stops. A batch job's log shows the staging move, not a silence.
fn report_progress(agent: &crate::agent::Agent, node: &Node, rank: u32, every: Duration) {
    let mut last = None;
    loop {
        let due = std::time::Instant::now() + every;
        while std::time::Instant::now() < due {
            if agent.stopping.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let s = node.share();
        if s.files_held >= s.files_owned && s.copies_pending == 0 {
            say!(
                "granary serve: rank {rank}: holds its share, {} files ({})",
                s.files_owned,
                format_size(s.bytes_owned)
            );
            return;
        }
        let now = (s.files_held, s.copies_pending, s.pfs_bytes);
        if last != Some(now) {
            say!(
                "granary serve: rank {rank}: holds {} of its {} files ({} of {}), {} copies of \
                 other ranks' files to make, {} read from the source",
                s.files_held,
                s.files_owned,
                format_size(s.bytes_held),
                format_size(s.bytes_owned),
                s.copies_pending,
                format_size(s.pfs_bytes)
            );
        }
        last = Some(now);
    }
}

/// Rank 0's catalog of the source (walked, or loaded and checked), saying every
/// `config.progress_every` where the walk is: a batch log shows a long first walk moving.
fn walk_with_progress(agent: &Arc<crate::agent::Agent>, config: &ServeConfig) -> Result<Lease> {
    use std::sync::atomic::Ordering::Relaxed;
    let progress = granary_core::catalog::Progress::default();
    let done = std::sync::atomic::AtomicBool::new(false);
    let started = std::time::Instant::now();
    let source = config.source.display();
    std::thread::scope(|s| {
        if let Some(every) = config.progress_every {
            let (progress, done, source) = (&progress, &done, &source);
            s.spawn(move || {
                let mut next = started + every;
                let mut said = false;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                    if std::time::Instant::now() < next {
                        continue;
                    }
                    next += every;
                    said = true;
                    say!(
                        "granary serve: rank 0: cataloguing {source}: {} files, {} dirs, {} \
                         after {:.0} s",
                        progress.files.load(Relaxed),
                        progress.dirs.load(Relaxed),
                        format_size(progress.bytes.load(Relaxed)),
                        started.elapsed().as_secs_f64()
                    );
                }
                if said {
                    say!(
                        "granary serve: rank 0: catalogued {source}: {} files, {} dirs, {} in \
                         {:.1} s",
                        progress.files.load(Relaxed),
                        progress.dirs.load(Relaxed),
                        format_size(progress.bytes.load(Relaxed)),
                        started.elapsed().as_secs_f64()
                    );
                }
            });
        }
        let lease = attach_serving(agent, &config.source, config.immutable, None, &progress);
        done.store(true, std::sync::atomic::Ordering::Release);
        lease
    })
}

type Prepared = (Started, Option<Lease>, Vec<u8>, Vec<u8>);

/// This rank's agent; on rank 0 also the catalog (walked or loaded, and checked against the
/// source; or a pack's index, the tree checked per directory) and its image for the others,
/// with the pack's partition table.
fn prepare(config: &ServeConfig, rank: u32, ranks: u32) -> Result<Prepared> {
    let rt = match &config.runtime_dir {
        Some(d) => Runtime::at(for_rank(d, rank).into())?,
        None => Runtime::open()?,
    };
    let named: Vec<_> = config
        .tiers
        .iter()
        .map(|t| granary_core::config::TierConfig {
            path: path_for_rank(&t.path, rank),
            ..t.clone()
        })
        .collect();
    let resolved = resolve_job_tiers(&named)?;
    for d in &resolved.dropped {
        say!("granary: {d}; not using this tier");
    }
    let mut tiers = resolved.specs;
    if tiers.is_empty() {
        bail!("no usable tier");
    }
    let staging = match &config.staging {
        Some(s) => {
            let c = granary_core::config::TierConfig {
                path: path_for_rank(&s.path, rank),
                ..s.clone()
            };
            granary_core::config::resolve_tiers(&[c])?
                .pop()
                .context("staging tier")?
                .0
        }
        None => {
            let first = tiers.first().context("no tier")?;
            let c = granary_core::config::TierConfig {
                path: first.path.join("staging"),
                capacity: Some(first.capacity / 4),
                block_size: None,
            };
            granary_core::config::resolve_tiers(&[c])?
                .pop()
                .context("staging tier")?
                .0
        }
    };
    tiers.push(granary_core::tiers::TierSpec {
        staging: true,
        ..staging
    });
    let mut cfg = config.cfg.clone();
    crate::logging::init(
        Some(cfg.log_level.as_deref().unwrap_or("info")),
        cfg.log_file.clone().or(Some(rt.log())),
    );
    // Every file is fetched whole by its owner, never read by the program itself.
    cfg.prefetch_min_size = cfg.prefetch_min_size.or(Some(1));
    let started = daemon::start(
        rt,
        AgentConfig {
            cfg,
            tiers,
            workers: config.workers.or(Some(SERVE_WORKERS)),
            idle_timeout: None,
            serving: Some(Serving::new(
                config.source.clone(),
                config.pack.clone(),
                rank,
                ranks,
            )),
        },
    )?;
    // Status answers from now on; jobs attaching wait for the catalog (`Serving::admit`).
    daemon::spawn_threads(&started)?;
    if rank != 0 {
        return Ok((started, None, Vec::new(), Vec::new()));
    }
    let agent = started.agent.clone();
    let lease = walk_with_progress(&agent, config)?;
    let ctx = lease.source.ctx().context("no table published")?;
    // A loaded catalog is checked against the source in the background: the image every rank
    // adopts carries its verdicts, so wait for them.
    loop {
        let done = ctx
            .validation
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|v| v.finished());
        if done {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let image = granary_core::catalog::image_bytes(&ctx.table);
    let layout = ctx
        .pack
        .get()
        .map(|st| st.partitions().encode())
        .unwrap_or_default();
    Ok((started, Some(lease), image, layout))
}
