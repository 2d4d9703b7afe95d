//! `granary cache`'s flags: list the copies on this node (`granary cache`), remove some
//! (`granary cache clean`), re-read them (`granary cache verify`).

use std::path::PathBuf;

use clap::{ArgGroup, Args, Subcommand};

pub const CACHE_EXAMPLES: &str = "\
Examples:
  granary cache
      every source's copies on this node, per tier: files, bytes, last use, whether valid
  granary cache clean --older-than 7d
      remove the copies of sources no job used for a week
  granary cache clean --source /pfs/imagenet
      remove one dataset's copies, in every tier (also those served from its pack if you
      name the pack)
  granary cache verify
      re-read every copy against the checksum recorded when it was placed

A listing, one block per source (and pack), one line per tier:
  /pfs/imagenet
    tier /local/ssd/granary-me: 1281167 files, 140.2 GiB, last used 2 h ago: valid
    tier /dev/shm/granary-me: 61440 files, 6.9 GiB, last used 3 days ago: valid
\"valid\": recorded when placed and still the file recorded; `verify` also re-reads them and
asks the source. \"not recorded\": copies no record vouches for (an agent killed before it
saved), removed at the source's next job.

Tiers looked at: those --tier names (repeatable); else the configuration's (--config,
$GRANARY_CONFIG), the default tier, every tier this user's agents used on this machine
(~/.cache/granary/tiers) and the running agent's.

Copies are never removed because a job used other tiers, the agent restarted or the dataset was
read another way (plainly, --pack, --mount): those share one copy of each file. They go when a
file changes on the source, when the known-order policy needs room, or when you clean them.
A copy a job is being served from is never removed: with an agent running, clean asks it, and
it keeps the sources its jobs use (exit status 1 then).";

/// The copies on this node: list (the default), clean, verify.
#[derive(Args, Debug)]
#[command(after_help = CACHE_EXAMPLES)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub action: Option<CacheAction>,
    /// Print the listing as JSON.
    #[arg(long)]
    pub json: bool,
    /// Look only at this tier (PATH, or PATH=SIZE as given to `granary run`). Repeatable.
    #[arg(long = "tier", value_name = "PATH[=SIZE]", global = true)]
    pub tiers: Vec<String>,
    /// The configuration whose tiers to look at too (default: $GRANARY_CONFIG).
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CacheAction {
    /// Remove copies: of one source, of sources unused for a while, or all.
    #[command(
        group(ArgGroup::new("what").required(true).multiple(true)
            .args(["source", "older_than", "all"])),
        after_help = "\
Examples:
  granary cache clean --source /pfs/imagenet      that dataset's copies, in every tier
  granary cache clean --older-than 7d             sources no job used for a week
  granary cache clean --all --tier /dev/shm/g     everything in one tier
  granary cache clean --all --dry-run             say what would go, remove nothing

--source and --older-than together remove what matches both. Only directories granary made
(named <name>-<16 hex digits>, yours) are removed, never through a symlink. Sources a job is
using are kept and named; the exit status is then 1."
    )]
    Clean(CleanArgs),
    /// Re-read every recorded copy and check it against its checksum and the source.
    #[command(after_help = "\
Examples:
  granary cache verify
  granary cache verify --source /pfs/imagenet

Each copy is hashed whole (xxh3) and compared with the checksum recorded when it was placed; its
file on the source is checked to be the version it is a copy of (one metadata call each; a pack
mounted with --mount has no tree to ask). Nothing is changed: a wrong copy is never served (every
open checks it) and is replaced at the source's next job, or removed by `granary cache clean`.
Exit status: 0 when every copy is valid, 1 otherwise.")]
    Verify(VerifyArgs),
}

#[derive(Args, Debug)]
pub struct CleanArgs {
    /// The source's copies (the --source or --mount path a job used, or the pack).
    #[arg(long, value_name = "PATH")]
    pub source: Option<PathBuf>,
    /// Copies of sources no job used for this long (e.g. 12h, 7d).
    #[arg(long, value_name = "DURATION")]
    pub older_than: Option<String>,
    /// Every copy in the tiers looked at.
    #[arg(long, conflicts_with_all = ["source", "older_than"])]
    pub all: bool,
    /// Say what would be removed; remove nothing.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Only this source's copies (the --source or --mount path a job used, or the pack).
    #[arg(long, value_name = "PATH")]
    pub source: Option<PathBuf>,
}
