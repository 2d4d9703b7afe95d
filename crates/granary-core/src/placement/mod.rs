//! Placement: copying files from the source into a tier in the background (docs/placement.md).
//!
//! A request (a client opened an unplaced file) moves the entry UNPLACED → QUEUED and becomes a
//! `CopyTask`: a file at least as large as the table's whole-fetch size (`prefetch_min_size`, or
//! less on a source whose readahead makes the program's own reads cost more requests:
//! `whole_file::threshold`) is fetched whole by the agent at once (`whole_file`), a smaller one
//! is copied from the page cache once the program closed it (`page_cache_copy`). A worker moves
//! it QUEUED → PLACING, asks the `Policy` which tiers to try, reserves capacity, copies under a
//! temporary name, renames, and publishes PLACED. Every failure releases what it took and leaves
//! the entry served from the source.
//!
//! - `source_ctx`: one published table as placement sees it (`SourceCtx`), and the handles it
//!   is made of: where its copies go (`Space`), the work held for it (`Work`);
//! - `requests`: acting on the requests clients push to a table's ring;
//! - `pool`: the worker threads and their queue; `engine`: what every job runs with (the
//!   parameters, the policy, the node-wide cap on source streams);
//! - `whole_file`: the whole-file fetch of a large file (`direct`: in one direct read; `order`:
//!   where it reads while programs map the file; `threshold`: which files are fetched whole);
//! - `page_cache_copy`: the copy of a small file the program read, from the page cache;
//! - `partial`, `chunks`: a file no tier has room for, kept as chunks (the chunk file format);
//! - `pack_streamer`, `unpack`: a packed source's partitions streamed into copies;
//! - `peer_copy`: copies whose bytes come from another node (cluster mode);
//! - `copy`: what those share (claiming, reserving, opening the source, publishing);
//!   `states`: the lifecycle steps that also move tier space;
//! - `policy`, `known_order`: where copies go, and the known-order policy's prefetcher;
//! - `ahead`: files fetched ahead of a program that opens a directory's files in name order;
//! - `residency`: which copies keep their pages in the page cache;
//! - `mmap`: following programs through their mappings and reading the source ahead of them.

pub mod ahead;
pub mod chunks;
mod copy;
mod engine;
pub mod known_order;
pub mod mmap;
pub mod pack_streamer;
mod page_cache_copy;
mod partial;
pub mod peer_copy;
mod policy;
mod pool;
mod requests;
pub mod residency;
mod source_ctx;
pub mod states;
mod unpack;
pub mod whole_file;

pub use copy::{object_dir, PlaceOutcome};
pub use engine::{Engine, Held, Stream, Streams};
pub use partial::{adopt_charges, copies_now, release_partial_charges, Partials};
pub use peer_copy::Remote;
pub use policy::{
    free_space, most_free, reserve_first, FillHighestFirst, KnownOrder, OrderState, Policy,
};
pub use pool::{default_workers, CopyMethod, CopyTask, Pool};
pub use requests::handle_request;
pub use source_ctx::{SourceCtx, Space, Work, BUSY_WINDOW};
pub use whole_file::threshold::SourceRequests;

/// The placement engine's parameters (`[placement]` in the configuration), resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Size of the agent's reads of the source.
    pub block_size: u64,
    /// Source reads in flight at once, node-wide.
    pub max_source_streams: usize,
    /// Files at least this large are fetched whole by the agent from their first open (smaller
    /// ones too on a source with a small readahead: `SourceRequests::whole_fetch_from`);
    /// 0 = never (every file is copied from the page cache after the program read it).
    pub prefetch_min_size: u64,
    /// Chunk size of partial copies (0 = none).
    pub chunk_size: u64,
    /// A small file is copied this long after its open if no CLOSED arrived before.
    pub small_copy_delay: std::time::Duration,
}

/// Large reads reach a PFS's bandwidth limit where the program's 128–256 KiB reads hit its
/// per-request (IOPS) limit.
pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;
/// Per node: many nodes times many streams is what overwhelms a PFS (LMDBIO's staggering).
pub const DEFAULT_MAX_SOURCE_STREAMS: usize = 4;
pub const DEFAULT_PREFETCH_MIN_SIZE: u64 = 1 << 20;
pub const DEFAULT_CHUNK_SIZE: u64 = 4 << 20;
pub const DEFAULT_SMALL_COPY_DELAY: std::time::Duration = std::time::Duration::from_secs(2);

impl Default for Params {
    fn default() -> Params {
        Params {
            block_size: DEFAULT_BLOCK_SIZE,
            max_source_streams: DEFAULT_MAX_SOURCE_STREAMS,
            prefetch_min_size: DEFAULT_PREFETCH_MIN_SIZE,
            chunk_size: DEFAULT_CHUNK_SIZE,
            small_copy_delay: DEFAULT_SMALL_COPY_DELAY,
        }
    }
}

impl Params {
    /// The smallest file the agent fetches whole on the source at `path`, on device
    /// `major:minor` (0: none), for its table's header, where the preload library reads it too.
    /// The device comes from a record the caller has (no call on the source for it).
    pub fn whole_fetch_from(&self, path: &std::path::Path, dev: (u32, u32)) -> u64 {
        let src = SourceRequests::from_sysfs(std::path::Path::new("/sys"), dev.0, dev.1);
        let from = src.whole_fetch_from(self.prefetch_min_size, self.block_size);
        tracing::info!("{}: {}", path.display(), src.describe(from));
        from
    }
}
