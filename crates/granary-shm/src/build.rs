//! Serialises a catalog into a table image. The agent writes the image into a temporary file,
//! renames it into place and only then hands its path to clients, so readers never see a
//! half-built table.
//!
//! The builder's input is a `Catalog`: compact nodes (the `DiskEntry` each becomes, plus its
//! initial placement state) with a string pool and interned stat classes, so a walk of a million
//! files holds about 120 bytes per file until the image is written. `CatalogEntry` is the
//! plain-data form (one `Vec` per path) that tests and small tools find easier to write.

use std::collections::HashMap;

use crate::layout::*;
use crate::lifecycle;
use crate::state::{State, StateWord};

/// One path of the source, as plain data. `entries[0]` is the root; `children` index into the
/// same slice, in the order the source listed them.
#[derive(Clone, Debug, Default)]
pub struct CatalogEntry {
    pub rel_path: Vec<u8>,
    pub stat: StatRec,
    pub link_target: Vec<u8>,
    pub children: Vec<usize>,
    /// Initial state word (`lifecycle::initial` and its kin) and checksum (a placement reused
    /// from an earlier run).
    pub state: StateWord,
    pub checksum: u64,
    /// Initial chunk bitmap words (a partial copy reused from an earlier run); may be shorter
    /// than the file's bitmap, missing words are zero.
    pub chunks: Vec<u64>,
    /// Initial copy identity (`Table::copy_identity`) of a reused copy: inode, ctime ns.
    pub copy_ino: u64,
    pub copy_ctime: u64,
}

/// One node of a `Catalog`: the entry as it will be stored and its initial mutable words.
#[derive(Clone, Copy, Debug, Default)]
pub struct Node {
    /// `class` indexes the catalog's classes; for a directory `aux`/`aux2` are its children's
    /// range in the catalog, for a symlink its target in the catalog's strings. A file's `aux`
    /// (large record) is assigned by the builder.
    pub disk: DiskEntry,
    /// Made by `lifecycle` (`initial`, `initial_void`, `carried`).
    pub state: StateWord,
    pub checksum: u64,
    pub copy_ino: u64,
    pub copy_ctime: u64,
}

impl Node {
    pub fn is_dir(&self, cat: &Catalog) -> bool {
        cat.class(self.disk.class)
            .is_some_and(|c| c.mode & libc::S_IFMT == libc::S_IFDIR)
    }
}

/// A catalog being built: node 0 is the root, each directory's children are pushed at once
/// (contiguous, in listing order), so a parent always precedes its children.
#[derive(Debug, Default)]
pub struct Catalog {
    pub nodes: Vec<Node>,
    /// Names and symlink targets.
    pub strings: Vec<u8>,
    classes: Vec<StatClass>,
    class_ix: HashMap<StatClass, u16>,
    /// Initial chunk bitmaps of reused partial copies, by node index.
    pub chunks: HashMap<u32, Vec<u64>>,
    /// Where each node's bytes are in a pack (`TableSpec::pack`), by node index; empty for a
    /// catalog that serves no pack, and shorter than `nodes` when the last nodes have none.
    pub locators: Vec<Locator>,
    /// The seed of every node's `path_check` (`DiskEntry::check`), drawn for this catalog
    /// (`new_check_seed`) and written to its table's header (`H_CHECK_SEED`).
    check_seed: u64,
}

