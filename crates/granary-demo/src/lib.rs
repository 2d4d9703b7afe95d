//! The demo behind `granary demo`: a self-contained before/after comparison on a generated dataset.
//!
//! Where it can (root, cgroup v1 blkio and memory, loop devices) the dataset lives on an
//! emulated slow source, as in the benchmark (`emulation`); otherwise on the local disk, and
//! the report says why. The same reader (`reader`, this binary) reads it for a few shuffled
//! epochs directly and then under `granary run`, verifying every byte; `report` prints the
//! epochs side by side and the gain. Everything the demo creates is removed at the end, on
//! error and on Ctrl-C.

mod dataset;
mod emulation;
mod reader;
mod report;

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use granary_core::size::format_size;

use emulation::SlowSource;
use reader::Run;
pub use reader::{read, ReaderConfig};

/// What the demo generates and how it reads it.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Number of files.
    pub files: usize,
    /// Size of each file, 1 B ..= 1 GiB.
    pub size: usize,
    /// Epochs per reader run.
    pub epochs: usize,
    /// Read a local directory even where a slow source could be emulated.
    pub no_emulation: bool,
    /// Directory for the dataset and the demo's tier; `None`: a temporary directory.
    pub dir: Option<PathBuf>,
    /// The granary binary: it runs the reader (`__demo-reader`) and `run`/`stop`.
    pub exe: PathBuf,
}

/// How the demo meets the signals of the process that runs it: whether a Ctrl-C arrived, and
/// which child (0: none) the process forwards signals to.
pub struct Interrupts {
    pub interrupted: fn() -> bool,
    pub set_child: fn(u32),
}

/// Where the dataset lives.
enum Source {
    Slow(SlowSource),
    /// A local directory; why no slow source was emulated.
    Local(String),
}

impl Source {
    fn command(&self, program: &Path) -> Command {
        match self {
            Source::Slow(s) => s.command(program.as_os_str()),
            Source::Local(_) => Command::new(program),
        }
    }
    fn device_reads(&self) -> Option<(u64, u64)> {
        match self {
            Source::Slow(s) => Some(s.device_reads()),
            Source::Local(_) => None,
        }
    }
    fn drop_caches(&mut self) -> Result<()> {
        match self {
            Source::Slow(s) => s.drop_caches(),
            Source::Local(_) => Ok(()),
        }
    }
}

/// Runs the demo; the caller catches interrupts first. Everything the demo created is removed
/// at the end, also on error; 130 after a Ctrl-C.
pub fn run(a: &DemoConfig, signals: &Interrupts) -> Result<i32> {
    let (root, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("granary-demo-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let res = demo_in(a, &root, signals);
    let dataset = root.join("dataset");
    if is_mount_point(&dataset) {
        eprintln!(
            "granary demo: {} is still mounted; not removing {}",
            dataset.display(),
            root.display()
        );
    } else if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    if (signals.interrupted)() {
        eprintln!("granary demo: interrupted; what the demo created is removed");
        return Ok(130);
    }
    res
}

fn is_mount_point(p: &Path) -> bool {
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(m), Some(Ok(parent))) => m.dev() != parent.dev(),
        _ => false,
    }
}

/// The emulated source's page-cache cap: below the dataset, so a direct run's later epochs read
/// the source again, as on a node whose RAM is smaller than the dataset; at least 64 MiB, room
/// for the reader and the agent.
fn memory_cap(total: u64) -> u64 {
    (total / 2).max(64 << 20)
}

