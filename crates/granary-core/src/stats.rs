//! Counters: what the agent did (placement, its own source traffic) and the report `granary run`
//! prints and writes with `--stats-json`. The program's own I/O is counted by the preload library
//! in the table's job slots (`granary_shm::job`); `JobReport` puts both together.

use crate::sync::atomic::{AtomicU64, Ordering};

use granary_shm::layout::MAX_TIERS;
use serde::{Deserialize, Serialize};

use crate::tiers::TierUsage;

/// The agent's counters for one source (lifetime of the agent).
#[derive(Debug, Default)]
pub struct AgentCounters {
    pub files_placed: AtomicU64,
    pub bytes_placed: AtomicU64,
    pub tier_files: [AtomicU64; MAX_TIERS],
    pub tier_bytes: [AtomicU64; MAX_TIERS],
    /// The agent's own reads of the source (placement copies).
    pub source_opens: AtomicU64,
    pub source_reads: AtomicU64,
    pub source_bytes: AtomicU64,
    /// Placements that failed (unreadable source, write error, rename): real errors only; no
    /// room is `no_room`.
    pub failures: AtomicU64,
    pub stale: AtomicU64,
    /// Bytes of small-file copies taken from the page cache (pages the program had just read):
    /// no source traffic.
    pub page_cache_bytes: AtomicU64,
    /// Bytes the agent read from the source that the program had read already (a small file's
    /// pages were evicted before the copy). Also counted in `source_bytes`.
    pub duplicate_bytes: AtomicU64,
    /// Known-order placement: copies dropped to make room (only files read this epoch), and
    /// files placed ahead of the program.
    pub evictions: AtomicU64,
    pub prefetched: AtomicU64,
    /// Files fetched ahead of a program reading their directory in name order
    /// (`placement::ahead`).
    pub read_ahead: AtomicU64,
    /// Files no tier had room for (SOURCE_ONLY or PARTIAL without a source call): not failures.
    pub no_room: AtomicU64,
    /// Chunks of PARTIAL files written to a tier, and their bytes.
    pub chunks_placed: AtomicU64,
    pub chunk_bytes_placed: AtomicU64,
    /// Times source-reading work nobody waited on backed off because the program's own source
    /// reads were moving (`Engine::stream_for`).
    pub backoffs: AtomicU64,
    /// Bytes of the source read ahead of programs' mappings (`placement::mmap`; also in
    /// `source_bytes`), and the read-ahead windows issued.
    pub mmap_read_ahead: AtomicU64,
    pub mmap_windows: AtomicU64,
    /// Opens of LMDB lock files given the node-local lock file instead of the source's.
    pub lmdb_local_locks: AtomicU64,
    /// Cluster mode: copies this node received from other nodes (for its programs, and for
    /// `--replicate`d files), and their bytes.
    pub remote_files: AtomicU64,
    pub remote_bytes: AtomicU64,
    /// Cluster mode: copies this node sent to other nodes, and their bytes.
    pub peer_files: AtomicU64,
    pub peer_bytes: AtomicU64,
    /// Cluster mode: files another node was to send that came from the source instead (the
    /// node did not answer in time, failed, or had no room for them).
    pub remote_fallbacks: AtomicU64,
    /// Copies of files other nodes hold dropped from the staging tier to make room.
    pub staging_evictions: AtomicU64,
    /// Copies credited to each job slot, per tier (`credit_placement`).
    pub jobs: JobPlacements,
}

/// Most job slots a table has (`granary_shm::job` counters per slot).
pub const MAX_JOB_SLOTS: usize = 64;

/// Per job slot and tier: files and bytes of the copies placed for that job.
#[derive(Debug)]
pub struct JobPlacements {
    /// `[slot][tier]`: files, then bytes.
    files: Box<[[AtomicU64; MAX_TIERS]; MAX_JOB_SLOTS]>,
    bytes: Box<[[AtomicU64; MAX_TIERS]; MAX_JOB_SLOTS]>,
}

impl Default for JobPlacements {
    fn default() -> Self {
        let zero = || {
            Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicU64::new(0))
            }))
        };
        JobPlacements {
            files: zero(),
            bytes: zero(),
        }
    }
}

/// What one job's copies were, per tier (`files[t]`, `bytes[t]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlaced {
    pub files: Vec<u64>,
    pub bytes: Vec<u64>,
}