impl Catalog {
    /// A catalog of just the root.
    pub fn new(root: &StatRec) -> Catalog {
        let mut c = Catalog {
            check_seed: new_check_seed(),
            ..Catalog::default()
        };
        let node = c.node(0, object_id(b""), b"", root, b"", lifecycle::initial_root());
        c.nodes.push(node);
        c
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The seed of this catalog's `path_check`s, its table's `H_CHECK_SEED`.
    pub fn check_seed(&self) -> u64 {
        self.check_seed
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn class(&self, ix: u16) -> Option<&StatClass> {
        self.classes.get(ix as usize)
    }

    pub fn classes(&self) -> &[StatClass] {
        &self.classes
    }

    /// The full record of node `i`.
    pub fn stat(&self, i: usize) -> Option<StatRec> {
        let n = self.nodes.get(i)?;
        Some(n.disk.stat(self.class(n.disk.class)?))
    }

    pub fn name(&self, i: usize) -> &[u8] {
        let d = &self.nodes[i].disk;
        let start = d.name_off as usize;
        self.strings
            .get(start..start + d.name_len as usize)
            .unwrap_or(b"")
    }

    /// The class of `s`, and whether it is exact. When the classes are exhausted, a class of the
    /// same file type stands in (the node is then built void, so its fields are never served).
    fn intern(&mut self, s: &StatRec) -> (u16, bool) {
        let c = StatClass::of(s);
        if let Some(&ix) = self.class_ix.get(&c) {
            return (ix, true);
        }
        let ix = self.classes.len();
        if ix < CLASS_NONE as usize {
            self.classes.push(c);
            self.class_ix.insert(c, ix as u16);
            return (ix as u16, true);
        }
        let same_type = self
            .classes
            .iter()
            .position(|k| k.mode & libc::S_IFMT == s.file_type())
            .map_or(CLASS_NONE, |k| k as u16);
        (same_type, false)
    }

    fn push_str(&mut self, s: &[u8]) -> u32 {
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(s);
        off
    }

    /// A node for `rel` (its path relative to the root: its object id is the path's hash), with
    /// its name being the last component. A record that does not fit the compact form (a time
    /// outside 1678–2262, too many distinct stat classes) makes a void node: every call on it
    /// passes through.
    pub fn node(
        &mut self,
        parent: u32,
        object: u64,
        rel: &[u8],
        stat: &StatRec,
        link: &[u8],
        initial: StateWord,
    ) -> Node {
        let name = rel
            .iter()
            .rposition(|&b| b == b'/')
            .map_or(rel, |p| &rel[p + 1..]);
        let name_off = self.push_str(name);
        let times = [stat.atime, stat.btime, stat.ctime, stat.mtime].map(Ts::to_ns);
        let (class, exact) = self.intern(stat);
        let void = !exact || times.iter().any(Option::is_none) || name.len() > u16::MAX as usize;
        let [atime_ns, btime_ns, ctime_ns, mtime_ns] = times.map(|t| t.unwrap_or(0));
        let (aux, aux2) = if stat.is_symlink() {
            (self.push_str(link), link.len() as u32)
        } else {
            (0, 0)
        };
        let state = if void {
            lifecycle::initial_void()
        } else {
            initial
        };
        Node {
            disk: DiskEntry {
                object,
                check: path_check(rel, self.check_seed),
                parent,
                name_off,
                name_len: name.len().min(u16::MAX as usize) as u16,
                class,
                nlink: stat.nlink,
                aux,
                aux2,
                ino: stat.ino,
                size: stat.size,
                blocks: stat.blocks,
                atime_ns,
                btime_ns,
                ctime_ns,
                mtime_ns,
            },
            state,
            ..Node::default()
        }
    }

    /// Appends directory `dir`'s children (all of them, in listing order) and returns the index
    /// of the first. Each directory's children are pushed once.
    pub fn push_children(&mut self, dir: u32, children: impl IntoIterator<Item = Node>) -> u32 {
        let first = self.nodes.len() as u32;
        self.nodes.extend(children);
        let count = self.nodes.len() as u32 - first;
        if let Some(d) = self.nodes.get_mut(dir as usize) {
            d.disk.aux = if count == 0 { 0 } else { first };
            d.disk.aux2 = count;
        }
        first
    }

    /// The plain-data form in breadth-first order from the root; unreachable entries are dropped.
    pub fn from_entries(entries: &[CatalogEntry]) -> Result<Catalog, BuildError> {
        let root = entries.first().ok_or(BuildError::Empty)?;
        if entries.len() > MAX_ENTRIES {
            return Err(BuildError::TooManyEntries(entries.len()));
        }
        let mut cat = Catalog::new(&root.stat);
        cat.nodes[0].state = root.state;
        let mut seen = vec![false; entries.len()];
        seen[0] = true;
        // (catalog index, entries index) of directories whose children are still to push.
        let mut queue = std::collections::VecDeque::from([(0u32, 0usize)]);
        while let Some((at, old)) = queue.pop_front() {
            let mut kids = Vec::with_capacity(entries[old].children.len());
            for &c in &entries[old].children {
                if c >= entries.len() || seen[c] {
                    return Err(BuildError::BadChild {
                        parent: old,
                        child: c,
                    });
                }
                seen[c] = true;
                let e = &entries[c];
                if e.rel_path.len() > PATH_MAX_LEN {
                    return Err(BuildError::PathTooLong(e.rel_path.clone()));
                }
                let mut n = cat.node(
                    at,
                    object_id(&e.rel_path),
                    &e.rel_path,
                    &e.stat,
                    &e.link_target,
                    e.state,
                );
                n.checksum = e.checksum;
                n.copy_ino = e.copy_ino;
                n.copy_ctime = e.copy_ctime;
                kids.push((n, c));
            }
            let first = cat.push_children(at, kids.iter().map(|(n, _)| *n));
            for (k, (_, c)) in kids.into_iter().enumerate() {
                let at = first + k as u32;
                if !entries[c].chunks.is_empty() {
                    cat.chunks.insert(at, entries[c].chunks.clone());
                }
                if entries[c].stat.is_dir() {
                    queue.push_back((at, c));
                }
            }
        }
        if cat.strings.len() > u32::MAX as usize {
            return Err(BuildError::StringsTooLarge);
        }
        Ok(cat)
    }
}

/// Where things are, for the header.
#[derive(Clone, Debug, Default)]
pub struct TableSpec {
    pub source: Vec<u8>,
    pub source_real: Vec<u8>,
    pub tier_dirs: Vec<Vec<u8>>,
    /// `(st_dev, st_ino)` of each tier's object directory (`layout::H_TIER_DIR_IDS`); missing
    /// ones are zero (clients then never open copies there).
    pub tier_dir_ids: Vec<(u64, u64)>,
    /// The agent's `(uid, gid, groups hash)` (`layout::H_CREDS`).
    pub creds: (u32, u32, u64),
    pub root_parent_ino: u64,
    pub agent_pid: u32,
    /// Rounded up to a power of two.
    pub ring_cap: u32,
    pub job_slots: u32,
    /// See `layout::H_PREFETCH_MIN_SIZE`; 0 means "never" (u64::MAX is stored).
    pub prefetch_min_size: u64,
    /// See `layout::H_CHUNK_SIZE`; a multiple of 4096, 0 means no chunk bitmaps.
    pub chunk_size: u64,
    /// The pack this table serves (`layout::pack`), if any.
    pub pack: Option<PackSpec>,
}

/// The pack section's fixed part (`layout::pack`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackSpec {
    /// The pack directory, absolute.
    pub dir: Vec<u8>,
    /// An empty directory standing for the tree's directories (`mount`).
    pub empty_dir: Vec<u8>,
    pub block_size: u32,
    pub partitions: u32,
    pub id: [u8; 16],
    /// Only the pack exists (`pack::FLAG_MOUNT`).
    pub mount: bool,
}

impl TableSpec {
    /// True if a file of `size` gets a large record: fetched whole (progress) or cut in chunks.
    pub fn is_large(&self, size: u64) -> bool {
        (self.prefetch_min_size != 0 && size >= self.prefetch_min_size)
            || (self.chunk_size != 0 && size > self.chunk_size)
    }

