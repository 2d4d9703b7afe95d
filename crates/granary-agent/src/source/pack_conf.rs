//! Which pack a source is served from (`PackConf`), and the agent's key for a source
//! (`source_key`): its path, or its path and its pack's.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The pack a source is served from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackConf {
    /// The pack directory (canonical).
    pub dir: PathBuf,
    /// Only the pack exists: the source path names where the program expects the tree.
    pub mount: bool,
}

/// The agent's key for a source: its path, or for a packed source its path and the pack's
/// (a NUL between them, which no path contains), so one path may be served plainly and from
/// a pack by different jobs.
pub fn source_key(source: &Path, pack: Option<&Path>) -> PathBuf {
    match pack {
        None => source.to_path_buf(),
        Some(p) => {
            let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            let mut b = source.as_os_str().as_bytes().to_vec();
            b.push(0);
            b.extend_from_slice(p.as_os_str().as_bytes());
            PathBuf::from(OsString::from_vec(b))
        }
    }
}
