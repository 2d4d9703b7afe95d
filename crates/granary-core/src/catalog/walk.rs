//! The parallel walk of a source tree into a compact `Catalog`: root first, each directory's
//! children in the order the source's `readdir` returned them. Never descends symlinks. A
//! directory that cannot be listed (or a child that cannot be stat'ed) makes the directory
//! `STALE`, so the preload library passes every call on it through instead of answering an
//! incomplete listing.
//!
//! With an earlier table of the same source (`Prev`), the walk only lists what that table
//! cannot vouch for: directories it marked `STALE` (the program changed their names through
//! granary, or a validation found them changed) and files it marked `STALE`/`GONE`. Everything
//! else is taken over as it was, copies included, without a system call — the background
//! validation of the attach (`validate`) then checks it against the source.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use granary_shm::{
    lifecycle, object_id, Catalog, EntryRec, Node, StatRec, State, StateWord, Table,
};

use crate::stats::CatalogStats;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{thread, Condvar, Mutex};
use crate::sys::statx_nofollow;

use super::xattr;

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
    pub catalog: Catalog,
    pub root_parent_ino: u64,
    pub stats: CatalogStats,
    /// Nodes whose metadata this walk read from the source (validated in this attach), as a
    /// bitmap over the catalog's nodes.
    pub fresh: Vec<u64>,
}

/// An earlier table of the same source whose knowledge the walk may take over.
pub struct Prev<'a> {
    pub table: &'a Table,
    /// Tier `t` of the earlier table is tier `tier_map[t]` of the new one (`None`: its copies
    /// are not carried over).
    pub tier_map: Vec<Option<u8>>,
    /// The new table's chunk size: chunk bitmaps are carried over only when it is the same.
    pub chunk_size: u64,
}

/// A directory still to do: its node, its path on the source and relative to the root, the
/// earlier table's entry for it, and whether it must be listed.
struct Todo {
    idx: u32,
    path: PathBuf,
    rel: Vec<u8>,
    prev: Option<u32>,
    list: bool,
}

struct Shared<'a> {
    cat: Mutex<(Catalog, Vec<u64>)>,
    queue: Mutex<(VecDeque<Todo>, usize)>,
    wake: Condvar,
    unreadable: AtomicU64,
    symlinks: AtomicU64,
    carried: AtomicU64,
    prev: Option<&'a Prev<'a>>,
    progress: &'a Progress,
    /// Record each path's attribute list (`xattr::listed`) on this device (major, minor): the
    /// source's file system is one whose absent attributes the catalog answers for.
    list_xattrs: Option<(u32, u32)>,
}

/// A child before it becomes a node: what the source (or the earlier table) says about it.
struct Child {
    rel: Vec<u8>,
    stat: StatRec,
    link: Vec<u8>,
    state: StateWord,
    checksum: u64,
    copy: (u64, u64),
    chunks: Vec<u64>,
    fresh: bool,
    /// For a directory: its entry in the earlier table and whether it must be listed.
    prev: Option<u32>,
    list: bool,
}

