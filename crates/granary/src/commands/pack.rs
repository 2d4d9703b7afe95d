//! `granary pack`: make a pack (`granary pack SRC OUT`) and the tools that read one
//! (`granary pack verify|ls|cat|diff`). Both forms share the verb: a first argument naming a
//! tool is the tool; `granary pack create SRC OUT` packs a source that happens to be named
//! like one.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};

use std::path::Path;

use crate::flags::pack::{CatArgs, CreateArgs, DiffArgs, LsArgs, PackArgs, Tool, VerifyArgs};
use granary_core::size::{format_size, parse_size};
use granary_pack::listing::{escape, long_line};
use granary_pack::writer::phase;
use granary_pack::{Compression, Options, Pack, PackError, Progress};
use indicatif::{ProgressBar, ProgressStyle};

pub fn main(a: PackArgs) -> anyhow::Result<i32> {
    match a.tool {
        None | Some(Tool::Create(_)) => {
            let c = match a.tool {
                Some(Tool::Create(c)) => c,
                _ => a.create,
            };
            create(c)
        }
        Some(Tool::Verify(v)) => verify(v),
        Some(Tool::Ls(l)) => ls(l),
        Some(Tool::Cat(c)) => cat(c),
        Some(Tool::Diff(d)) => diff(d),
    }
}

