//! The placement engine's parameters (`[placement]` in the configuration), resolved, with their
//! defaults: placement reads no configuration itself (`Params::from_config` is the
//! configuration's).

use super::whole_file::threshold::SourceRequests;

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
    /// A small file whose open was reported (`OPEN_UNPLACED`: the agent follows opens) is copied
    /// this long after it if no CLOSED arrived before; otherwise its CLOSED alone asks.
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