/// Walks `root` (already resolved: the real path of the source) with `threads` threads.
pub fn walk(
    root: &Path,
    prev: Option<&Prev<'_>>,
    threads: usize,
    progress: &Progress,
) -> Result<Walk, WalkError> {
    let mut root_stat = statx_nofollow(root).map_err(|cause| WalkError::Root {
        path: root.to_path_buf(),
        cause,
    })?;
    if !root_stat.is_dir() {
        return Err(WalkError::NotDir(root.to_path_buf()));
    }
    let list_xattrs =
        xattr::worth_listing(root).then_some((root_stat.dev_major, root_stat.dev_minor));
    if list_xattrs.is_some() {
        root_stat.xattrs = xattr::listed(root);
    }
    let parent = root.parent().unwrap_or(root);
    let root_parent_ino = statx_nofollow(parent)
        .map(|s| s.ino)
        .unwrap_or(root_stat.ino);
    progress.dirs.fetch_add(1, Ordering::Relaxed);
    let list_root = prev.is_none_or(|p| must_list(p.table, 0, &root_stat));
    let shared = Shared {
        cat: Mutex::new((Catalog::new(&root_stat), vec![1])),
        queue: Mutex::new((
            VecDeque::from([Todo {
                idx: 0,
                path: root.to_path_buf(),
                rel: Vec::new(),
                prev: prev.map(|_| 0),
                list: list_root,
            }]),
            0,
        )),
        wake: Condvar::new(),
        unreadable: AtomicU64::new(0),
        symlinks: AtomicU64::new(0),
        carried: AtomicU64::new(0),
        prev,
        progress,
        list_xattrs,
    };
    thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| worker(&shared));
        }
    });
    let (catalog, fresh) = shared.cat.into_inner().unwrap_or_else(|e| e.into_inner());
    let stats = CatalogStats {
        files: progress.files.load(Ordering::Relaxed),
        dirs: progress.dirs.load(Ordering::Relaxed),
        symlinks: shared.symlinks.load(Ordering::Relaxed),
        bytes: progress.bytes.load(Ordering::Relaxed),
        unreadable: shared.unreadable.load(Ordering::Relaxed),
        carried: shared.carried.load(Ordering::Relaxed),
        ..Default::default()
    };
    Ok(Walk {
        catalog,
        root_parent_ino,
        stats,
        fresh,
    })
}

/// True if the earlier table cannot vouch for directory `idx`'s names: it marked it void, or
/// the directory is no longer the one it describes.
fn must_list(t: &Table, idx: u32, now: &StatRec) -> bool {
    let void = t.state(idx).is_void();
    void || t.entry(idx).is_none_or(|e| !e.stat.same_version(now))
}

fn worker(shared: &Shared<'_>) {
    loop {
        let todo = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(t) = q.0.pop_front() {
                    q.1 += 1;
                    break t;
                }
                if q.1 == 0 {
                    // Nothing queued and nobody listing: the walk is complete.
                    shared.wake.notify_all();
                    return;
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let subdirs = do_dir(shared, todo);
        let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.0.extend(subdirs);
        q.1 -= 1;
        shared.wake.notify_all();
    }
}

fn child_rel(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut rel = Vec::with_capacity(parent.len() + 1 + name.len());
    rel.extend_from_slice(parent);
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name);
    rel
}

