//! The control socket's messages: one JSON object per line, tagged by `"type"`.

use std::path::PathBuf;

use granary_core::stats::{CatalogStats, PlacementStats};
use granary_core::tiers::{TierSpec, TierUsage};
use serde::{Deserialize, Serialize};

// One request per connection and a few per job: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Attach a job to a source. The connection stays open as the job's lease; closing it
    /// detaches. `tiers` become the source's tiers if no other job is attached to it (empty:
    /// the agent's configured tiers); `workers` sizes the placement pool of an agent that has
    /// none yet.
    Attach {
        source: PathBuf,
        pid: u32,
        tiers: Vec<TierSpec>,
        workers: Option<usize>,
        /// `[placement] block_size` / `max_source_streams` of an agent that has no pool yet
        /// (the job's flags or configuration); the agent's own configuration wins.
        #[serde(default)]
        block_size: Option<u64>,
        #[serde(default)]
        max_source_streams: Option<usize>,
        /// `[placement] page_cache` of an agent that has no pool yet; likewise.
        #[serde(default)]
        page_cache: Option<granary_core::placement::residency::Budget>,
        /// Known-order placement (`--access-order`): the source's policy if no other job is
        /// attached to it (like `tiers`); `None`: fill highest first.
        #[serde(default)]
        order: Option<granary_core::placement::known_order::OrderSpec>,
        /// The dataset is declared immutable (`--immutable`, `[catalog] immutable`): a job
        /// attaching to an idle source validates the catalog by directory only.
        #[serde(default)]
        immutable: bool,
        /// Serve this pack (`--pack`): its index is the catalog, its partitions are what
        /// placement reads. Absolute.
        #[serde(default)]
        pack: Option<PathBuf>,
        /// Only the pack exists (`--mount`): `source` names where the program expects the tree.
        #[serde(default)]
        mount: bool,
        /// `[mmap]` of an agent that has no pool yet; the agent's own configuration wins.
        #[serde(default)]
        mmap: Option<granary_core::placement::mmap::MmapConfig>,
        /// The agent-wide settings the job's configuration and flags set
        /// (`granary_core::config::agent_wide`): those the agent does not apply come back as
        /// notes.
        #[serde(default)]
        settings: Vec<granary_core::config::agent_wide::Setting>,
    },
    /// Agent counters of one source (placement, its own source traffic) and its tiers' usage;
    /// with the job's slot, what was placed for that job.
    Stats {
        source: PathBuf,
        #[serde(default)]
        slot: u32,
        /// The pack the job attached with, if any (a packed source is its own source).
        #[serde(default)]
        pack: Option<PathBuf>,
    },
    Status,
    Stop,
    /// `granary cache`: record every source's copies as they are now, then take away each
    /// source directory (`<tier root>/<source id>`) in `clean` that no job uses — renamed to
    /// trash in its tier root, which the caller deletes.
    Cache {
        #[serde(default)]
        clean: Vec<PathBuf>,
    },
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
        /// What the job should know (printed unless `-q`): it gets other tiers or another
        /// capacity than it asked for (another job uses them), the source's copies left a tier
        /// it no longer uses, its known-order policy's summary.
        #[serde(default)]
        notes: Vec<String>,
        /// What is wrong (printed even with `-q`): tiers refused or lost.
        #[serde(default)]
        warnings: Vec<String>,
        catalog: CatalogStats,
        placement: PlacementStats,
    },
    Stats {
        placement: PlacementStats,
        tiers: Vec<TierUsage>,
        /// As in `Attached`, as they stand now (a tier lost during the job shows here).
        #[serde(default)]
        warnings: Vec<String>,
        /// The copies credited to the job of `slot` (`AgentCounters::credit_placement`).
        #[serde(default)]
        job: granary_core::stats::JobPlaced,
        /// Cluster mode: this node's place in the serving job.
        #[serde(default)]
        cluster: Option<granary_core::stats::ClusterReport>,
        /// Placement work of the source not finished (`SourceCtx::pending`: requests, not
        /// files; zero once every request is decided).
        #[serde(default)]
        pending: u64,
        /// Files of the source queued or being copied now (entries QUEUED or PLACING): what the
        /// job's report says is still being placed.
        #[serde(default)]
        placing: u64,
        /// A packed source: what of the pack was found damaged (partitions refused, files
        /// whose bytes failed their checksum).
        #[serde(default)]
        pack_damage: Option<granary_core::stats::PackDamage>,
    },
    Status(AgentStatus),
    Stopping,
    Cache {
        /// Sources the agent holds a table of, and their jobs now.
        in_use: Vec<CacheInUse>,
        taken: Vec<CacheTaken>,
        refused: Vec<CacheRefused>,
        /// Every tier directory its sources use.
        #[serde(default)]
        tiers: Vec<PathBuf>,
    },
    Error {
        message: String,
        /// The attach failed because the pack's index is damaged: what the job's report says.
        #[serde(default)]
        pack_damage: Option<granary_core::stats::PackDamage>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheInUse {
    pub id: String,
    pub source: PathBuf,
    pub jobs: usize,
    /// The tier roots of its table.
    #[serde(default)]
    pub tiers: Vec<PathBuf>,
}

/// A source directory taken away: now at `trash`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheTaken {
    pub dir: PathBuf,
    pub trash: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheRefused {
    pub dir: PathBuf,
    pub reason: String,
}

/// `granary status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentStatus {
    pub pid: u32,
    pub uptime_s: f64,
    pub jobs: usize,
    pub idle_timeout_s: f64,
    pub runtime_dir: PathBuf,
    /// The placement pool, once the first job started it: workers, the size of their source
    /// reads, and the memory cgroup limit they were sized for (buffers ≤ 1/16 of it).
    #[serde(default)]
    pub placement: Option<PoolStatus>,
    /// Every tier directory any source has used in this agent, once each, ordered by path.
    pub tiers: Vec<TierUsage>,
    /// Cluster mode (`granary serve`): every rank as this one knows it.
    #[serde(default)]
    pub cluster: Option<ClusterStatus>,
    pub sources: Vec<SourceStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatus {
    pub workers: usize,
    pub block_size: u64,
    pub memory_limit: Option<u64>,
    #[serde(default)]
    pub page_cache: Option<PageCacheStatus>,
}

/// Page-cache residency (`[placement] page_cache`), as last rebalanced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PageCacheStatus {
    /// `auto`, `off` or a size.
    pub budget: String,
    /// Bytes of copies that may stay cached; `None`: no limit.
    pub target: Option<u64>,
    /// What the page cache could hold at the last measurement (`auto` only; 0 otherwise).
    pub room: u64,
    /// Bytes of resident copies.
    pub resident: u64,
    /// Copies moved out of / into the resident set since the agent started.
    pub demoted: u64,
    pub promoted: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceStatus {
    pub source: PathBuf,
    pub id: String,
    /// The pack the source is served from (`granary run --pack`), if any.
    #[serde(default)]
    pub pack: Option<PathBuf>,
    /// True when the source was busy (being walked, attached or saved) as status was taken:
    /// `table`, `jobs` and `catalog` are then not filled in rather than waited for.
    pub busy: bool,
    /// The current table; `None` before the first walk finished (or while busy).
    pub table: Option<PathBuf>,
    pub jobs: usize,
    pub catalog: CatalogStats,
    /// This source's tiers, fastest first (tier `t` of its table and counters). Usage is the
    /// directory's: sources sharing a directory share its capacity and count each other's copies.
    pub tiers: Vec<TierUsage>,
    pub files_placed_now: u64,
    pub bytes_placed_now: u64,
    /// Placement work not finished for the current table: requests still in its ring plus
    /// copies queued or running (entries in QUEUED/PLACING). 0 means every file opened so far
    /// has been decided (PLACED, SOURCE_ONLY or STALE), so polling for 0 waits for background
    /// copies. A request the ring had no room for is dropped (the next open asks again) and is
    /// not counted.
    pub pending: u64,
    pub placement: PlacementStats,
    /// The current attach's background validation of the catalog against the source.
    #[serde(default)]
    pub validation: Option<ValidationStatus>,
    /// What is wrong with its tiers (refused at the walk, lost since), as jobs are told.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The source's directories and files whose inodes the agent holds in the kernel's cache
    /// between jobs (`source::pins`).
    #[serde(default)]
    pub held_dirs: u64,
    #[serde(default)]
    pub held_files: u64,
    /// What the programs of every job on this source read, since the agent started.
    #[serde(default)]
    pub served: Served,
}

/// The programs' opens of a source's files and the bytes they read, by where they were served
/// from, summed over jobs (`granary status`, the metrics file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Served {
    pub opens: u64,
    pub tier_opens: u64,
    pub tier_bytes: u64,
    pub source_opens: u64,
    pub source_bytes: u64,
}

