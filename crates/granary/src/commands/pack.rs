//! `granary pack`: make a pack (`granary pack SRC OUT`) and the tools that read one
//! (`granary pack verify|ls|cat|diff`). Both forms share the verb: a first argument naming a
//! tool is the tool; `granary pack create SRC OUT` packs a source that happens to be named
//! like one.

use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::flags::pack::{CatArgs, CreateArgs, DiffArgs, LsArgs, PackArgs, Tool, VerifyArgs};
use granary_core::size::{format_size, parse_size};
use granary_pack::listing::{escape, long_line};
use granary_pack::writer::phase;
use granary_pack::{Compression, Options, Pack, Progress};
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

fn show_progress(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// Draws `progress` until `done` is set.
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
    let progress = Progress::default();
    let done = AtomicBool::new(false);
    let summary = std::thread::scope(|s| {
        if show_progress(c.quiet) {
            s.spawn(|| progress_bar(&progress, &done));
        }
        let r = granary_pack::pack(&src, &out, &opts, &progress);
        done.store(true, Ordering::Relaxed);
        r
    })?;
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

fn verify(v: VerifyArgs) -> anyhow::Result<i32> {
    let pack = Pack::open(&v.pack)?;
    let checked = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let total = pack.index().header().raw_bytes;
    let report = std::thread::scope(|s| {
        if show_progress(v.quiet) {
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
        let r = granary_pack::verify::verify(&pack, v.source.as_deref(), &checked);
        done.store(true, Ordering::Relaxed);
        r
    });
    for p in &report.problems {
        println!("{p}");
    }
    if !v.quiet {
        eprintln!(
            "granary pack verify: {} files ({}) in {} partitions{}: {}",
            report.files,
            format_size(report.bytes),
            report.partitions,
            if v.source.is_some() {
                format!(", {} compared with the source", report.compared)
            } else {
                String::new()
            },
            if report.problems.is_empty() {
                "OK".to_string()
            } else {
                format!("{} problems", report.problems.len())
            }
        );
    }
    Ok(if report.problems.is_empty() { 0 } else { 1 })
}

fn ls(l: LsArgs) -> anyhow::Result<i32> {
    let pack = Pack::open(&l.pack)?;
    let ix = pack.index();
    let path = l
        .path
        .as_ref()
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_default();
    let i = ix.lookup(&path)?;
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
    let pack = Pack::open(&c.pack)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for p in &c.paths {
        let i = pack.resolve(p.as_bytes())?;
        match pack.copy_to(i, &mut out) {
            Ok(_) => {}
            // `granary pack cat … | head` is not an error.
            Err(granary_pack::PackError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::BrokenPipe =>
            {
                return Ok(0)
            }
            Err(e) => return Err(e.into()),
        }
    }
    out.flush()?;
    Ok(0)
}

fn diff(d: DiffArgs) -> anyhow::Result<i32> {
    let pack = Pack::open(&d.pack)?;
    let report = granary_pack::diff::diff(&d.src, pack.index())?;
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
