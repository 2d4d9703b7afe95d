//! `granary pack diff SRC PACK`: what changed in the source since it was packed, by identity
//! (device, inode, type, size, mtime, ctime; symlinks also by target) — never by reading data.
//!
//! Per directory: when the source directory still has the inode, mtime and ctime the index
//! recorded, its listing cannot have changed, so only its entries are `statx`ed (no `readdir`);
//! otherwise it is listed and compared name by name. The pack's root device stands for the
//! source root's (a pack may be read where the file system has another device number).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{PackError, Result};
use crate::format::header::info;
use crate::format::{IndexEntry, Stat};
use crate::index::Index;
use crate::sys::{open_under, statx_at};
use crate::writer::walk::Source;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// In the source, not in the pack (a directory stands for everything below it).
    Added(Vec<u8>),
    /// In the pack, gone from the source (likewise).
    Removed(Vec<u8>),
    /// Both, but another version: the fields that differ.
    Modified(Vec<u8>, String),
}

impl Change {
    pub fn path(&self) -> &[u8] {
        match self {
            Change::Added(p) | Change::Removed(p) | Change::Modified(p, _) => p,
        }
    }
}

#[derive(Debug, Default)]
pub struct DiffReport {
    pub changes: Vec<Change>,
    /// Directories whose listing was read (the others were unchanged).
    pub listed_dirs: u64,
    pub dirs: u64,
}

struct Devs {
    pack_root: (u32, u32),
    src_root: (u32, u32),
}

impl Devs {
    fn same(&self, packed: &Stat, now: &Stat) -> bool {
        let p = (packed.dev_major, packed.dev_minor);
        let n = (now.dev_major, now.dev_minor);
        if p == self.pack_root {
            n == self.src_root
        } else {
            p == n
        }
    }
}

fn differences(devs: &Devs, p: &Stat, n: &Stat) -> Vec<&'static str> {
    let mut d = Vec::new();
    if p.file_type() != n.file_type() {
        d.push("type");
        return d;
    }
    if !devs.same(p, n) || p.ino != n.ino {
        d.push("inode");
    }
    if p.size != n.size {
        d.push("size");
    }
    if p.mtime != n.mtime {
        d.push("mtime");
    }
    if p.ctime != n.ctime {
        d.push("ctime");
    }
    d
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Compares the source at `src` with the pack's index.
pub fn diff<B: AsRef<[u8]>>(src: &Path, ix: &Index<B>) -> Result<DiffReport> {
    let source = Source::open(src)?;
    let subset = ix.header().info & info::SUBSET != 0;
    let root = ix
        .entry(0)
        .ok_or_else(|| PackError::corrupt(ix.path(), "no root"))?;
    let src_root = statx_at(&source.fd, b"").map_err(|e| PackError::io(src, e))?;
    let devs = Devs {
        pack_root: (root.stat.dev_major, root.stat.dev_minor),
        src_root: (src_root.dev_major, src_root.dev_minor),
    };
    let mut report = DiffReport::default();
    // Directories to compare: (entry, path); depth first, names in order.
    let mut stack: Vec<(u32, Vec<u8>)> = vec![(0, Vec::new())];
    while let Some((d, rel)) = stack.pop() {
        report.dirs += 1;
        let Some(de) = ix.entry(d) else { continue };
        let dir = match open_under(&source.fd, &rel, true) {
            Ok(f) => f,
            Err(e) if is_gone(&e) => {
                report.changes.push(Change::Removed(rel));
                continue;
            }
            Err(e) => return Err(PackError::io(source.path_of(&rel), e)),
        };
        let now = statx_at(&dir, b"").map_err(|e| PackError::io(source.path_of(&rel), e))?;
        let unchanged_listing = devs.same(&de.stat, &now)
            && de.stat.ino == now.ino
            && de.stat.mtime == now.mtime
            && de.stat.ctime == now.ctime;
        let children: Vec<(u32, IndexEntry)> = ix
            .children(&de)
            .filter_map(|c| ix.entry(c).map(|e| (c, e)))
            .collect();
        if !unchanged_listing {
            report.listed_dirs += 1;
            if !subset {
                let names = list(&dir).map_err(|e| PackError::io(source.path_of(&rel), e))?;
                for name in names {
                    if ix.find_child(&de, &name).is_none() {
                        report.changes.push(Change::Added(join(&rel, &name)));
                    }
                }
            }
        }
        let mut subdirs = Vec::new();
        for (c, ce) in children {
            let name = ix.name(&ce);
            let path = join(&rel, name);
            let st = match statx_at(&dir, name) {
                Ok(st) => st,
                Err(e) if is_gone(&e) => {
                    report.changes.push(Change::Removed(path));
                    continue;
                }
                Err(e) => return Err(PackError::io(source.path_of(&path), e)),
            };
            if ce.stat.is_dir() && st.is_dir() {
                subdirs.push((c, path));
                continue;
            }
            let mut what = differences(&devs, &ce.stat, &st);
            if what.is_empty() && ce.stat.is_symlink() {
                let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir));
                let target =
                    std::fs::read_link(Path::new(&proc).join(std::ffi::OsStr::from_bytes(name)));
                if target
                    .map(|t| t.as_os_str().as_bytes() != ix.link_target(&ce))
                    .unwrap_or(true)
                {
                    what.push("target");
                }
            }
            if !what.is_empty() {
                report.changes.push(Change::Modified(path, what.join(", ")));
            }
        }
        // Reversed so that directories pop in name order.
        stack.extend(subdirs.into_iter().rev());
    }
    report.changes.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(report)
}

fn is_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

fn list(dir: &File) -> std::io::Result<BTreeSet<Vec<u8>>> {
    let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(dir));
    std::fs::read_dir(proc)?
        .map(|de| de.map(|d| d.file_name().as_bytes().to_vec()))
        .collect()
}
