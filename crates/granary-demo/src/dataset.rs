//! The demo's dataset: files of random bytes in class directories, and a manifest of their
//! xxh3 checksums kept outside the source (reading it costs the source nothing).

use std::path::Path;

use anyhow::{bail, Context, Result};

pub const CLASSES: usize = 20;

/// xorshift64*: deterministic, fast, good enough for test data and shuffles.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// One line of the manifest.
pub struct Sample {
    pub rel: String,
    pub size: u64,
    pub sum: u64,
}

/// Writes `files` files of `size` bytes under `dataset` and their manifest; returns the bytes
/// written. Stops early (an error) once `stop()` says so.
pub fn generate(
    dataset: &Path,
    manifest: &Path,
    files: usize,
    size: usize,
    stop: impl Fn() -> bool,
) -> Result<u64> {
    let mut out = String::new();
    let mut buf = vec![0u8; size];
    let mut total = 0u64;
    for i in 0..files {
        if stop() {
            bail!("interrupted");
        }
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
    std::fs::write(manifest, out).with_context(|| format!("writing {}", manifest.display()))?;
    Ok(total)
}

/// The manifest's samples (lines that do not parse are skipped).
pub fn read_manifest(manifest: &Path) -> Result<Vec<Sample>> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("reading the demo manifest {}", manifest.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut it = l.split(' ');
            Some(Sample {
                rel: it.next()?.to_string(),
                size: it.next()?.parse().ok()?,
                sum: u64::from_str_radix(it.next()?, 16).ok()?,
            })
        })
        .collect())
}