impl JobPlacements {
    /// A slot given to a new job starts from zero.
    pub fn reset(&self, slot: u32) {
        let Some((f, b)) = self.row(slot) else { return };
        for c in f.iter().chain(b) {
            c.store(0, Ordering::Relaxed);
        }
    }

    pub fn get(&self, slot: u32) -> JobPlaced {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        match self.row(slot) {
            Some((f, b)) => JobPlaced {
                files: f.iter().map(l).collect(),
                bytes: b.iter().map(l).collect(),
            },
            None => JobPlaced::default(),
        }
    }

    fn row(&self, slot: u32) -> Option<(&[AtomicU64; MAX_TIERS], &[AtomicU64; MAX_TIERS])> {
        let s = slot as usize;
        Some((self.files.get(s)?, self.bytes.get(s)?))
    }

    fn add(&self, slot: u32, tier: usize, bytes: u64) {
        if let Some((f, b)) = self.row(slot) {
            if let (Some(f), Some(b)) = (f.get(tier), b.get(tier)) {
                f.fetch_add(1, Ordering::Relaxed);
                b.fetch_add(bytes, Ordering::Relaxed);
            }
        }
    }
}

impl AgentCounters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// A copy of `bytes` was placed on `tier` at the request of job slot `slot`: it counts for
    /// that job only (`job::FILES_PLACED`/`BYTES_PLACED` in the table, and per tier here). A
    /// copy nobody asked for (slot 0: placed ahead of the program by the known-order policy)
    /// counts for every job attached to the table at that moment.
    pub fn credit_placement(&self, table: &granary_shm::Table, slot: u32, tier: usize, bytes: u64) {
        use granary_shm::job;
        let slots: Vec<u32> = if slot != 0 {
            vec![slot]
        } else {
            (1..table.job_slots())
                .filter(|s| {
                    table
                        .counter(*s, job::OWNER)
                        .is_some_and(|o| o.load(Ordering::Acquire) != 0)
                })
                .collect()
        };
        for s in slots {
            table.count(s, job::FILES_PLACED, 1);
            table.count(s, job::BYTES_PLACED, bytes);
            self.jobs.add(s, tier, bytes);
        }
    }

    pub fn snapshot(&self) -> PlacementStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PlacementStats {
            files_placed: l(&self.files_placed),
            bytes_placed: l(&self.bytes_placed),
            tier_files_placed: self.tier_files.iter().map(l).collect(),
            tier_bytes_placed: self.tier_bytes.iter().map(l).collect(),
            agent_source_opens: l(&self.source_opens),
            agent_source_reads: l(&self.source_reads),
            agent_source_bytes: l(&self.source_bytes),
            failures: l(&self.failures),
            stale: l(&self.stale),
            page_cache_bytes: l(&self.page_cache_bytes),
            duplicate_bytes: l(&self.duplicate_bytes),
            evictions: l(&self.evictions),
            prefetched: l(&self.prefetched),
            read_ahead: l(&self.read_ahead),
            no_room: l(&self.no_room),
            chunks_placed: l(&self.chunks_placed),
            chunk_bytes_placed: l(&self.chunk_bytes_placed),
            backoffs: l(&self.backoffs),
            mmap_read_ahead: l(&self.mmap_read_ahead),
            mmap_windows: l(&self.mmap_windows),
            lmdb_local_locks: l(&self.lmdb_local_locks),
            remote_files: l(&self.remote_files),
            remote_bytes: l(&self.remote_bytes),
            peer_files: l(&self.peer_files),
            peer_bytes: l(&self.peer_bytes),
            remote_fallbacks: l(&self.remote_fallbacks),
            staging_evictions: l(&self.staging_evictions),
        }
    }
}

