//! `granary run`: attach to the agent, run the program with the preload library, report.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_agent::client::{connect_or_spawn, replace_unresponsive, silent_pid, Conn};
use granary_agent::protocol::{Reply, Request};
use granary_core::config::Config;
use granary_core::placement::prefetch::OrderSpec;
use granary_core::runtime::Runtime;
use granary_core::size::format_size;
use granary_core::stats::{JobPlaced, JobReport, PlacementStats, SourceReport};
use granary_shm::{job, layout::MAX_TIERS, Mapping};

use crate::flags::run::RunArgs;
use crate::output::{say, say_raw};

fn exit_code(st: std::process::ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

/// Why `--source` cannot be served: it does not exist or is not a directory.
fn unusable_source(source: &Path) -> Option<String> {
    match std::fs::metadata(source) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(format!("source {} is not a directory", source.display())),
        Err(e) => Some(format!("source {}: {e}", source.display())),
    }
}

pub fn main(args: RunArgs) -> Result<i32> {
    let started = Instant::now();
    // Bad flags or configuration are the user's to fix: refused before anything runs (rc 2).
    let cfg = args.tiers.config()?;
    args.tiers.named(&cfg)?;
    let (prog, prog_args) = args.program.split_first().context("no program given")?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(prog_args);
    let source = match (&args.source, args.attach) {
        (None, true) => match served_source() {
            Ok((s, _)) => s,
            Err(e) => {
                let why = format!("{e:#}");
                say(format!(
                    "granary: {why}; running the program without granary"
                ));
                return run_plain(&args, &mut cmd, prog, Path::new(""), started, why);
            }
        },
        _ => args.target()?,
    };

    // Same rule as the preload library: any value but empty or "0" turns granary off.
    if std::env::var_os("GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
        let why = "GRANARY_DISABLE is set".to_string();
        return run_plain(&args, &mut cmd, prog, &source, started, why);
    }
    // granary may make a job slower, never failed: whatever keeps granary from serving the
    // job (here or below), the program runs as if granary were absent, and the report says why.
    // With `--mount` only the pack exists: the path names nothing on purpose (so with a serving
    // agent that serves it so).
    let mounted = || {
        args.mount.is_some()
            || args.attach && served_source().is_ok_and(|(s, mount)| mount && s == source)
    };
    if let Some(why) = unusable_source(&source).filter(|_| !mounted()) {
        say(format!(
            "granary: {why}; running the program without granary"
        ));
        return run_plain(&args, &mut cmd, prog, &source, started, why);
    }
    // Checked before any tier directory is made: a cache created inside the dataset would show
    // in its listings even though the agent then refuses the tier.
    if let Some(why) = args.tier_inside(&cfg, &source) {
        say(format!(
            "granary: {why}; running the program without granary"
        ));
        return run_plain(&args, &mut cmd, prog, &source, started, why);
    }
    let order = args.order_spec(&cfg)?;
    let job = match attach(&args, &cfg, &source, order) {
        Ok(job) => job,
        Err(e) if args.mount.is_some() => bail!("{e:#}"),
        Err(e) => {
            let why = format!("{e:#}");
            // Only the serving agent's pack holds the dataset (the path names nothing): run
            // without granary, the program would find no data there and "succeed" on none.
            if unusable_source(&source).is_some() {
                bail!(
                    "{why}; {} exists only in the pack the serving agent served, so the \
                     program was not run",
                    source.display()
                );
            }
            say(format!("granary: {why}"));
            say("granary: running the program without granary");
            return run_plain(&args, &mut cmd, prog, &source, started, why);
        }
    };
    let Job {
        mut conn,
        table_path,
        slot,
        tier_usage,
        catalog,
        before,
        preload,
        _mapping,
        table,
        runtime,
        mut warnings,
    } = job;
    let mut ld = preload.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    // The table also as an inherited fd: it reaches into containers with their own /dev/shm.
    let handover = crate::jobenv::Handover::open(&table_path)
        .map_err(|e| {
            say(format!(
                "granary: {e:#}; the program gets the table by its path only"
            ))
        })
        .ok();
    crate::jobenv::job_env(&mut cmd, handover.as_ref(), prog, &ld, &table_path, slot);
    let st = spawn_and_wait(&mut cmd, prog)?;
    drop(handover);
    let exit_status = exit_code(st);

    let c = |w: usize| {
        table
            .counter(slot, w)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    };
    let (delta, usage, mine, cluster) =
        match agent_stats(&mut conn, &source, slot, args.pack.as_deref()) {
            Ok(AgentStats {
                placement,
                tiers,
                warnings: now,
                job,
                cluster,
            }) => {
                for w in now {
                    if !warnings.contains(&w) {
                        say(format!("granary: {w}"));
                        warnings.push(w);
                    }
                }
                (placement.since(&before), tiers, job, cluster)
            }
            Err(e) => {
                // The program is done; the agent's figures are not worth a hung job.
                let w = format!("{e:#}; the report lacks the agent's figures");
                say(format!("granary: {w}"));
                warnings.push(w);
                (
                    PlacementStats::default(),
                    tier_usage,
                    JobPlaced::default(),
                    None,
                )
            }
        };
    let mut tiers_rep = JobReport::tier_reports(&usage);
    for (i, t) in tiers_rep.iter_mut().enumerate().take(MAX_TIERS) {
        t.files_served = c(job::TIER_FILES + i);
        t.bytes_served = c(job::TIER_BYTES + i);
        t.files_placed = mine.files.get(i).copied().unwrap_or(0);
        t.bytes_placed = mine.bytes.get(i).copied().unwrap_or(0);
    }
    let mmap = granary_core::stats::MmapReport {
        tier_bytes: c(job::MAP_LOCAL_BYTES),
        source_bytes: c(job::MAP_SOURCE_BYTES),
        faulted_bytes: c(job::MAP_FAULTED_BYTES),
        read_ahead_bytes: delta.mmap_read_ahead,
        windows: delta.mmap_windows,
        lmdb_local_locks: delta.lmdb_local_locks,
    };
    for w in crate::report::warnings::of(&crate::report::warnings::Job {
        table: &table,
        slot,
        program: prog,
        args: prog_args,
        source: &source,
        tiers: &tiers_rep,
        runtime: &runtime,
        preload: &preload,
    }) {
        if args.quiet {
            say(format!("granary: warning: {w}"));
        }
        warnings.push(w);
    }
    // The copies are this job's; the rest of `placement` is the agent's work on the source.
    let placement = PlacementStats {
        files_placed: mine.files.iter().sum(),
        bytes_placed: mine.bytes.iter().sum(),
        tier_files_placed: mine.files.clone(),
        tier_bytes_placed: mine.bytes.clone(),
        ..delta
    };
    let report = JobReport {
        version: 1,
        source: source.display().to_string(),
        exit_status,
        wall_time_s: started.elapsed().as_secs_f64(),
        disabled: false,
        job_slot: slot,
        catalog,
        opens: c(job::OPENS),
        catalog_metadata_calls: c(job::CATALOG_META),
        fallbacks: c(job::FALLBACKS),
        source_io: SourceReport {
            opens: c(job::SOURCE_OPENS),
            reads: c(job::SOURCE_READS),
            bytes: c(job::SOURCE_BYTES),
            metadata_calls: c(job::SOURCE_META),
        },
        files_served_from_tiers: tiers_rep.iter().map(|t| t.files_served).sum(),
        bytes_served_from_tiers: tiers_rep.iter().map(|t| t.bytes_served).sum(),
        bytes_placed: placement.bytes_placed,
        tiers: tiers_rep,
        placement,
        transient_drops: c(job::TRANSIENT_DROPS),
        fallback: None,
        warnings,
        mmap,
        cluster,
    };
    drop(conn);
    finish(&args, &report)?;
    Ok(exit_status)
}

