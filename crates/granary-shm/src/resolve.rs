//! From a source-relative path to the catalog entry it names, without allocation: symlinks
//! followed inside the catalog (`resolve`), and the one lookup a reader of the table makes
//! (`Table::find`): the entry, provided the catalog may speak for it now.
//!
//! Only positive answers come from the catalog. Whenever the kernel could resolve a path
//! differently from what the catalog can prove (a link leaving the source, `..` after a link,
//! too many hops) the answer is `PassThrough` and the caller asks the real file system.

use crate::layout::{EntryRec, PATH_MAX_LEN};
use crate::lifecycle;
use crate::state::{State, StateWord};
use crate::table::Table;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum Resolved {
    /// The path names this entry (decoded).
    Entry(u32, EntryRec),
    /// Not in the catalog, or not provably: ask the source.
    PassThrough,
}

/// Linux's limit on symlinks followed in one resolution.
const MAX_HOPS: usize = 40;

/// Resolves `rel` (relative to the source root, normalised: no `.`/`..`/empty components, no
/// leading or trailing `/`). With `follow`, a final symlink is followed as `stat` and `open` do.
pub fn resolve(table: &Table, rel: &[u8], follow: bool) -> Resolved {
    let Some(idx) = table.lookup(rel) else {
        return Resolved::PassThrough;
    };
    resolve_from(table, idx, follow, |_, _| true)
}

/// `resolve` of the path that names entry `idx`; each link followed is given to `link_ok`
/// first (its index and entry), and a false answer ends the walk (`PassThrough`).
#[inline]
fn resolve_from(
    table: &Table,
    idx: u32,
    follow: bool,
    link_ok: impl FnMut(u32, &EntryRec) -> bool,
) -> Resolved {
    let Some(e) = table.entry(idx) else {
        return Resolved::PassThrough;
    };
    if !follow || table.link_target(&e).is_none() {
        // Nearly every path: no link to follow, and no buffer to clear. Inlined, so the decoded
        // entry is built where the caller keeps it rather than copied out through each layer.
        return Resolved::Entry(idx, e);
    }
    follow_links(table, idx, link_ok)
}

#[inline(never)]
fn follow_links(
    table: &Table,
    mut idx: u32,
    mut link_ok: impl FnMut(u32, &EntryRec) -> bool,
) -> Resolved {
    let mut buf = [0u8; PATH_MAX_LEN];
    for _ in 0..MAX_HOPS {
        let Some(e) = table.entry(idx) else {
            return Resolved::PassThrough;
        };
        let Some(target) = table.link_target(&e) else {
            return Resolved::Entry(idx, e);
        };
        if !link_ok(idx, &e) {
            return Resolved::PassThrough;
        }
        let Some(dir_len) = table.write_rel_path(e.parent, &mut buf) else {
            return Resolved::PassThrough;
        };
        let Some(len) = join_target(table, dir_len, target, &mut buf) else {
            return Resolved::PassThrough;
        };
        match table.lookup(&buf[..len]) {
            Some(next) => idx = next,
            None => return Resolved::PassThrough,
        }
    }
    Resolved::PassThrough
}

/// Writes the catalog path a link target names into `out`, which holds the link's directory in
/// its first `dir_len` bytes; `None` if it leaves the source or needs knowledge the catalog lacks.
fn join_target(table: &Table, dir_len: usize, target: &[u8], out: &mut [u8]) -> Option<usize> {
    let mut len = dir_len;
    let mut rest = target;
    if target.first() == Some(&b'/') {
        rest = strip_root(target, table.source_root())
            .or_else(|| strip_root(target, table.source_real_root()))?;
        len = 0;
    }
    // Leading `..` are exact: the link's directory and its ancestors are real directories.
    // A `..` after any other component might follow a symlink, which only the kernel knows.
    let mut seen_name = false;
    for comp in rest.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." if !seen_name => {
                if len == 0 {
                    return None; // above the source root
                }
                len = out[..len].iter().rposition(|&b| b == b'/').unwrap_or(0);
            }
            b".." => return None,
            name => {
                seen_name = true;
                if len > 0 {
                    *out.get_mut(len)? = b'/';
                    len += 1;
                }
                out.get_mut(len..len + name.len())?.copy_from_slice(name);
                len += name.len();
            }
        }
    }
    Some(len)
}

/// `path` relative to `root` if `path` lies inside it (`root` itself gives "").
pub fn strip_root<'a>(path: &'a [u8], root: &[u8]) -> Option<&'a [u8]> {
    if root.is_empty() {
        return None;
    }
    let rest = path.strip_prefix(root)?;
    if rest.is_empty() {
        return Some(rest);
    }
    if root == b"/" {
        return Some(rest);
    }
    rest.strip_prefix(b"/")
}

/// Why the catalog does not answer for a path: the caller asks the file system instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No entry has that path.
    NotCatalogued,
    /// A symlink on the way the catalog cannot follow exactly (it leaves the source, a `..`
    /// comes after it, too many hops) or a damaged record.
    Unprovable,
    /// The program changed the entry (`STALE`) or removed or renamed it (`GONE`).
    Void,
    /// The program renamed or removed a directory above it.
    AncestorGone,
    /// The path ends as a directory (`dir/`) but names something else.
    NotADirectory,
}

