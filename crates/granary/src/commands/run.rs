//! `granary run`: attach to the agent, run the program with the preload library, report.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_agent::client::{connect_or_spawn, replace_unresponsive, silent_pid, Conn};
use granary_agent::job::{Ended, Job, Refused};
use granary_agent::protocol::{Reply, Request};
use granary_core::config::Config;
use granary_core::placement::known_order::OrderSpec;
use granary_core::runtime::Runtime;
use granary_core::size::format_size;
use granary_core::stats::{JobReport, PackDamage};

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

/// `granary run --strict` (or `GRANARY_STRICT=1`) refusing a job granary cannot serve: the
/// program was not started (EX_UNAVAILABLE of sysexits.h: a service the job needs is not there).
pub const STRICT_EXIT: i32 = 69;

/// Why granary cannot serve a job, and what the user can do about it.
struct Unserved {
    why: String,
    fix: String,
    /// The cause is the pack's damaged index.
    pack_damage: Option<PackDamage>,
}

impl Unserved {
    fn new(why: impl Into<String>, fix: impl Into<String>) -> Unserved {
        Unserved {
            why: why.into(),
            fix: fix.into(),
            pack_damage: None,
        }
    }
}

pub fn main(args: RunArgs) -> Result<i32> {
    let started = Instant::now();
    // Bad flags, configuration or output paths are the user's to fix: refused before anything
    // runs (rc 2).
    let cfg = args.tiers.config()?;
    args.tiers.named(&cfg)?;
    args.tiers.idle_timeout()?;
    if let Some(p) = &args.stats_json {
        crate::preflight::check_output("--stats-json", p)?;
    }
    let strict = args.strict || crate::preflight::strict_env();
    let (prog, prog_args) = args.program.split_first().context("no program given")?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(prog_args);
    let decline = |cmd: &mut std::process::Command, source: &Path, u: Unserved| {
        decline(&args, strict, cmd, prog, source, started, u)
    };
    let attach_wait = args.attach_wait()?;
    let source = match (&args.source, attach_wait) {
        (None, Some(wait)) => match served_source(wait) {
            Ok((s, _)) => s,
            Err(e) => {
                let u = Unserved::new(
                    format!("{e:#}"),
                    "start `granary serve` on this node first, or run without --attach",
                );
                return decline(&mut cmd, Path::new(""), u);
            }
        },
        _ => args.target()?,
    };

    // Same rule as the preload library: any value but empty or "0" turns granary off.
    if std::env::var_os("GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
        let u = Unserved::new("GRANARY_DISABLE is set", "unset GRANARY_DISABLE");
        return decline(&mut cmd, &source, u);
    }
    // granary may make a job slower, never failed: whatever keeps granary from serving the
    // job (here or below), the program runs as if granary were absent, and the report says why
    // (with --strict, it does not run).
    // With `--mount` only the pack exists: the path names nothing on purpose (so with a serving
    // agent that serves it so).
    let mounted = || {
        args.mount.is_some()
            || attach_wait
                .is_some_and(|w| served_source(w).is_ok_and(|(s, mount)| mount && s == source))
    };
    if let Some(why) = unusable_source(&source).filter(|_| !mounted()) {
        let u = Unserved::new(
            why,
            "give --source the dataset's directory, as the program reads it",
        );
        return decline(&mut cmd, &source, u);
    }
    // Checked before any tier directory is made: a cache created inside the dataset would show
    // in its listings even though the agent then refuses the tier.
    if let Some(why) = args.tier_inside(&cfg, &source) {
        let u = Unserved::new(why, "choose a tier outside the dataset (--tier DIR)");
        return decline(&mut cmd, &source, u);
    }
    let order = args.order_spec(&cfg)?;
    let (job, preload) = match attach(&args, &cfg, &source, order, attach_wait, strict) {
        Ok(attached) => attached,
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
            let pack_damage = e
                .chain()
                .find_map(|c| c.downcast_ref::<Refused>())
                .and_then(|r| r.pack_damage.clone());
            let fix = match (&pack_damage, Runtime::open()) {
                // The reason names the pack and `granary pack verify` already.
                (Some(_), _) => "pack the source again".to_string(),
                (None, Ok(rt)) => format!(
                    "see the agent's log {} (GRANARY_LOG=debug for more)",
                    rt.log().display()
                ),
                (None, Err(_)) => "run with GRANARY_LOG=debug for more".to_string(),
            };
            let u = Unserved {
                pack_damage,
                ..Unserved::new(why, fix)
            };
            return decline(&mut cmd, &source, u);
        }
    };
    let mut ld = preload.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    // The table also as an inherited fd: it reaches into containers with their own /dev/shm.
    let handover = crate::jobenv::Handover::open(&job.table_path)
        .map_err(|e| {
            say(format!(
                "granary: {e:#}; the program gets the table by its path only"
            ))
        })
        .ok();
    crate::jobenv::job_env(
        &mut cmd,
        handover.as_ref(),
        prog,
        &ld,
        &job.table_path,
        job.slot,
        &source,
    );
    let st = spawn_and_wait(&mut cmd, prog)?;
    drop(handover);
    let reported = job.report(&Ended {
        source: &source,
        pack: args.pack.as_deref(),
        mount: args.mount.is_some(),
        program: prog,
        args: prog_args,
        preload: &preload,
        exit_status: exit_code(st),
        wall_time_s: started.elapsed().as_secs_f64(),
    });
    for w in &reported.agent_warnings {
        say(format!("granary: {w}"));
    }
    if args.quiet {
        for w in &reported.program_warnings {
            say(format!("granary: warning: {w}"));
        }
    }
    finish(&args, &reported.report)?;
    Ok(reported.report.exit_status)
}