/// A job attached to the agent: its table mapped, its counter slot, the agent's counters at start.
struct Job {
    conn: Conn,
    table_path: PathBuf,
    slot: u32,
    tier_usage: Vec<granary_core::tiers::TierUsage>,
    catalog: granary_core::stats::CatalogStats,
    before: PlacementStats,
    preload: PathBuf,
    _mapping: Mapping,
    table: granary_shm::Table,
    /// The agent's runtime directory (the table's).
    runtime: PathBuf,
    /// What the agent warned about at attach.
    warnings: Vec<String>,
}

/// What the agent answered to `attach`.
struct Attached {
    table: PathBuf,
    slot: u32,
    tiers: Vec<granary_core::tiers::TierUsage>,
    catalog: granary_core::stats::CatalogStats,
    placement: PlacementStats,
    warnings: Vec<String>,
}

/// Everything granary needs before the program starts: tiers, preload library, agent, table.
/// Any failure here is granary's, so the caller runs the program without granary instead.
fn attach(args: &RunArgs, cfg: &Config, source: &Path, order: Option<OrderSpec>) -> Result<Job> {
    // Attaching to a running agent: its tiers, unless the job names some.
    let tiers = if args.attach && args.tiers.named(cfg)?.is_empty() {
        Vec::new()
    } else {
        args.tiers.job_tiers(cfg, args.quiet)?
    };
    let preload = crate::preload::find()?;
    let rt = Runtime::open()?;
    let mut agent_args = Vec::new();
    if let Some(c) = &args.tiers.config {
        agent_args.push("--config".to_string());
        agent_args.push(c.display().to_string());
    }
    if let Some(t) = &args.tiers.idle_timeout {
        agent_args.push(format!("--idle-timeout={t}"));
    }
    let request = Request::Attach {
        source: source.to_path_buf(),
        pid: std::process::id(),
        tiers: tiers.clone(),
        workers: args.tiers.workers.or(cfg.workers),
        block_size: cfg.block_size,
        max_source_streams: cfg.max_source_streams,
        page_cache: cfg.page_cache,
        order,
        immutable: args.immutable || cfg.immutable.unwrap_or(false),
        pack: args.pack_dir()?,
        mount: args.mount.is_some(),
        mmap: cfg.mmap,
    };
    let try_once = || -> Result<(Conn, Attached)> {
        let mut conn = if args.attach {
            granary_agent::client::connect(&rt)?
                .context("no granary agent runs on this node (--attach starts none)")?
        } else {
            connect_or_spawn(&rt, &agent_args)?
        };
        let a = attach_on(&mut conn, &request, args.quiet, source)?;
        Ok((conn, a))
    };
    // An agent that does not answer is replaced once; a second silence is the job's fallback.
    let (conn, a) = match try_once() {
        Err(e) if silent_pid(&e).is_some() => {
            say(format!("granary: {e}"));
            replace_unresponsive(&rt, silent_pid(&e).flatten())?;
            try_once()?
        }
        r => r?,
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&a.table)
        .with_context(|| format!("opening table {}", a.table.display()))?;
    let len = f.metadata()?.len() as usize;
    let (mapping, table) = Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len)
        .with_context(|| format!("mapping table {}", a.table.display()))?;
    drop(f);
    Ok(Job {
        conn,
        table_path: a.table,
        slot: a.slot,
        tier_usage: a.tiers,
        catalog: a.catalog,
        before: a.placement,
        preload,
        _mapping: mapping,
        table,
        runtime: rt.dir.clone(),
        warnings: a.warnings,
    })
}

