//! What `granary status` and a job's report show of a cluster-mode agent (`granary serve`).

use granary_core::size::format_size;
use serde::{Deserialize, Serialize};

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
    /// else having it open (cluster/staging.rs).
    #[serde(default)]
    pub staging_recycled: u64,
    /// Staging files made ahead and ready for a copy now, and their bytes.
    #[serde(default)]
    pub staging_free_files: u64,
    #[serde(default)]
    pub staging_free_bytes: u64,
    /// Files and bytes this rank holds of the dataset (as first owner or replica), all ranks
    /// together: the dataset as dealt out.
    pub files_owned: u64,
    pub bytes_owned: u64,
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
}

/// `granary status`'s lines for the cluster.
pub fn print(c: &ClusterStatus, out: &mut dyn FnMut(&str)) {
    out(&format!(
        "cluster: rank {} of {} serving {}{}{}; held here: {} files ({}); replicas {}{}{}",
        c.rank,
        c.ranks,
        c.source.display(),
        match &c.pack {
            Some(p) if c.mount => format!(" from pack {} (only the pack exists)", p.display()),
            Some(p) => format!(" from pack {}", p.display()),
            None => String::new(),
        },
        if c.ready {
            ""
        } else {
            " (waiting for the catalog)"
        },
        c.files_owned,
        format_size(c.bytes_owned),
        c.replicas,
        if c.replicate.is_empty() {
            String::new()
        } else {
            format!(", on every rank: {}", c.replicate.join(" "))
        },
        if c.copies_pending > 0 {
            format!(", {} copies still to make", c.copies_pending)
        } else {
            String::new()
        }
    ));
    for p in &c.peers {
        let (alive, silent, p_rank) = (p.alive, p.silent_ms, p.rank);
        let p = &p.numbers;
        out(&format!(
            "  rank {}: {}, holds {} files ({}), staged {}; from others {} ({}), to others {} \
             ({}); PFS {}, from the source instead {}; {} job(s)",
            p_rank,
            match (alive, silent) {
                (true, _) => "alive".to_string(),
                (false, Some(ms)) => format!("silent for {:.1} s", ms as f64 / 1000.0),
                (false, None) => "written off".to_string(),
            },
            p.files_held,
            format_size(p.bytes_held),
            format_size(p.bytes_staged),
            p.remote_files,
            format_size(p.remote_bytes),
            p.peer_files,
            format_size(p.peer_bytes),
            format_size(p.pfs_bytes),
            p.fallbacks,
            p.jobs
        ));
    }
}
