//! A pack's index as a catalog, checked against the original tree per directory.
//!
//! The index holds every `statx` field the catalog serves, so no file of the tree is stat'ed.
//! With the original tree present, each directory is: one `statx` — when its identity (device,
//! inode, size, mtime, ctime) is the packed one, its names cannot have changed (any entry added,
//! removed or renamed moves its mtime), and its children come from the index; otherwise it is
//! listed, and each child is served from the pack only if its own identity is still the packed
//! one, else from the source (changed, new). A file rewritten in place under its old name leaves
//! its directory's identity alone: serving does not see it (`granary pack diff` does).
//!
//! A pack made from a file list (`--files`) may hold only part of each directory: its
//! directories' own listings and `stat`s then pass through to the source, while the files it
//! holds are still served from it.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use granary_pack::format::entry::flags as pflags;
use granary_pack::format::header::info;
use granary_pack::format::IndexEntry;
use granary_pack::Index;
use granary_shm::layout::pack::{LOC_PACKED, LOC_REPLICATE, LOC_SPARSE};
use granary_shm::{lifecycle, object_id, Catalog, Locator, Node, StatRec, State};

use crate::catalog::Prev;
use crate::stats::CatalogStats;
use crate::sys::statx_nofollow;

/// The catalog of a pack, ready for `granary_shm::build_into`.
pub struct Built {
    /// Its `locators` say where each packed file's bytes are.
    pub catalog: Catalog,
    pub stats: CatalogStats,
    pub root_parent_ino: u64,
}

/// What to build against.
pub struct Options<'a> {
    /// The original tree (`None`: only the pack exists).
    pub source: Option<&'a Path>,
    /// An earlier table of the same tree, whose complete copies are taken over when they are
    /// copies of the same version.
    pub prev: Option<&'a Prev<'a>>,
    /// `..` of the root in a listing, when there is no source to ask.
    pub root_parent_ino: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("source {path}: {cause}")]
    Source {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("source {0} is not a directory")]
    NotDir(PathBuf),
    #[error("the pack's index has no root entry")]
    NoRoot,
}

/// Where a directory's children come from.
#[derive(Clone, Copy)]
enum Mode {
    /// The index (entry): the directory is the packed one, or there is no source.
    Pack(u32),
    /// A listing of the source; the pack's directory of that path, if it had one, still
    /// vouches for each child whose identity is the packed one.
    Source(Option<u32>),
}

struct Todo {
    idx: u32,
    rel: Vec<u8>,
    mode: Mode,
}

/// The pack's root device stands for the source root's: a pack may be served where the file
/// system has another device number (remounted, another node), and directories are compared by
/// identity.
#[derive(Clone, Copy)]
struct Devs {
    pack: (u32, u32),
    source: (u32, u32),
}

impl Devs {
    fn map(self, s: &mut StatRec) {
        if (s.dev_major, s.dev_minor) == self.pack {
            (s.dev_major, s.dev_minor) = self.source;
        }
    }
}

/// One child before it becomes a node.
struct Child {
    rel: Vec<u8>,
    stat: StatRec,
    link: Vec<u8>,
    locator: Locator,
    /// Void on arrival (could not be read): everything about it passes through.
    stale: bool,
    sub: Option<Mode>,
}

struct Builder<'a, B> {
    ix: &'a Index<B>,
    source: Option<&'a Path>,
    prev: Option<&'a Prev<'a>>,
    devs: Option<Devs>,
    subset: bool,
    stats: CatalogStats,
}

