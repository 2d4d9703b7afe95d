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
//! - `source_ctx`: one published table as placement holds it (`SourceCtx`), what the other
//!   modules share, made of handles that functions take one by one: the `Table`, where its
//!   copies go (`space`), the work held for it (`work`), and the state of each helper below;
//!   cluster mode's hook (`Remote`); `params`: the engine's parameters. A helper whose state
//!   `SourceCtx` holds keeps that state, knowing nothing of `SourceCtx`, in a child file named
//!   after the type (`partial::partials`, `pack_streamer::streamer`, `known_order::prefetcher`,
//!   `ahead::name_order`, `mmap::follower`), and what works on it in the module itself;
//! - `requests`: acting on the requests clients push to a table's ring;
//! - `pool`: the worker threads and their queue; `engine`: what every job runs with (the
//!   parameters, the policy, the node-wide cap on source streams);
//! - `whole_file`: the whole-file fetch of a large file (`direct`: in one direct read; `order`:
//!   where it reads while programs map the file; `threshold`: which files are fetched whole);
//! - `page_cache_copy`: the copy of a small file the program read, from the page cache;
//! - `partial`, `chunks`: a file no tier has room for, kept as chunks (the chunk file format);
//! - `pack_streamer`, `unpack`: a packed source's partitions streamed into copies;
//! - `peer_copy`: copies whose bytes come from another node (cluster mode);
//! - `copy`: what those share (claiming, reserving, opening the source, publishing), `outcome`
//!   how each ended (`PlaceOutcome`), `buffers` the workers' aligned read buffers;
//!   `states`: the lifecycle steps that also move tier space;
//! - `policy`, `known_order`: where copies go, and the known-order policy's prefetcher;
//! - `ahead`: files fetched ahead of a program that opens a directory's files in name order;
//! - `residency`: which copies keep their pages in the page cache;
//! - `sweep`: the tiers' object directories kept to what the table names, copies re-hashed;
//! - `mmap`: following programs through their mappings and reading the source ahead of them.

pub mod ahead;
mod buffers;
pub mod chunks;
mod clock;
mod copy;
mod engine;
pub mod known_order;
pub mod mmap;
mod outcome;
pub mod pack_streamer;
mod page_cache_copy;
mod params;
mod partial;
pub mod peer_copy;
mod policy;
mod pool;
mod requests;
pub mod residency;
mod source_ctx;
mod space;
pub mod states;
pub mod sweep;
mod unpack;
pub mod whole_file;
mod work;

pub use copy::object_dir;
pub use engine::{Engine, Held, Stream, Streams};
pub use outcome::PlaceOutcome;
pub use params::{
    Params, DEFAULT_BLOCK_SIZE, DEFAULT_CHUNK_SIZE, DEFAULT_MAX_SOURCE_STREAMS,
    DEFAULT_PREFETCH_MIN_SIZE, DEFAULT_SMALL_COPY_DELAY,
};
pub use partial::{adopt_charges, copies_now, release_partial_charges, Partials};
pub use policy::{
    free_space, most_free, reserve_first, FillHighestFirst, KnownOrder, OrderState, Policy,
};
pub use pool::{default_workers, CopyMethod, CopyTask, Pool};
pub use requests::handle_request;
pub use source_ctx::{Remote, SourceCtx, BUSY_WINDOW};
pub use space::Space;
pub use whole_file::threshold::SourceRequests;
pub use work::Work;