impl Served {
    /// A job's counters, from its slot of the table.
    pub fn of_slot(t: &granary_shm::Table, slot: u32) -> Served {
        use granary_shm::job;
        let c = |w: usize| t.job_value(slot, w);
        let tiers = 0..granary_shm::layout::MAX_TIERS;
        Served {
            opens: c(job::OPENS),
            tier_opens: tiers.clone().map(|i| c(job::TIER_FILES + i)).sum(),
            tier_bytes: tiers.map(|i| c(job::TIER_BYTES + i)).sum(),
            source_opens: c(job::SOURCE_OPENS),
            source_bytes: c(job::SOURCE_BYTES),
        }
    }

    pub fn add(&mut self, o: &Served) {
        self.opens += o.opens;
        self.tier_opens += o.tier_opens;
        self.tier_bytes += o.tier_bytes;
        self.source_opens += o.source_opens;
        self.source_bytes += o.source_bytes;
    }
}

/// Progress of an attach's validation (`catalog::validate`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ValidationStatus {
    pub epoch: u64,
    pub immutable: bool,
    pub dirs_checked: u64,
    pub files_checked: u64,
    /// Entries found changed or gone (voided).
    pub changed: u64,
    /// Every directory was checked (or the attach ended).
    pub done: bool,
}

/// `granary status --json`: `cluster` (absent on one node).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub rank: u32,
    pub ranks: u32,
    /// The catalog arrived and requests are served (jobs attaching before wait for it).
    pub ready: bool,
    pub source: std::path::PathBuf,
    /// The pack the source is served from (`--pack`), if any.
    #[serde(default)]
    pub pack: Option<std::path::PathBuf>,
    /// Only the pack exists: `source` is where the programs expect the tree (`--mount`).
    #[serde(default)]
    pub mount: bool,
    /// `--replicas`: ranks holding each file.
    pub replicas: u32,
    /// `--replicate` globs: files every rank holds.
    #[serde(default)]
    pub replicate: Vec<String>,
    /// Copies of other ranks' files (replicas, `--replicate`) still to be made at start.
    pub copies_pending: u64,
    /// Entries other ranks reported changed on the source (written or removed through granary
    /// there), dropped here.
    #[serde(default)]
    pub invalidations: u64,
    /// Staged copies dropped whose file (pages and mapping) was kept for the next copy, nobody
    /// else having it open (`cluster::staging`).
    #[serde(default)]
    pub staging_recycled: u64,
    /// Copies received into the staging tier that found no file ready (made ahead or dropped):
    /// their pages were allocated while the program waited.
    #[serde(default)]
    pub staging_fresh: u64,
    /// Staging files made ahead and ready for a copy now, and their bytes.
    #[serde(default)]
    pub staging_free_files: u64,
    #[serde(default)]
    pub staging_free_bytes: u64,
    /// Bytes of copies received here and checksummed, and the time the checksums took on one
    /// thread (`hashing_ns / hashed_bytes`: the checksum's cost per byte on this node).
    #[serde(default)]
    pub hashed_bytes: u64,
    #[serde(default)]
    pub hashing_ns: u64,
    /// Mappings of this rank's own copies kept for sending from (`cluster::maps`).
    #[serde(default)]
    pub maps_kept: u64,
    /// Copies read straight from the memory of a rank on this host (`cluster::direct`), not
    /// over MPI: files and bytes (part of the remote files and bytes).
    #[serde(default)]
    pub direct_files: u64,
    #[serde(default)]
    pub direct_bytes: u64,
    /// Other ranks' copies this rank knows it may read that way (their mappings announced).
    #[serde(default)]
    pub direct_known: u64,
    /// Files and bytes this rank holds of the dataset (as first owner or replica), all ranks
    /// together: the dataset as dealt out.
    pub files_owned: u64,
    pub bytes_owned: u64,
    /// Milliseconds this rank's communication thread has been stuck inside the MPI library
    /// (`cluster::transport::Pulse`), once past `STUCK_AFTER`: the rank then counts on no
    /// peer, serving what its tiers hold and reading the rest from the source.
    #[serde(default)]
    pub mpi_stuck_ms: Option<u64>,
    /// Every rank, this one included, as last heard of.
    pub peers: Vec<PeerStatus>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PeerStatus {
    pub rank: u32,
    /// Heard from within the suspect time and not written off since.
    pub alive: bool,
    /// Milliseconds since its last message (`None`: written off).
    pub silent_ms: Option<u64>,
    /// Its numbers, as of its last heartbeat.
    #[serde(flatten)]
    pub numbers: Beat,
}

/// A rank's numbers, sent with every heartbeat (`wire::Msg::Heartbeat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// Complete copies of the dataset in its own tiers, and bytes in its staging tier.
    pub files_held: u64,
    pub bytes_held: u64,
    pub bytes_staged: u64,
    /// Copies it received from other ranks and sent to them.
    pub remote_files: u64,
    pub remote_bytes: u64,
    pub peer_files: u64,
    pub peer_bytes: u64,
    /// Bytes its agent read from the source (the PFS).
    pub pfs_bytes: u64,
    /// Files another rank was to send it that it read from the source instead.
    pub fallbacks: u64,
    pub jobs: u64,
    /// Bytes of copies that went through a buffer on this rank instead of straight between
    /// the owner's copy and the receiving one (a piece read into a buffer by the owner, or
    /// received into one): 0 on the normal path.
    #[serde(default)]
    pub bounce_bytes: u64,
}
