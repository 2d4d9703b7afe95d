//! A source's directories in a tier, opened so that nobody else's bytes can be served from them:
//! `<tier root>/<source id>/objects`, every level verified on the fd that was opened (never by
//! path afterwards):
//!
//! - the tier root (the user's `--tier PATH`, or the default tier) must be a directory owned by
//!   the user and not writable by group or other — otherwise another user could replace the
//!   levels below it between our checks and a client's open. It is never changed by granary: a
//!   root that fails is refused with a message saying how to fix it;
//! - `<source id>` and `objects` are created 0700 by the agent; if they exist they must be
//!   directories owned by the user (their mode is narrowed back to 0700 if someone widened it),
//!   opened with `O_NOFOLLOW` relative to the verified level above.
//!
//! The `objects` directory's device and inode go into the table (`H_TIER_DIR_IDS`), and clients
//! open copies only through a directory fd with that identity.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TierDirError {
    #[error("tier {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error(
        "tier {path} is owned by uid {owner}, not by you (uid {me}): another user could replace \
         its contents; use a directory of your own"
    )]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "tier {path} is writable by other users (mode {mode:04o}): they could replace its \
         contents; `chmod go-w {path}` or use a private subdirectory"
    )]
    OpenToOthers { path: PathBuf, mode: u32 },
    #[error("tier {path}: {what} is not a directory")]
    NotDir { path: PathBuf, what: String },
}

/// A source's verified directories in one tier.
#[derive(Debug)]
pub struct SourceDirs {
    /// `<root>/<source id>`: where the source's saved catalog lives.
    pub source_dir: OwnedFd,
    /// `<root>/<source id>/objects`: the copies.
    pub objects: OwnedFd,
    /// `(st_dev, st_ino)` of `objects`.
    pub objects_id: (u64, u64),
    pub objects_path: PathBuf,
}

fn stat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, writable out-buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn open_at(dir: Option<&OwnedFd>, name: &Path, nofollow: bool) -> io::Result<OwnedFd> {
    let c = CString::new(name.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL"))?;
    let flags = libc::O_RDONLY
        | libc::O_DIRECTORY
        | libc::O_CLOEXEC
        | if nofollow { libc::O_NOFOLLOW } else { 0 };
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: NUL-terminated name relative to a valid directory fd (or the cwd).
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The tier root, verified (see the module comment). Following a symlink is fine here: what is
/// checked is the directory that was opened.
pub fn open_root(root: &Path) -> Result<OwnedFd, TierDirError> {
    let io_err = |cause| TierDirError::Io {
        path: root.to_path_buf(),
        cause,
    };
    let fd = open_at(None, root, false).map_err(io_err)?;
    let st = stat(&fd).map_err(io_err)?;
    let me = crate::sys::uid();
    if st.st_uid != me {
        return Err(TierDirError::NotOwned {
            path: root.to_path_buf(),
            owner: st.st_uid,
            me,
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(TierDirError::OpenToOthers {
            path: root.to_path_buf(),
            mode: st.st_mode & 0o7777,
        });
    }
    Ok(fd)
}

/// `name` inside the verified directory `parent`: created 0700 if missing; must be a directory
/// of ours (never followed through a symlink); narrowed to 0700 if it was widened.
fn private_child(parent: &OwnedFd, name: &str, path: &Path) -> Result<OwnedFd, TierDirError> {
    let io_err = |cause| TierDirError::Io {
        path: path.to_path_buf(),
        cause,
    };
    let c = CString::new(name).map_err(|_| io_err(io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: NUL-terminated name relative to a valid directory fd.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(io_err(e));
        }
    }
    let fd = open_at(Some(parent), Path::new(name), true).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
            TierDirError::NotDir {
                path: path.to_path_buf(),
                what: name.to_string(),
            }
        } else {
            io_err(e)
        }
    })?;
    let st = stat(&fd).map_err(io_err)?;
    let me = crate::sys::uid();
    if st.st_uid != me {
        return Err(TierDirError::NotOwned {
            path: path.to_path_buf(),
            owner: st.st_uid,
            me,
        });
    }
    if st.st_mode & 0o077 != 0 {
        // SAFETY: fchmod on our own directory fd.
        if unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } != 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
    }
    Ok(fd)
}

/// Opens (creating what is missing) a source's directories in the tier at `root`.
pub fn open_source_dirs(root: &Path, source_id: &str) -> Result<SourceDirs, TierDirError> {
    let root_fd = open_root(root)?;
    let source_path = root.join(source_id);
    let source_dir = private_child(&root_fd, source_id, &source_path)?;
    let objects_path = source_path.join("objects");
    let objects = private_child(&source_dir, "objects", &objects_path)?;
    let st = stat(&objects).map_err(|cause| TierDirError::Io {
        path: objects_path.clone(),
        cause,
    })?;
    Ok(SourceDirs {
        source_dir,
        objects,
        objects_id: (st.st_dev, st.st_ino),
        objects_path,
    })
}

