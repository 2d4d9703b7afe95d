//! `granary demo`'s flags, and those of the reader it runs (`granary __demo-reader`).

use std::path::PathBuf;

use clap::Args;

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
