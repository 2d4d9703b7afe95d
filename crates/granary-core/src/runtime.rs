//! The per-user runtime directory: `/dev/shm/granary-<uid>` (falls back to
//! `$TMPDIR/granary-<uid>`, then `/tmp/granary-<uid>`), or `$GRANARY_RUNTIME_DIR` when set (tests,
//! several independent agents on one node). It holds the agent's socket, lock and log, the tables
//! and the shadow directory. Mode 0700, owned by the user, never a symlink: anything else is
//! refused (never repaired), because another user could already have planted files in it.
//! Files in it are opened with `O_NOFOLLOW` and must be regular files of the user's.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime directory {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error("runtime directory {0} is a symlink; refusing to use it")]
    Symlink(PathBuf),
    #[error("runtime directory {0} is owned by uid {1}, not by this user; refusing to use it")]
    NotOwned(PathBuf, u32),
    #[error(
        "runtime directory {0} has mode {1:04o}, not 0700: other users may have planted files in \
         it; refusing to use it (check it, then `chmod 700 {0}`, or remove it)"
    )]
    NotPrivate(PathBuf, u32),
    #[error("no usable runtime directory (tried {0})")]
    NoneUsable(String),
}

#[derive(Clone, Debug)]
pub struct Runtime {
    pub dir: PathBuf,
}

