//! What `granary pack` is asked: partitions, compression, the files and their order, what to
//! replicate, threads, block size, syncing.

use std::path::PathBuf;

use crate::codec::Compression;
use crate::format::DEFAULT_BLOCK_SIZE;

/// Largest partition (data bytes) when neither a count nor a size is asked for.
pub const DEFAULT_PARTITION_SIZE: u64 = 1 << 30;

#[derive(Clone, Debug)]
pub struct Options {
    /// Partitions wanted (balanced by size).
    pub partitions: Option<u32>,
    /// Largest partition (data bytes); also sets the count when `partitions` is not given.
    pub partition_size: Option<u64>,
    pub compression: Compression,
    /// `--files`: pack these paths (relative to the source), in this order.
    pub files: Option<PathBuf>,
    /// `--replicate` patterns (globs on paths relative to the source).
    pub replicate: Vec<String>,
    pub threads: usize,
    pub block_size: u32,
    /// fsync partitions, index and directories before the rename.
    pub sync: bool,
    /// Replace an existing OUT.
    pub force: bool,
}

impl Default for Options {
    fn default() -> Options {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Options {
            partitions: None,
            partition_size: None,
            compression: Compression::None,
            files: None,
            replicate: Vec::new(),
            // Reads block on the source: a few more threads than cores keep it busy.
            threads: (cores * 2).max(4),
            block_size: DEFAULT_BLOCK_SIZE,
            sync: true,
            force: false,
        }
    }
}
