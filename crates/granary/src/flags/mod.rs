//! The command line: clap's definitions of every command's flags (one module per command,
//! `tiers` for the flags several share) and, beside each, how its flags become the typed
//! configuration the libraries take (the agent's `AgentConfig`, cluster mode's `ServeConfig`).

pub mod cache;
pub mod container;
pub mod demo;
pub mod pack;
pub mod run;
pub mod serve;
pub mod tiers;

use clap::{Args, Parser, Subcommand};

/// Shown after `granary --help`.
const EXAMPLES: &str = "\
Examples:
  granary demo
      see it work: a generated dataset read with and without granary (about a minute)
  granary run --source /pfs/imagenet -- python train.py
      the program reads /pfs/imagenet as before; later epochs and jobs read node-local copies
  granary run --strict --source /pfs/imagenet --tier /dev/shm/granary=8G -- torchrun train.py
      refuse to start the program if granary cannot serve it
  granary status          the node's agent: sources, tiers, copies, jobs (--json for scripts)
  granary stop            save the catalogs and stop the agent
  granary cache           the copies on this node per source and tier; `clean`, `verify`
  granary pack /pfs/imagenet /pfs/imagenet.granary
      millions of small files into a few large partitions, for the fastest first epoch

`granary COMMAND --help` says more; the README and docs/ of the source explain everything.";

/// Serve a training program's reads of a dataset from fast node-local tiers.
#[derive(Parser, Debug)]
#[command(
    name = "granary",
    version,
    about = "Serve a training program's reads of a dataset from fast node-local tiers: RAM, \
             local SSD. The program is not changed.",
    long_about = None,
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a program with its reads of --source served from local tiers.
    #[command(after_help = run::RUN_EXAMPLES)]
    Run(run::RunArgs),
    /// Run the node agent in the foreground (normally `granary run` starts it on demand).
    Agent(AgentArgs),
    /// Ask the running agent to save its catalogs and exit; waits until it is gone.
    Stop,
    /// Show the running agent: sources, tiers, files placed, jobs.
    Status(StatusArgs),
    /// Generate a small dataset and compare a shuffled multi-epoch reader with and without granary.
    Demo(demo::DemoArgs),
    /// Pack a dataset into a few large partitions and an index; verify, ls, cat, diff a pack.
    Pack(pack::PackArgs),
    /// The copies on this node, per source and tier: list them, clean some, verify them.
    Cache(cache::CacheArgs),
    /// Print the flags a container started by a daemon (docker, podman) needs to be served.
    ///
    /// The binds of the source, the tiers, the runtime directory and the preload library, the
    /// user and groups, and the job's variables. With the same --source/--tier/--config as the
    /// job: `granary run --source DIR -- docker run $(granary container-flags --source DIR)
    /// IMAGE CMD` (docs/containers.md).
    ContainerFlags(container::ContainerFlagsArgs),
    /// Cluster mode: one serving rank per node (started by srun or mpirun); every node's tiers
    /// become one cache of the dataset, read once from the source.
    ///
    /// Listed only in builds with MPI (`cargo build --release --features mpi`); elsewhere it
    /// says how to get one.
    #[command(after_help = serve::SERVE_EXAMPLES, hide = cfg!(not(feature = "mpi")))]
    Serve(serve::ServeArgs),
    #[command(name = "__demo-reader", hide = true)]
    DemoReader(demo::DemoReaderArgs),
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub tiers: tiers::TierArgs,
}

/// A line to add to clap's error when the mistake is a common one: a program given to `run`
/// without the `--` that separates it from granary's flags.
pub fn hint_for(e: &clap::Error, argv: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    use clap::error::ErrorKind;
    let argv: Vec<_> = argv.collect();
    let is_run = argv.get(1).is_some_and(|a| a == "run");
    let has_sep = argv.iter().any(|a| a == "--");
    let unexpected = matches!(
        e.kind(),
        ErrorKind::UnknownArgument | ErrorKind::InvalidSubcommand
    );
    (is_run && !has_sep && (unexpected || e.kind() == ErrorKind::MissingRequiredArgument)).then(
        || {
            "hint: put `--` between granary's flags and the program: \
             granary run --source DIR -- python train.py"
                .to_string()
        },
    )
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Print the agent's answer as JSON (`null` when no agent runs).
    #[arg(long)]
    pub json: bool,
    /// Also write the status as metrics to PATH (atomically), for node_exporter's textfile
    /// collector (Prometheus text format); with no agent running, `granary_agent_up 0`.
    #[arg(long, value_name = "PATH")]
    pub metrics_file: Option<std::path::PathBuf>,
}
