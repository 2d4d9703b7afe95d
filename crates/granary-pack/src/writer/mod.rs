//! `granary pack SRC OUT`: walk, plan, store, index, then one rename makes the pack visible.
//!
//! Everything is written under a temporary name beside OUT (`.OUT.tmp-<pid>`), partitions
//! first, the index last; only a complete pack is renamed to OUT. A pack that fails or is
//! stopped (`Progress::stop`) removes that temporary directory; a killed one (SIGKILL, a
//! crash) leaves it (no index, or one under a name no reader opens) and never a pack that
//! looks valid — the next pack to the same OUT names it.

pub mod build;
pub mod options;
pub mod output;
pub mod pipeline;
pub mod plan;
pub mod progress;
pub mod walk;

pub use options::{Options, DEFAULT_PARTITION_SIZE};
pub use progress::{phase, Progress};

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{PackError, Result};
use crate::format::{partition_file, PartitionHeader, INDEX_FILE};

#[derive(Clone, Debug)]
pub struct Summary {
    pub out: PathBuf,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub partitions: u32,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
    pub index_bytes: u64,
    pub elapsed: Duration,
    /// Temporary directories left beside OUT by interrupted packs (safe to remove once no pack
    /// to OUT runs).
    pub leftovers: Vec<PathBuf>,
}

fn globs(patterns: &[String]) -> Result<GlobSet> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let g = GlobBuilder::new(p.trim_start_matches('/'))
            .literal_separator(true)
            .build()
            .map_err(|e| PackError::Invalid(format!("--replicate {p:?}: {e}")))?;
        b.add(g);
    }
    b.build()
        .map_err(|e| PackError::Invalid(format!("--replicate: {e}")))
}

/// Packs the tree at `src` into a new pack directory `out`.
pub fn pack(src: &Path, out: &Path, opts: &Options, progress: &Progress) -> Result<Summary> {
    let started = Instant::now();
    if !opts.block_size.is_power_of_two()
        || !(crate::format::MIN_BLOCK_SIZE..=crate::format::MAX_BLOCK_SIZE)
            .contains(&opts.block_size)
    {
        return Err(PackError::Invalid(format!(
            "block size {}",
            opts.block_size
        )));
    }
    if opts.partitions == Some(0) || opts.partition_size == Some(0) {
        return Err(PackError::Invalid(
            "partitions must be at least 1 (and their size above 0)".into(),
        ));
    }
    let replicate = globs(&opts.replicate)?;
    let source = walk::Source::open(src)?;
    let tmp = output::Staging::create(src, out, opts.force)?;

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        // Deep trees recurse once per level.
        .stack_size(64 << 20)
        .build()
        .map_err(|e| PackError::Invalid(format!("thread pool: {e}")))?;
    let list = match &opts.files {
        Some(l) => Some(walk::read_list(l, src)?),
        None => None,
    };
    let root = pool.install(|| match &list {
        Some(paths) => walk::walk_list(&source, paths, progress),
        None => {
            let st = crate::sys::statx_at(&source.fd, b"").map_err(|e| PackError::io(src, e))?;
            walk::walk(&source, b"", st, progress)
        }
    })?;
    let (items, by_path) = plan::order(&root, list.as_deref());
    // Totals from the plan (hard links counted once) so progress ends at 100 %.
    let data: Vec<&plan::Item> = items.iter().filter(|i| i.link_to.is_none()).collect();
    progress
        .files_total
        .store(data.len() as u64, Ordering::Relaxed);
    progress
        .bytes_total
        .store(data.iter().map(|i| i.stat.size).sum(), Ordering::Relaxed);
    progress.phase.store(phase::PACKING, Ordering::Relaxed);

    let written = pipeline::run(&source, &items, tmp.path(), opts, progress)?;
    progress.check_stop()?;
    progress.phase.store(phase::FINISHING, Ordering::Relaxed);
    let built = build::build(
        &root,
        &items,
        &by_path,
        &written.locs,
        &written.partitions,
        &build::Meta {
            replicate,
            block_size: opts.block_size,
            info: if list.is_some() {
                crate::format::header::info::SUBSET
            } else {
                0
            },
        },
    )?;
    let count = written.partitions.len() as u32;
    for (n, (f, rec)) in written.files.iter().zip(&written.partitions).enumerate() {
        let path = tmp.path().join(partition_file(n as u32));
        let h = PartitionHeader {
            header_len: crate::format::header::PARTITION_HEADER_LEN as u32,
            number: n as u32,
            partition_count: count,
            pack_id: built.header.pack_id,
            data_len: rec.data_len,
            file_count: rec.file_count,
        };
        f.write_all_at(&h.encode(), 0)
            .map_err(|e| PackError::io(&path, e))?;
        if opts.sync {
            f.sync_all().map_err(|e| PackError::io(&path, e))?;
        }
    }
    tmp.write_file(INDEX_FILE, &built.bytes, opts.sync)?;
    // The last moment to stop: after the rename the pack is complete.
    progress.check_stop()?;
    let leftovers = tmp.leftovers.clone();
    let out = tmp.commit(opts.sync)?;
    Ok(Summary {
        out,
        files: built.header.file_count,
        dirs: built.header.dir_count,
        symlinks: built.header.symlink_count,
        partitions: count,
        raw_bytes: built.header.raw_bytes,
        stored_bytes: built.header.stored_bytes,
        index_bytes: built.bytes.len() as u64,
        elapsed: started.elapsed(),
        leftovers,
    })
}
