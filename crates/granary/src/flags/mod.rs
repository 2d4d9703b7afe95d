//! The command line: clap's definitions of every command's flags (one module per command,
//! `tiers` for the flags several share) and, beside each, how its flags become the typed
//! configuration the libraries take (the agent's `AgentConfig`, cluster mode's `ServeConfig`).

pub mod container;
pub mod demo;
pub mod pack;
pub mod run;
pub mod serve;
pub mod tiers;

use clap::{Args, Parser, Subcommand};

/// Serve a training program's reads of a dataset from fast node-local tiers.
#[derive(Parser, Debug)]
#[command(name = "granary", version, about, long_about = None)]
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
    Status {
        /// Print the agent's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate a small dataset and compare a shuffled multi-epoch reader with and without granary.
    Demo(demo::DemoArgs),
    /// Pack a dataset into a few large partitions and an index; verify, ls, cat, diff a pack.
    Pack(pack::PackArgs),
    /// Print what a container needs to be served: the binds of the source, the tiers, the
    /// runtime directory and the preload library, the user and groups, and the job's variables.
    /// With the same --source/--tier/--config as the job:
    /// `granary run --source DIR -- docker run $(granary container-flags --source DIR) IMAGE CMD`
    /// (docs/containers.md).
    ContainerFlags(container::ContainerFlagsArgs),
    /// Cluster mode: one serving rank per node (started by srun or mpirun); every node's tiers
    /// become one cache of the dataset, read once from the source (needs the `mpi` build).
    #[command(after_help = serve::SERVE_EXAMPLES)]
    Serve(serve::ServeArgs),
    #[command(name = "__demo-reader", hide = true)]
    DemoReader(demo::DemoReaderArgs),
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub tiers: tiers::TierArgs,
}
