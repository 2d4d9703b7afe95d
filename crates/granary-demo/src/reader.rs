//! `granary __demo-reader`: the demo's training-data reader. It needs nothing installed: it
//! shuffles the file list each epoch, reads every file in 256 KiB pieces (the buffer numpy's
//! `np.load` reads an .npz member with), verifies every checksum against the manifest, and
//! (under granary) samples its job's counters from the table at each epoch boundary, so the
//! report shows per-epoch source traffic.

use std::io::Read;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use granary_shm::{job, layout::MAX_TIERS, Mapping};
use serde::{Deserialize, Serialize};

use crate::dataset::{read_manifest, Rng};

/// The size of each `read` the reader makes.
pub const PIECE: usize = 256 << 10;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Epoch {
    pub secs: f64,
    pub files: u64,
    pub bytes: u64,
    /// From the job's counters (zero when not under granary).
    pub source_opens: u64,
    pub source_bytes: u64,
    pub tier_files: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ReaderOut {
    pub epochs: Vec<Epoch>,
    pub verified_bytes: u64,
    pub under_granary: bool,
}

/// What one reader run measured.
pub(crate) struct Run {
    pub out: ReaderOut,
    /// (requests, bytes) the source device served during the run (emulated source only).
    pub device: Option<(u64, u64)>,
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
        self.table.job_value(self.slot, w)
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

/// Reads `path` whole in `PIECE`-sized reads into `buf`.
fn read_in_pieces(path: &std::path::Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    buf.clear();
    let mut piece = vec![0u8; PIECE];
    loop {
        match f.read(&mut piece) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&piece[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The reader's run: the dataset (its manifest is beside it), epochs, shuffle seed, and where
/// its per-epoch timings go (JSON).
#[derive(Debug, Clone)]
pub struct ReaderConfig {
    pub dataset: std::path::PathBuf,
    pub epochs: usize,
    pub seed: u64,
    pub out: std::path::PathBuf,
}

/// Reads every file of the dataset once per epoch in a new shuffled order, checking each
/// against the manifest, and writes the timings (and, under granary, where reads came from).
pub fn read(a: &ReaderConfig) -> Result<i32> {
    let mut files = read_manifest(&a.dataset.join("../manifest.txt"))?;
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
        for s in &files {
            let p = a.dataset.join(&s.rel);
            read_in_pieces(&p, &mut buf).with_context(|| format!("reading {}", p.display()))?;
            if buf.len() as u64 != s.size || xxhash_rust::xxh3::xxh3_64(&buf) != s.sum {
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