/// A snapshot of `AgentCounters`; also the delta over one job (`since`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementStats {
    pub files_placed: u64,
    pub bytes_placed: u64,
    /// Per tier index (`MAX_TIERS` long).
    pub tier_files_placed: Vec<u64>,
    pub tier_bytes_placed: Vec<u64>,
    pub agent_source_opens: u64,
    pub agent_source_reads: u64,
    pub agent_source_bytes: u64,
    pub failures: u64,
    pub stale: u64,
    /// See `AgentCounters::page_cache_bytes` (absent in older agents' replies: 0).
    #[serde(default)]
    pub page_cache_bytes: u64,
    #[serde(default)]
    pub duplicate_bytes: u64,
    /// See `AgentCounters::evictions`, `prefetched` (known-order policy only).
    #[serde(default)]
    pub evictions: u64,
    #[serde(default)]
    pub prefetched: u64,
    /// See `AgentCounters::read_ahead`.
    #[serde(default)]
    pub read_ahead: u64,
    /// See the `AgentCounters` fields of the same names.
    #[serde(default)]
    pub no_room: u64,
    #[serde(default)]
    pub chunks_placed: u64,
    #[serde(default)]
    pub chunk_bytes_placed: u64,
    #[serde(default)]
    pub backoffs: u64,
    /// See `AgentCounters::mmap_read_ahead`, `mmap_windows`.
    #[serde(default)]
    pub mmap_read_ahead: u64,
    #[serde(default)]
    pub mmap_windows: u64,
    #[serde(default)]
    pub lmdb_local_locks: u64,
    /// Cluster mode (`AgentCounters` fields of the same names): copies received from and sent
    /// to other nodes, files that came from the source instead, staging copies dropped.
    #[serde(default)]
    pub remote_files: u64,
    #[serde(default)]
    pub remote_bytes: u64,
    #[serde(default)]
    pub peer_files: u64,
    #[serde(default)]
    pub peer_bytes: u64,
    #[serde(default)]
    pub remote_fallbacks: u64,
    #[serde(default)]
    pub staging_evictions: u64,
}

impl PlacementStats {
    pub fn since(&self, before: &PlacementStats) -> PlacementStats {
        let v = |a: &Vec<u64>, b: &Vec<u64>| {
            a.iter()
                .enumerate()
                .map(|(i, x)| x.saturating_sub(b.get(i).copied().unwrap_or(0)))
                .collect()
        };
        PlacementStats {
            files_placed: self.files_placed.saturating_sub(before.files_placed),
            bytes_placed: self.bytes_placed.saturating_sub(before.bytes_placed),
            tier_files_placed: v(&self.tier_files_placed, &before.tier_files_placed),
            tier_bytes_placed: v(&self.tier_bytes_placed, &before.tier_bytes_placed),
            agent_source_opens: self
                .agent_source_opens
                .saturating_sub(before.agent_source_opens),
            agent_source_reads: self
                .agent_source_reads
                .saturating_sub(before.agent_source_reads),
            agent_source_bytes: self
                .agent_source_bytes
                .saturating_sub(before.agent_source_bytes),
            failures: self.failures.saturating_sub(before.failures),
            stale: self.stale.saturating_sub(before.stale),
            page_cache_bytes: self
                .page_cache_bytes
                .saturating_sub(before.page_cache_bytes),
            duplicate_bytes: self.duplicate_bytes.saturating_sub(before.duplicate_bytes),
            evictions: self.evictions.saturating_sub(before.evictions),
            prefetched: self.prefetched.saturating_sub(before.prefetched),
            read_ahead: self.read_ahead.saturating_sub(before.read_ahead),
            no_room: self.no_room.saturating_sub(before.no_room),
            chunks_placed: self.chunks_placed.saturating_sub(before.chunks_placed),
            chunk_bytes_placed: self
                .chunk_bytes_placed
                .saturating_sub(before.chunk_bytes_placed),
            backoffs: self.backoffs.saturating_sub(before.backoffs),
            mmap_read_ahead: self.mmap_read_ahead.saturating_sub(before.mmap_read_ahead),
            mmap_windows: self.mmap_windows.saturating_sub(before.mmap_windows),
            lmdb_local_locks: self
                .lmdb_local_locks
                .saturating_sub(before.lmdb_local_locks),
            remote_files: self.remote_files.saturating_sub(before.remote_files),
            remote_bytes: self.remote_bytes.saturating_sub(before.remote_bytes),
            peer_files: self.peer_files.saturating_sub(before.peer_files),
            peer_bytes: self.peer_bytes.saturating_sub(before.peer_bytes),
            remote_fallbacks: self
                .remote_fallbacks
                .saturating_sub(before.remote_fallbacks),
            staging_evictions: self
                .staging_evictions
                .saturating_sub(before.staging_evictions),
        }
    }
}