/// A source's directories in the tier at `root` as they are — never created nor changed (for
/// `granary cache` and for taking another source's copies): `None` when `<root>/<source id>` or
/// its `objects` is missing; an error when either is not a directory of the user's.
pub fn open_existing(root: &Path, source_id: &str) -> Result<Option<SourceDirs>, TierDirError> {
    let root_fd = open_root(root)?;
    let source_path = root.join(source_id);
    let Some(source_dir) = existing_child(&root_fd, source_id, &source_path)? else {
        return Ok(None);
    };
    let objects_path = source_path.join("objects");
    let Some(objects) = existing_child(&source_dir, "objects", &objects_path)? else {
        return Ok(None);
    };
    let st = stat(&objects).map_err(|cause| TierDirError::Io {
        path: objects_path.clone(),
        cause,
    })?;
    Ok(Some(SourceDirs {
        source_dir,
        objects,
        objects_id: (st.st_dev, st.st_ino),
        objects_path,
    }))
}

/// `<root>/<source id>` if it exists: a directory of the user's, never followed through a
/// symlink (its `objects` may be missing).
pub fn existing_source_dir(root: &Path, source_id: &str) -> Result<Option<OwnedFd>, TierDirError> {
    let root_fd = open_root(root)?;
    existing_child(&root_fd, source_id, &root.join(source_id))
}

/// `name` in the verified directory `parent` if it exists: a directory of ours, never followed
/// through a symlink.
fn existing_child(
    parent: &OwnedFd,
    name: &str,
    path: &Path,
) -> Result<Option<OwnedFd>, TierDirError> {
    let fd = match open_at(Some(parent), Path::new(name), true) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
            return Err(TierDirError::NotDir {
                path: path.to_path_buf(),
                what: name.to_string(),
            })
        }
        Err(cause) => {
            return Err(TierDirError::Io {
                path: path.to_path_buf(),
                cause,
            })
        }
    };
    let st = stat(&fd).map_err(|cause| TierDirError::Io {
        path: path.to_path_buf(),
        cause,
    })?;
    let me = crate::sys::uid();
    if st.st_uid != me {
        return Err(TierDirError::NotOwned {
            path: path.to_path_buf(),
            owner: st.st_uid,
            me,
        });
    }
    Ok(Some(fd))
}

/// The source directories in the tier root `root` (names that are source ids, directories of
/// the user's), through a verified fd of the root.
pub fn source_dirs(root: &Path) -> Vec<String> {
    let Ok(fd) = open_root(root) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .flatten()
        .filter(|d| d.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|d| d.file_name().into_string().ok())
        .filter(|n| is_source_id(n.as_bytes()))
        .collect();
    v.sort();
    v
}

/// True if `name` is a source id (`<up to 32 of [A-Za-z0-9_-]>-<16 hex digits>`,
/// `source::source_id`): the only names in a tier root granary treats as its own.
pub fn is_source_id(name: &[u8]) -> bool {
    let Some(dash) = name.len().checked_sub(17) else {
        return false;
    };
    let (base, hash) = (&name[..dash], &name[dash + 1..]);
    name[dash] == b'-'
        && (1..=32).contains(&base.len())
        && base
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && hash
            .iter()
            .all(|&b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn levels_are_created_private_and_verified() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tier");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = open_source_dirs(&root, "src-1").unwrap();
        let m = std::fs::metadata(root.join("src-1/objects")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        assert_eq!(d.objects_path, root.join("src-1/objects"));
        // Widened by someone: narrowed back.
        std::fs::set_permissions(root.join("src-1"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        open_source_dirs(&root, "src-1").unwrap();
        let m = std::fs::metadata(root.join("src-1")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_root_open_to_others_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tier");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open_source_dirs(&root, "s").unwrap_err();
        assert!(matches!(e, TierDirError::OpenToOthers { .. }), "{e}");
        assert!(e.to_string().contains("chmod go-w"), "{e}");
    }

    #[test]
    fn existing_directories_are_opened_as_they_are() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tier");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(open_existing(&root, "s-0123456789abcdef")
            .unwrap()
            .is_none());
        assert!(!root.join("s-0123456789abcdef").exists(), "nothing created");
        open_source_dirs(&root, "s-0123456789abcdef").unwrap();
        let d = open_existing(&root, "s-0123456789abcdef").unwrap().unwrap();
        assert_eq!(d.objects_path, root.join("s-0123456789abcdef/objects"));
        std::os::unix::fs::symlink(
            root.join("s-0123456789abcdef"),
            root.join("l-0123456789abcdef"),
        )
        .unwrap();
        let e = open_existing(&root, "l-0123456789abcdef").unwrap_err();
        assert!(matches!(e, TierDirError::NotDir { .. }), "{e}");
    }

    #[test]
    fn source_ids() {
        assert!(is_source_id(b"imagenet-0123456789abcdef"));
        assert!(is_source_id(
            crate::source::source_id(Path::new("/pfs/a b")).as_bytes()
        ));
        for bad in [
            &b"imagenet-0123456789abcdeF"[..],
            b"-0123456789abcdef",
            b"imagenet0123456789abcdef",
            b"a.b-0123456789abcdef",
            b".granary-trash-x",
            b"objects",
        ] {
            assert!(!is_source_id(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_symlink_below_the_root_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("tier");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("s")).unwrap();
        let e = open_source_dirs(&root, "s").unwrap_err();
        assert!(matches!(e, TierDirError::NotDir { .. }), "{e}");
    }
}
