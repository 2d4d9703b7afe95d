//! One error type for packing and reading: every failure names the file and what was wrong,
//! so a user can tell a damaged pack from a bad argument or a changing source.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The cause is shown in the message (and not also as the error's source, so that a
    /// chain printed with `{:#}` names it once).
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// What was named as a pack is not one (no index, or not a pack's index): a usage error,
    /// not damage.
    #[error("{path}: not a granary pack ({why})")]
    NotAPack { path: PathBuf, why: String },
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
    /// The caller asked the pack to stop (`Progress::stop`): nothing was left behind.
    #[error("interrupted; the partial pack was removed")]
    Interrupted,
}

pub type Result<T, E = PackError> = std::result::Result<T, E>;

impl PackError {
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> PackError {
        PackError::Io {
            path: path.into(),
            cause,
        }
    }
    /// True when the pack's own bytes are at fault (damaged, truncated, a partition missing):
    /// `granary pack verify` names what; other errors are the caller's (a path that is not a
    /// pack, a newer format, a file not in the pack) or the system's.
    pub fn is_damage(&self) -> bool {
        matches!(self, PackError::Corrupt { .. })
    }

    pub fn corrupt(path: impl Into<PathBuf>, what: impl Into<String>) -> PackError {
        PackError::Corrupt {
            path: path.into(),
            what: what.into(),
        }
    }
}
