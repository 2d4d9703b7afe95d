//! `granary run`'s flags, and the checks on them made before anything starts: which path the
//! program reads and which pack serves it, the placement policy, a tier inside the dataset.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use granary_core::config::{default_tier, Config, PolicyKind};
use granary_core::placement::known_order::OrderSpec;

use super::tiers::TierArgs;

/// Shown after `granary run --help`.
pub const RUN_EXAMPLES: &str = "\
Examples:
  granary run --source /pfs/imagenet -- python train.py
      default tier: a per-user directory on node-local storage, 90% of its free space
  granary run --source /pfs/imagenet --tier /dev/shm/granary=8G --tier /local/ssd/granary=400G \\
      --stats-json stats.json -- torchrun --nproc-per-node 4 train.py
      RAM first, then SSD; every rank and DataLoader worker shares one node agent
  GRANARY_DISABLE=1 granary run --source /pfs/imagenet -- python train.py
      the same job without interception, for comparison
  granary run --source /pfs/imagenet --pack /pfs/imagenet.granary -- python train.py
      stat and listings from the pack's index (no call on /pfs/imagenet after the start), the
      agent streams the pack's partitions into the tiers; what changed since packing comes from
      /pfs/imagenet
  granary run --pack /scratch/imagenet.granary --mount /pfs/imagenet -- python train.py
      only the pack exists here: the program reads /pfs/imagenet/... from it

The program keeps reading /pfs/imagenet as before. Later jobs on this node reuse what earlier
ones placed (checked against the source's identity). `granary status` shows the agent, `granary
stop` ends it; it also exits by itself after --idle-timeout without jobs. Exit status: the
program's (128 + N if a signal N ended it); 2 for granary's own usage errors, before the program
starts; 69 with --strict when granary cannot serve the job (the program did not run).";

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The dataset directory the program reads (on the shared file system).
    ///
    /// With --attach, the one the running agent serves (default: the only one it serves).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["mount", "attach"],
        conflicts_with = "mount"
    )]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// Write the job's report as JSON to FILE (checked before the program starts).
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Print only warnings, not the report table or notes.
    #[arg(long, short)]
    pub quiet: bool,
    /// Refuse to run the program when granary cannot serve it (exit 69).
    ///
    /// A missing source, an unusable tier, an agent that cannot start, GRANARY_DISABLE, …: the
    /// cause and its fix are printed and the program is not started. Without it such a job runs
    /// without granary and its report says why on its first line. Also GRANARY_STRICT=1.
    #[arg(long)]
    pub strict: bool,
    /// Serve the dataset from this pack (made by `granary pack`).
    ///
    /// Every stat and listing comes from its index, and the agent streams its partitions into
    /// the tiers in large sequential reads. With --source, the tree is checked against the index
    /// per directory before the program starts (one metadata call each) and files changed
    /// since packing are read from it.
    #[arg(long, value_name = "PACK", help_heading = "Packs and cluster mode")]
    pub pack: Option<PathBuf>,
    /// Only the pack exists: serve it where the program expects the tree (PATH).
    ///
    /// E.g. a pack copied to node-local scratch. Directories opened there are stand-ins:
    /// listings, stat and opens below them work, `chdir` into them does not.
    #[arg(
        long,
        value_name = "PATH",
        requires = "pack",
        help_heading = "Packs and cluster mode"
    )]
    pub mount: Option<PathBuf>,
    /// Attach to the agent `granary serve` runs on this node; never start one.
    ///
    /// Without a serving agent here the program runs without granary (or, with --strict, not
    /// at all).
    #[arg(
        long,
        conflicts_with_all = ["pack", "mount"],
        help_heading = "Packs and cluster mode"
    )]
    pub attach: bool,
    /// With --attach: how long to wait for this node's agent to start (default 120s).
    ///
    /// The steps of a Slurm job start together: the program waits (bounded) until its node's
    /// serving rank is ready, then runs without granary. Default `$GRANARY_ATTACH_WAIT`, else
    /// 120s; 0 does not wait.
    #[arg(
        long,
        value_name = "DURATION",
        requires = "attach",
        help_heading = "Packs and cluster mode"
    )]
    pub attach_wait: Option<String>,
    /// The order the program will open its files (a file list): placed ahead of it.
    ///
    /// One path per line, relative to --source or absolute under it, `#` comments; list one
    /// epoch or all of them (a list written from the shuffle seed). Implies the known-order
    /// placement policy: the agent keeps the next --prefetch-window bytes of that order placed
    /// before the program asks, and to make room evicts only files the program already read
    /// this epoch. Lines naming no file of the source are reported, not fatal. Like --tier, it
    /// applies when no other job is using the source. Config: `[placement] policy =
    /// "known-order"`, `access_order = "FILE"`.
    #[arg(long, value_name = "FILE", help_heading = "Placement tuning")]
    pub access_order: Option<PathBuf>,
    /// Bytes of upcoming files (in --access-order) kept placed ahead (default 25% of tier 0).
    ///
    /// E.g. 10G. Config: `[placement] prefetch_window`.
    #[arg(long, value_name = "SIZE", help_heading = "Placement tuning")]
    pub prefetch_window: Option<String>,
    /// The dataset's files are never changed in place: a later job checks it per directory.
    ///
    /// A job that finds the source's catalog from an earlier job then checks it with one
    /// metadata call per directory instead of one per file (a directory whose identity is
    /// unchanged vouches for its files). Like --tier, it applies when no other job is using the
    /// source. Config: `[catalog] immutable = true`.
    #[arg(long, help_heading = "Placement tuning")]
    pub immutable: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub program: Vec<std::ffi::OsString>,
}

