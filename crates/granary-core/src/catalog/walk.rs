//! Parallel walk of a source tree into `CatalogEntry`s: root first, each directory's children in
//! the order the source's `readdir` returned them. Never descends symlinks. A directory that
//! cannot be listed (or a child that cannot be stat'ed) makes the directory `STALE`, so the
//! preload library passes every call on it through instead of answering an incomplete listing.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use granary_shm::{state, CatalogEntry};

use crate::stats::CatalogStats;
use crate::sys::statx_nofollow;

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("source {path}: {cause}")]
    Root {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("source {0} is not a directory")]
    NotDir(PathBuf),
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    pub files: AtomicU64,
    pub dirs: AtomicU64,
    pub bytes: AtomicU64,
}

pub struct Walk {
    pub entries: Vec<CatalogEntry>,
    pub root_parent_ino: u64,
    pub stats: CatalogStats,
}

struct Shared {
    entries: Mutex<Vec<CatalogEntry>>,
    queue: Mutex<(VecDeque<(usize, PathBuf)>, usize)>,
    wake: Condvar,
    unreadable: AtomicU64,
    symlinks: AtomicU64,
}

/// Walks `root` (already resolved: the real path of the source) with `threads` threads.
pub fn walk(root: &Path, threads: usize, progress: &Progress) -> Result<Walk, WalkError> {
    let root_stat = statx_nofollow(root).map_err(|cause| WalkError::Root {
        path: root.to_path_buf(),
        cause,
    })?;
    if !root_stat.is_dir() {
        return Err(WalkError::NotDir(root.to_path_buf()));
    }
    let parent = root.parent().unwrap_or(root);
    let root_parent_ino = statx_nofollow(parent)
        .map(|s| s.ino)
        .unwrap_or(root_stat.ino);
    progress.dirs.fetch_add(1, Ordering::Relaxed);
    let shared = Shared {
        entries: Mutex::new(vec![CatalogEntry {
            rel_path: Vec::new(),
            stat: root_stat,
            state: state::word(state::SOURCE_ONLY, 0),
            ..Default::default()
        }]),
        // (pending directories, directories being listed)
        queue: Mutex::new((VecDeque::from([(0usize, root.to_path_buf())]), 0)),
        wake: Condvar::new(),
        unreadable: AtomicU64::new(0),
        symlinks: AtomicU64::new(0),
    };
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| worker(&shared, progress));
        }
    });
    let entries = shared
        .entries
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    let stats = CatalogStats {
        files: progress.files.load(Ordering::Relaxed),
        dirs: progress.dirs.load(Ordering::Relaxed),
        symlinks: shared.symlinks.load(Ordering::Relaxed),
        bytes: progress.bytes.load(Ordering::Relaxed),
        unreadable: shared.unreadable.load(Ordering::Relaxed),
        ..Default::default()
    };
    Ok(Walk {
        entries,
        root_parent_ino,
        stats,
    })
}