/// One directory: its children (listed, or taken over from the earlier table), appended to the
/// catalog; returns the subdirectories to do.
fn do_dir(shared: &Shared<'_>, todo: Todo) -> Vec<Todo> {
    let (children, complete) = if todo.list {
        list_dir(shared, &todo)
    } else {
        take_over(shared, &todo)
    };
    let progress = shared.progress;
    for c in &children {
        match c.stat.file_type() {
            libc::S_IFREG => {
                progress.files.fetch_add(1, Ordering::Relaxed);
                progress.bytes.fetch_add(c.stat.size, Ordering::Relaxed);
            }
            libc::S_IFDIR => {
                progress.dirs.fetch_add(1, Ordering::Relaxed);
            }
            libc::S_IFLNK => {
                shared.symlinks.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    let mut guard = shared.cat.lock().unwrap_or_else(|e| e.into_inner());
    let (cat, fresh) = &mut *guard;
    if !complete {
        shared.unreadable.fetch_add(1, Ordering::Relaxed);
        // An incomplete listing must never be answered from the catalog.
        if let Some(n) = cat.nodes.get_mut(todo.idx as usize) {
            n.state = lifecycle::initial_void();
        }
        return Vec::new();
    }
    let nodes: Vec<Node> = children
        .iter()
        .map(|c| {
            let mut n = cat.node(
                todo.idx,
                object_id(&c.rel),
                &c.rel,
                &c.stat,
                &c.link,
                c.state,
            );
            n.checksum = c.checksum;
            (n.copy_ino, n.copy_ctime) = c.copy;
            n
        })
        .collect();
    let first = cat.push_children(todo.idx, nodes);
    fresh.resize(granary_shm::layout::bitmap_words(cat.nodes.len()), 0);
    let mut subdirs = Vec::new();
    for (k, c) in children.into_iter().enumerate() {
        let idx = first + k as u32;
        if c.fresh {
            fresh[(idx / 64) as usize] |= 1 << (idx % 64);
        }
        if !c.chunks.is_empty() {
            cat.chunks.insert(idx, c.chunks);
        }
        if c.stat.is_dir() && !c.state.is_void() {
            let name = c.rel.rsplit(|&b| b == b'/').next().unwrap_or(b"");
            subdirs.push(Todo {
                idx,
                path: todo.path.join(OsStr::from_bytes(name)),
                rel: c.rel,
                prev: c.prev,
                list: c.list,
            });
        }
    }
    subdirs
}

/// Reads a directory from the source: every child stat'ed.
fn list_dir(shared: &Shared<'_>, todo: &Todo) -> (Vec<Child>, bool) {
    let mut children = Vec::new();
    let rd = match std::fs::read_dir(&todo.path) {
        Ok(rd) => rd,
        Err(e) => {
            tracing::debug!("walk: cannot list {}: {e}", todo.path.display());
            return (children, false);
        }
    };
    let mut complete = true;
    for de in rd {
        let de = match de {
            Ok(de) => de,
            Err(e) => {
                tracing::debug!("walk: listing {} failed: {e}", todo.path.display());
                complete = false;
                break;
            }
        };
        let name = de.file_name();
        let path = todo.path.join(&name);
        let stat = match statx_nofollow(&path) {
            Ok(s) => with_xattrs(shared, s, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::debug!("walk: cannot stat {}: {e}", path.display());
                complete = false;
                continue;
            }
        };
        let rel = child_rel(&todo.rel, name.as_bytes());
        match fresh_child(shared, rel, stat, &path) {
            Some(c) => children.push(c),
            None => complete = false,
        }
    }
    (children, complete)
}

/// `stat` of `path` with what its attribute list says, where the walk records it.
fn with_xattrs(shared: &Shared<'_>, mut stat: StatRec, path: &Path) -> StatRec {
    if shared.list_xattrs == Some((stat.dev_major, stat.dev_minor)) {
        stat.xattrs = xattr::listed(path);
    }
    stat
}

/// A child the walk stat'ed: its placement is taken over from the earlier table when that
/// table describes the very same version of it.
fn fresh_child(shared: &Shared<'_>, rel: Vec<u8>, stat: StatRec, path: &Path) -> Option<Child> {
    let mut link = Vec::new();
    if stat.is_symlink() {
        match std::fs::read_link(path) {
            Ok(t) => link = t.as_os_str().as_bytes().to_vec(),
            Err(e) => {
                tracing::debug!("walk: cannot readlink {}: {e}", path.display());
                return None;
            }
        }
    }
    let mut c = Child {
        state: lifecycle::initial(&stat),
        rel,
        stat,
        link,
        checksum: 0,
        copy: (0, 0),
        chunks: Vec::new(),
        fresh: true,
        prev: None,
        list: true,
    };
    if let Some(p) = shared.prev {
        if let Some(pi) = p.table.lookup(&c.rel) {
            if let Some(pe) = p.table.entry(pi) {
                let live = !p.table.state(pi).is_void();
                if live && pe.stat.same_version(&c.stat) {
                    carry_placement(p, pi, &pe, &mut c);
                    if c.stat.is_dir() {
                        c.prev = Some(pi);
                        c.list = false;
                    }
                }
            }
        }
    }
    Some(c)
}

/// The earlier table's copy of entry `pi` (a complete copy, or a chunk file of the same chunk
/// size), on a tier the new table still has.
fn carry_placement(p: &Prev<'_>, pi: u32, pe: &EntryRec, c: &mut Child) {
    if !pe.stat.is_file() {
        return;
    }
    let w = p.table.state(pi);
    let Some(Some(nt)) = p.tier_map.get(w.tier() as usize) else {
        return;
    };
    let Some(carried) = lifecycle::carried(w, *nt) else {
        return;
    };
    match w.state() {
        State::Placed if p.table.checksum(pi) != 0 => {
            c.state = carried;
            c.checksum = p.table.checksum(pi);
            c.copy = p.table.copy_identity(pi);
        }
        State::Partial if p.chunk_size == p.table.chunk_size() && p.chunk_size != 0 => {
            let n = p.table.chunk_count(pi);
            let mut words = vec![0u64; n.div_ceil(64) as usize];
            for k in 0..n {
                if p.table.chunk_present(pi, k) {
                    words[(k / 64) as usize] |= 1 << (k % 64);
                }
            }
            if words.iter().any(|w| *w != 0) {
                c.state = carried;
                c.copy = p.table.copy_identity(pi);
                c.chunks = words;
            }
        }
        _ => {}
    }
}

/// A directory the earlier table vouches for: its children as that table has them, without a
/// system call — except children it marked void, which are stat'ed again.
fn take_over(shared: &Shared<'_>, todo: &Todo) -> (Vec<Child>, bool) {
    let (Some(p), Some(pd)) = (shared.prev, todo.prev) else {
        return list_dir(shared, todo);
    };
    let Some(dir) = p.table.entry(pd) else {
        return list_dir(shared, todo);
    };
    let mut children = Vec::with_capacity(dir.child_count as usize);
    for pi in dir.first_child..dir.first_child.saturating_add(dir.child_count) {
        let Some(pe) = p.table.entry(pi) else {
            return list_dir(shared, todo);
        };
        let name = p.table.name(&pe).unwrap_or(b"");
        let rel = child_rel(&todo.rel, name);
        let st = p.table.state(pi).state();
        if st.is_void() {
            // Changed or removed through granary: what is there now.
            let path = todo.path.join(OsStr::from_bytes(name));
            match statx_nofollow(&path) {
                Ok(stat) => match fresh_child(shared, rel, with_xattrs(shared, stat, &path), &path)
                {
                    Some(c) => children.push(c),
                    None => return list_dir(shared, todo),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => return list_dir(shared, todo),
            }
            continue;
        }
        shared.carried.fetch_add(1, Ordering::Relaxed);
        let mut c = Child {
            state: lifecycle::initial(&pe.stat),
            rel,
            stat: pe.stat,
            link: p.table.link_target(&pe).unwrap_or(b"").to_vec(),
            checksum: 0,
            copy: (0, 0),
            chunks: Vec::new(),
            fresh: false,
            prev: Some(pi),
            list: false,
        };
        carry_placement(p, pi, &pe, &mut c);
        children.push(c);
    }
    (children, true)
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
        let w = walk(r, None, 4, &p).unwrap();
        let cat = &w.catalog;
        assert_eq!(cat.len(), 6);
        assert_eq!(w.stats.files, 2);
        assert_eq!(w.stats.dirs, 3);
        assert_eq!(w.stats.bytes, 6);
        let names: Vec<_> = std::fs::read_dir(r)
            .unwrap()
            .map(|d| d.unwrap().file_name().into_encoded_bytes())
            .collect();
        let root = &cat.nodes[0].disk;
        let root_children: Vec<_> = (root.aux..root.aux + root.aux2)
            .map(|c| cat.name(c as usize).to_vec())
            .collect();
        assert_eq!(root_children, names);
        let link = (0..cat.len()).find(|&i| cat.name(i) == b"link").unwrap();
        let ld = &cat.nodes[link].disk;
        assert_eq!(
            &cat.strings[ld.aux as usize..(ld.aux + ld.aux2) as usize],
            b"a/b"
        );
        let f = (0..cat.len()).find(|&i| cat.name(i) == b"f").unwrap();
        assert_eq!(
            cat.stat(f).unwrap().ino,
            std::fs::metadata(r.join("a/b/f")).unwrap().ino()
        );
        assert!((0..cat.len()).all(|i| w.fresh[i / 64] & (1 << (i % 64)) != 0));
    }
}
