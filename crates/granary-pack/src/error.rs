//! One error type for packing and reading: every failure names the file and what was wrong,
//! so a user can tell a damaged pack from a bad argument or a changing source.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The pack's bytes are not what the format allows (damaged, truncated or hostile).
    #[error("{path}: corrupt pack: {what}")]
    Corrupt { path: PathBuf, what: String },
    /// A pack written by a newer, incompatible granary.
    #[error("{path}: pack format {major}.{minor} is not supported by this granary (reads {supported}.x)")]
    Version {
        path: PathBuf,
        major: u16,
        minor: u16,
        supported: u16,
    },
    #[error("{0}: not in the pack")]
    NotFound(String),
    /// The source changed between the walk and the read of a file.
    #[error("{path}: changed while packing ({what}); pack again once the source is quiet")]
    Changed { path: PathBuf, what: String },
    /// Bad arguments or a file list naming something the pack cannot hold.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = PackError> = std::result::Result<T, E>;

impl PackError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> PackError {
        PackError::Io {
            path: path.into(),
            source,
        }
    }
    pub fn corrupt(path: impl Into<PathBuf>, what: impl Into<String>) -> PackError {
        PackError::Corrupt {
            path: path.into(),
            what: what.into(),
        }
    }
}
