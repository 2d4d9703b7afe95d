//! `granary serve`'s flags.

use std::path::PathBuf;

use clap::Args;

use crate::cli::TierArgs;

pub const SERVE_EXAMPLES: &str = "\
Examples (one serving rank per node, then the program on every node):
  srun --ntasks-per-node=1 granary serve --source /pfs/imagenet \\
       --tier /dev/shm/granary=32G --tier /local/granary=800G --replicate 'val/**' &
  srun granary run --attach -- python train.py
  mpirun -np 8 --map-by ppr:1:node granary serve --source /pfs/imagenet --replicas 2 &

A pack (granary pack): rank 0 reads its index, each rank streams its share of the pack:
  srun --ntasks-per-node=1 granary serve --source /pfs/imagenet --pack /pfs/imagenet.granary &
  srun --ntasks-per-node=1 granary serve --pack /pfs/imagenet.granary --mount /data/imagenet &

On one machine (tests), `{rank}` in $GRANARY_RUNTIME_DIR, --tier and --staging is the MPI rank:
  GRANARY_RUNTIME_DIR=/tmp/g/rt{rank} mpirun -np 3 --oversubscribe granary serve \\
       --source /data --tier /tmp/g/t{rank}=4G &
  GRANARY_RUNTIME_DIR=/tmp/g/rt1 granary run --attach -- python train.py   # as on rank 1's node

`granary status` on any node shows every rank; `granary stop` on any node stops them all.";

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// The dataset directory, at the same path on every node (the shared file system).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "mount",
        conflicts_with = "mount"
    )]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// Where copies of files other nodes hold go when a program here opens them: PATH[=SIZE].
    /// When full, the oldest are dropped. Default: `staging` in the first tier's directory,
    /// a quarter of that tier's size.
    #[arg(long, value_name = "PATH[=SIZE]")]
    pub staging: Option<String>,
    /// Nodes holding each file: the first reads it from the source, the others copy it from
    /// it at start and serve it when the first does not answer.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub replicas: u32,
    /// Files every node holds (a validation set): a glob relative to --source, or a
    /// directory, e.g. 'val/**' or val. Read from the source once, copied to every node at
    /// start. Repeatable. (A pack's files marked by `granary pack --replicate` are held by
    /// every node too.)
    #[arg(long, value_name = "GLOB")]
    pub replicate: Vec<String>,
    /// How long a node waits for another node's next message before it reads the source
    /// itself (and asks that node nothing until it is heard from again).
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub peer_timeout: String,
    /// Declare the dataset immutable: rank 0 checks a saved catalog by directory only.
    #[arg(long)]
    pub immutable: bool,
    /// Keep the CPU binding the MPI launcher gave this rank (by default the serving agent runs
    /// on every CPU its node allows it: a launcher binds a rank as it would a compute process,
    /// OpenMPI to one core when it starts two ranks or fewer).
    #[arg(long)]
    pub keep_binding: bool,
    /// Serve the dataset from this pack (made by `granary pack`, at the same path on every
    /// node): rank 0 reads its index (with --source, the tree is checked against it per
    /// directory), every rank gets the catalog, and each rank streams its share of the pack
    /// (runs of consecutive files spread over the ranks) from the shared file system — every
    /// byte once for the job — and sends those files to the others. Files changed since
    /// packing are read from --source.
    #[arg(long, value_name = "PACK")]
    pub pack: Option<PathBuf>,
    /// Only the pack exists: PATH is where the programs expect the tree, served from the pack
    /// alone (see `granary run --mount`).
    #[arg(long, value_name = "PATH", requires = "pack")]
    pub mount: Option<PathBuf>,
}

impl ServeArgs {
    /// The path the programs read (normalized), and the pack serving it (absolute) with
    /// whether only the pack exists; checked before MPI starts.
    pub fn served(&self) -> anyhow::Result<(PathBuf, Option<(PathBuf, bool)>)> {
        let path = match (&self.source, &self.mount) {
            (_, Some(m)) => granary_core::source::normalize(m)?,
            (Some(s), None) => granary_core::source::normalize(s)?,
            (None, None) => anyhow::bail!("--source DIR or --pack PACK --mount PATH is required"),
        };
        if self.mount.is_some() && path == std::path::Path::new("/") {
            anyhow::bail!("--mount /: choose the directory where the programs expect the dataset");
        }
        let Some(p) = &self.pack else {
            return Ok((path, None));
        };
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let index = p.join(granary_pack::format::INDEX_FILE);
        if !index.is_file() {
            anyhow::bail!(
                "pack {}: no index (make one with `granary pack SRC {}`)",
                p.display(),
                p.display()
            );
        }
        // (Whether --source is a directory is rank 0's to check: the others never look at it.)
        Ok((path, Some((p, self.mount.is_some()))))
    }
}

/// `{rank}` replaced by `rank` (several "nodes" on one machine).
pub fn for_rank(s: &str, rank: u32) -> String {
    s.replace("{rank}", &rank.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_paths_and_directories() {
        let s = replicate_set(&["val/**".into(), "test".into(), "x/*.jpg".into()]).unwrap();
        let m = |p: &str| super::super::replicated(&s, p.as_bytes());
        assert!(m("val/a/b.jpg") && m("val/c"));
        assert!(m("test/t1/img.png"), "a directory: everything under it");
        assert!(
            m("x/a.jpg") && !m("x/y/a.jpg"),
            "* stays within a directory"
        );
        assert!(!m("train/val/a") && !m("validation/a"));
        assert!(replicate_set(&["a[".into()]).is_err());
        assert_eq!(for_rank("/t/rt{rank}/x{rank}", 12), "/t/rt12/x12");
    }
}