/// The walk's progress line on a terminal: files, directories and bytes so far, rate, time.
fn walk_bar(source: &Path) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::new_spinner();
    b.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    let style = indicatif::ProgressStyle::with_template(
        "granary: cataloguing {prefix}: {spinner} {pos} files ({per_sec}), {msg} [{elapsed}]",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
    b.set_style(style);
    b.set_prefix(source.display().to_string());
    b
}

/// Sends the attach request and waits for the table, showing the walk's progress on a
/// terminal; the agent's notes are printed unless `quiet`, its warnings always.
fn attach_on(conn: &mut Conn, request: &Request, quiet: bool, source: &Path) -> Result<Attached> {
    conn.send(request)?;
    let walk_started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    loop {
        match conn.recv()? {
            Reply::Progress { files, dirs, bytes } => {
                if bar.is_none()
                    && walk_started.elapsed() > Duration::from_secs(1)
                    && files + dirs > 0
                    && !quiet
                    && std::io::IsTerminal::is_terminal(&std::io::stderr())
                {
                    bar = Some(walk_bar(source));
                }
                if let Some(b) = &bar {
                    b.set_position(files);
                    b.set_message(format!("{dirs} dirs, {}", format_size(bytes)));
                }
            }
            Reply::Attached {
                table,
                job_slot,
                tiers,
                notes,
                warnings,
                catalog,
                placement,
                ..
            } => {
                let shown = bar.take().map(|b| b.finish_and_clear()).is_some();
                if shown || (walk_started.elapsed() > Duration::from_secs(1) && !quiet) {
                    say(format!(
                        "granary: catalogued {}: {} files, {} dirs, {} in {:.1} s",
                        source.display(),
                        catalog.files,
                        catalog.dirs,
                        format_size(catalog.bytes),
                        catalog.walk_s
                    ));
                }
                if !quiet {
                    for n in notes {
                        say(format!("granary: {n}"));
                    }
                }
                for w in &warnings {
                    say(format!("granary: {w}"));
                }
                return Ok(Attached {
                    table,
                    slot: job_slot,
                    tiers,
                    catalog,
                    placement,
                    warnings,
                });
            }
            Reply::Error { message } => bail!("agent: {message}"),
            other => bail!("unexpected reply from the agent: {other:?}"),
        }
    }
}