    fn bitmap_words(&self, size: u64) -> usize {
        if self.chunk_size == 0 || size <= self.chunk_size {
            0
        } else {
            chunk_count(size, self.chunk_size).div_ceil(64) as usize
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    Empty,
    TooManyEntries(usize),
    TooManyTiers(usize),
    PathTooLong(Vec<u8>),
    StringsTooLarge,
    BadChild {
        parent: usize,
        child: usize,
    },
    BadChunkSize(u64),
    /// A directory's children range is out of bounds or claims nodes of another parent.
    BadChildren(u32),
    /// `build_into` was given a buffer of another length than `image_len`.
    BadLength,
    /// `rebase` was given an image whose layout does not fit the spec (`what` differs).
    Foreign(&'static str),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Empty => write!(f, "catalog has no root entry"),
            BuildError::TooManyEntries(n) => {
                write!(f, "{n} entries exceed the table's limit of {MAX_ENTRIES}")
            }
            BuildError::TooManyTiers(n) => write!(f, "{n} tiers exceed the limit of {MAX_TIERS}"),
            BuildError::PathTooLong(p) => {
                write!(
                    f,
                    "path longer than {PATH_MAX_LEN} bytes: {}",
                    String::from_utf8_lossy(p)
                )
            }
            BuildError::StringsTooLarge => write!(f, "names of the catalog exceed 4 GiB"),
            BuildError::BadChunkSize(c) => write!(f, "chunk size {c} is not a multiple of 4096"),
            BuildError::BadChild { parent, child } => {
                write!(
                    f,
                    "catalog entry {parent} names child {child}, which is missing or listed twice"
                )
            }
            BuildError::BadChildren(d) => {
                write!(
                    f,
                    "catalog directory {d} has an inconsistent children range"
                )
            }
            BuildError::BadLength => write!(f, "table buffer has the wrong length"),
            BuildError::Foreign(what) => write!(f, "table image made with another {what}"),
        }
    }
}

impl std::error::Error for BuildError {}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Section offsets of an image.
struct Plan {
    n: usize,
    hash_slots: u32,
    ring_cap: u32,
    large_count: usize,
    entries_off: usize,
    states_off: usize,
    checksums_off: usize,
    hash_off: usize,
    strings_off: usize,
    ring_off: usize,
    stats_off: usize,
    large_off: usize,
    chunks_off: usize,
    chunks_len: usize,
    transient_off: usize,
    valid_off: usize,
    classes_off: usize,
    copy_bits_off: usize,
    copy_bits: u64,
    /// 0: no pack section.
    pack_off: usize,
    locators_off: usize,
    total: usize,
}

fn plan(spec: &TableSpec, cat: &Catalog) -> Result<Plan, BuildError> {
    let n = cat.nodes.len();
    if n == 0 {
        return Err(BuildError::Empty);
    }
    if n > MAX_ENTRIES {
        return Err(BuildError::TooManyEntries(n));
    }
    if spec.tier_dirs.len() > MAX_TIERS {
        return Err(BuildError::TooManyTiers(spec.tier_dirs.len()));
    }
    if spec.chunk_size % 4096 != 0 {
        return Err(BuildError::BadChunkSize(spec.chunk_size));
    }
    if cat.strings.len() > u32::MAX as usize {
        return Err(BuildError::StringsTooLarge);
    }
    // Load factor 3/4: with tags, a probe past another path's slot costs no entry line, and
    // 5 slots share a line; a smaller slot array keeps the first line of a lookup cached.
    let hash_slots = (n + n / 3 + 1).max(2) as u32;
    let ring_cap = ring_cap_of(spec);
    let (mut large_count, mut bitmap_words) = (0usize, 0usize);
    for node in &cat.nodes {
        if is_file(cat, node) && spec.is_large(node.disk.size) {
            large_count += 1;
            bitmap_words += spec.bitmap_words(node.disk.size);
        }
    }
    let words = bitmap_words_of(n);
    let entries_off = HEADER_LEN;
    let states_off = entries_off + n * ENTRY_LEN;
    let checksums_off = states_off + n * STATE_LEN;
    let hash_off = checksums_off + n * 8;
    let strings_off = align8(hash_off + hash_slots as usize * SLOT_LEN);
    let ring_off = align8(strings_off + cat.strings.len());
    let stats_off = (ring_off + RING_SLOTS + ring_cap as usize * RING_SLOT_LEN).div_ceil(256) * 256;
    let large_off = stats_off + spec.job_slots as usize * JOB_STATS_LEN;
    let chunks_off = large_off + large_count * LARGE_LEN;
    // Offset 0 means "no bitmap", so the section starts with one unused word.
    let chunks_len = 8 + bitmap_words * 8;
    let transient_off = chunks_off + align8(chunks_len);
    let valid_off = transient_off + words * 8;
    // Validated bits, then being-checked bits.
    let classes_off = valid_off + 2 * words * 8;
    let copy_bits_off = align8(classes_off + cat.classes.len() * CLASS_LEN);
    let copy_bits = copy_bits_of(n);
    let classes_end = copy_bits_off + (copy_bits / 8) as usize;
    let (pack_off, locators_off, end) = match &spec.pack {
        Some(ps) => {
            if ps.dir.len() > PATH_MAX_LEN || ps.empty_dir.len() > PATH_MAX_LEN {
                return Err(BuildError::PathTooLong(ps.dir.clone()));
            }
            let off = align8(classes_end);
            let loc = off + pack::HEADER_LEN;
            (off, loc, loc + n * pack::LOCATOR_LEN)
        }
        None => (0, 0, classes_end),
    };
    let total = end.div_ceil(4096) * 4096;
    Ok(Plan {
        n,
        hash_slots,
        ring_cap,
        large_count,
        entries_off,
        states_off,
        checksums_off,
        hash_off,
        strings_off,
        ring_off,
        stats_off,
        large_off,
        chunks_off,
        chunks_len,
        transient_off,
        valid_off,
        classes_off,
        copy_bits_off,
        copy_bits,
        pack_off,
        locators_off,
        total,
    })
}

/// The request ring's slots for `spec`: a power of two, at least two per shard.
fn ring_cap_of(spec: &TableSpec) -> u32 {
    spec.ring_cap
        .max(2 * RING_SHARDS as u32)
        .next_power_of_two()
}

fn bitmap_words_of(n: usize) -> usize {
    crate::layout::bitmap_words(n)
}

/// An entry whose bit in the copy bitmap (`H_COPY_BITS_OFF`) starts set: a copy carried over,
/// or a symlink (an open of it may reach a placed file's copy).
fn may_be_placed(cat: &Catalog, node: &Node) -> bool {
    node.state.state() == State::Placed || is_link(cat, node)
}

fn is_link(cat: &Catalog, node: &Node) -> bool {
    cat.class(node.disk.class)
        .is_some_and(|c| c.mode & libc::S_IFMT == libc::S_IFLNK)
}

fn is_file(cat: &Catalog, node: &Node) -> bool {
    cat.class(node.disk.class)
        .is_some_and(|c| c.mode & libc::S_IFMT == libc::S_IFREG)
}

/// Checks that every directory's children range is in bounds and names nodes whose parent it is,
/// and that every node but the root belongs to exactly its parent's range.
fn check_tree(cat: &Catalog) -> Result<(), BuildError> {
    let n = cat.nodes.len();
    let mut covered = 0usize;
    for (i, node) in cat.nodes.iter().enumerate() {
        if !node.is_dir(cat) || node.disk.aux2 == 0 {
            continue;
        }
        let (first, count) = (node.disk.aux as usize, node.disk.aux2 as usize);
        let end = first.checked_add(count).filter(|&e| e <= n);
        let ok = first > i
            && end.is_some_and(|end| {
                cat.nodes[first..end]
                    .iter()
                    .all(|c| c.disk.parent as usize == i)
            });
        if !ok {
            return Err(BuildError::BadChildren(i as u32));
        }
        covered += count;
    }
    if covered != n - 1 {
        return Err(BuildError::BadChildren(0));
    }
    Ok(())
}

/// The length of the image of `cat` (a multiple of 4096).
pub fn image_len(spec: &TableSpec, cat: &Catalog) -> Result<usize, BuildError> {
    Ok(plan(spec, cat)?.total)
}

/// Builds a table image from plain-data entries (breadth-first renumbering from the root).
pub fn build(spec: &TableSpec, entries: &[CatalogEntry]) -> Result<Vec<u8>, BuildError> {
    build_catalog(spec, &Catalog::from_entries(entries)?)
}

/// Builds a table image of `cat` in memory.
pub fn build_catalog(spec: &TableSpec, cat: &Catalog) -> Result<Vec<u8>, BuildError> {
    let mut img = vec![0u8; image_len(spec, cat)?];
    build_into(spec, cat, &mut img)?;
    Ok(img)
}

struct Image<'a>(&'a mut [u8]);

impl Image<'_> {
    fn put(&mut self, off: usize, bytes: &[u8]) {
        self.0[off..off + bytes.len()].copy_from_slice(bytes);
    }
    fn put_u32(&mut self, off: usize, v: u32) {
        self.put(off, &v.to_ne_bytes());
    }
    fn put_u64(&mut self, off: usize, v: u64) {
        self.put(off, &v.to_ne_bytes());
    }
    fn put_path(&mut self, slot: usize, path: &[u8]) -> Result<(), BuildError> {
        self.put_path_at(PATHS_OFF + slot * PATH_SLOT_LEN, path)
    }
    fn put_path_at(&mut self, off: usize, path: &[u8]) -> Result<(), BuildError> {
        if path.len() > PATH_MAX_LEN {
            return Err(BuildError::PathTooLong(path.to_vec()));
        }
        self.put_u32(off, path.len() as u32);
        self.put(off + 8, path);
        Ok(())
    }
    fn put_pack(
        &mut self,
        p: &Plan,
        ps: &PackSpec,
        locators: &[Locator],
    ) -> Result<(), BuildError> {
        let o = p.pack_off;
        self.put_u64(H_PACK_OFF, o as u64);
        self.put_u64(o + pack::F_MAGIC, pack::MAGIC);
        self.put_u32(
            o + pack::F_FLAGS,
            if ps.mount { pack::FLAG_MOUNT } else { 0 },
        );
        self.put_u32(o + pack::F_BLOCK, ps.block_size);
        self.put_u32(o + pack::F_PARTITIONS, ps.partitions);
        self.put_u64(o + pack::F_LOCATORS, p.locators_off as u64);
        self.put(o + pack::F_ID, &ps.id);
        self.put_path_at(o + pack::F_DIR, &ps.dir)?;
        self.put_path_at(o + pack::F_EMPTY, &ps.empty_dir)?;
        for (i, l) in locators.iter().take(p.n).enumerate() {
            let at = p.locators_off + i * pack::LOCATOR_LEN;
            self.put_u64(at, l.offset);
            self.put_u64(at + 8, l.stored_len);
            self.put_u64(at + 16, l.checksum);
            self.put_u32(at + 24, l.partition);
            self.put(at + 28, &[l.codec, l.flags]);
        }
        Ok(())
    }
    fn put_entry(&mut self, off: usize, d: &DiskEntry) {
        let mut w = off;
        let mut put = |img: &mut Image, bytes: &[u8]| {
            img.put(w, bytes);
            w += bytes.len();
        };
        put(self, &d.object.to_ne_bytes());
        put(self, &d.check.to_ne_bytes());
        put(self, &d.parent.to_ne_bytes());
        put(self, &d.name_off.to_ne_bytes());
        put(self, &d.name_len.to_ne_bytes());
        put(self, &d.class.to_ne_bytes());
        put(self, &d.nlink.to_ne_bytes());
        put(self, &d.aux.to_ne_bytes());
        put(self, &d.aux2.to_ne_bytes());
        put(self, &d.ino.to_ne_bytes());
        put(self, &d.size.to_ne_bytes());
        put(self, &d.blocks.to_ne_bytes());
        for t in [d.atime_ns, d.btime_ns, d.ctime_ns, d.mtime_ns] {
            put(self, &t.to_ne_bytes());
        }
        debug_assert_eq!(w, off + ENTRY_LEN);
    }
    fn put_class(&mut self, off: usize, c: &StatClass) {
        let mut w = off;
        let mut put = |img: &mut Image, bytes: &[u8]| {
            img.put(w, bytes);
            w += bytes.len();
        };
        put(self, &c.mask.to_ne_bytes());
        put(self, &c.blksize.to_ne_bytes());
        put(self, &c.attributes.to_ne_bytes());
        put(self, &c.attributes_mask.to_ne_bytes());
        for v in [
            c.uid,
            c.gid,
            c.mode,
            c.rdev_major,
            c.rdev_minor,
            c.dev_major,
            c.dev_minor,
            c.xattrs,
        ] {
            put(self, &v.to_ne_bytes());
        }
        debug_assert_eq!(w, off + CLASS_LEN);
    }
}

