//! The tree to pack, read from the source: every directory listed through its own fd (so deep
//! paths never hit `PATH_MAX`), every entry `statx`ed without following symlinks, directories in
//! parallel. With `--files`, only the listed paths (and their directories) are read.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rayon::prelude::*;

use crate::error::{PackError, Result};
use crate::format::name::{component_problem, split_relative};
use crate::format::Stat;
use crate::sys::{open_under, statx_at};
use crate::writer::progress::Progress;

/// One path of the tree; a directory's children are sorted by name.
#[derive(Debug, Default)]
pub struct Node {
    pub stat: Stat,
    /// Symlinks: the target.
    pub link: Option<Vec<u8>>,
    pub children: BTreeMap<Vec<u8>, Node>,
}

pub struct Source {
    pub root: PathBuf,
    pub fd: File,
}

impl Source {
    pub fn open(root: &Path) -> Result<Source> {
        let fd = File::open(root).map_err(|e| PackError::io(root, e))?;
        let st = statx_at(&fd, b"").map_err(|e| PackError::io(root, e))?;
        if !st.is_dir() {
            return Err(PackError::Invalid(format!(
                "{}: not a directory",
                root.display()
            )));
        }
        Ok(Source {
            root: root.to_path_buf(),
            fd,
        })
    }

    pub fn path_of(&self, rel: &[u8]) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(std::ffi::OsStr::from_bytes(rel))
        }
    }

    /// `statx` of `rel` below the root, not following a final symlink.
    pub fn stat(&self, rel: &[u8]) -> Result<Stat> {
        let err = |e| PackError::io(self.path_of(rel), e);
        match rel.iter().rposition(|&b| b == b'/') {
            None => statx_at(&self.fd, rel).map_err(err),
            Some(p) => {
                let dir = open_under(&self.fd, &rel[..p], true).map_err(err)?;
                statx_at(&dir, &rel[p + 1..]).map_err(err)
            }
        }
    }
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return name.to_vec();
    }
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

/// The whole tree below `rel` (a directory whose `statx` is `stat`).
pub fn walk(src: &Source, rel: &[u8], stat: Stat, progress: &Progress) -> Result<Node> {
    let dir = open_under(&src.fd, rel, true).map_err(|e| PackError::io(src.path_of(rel), e))?;
    walk_open(src, &dir, rel, stat, progress)
}

fn walk_open(
    src: &Source,
    dir: &File,
    rel: &[u8],
    stat: Stat,
    progress: &Progress,
) -> Result<Node> {
    let here = src.path_of(rel);
    progress.check_stop()?;
    let now = statx_at(dir, b"").map_err(|e| PackError::io(&here, e))?;
    if now.ino != stat.ino || now.dev_major != stat.dev_major || now.dev_minor != stat.dev_minor {
        return Err(PackError::Changed {
            path: here,
            what: "directory replaced".into(),
        });
    }
    progress.dirs.fetch_add(1, Ordering::Relaxed);
    // Listing through the fd's /proc name keeps deep paths short.
    let proc_path = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let list = std::fs::read_dir(&proc_path).map_err(|e| PackError::io(&here, e))?;
    let mut children = BTreeMap::new();
    let mut subdirs = Vec::new();
    for de in list {
        let de = de.map_err(|e| PackError::io(&here, e))?;
        let name = de.file_name().as_bytes().to_vec();
        let child_rel = join(rel, &name);
        if let Some(p) = component_problem(&name) {
            return Err(PackError::Invalid(format!(
                "{}: {p}",
                src.path_of(&child_rel).display()
            )));
        }
        let st = statx_at(dir, &name).map_err(|e| PackError::io(src.path_of(&child_rel), e))?;
        let mut node = Node {
            stat: st,
            ..Default::default()
        };
        if st.is_symlink() {
            let target = std::fs::read_link(proc_path.join(de.file_name()))
                .map_err(|e| PackError::io(src.path_of(&child_rel), e))?;
            node.link = Some(target.as_os_str().as_bytes().to_vec());
        } else if st.is_file() {
            progress.files_total.fetch_add(1, Ordering::Relaxed);
            progress.bytes_total.fetch_add(st.size, Ordering::Relaxed);
        }
        if st.is_dir() {
            subdirs.push((name, st));
        } else {
            children.insert(name, node);
        }
    }
    let walked: Vec<Result<(Vec<u8>, Node)>> = subdirs
        .into_par_iter()
        .map(|(name, st)| {
            let child_rel = join(rel, &name);
            let fd = open_under(dir, &name, true)
                .map_err(|e| PackError::io(src.path_of(&child_rel), e))?;
            Ok((name, walk_open(src, &fd, &child_rel, st, progress)?))
        })
        .collect();
    for w in walked {
        let (name, node) = w?;
        children.insert(name, node);
    }
    Ok(Node {
        stat,
        children,
        ..Default::default()
    })
}

