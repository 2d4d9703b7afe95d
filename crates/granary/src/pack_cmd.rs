//! `granary pack`: make a pack (`granary pack SRC OUT`) and the tools that read one
//! (`granary pack verify|ls|cat|diff`). Both forms share the verb: a first argument naming a
//! tool is the tool; `granary pack create SRC OUT` packs a source that happens to be named
//! like one.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use granary_core::size::{format_size, parse_size};
use granary_pack::listing::{escape, long_line};
use granary_pack::writer::phase;
use granary_pack::{Compression, Options, Pack, Progress};
use indicatif::{ProgressBar, ProgressStyle};

const PACK_EXAMPLES: &str = "\
Examples:
  granary pack /pfs/imagenet /pfs/imagenet.granary
      every file of the tree into ~1 GiB partitions plus an index, on every core
  granary pack /pfs/imagenet /pfs/imagenet.granary --partitions 8 --compress zstd:3
      8 partitions of balanced size; files (and 1 MiB frames) that do not shrink stay raw
  granary pack /pfs/imagenet /pfs/in.granary --files order.txt --replicate 'val/**'
      only the listed paths, stored in the listed order; val/ marked for every node
  granary pack verify /pfs/imagenet.granary --source /pfs/imagenet
  granary pack ls /pfs/imagenet.granary train/n01440764
  granary pack cat /pfs/imagenet.granary train/n01440764/img_1.JPEG > img.jpg
  granary pack diff /pfs/imagenet /pfs/imagenet.granary

The pack is written under a temporary name beside OUT and renamed when complete: an interrupted
pack never leaves a pack that looks valid. The same tree always gives the same bytes.
`granary pack create SRC OUT` is the same as `granary pack SRC OUT` (for a SRC named like a tool).
The format is described in docs/pack-format.md.";

/// Pack a dataset into a few large partitions and an index, or inspect a pack.
#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = PACK_EXAMPLES
)]
pub struct PackArgs {
    #[command(subcommand)]
    pub tool: Option<Tool>,
    #[command(flatten)]
    pub create: CreateArgs,
}

#[derive(Subcommand, Debug)]
pub enum Tool {
    /// Pack SRC into OUT (what `granary pack SRC OUT` does).
    #[command(after_help = PACK_EXAMPLES)]
    Create(CreateArgs),
    /// Check every checksum of a pack; with --source, compare every file with the source.
    #[command(after_help = "\
Examples:
  granary pack verify /pfs/imagenet.granary
      index, partition headers, every file's and symlink's checksum, partitions fully covered
  granary pack verify /pfs/imagenet.granary --source /pfs/imagenet
      also compares each file byte for byte with the file it was packed from

Exit status: 0 when everything holds, 1 when a problem was found (each is printed).")]
    Verify(VerifyArgs),
    /// List a directory of a pack like `ls -l`, from the index alone.
    #[command(after_help = "\
Examples:
  granary pack ls /pfs/imagenet.granary                 the pack's top directory
  granary pack ls /pfs/imagenet.granary train/n01440764 one directory
  granary pack ls -R /pfs/imagenet.granary              every entry, with its path
  granary pack ls -d /pfs/imagenet.granary train        the directory itself

Columns: mode, links, uid, gid, size, mtime (UTC), name (`-> target` for symlinks). Control
characters and bytes that are not UTF-8 are shown as backslash escapes, like `ls -b`.")]
    Ls(LsArgs),
    /// Write files of a pack to stdout, checked against their checksums first.
    #[command(after_help = "\
Examples:
  granary pack cat /pfs/imagenet.granary train/n01440764/img_1.JPEG > img.jpg
  granary pack cat /pfs/imagenet.granary labels.txt synsets.txt | wc -l

Symlinks inside the pack are followed; one pointing outside it is an error. A damaged file is an
error, never wrong bytes.")]
    Cat(CatArgs),
    /// List what changed in the source since it was packed (added, removed, modified).
    #[command(after_help = "\
Examples:
  granary pack diff /pfs/imagenet /pfs/imagenet.granary
  granary pack diff /pfs/imagenet /pfs/imagenet.granary | grep '^M'

Output: `A path` added, `D path` removed, `M path (fields)` another version (inode, size, mtime,
ctime, type or symlink target differ). A directory whose inode, mtime and ctime are unchanged is
not listed again (only its entries are stat'ed); no file is read.
Exit status: 0 when nothing changed, 1 when something did.")]
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The directory to pack.
    #[arg(required = true, value_name = "SRC")]
    pub src: Option<PathBuf>,
    /// The pack directory to create (must not exist, unless --force).
    #[arg(required = true, value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Number of partitions, balanced by size (at most one per file).
    #[arg(long, value_name = "N", conflicts_with = "partition_size")]
    pub partitions: Option<u32>,
    /// Largest partition (e.g. 1G, the default); sets the number of partitions.
    #[arg(long, value_name = "SIZE")]
    pub partition_size: Option<String>,
    /// none, lz4, zstd or zstd:LEVEL (1-22). Per 1 MiB frame, what does not shrink is stored raw.
    #[arg(long, value_name = "CODEC", default_value = "none")]
    pub compress: String,
    /// Pack only these paths, in this order: one per line (or NUL-separated), relative to SRC
    /// or absolute below it; a directory brings its whole subtree.
    #[arg(long, value_name = "LIST")]
    pub files: Option<PathBuf>,
    /// Mark paths matching this glob (e.g. 'val/**') to be kept by every node in cluster
    /// mode. Repeatable.
    #[arg(long, value_name = "GLOB")]
    pub replicate: Vec<String>,
    /// Reader/compressor threads (default: twice the cores, at least 4).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Replace OUT if it exists (the old pack stays in place until the new one is complete).
    #[arg(long)]
    pub force: bool,
    /// Do not fsync the pack before publishing it.
    #[arg(long)]
    pub no_sync: bool,
    /// No progress bar and no summary.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    pub pack: PathBuf,
    /// Also compare every file with this source directory.
    #[arg(long, value_name = "SRC")]
    pub source: Option<PathBuf>,
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    pub pack: PathBuf,
    /// A path inside the pack (default: its root).
    pub path: Option<OsString>,
    /// Every entry below PATH, each with its path.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// The directory itself, not its contents.
    #[arg(short, long)]
    pub directory: bool,
}

#[derive(Args, Debug)]
pub struct CatArgs {
    pub pack: PathBuf,
    #[arg(required = true)]
    pub paths: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    pub src: PathBuf,
    pub pack: PathBuf,
}

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