/// Builds the image of `cat` into `out`, which must be `image_len` bytes of zeros (a new file
/// mapped in memory, so a large catalog never needs a second copy on the heap).
pub fn build_into(spec: &TableSpec, cat: &Catalog, out: &mut [u8]) -> Result<(), BuildError> {
    let p = plan(spec, cat)?;
    if out.len() != p.total {
        return Err(BuildError::BadLength);
    }
    check_tree(cat)?;
    let mut img = Image(out);
    img.put_u64(H_MAGIC, MAGIC);
    img.put_u32(H_VERSION, VERSION);
    img.put_u32(H_FLAGS, FLAG_VALID);
    img.put_u64(H_TOTAL_LEN, p.total as u64);
    img.put_u32(H_ENTRY_COUNT, p.n as u32);
    img.put_u32(H_HASH_SLOTS, p.hash_slots);
    img.put_u64(H_ENTRIES_OFF, p.entries_off as u64);
    img.put_u64(H_STATES_OFF, p.states_off as u64);
    img.put_u64(H_CHECKSUMS_OFF, p.checksums_off as u64);
    img.put_u64(H_HASH_OFF, p.hash_off as u64);
    img.put_u64(H_STRINGS_OFF, p.strings_off as u64);
    img.put_u64(H_STRINGS_LEN, cat.strings.len() as u64);
    img.put_u64(H_RING_OFF, p.ring_off as u64);
    img.put_u32(H_RING_CAP, p.ring_cap);
    img.put_u32(H_JOB_SLOTS, spec.job_slots);
    img.put_u64(H_STATS_OFF, p.stats_off as u64);
    img.put_u64(H_LARGE_OFF, p.large_off as u64);
    img.put_u32(H_LARGE_COUNT, p.large_count as u32);
    img.put_u32(H_TIER_COUNT, spec.tier_dirs.len() as u32);
    img.put_u32(H_AGENT_PID, spec.agent_pid);
    img.put_u64(H_ROOT_PARENT_INO, spec.root_parent_ino);
    img.put_u64(
        H_PREFETCH_MIN_SIZE,
        if spec.prefetch_min_size == 0 {
            u64::MAX
        } else {
            spec.prefetch_min_size
        },
    );
    img.put_u64(H_CHUNK_SIZE, spec.chunk_size);
    img.put_u64(H_CHUNKS_OFF, p.chunks_off as u64);
    img.put_u64(H_CHUNKS_LEN, p.chunks_len as u64);
    img.put_u64(H_TRANSIENT_OFF, p.transient_off as u64);
    img.put_u64(H_VALID_OFF, p.valid_off as u64);
    img.put_u64(H_CLASSES_OFF, p.classes_off as u64);
    img.put_u32(H_CLASS_COUNT, cat.classes.len() as u32);
    img.put_u64(H_COPY_BITS_OFF, p.copy_bits_off as u64);
    img.put_u64(H_COPY_BITS, p.copy_bits);
    img.put_u64(H_CHECK_SEED, cat.check_seed);
    img.put_path(SLOT_SOURCE, &spec.source)?;
    img.put_path(SLOT_SOURCE_REAL, &spec.source_real)?;
    for (t, dir) in spec.tier_dirs.iter().enumerate() {
        img.put_path(SLOT_TIER0 + t, dir)?;
        let (dev, ino) = spec.tier_dir_ids.get(t).copied().unwrap_or((0, 0));
        img.put_u64(H_TIER_DIR_IDS + 16 * t, dev);
        img.put_u64(H_TIER_DIR_IDS + 16 * t + 8, ino);
    }
    img.put_u32(H_CREDS, spec.creds.0);
    img.put_u32(H_CREDS + 4, spec.creds.1);
    img.put_u64(H_CREDS + 8, spec.creds.2);
    for (i, c) in cat.classes.iter().enumerate() {
        img.put_class(p.classes_off + i * CLASS_LEN, c);
    }
    if let Some(ps) = &spec.pack {
        img.put_pack(&p, ps, &cat.locators)?;
    }
    img.put(p.strings_off, &cat.strings);

    // As the header says it (0 there: every file is small).
    let prefetch_min = match spec.prefetch_min_size {
        0 => u64::MAX,
        n => n,
    };
    let (mut large, mut chunk_pos) = (0usize, 8usize);
    for (i, node) in cat.nodes.iter().enumerate() {
        let mut d = node.disk;
        if is_file(cat, node) {
            d.aux = 0;
            d.aux2 = 0;
            if spec.is_large(d.size) {
                let rec = p.large_off + large * LARGE_LEN;
                large += 1;
                d.aux = large as u32;
                let words = spec.bitmap_words(d.size);
                if words > 0 {
                    img.put_u64(rec + LARGE_CHUNKS, chunk_pos as u64);
                    if let Some(bits) = cat.chunks.get(&(i as u32)) {
                        for (k, w) in bits.iter().take(words).enumerate() {
                            img.put_u64(p.chunks_off + chunk_pos + k * 8, *w);
                        }
                    }
                    chunk_pos += words * 8;
                }
            }
        }
        img.put_entry(p.entries_off + i * ENTRY_LEN, &d);
        let st = p.states_off + i * STATE_LEN;
        img.put_u64(st + STATE_WORD, node.state.bits());
        img.put_u64(st + STATE_COPY_INO, node.copy_ino);
        img.put_u64(st + STATE_COPY_CTIME, node.copy_ctime);
        img.put_u64(p.checksums_off + i * 8, node.checksum);
        if may_be_placed(cat, node) {
            let (word, mask) = copy_word(d.object, p.copy_bits);
            let at = p.copy_bits_off + word;
            let now = u64::from_ne_bytes(img.0[at..at + 8].try_into().unwrap_or_default());
            img.put_u64(at, now | mask);
        }

        let mut slot = home_slot(d.object, p.hash_slots);
        loop {
            let off = p.hash_off + slot as usize * SLOT_LEN;
            if img.0[off + 4..off + 8] == [0; 4] {
                let link = is_link(cat, node);
                let small = is_file(cat, node) && d.size < prefetch_min;
                for (k, w) in hash_slot(d.object, i as u32, link, small)
                    .iter()
                    .enumerate()
                {
                    img.put_u32(off + 4 * k, *w);
                }
                break;
            }
            slot = next_slot(slot, p.hash_slots);
        }
    }
    // Each shard's positions count from 0 (`ring`).
    let per_shard = p.ring_cap as usize / RING_SHARDS;
    for slot in 0..p.ring_cap as usize {
        let pos = (slot % per_shard) as u64;
        img.put_u64(p.ring_off + RING_SLOTS + slot * RING_SLOT_LEN, pos);
    }
    Ok(())
}

