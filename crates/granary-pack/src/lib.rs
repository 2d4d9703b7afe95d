//! granary packs (docs/pack-format.md): a dataset's files stored in a few large partitions,
//! with every path's metadata, location and checksum in one index that can be used straight
//! from a mapping. Packing reads, checksums and compresses on every core and publishes the
//! pack with one rename; reading never hands out a byte its checksum does not vouch for.

pub mod codec;
pub mod diff;
pub mod error;
pub mod format;
pub mod index;
pub mod listing;
pub mod locate;
pub mod partition;
pub mod reader;
mod sys;
pub mod verify;
pub mod writer;

pub use codec::Compression;
pub use error::{PackError, Result};
pub use index::Index;
pub use reader::Pack;
pub use writer::{pack, Options, Progress, Summary};

/// Maps the index of the pack directory `dir` and checks it (the way a server loads it: no
/// copy, no decoding beyond one validating pass). A `dir` that is no pack is
/// `PackError::NotAPack` (`locate::open_index`).
pub fn map_index(dir: &std::path::Path) -> Result<Index<memmap2::Mmap>> {
    let (path, f) = locate::open_index(dir)?;
    let m = sys::map_file(&f).map_err(|e| PackError::io(&path, e))?;
    Index::parse(m, &path)
}