fn worker(shared: &Shared, progress: &Progress) {
    loop {
        let (idx, dir) = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(job) = q.0.pop_front() {
                    q.1 += 1;
                    break job;
                }
                if q.1 == 0 {
                    // Nothing queued and nobody listing: the walk is complete.
                    shared.wake.notify_all();
                    return;
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let subdirs = list_dir(shared, progress, idx, &dir);
        let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.0.extend(subdirs);
        q.1 -= 1;
        shared.wake.notify_all();
    }
}

/// Lists one directory, appends its children, returns the subdirectories to walk.
fn list_dir(shared: &Shared, progress: &Progress, idx: usize, dir: &Path) -> Vec<(usize, PathBuf)> {
    let parent_rel = {
        let e = shared.entries.lock().unwrap_or_else(|e| e.into_inner());
        e[idx].rel_path.clone()
    };
    let mut children = Vec::new();
    let mut complete = true;
    match std::fs::read_dir(dir) {
        Err(e) => {
            tracing::debug!("walk: cannot list {}: {e}", dir.display());
            complete = false;
        }
        Ok(rd) => {
            for de in rd {
                let de = match de {
                    Ok(de) => de,
                    Err(e) => {
                        tracing::debug!("walk: listing {} failed: {e}", dir.display());
                        complete = false;
                        break;
                    }
                };
                let name = de.file_name();
                let path = dir.join(&name);
                let stat = match statx_nofollow(&path) {
                    Ok(s) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        tracing::debug!("walk: cannot stat {}: {e}", path.display());
                        complete = false;
                        continue;
                    }
                };
                let mut rel = parent_rel.clone();
                if !rel.is_empty() {
                    rel.push(b'/');
                }
                rel.extend_from_slice(name.as_bytes());
                let mut link_target = Vec::new();
                let st = if stat.is_file() {
                    progress.files.fetch_add(1, Ordering::Relaxed);
                    progress.bytes.fetch_add(stat.size, Ordering::Relaxed);
                    state::word(state::UNPLACED, 0)
                } else {
                    if stat.is_dir() {
                        progress.dirs.fetch_add(1, Ordering::Relaxed);
                    } else if stat.is_symlink() {
                        shared.symlinks.fetch_add(1, Ordering::Relaxed);
                        match std::fs::read_link(&path) {
                            Ok(t) => link_target = t.as_os_str().as_bytes().to_vec(),
                            Err(e) => {
                                tracing::debug!("walk: cannot readlink {}: {e}", path.display());
                                complete = false;
                                continue;
                            }
                        }
                    }
                    state::word(state::SOURCE_ONLY, 0)
                };
                children.push((
                    CatalogEntry {
                        rel_path: rel,
                        stat,
                        link_target,
                        state: st,
                        ..Default::default()
                    },
                    path,
                ));
            }
        }
    }
    let mut subdirs = Vec::new();
    let mut entries = shared.entries.lock().unwrap_or_else(|e| e.into_inner());
    if !complete {
        shared.unreadable.fetch_add(1, Ordering::Relaxed);
        // An incomplete listing must never be answered from the catalog.
        entries[idx].state = state::word(state::STALE, 0);
        children.clear();
    }
    let mut child_idx = Vec::with_capacity(children.len());
    for (c, path) in children {
        let i = entries.len();
        if c.stat.is_dir() {
            subdirs.push((i, path));
        }
        entries.push(c);
        child_idx.push(i);
    }
    entries[idx].children = child_idx;
    subdirs
}

/// Display helper for relative catalog paths.
pub fn rel_display(rel: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(rel))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn walks_tree_in_readdir_order() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/b/f"), b"hello").unwrap();
        std::fs::write(r.join("top"), b"x").unwrap();
        std::os::unix::fs::symlink("a/b", r.join("link")).unwrap();
        let p = Progress::default();
        let w = walk(r, 4, &p).unwrap();
        assert_eq!(w.entries.len(), 6);
        assert_eq!(w.stats.files, 2);
        assert_eq!(w.stats.dirs, 3);
        assert_eq!(w.stats.bytes, 6);
        let names: Vec<_> = std::fs::read_dir(r)
            .unwrap()
            .map(|d| d.unwrap().file_name().into_encoded_bytes())
            .collect();
        let root_children: Vec<_> = w.entries[0]
            .children
            .iter()
            .map(|&c| w.entries[c].rel_path.clone())
            .collect();
        assert_eq!(root_children, names);
        let link = w.entries.iter().find(|e| e.rel_path == b"link").unwrap();
        assert_eq!(link.link_target, b"a/b");
        assert!(link.children.is_empty());
        let f = w.entries.iter().find(|e| e.rel_path == b"a/b/f").unwrap();
        assert_eq!(
            f.stat.ino,
            std::fs::metadata(r.join("a/b/f")).unwrap().ino()
        );
    }
}