/// Makes a table image built by another agent (cluster mode: rank 0's catalog, broadcast to
/// every rank) this agent's: the header's tiers (paths, object directory identities, count) and
/// agent pid are replaced by `spec`'s. Everything the layout depends on — version, job slots,
/// ring size, whole-fetch size, chunk size — and what the catalog answers for — the source and
/// the credentials it was walked with — must already be `spec`'s, or the image is refused.
/// A table serving a pack must serve `spec`'s pack (directory, id, partitions, mount); its
/// empty stand-in directory becomes `spec`'s (it lives in each node's runtime directory) and
/// its streamed-bytes counter starts over. Entry words are left alone
/// (`lifecycle::forget_placement` clears them once mapped).
pub fn rebase(img: &mut [u8], spec: &TableSpec) -> Result<(), BuildError> {
    if spec.tier_dirs.len() > MAX_TIERS {
        return Err(BuildError::TooManyTiers(spec.tier_dirs.len()));
    }
    if img.len() < HEADER_LEN {
        return Err(BuildError::BadLength);
    }
    let u32_at = |img: &[u8], off: usize| {
        u32::from_ne_bytes(img[off..off + 4].try_into().unwrap_or_default())
    };
    let u64_at = |img: &[u8], off: usize| {
        u64::from_ne_bytes(img[off..off + 8].try_into().unwrap_or_default())
    };
    let path_at = |img: &[u8], slot: usize| {
        let off = PATHS_OFF + slot * PATH_SLOT_LEN;
        let len = (u32_at(img, off) as usize).min(PATH_MAX_LEN);
        img[off + 8..off + 8 + len].to_vec()
    };
    if u64_at(img, H_MAGIC) != MAGIC || u32_at(img, H_VERSION) != VERSION {
        return Err(BuildError::Foreign("table version"));
    }
    if u64_at(img, H_TOTAL_LEN) != img.len() as u64 {
        return Err(BuildError::BadLength);
    }
    if u32_at(img, H_JOB_SLOTS) != spec.job_slots || u32_at(img, H_RING_CAP) != ring_cap_of(spec) {
        return Err(BuildError::Foreign("number of job slots or ring size"));
    }
    let prefetch = if spec.prefetch_min_size == 0 {
        u64::MAX
    } else {
        spec.prefetch_min_size
    };
    if u64_at(img, H_PREFETCH_MIN_SIZE) != prefetch || u64_at(img, H_CHUNK_SIZE) != spec.chunk_size
    {
        return Err(BuildError::Foreign("whole-fetch size or chunk size"));
    }
    if path_at(img, SLOT_SOURCE_REAL) != spec.source_real
        || path_at(img, SLOT_SOURCE) != spec.source
    {
        return Err(BuildError::Foreign("source path"));
    }
    let creds = (
        u32_at(img, H_CREDS),
        u32_at(img, H_CREDS + 4),
        u64_at(img, H_CREDS + 8),
    );
    if creds != spec.creds {
        return Err(BuildError::Foreign("user or groups"));
    }
    rebase_pack(img, spec)?;
    let mut out = Image(img);
    out.put_u32(H_TIER_COUNT, spec.tier_dirs.len() as u32);
    out.put_u32(H_AGENT_PID, spec.agent_pid);
    // Probed again by this agent at the attach (another node's device numbers differ).
    out.put_u32(H_XATTR, 0);
    for t in 0..MAX_TIERS {
        let off = PATHS_OFF + (SLOT_TIER0 + t) * PATH_SLOT_LEN;
        out.0[off..off + PATH_SLOT_LEN].fill(0);
        out.put_u64(H_TIER_DIR_IDS + 16 * t, 0);
        out.put_u64(H_TIER_DIR_IDS + 16 * t + 8, 0);
    }
    for (t, dir) in spec.tier_dirs.iter().enumerate() {
        out.put_path(SLOT_TIER0 + t, dir)?;
        let (dev, ino) = spec.tier_dir_ids.get(t).copied().unwrap_or((0, 0));
        out.put_u64(H_TIER_DIR_IDS + 16 * t, dev);
        out.put_u64(H_TIER_DIR_IDS + 16 * t + 8, ino);
    }
    Ok(())
}

