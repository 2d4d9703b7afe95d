//! Removing a source's directory from a tier (`granary cache clean`), in two steps: `take_away`
//! renames it, in one atomic call inside the verified tier root, to a trash name no table
//! will ever open (`.granary-trash-…`); `delete` then removes the trash at leisure. Whoever
//! coordinates with jobs (the agent, or the command holding the agent's lock) needs to hold
//! them off only for the rename.
//!
//! Only a directory of the user's named like a source id is taken, never through a symlink;
//! deleting never follows one either (`std::fs::remove_dir_all` opens every level with
//! `O_NOFOLLOW` relative to its parent).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::tierdir::TierDirError;

/// The start of a trash directory's name in a tier root.
pub const TRASH: &str = ".granary-trash-";

/// Renames `<root>/<id>` to a trash name in `root`; returns the trash's path (`None`: there
/// was nothing to take).
pub fn take_away(root: &Path, id: &str) -> Result<Option<PathBuf>, TierDirError> {
    let io = |cause| TierDirError::Io {
        path: root.join(id),
        cause,
    };
    if !crate::tierdir::is_source_id(id.as_bytes()) {
        return Err(io(std::io::Error::other("not a source directory")));
    }
    let root_fd = crate::tierdir::open_root(root)?;
    if crate::tierdir::existing_source_dir(root, id)?.is_none() {
        return Ok(None);
    }
    let trash = format!(
        "{TRASH}{id}-{}-{}",
        std::process::id(),
        super::copies::now_ns()
    );
    crate::sys::rename_at(&root_fd, id.as_bytes(), trash.as_bytes()).map_err(io)?;
    Ok(Some(root.join(trash)))
}

/// Deletes a trash directory `take_away` made (or an earlier, interrupted clean left).
pub fn delete(trash: &Path) -> std::io::Result<()> {
    let ok = trash
        .file_name()
        .is_some_and(|n| n.as_bytes().starts_with(TRASH.as_bytes()));
    if !ok {
        return Err(std::io::Error::other("not a trash directory"));
    }
    std::fs::remove_dir_all(trash)
}

/// Trash an interrupted clean left in `root`.
pub fn leftovers(root: &Path) -> Vec<PathBuf> {
    use std::os::fd::AsRawFd;
    let Ok(fd) = crate::tierdir::open_root(root) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|d| d.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|d| d.file_name().as_bytes().starts_with(TRASH.as_bytes()))
        .map(|d| root.join(d.file_name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn takes_only_source_directories_and_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tier");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let id = "data-0123456789abcdef";
        crate::tierdir::open_source_dirs(&root, id).unwrap();
        std::fs::write(root.join(id).join("objects/0000000000000001"), b"x").unwrap();
        // Someone else's files behind a link inside the directory: the link goes, they stay.
        let precious = t.path().join("precious");
        std::fs::create_dir(&precious).unwrap();
        std::fs::write(precious.join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(&precious, root.join(id).join("objects/link")).unwrap();
        let trash = take_away(&root, id).unwrap().unwrap();
        assert!(!root.join(id).exists());
        assert_eq!(leftovers(&root), vec![trash.clone()]);
        delete(&trash).unwrap();
        assert!(leftovers(&root).is_empty());
        assert_eq!(std::fs::read(precious.join("f")).unwrap(), b"keep");
        // Nothing there: nothing taken.
        assert!(take_away(&root, id).unwrap().is_none());
        // A link named like a source directory is refused, its target untouched.
        let other = "other-0123456789abcdef";
        std::os::unix::fs::symlink(&precious, root.join(other)).unwrap();
        assert!(take_away(&root, other).is_err());
        assert!(precious.join("f").exists());
        // Names that are not source ids are never taken; only trash is deleted.
        assert!(take_away(&root, "precious").is_err());
        assert!(delete(&precious).is_err());
        assert!(precious.join("f").exists());
    }
}