/// Reads a `--files` list: one path per line, or NUL-separated when the list holds a NUL byte
/// (`find -print0`, for names with newlines). Paths are relative to the source or absolute below
/// it; empty lines and lines starting with `#` are skipped.
pub fn read_list(list: &Path, src_root: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(list).map_err(|e| PackError::io(list, e))?;
    let sep = if bytes.contains(&0) { 0 } else { b'\n' };
    let canon = src_root
        .canonicalize()
        .unwrap_or_else(|_| src_root.to_path_buf());
    let prefixes = [
        src_root.as_os_str().as_bytes().to_vec(),
        canon.as_os_str().as_bytes().to_vec(),
    ];
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, line) in bytes.split(|&b| b == sep).enumerate() {
        if line.is_empty() || (sep == b'\n' && line.starts_with(b"#")) {
            continue;
        }
        let mut rel = line;
        if line.starts_with(b"/") {
            rel = prefixes
                .iter()
                .filter_map(|p| line.strip_prefix(p.as_slice()))
                .find(|r| r.is_empty() || r.starts_with(b"/"))
                .ok_or_else(|| {
                    PackError::Invalid(format!(
                        "{}:{}: {} is not below the source {}",
                        list.display(),
                        n + 1,
                        String::from_utf8_lossy(line),
                        src_root.display()
                    ))
                })?;
        }
        let parts = split_relative(rel)
            .map_err(|e| PackError::Invalid(format!("{}:{}: {e}", list.display(), n + 1)))?;
        if parts.is_empty() {
            return Err(PackError::Invalid(format!(
                "{}:{}: names the source itself",
                list.display(),
                n + 1
            )));
        }
        let norm = parts.join(&b'/');
        if !seen.insert(norm.clone()) {
            return Err(PackError::Invalid(format!(
                "{}:{}: {} is listed twice",
                list.display(),
                n + 1,
                String::from_utf8_lossy(&norm)
            )));
        }
        out.push(norm);
    }
    Ok(out)
}

/// The tree holding just `paths` (each with its directories; a listed directory brings its
/// whole subtree).
pub fn walk_list(src: &Source, paths: &[Vec<u8>], progress: &Progress) -> Result<Node> {
    let root_stat = statx_at(&src.fd, b"").map_err(|e| PackError::io(&src.root, e))?;
    let mut root = Node {
        stat: root_stat,
        ..Default::default()
    };
    progress.dirs.fetch_add(1, Ordering::Relaxed);
    for rel in paths {
        progress.check_stop()?;
        let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
        let mut node = &mut root;
        for k in 0..parts.len() {
            let prefix = parts[..=k].join(&b'/');
            if !node.children.contains_key(parts[k]) {
                let st = src.stat(&prefix)?;
                let last = k + 1 == parts.len();
                if !last && !st.is_dir() {
                    return Err(PackError::Invalid(format!(
                        "{}: not a directory",
                        src.path_of(&prefix).display()
                    )));
                }
                let child = if last && st.is_dir() {
                    walk(src, &prefix, st, progress)?
                } else {
                    if st.is_dir() {
                        progress.dirs.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut n = Node {
                        stat: st,
                        ..Default::default()
                    };
                    if st.is_symlink() {
                        let t = std::fs::read_link(src.path_of(&prefix))
                            .map_err(|e| PackError::io(src.path_of(&prefix), e))?;
                        n.link = Some(t.as_os_str().as_bytes().to_vec());
                    } else if st.is_file() {
                        progress.files_total.fetch_add(1, Ordering::Relaxed);
                        progress.bytes_total.fetch_add(st.size, Ordering::Relaxed);
                    }
                    n
                };
                node.children.insert(parts[k].to_vec(), child);
            } else if k + 1 == parts.len() {
                // Listed after a path below it: its subtree was not walked.
                let st = src.stat(&prefix)?;
                if st.is_dir() {
                    let walked = walk(src, &prefix, st, progress)?;
                    let existing = node.children.get_mut(parts[k]).expect("checked above");
                    merge(existing, walked);
                }
            }
            node = node.children.get_mut(parts[k]).expect("inserted above");
        }
    }
    Ok(root)
}

fn merge(into: &mut Node, from: Node) {
    for (name, child) in from.children {
        match into.children.get_mut(&name) {
            Some(existing) => merge(existing, child),
            None => {
                into.children.insert(name, child);
            }
        }
    }
}
