//! The catalog: every path of a source with its `statx` record, placement state and tier.
//!
//! `walk` builds it from the source (taking over what an earlier table still vouches for),
//! `persist` saves it beside the cache and loads it back, and `validate` checks a reused catalog
//! against the source in the background of each attach; `xattr` records what the catalog may
//! answer of extended attributes.

pub mod persist;
pub mod validate;
pub mod walk;
pub mod xattr;

pub use persist::{
    adopt, image_bytes, load, open_saved, save, write_atomic, Expect, LoadError, Loaded,
};
pub use validate::Validation;
pub use walk::{walk, Prev, Progress, Walk, WalkError};
