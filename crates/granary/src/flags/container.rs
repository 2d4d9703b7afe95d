//! `granary container-flags`'s flags.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Runtime {
    Docker,
    Podman,
    Apptainer,
}

#[derive(Args, Debug)]
pub struct ContainerFlagsArgs {
    /// The container runtime the flags are for.
    #[arg(long, value_enum, default_value = "docker")]
    pub runtime: Runtime,
    /// The dataset directory, as given to `granary run --source`.
    #[arg(long, value_name = "DIR")]
    pub source: PathBuf,
    /// The tiers, as given to `granary run --tier` (default: the configuration's, else the
    /// default tier).
    #[arg(long = "tier", value_name = "PATH[=SIZE]")]
    pub tiers: Vec<String>,
    /// The configuration, as given to `granary run --config` (default: $GRANARY_CONFIG).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}
