//! `granary demo`: a self-contained before/after comparison on a generated dataset.
//!
//! The reader is this binary (`granary __demo-reader`), so the demo needs nothing else installed:
//! it shuffles the file list each epoch, reads every file whole, verifies every checksum against
//! the manifest, and (under granary) samples its job's counters from the table at each epoch
//! boundary, so the report shows per-epoch source traffic.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use granary_core::size::{format_size, parse_size};
use granary_shm::{job, layout::MAX_TIERS, Mapping};
use serde::{Deserialize, Serialize};

use crate::cli::{DemoArgs, DemoReaderArgs};

const CLASSES: usize = 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, fast, good enough for test data and shuffles.
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn generate(dataset: &Path, manifest: &Path, files: usize, size: usize) -> Result<u64> {
    let mut out = String::new();
    let mut buf = vec![0u8; size];
    let mut total = 0u64;
    for i in 0..files {
        let class = format!("class_{:02}", i % CLASSES);
        let dir = dataset.join(&class);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
        for chunk in buf.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let rel = format!("{class}/img_{i:06}.bin");
        std::fs::write(dataset.join(&rel), &buf).with_context(|| format!("writing {rel}"))?;
        out.push_str(&format!(
            "{rel} {} {:016x}\n",
            size,
            xxhash_rust::xxh3::xxh3_64(&buf)
        ));
        total += size as u64;
    }
    std::fs::write(manifest, out)?;
    Ok(total)
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Epoch {
    secs: f64,
    files: u64,
    bytes: u64,
    /// From the job's counters (zero when not under granary).
    source_opens: u64,
    source_bytes: u64,
    tier_files: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ReaderOut {
    epochs: Vec<Epoch>,
    verified_bytes: u64,
    under_granary: bool,
}

/// The job's counters, when running under `granary run`.
struct Counters {
    _map: Mapping,
    table: granary_shm::Table,
    slot: u32,
}

impl Counters {
    fn open() -> Option<Counters> {
        let path = std::env::var_os("GRANARY_TABLE")?;
        let slot: u32 = std::env::var("GRANARY_JOB_SLOT").ok()?.parse().ok()?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()?;
        let len = f.metadata().ok()?.len() as usize;
        let (map, table) = Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len).ok()?;
        Some(Counters {
            _map: map,
            table,
            slot,
        })
    }
    fn get(&self, w: usize) -> u64 {
        self.table
            .counter(self.slot, w)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
    fn sample(&self) -> (u64, u64, u64) {
        let tiers = (0..MAX_TIERS).map(|t| self.get(job::TIER_FILES + t)).sum();
        (
            self.get(job::SOURCE_OPENS),
            self.get(job::SOURCE_BYTES),
            tiers,
        )
    }
}

pub fn reader(a: DemoReaderArgs) -> Result<i32> {
    let manifest = std::fs::read_to_string(a.dataset.join("../manifest.txt"))
        .context("reading the demo manifest")?;
    let mut files: Vec<(String, u64, u64)> = manifest
        .lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            let rel = it.next()?.to_string();
            let size = it.next()?.parse().ok()?;
            let sum = u64::from_str_radix(it.next()?, 16).ok()?;
            Some((rel, size, sum))
        })
        .collect();
    let counters = Counters::open();
    let mut out = ReaderOut {
        under_granary: counters.is_some(),
        ..Default::default()
    };
    let mut rng = Rng(a.seed | 1);
    let mut buf = Vec::new();
    for _ in 0..a.epochs {
        // Fisher-Yates: a new order every epoch, like a DataLoader with shuffle=True.
        for i in (1..files.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            files.swap(i, j);
        }
        let before = counters.as_ref().map(|c| c.sample()).unwrap_or_default();
        let t = Instant::now();
        let mut e = Epoch::default();
        for (rel, size, sum) in &files {
            let p = a.dataset.join(rel);
            buf.clear();
            std::fs::File::open(&p)
                .and_then(|mut f| f.read_to_end(&mut buf))
                .with_context(|| format!("reading {}", p.display()))?;
            if buf.len() as u64 != *size || xxhash_rust::xxh3::xxh3_64(&buf) != *sum {
                bail!("{}: content differs from the manifest", p.display());
            }
            e.files += 1;
            e.bytes += buf.len() as u64;
        }
        e.secs = t.elapsed().as_secs_f64();
        let after = counters.as_ref().map(|c| c.sample()).unwrap_or_default();
        e.source_opens = after.0 - before.0;
        e.source_bytes = after.1 - before.1;
        e.tier_files = after.2 - before.2;
        out.verified_bytes += e.bytes;
        out.epochs.push(e);
        // Give the background placement a moment between epochs, as a training step would.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::fs::write(&a.out, serde_json::to_vec_pretty(&out)?)?;
    Ok(0)
}

pub fn demo(a: DemoArgs) -> Result<i32> {
    let size = parse_size(&a.size)
        .filter(|s| *s <= 1 << 30)
        .with_context(|| format!("bad --size `{}`", a.size))? as usize;
    let (root, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => {
            let base = std::env::temp_dir();
            (
                base.join(format!("granary-demo-{}", std::process::id())),
                true,
            )
        }
    };
    let res = demo_in(&a, &root, size);
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    res
}

fn demo_in(a: &DemoArgs, root: &Path, size: usize) -> Result<i32> {
    let dataset = root.join("dataset");
    let manifest = root.join("manifest.txt");
    let tier = root.join("tier");
    let runtime = root.join("runtime");
    let _ = std::fs::remove_dir_all(&dataset);
    let _ = std::fs::remove_dir_all(&tier);
    std::fs::create_dir_all(&dataset).with_context(|| format!("creating {}", dataset.display()))?;
    let exe = std::env::current_exe()?;
    eprintln!(
        "granary demo: generating {} files of {} in {CLASSES} classes under {}",
        a.files,
        format_size(size as u64),
        dataset.display()
    );
    let total = generate(&dataset, &manifest, a.files, size)?;
    let capacity = (total * 2).max(64 << 20);

    let reader = |out: &Path| -> Vec<std::ffi::OsString> {
        vec![
            exe.clone().into(),
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
    let args = reader(&direct_out);
    let st = Command::new(&args[0]).args(&args[1..]).status()?;
    if !st.success() {
        bail!("the direct reader failed ({st})");
    }
    eprintln!("granary demo: {} epochs under `granary run`", a.epochs);
    let granary_out = root.join("granary.json");
    let stats = root.join("stats.json");
    let st = Command::new(&exe)
        .env("GRANARY_RUNTIME_DIR", &runtime)
        .arg("run")
        .arg("--quiet")
        .arg("--source")
        .arg(&dataset)
        .arg("--tier")
        .arg(format!("{}={capacity}", tier.display()))
        .arg("--idle-timeout=5s")
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .args(reader(&granary_out))
        .status()?;
    // The demo's agent is private to it: stop it now rather than waiting for the idle timeout.
    let _ = Command::new(&exe)
        .env("GRANARY_RUNTIME_DIR", &runtime)
        .arg("stop")
        .stderr(std::process::Stdio::null())
        .status();
    if !st.success() {
        bail!("the reader under granary failed ({st})");
    }
    let direct: ReaderOut = serde_json::from_slice(&std::fs::read(&direct_out)?)?;
    let gran: ReaderOut = serde_json::from_slice(&std::fs::read(&granary_out)?)?;
    let report: granary_core::stats::JobReport = serde_json::from_slice(&std::fs::read(&stats)?)?;

    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "\n{} files x {} ({} per epoch), shuffled, every byte verified against the manifest",
        a.files,
        format_size(size as u64),
        format_size(total)
    )?;
    writeln!(
        o,
        "{:>5}  {:>10}  {:>11}  {:>18}  {:>18}  {:>16}",
        "epoch",
        "direct s",
        "granary s",
        "source opens (gr)",
        "source bytes (gr)",
        "tier files (gr)"
    )?;
    for (i, (d, g)) in direct.epochs.iter().zip(&gran.epochs).enumerate() {
        writeln!(
            o,
            "{:>5}  {:>10.3}  {:>11.3}  {:>18}  {:>18}  {:>16}",
            i + 1,
            d.secs,
            g.secs,
            g.source_opens,
            format_size(g.source_bytes),
            g.tier_files
        )?;
    }
    writeln!(
        o,
        "bytes verified: {} direct, {} under granary; agent placed {} files ({}) on {}",
        format_size(direct.verified_bytes),
        format_size(gran.verified_bytes),
        report.placement.files_placed,
        format_size(report.placement.bytes_placed),
        tier.display()
    )?;
    if !gran.epochs.is_empty() && gran.epochs.iter().all(|e| e.tier_files == 0) {
        writeln!(
            o,
            "note: the preload library served nothing from the tier (is libgranary_preload.so built?)"
        )?;
    }
    writeln!(
        o,
        "(the source here is a local directory, so times are close; on a parallel file system the \
         later epochs' savings are the source opens and bytes above)"
    )?;
    Ok(0)
}