/// An entry the catalog may answer for.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    pub idx: u32,
    pub entry: EntryRec,
    /// Its state word as the lookup read it (`StateWord::state`, `StateWord::tier`).
    pub word: StateWord,
    /// Checked against the source in this attach (`lifecycle::is_validated`); if not, whoever
    /// answers from the entry must check it first.
    pub validated: bool,
}

/// What an open of a file needs of the entry `Table::find_file` found, read from its stored
/// record and class without decoding the entry (`Table::entry`): its file type and owner, size
/// and object id, and what `Found` says besides.
#[derive(Debug, Clone, Copy)]
pub struct FileHit {
    pub idx: u32,
    pub object: u64,
    pub size: u64,
    /// `st_mode` (file type and permission bits) and `st_uid`, from the entry's class.
    pub mode: u32,
    pub uid: u32,
    pub word: StateWord,
    pub validated: bool,
}

impl FileHit {
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

impl Table {
    /// The one lookup of a path a reader of the table makes: the entry `rel` names (following a
    /// final symlink with `follow`), if it is live — not voided by the program, nor below a
    /// directory the program renamed or removed — and, with `must_dir`, a directory.
    #[inline]
    pub fn find(&self, rel: &[u8], follow: bool, must_dir: bool) -> Result<Found, Miss> {
        self.find_hashed(rel, crate::layout::path_hash(rel), follow, must_dir)
    }

    /// `find` of `rel` whose `path_hash` the caller has already (`hash`).
    #[inline]
    pub fn find_hashed(
        &self,
        rel: &[u8],
        hash: u64,
        follow: bool,
        must_dir: bool,
    ) -> Result<Found, Miss> {
        self.find_hashed_with(rel, hash, follow, must_dir, |_, _| true)
    }

    /// `find_hashed`, giving every link it follows to `link_ok` (its index and entry) before
    /// following it, in order — the entry the last link leads to is not given, nor anything
    /// when the path's own entry is no link or `follow` is false: a false answer ends the
    /// lookup (`Miss::Unprovable`; the caller kept why).
    #[inline]
    pub fn find_hashed_with(
        &self,
        rel: &[u8],
        hash: u64,
        follow: bool,
        must_dir: bool,
        link_ok: impl FnMut(u32, &EntryRec) -> bool,
    ) -> Result<Found, Miss> {
        let idx = self.lookup_hashed(rel, hash).ok_or(Miss::NotCatalogued)?;
        let Resolved::Entry(idx, entry) = resolve_from(self, idx, follow, link_ok) else {
            return Err(Miss::Unprovable);
        };
        let word = self.state(idx);
        if word.state().is_void() {
            return Err(Miss::Void);
        }
        if must_dir && !entry.stat.is_dir() {
            return Err(Miss::NotADirectory);
        }
        if !self.ancestors_live(idx) {
            return Err(Miss::AncestorGone);
        }
        Ok(Found {
            idx,
            entry,
            word,
            validated: lifecycle::is_validated(self, idx),
        })
    }

    /// `find_hashed(rel, hash, follow, must_dir)` without decoding the entry, for the case
    /// that decides nearly every open: `Some` only when that call would answer `Ok` with this
    /// entry, and the entry is no symlink (so `follow` changes nothing). `None` says nothing:
    /// the caller asks `find_hashed` (a symlink, a miss, a void, a damaged record).
    #[inline]
    pub fn find_file(&self, rel: &[u8], hash: u64, must_dir: bool) -> Option<FileHit> {
        let idx = self.lookup_hashed(rel, hash)?;
        // What `resolve_from` reads: the record and its class (`Table::entry` is `None`
        // without either), and whether it is a symlink.
        let (object, size, class) = self.file_fields(idx)?;
        let (mode, uid) = self.class_mode_uid(class)?;
        if mode & libc::S_IFMT == libc::S_IFLNK {
            return None;
        }
        let word = self.state(idx);
        if word.state().is_void()
            || must_dir && mode & libc::S_IFMT != libc::S_IFDIR
            || !self.ancestors_live(idx)
        {
            return None;
        }
        Some(FileHit {
            idx,
            object,
            size,
            mode,
            uid,
            word,
            validated: lifecycle::is_validated(self, idx),
        })
    }

    /// Entry `idx` (a directory the program holds open, say) is still live: see `find`.
    pub fn is_live(&self, idx: u32) -> Result<(), Miss> {
        if self.state(idx).state().is_void() {
            return Err(Miss::Void);
        }
        if !self.ancestors_live(idx) {
            return Err(Miss::AncestorGone);
        }
        Ok(())
    }

    /// No ancestor of entry `idx` was renamed or removed by the program (`State::Gone`).
    fn ancestors_live(&self, idx: u32) -> bool {
        let mut cur = idx;
        // Bounded by the depth limit of a path.
        for _ in 0..4096 {
            if cur == 0 {
                return true;
            }
            let Some(parent) = self.parent_of(cur) else {
                return false;
            };
            if parent >= cur {
                return false;
            }
            if self.state(parent).state() == State::Gone {
                return false;
            }
            cur = parent;
        }
        false
    }
}
