//! `granary serve`'s flags, and the `ServeConfig` they make: checked before MPI starts, so
//! every rank refuses a bad flag alike and none waits for another.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use granary_agent::cluster::{replicate_set, ServeConfig};

use super::tiers::TierArgs;

pub const SERVE_EXAMPLES: &str = "\
Examples (one serving rank per node, then the program on every node; a whole job script
is in docs/cluster.md, \"Slurm\"):
  srun --overlap --mpi=pmix --ntasks-per-node=1 granary serve --source /pfs/imagenet \\
       --tier /dev/shm/granary=32G --tier /local/granary=800G --replicate 'val/**' &
  srun --overlap granary run --attach -- python train.py    # waits for its node's rank
  mpirun -np 8 --map-by ppr:1:node granary serve --source /pfs/imagenet --replicas 2 &

A pack (granary pack): rank 0 reads its index, each rank streams its share of the pack:
  srun --overlap --mpi=pmix --ntasks-per-node=1 granary serve --source /pfs/imagenet \\
       --pack /pfs/imagenet.granary &
  srun --overlap --mpi=pmix --ntasks-per-node=1 granary serve --pack /pfs/imagenet.granary \\
       --mount /data/imagenet &

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
    /// Copy files other ranks on this host hold over MPI only (by default a rank reads such a
    /// copy straight from the other rank's memory, `process_vm_readv`, checked against the
    /// copy's checksum; ranks on other hosts are always reached over MPI).
    #[arg(long)]
    pub no_direct: bool,
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
    /// whether only the pack exists.
    fn served(&self) -> Result<(PathBuf, Option<(PathBuf, bool)>)> {
        let path = match (&self.source, &self.mount) {
            (_, Some(m)) => granary_core::source::normalize(m)?,
            (Some(s), None) => granary_core::source::normalize(s)?,
            (None, None) => bail!("--source DIR or --pack PACK --mount PATH is required"),
        };
        if self.mount.is_some() && path == std::path::Path::new("/") {
            bail!("--mount /: choose the directory where the programs expect the dataset");
        }
        let Some(p) = &self.pack else {
            return Ok((path, None));
        };
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let index = p.join(granary_pack::format::INDEX_FILE);
        if !index.is_file() {
            bail!(
                "pack {}: no index (make one with `granary pack SRC {}`)",
                p.display(),
                p.display()
            );
        }
        // (Whether --source is a directory is rank 0's to check: the others never look at it.)
        Ok((path, Some((p, self.mount.is_some()))))
    }

    /// One rank's configuration, `{rank}` still in its paths.
    pub fn serve_config(&self) -> Result<ServeConfig> {
        let replicate_set = replicate_set(&self.replicate)?;
        let peer_timeout = granary_core::size::parse_duration(&self.peer_timeout)
            .filter(|d| *d >= Duration::from_millis(50))
            .with_context(|| {
                format!(
                    "bad --peer-timeout `{}`: a duration like 1s",
                    self.peer_timeout
                )
            })?;
        if self.replicas == 0 {
            bail!("--replicas must be at least 1");
        }
        let (source, pack) = self.served()?;
        let cfg = self.tiers.config()?;
        let tiers = self.tiers.named(&cfg)?;
        let staging = self
            .staging
            .as_deref()
            .map(granary_core::config::parse_tier_flag)
            .transpose()?;
        Ok(ServeConfig {
            source,
            pack,
            tiers,
            staging,
            runtime_dir: std::env::var("GRANARY_RUNTIME_DIR")
                .ok()
                .filter(|d| !d.is_empty()),
            workers: self.tiers.workers.map(usize::from),
            replicas: self.replicas,
            replicate: self.replicate.clone(),
            replicate_set,
            peer_timeout,
            immutable: self.immutable,
            keep_binding: self.keep_binding,
            direct: !self.no_direct,
            progress_every: Some(crate::output::batch_every()),
            cfg,
        })
    }
}