/// What the catalog walk found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CatalogStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Sum of regular files' sizes.
    pub bytes: u64,
    /// Files whose copy from an earlier run was reused (size, mtime and object verified).
    pub reused_files: u64,
    pub reused_bytes: u64,
    /// Copies from an earlier run dropped at the walk because their contents (checksum) or size
    /// no longer matched: deleted, placed again on demand, never served.
    #[serde(default)]
    pub reuse_rejected: u64,
    /// Seconds the walk took (0 when the job joined a table another job already had).
    pub walk_s: f64,
    /// Directories or files the walk could not read; calls on them pass through.
    pub unreadable: u64,
    /// Entries taken over from the earlier catalog without a call on the source (checked by the
    /// background validation instead).
    #[serde(default)]
    pub carried: u64,
    /// Serving a pack (`granary run --pack`): regular files whose bytes come from the pack.
    #[serde(default)]
    pub pack_files: u64,
    /// Directories of the source checked against the pack's index (one `statx` each), and
    /// those whose names had changed (listed from the source).
    #[serde(default)]
    pub pack_dirs_checked: u64,
    #[serde(default)]
    pub pack_dirs_changed: u64,
    /// Regular files served from the source instead: changed since packing, or not in it.
    #[serde(default)]
    pub pack_source_files: u64,
}

/// One tier's line in the job report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierReport {
    pub index: usize,
    pub path: String,
    pub capacity: u64,
    /// Bytes of complete copies on the tier now (all sources), and reserved by copies in progress.
    pub used: u64,
    pub reserved: u64,
    /// Opens of this job's program served from the tier, and bytes it read from them.
    pub files_served: u64,
    pub bytes_served: u64,
    /// Files and bytes the agent placed on this tier during the job.
    pub files_placed: u64,
    pub bytes_placed: u64,
}

/// The program's traffic to the source (the PFS).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceReport {
    /// Opens of source files by the program (not served from a tier).
    pub opens: u64,
    pub reads: u64,
    pub bytes: u64,
    /// Metadata calls (stat, access, readdir, …) that went to the source.
    pub metadata_calls: u64,
}

/// What the job's programs read through mappings of catalogued files that were not all local
/// (`placement::mmap`), as the agent saw pages appear in their page tables: pages backed by
/// a tier file (`tier_bytes`), by the source (`source_bytes`), and of those the ones no read of
/// the agent had asked for first (`faulted_bytes`: the program's own faults; pages touched and
/// reclaimed between two looks are missed). `read_ahead_bytes`: what the agent read from the
/// source ahead of them (pages not cached when asked for), in `windows` windows.
/// `lmdb_local_locks`: opens of LMDB lock files given the node-local lock file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmapReport {
    pub tier_bytes: u64,
    pub source_bytes: u64,
    pub faulted_bytes: u64,
    pub read_ahead_bytes: u64,
    pub windows: u64,
    pub lmdb_local_locks: u64,
}

