//! The catalog table shared by the node agent (writer) and the preload library (reader).
//!
//! See `layout` for the format. The API is allocation-free and lock-free on the reading side, so
//! it is safe to call from inside interposed libc calls.

pub mod build;
pub mod layout;
pub mod lifecycle;
pub mod mapping;
mod random;
pub mod region;
pub mod resolve;
mod ring;
pub mod shard;
pub mod state;
pub mod table;
pub mod xattr;

pub use build::{
    build, build_catalog, build_into, image_len, image_source_real, rebase, BuildError, Catalog,
    CatalogEntry, Node, PackSpec, TableSpec,
};
pub use layout::{
    chunk_count, chunk_data_offset, chunks_name, groups_hash, job, object_id, object_name,
    parse_object_name, part_name, path_check, path_hash, request, seen, DiskEntry, EntryRec,
    Locator, StatClass, StatRec, Ts,
};
pub use mapping::{MapError, Mapping};
pub use resolve::{resolve, strip_root, FileHit, Found, Miss, Resolved};
pub use shard::set_counter_shard;
pub use state::{State, StateWord};
pub use table::{CopyHint, Request, Table, TableError, Unserved};

/// The largest file the agent fetches whole in one direct read, not through the page cache (a
/// mid-size file: one device request instead of one per `max_segments` scattered pages). A
/// program mapping such a file while it is fetched would fault the source's pages itself, so the
/// library's `mmap` waits for its copy (one request long) instead of mapping the source.
pub const DIRECT_FETCH_MAX: u64 = 1 << 20;

#[cfg(test)]
mod tests;
