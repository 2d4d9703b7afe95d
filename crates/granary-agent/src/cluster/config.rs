//! What `granary serve` is started with (`ServeConfig`, resolved from its flags by the binary),
//! and the few rules that turn it into one rank's settings: `{rank}` in paths, the
//! `--replicate` globs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use granary_core::config::{Config, TierConfig};

/// One rank of the serving job, before MPI says which: paths may hold `{rank}` (several
/// "nodes" on one machine).
pub struct ServeConfig {
    /// The path the programs read (normalized): the source, or with `mount` where the
    /// programs expect the tree that exists only in the pack.
    pub source: PathBuf,
    /// The pack serving it (absolute) and whether only the pack exists (`--mount`).
    pub pack: Option<(PathBuf, bool)>,
    /// The configuration file and placement flags.
    pub cfg: Config,
    /// Tiers (flags, else the configuration's; empty: the default tier); `{rank}` in a path
    /// is the rank.
    pub tiers: Vec<TierConfig>,
    /// Where copies of other ranks' files go; `None`: `staging` in the first tier, a quarter
    /// of its size. `{rank}` in the path is the rank.
    pub staging: Option<TierConfig>,
    /// `$GRANARY_RUNTIME_DIR` with `{rank}` for the rank; `None`: the user's runtime
    /// directory.
    pub runtime_dir: Option<String>,
    /// Placement workers (`--workers`); `None`: a serving rank's default.
    pub workers: Option<usize>,
    /// Ranks holding each file (at least 1).
    pub replicas: u32,
    /// `--replicate` globs, as given and compiled (`replicate_set`).
    pub replicate: Vec<String>,
    pub replicate_set: globset::GlobSet,
    /// How long a rank waits for another's next message.
    pub peer_timeout: Duration,
    /// The dataset is immutable: rank 0 checks a saved catalog by directory only.
    pub immutable: bool,
    /// Keep the CPU binding the MPI launcher gave this rank.
    pub keep_binding: bool,
    /// Read the copies of ranks on this host directly (`cluster::direct`), not over MPI.
    pub direct: bool,
    /// How often the rank says on stderr how far it is in holding its share, until it holds
    /// it (a batch job's log); `None`: only the ready line.
    pub progress_every: Option<Duration>,
}

/// `{rank}` replaced by `rank` (several "nodes" on one machine).
pub fn for_rank(s: &str, rank: u32) -> String {
    s.replace("{rank}", &rank.to_string())
}

/// A path with `{rank}` replaced (a path that is not UTF-8 has no `{rank}` to replace).
pub(super) fn path_for_rank(p: &Path, rank: u32) -> PathBuf {
    match p.to_str() {
        Some(s) => PathBuf::from(for_rank(s, rank)),
        None => p.to_path_buf(),
    }
}

/// The `--replicate` globs, checked (before MPI starts, so every rank refuses alike).
pub fn replicate_set(globs: &[String]) -> anyhow::Result<globset::GlobSet> {
    let mut b = globset::GlobSetBuilder::new();
    for g in globs {
        let glob = globset::GlobBuilder::new(g.trim_end_matches('/'))
            .literal_separator(true)
            .build()
            .map_err(|e| anyhow::anyhow!("bad --replicate `{g}`: {e}"))?;
        b.add(glob);
    }
    b.build()
        .map_err(|e| anyhow::anyhow!("bad --replicate: {e}"))
}

/// True if `rel` (or a directory above it) matches a `--replicate` glob.
pub(super) fn replicated(set: &globset::GlobSet, rel: &[u8]) -> bool {
    if set.is_empty() {
        return false;
    }
    use std::os::unix::ffi::OsStrExt;
    let path = Path::new(std::ffi::OsStr::from_bytes(rel));
    path.ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .any(|p| set.is_match(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_paths_and_directories() {
        let s = replicate_set(&["val/**".into(), "test".into(), "x/*.jpg".into()]).unwrap();
        let m = |p: &str| replicated(&s, p.as_bytes());
        assert!(m("val/a/b.jpg") && m("val/c"));
        assert!(m("test/t1/img.png"), "a directory: everything under it");
        assert!(
            m("x/a.jpg") && !m("x/y/a.jpg"),
            "* stays within a directory"
        );
        assert!(!m("train/val/a") && !m("validation/a"));
        assert!(replicate_set(&["a[".into()]).is_err());
        assert_eq!(for_rank("/t/rt{rank}/x{rank}", 12), "/t/rt12/x12");
        assert_eq!(
            path_for_rank(Path::new("/t/{rank}/a"), 3),
            PathBuf::from("/t/3/a")
        );
    }
}