/// The report of one `granary run`, printed as a table on stderr and written by `--stats-json`.
///
/// JSON keys are stable (add, never rename); version 1:
/// ```json
/// {
///   "version": 1, "source": "/pfs/imagenet", "exit_status": 0, "wall_time_s": 12.5,
///   "disabled": false, "job_slot": 1,
///   "catalog": {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0, "reused_files": 0,
///               "reused_bytes": 0, "reuse_rejected": 0, "walk_s": 0.0, "unreadable": 0},
///   "opens": 0, "catalog_metadata_calls": 0, "fallbacks": 0,
///   "source_io": {"opens": 0, "reads": 0, "bytes": 0, "metadata_calls": 0},
///   "tiers": [{"index": 0, "path": "/dev/shm/granary/…", "capacity": 0, "used": 0, "reserved": 0,
///              "files_served": 0, "bytes_served": 0, "files_placed": 0, "bytes_placed": 0}],
///   "placement": {"files_placed": 0, "bytes_placed": 0, "tier_files_placed": [..8],
///                 "tier_bytes_placed": [..8], "agent_source_opens": 0, "agent_source_reads": 0,
///                 "agent_source_bytes": 0, "failures": 0, "stale": 0,
///                 "page_cache_bytes": 0, "duplicate_bytes": 0, "no_room": 0,
///                 "chunks_placed": 0, "chunk_bytes_placed": 0, "backoffs": 0},
///   "files_served_from_tiers": 0, "bytes_served_from_tiers": 0, "bytes_placed": 0,
///   "transient_drops": 0, "fallback": null, "warnings": [],
///   "mmap": {"tier_bytes": 0, "source_bytes": 0, "faulted_bytes": 0, "read_ahead_bytes": 0,
///            "windows": 0, "lmdb_local_locks": 0},
///   "cluster": null,
///   "pack_damage": null | {"pack": "/pfs/imagenet.granary", "files": 302,
///                          "problems": ["…/part-00000: corrupt pack: … (truncated): 302 files in it"],
///                          "index": false, "refused_opens": 0,
///                          "verify": "granary pack verify /pfs/imagenet.granary"}
/// }
/// ```
/// `opens` counts the program's opens of catalogued regular files; `source_io` what it did on
/// the source itself; `tiers[i].files_served/bytes_served` what the tiers served it;
/// `tiers[i].files_placed/bytes_placed` and `bytes_placed` the copies placed for this job (at
/// its processes' requests, and copies placed ahead of the access order while it was attached);
/// `placement` the agent's work on this source while the job ran (delta, shared by concurrent
/// jobs on the source) with the agent's own source traffic, except `files_placed`/`bytes_placed`
/// and `tier_*_placed`, which are this job's;
/// `transient_drops` the program's closes of transient copies whose pages were dropped
/// (page-cache residency).
/// Program-side counters are zero until the preload library counts them (or with
/// `GRANARY_DISABLE=1`, when `disabled` is true).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub version: u32,
    pub source: String,
    pub exit_status: i32,
    pub wall_time_s: f64,
    pub disabled: bool,
    pub job_slot: u32,
    pub catalog: CatalogStats,
    pub opens: u64,
    pub catalog_metadata_calls: u64,
    pub fallbacks: u64,
    pub source_io: SourceReport,
    pub tiers: Vec<TierReport>,
    pub placement: PlacementStats,
    pub files_served_from_tiers: u64,
    pub bytes_served_from_tiers: u64,
    pub bytes_placed: u64,
    #[serde(default)]
    pub transient_drops: u64,
    /// Why the program ran without granary (`disabled` is then true): `GRANARY_DISABLE`, a
    /// missing source, an agent that could not be reached, … `None` when granary served it.
    #[serde(default)]
    pub fallback: Option<String>,
    /// With `fallback`: what to do so that the next job is served.
    #[serde(default)]
    pub fix: Option<String>,
    /// Files the agent was still placing when the job ended (a first run: the next job finds
    /// them in the tiers).
    #[serde(default)]
    pub placing: u64,
    /// The pack the job was served from (`--pack`), if any.
    #[serde(default)]
    pub pack: Option<String>,
    /// What kept granary from serving all of the job, each with its cause and its fix: inside
    /// granary (a tier refused or lost, an agent that stopped answering) or around it (no
    /// process of the program loaded the library, a container hid a tier, the source or the
    /// catalog, a program started without granary's environment). Empty when all went well.
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub mmap: MmapReport,
    /// Cluster mode: which node of the serving job this job ran on (`None` on one node).
    #[serde(default)]
    pub cluster: Option<ClusterReport>,
    /// The pack served to the job (`--pack`) turned out damaged (also one of `warnings`).
    #[serde(default)]
    pub pack_damage: Option<PackDamage>,
}

/// A pack served to the job (`--pack`) that turned out damaged: which, how many of its files
/// could not be served from it, what is wrong, and the command that names every damaged file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackDamage {
    /// The pack directory.
    pub pack: String,
    /// Files of the pack that cannot be served from it (found so far: the agent streams the
    /// pack in the background): every file of a partition it refused (missing, cut, another
    /// pack's, its header damaged) and each file whose bytes failed their checksum. With the
    /// original tree they come from the source; with the pack alone (`--mount`) opening one
    /// fails with EIO — never wrong bytes.
    pub files: u64,
    /// What is wrong: refused partitions first, then damaged files (the first few).
    pub problems: Vec<String>,
    /// The index is damaged: no file can be served from the pack (`files` is every file when
    /// the index's header still says how many).
    #[serde(default)]
    pub index: bool,
    /// The job's opens of packed files that failed with EIO because the pack's bytes could not
    /// be checked (pack alone).
    #[serde(default)]
    pub refused_opens: u64,
    /// The command that names every damaged file.
    pub verify: String,
}

impl PackDamage {
    pub fn new(pack: &std::path::Path) -> PackDamage {
        PackDamage {
            pack: pack.display().to_string(),
            verify: format!("granary pack verify {}", pack.display()),
            ..Default::default()
        }
    }