fn demo_in(a: &DemoConfig, root: &Path, signals: &Interrupts) -> Result<i32> {
    let size = a.size;
    let started = Instant::now();
    let dataset = root.join("dataset");
    let manifest = root.join("manifest.txt");
    let tier = root.join("tier");
    let runtime = root.join("runtime");
    if !is_mount_point(&dataset) {
        let _ = std::fs::remove_dir_all(&dataset);
    }
    let _ = std::fs::remove_dir_all(&tier);
    let total = (a.files * size) as u64;
    let mut source = if a.no_emulation {
        Source::Local("--no-emulation".into())
    } else if let Some(why) = emulation::unavailable() {
        Source::Local(why)
    } else {
        let image = root.join("source.img");
        match SlowSource::create(
            &image,
            &dataset,
            total + total / 4 + (64 << 20),
            memory_cap(total),
        ) {
            Ok(s) => Source::Slow(s),
            Err(e) => Source::Local(format!("setting up the emulation failed: {e:#}")),
        }
    };
    if (signals.interrupted)() {
        // A Ctrl-C that ended a setup command is not a reason to fall back.
        bail!("interrupted");
    }
    match &source {
        Source::Slow(s) => eprintln!("granary demo: the source is {}", s.describe()),
        Source::Local(why) => eprintln!(
            "granary demo: no slow-source emulation ({why}): the source is a local directory"
        ),
    }
    std::fs::create_dir_all(&dataset).with_context(|| format!("creating {}", dataset.display()))?;
    eprintln!(
        "granary demo: generating {} files of {} in {} classes under {}",
        a.files,
        format_size(size as u64),
        dataset::CLASSES,
        dataset.display()
    );
    dataset::generate(&dataset, &manifest, a.files, size, signals.interrupted)?;
    let exe = &a.exe;
    let reader_args = |out: &Path| -> Vec<OsString> {
        vec![
            "__demo-reader".into(),
            "--dataset".into(),
            dataset.clone().into(),
            "--epochs".into(),
            a.epochs.to_string().into(),
            "--seed".into(),
            "42".into(),
            "--out".into(),
            out.to_path_buf().into(),
        ]
    };

    eprintln!(
        "granary demo: {} epochs reading the source directly",
        a.epochs
    );
    let direct_out = root.join("direct.json");
    source.drop_caches()?;
    let before = source.device_reads();
    let mut c = source.command(exe);
    c.args(reader_args(&direct_out));
    wait(c, "the direct reader", signals)?;
    let direct_dev = delta(before, source.device_reads());

    eprintln!("granary demo: {} epochs under `granary run`", a.epochs);
    let granary_out = root.join("granary.json");
    let stats = root.join("stats.json");
    source.drop_caches()?;
    let before = source.device_reads();
    let mut c = source.command(exe);
    c.env("GRANARY_RUNTIME_DIR", &runtime)
        .arg("run")
        .arg("--quiet")
        .arg("--source")
        .arg(&dataset)
        .arg("--tier")
        .arg(format!("{}={}", tier.display(), (total * 2).max(64 << 20)))
        .arg("--idle-timeout=5s")
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .arg(exe)
        .args(reader_args(&granary_out));
    let res = wait(c, "the reader under granary", signals);
    // The demo's agent is private to it: stop it now rather than waiting for the idle timeout.
    let _ = Command::new(exe)
        .env("GRANARY_RUNTIME_DIR", &runtime)
        .arg("stop")
        .stderr(std::process::Stdio::null())
        .status();
    res?;
    let granary_dev = delta(before, source.device_reads());

    let direct = Run {
        out: read_json(&direct_out)?,
        device: direct_dev,
    };
    let gran = Run {
        out: read_json(&granary_out)?,
        device: granary_dev,
    };
    let job: granary_core::stats::JobReport = read_json(&stats)?;
    let mode = match &source {
        Source::Slow(s) => report::Mode::Emulated(s.describe()),
        Source::Local(why) => report::Mode::Local(why.clone()),
    };
    if let Source::Slow(s) = &mut source {
        s.teardown();
    }
    let shape = report::Shape {
        files: a.files,
        size: size as u64,
        total,
        piece: reader::PIECE as u64,
    };
    report::print(&shape, &mode, &direct, &gran, &job, &tier)?;
    eprintln!(
        "granary demo: done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// Runs `c` to the end; Ctrl-C and friends reach it (forwarded) and end the demo.
fn wait(mut c: Command, what: &str, signals: &Interrupts) -> Result<()> {
    if (signals.interrupted)() {
        bail!("interrupted");
    }
    let mut child = c.spawn().with_context(|| format!("starting {what}"))?;
    (signals.set_child)(child.id());
    let st = child.wait();
    (signals.set_child)(0);
    let st = st?;
    if (signals.interrupted)() {
        bail!("interrupted");
    }
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

fn delta(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<(u64, u64)> {
    Some((after?.0 - before?.0, after?.1 - before?.1))
}

fn read_json<T: serde::de::DeserializeOwned>(p: &PathBuf) -> Result<T> {
    serde_json::from_slice(&std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)
        .with_context(|| format!("parsing {}", p.display()))
}