/// Shows `progress` until `done` is set: a bar on a terminal, else (a batch job's log) a line
/// every `output::batch_every()`.
fn show_progress(progress: &Progress, done: &AtomicBool) {
    if crate::output::stderr_is_terminal() {
        progress_bar(progress, done);
        return;
    }
    let mut ticker = crate::output::Ticker::new();
    let started = std::time::Instant::now();
    while !done.load(Ordering::Relaxed) {
        if ticker.due() {
            let files = progress.files_total.load(Ordering::Relaxed);
            let line = match progress.phase.load(Ordering::Relaxed) {
                phase::WALKING => format!(
                    "walking: {} directories, {files} files",
                    progress.dirs.load(Ordering::Relaxed)
                ),
                _ => format!(
                    "packed {} of {} ({} of {files} files)",
                    format_size(progress.bytes_done.load(Ordering::Relaxed)),
                    format_size(progress.bytes_total.load(Ordering::Relaxed)),
                    progress.files_done.load(Ordering::Relaxed)
                ),
            };
            crate::output::say(format!(
                "granary pack: {line} after {:.0} s",
                started.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Draws `progress` on a terminal until `done` is set.
fn progress_bar(progress: &Progress, done: &AtomicBool) {
    let bar = ProgressBar::new_spinner();
    let bytes_style = ProgressStyle::with_template(
        "{spinner} packing [{bar:30}] {bytes}/{total_bytes} {msg} {binary_bytes_per_sec} ETA {eta}",
    )
    .map(|s| s.progress_chars("=> "))
    .ok();
    let mut packing = false;
    while !done.load(Ordering::Relaxed) {
        match progress.phase.load(Ordering::Relaxed) {
            phase::WALKING => bar.set_message(format!(
                "walking: {} directories, {} files",
                progress.dirs.load(Ordering::Relaxed),
                progress.files_total.load(Ordering::Relaxed)
            )),
            _ => {
                if !packing {
                    packing = true;
                    if let Some(s) = bytes_style.clone() {
                        bar.set_style(s);
                    }
                    bar.set_length(progress.bytes_total.load(Ordering::Relaxed));
                }
                bar.set_position(progress.bytes_done.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "{}/{} files",
                    progress.files_done.load(Ordering::Relaxed),
                    progress.files_total.load(Ordering::Relaxed)
                ));
            }
        }
        bar.tick();
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

fn create(c: CreateArgs) -> anyhow::Result<i32> {
    let (Some(src), Some(out)) = (c.src, c.out) else {
        bail!("usage: granary pack SRC OUT (see granary pack --help)");
    };
    let mut opts = Options {
        partitions: c.partitions,
        compression: c
            .compress
            .parse::<Compression>()
            .map_err(anyhow::Error::msg)?,
        files: c.files,
        replicate: c.replicate,
        sync: !c.no_sync,
        force: c.force,
        ..Default::default()
    };
    if let Some(s) = &c.partition_size {
        opts.partition_size =
            Some(parse_size(s).with_context(|| format!("--partition-size {s:?}: not a size"))?);
    }
    if let Some(t) = c.threads {
        opts.threads = t.max(1);
    }
    // Ctrl-C, SIGTERM, SIGHUP: the pack stops, removes its temporary directory, and this
    // process then ends by the signal.
    crate::signals::catch_stop_signals();
    let progress = Progress::default();
    let done = AtomicBool::new(false);
    let summary = std::thread::scope(|s| {
        if !c.quiet {
            s.spawn(|| show_progress(&progress, &done));
        }
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if crate::signals::interrupted() {
                    progress.stop.store(true, Ordering::Relaxed);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = granary_pack::pack(&src, &out, &opts, &progress);
        done.store(true, Ordering::Relaxed);
        r
    });
    let summary = match summary {
        Err(e @ PackError::Interrupted) => {
            eprintln!("granary pack: {e}");
            crate::signals::die_by_stop_signal();
        }
        r => r?,
    };
    for l in &summary.leftovers {
        eprintln!(
            "granary pack: note: {} was left by an interrupted pack; remove it once no other pack to {} is running",
            l.display(),
            summary.out.display()
        );
    }
    if !c.quiet {
        let secs = summary.elapsed.as_secs_f64().max(1e-6);
        eprintln!(
            "granary pack: {} files, {} directories, {} symlinks: {} stored as {} in {} partition{} + {} index, {:.1} s ({}/s) -> {}",
            summary.files,
            summary.dirs,
            summary.symlinks,
            format_size(summary.raw_bytes),
            format_size(summary.stored_bytes),
            summary.partitions,
            if summary.partitions == 1 { "" } else { "s" },
            format_size(summary.index_bytes),
            secs,
            format_size((summary.raw_bytes as f64 / secs) as u64),
            summary.out.display()
        );
    }
    Ok(0)
}

/// Exit statuses of the tools: 1 the pack is damaged (or, for `verify`, differs from the
/// source; for `diff`, the source changed), 2 a usage error (not a pack, a path not in it).
const DAMAGED: i32 = 1;
const USAGE: i32 = 2;

/// Opens `dir` for a tool: a damaged index is the pack's fault (exit 1, with what to run), a
/// path that is no pack the user's (exit 2).
fn open_pack(tool: &str, dir: &Path) -> Result<Pack, i32> {
    Pack::open(dir).map_err(|e| report_error(tool, dir, &e))
}

/// Prints `e` as the tool's error and gives its exit status.
fn report_error(tool: &str, dir: &Path, e: &PackError) -> i32 {
    if e.is_damage() {
        eprintln!(
            "granary pack {tool}: {e}\n  the pack is damaged: `granary pack verify {}` says what is wrong; pack the source again",
            dir.display()
        );
        DAMAGED
    } else if let PackError::NotFound(_) = e {
        eprintln!("granary pack {tool}: {}: {e}", dir.display());
        USAGE
    } else {
        eprintln!("granary pack {tool}: {e}");
        USAGE
    }
}

fn verify(v: VerifyArgs) -> anyhow::Result<i32> {
    let pack = match Pack::open(&v.pack) {
        Ok(p) => p,
        Err(e) if e.is_damage() => {
            println!("{e}");
            if !v.quiet {
                eprintln!(
                    "granary pack verify: {}: the index is damaged: no file can be read from this pack; pack the source again",
                    v.pack.display()
                );
            }
            return Ok(DAMAGED);
        }
        Err(e) => return Ok(report_error("verify", &v.pack, &e)),
    };
    let checked = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let total = pack.index().header().raw_bytes;
    let source = v.source();
    let report = std::thread::scope(|s| {
        if !v.quiet && crate::output::stderr_is_terminal() {
            s.spawn(|| {
                let bar = ProgressBar::new(total);
                if let Ok(st) = ProgressStyle::with_template(
                    "verifying [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                ) {
                    bar.set_style(st.progress_chars("=> "));
                }
                while !done.load(Ordering::Relaxed) {
                    bar.set_position(checked.load(Ordering::Relaxed));
                    std::thread::sleep(Duration::from_millis(100));
                }
                bar.finish_and_clear();
            });
        }
        let r = granary_pack::verify::verify(&pack, source, &checked);
        done.store(true, Ordering::Relaxed);
        r
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("granary pack verify: {e}");
            return Ok(USAGE);
        }
    };
    {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for p in &report.problems {
            writeln!(out, "{p}")?;
        }
        out.flush()?;
    }
    if !v.quiet {
        let plural = |n: u64, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let mut found = Vec::new();
        if report.refused_partitions > 0 {
            found.push(format!(
                "{} unusable",
                plural(report.refused_partitions.into(), "partition")
            ));
        }
        if report.damaged_files > 0 {
            found.push(format!(
                "{} cannot be read from the pack",
                plural(report.damaged_files, "file")
            ));
        }
        if report.differing_files > 0 {
            found.push(format!(
                "{} {} from the source",
                plural(report.differing_files, "file"),
                if report.differing_files == 1 {
                    "differs"
                } else {
                    "differ"
                }
            ));
        }
        let rest = report.problems.len() as u64
            - report.damaged_files
            - report.differing_files
            - u64::from(report.refused_partitions);
        if rest > 0 {
            found.push(plural(rest, "other problem"));
        }
        eprintln!(
            "granary pack verify: {} ({}) in {}{}: {}",
            plural(report.files, "file"),
            format_size(report.bytes),
            plural(report.partitions.into(), "partition"),
            if source.is_some() {
                format!(", {} compared with the source", report.compared)
            } else {
                String::new()
            },
            if found.is_empty() {
                "OK".to_string()
            } else {
                format!("{}; pack the source again", found.join(", "))
            }
        );
    }
    Ok(if report.ok() { 0 } else { DAMAGED })
}

fn ls(l: LsArgs) -> anyhow::Result<i32> {
    let pack = match open_pack("ls", &l.pack) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let ix = pack.index();
    let path = l
        .path
        .as_ref()
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_default();
    let i = match ix.lookup(&path) {
        Ok(i) => i,
        Err(e) => return Ok(report_error("ls", &l.pack, &e)),
    };
    let e = ix.entry(i).context("entry vanished")?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let shown_root = if path.is_empty() {
        b".".to_vec()
    } else {
        path.clone()
    };
    if !e.stat.is_dir() || l.directory {
        writeln!(out, "{}", long_line(ix, &e, &shown_root))?;
    } else if l.recursive {
        // Depth first, names in order, each line with its path.
        let mut stack: Vec<u32> = ix.children(&e).rev().collect();
        while let Some(c) = stack.pop() {
            let Some(ce) = ix.entry(c) else { continue };
            writeln!(out, "{}", long_line(ix, &ce, &ix.path_of(c)))?;
            stack.extend(ix.children(&ce).rev());
        }
    } else {
        for c in ix.children(&e) {
            if let Some(ce) = ix.entry(c) {
                writeln!(out, "{}", long_line(ix, &ce, ix.name(&ce)))?;
            }
        }
    }
    out.flush()?;
    Ok(0)
}

fn cat(c: CatArgs) -> anyhow::Result<i32> {
    let pack = match open_pack("cat", &c.pack) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Like cat(1): every file is tried; the status is the worst.
    let mut status = 0;
    for p in &c.paths {
        let r = pack
            .resolve(p.as_bytes())
            .and_then(|i| pack.copy_to(i, &mut out));
        match r {
            Ok(_) => {}
            // `granary pack cat … | head` is not an error.
            Err(PackError::Io { cause, .. }) if cause.kind() == std::io::ErrorKind::BrokenPipe => {
                return Ok(status)
            }
            Err(e) if e.is_damage() => {
                eprintln!(
                    "granary pack cat: {}: {e}\n  nothing of it was written; `granary pack verify {}` names every damaged file",
                    escape(p.as_bytes()),
                    c.pack.display()
                );
                status = status.max(DAMAGED);
            }
            Err(e) => {
                status = status.max(report_error("cat", &c.pack, &e));
            }
        }
    }
    out.flush()?;
    Ok(status)
}

fn diff(d: DiffArgs) -> anyhow::Result<i32> {
    // The older order, SRC PACK: only a pack has an index, so the two cannot be confused.
    let (pack_dir, src) = match granary_pack::locate::open_index(&d.pack) {
        Err(PackError::NotAPack { .. }) if holds_pack(&d.src) => (&d.src, &d.pack),
        _ => (&d.pack, &d.src),
    };
    let pack = match open_pack("diff", pack_dir) {
        Ok(p) => p,
        // A damaged index cannot say what changed: an error, not a difference.
        Err(_) => return Ok(USAGE),
    };
    let report = match granary_pack::diff::diff(src, pack.index()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("granary pack diff: {e}");
            return Ok(USAGE);
        }
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for ch in &report.changes {
        match ch {
            granary_pack::diff::Change::Added(p) => writeln!(out, "A {}", escape(p))?,
            granary_pack::diff::Change::Removed(p) => writeln!(out, "D {}", escape(p))?,
            granary_pack::diff::Change::Modified(p, what) => {
                writeln!(out, "M {} ({what})", escape(p))?
            }
        }
    }
    out.flush()?;
    eprintln!(
        "granary pack diff: {} changes; {} of {} directories listed (the rest unchanged)",
        report.changes.len(),
        report.listed_dirs,
        report.dirs
    );
    Ok(if report.changes.is_empty() { 0 } else { 1 })
}

/// `dir` holds a pack, damaged or not.
fn holds_pack(dir: &Path) -> bool {
    match granary_pack::locate::open_index(dir) {
        Ok(_) => true,
        Err(e) => e.is_damage(),
    }
}
