//! `granary run`: attach to the agent, run the program with the preload library, report.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_core::config::{default_tier, parse_tier_flag, resolve_tiers, Config, TierConfig};
use granary_core::runtime::Runtime;
use granary_core::size::format_size;
use granary_core::stats::{JobReport, PlacementStats, SourceReport};
use granary_core::tiers::TierSpec;
use granary_shm::{job, layout::MAX_TIERS, Mapping};

use granary_core::config::PolicyKind;
use granary_core::placement::prefetch::OrderSpec;

use crate::agent::protocol::{Reply, Request};
use crate::cli::{RunArgs, TierArgs};
use crate::client::{connect_or_spawn, Conn};

/// `--config FILE`, else `$GRANARY_CONFIG`, else nothing; the placement flags
/// (`--block-size`, `--max-source-streams`) override the file's values.
pub fn load_config(args: &TierArgs) -> Result<Config> {
    let file = args.config.clone().or_else(|| {
        std::env::var_os("GRANARY_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let mut cfg = match file {
        Some(f) => Config::load(&f)?,
        None => Config::default(),
    };
    if let Some(b) = &args.block_size {
        let v = granary_core::size::parse_size(b)
            .filter(|v| (4096..=1 << 30).contains(v))
            .with_context(|| format!("bad --block-size `{b}`: expected a size 4K..1G like 8M"))?;
        cfg.block_size = Some(v);
    }
    if let Some(n) = args.max_source_streams {
        if !(1..=1024).contains(&n) {
            bail!("bad --max-source-streams `{n}`: expected 1..1024");
        }
        cfg.max_source_streams = Some(n);
    }
    if let Some(p) = &args.page_cache {
        let b = granary_core::placement::residency::Budget::parse(p).with_context(|| {
            format!("bad --page-cache `{p}`: expected auto, off or a size like 200G")
        })?;
        cfg.page_cache = Some(b);
    }
    Ok(cfg)
}

/// The job's placement policy: `--access-order` (implies known-order) or the configuration's
/// `[placement] policy`; `None` is fill-highest-first. Errors name the key or flag, in one line.
pub fn order_spec(args: &RunArgs, cfg: &Config) -> Result<Option<OrderSpec>> {
    let window = match &args.prefetch_window {
        Some(w) => Some(
            granary_core::size::parse_size(w)
                .filter(|v| *v > 0)
                .with_context(|| {
                    format!("bad --prefetch-window `{w}`: expected a non-zero size like 2G")
                })?,
        ),
        None => cfg.prefetch_window,
    };
    let file = match (&args.access_order, cfg.policy.unwrap_or_default()) {
        (Some(f), _) => f.clone(),
        (None, PolicyKind::KnownOrder) => cfg.access_order.clone().context(
            "config: `placement.access_order` is required with policy = \"known-order\" \
             (or pass --access-order FILE)",
        )?,
        (None, PolicyKind::FillHighestFirst) => {
            if args.prefetch_window.is_some() {
                bail!("--prefetch-window needs --access-order FILE (the known-order policy)");
            }
            return Ok(None);
        }
    };
    // The agent reads it (it may run in another directory): absolute, and readable now, so a
    // typo is the user's one-line error rather than a job silently run without granary.
    let file = std::path::absolute(&file).unwrap_or(file);
    std::fs::File::open(&file)
        .with_context(|| format!("access order {} (placement.access_order)", file.display()))?;
    Ok(Some(OrderSpec {
        access_order: file,
        prefetch_window: window,
    }))
}

/// Tiers named by flags (which win) or the configuration; empty when neither names any.
pub fn tier_configs(args: &TierArgs, cfg: &Config) -> Result<Vec<TierConfig>> {
    if !args.tiers.is_empty() {
        return args
            .tiers
            .iter()
            .map(|t| parse_tier_flag(t).map_err(anyhow::Error::from))
            .collect();
    }
    Ok(cfg.tiers.clone())
}

/// The tiers for a job: flags, config, or the default (announced on stderr).
pub fn job_tiers(args: &TierArgs, cfg: &Config, quiet: bool) -> Result<Vec<TierSpec>> {
    let mut tcfg = tier_configs(args, cfg)?;
    let defaulted = tcfg.is_empty();
    if defaulted {
        tcfg.push(default_tier().context(
            "no writable directory for a default tier ($GRANARY_CACHE_DIR, $SLURM_TMPDIR, $TMPDIR, /tmp); use --tier",
        )?);
    }
    // An unusable tier (not creatable, not a directory) costs speed, never the job: drop it.
    let mut resolved = Vec::new();
    for t in &tcfg {
        match resolve_tiers(std::slice::from_ref(t)) {
            Ok(mut r) => resolved.append(&mut r),
            Err(e) => eprintln!("granary: {e}; not using this tier"),
        }
    }
    if resolved.is_empty() {
        bail!("no usable tier");
    }
    for (i, (t, cap_default)) in resolved.iter().enumerate() {
        if (defaulted || *cap_default) && !quiet {
            eprintln!(
                "granary: tier {i}: {} ({}{})",
                t.path.display(),
                format_size(t.capacity),
                if *cap_default {
                    ", 90% of free space"
                } else {
                    ""
                }
            );
        }
    }
    Ok(resolved.into_iter().map(|t| t.0).collect())
}

/// `libgranary_preload.so`: `$GRANARY_PRELOAD`, next to this executable, or in `../lib`.
pub fn find_preload() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GRANARY_PRELOAD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("GRANARY_PRELOAD={} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("finding the granary executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut tried = Vec::new();
    // Test binaries live in target/<profile>/deps; the library one level up.
    for cand in [
        dir.join("libgranary_preload.so"),
        dir.join("../lib/libgranary_preload.so"),
        dir.join("../libgranary_preload.so"),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
        tried.push(cand.display().to_string());
    }
    bail!(
        "cannot find libgranary_preload.so (tried {}); build it with `cargo build --release` \
         (the whole workspace) or set GRANARY_PRELOAD",
        tried.join(", ")
    )
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

pub fn run(args: RunArgs) -> Result<i32> {
    let started = Instant::now();
    // Same rule as the preload library: any value but empty or "0" turns granary off.
    let disabled = std::env::var_os("GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != "0");
    let cfg = load_config(&args.tiers)?;
    let source = granary_core::source::normalize(&args.source)?;
    if !source.is_dir() {
        bail!("source {} is not a directory", source.display());
    }
    let (prog, prog_args) = args.program.split_first().context("no program given")?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(prog_args);

    if disabled {
        return run_plain(&args, &mut cmd, prog, &source, started);
    }

    // A malformed --tier is the user's to fix: refuse it before anything runs.
    tier_configs(&args.tiers, &cfg)?;
    let order = order_spec(&args, &cfg)?;
    let job = match attach(&args, &cfg, &source, order) {
        Ok(job) => job,
        Err(e) => {
            // granary may make a job slower, never failed: run it as if granary were absent.
            eprintln!("granary: {e:#}");
            eprintln!("granary: running the program without granary");
            return run_plain(&args, &mut cmd, prog, &source, started);
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
    } = job;
    let mut ld = preload.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    cmd.env("LD_PRELOAD", ld)
        .env("GRANARY_TABLE", &table_path)
        .env("GRANARY_JOB_SLOT", slot.to_string());
    let st = spawn_and_wait(&mut cmd, prog)?;
    let exit_status = exit_code(st);

    let c = |w: usize| {
        table
            .counter(slot, w)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    };
    let (placement, usage) =
        agent_stats(&mut conn, &source).unwrap_or((before.clone(), tier_usage));
    let delta = placement.since(&before);
    let mut tiers_rep = JobReport::tier_reports(&usage);
    for (i, t) in tiers_rep.iter_mut().enumerate().take(MAX_TIERS) {
        t.files_served = c(job::TIER_FILES + i);
        t.bytes_served = c(job::TIER_BYTES + i);
        t.files_placed = delta.tier_files_placed.get(i).copied().unwrap_or(0);
        t.bytes_placed = delta.tier_bytes_placed.get(i).copied().unwrap_or(0);
    }
    let mmap = granary_core::stats::MmapReport {
        tier_bytes: c(job::MAP_LOCAL_BYTES),
        source_bytes: c(job::MAP_SOURCE_BYTES),
        faulted_bytes: c(job::MAP_FAULTED_BYTES),
        read_ahead_bytes: delta.mmap_read_ahead,
        windows: delta.mmap_windows,
        lmdb_local_locks: delta.lmdb_local_locks,
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
        bytes_placed: delta.bytes_placed,
        tiers: tiers_rep,
        placement: delta,
        transient_drops: c(job::TRANSIENT_DROPS),
        mmap,
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
}

/// Everything granary needs before the program starts: tiers, preload library, agent, table.
/// Any failure here is granary's, so the caller runs the program without granary instead.
fn attach(args: &RunArgs, cfg: &Config, source: &Path, order: Option<OrderSpec>) -> Result<Job> {
    let tiers = job_tiers(&args.tiers, cfg, args.quiet)?;
    let preload = find_preload()?;
    let rt = Runtime::open()?;
    let mut agent_args = Vec::new();
    if let Some(c) = &args.tiers.config {
        agent_args.push("--config".to_string());
        agent_args.push(c.display().to_string());
    }
    if let Some(t) = &args.tiers.idle_timeout {
        agent_args.push(format!("--idle-timeout={t}"));
    }
    let mut conn = connect_or_spawn(&rt, &agent_args)?;
    conn.send(&Request::Attach {
        source: source.to_path_buf(),
        pid: std::process::id(),
        tiers: tiers.clone(),
        workers: args.tiers.workers.or(cfg.workers),
        block_size: cfg.block_size,
        max_source_streams: cfg.max_source_streams,
        page_cache: cfg.page_cache,
        order,
        immutable: args.immutable || cfg.immutable.unwrap_or(false),
        mmap: cfg.mmap,
    })?;
    let walk_started = Instant::now();
    let mut shown = false;
    let (table_path, slot, tier_usage, catalog, before) = loop {
        match conn.recv()? {
            Reply::Progress { files, dirs, bytes } => {
                if walk_started.elapsed() > Duration::from_secs(1)
                    && !args.quiet
                    && std::io::IsTerminal::is_terminal(&std::io::stderr())
                {
                    eprint!(
                        "\rgranary: cataloguing {}: {files} files, {dirs} dirs, {}   ",
                        source.display(),
                        format_size(bytes)
                    );
                    shown = true;
                }
            }
            Reply::Attached {
                table,
                job_slot,
                tiers,
                note,
                catalog,
                placement,
                ..
            } => {
                if shown {
                    eprintln!();
                } else if walk_started.elapsed() > Duration::from_secs(1) && !args.quiet {
                    eprintln!(
                        "granary: catalogued {}: {} files, {} dirs, {} in {:.1} s",
                        source.display(),
                        catalog.files,
                        catalog.dirs,
                        format_size(catalog.bytes),
                        catalog.walk_s
                    );
                }
                if let Some(n) = note {
                    eprintln!("granary: {n}");
                }
                break (table, job_slot, tiers, catalog, placement);
            }
            Reply::Error { message } => bail!("agent: {message}"),
            other => bail!("unexpected reply from the agent: {other:?}"),
        }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&table_path)
        .with_context(|| format!("opening table {}", table_path.display()))?;
    let len = f.metadata()?.len() as usize;
    let (mapping, table) = Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len)
        .with_context(|| format!("mapping table {}", table_path.display()))?;
    drop(f);
    Ok(Job {
        conn,
        table_path,
        slot,
        tier_usage,
        catalog,
        before,
        preload,
        _mapping: mapping,
        table,
    })
}

/// Runs the program without interception (GRANARY_DISABLE, or granary could not set up) and
/// reports it as such; the exit status is the program's.
fn run_plain(
    args: &RunArgs,
    cmd: &mut std::process::Command,
    prog: &std::ffi::OsStr,
    source: &Path,
    started: Instant,
) -> Result<i32> {
    let st = spawn_and_wait(cmd, prog)?;
    let report = JobReport {
        version: 1,
        source: source.display().to_string(),
        exit_status: exit_code(st),
        wall_time_s: started.elapsed().as_secs_f64(),
        disabled: true,
        ..Default::default()
    };
    finish(args, &report)?;
    Ok(report.exit_status)
}

fn agent_stats(
    conn: &mut Conn,
    source: &Path,
) -> Result<(PlacementStats, Vec<granary_core::tiers::TierUsage>)> {
    conn.send(&Request::Stats {
        source: source.to_path_buf(),
    })?;
    match conn.recv()? {
        Reply::Stats { placement, tiers } => Ok((placement, tiers)),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn spawn_and_wait(
    cmd: &mut std::process::Command,
    prog: &std::ffi::OsStr,
) -> Result<std::process::ExitStatus> {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As a shell reports it: 127 not found, 126 not executable.
            eprintln!("granary: cannot run {}: {e}", Path::new(prog).display());
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Ok(std::process::ExitStatus::from_raw(code << 8));
        }
    };
    crate::signals::forward_to(child.id());
    Ok(child.wait()?)
}

fn finish(args: &RunArgs, report: &JobReport) -> Result<()> {
    if !args.quiet {
        eprint!("{}", report.render());
    }
    if let Some(p) = &args.stats_json {
        let mut s = serde_json::to_string_pretty(report)?;
        s.push('\n');
        std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
