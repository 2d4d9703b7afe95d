//! What the configuration says, as the agent reads it (`Config`, with its `TierConfig`s,
//! `PolicyKind` and `Verify`): made from the file by `schema`, merged with flags by the binary.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which placement policy a source gets (`[placement] policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Fastest tier with room, spill to the next, never evict.
    #[default]
    FillHighestFirst,
    /// The program's access order is known (`access_order`): place ahead, evict what was read.
    KnownOrder,
}

/// How a copy left by an earlier run is checked before it is served again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Every open checks the copy's identity (inode, ctime, size, type, owner) against what the
    /// agent recorded when it wrote it: anything done to it through the file system is caught.
    #[default]
    Identity,
    /// Also re-hash each reused copy (xxh3) in the background, at idle priority with direct I/O,
    /// against the checksum recorded when it was placed: catches damage below the file system.
    Checksum,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierConfig {
    pub path: PathBuf,
    /// Bytes; `None` = 90 % of the free space of the tier's file system.
    pub capacity: Option<u64>,
    pub block_size: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub tiers: Vec<TierConfig>,
    pub workers: Option<usize>,
    pub block_size: Option<u64>,
    pub max_source_streams: Option<usize>,
    pub prefetch_min_size: Option<u64>,
    pub chunk_size: Option<u64>,
    pub small_copy_delay: Option<Duration>,
    pub policy: Option<PolicyKind>,
    /// The access-order file (relative paths are resolved against the config file's directory).
    pub access_order: Option<PathBuf>,
    pub prefetch_window: Option<u64>,
    /// Page-cache residency budget (`None`: auto).
    pub page_cache: Option<crate::placement::residency::Budget>,
    pub verify: Option<Verify>,
    /// `[catalog] immutable`: the datasets of jobs using this configuration never change in
    /// place; a re-attach validates one `statx` per directory.
    pub immutable: Option<bool>,
    /// `[catalog] validate_threads`: threads of the background validation of an attach (0: none,
    /// each entry is checked by the first program that uses it).
    pub validate_threads: Option<usize>,
    /// `[catalog] pin_inodes`: while no job uses a source, the agent holds a reference to each
    /// of its catalogued directories and files (as many as its budget allows), so the next
    /// job's validation and metadata calls find them in the kernel's cache (default true).
    pub pin_inodes: Option<bool>,
    pub idle_timeout: Option<Duration>,
    pub log_level: Option<String>,
    pub log_file: Option<PathBuf>,
    /// `[mmap]`: following programs through their mappings.
    pub mmap: Option<crate::placement::mmap::MmapConfig>,
}