impl Runtime {
    /// Finds or creates the runtime directory, verifying owner and mode.
    pub fn open() -> Result<Runtime, RuntimeError> {
        if let Some(dir) = std::env::var_os("GRANARY_RUNTIME_DIR") {
            let dir = PathBuf::from(dir);
            ensure_private_dir(&dir)?;
            return Runtime::with_dir(dir);
        }
        let uid = crate::sys::uid();
        let mut tried = Vec::new();
        let mut candidates = vec![PathBuf::from("/dev/shm")];
        if let Some(t) = std::env::var_os("TMPDIR") {
            candidates.push(PathBuf::from(t));
        }
        candidates.push(PathBuf::from("/tmp"));
        let mut last = None;
        for base in candidates {
            if !base.is_dir() {
                continue;
            }
            let dir = base.join(format!("granary-{uid}"));
            tried.push(dir.display().to_string());
            match ensure_private_dir(&dir) {
                Ok(()) => return Runtime::with_dir(dir),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(RuntimeError::NoneUsable(tried.join(", "))))
    }

    /// The runtime directory at `dir` (created if missing, verified like `open`'s): a serving
    /// rank's, named with its MPI rank.
    pub fn at(dir: PathBuf) -> Result<Runtime, RuntimeError> {
        ensure_private_dir(&dir)?;
        Runtime::with_dir(dir)
    }

    fn with_dir(dir: PathBuf) -> Result<Runtime, RuntimeError> {
        let rt = Runtime { dir };
        ensure_private_dir(&rt.shadow_dir())?;
        Ok(rt)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }
    pub fn lock(&self) -> PathBuf {
        self.dir.join("agent.lock")
    }
    /// Held (`flock`) by an agent for its whole life, shutdown included: a new agent must not
    /// walk and reuse a cache while the previous one is still saving its catalogs.
    pub fn alive(&self) -> PathBuf {
        self.dir.join("agent.alive")
    }
    /// Opens (creating) the `alive` lock file.
    pub fn open_alive(&self) -> io::Result<File> {
        open_private(&self.alive(), false)
    }
    /// Opens (creating) the lock that serialises starting an agent.
    pub fn open_lock(&self) -> io::Result<File> {
        open_private(&self.lock(), false)
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("agent.log")
    }
    /// Opens (creating) the agent's log for appending.
    pub fn open_log(&self) -> io::Result<File> {
        open_private(&self.log(), true)
    }
    /// The empty directory whose fd stands in for catalogued directories.
    pub fn shadow_dir(&self) -> PathBuf {
        self.dir.join("empty")
    }
    /// The agent's pid is part of the name: generations restart at 0 in every agent, and an old
    /// agent finishing its shutdown removes its own tables — never a newer agent's.
    pub fn table(&self, source_id: &str, generation: u64) -> PathBuf {
        let pid = std::process::id();
        self.dir
            .join(format!("{source_id}.{pid}.{generation}.table"))
    }
}

impl Runtime {
    /// Removes the tables agents that are gone left here (a killed agent's: a clean exit
    /// removes its own) and returns how many. The caller holds `alive` (`_alive`, locked): no
    /// other agent of this directory lives then, so a table whose name carries another pid than
    /// `own_pid` is a dead agent's, whatever process has that pid by now. Only regular files of
    /// the user's named like tables, never through a symlink; programs still mapping one keep
    /// their mapping (and read the source: its agent's heartbeat stopped).
    pub fn remove_dead_tables(&self, _alive: &File, own_pid: Option<u32>) -> usize {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for de in rd.flatten() {
            let name = de.file_name();
            let Some(pid) = name.to_str().and_then(table_pid) else {
                continue;
            };
            let path = de.path();
            let ours = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.is_file() && m.uid() == crate::sys::uid());
            if ours && Some(pid) != own_pid && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

/// The agent pid in a table's name (`Runtime::table`: `<source id>.<pid>.<generation>.table`).
fn table_pid(name: &str) -> Option<u32> {
    let mut parts = name.strip_suffix(".table")?.rsplitn(3, '.');
    let generation = parts.next()?;
    let pid = parts.next()?;
    let id = parts.next()?;
    (crate::tierdir::is_source_id(id.as_bytes()) && generation.parse::<u64>().is_ok())
        .then(|| pid.parse().ok())
        .flatten()
}

/// Creates `dir` with mode 0700 if missing; then insists it is a real directory owned by us,
/// and takes away group/other access if someone added it.
pub fn ensure_private_dir(dir: &Path) -> Result<(), RuntimeError> {
    let io_err = |cause| RuntimeError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err(e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(io_err)?;
    if md.file_type().is_symlink() {
        return Err(RuntimeError::Symlink(dir.to_path_buf()));
    }
    if !md.is_dir() {
        return Err(io_err(io::Error::other("exists and is not a directory")));
    }
    if md.uid() != crate::sys::uid() {
        return Err(RuntimeError::NotOwned(dir.to_path_buf(), md.uid()));
    }
    if md.mode() & 0o077 != 0 {
        return Err(RuntimeError::NotPrivate(
            dir.to_path_buf(),
            md.mode() & 0o7777,
        ));
    }
    Ok(())
}

/// Opens (creating, mode 0600) a file of the runtime directory: never through a symlink, and
/// only a regular file of this user's.
fn open_private(path: &Path, append: bool) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(!append)
        .write(true)
        .append(append)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other(format!(
                    "{} is a symlink; refusing to follow it (remove it)",
                    path.display()
                ))
            } else {
                io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        })?;
    let md = f.metadata()?;
    if !md.is_file() || md.uid() != crate::sys::uid() {
        return Err(io::Error::other(format!(
            "{} is not a regular file of this user's; refusing to use it (remove it)",
            path.display()
        )));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_tables_of_other_agents_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let rt = Runtime::at(t.path().join("rt")).unwrap();
        let alive = rt.open_alive().unwrap();
        let id = "data-0123456789abcdef";
        for name in [
            format!("{id}.100.0.table"),
            format!("{id}.200.3.table"),
            "agent.log".to_string(),
            "notes.table".to_string(),
            format!("{id}.x.0.table"),
        ] {
            std::fs::write(rt.dir.join(name), b"t").unwrap();
        }
        // A symlink named like a table: removing it would be harmless, but it is no table.
        std::os::unix::fs::symlink(
            t.path().join("elsewhere"),
            rt.dir.join(format!("{id}.300.0.table")),
        )
        .unwrap();
        assert_eq!(rt.remove_dead_tables(&alive, Some(200)), 1);
        let mut left: Vec<String> = std::fs::read_dir(&rt.dir)
            .unwrap()
            .flatten()
            .map(|d| d.file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            format!("{id}.200.3.table"),
            format!("{id}.300.0.table"),
            format!("{id}.x.0.table"),
            "agent.alive".to_string(),
            "agent.log".to_string(),
            "empty".to_string(),
            "notes.table".to_string(),
        ];
        want.sort();
        assert_eq!(left, want);
        assert_eq!(rt.remove_dead_tables(&alive, None), 1);
    }

    #[test]
    fn private_dir_rules() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("rt");
        ensure_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&d).unwrap_err();
        assert!(matches!(e, RuntimeError::NotPrivate(_, 0o755)), "{e}");
        assert!(e.to_string().contains("chmod 700"), "{e}");
        let l = t.path().join("link");
        std::os::unix::fs::symlink(&d, &l).unwrap();
        assert!(matches!(
            ensure_private_dir(&l),
            Err(RuntimeError::Symlink(_))
        ));
    }
}
