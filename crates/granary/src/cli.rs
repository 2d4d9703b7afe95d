use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Shown after `granary run --help`.
const RUN_EXAMPLES: &str = "\
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

The program keeps reading /pfs/imagenet as before. Later jobs on this node reuse what earlier ones
placed (validated by the source's identity and a checksum). `granary status` shows the agent, `granary stop`
ends it; it also exits by itself after --idle-timeout without jobs.";

/// Serve a training program's reads of a dataset from fast node-local tiers.
#[derive(Parser, Debug)]
#[command(name = "granary", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

/// Where to cache: shared by `run` and `agent`.
#[derive(Args, Debug, Clone, Default)]
pub struct TierArgs {
    /// A tier, fastest first: PATH or PATH=SIZE (e.g. /dev/shm/granary=8G). Repeatable.
    /// Default: a per-user directory on node-local storage, 90% of its free space.
    #[arg(long = "tier", value_name = "PATH[=SIZE]")]
    pub tiers: Vec<String>,
    /// TOML configuration (tiers, placement workers, agent idle timeout, logging).
    /// Default: $GRANARY_CONFIG.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Placement worker threads (default: from the core count).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Size of the agent's reads of the source (e.g. 8M; default 8M). Applies to an agent
    /// started by this command.
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Source reads the agent makes at once on this node, all jobs together (default 4).
    /// Applies to an agent started by this command.
    #[arg(long, value_name = "N")]
    pub max_source_streams: Option<usize>,
    /// Bytes of placed copies kept in the page cache: `auto` (default: what the memory limit
    /// of the agent's cgroup, or the node's memory, leaves for file pages, less a reserve),
    /// `off` (the kernel's LRU decides, as without granary) or a size (e.g. 200G). Copies
    /// beyond it are dropped from the page cache after each read, so a dataset larger than RAM
    /// misses only those instead of thrashing the cache. Applies to an agent started by this
    /// command. Config: `[placement] page_cache`.
    #[arg(long, value_name = "auto|off|SIZE")]
    pub page_cache: Option<String>,
    /// An agent exits after no job used it this long (e.g. 30s, 2m). Default 30s.
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a program with its reads of --source served from local tiers.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Run the node agent in the foreground (normally `granary run` starts it on demand).
    Agent(AgentArgs),
    /// Ask the running agent to save its catalogs and exit; waits until it is gone.
    Stop,
    /// Show the running agent: sources, tiers, files placed, jobs.
    Status {
        /// Print the agent's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate a small dataset and compare a shuffled multi-epoch reader with and without granary.
    Demo(DemoArgs),
    /// Pack a dataset into a few large partitions and an index; verify, ls, cat, diff a pack.
    Pack(crate::pack_cmd::PackArgs),
    /// Print what a container needs to be served: the binds of the source, the tiers, the
    /// runtime directory and the preload library, the user and groups, and the job's variables.
    /// With the same --source/--tier/--config as the job:
    /// `granary run --source DIR -- docker run $(granary container-flags --source DIR) IMAGE CMD`
    /// (docs/containers.md).
    ContainerFlags(crate::container::FlagsArgs),
    /// Cluster mode: one serving rank per node (started by srun or mpirun); every node's tiers
    /// become one cache of the dataset, read once from the source (needs the `mpi` build).
    #[command(after_help = crate::cluster::args::SERVE_EXAMPLES)]
    Serve(crate::cluster::ServeArgs),
    #[command(name = "__demo-reader", hide = true)]
    DemoReader(DemoReaderArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The dataset directory the program reads (on the shared file system). With --attach,
    /// the one the running agent serves.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present_any = ["mount", "attach"],
        conflicts_with = "mount"
    )]
    pub source: Option<PathBuf>,
    /// Serve the dataset from this pack (made by `granary pack`): every stat and listing comes
    /// from its index, and the agent streams its partitions into the tiers in large sequential
    /// reads. With --source, the tree is checked against the index per directory before the
    /// program starts (one metadata call each) and files changed since packing are read from it.
    #[arg(long, value_name = "PACK")]
    pub pack: Option<PathBuf>,
    /// Only the pack exists (e.g. copied to node-local scratch): PATH is where the program
    /// expects the tree, which granary serves from the pack alone (directories opened there are
    /// stand-ins: listings, stat and opens below them work, `chdir` into them does not).
    #[arg(long, value_name = "PATH", requires = "pack")]
    pub mount: Option<PathBuf>,
    /// Attach to the agent already running on this node (`granary serve`'s rank here) and
    /// never start one: without it the program runs without granary.
    #[arg(long, conflicts_with_all = ["pack", "mount"])]
    pub attach: bool,
    #[command(flatten)]
    pub tiers: TierArgs,
    /// The order the program opens its files, when it is known ahead (a file list, or one
    /// written from the shuffle seed): one path per line, relative to --source or absolute
    /// under it, `#` comments; list one epoch or all of them. Implies the known-order placement
    /// policy: the agent keeps the next --prefetch-window bytes of that order placed before the
    /// program asks, and to make room evicts only files the program already read this epoch.
    /// Lines naming no file of the source are reported, not fatal. Like --tier, it applies when
    /// no other job is using the source. Config: `[placement] policy = "known-order"`,
    /// `access_order = "FILE"`.
    #[arg(long, value_name = "FILE")]
    pub access_order: Option<PathBuf>,
    /// Bytes of upcoming files (in --access-order) kept placed ahead of the program (e.g. 10G;
    /// default 25% of the first tier). Config: `[placement] prefetch_window`.
    #[arg(long, value_name = "SIZE")]
    pub prefetch_window: Option<String>,
    /// Declare the dataset immutable: files are never changed in place, only added or removed.
    /// A job that finds the source's catalog from an earlier job then checks it with one
    /// metadata call per directory instead of one per file (a directory whose identity is
    /// unchanged vouches for its files). Like --tier, it applies when no other job is using the
    /// source. Config: `[catalog] immutable = true`.
    #[arg(long)]
    pub immutable: bool,
    /// Write the job's report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Do not print the report table or notes (warnings about what is wrong are still printed).
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub program: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub tiers: TierArgs,
}

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Number of files.
    #[arg(long, default_value_t = 160)]
    pub files: usize,
    /// Size of each file (e.g. 64K).
    #[arg(long, default_value = "640K")]
    pub size: String,
    /// Read a local directory even where a slow source could be emulated (as root, with cgroup
    /// v1 blkio and memory controllers and loop devices).
    #[arg(long)]
    pub no_emulation: bool,
    /// Epochs per reader run.
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    /// Directory for the dataset and the demo's tier (default: a temporary directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DemoReaderArgs {
    #[arg(long)]
    pub dataset: PathBuf,
    #[arg(long)]
    pub epochs: usize,
    #[arg(long)]
    pub seed: u64,
    /// Where to write per-epoch timings (JSON).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    if !matches!(cli.cmd, Command::Agent(_) | Command::Serve(_)) {
        crate::logging::init(None, None);
    }
    if matches!(
        cli.cmd,
        Command::Status { .. } | Command::Stop | Command::Demo(_) | Command::ContainerFlags(_)
    ) {
        crate::output::die_on_closed_pipe();
    }
    match cli.cmd {
        Command::Run(a) => crate::run::run(a),
        Command::Agent(a) => crate::agent::main(a),
        Command::Stop => crate::client::stop(),
        Command::Status { json } => crate::client::status(json),
        Command::Demo(a) => crate::demo::demo(a),
        Command::DemoReader(a) => crate::demo::reader(a),
        Command::Pack(a) => crate::pack_cmd::main(a),
        Command::ContainerFlags(a) => crate::container::flags(a),
        Command::Serve(a) => crate::cluster::main(a),
    }
}