/// The source root's resolved path in a table image (`SLOT_SOURCE_REAL`), read without
/// mapping it (cluster mode: another rank's image, before it is adopted).
pub fn image_source_real(img: &[u8]) -> Option<Vec<u8>> {
    let off = PATHS_OFF + SLOT_SOURCE_REAL * PATH_SLOT_LEN;
    let len = u32::from_ne_bytes(img.get(off..off + 4)?.try_into().ok()?) as usize;
    if len > PATH_MAX_LEN {
        return None;
    }
    img.get(off + 8..off + 8 + len).map(|p| p.to_vec())
}

/// `rebase` of the pack section (`layout::pack`).
fn rebase_pack(img: &mut [u8], spec: &TableSpec) -> Result<(), BuildError> {
    let at = |off: usize, n: usize| img.get(off..off + n);
    let u64_at =
        |off: usize| at(off, 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    let u32_at =
        |off: usize| at(off, 4).map(|b| u32::from_ne_bytes(b.try_into().unwrap_or_default()));
    let off = u64_at(H_PACK_OFF).unwrap_or(0) as usize;
    let Some(ps) = &spec.pack else {
        return if off == 0 {
            Ok(())
        } else {
            Err(BuildError::Foreign("pack (the image serves one)"))
        };
    };
    if off == 0
        || off
            .checked_add(pack::HEADER_LEN)
            .is_none_or(|e| e > img.len())
    {
        return Err(BuildError::Foreign("pack (the image serves none)"));
    }
    let path_at = |f: usize| {
        let len = (u32_at(off + f).unwrap_or(0) as usize).min(PATH_MAX_LEN);
        at(off + f + 8, len).map(|b| b.to_vec())
    };
    let flags = if ps.mount { pack::FLAG_MOUNT } else { 0 };
    let same = u64_at(off + pack::F_MAGIC) == Some(pack::MAGIC)
        && u32_at(off + pack::F_FLAGS) == Some(flags)
        && u32_at(off + pack::F_PARTITIONS) == Some(ps.partitions)
        && u32_at(off + pack::F_BLOCK) == Some(ps.block_size)
        && at(off + pack::F_ID, 16) == Some(&ps.id[..])
        && path_at(pack::F_DIR).as_deref() == Some(&ps.dir[..]);
    if !same {
        return Err(BuildError::Foreign("pack"));
    }
    let mut out = Image(img);
    let slot = off + pack::F_EMPTY;
    out.0[slot..slot + PATH_SLOT_LEN].fill(0);
    out.put_path_at(slot, &ps.empty_dir)?;
    out.put_u64(off + pack::F_STREAMED, 0);
    Ok(())
}