    /// The job's warning: `mount` when only the pack holds the tree.
    pub fn warning(&self, mount: bool) -> String {
        let (it, they) = if self.files == 1 {
            ("it", "it")
        } else {
            ("them", "they")
        };
        let what = match (self.index, self.files, mount) {
            (true, _, false) => {
                "its index cannot be read, so no file can be served from it: every file came \
                 from the source (slower)"
                    .to_string()
            }
            (true, _, true) => "its index cannot be read, so no file can be served".to_string(),
            (false, n, true) => {
                let opens = match self.refused_opens {
                    0 => String::new(),
                    1 => " (1 open failed)".to_string(),
                    n => format!(" ({n} opens failed)"),
                };
                format!(
                    "{} cannot be read from it: opening {it} fails with EIO{opens}",
                    count(n)
                )
            }
            (false, n, false) => format!(
                "{} could not be read from it: {they} came from the source (slower)",
                count(n)
            ),
        };
        let first = self
            .problems
            .first()
            .map(|p| format!(" [{p}]"))
            .unwrap_or_default();
        format!(
            "pack {} is damaged: {what}{first}; `{}` names every damaged file; pack the source \
             again",
            self.pack, self.verify
        )
    }
}

fn count(files: u64) -> String {
    match files {
        0 => "some of its files".to_string(),
        1 => "1 file".to_string(),
        n => format!("{n} files"),
    }
}

/// The node of a cluster-mode job a `granary run` attached to; the traffic between nodes is in
/// `placement` (`remote_*`, `peer_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    pub rank: u32,
    pub ranks: u32,
}

impl JobReport {
    pub fn tier_reports(usage: &[TierUsage]) -> Vec<TierReport> {
        usage
            .iter()
            .enumerate()
            .map(|(i, u)| TierReport {
                index: i,
                path: u.path.display().to_string(),
                capacity: u.capacity,
                used: u.used,
                reserved: u.reserved,
                ..Default::default()
            })
            .collect()
    }