pub fn build<B: AsRef<[u8]>>(ix: &Index<B>, opts: &Options<'_>) -> Result<Built, Error> {
    let root = ix.entry(0).ok_or(Error::NoRoot)?;
    let mut b = Builder {
        ix,
        source: opts.source,
        prev: opts.prev,
        devs: None,
        subset: ix.header().info & info::SUBSET != 0,
        stats: CatalogStats::default(),
    };
    let (root_stat, mode, root_parent_ino) = match opts.source {
        Some(src) => {
            let now = statx_nofollow(src).map_err(|cause| Error::Source {
                path: src.to_path_buf(),
                cause,
            })?;
            if !now.is_dir() {
                return Err(Error::NotDir(src.to_path_buf()));
            }
            let devs = Devs {
                pack: (root.stat.dev_major, root.stat.dev_minor),
                source: (now.dev_major, now.dev_minor),
            };
            b.devs = Some(devs);
            let parent = src.parent().unwrap_or(src);
            let pino = statx_nofollow(parent).map_or(now.ino, |s| s.ino);
            let mode = b.dir_mode(&root, &now, 0);
            (now, mode, pino)
        }
        None => (b.packed_stat(&root), Mode::Pack(0), opts.root_parent_ino),
    };
    b.stats.dirs = 1;
    let mut cat = Catalog::new(&root_stat);
    if b.subset && b.source.is_some() {
        cat.nodes[0].state = lifecycle::initial_void();
    }
    let mut queue = VecDeque::from([Todo {
        idx: 0,
        rel: Vec::new(),
        mode,
    }]);
    while let Some(todo) = queue.pop_front() {
        let children = match todo.mode {
            Mode::Pack(pe) => b.packed_children(pe, &todo.rel),
            Mode::Source(pe) => match b.listed_children(pe, &todo.rel) {
                Some(c) => c,
                None => {
                    // An incomplete listing must never be answered from the catalog.
                    b.stats.unreadable += 1;
                    if let Some(n) = cat.nodes.get_mut(todo.idx as usize) {
                        n.state = lifecycle::initial_void();
                    }
                    continue;
                }
            },
        };
        b.push(&mut cat, &mut queue, todo.idx, children);
    }
    Ok(Built {
        catalog: cat,
        stats: b.stats,
        root_parent_ino,
    })
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

impl<B: AsRef<[u8]>> Builder<'_, B> {
    fn path_of(&self, rel: &[u8]) -> Option<PathBuf> {
        self.source.map(|s| {
            if rel.is_empty() {
                s.to_path_buf()
            } else {
                s.join(OsStr::from_bytes(rel))
            }
        })
    }

    /// The packed record of `e` as the source would report it now: the device remapped, and
    /// atime (which a pack records as mtime and marks absent) served as present, as the tree's
    /// own `statx` says it is.
    fn packed_stat(&self, e: &IndexEntry) -> StatRec {
        let mut s = super::stat::stat_rec(&e.stat);
        s.mask |= libc::STATX_ATIME;
        if let Some(d) = self.devs {
            d.map(&mut s);
        }
        s
    }

    /// A directory present in both: from the index if its identity is the packed one.
    fn dir_mode(&mut self, packed: &IndexEntry, now: &StatRec, pe: u32) -> Mode {
        self.stats.pack_dirs_checked += 1;
        if now.is_dir() && self.packed_stat(packed).same_version(now) {
            Mode::Pack(pe)
        } else {
            self.stats.pack_dirs_changed += 1;
            Mode::Source(Some(pe))
        }
    }

    fn locator(e: &IndexEntry) -> Locator {
        Locator {
            offset: e.offset,
            stored_len: e.stored_len,
            checksum: e.checksum,
            partition: e.partition,
            codec: e.codec,
            flags: LOC_PACKED
                | if e.flags & pflags::SPARSE != 0 {
                    LOC_SPARSE
                } else {
                    0
                }
                | if e.flags & pflags::REPLICATE != 0 {
                    LOC_REPLICATE
                } else {
                    0
                },
        }
    }

    /// A directory taken from the index: its children without a call on the source, but one
    /// `statx` per subdirectory (its own check).
    fn packed_children(&mut self, pe: u32, rel: &[u8]) -> Vec<Child> {
        let Some(dir) = self.ix.entry(pe) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(dir.child_count as usize);
        for c in self.ix.children(&dir) {
            let Some(e) = self.ix.entry(c) else { continue };
            let rel = join(rel, self.ix.name(&e));
            let stat = self.packed_stat(&e);
            let mut child = Child {
                rel,
                stat,
                link: Vec::new(),
                locator: Locator::default(),
                stale: false,
                sub: None,
            };
            if e.stat.is_file() {
                child.locator = Self::locator(&e);
            } else if e.stat.is_symlink() {
                child.link = self.ix.link_target(&e).to_vec();
            } else if e.stat.is_dir() {
                match self.path_of(&child.rel) {
                    None => child.sub = Some(Mode::Pack(c)),
                    Some(path) => match statx_nofollow(&path) {
                        Ok(now) if now.is_dir() => {
                            child.sub = Some(self.dir_mode(&e, &now, c));
                            child.stat = now;
                        }
                        // Gone or replaced, though its directory was not: passes through.
                        _ => child.stale = true,
                    },
                }
            }
            out.push(child);
        }
        out
    }

    /// A directory whose names changed since packing (or that the pack never had): listed,
    /// every child stat'ed, as a walk would.
    fn listed_children(&mut self, pe: Option<u32>, rel: &[u8]) -> Option<Vec<Child>> {
        let path = self.path_of(rel)?;
        let pdir = pe.and_then(|p| self.ix.entry(p));
        let rd = std::fs::read_dir(&path).ok()?;
        let mut out = Vec::new();
        for de in rd {
            let de = de.ok()?;
            let name = de.file_name();
            let name = name.as_bytes();
            let cpath = path.join(OsStr::from_bytes(name));
            let now = match statx_nofollow(&cpath) {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(_) => return None,
            };
            let packed = pdir
                .as_ref()
                .and_then(|d| self.ix.find_child(d, name))
                .and_then(|c| self.ix.entry(c).map(|e| (c, e)));
            let mut child = Child {
                rel: join(rel, name),
                stat: now,
                link: Vec::new(),
                locator: Locator::default(),
                stale: false,
                sub: None,
            };
            if now.is_file() {
                match &packed {
                    Some((_, e)) if e.stat.is_file() && self.packed_stat(e).same_version(&now) => {
                        child.locator = Self::locator(e);
                    }
                    _ => {}
                }
            } else if now.is_symlink() {
                child.link = std::fs::read_link(&cpath)
                    .ok()?
                    .as_os_str()
                    .as_bytes()
                    .to_vec();
            } else if now.is_dir() {
                child.sub = Some(match &packed {
                    Some((c, e)) if e.stat.is_dir() => self.dir_mode(e, &now, *c),
                    _ => Mode::Source(None),
                });
            }
            out.push(child);
        }
        Some(out)
    }

    /// Appends directory `dir`'s children to the catalog and queues its subdirectories.
    fn push(
        &mut self,
        cat: &mut Catalog,
        queue: &mut VecDeque<Todo>,
        dir: u32,
        children: Vec<Child>,
    ) {
        let nodes: Vec<Node> = children
            .iter()
            .map(|c| {
                // Part of a directory of a subset may not be in the pack: its listing is the
                // source's.
                let partial_dir = c.stat.is_dir() && self.subset && self.source.is_some();
                let initial = if c.stale || partial_dir {
                    lifecycle::initial_void()
                } else {
                    lifecycle::initial(&c.stat)
                };
                let mut n = cat.node(dir, object_id(&c.rel), &c.rel, &c.stat, &c.link, initial);
                if c.stat.is_file() && !c.stale {
                    self.carry(&c.rel, c, &mut n);
                }
                n
            })
            .collect();
        let first = cat.push_children(dir, nodes);
        if cat.locators.len() < cat.nodes.len() {
            cat.locators.resize(cat.nodes.len(), Locator::default());
        }
        for (k, c) in children.into_iter().enumerate() {
            let idx = first + k as u32;
            match c.stat.file_type() {
                libc::S_IFREG => {
                    self.stats.files += 1;
                    self.stats.bytes += c.stat.size;
                    if c.locator.is_packed() {
                        self.stats.pack_files += 1;
                        cat.locators[idx as usize] = c.locator;
                    } else {
                        self.stats.pack_source_files += 1;
                    }
                }
                libc::S_IFDIR => self.stats.dirs += 1,
                libc::S_IFLNK => self.stats.symlinks += 1,
                _ => {}
            }
            if let Some(mode) = c.sub {
                queue.push_back(Todo {
                    idx,
                    rel: c.rel,
                    mode,
                });
            }
        }
    }

    /// An earlier table's complete copy of the same version of this file, on a tier the new
    /// table still has (for a packed file: with the pack's checksum).
    fn carry(&mut self, rel: &[u8], c: &Child, n: &mut Node) {
        let Some(p) = self.prev else { return };
        let Some(pi) = p.table.lookup(rel) else {
            return;
        };
        let Some(pe) = p.table.entry(pi) else { return };
        let w = p.table.state(pi);
        let sum = p.table.checksum(pi);
        if w.state() != State::Placed || sum == 0 || !pe.stat.same_version(&c.stat) {
            return;
        }
        if c.locator.is_packed() && c.locator.checksum != sum {
            return;
        }
        let Some(Some(tier)) = p.tier_map.get(w.tier() as usize) else {
            return;
        };
        let Some(carried) = lifecycle::carried(w, *tier) else {
            return;
        };
        n.state = carried;
        n.checksum = sum;
        (n.copy_ino, n.copy_ctime) = p.table.copy_identity(pi);
        self.stats.carried += 1;
    }
}
