//! `granary serve`: one rank of the serving job (module comment of `cluster`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use granary_core::runtime::Runtime;
use granary_core::size::format_size;

use super::args::{for_rank, replicate_set, ServeArgs};
use super::transport::{Comm, Inbox};
use super::{mpi, Node, Setup};

use crate::agent::{self, Broadcast, Options, Serving};

/// Placement workers of a serving rank when not configured: its pool reads the files it owns
/// for every rank (the source-stream cap still bounds the reads in flight).
const SERVE_WORKERS: usize = 8;

pub fn main(args: ServeArgs) -> Result<i32> {
    // Checked before MPI starts: every rank refuses a bad flag alike, none waits for another.
    let replicate = replicate_set(&args.replicate)?;
    let timeout = granary_core::size::parse_duration(&args.peer_timeout)
        .filter(|d| *d >= Duration::from_millis(50))
        .with_context(|| {
            format!(
                "bad --peer-timeout `{}`: a duration like 1s",
                args.peer_timeout
            )
        })?;
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let (source, pack) = args.served()?;

    let mpi = mpi::init()?;
    let (rank, ranks) = (mpi.rank, mpi.ranks);
    // The launcher binds each rank as it would a compute process (OpenMPI: one core when it
    // starts two ranks or fewer, else a socket): every thread of this node's agent would share
    // it, and a program woken on that core waits for them. This agent is the node's service.
    if !args.keep_binding {
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
    let prepared = prepare(&args, rank, ranks, &source, pack);
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
            crate::agent::server::attach_serving(&agent, &source, args.immutable, Some(&b))
                .context("adopting rank 0's catalog")?
        }
    };
    let ctx = lease.source.ctx().context("no table published")?;
    let (comm, cmds) = Comm::new();
    let node = Node::start(
        agent.clone(),
        ctx.clone(),
        Setup {
            rank,
            ranks,
            replicas: args.replicas.min(ranks),
            replicate: args.replicate.clone(),
            replicate_set: replicate,
            timeout,
        },
        comm.clone(),
    )?;
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    {
        let inbox: Arc<dyn Inbox> = node.clone();
        let (bufs, budget) = (comm.bufs.clone(), comm.budget.clone());
        std::thread::Builder::new()
            .name("mpi".into())
            .spawn(move || {
                mpi.serve(inbox, cmds, bufs, budget);
                let _ = done_tx.send(());
            })?;
    }
    let _ = serving.node.set(node.clone());
    let st = super::status(serving);
    let line =
        format!(
        "granary serve: rank {rank} of {ranks} ready: {} files ({}) in the catalog, {} of them \
         ({}) held here; runtime {}",
        lease.source.inner.lock().map(|i| i.catalog.files).unwrap_or(0),
        format_size(lease.source.inner.lock().map(|i| i.catalog.bytes).unwrap_or(0)),
        st.files_owned,
        format_size(st.bytes_owned),
        agent.rt.dir.display()
    );
    tracing::info!("{line}");
    eprintln!("{line}");
    agent::main_loop(&agent);
    agent.shutdown();
    comm.stop();
    if done_rx.recv_timeout(Duration::from_secs(15)).is_err() {
        tracing::warn!("MPI did not finish in time (another rank is stopped or gone)");
    }
    drop(lease);
    Ok(0)
}

type Prepared = (
    agent::Started,
    Option<crate::agent::server::Lease>,
    Vec<u8>,
    Vec<u8>,
);

/// This rank's agent; on rank 0 also the catalog (walked or loaded, and checked against the
/// source; or a pack's index, the tree checked per directory) and its image for the others,
/// with the pack's partition table.
fn prepare(
    args: &ServeArgs,
    rank: u32,
    ranks: u32,
    source: &std::path::Path,
    pack: Option<(std::path::PathBuf, bool)>,
) -> Result<Prepared> {
    let rt = match std::env::var("GRANARY_RUNTIME_DIR") {
        Ok(d) if !d.is_empty() => Runtime::at(for_rank(&d, rank).into())?,
        _ => Runtime::open()?,
    };
    let mut tier_args = args.tiers.clone();
    tier_args.tiers = tier_args.tiers.iter().map(|t| for_rank(t, rank)).collect();
    tier_args.workers = tier_args.workers.or(Some(SERVE_WORKERS));
    let cfg = crate::run::load_config(&tier_args)?;
    let mut tiers = crate::run::job_tiers(&tier_args, &cfg, true)?;
    let staging = match &args.staging {
        Some(s) => {
            let c = granary_core::config::parse_tier_flag(&for_rank(s, rank))?;
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
    let log = rt.log();
    let started = agent::start(
        rt,
        &tier_args,
        Options {
            serving: Some(Serving::new(source.to_path_buf(), pack, rank, ranks)),
            tiers: Some(tiers),
            no_idle_exit: true,
            log_file: Some(log),
            // Every file is fetched whole by its owner, never read by the program itself.
            prefetch_min_size: Some(1),
        },
    )?;
    // Status answers from now on; jobs attaching wait for the catalog (`cluster::admit`).
    agent::spawn_threads(&started)?;
    if rank != 0 {
        return Ok((started, None, Vec::new(), Vec::new()));
    }
    let agent = started.agent.clone();
    let lease = crate::agent::server::attach_serving(&agent, source, args.immutable, None)?;
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
        .map(|st| st.layout().encode())
        .unwrap_or_default();
    Ok((started, Some(lease), image, layout))
}
