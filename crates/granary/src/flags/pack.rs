//! `granary pack`'s flags: make a pack (`granary pack SRC OUT`) or read one
//! (`granary pack verify|ls|cat|diff`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Subcommand};

pub const PACK_EXAMPLES: &str = "\
Examples:
  granary pack /pfs/imagenet /pfs/imagenet.granary
      every file of the tree into ~1 GiB partitions plus an index, on every core
  granary pack /pfs/imagenet /pfs/imagenet.granary --partitions 8 --compress zstd:3
      8 partitions of balanced size; files (and 1 MiB frames) that do not shrink stay raw
  granary pack /pfs/imagenet /pfs/in.granary --files order.txt --replicate 'val/**'
      only the listed paths, stored in the listed order; val/ marked for every node
  granary pack verify /pfs/imagenet.granary /pfs/imagenet
  granary pack ls /pfs/imagenet.granary train/n01440764
  granary pack cat /pfs/imagenet.granary train/n01440764/img_1.JPEG > img.jpg
  granary pack diff /pfs/imagenet.granary /pfs/imagenet

The pack is written under a temporary name beside OUT and renamed when complete: an interrupted
pack (Ctrl-C, SIGTERM, SIGHUP) removes it and never leaves a pack that looks valid. The same tree always gives the same bytes.
`granary pack create SRC OUT` is the same as `granary pack SRC OUT` (for a SRC named like a tool).
The format is described in docs/pack-format.md.";

/// Pack a dataset into a few large partitions and an index, or inspect a pack.
#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = PACK_EXAMPLES
)]
pub struct PackArgs {
    #[command(subcommand)]
    pub tool: Option<Tool>,
    #[command(flatten)]
    pub create: CreateArgs,
}

#[derive(Subcommand, Debug)]
pub enum Tool {
    /// Pack SRC into OUT (what `granary pack SRC OUT` does).
    #[command(after_help = PACK_EXAMPLES)]
    Create(CreateArgs),
    /// Check every checksum of a pack; with SRC, also compare every file with the source.
    #[command(after_help = "\
Examples:
  granary pack verify /pfs/imagenet.granary
      index, partition headers, every file's and symlink's checksum, partitions fully covered
  granary pack verify /pfs/imagenet.granary /pfs/imagenet
      also compares each file byte for byte with the file it was packed from

Output: one line per problem on stdout, each damaged file named once (`path: what`); a partition
that cannot be used is one line, and each of its files a line of its own. A summary on stderr.
Exit status: 0 when everything holds, 1 when the pack is damaged or differs from SRC, 2 when
PACK is not a pack or SRC cannot be read (usage errors).")]
    Verify(VerifyArgs),
    /// List a directory of a pack like `ls -l`, from the index alone.
    #[command(after_help = "\
Examples:
  granary pack ls /pfs/imagenet.granary                 the pack's top directory
  granary pack ls /pfs/imagenet.granary train/n01440764 one directory
  granary pack ls -R /pfs/imagenet.granary              every entry, with its path
  granary pack ls -d /pfs/imagenet.granary train        the directory itself

Columns: mode, links, uid, gid, size, mtime (UTC), name (`-> target` for symlinks). Control
characters and bytes that are not UTF-8 are shown as backslash escapes, like `ls -b`.
Exit status: 0, 1 when the index is damaged, 2 when PACK is not a pack or PATH not in it.")]
    Ls(LsArgs),
    /// Write files of a pack to stdout, checked against their checksums first.
    #[command(after_help = "\
Examples:
  granary pack cat /pfs/imagenet.granary train/n01440764/img_1.JPEG > img.jpg
  granary pack cat /pfs/imagenet.granary labels.txt synsets.txt | wc -l

Symlinks inside the pack are followed; one pointing outside it is an error. A damaged file is an
error, never wrong bytes: nothing of it is written.
Exit status: 0, 1 when a file is damaged in the pack, 2 when PACK is not a pack or a PATH is not
a file in it.")]
    Cat(CatArgs),
    /// List what changed in the source since it was packed (added, removed, modified).
    #[command(after_help = "\
Examples:
  granary pack diff /pfs/imagenet.granary /pfs/imagenet
  granary pack diff /pfs/imagenet.granary /pfs/imagenet | grep '^M'

Output: `A path` added, `D path` removed, `M path (fields)` another version (inode, size, mtime,
ctime, type or symlink target differ). A directory whose inode, mtime and ctime are unchanged is
not listed again (only its entries are stat'ed); no file is read. The older order, SRC PACK, is
still understood (only the pack has an index).
Exit status: 0 when nothing changed, 1 when something did, 2 on errors (PACK not a pack, its
index damaged, SRC unreadable).")]
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The directory to pack.
    #[arg(required = true, value_name = "SRC")]
    pub src: Option<PathBuf>,
    /// The pack directory to create (must not exist, unless --force).
    #[arg(required = true, value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Number of partitions, balanced by size (at most one per file).
    #[arg(long, value_name = "N", conflicts_with = "partition_size")]
    pub partitions: Option<u32>,
    /// Largest partition (e.g. 1G, the default); sets the number of partitions.
    #[arg(long, value_name = "SIZE")]
    pub partition_size: Option<String>,
    /// none, lz4, zstd or zstd:LEVEL (1-22). Per 1 MiB frame, what does not shrink is stored raw.
    #[arg(long, value_name = "CODEC", default_value = "none")]
    pub compress: String,
    /// Pack only these paths, in this order: one per line (or NUL-separated), relative to SRC
    /// or absolute below it; a directory brings its whole subtree.
    #[arg(long, value_name = "LIST")]
    pub files: Option<PathBuf>,
    /// Mark paths matching this glob (e.g. 'val/**') to be kept by every node in cluster
    /// mode. Repeatable.
    #[arg(long, value_name = "GLOB")]
    pub replicate: Vec<String>,
    /// Reader/compressor threads (default: twice the cores, at least 4).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Replace OUT if it exists (the old pack stays in place until the new one is complete).
    #[arg(long)]
    pub force: bool,
    /// Do not fsync the pack before publishing it.
    #[arg(long)]
    pub no_sync: bool,
    /// No progress bar and no summary.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The pack directory (holding `index` and `part-NNNNN`).
    #[arg(value_name = "PACK")]
    pub pack: PathBuf,
    /// Also compare every file with this source directory, byte for byte.
    #[arg(value_name = "SRC", conflicts_with = "source")]
    pub src: Option<PathBuf>,
    /// The same as SRC (the older spelling).
    #[arg(long, value_name = "SRC", hide = true)]
    pub source: Option<PathBuf>,
    /// No progress bar and no summary (problems are still printed).
    #[arg(long, short)]
    pub quiet: bool,
}

impl VerifyArgs {
    pub fn source(&self) -> Option<&std::path::Path> {
        self.src.as_deref().or(self.source.as_deref())
    }
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// The pack directory.
    #[arg(value_name = "PACK")]
    pub pack: PathBuf,
    /// A path inside the pack (default: its root).
    #[arg(value_name = "PATH")]
    pub path: Option<OsString>,
    /// Every entry below PATH, each with its path.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// The directory itself, not its contents.
    #[arg(short, long)]
    pub directory: bool,
}

#[derive(Args, Debug)]
pub struct CatArgs {
    /// The pack directory.
    #[arg(value_name = "PACK")]
    pub pack: PathBuf,
    /// Files inside the pack, relative to its root; written in this order.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The pack directory.
    #[arg(value_name = "PACK")]
    pub pack: PathBuf,
    /// The directory it was packed from.
    #[arg(value_name = "SRC")]
    pub src: PathBuf,
}