    /// The short table `granary run` prints on stderr: a first line that says whether granary
    /// served the job, then where the program's opens were served from (the rows add up to
    /// `opens`, but for opens that moved from the source to a copy as it landed), what was
    /// placed, and the catalog. Sizes in binary units throughout (`format_size`).
    pub fn render(&self) -> String {
        use crate::size::format_size as sz;
        let mut s = String::new();
        let source = if self.source.is_empty() {
            "(no source: no agent served one)"
        } else {
            &self.source
        };
        if self.disabled {
            s.push_str(&format!(
                "granary: NOT SERVED — {}{}\n",
                self.fallback.as_deref().unwrap_or("granary was disabled"),
                self.fix
                    .as_deref()
                    .map(|f| format!("; fix: {f}"))
                    .unwrap_or_default()
            ));
            s.push_str(&format!(
                "granary: {source} — exit {} in {:.2} s, read directly by the program\n",
                self.exit_status, self.wall_time_s
            ));
            self.render_warnings(&mut s);
            return s;
        }
        // Opens the library refused with EIO (a damaged pack) are opens of the job too.
        let refused = self.pack_damage.as_ref().map_or(0, |d| d.refused_opens);
        s.push_str(&format!(
            "granary: {source} — exit {} in {:.2} s; {} opens of dataset files\n",
            self.exit_status,
            self.wall_time_s,
            self.opens + refused
        ));
        let origin = match &self.pack {
            Some(_) => "the source or the pack".to_string(),
            None => format!("the source {source}"),
        };
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|t| format!("tier {} {} ({})", t.index, t.path, sz(t.capacity)))
            .collect();
        // The first column as wide as its longest label: paths differ in length.
        let w = tiers
            .iter()
            .map(|l| l.chars().count())
            .chain([origin.chars().count(), "served from".len()])
            .max()
            .unwrap_or(0);
        s.push_str(&format!(
            "  {:<w$} {:>9} {:>11}\n",
            "served from", "opens", "bytes read"
        ));
        for (t, label) in self.tiers.iter().zip(&tiers) {
            s.push_str(&format!(
                "  {:<w$} {:>9} {:>11}\n",
                label,
                t.files_served,
                sz(t.bytes_served)
            ));
        }
        s.push_str(&format!(
            "  {:<w$} {:>9} {:>11}   {} reads, {} metadata calls\n",
            origin,
            self.source_io.opens,
            sz(self.source_io.bytes),
            self.source_io.reads,
            self.source_io.metadata_calls
        ));
        if refused > 0 {
            s.push_str(&format!(
                "  {:<w$} {:>9} {:>11}   EIO: the pack is damaged (below)\n",
                "refused",
                refused,
                sz(0)
            ));
        }
        let p = &self.placement;
        s.push_str(&format!(
            "  placed for this job: {} files, {}",
            p.files_placed,
            sz(p.bytes_placed)
        ));
        if self.placing > 0 {
            s.push_str(&format!(
                "; {} more being placed in the background for the next job",
                self.placing
            ));
        }
        s.push('\n');
        if p.agent_source_opens + p.failures == 0 {
            s.push_str("  copied by the agent: nothing\n");
        } else {
            s.push_str(&format!(
                "  copied by the agent: {} files, {} ({} from {}, {} from the page cache), {} \
                 read twice, {} failures\n",
                p.agent_source_opens,
                sz(p.agent_source_bytes + p.page_cache_bytes),
                sz(p.agent_source_bytes),
                if self.pack.is_some() {
                    "the pack"
                } else {
                    "the source"
                },
                sz(p.page_cache_bytes),
                sz(p.duplicate_bytes),
                p.failures
            ));
        }
        if p.prefetched + p.evictions > 0 {
            s.push_str(&format!(
                "  known order: {} files placed ahead of the program, {} evicted\n",
                p.prefetched, p.evictions
            ));
        }
        if p.read_ahead > 0 {
            s.push_str(&format!(
                "  read ahead in name order: {} files placed before the program opened them\n",
                p.read_ahead
            ));
        }
        if p.chunks_placed + p.no_room + p.backoffs > 0 {
            s.push_str(&format!(
                "  files larger than the room left: {} chunks placed ({}); {} files with no \
                 room; {} backoffs\n",
                p.chunks_placed,
                sz(p.chunk_bytes_placed),
                p.no_room,
                p.backoffs
            ));
        }
        let m = &self.mmap;
        if m.tier_bytes + m.source_bytes + m.read_ahead_bytes + m.lmdb_local_locks > 0 {
            s.push_str(&format!(
                "  mapped: {} from tiers, {} from the source ({} faulted by the program), {} \
                 read ahead in {} windows\n",
                sz(m.tier_bytes),
                sz(m.source_bytes),
                sz(m.faulted_bytes),
                sz(m.read_ahead_bytes),
                m.windows
            ));
        }
        if m.lmdb_local_locks > 0 {
            s.push_str(&format!(
                "  LMDB: {} lock files opened node-local (the source's lock files untouched)\n",
                m.lmdb_local_locks
            ));
        }
        if let Some(c) = &self.cluster {
            s.push_str(&format!(
                "  other nodes (rank {} of {}): {} files ({}) received, {} ({}) sent, {} read \
                 from the source instead\n",
                c.rank,
                c.ranks,
                p.remote_files,
                sz(p.remote_bytes),
                p.peer_files,
                sz(p.peer_bytes),
                p.remote_fallbacks
            ));
            s.push_str(&format!(
                "  PFS bytes on this node: {} (program {} + agent {})\n",
                sz(self.source_io.bytes + p.agent_source_bytes),
                sz(self.source_io.bytes),
                sz(p.agent_source_bytes)
            ));
        }
        if self.transient_drops > 0 {
            s.push_str(&format!(
                "  page cache: {} reads of transient copies dropped after use (--page-cache)\n",
                self.transient_drops
            ));
        }
        s.push_str(&format!(
            "  catalog: {} files, {} dirs, {}; {} reused from an earlier run, {} rejected\n",
            self.catalog.files,
            self.catalog.dirs,
            sz(self.catalog.bytes),
            self.catalog.reused_files,
            self.catalog.reuse_rejected
        ));
        let c = &self.catalog;
        if c.pack_files + c.pack_dirs_checked > 0 {
            let damaged = match &self.pack_damage {
                Some(d) => format!("; DAMAGED: {} of its files cannot be read from it", d.files),
                None => String::new(),
            };
            s.push_str(&format!(
                "  pack: {} files catalogued from the pack, {} from the source; {} dirs checked, \
                 {} changed{damaged}\n",
                c.pack_files, c.pack_source_files, c.pack_dirs_checked, c.pack_dirs_changed
            ));
        }
        self.render_warnings(&mut s);
        s
    }

    fn render_warnings(&self, s: &mut String) {
        for w in &self.warnings {
            s.push_str(&format!("  warning: {w}\n"));
        }
    }
}