/// Runs the program without interception and reports it as such, with the reason; the exit
/// status is the program's.
fn run_plain(
    args: &RunArgs,
    cmd: &mut std::process::Command,
    prog: &std::ffi::OsStr,
    source: &Path,
    started: Instant,
    why: String,
) -> Result<i32> {
    let st = spawn_and_wait(cmd, prog)?;
    let report = JobReport {
        version: 1,
        source: source.display().to_string(),
        exit_status: exit_code(st),
        wall_time_s: started.elapsed().as_secs_f64(),
        disabled: true,
        fallback: Some(why),
        ..Default::default()
    };
    finish(args, &report)?;
    Ok(report.exit_status)
}

/// The agent's answer to `stats` at the end of a job.
struct AgentStats {
    placement: PlacementStats,
    tiers: Vec<granary_core::tiers::TierUsage>,
    warnings: Vec<String>,
    job: JobPlaced,
    cluster: Option<granary_core::stats::ClusterReport>,
}

/// `--attach`: the source the running agent serves, and whether it exists only in a pack
/// (`granary serve --mount`).
fn served_source() -> Result<(PathBuf, bool)> {
    let rt = Runtime::open()?;
    let mut c = granary_agent::client::connect(&rt)?
        .context("no granary agent runs on this node (--attach starts none)")?;
    match c.ask(&Request::Status)? {
        Reply::Status(s) => match (s.cluster, s.sources.as_slice()) {
            (Some(c), _) => Ok((c.source, c.mount)),
            (None, [one]) => Ok((one.source.clone(), false)),
            _ => bail!("the agent serves several sources (or none): name one with --source"),
        },
        other => bail!("unexpected reply {other:?}"),
    }
}

fn agent_stats(
    conn: &mut Conn,
    source: &Path,
    slot: u32,
    pack: Option<&Path>,
) -> Result<AgentStats> {
    let req = Request::Stats {
        source: source.to_path_buf(),
        slot,
        pack: pack.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())),
    };
    match conn.ask(&req)? {
        Reply::Stats {
            placement,
            tiers,
            warnings,
            job,
            cluster,
        } => Ok(AgentStats {
            placement,
            tiers,
            warnings,
            job,
            cluster,
        }),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn spawn_and_wait(
    cmd: &mut std::process::Command,
    prog: &std::ffi::OsStr,
) -> Result<std::process::ExitStatus> {
    crate::signals::install();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As a shell reports it: 127 not found, 126 not executable.
            say(format!(
                "granary: cannot run {}: {e}",
                Path::new(prog).display()
            ));
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Ok(std::process::ExitStatus::from_raw(code << 8));
        }
    };
    crate::signals::started(child.id());
    crate::signals::wait_exit(child.id());
    Ok(child.wait()?)
}

/// The report on stderr (unless `-q`; a closed stderr is ignored) and in `--stats-json`.
fn finish(args: &RunArgs, report: &JobReport) -> Result<()> {
    if !args.quiet {
        say_raw(&report.render());
    }
    if let Some(p) = &args.stats_json {
        let mut s = serde_json::to_string_pretty(report)?;
        s.push('\n');
        if let Err(e) = std::fs::write(p, s) {
            // The program has run: its status matters more than the report's file.
            say(format!("granary: writing {}: {e}", p.display()));
        }
    }
    Ok(())
}
