//! The control socket's messages: one JSON object per line, tagged by `"type"`.

use std::path::PathBuf;

use granary_core::stats::{CatalogStats, PlacementStats};
use granary_core::tiers::{TierSpec, TierUsage};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Attach a job to a source. The connection stays open as the job's lease; closing it
    /// detaches. `tiers` and `workers` configure an agent that has none yet.
    Attach {
        source: PathBuf,
        pid: u32,
        tiers: Vec<TierSpec>,
        workers: Option<usize>,
    },
    /// Agent counters of one source (placement, its own source traffic) and tier usage.
    Stats {
        source: PathBuf,
    },
    Status,
    Stop,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Progress {
        files: u64,
        dirs: u64,
        bytes: u64,
    },
    Attached {
        table: PathBuf,
        job_slot: u32,
        source_id: String,
        tiers: Vec<TierUsage>,
        /// Set when the agent already runs with other tiers than the job asked for.
        note: Option<String>,
        catalog: CatalogStats,
        placement: PlacementStats,
    },
    Stats {
        placement: PlacementStats,
        tiers: Vec<TierUsage>,
    },
    Status(AgentStatus),
    Stopping,
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentStatus {
    pub pid: u32,
    pub uptime_s: f64,
    pub jobs: usize,
    pub idle_timeout_s: f64,
    pub runtime_dir: PathBuf,
    pub tiers: Vec<TierUsage>,
    pub sources: Vec<SourceStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceStatus {
    pub source: PathBuf,
    pub id: String,
    pub table: Option<PathBuf>,
    pub jobs: usize,
    pub catalog: CatalogStats,
    pub files_placed_now: u64,
    pub bytes_placed_now: u64,
    pub placement: PlacementStats,
}