impl RunArgs {
    /// With --attach, how long to wait for the node's agent: `--attach-wait`, else
    /// `$GRANARY_ATTACH_WAIT`, else 120 s; `None` without --attach.
    pub fn attach_wait(&self) -> Result<Option<std::time::Duration>> {
        if !self.attach {
            return Ok(None);
        }
        let (v, from) = match (&self.attach_wait, std::env::var("GRANARY_ATTACH_WAIT")) {
            (Some(v), _) => (v.clone(), "--attach-wait"),
            (None, Ok(v)) if !v.is_empty() => (v, "GRANARY_ATTACH_WAIT"),
            _ => return Ok(Some(std::time::Duration::from_secs(120))),
        };
        granary_core::size::parse_duration(&v)
            .map(Some)
            .with_context(|| format!("bad {from} `{v}`: a duration like 120s or 5m"))
    }

    /// The path the program reads: `--source` (a directory that must exist) or `--mount` (where
    /// the program expects a tree that exists only in the pack), lexically normalised.
    pub fn target(&self) -> Result<PathBuf> {
        if let Some(m) = &self.mount {
            let m = granary_core::source::normalize(m)?;
            if m == Path::new("/") {
                bail!("--mount /: choose the directory where the program expects the dataset");
            }
            if std::env::var_os("GRANARY_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
                eprintln!(
                    "granary: GRANARY_DISABLE is set: {} exists only in the pack, the program will \
                     not find it",
                    m.display()
                );
            }
            return Ok(m);
        }
        let Some(src) = &self.source else {
            bail!("--source DIR or --pack PACK --mount PATH is required");
        };
        let source = granary_core::source::normalize(src)?;
        // Without a pack, a missing source runs the program without granary (`run`), as any other
        // reason granary cannot serve; with one, the user meant `--mount`.
        if !source.is_dir() && self.pack.is_some() {
            bail!(
                "source {} is not a directory; to serve the pack alone there, use --mount {} \
                 instead of --source",
                source.display(),
                source.display()
            );
        }
        Ok(source)
    }

    /// `--pack`, absolute, checked to look like a pack (its index is read by the agent).
    pub fn pack_dir(&self) -> Result<Option<PathBuf>> {
        let Some(p) = &self.pack else {
            return Ok(None);
        };
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let index = p.join(granary_pack::format::INDEX_FILE);
        std::fs::metadata(&index).with_context(|| {
            format!(
                "pack {}: no index (make one with `granary pack SRC {}`)",
                p.display(),
                p.display()
            )
        })?;
        Ok(Some(p))
    }

    /// The job's placement policy: `--access-order` (implies known-order) or the configuration's
    /// `[placement] policy`; `None` is fill-highest-first. Errors name the key or flag, in one line.
    pub fn order_spec(&self, cfg: &Config) -> Result<Option<OrderSpec>> {
        let window = match &self.prefetch_window {
            Some(w) => Some(
                granary_core::size::parse_size(w)
                    .filter(|v| *v > 0)
                    .with_context(|| {
                        format!("bad --prefetch-window `{w}`: expected a non-zero size like 2G")
                    })?,
            ),
            None => cfg.prefetch_window,
        };
        let file = match (&self.access_order, cfg.policy.unwrap_or_default()) {
            (Some(f), _) => f.clone(),
            (None, PolicyKind::KnownOrder) => cfg.access_order.clone().context(
                "config: `placement.access_order` is required with policy = \"known-order\" \
                 (or pass --access-order FILE)",
            )?,
            (None, PolicyKind::FillHighestFirst) => {
                if self.prefetch_window.is_some() {
                    bail!("--prefetch-window needs --access-order FILE (the known-order policy)");
                }
                return Ok(None);
            }
        };
        // The agent reads it (it may run in another directory): absolute, and readable now, so a
        // typo is the user's one-line error rather than a job silently run without granary.
        let file = std::path::absolute(&file).unwrap_or(file);
        std::fs::File::open(&file)
            .with_context(|| format!("access order {} (placement.access_order)", file.display()))?;
        Ok(Some(OrderSpec {
            access_order: file,
            prefetch_window: window,
        }))
    }

    /// Why a tier of the job (flag, config or default) lies inside `source`, if one does.
    pub fn tier_inside(&self, cfg: &Config, source: &Path) -> Option<String> {
        let mut tiers = self.tiers.named(cfg).ok()?;
        if tiers.is_empty() {
            tiers.push(default_tier().ok()?);
        }
        let source_real = std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
        tiers
            .iter()
            .find(|t| granary_core::source::contains(source, &source_real, &t.path))
            .map(|t| {
                format!(
                    "tier {} is inside the source {}: choose a tier outside the dataset",
                    t.path.display(),
                    source.display()
                )
            })
    }
}