/// Everything granary needs before the program starts: tiers, preload library, agent, table.
/// Any failure here is granary's, so the caller runs the program without granary instead.
/// With `strict`, a tier dropped or refused (the job would be served by fewer tiers than it
/// named) is a failure too.
fn attach(
    args: &RunArgs,
    cfg: &Config,
    source: &Path,
    order: Option<OrderSpec>,
    attach_wait: Option<Duration>,
    strict: bool,
) -> Result<(Job, PathBuf)> {
    // Attaching to a running agent: its tiers, unless the job names some.
    let (tiers, announce): (Vec<_>, Vec<_>) = if args.attach && args.tiers.named(cfg)?.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        args.tiers.job_tiers(cfg, strict)?.into_iter().unzip()
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
    // The flag wins over the file in the agent this job starts, as it does in the job.
    if let Some(w) = args.tiers.workers {
        agent_args.push(format!("--workers={w}"));
    }
    let request = Request::Attach {
        source: source.to_path_buf(),
        pid: std::process::id(),
        tiers: tiers.clone(),
        workers: args.tiers.workers.map(usize::from).or(cfg.workers),
        block_size: cfg.block_size,
        max_source_streams: cfg.max_source_streams,
        page_cache: cfg.page_cache,
        order,
        immutable: args.immutable || cfg.immutable.unwrap_or(false),
        pack: args.pack_dir()?,
        mount: args.mount.is_some(),
        mmap: cfg.mmap,
        settings: {
            // The flags over the file, as the agent this job would start gets them.
            let mut c = cfg.clone();
            c.workers = args.tiers.workers.map(usize::from).or(cfg.workers);
            c.idle_timeout = args.tiers.idle_timeout()?.or(cfg.idle_timeout);
            granary_core::config::agent_wide::set_in(&c)
        },
    };
    let try_once = || -> Result<Job> {
        let conn = match attach_wait {
            Some(wait) => connect_attached(&rt, wait)?,
            None => connect_or_spawn(&rt, &agent_args)?,
        };
        attach_on(conn, &request, args.quiet, source, rt.dir.clone())
    };
    // An agent that does not answer is replaced once; a second silence is the job's fallback.
    // Never one a job attaches to: it did not start it (a serving rank, maybe busy).
    let job = match try_once() {
        Err(e) if silent_pid(&e).is_some() && attach_wait.is_none() => {
            say(format!("granary: {e}"));
            replace_unresponsive(&rt, silent_pid(&e).flatten())?;
            try_once()?
        }
        r => r?,
    };
    if strict {
        if let Some(w) = job.warnings.first() {
            bail!("{w}");
        }
    }
    // The tiers the user did not size, as the agent uses them (their capacity is a share of
    // the free space, which the agent measured).
    if !args.quiet {
        for (i, t) in job.tiers.iter().enumerate() {
            if announce.get(i).copied().unwrap_or(false)
                && tiers.get(i).is_some_and(|s| s.path == t.path)
            {
                say(format!(
                    "granary: tier {i}: {} ({}, 90% of free space)",
                    t.path.display(),
                    format_size(t.capacity)
                ));
            }
        }
    }
    Ok((job, preload))
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

/// Attaches on `conn`, showing the walk's progress (a bar on a terminal, a line every few
/// seconds in a log); the agent's notes are printed unless `quiet`, its warnings always.
fn attach_on(
    conn: Conn,
    request: &Request,
    quiet: bool,
    source: &Path,
    runtime: PathBuf,
) -> Result<Job> {
    let walk_started = Instant::now();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let terminal = crate::output::stderr_is_terminal();
    let mut ticker = crate::output::Ticker::new();
    let mut ticked = false;
    let job = granary_agent::job::attach(conn, request, runtime, &mut |w| {
        // Ctrl-C while the signals are held for the program (`connect_attached` waited): the
        // program runs, without granary, and gets it.
        if crate::signals::interrupted() {
            bail!("interrupted");
        }
        let (files, dirs, bytes) = (w.files, w.dirs, w.bytes);
        if bar.is_none()
            && walk_started.elapsed() > Duration::from_secs(1)
            && files + dirs > 0
            && !quiet
            && terminal
        {
            bar = Some(walk_bar(source));
        }
        if let Some(b) = &bar {
            b.set_position(files);
            b.set_message(format!("{dirs} dirs, {}", format_size(bytes)));
        } else if !terminal && !quiet && files + dirs > 0 && ticker.due() {
            // A batch job's log: where the walk is, every few seconds.
            ticked = true;
            say(format!(
                "granary: cataloguing {}: {files} files, {dirs} dirs, {} after {:.0} s",
                source.display(),
                format_size(bytes),
                walk_started.elapsed().as_secs_f64()
            ));
        }
        Ok(())
    });
    let shown = bar.take().map(|b| b.finish_and_clear()).is_some();
    let job = job?;
    let c = &job.catalog;
    if shown || ticked || (walk_started.elapsed() > Duration::from_secs(1) && !quiet) {
        say(format!(
            "granary: catalogued {}: {} files, {} dirs, {} in {:.1} s",
            source.display(),
            c.files,
            c.dirs,
            format_size(c.bytes),
            c.walk_s
        ));
    }
    if !quiet {
        for n in &job.notes {
            say(format!("granary: {n}"));
        }
    }
    for w in &job.warnings {
        say(format!("granary: {w}"));
    }
    Ok(job)
}

/// A job granary cannot serve: with `strict`, refused before the program starts (the cause and
/// its fix, exit `STRICT_EXIT`); else the program runs without interception and the report's
/// first line says so, why, and how to fix it. The exit status is then the program's.
fn decline(
    args: &RunArgs,
    strict: bool,
    cmd: &mut std::process::Command,
    prog: &std::ffi::OsStr,
    source: &Path,
    started: Instant,
    u: Unserved,
) -> Result<i32> {
    if strict {
        say(format!(
            "granary: cannot serve this job: {}; fix: {}. The program was not run (--strict).",
            u.why, u.fix
        ));
        return Ok(STRICT_EXIT);
    }
    say(format!(
        "granary: {}; running the program without granary (fix: {})",
        u.why, u.fix
    ));
    let st = spawn_and_wait(cmd, prog)?;
    let report = JobReport {
        version: 1,
        source: source.display().to_string(),
        exit_status: exit_code(st),
        wall_time_s: started.elapsed().as_secs_f64(),
        disabled: true,
        fallback: Some(u.why),
        fix: Some(u.fix),
        pack_damage: u.pack_damage,
        ..Default::default()
    };
    finish(args, &report)?;
    Ok(report.exit_status)
}

/// `granary run --attach`: this node's agent (`granary serve`'s rank here), waited for up to
/// `wait` while it is not up yet — its socket not made yet, or made but not answering yet (an
/// attach never replaces an agent: it did not start it). The steps of a Slurm job start
/// together, and a program started before its node's rank has made its socket would otherwise
/// run without granary. Says once that it waits. Signals that arrive while it waits are held
/// for the program (Slurm's `--signal`, `scancel`), as while the program starts; a SIGINT,
/// SIGTERM or SIGHUP also ends the wait. Err: none by then.
fn connect_attached(rt: &Runtime, wait: Duration) -> Result<Conn> {
    let deadline = Instant::now() + wait;
    let mut said = false;
    loop {
        let why = match granary_agent::client::connect(rt) {
            Ok(Some(c)) => return Ok(c),
            Ok(None) => "no granary agent runs on this node (--attach starts none)".to_string(),
            Err(e) if silent_pid(&e).is_some() => format!("this node's granary agent: {e}"),
            Err(e) => return Err(e),
        };
        if crate::signals::interrupted() {
            bail!("{why}; interrupted while waiting for it");
        }
        if Instant::now() >= deadline {
            if said {
                bail!("{why}; waited {} (--attach-wait)", seconds(wait));
            }
            bail!("{why}");
        }
        if !said {
            crate::signals::install();
            say(format!(
                "granary: waiting for this node's granary agent (granary serve) to start: at \
                 most {} (--attach-wait, GRANARY_ATTACH_WAIT)",
                seconds(wait)
            ));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn seconds(d: Duration) -> String {
    format!("{} s", (d.as_secs_f64() * 10.0).round() / 10.0)
}

/// `--attach`: the source the running agent serves, and whether it exists only in a pack
/// (`granary serve --mount`); the agent waited for up to `wait` (`connect_attached`).
fn served_source(wait: Duration) -> Result<(PathBuf, bool)> {
    let rt = Runtime::open()?;
    let mut c = connect_attached(&rt, wait)?;
    match c.ask(&Request::Status)? {
        Reply::Status(s) => match (s.cluster, s.sources.as_slice()) {
            (Some(c), _) => Ok((c.source, c.mount)),
            (None, [one]) => Ok((one.source.clone(), false)),
            _ => bail!("the agent serves several sources (or none): name one with --source"),
        },
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
