//! The catalog: every path of a source with its `struct stat`, placement state and tier.
//!
//! `walk` builds it from the source; `persist` saves and loads it beside the cache (as a table
//! image) and decides which copies from an earlier run are still valid (`reuse`).

pub mod persist;
pub mod walk;

pub use persist::{
    load_persisted, reuse, reuse_chunked, save, snapshot, write_atomic, Persisted, ReuseOutcome,
};
pub use walk::{walk, Progress, Walk, WalkError};
