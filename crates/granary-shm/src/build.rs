//! Serialises a catalog into a table image. The agent writes the image to a temporary file,
//! renames it into place and only then hands its path to clients, so readers never see a
//! half-built table.

use crate::layout::*;

/// One path of the source, as the walk found it. `entries[0]` is the root; `children` index into
/// the same slice, in the order the source listed them.
#[derive(Clone, Debug, Default)]
pub struct CatalogEntry {
    pub rel_path: Vec<u8>,
    pub stat: StatRec,
    pub link_target: Vec<u8>,
    pub children: Vec<usize>,
    /// Initial state word and checksum (a placement reused from an earlier run).
    pub state: u64,
    pub checksum: u64,
    /// Initial chunk bitmap words (a partial copy reused from an earlier run); may be shorter
    /// than the file's bitmap, missing words are zero.
    pub chunks: Vec<u64>,
    /// Initial copy identity (`Table::copy_identity`) of a reused copy: inode, ctime ns.
    pub copy_ino: u64,
    pub copy_ctime: u64,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    Empty,
    TooManyEntries(usize),
    TooManyTiers(usize),
    PathTooLong(Vec<u8>),
    StringsTooLarge,
    BadChild { parent: usize, child: usize },
    BadChunkSize(u64),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Empty => write!(f, "catalog has no root entry"),
            BuildError::TooManyEntries(n) => write!(
                f,
                "{n} entries exceed the table's limit of {}",
                u32::MAX / 2
            ),
            BuildError::TooManyTiers(n) => write!(f, "{n} tiers exceed the limit of {MAX_TIERS}"),
            BuildError::PathTooLong(p) => {
                write!(
                    f,
                    "path longer than {PATH_MAX_LEN} bytes: {}",
                    String::from_utf8_lossy(p)
                )
            }
            BuildError::StringsTooLarge => write!(f, "paths of the catalog exceed 4 GiB"),
            BuildError::BadChunkSize(c) => write!(f, "chunk size {c} is not a multiple of 4096"),
            BuildError::BadChild { parent, child } => {
                write!(
                    f,
                    "catalog entry {parent} names child {child}, which is missing or listed twice"
                )
            }
        }
    }
}

impl std::error::Error for BuildError {}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

struct Image(Vec<u8>);

impl Image {
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
        if path.len() > PATH_MAX_LEN {
            return Err(BuildError::PathTooLong(path.to_vec()));
        }
        let off = PATHS_OFF + slot * PATH_SLOT_LEN;
        self.put_u32(off, path.len() as u32);
        self.put(off + 8, path);
        Ok(())
    }
    fn put_entry(&mut self, off: usize, e: &EntryRec) {
        let s = &e.stat;
        let mut w = off;
        let mut u32s = |img: &mut Image, vals: &[u32]| {
            for v in vals {
                img.put_u32(w, *v);
                w += 4;
            }
        };
        u32s(
            self,
            &[
                e.path_off,
                e.path_len,
                e.name_off,
                e.parent,
                e.first_child,
                e.child_count,
                e.link_off,
                e.link_len,
            ],
        );
        let mut w = off + 32;
        let mut put = |img: &mut Image, bytes: &[u8]| {
            img.put(w, bytes);
            w += bytes.len();
        };
        put(self, &e.object.to_ne_bytes());
        put(self, &s.mask.to_ne_bytes());
        put(self, &s.blksize.to_ne_bytes());
        put(self, &s.attributes.to_ne_bytes());
        put(self, &s.nlink.to_ne_bytes());
        put(self, &s.uid.to_ne_bytes());
        put(self, &s.gid.to_ne_bytes());
        put(self, &s.mode.to_ne_bytes());
        put(self, &s.ino.to_ne_bytes());
        put(self, &s.size.to_ne_bytes());
        put(self, &s.blocks.to_ne_bytes());
        put(self, &s.attributes_mask.to_ne_bytes());
        for t in [s.atime, s.btime, s.ctime, s.mtime] {
            put(self, &t.sec.to_ne_bytes());
            put(self, &t.nsec.to_ne_bytes());
            put(self, &0u32.to_ne_bytes());
        }
        for v in [s.rdev_major, s.rdev_minor, s.dev_major, s.dev_minor] {
            put(self, &v.to_ne_bytes());
        }
        debug_assert_eq!(w, off + ENTRY_LEN);
    }
}

/// Builds a table image. Entries are renumbered so that each directory's children are
/// contiguous (breadth-first from the root); `lookup` finds them by path afterwards.
pub fn build(spec: &TableSpec, entries: &[CatalogEntry]) -> Result<Vec<u8>, BuildError> {
    if entries.is_empty() {
        return Err(BuildError::Empty);
    }
    if entries.len() > (u32::MAX / 2) as usize {
        return Err(BuildError::TooManyEntries(entries.len()));
    }
    if spec.tier_dirs.len() > MAX_TIERS {
        return Err(BuildError::TooManyTiers(spec.tier_dirs.len()));
    }
    if spec.chunk_size % 4096 != 0 {
        return Err(BuildError::BadChunkSize(spec.chunk_size));
    }

    // Breadth-first order: order[new] = old, new_of[old] = new.
    let n = entries.len();
    let mut order = Vec::with_capacity(n);
    let mut new_of = vec![u32::MAX; n];
    let mut parent_of = vec![0u32; n];
    let mut first_child = vec![0u32; n];
    order.push(0usize);
    new_of[0] = 0;
    let mut next = 0;
    while next < order.len() {
        let old = order[next];
        first_child[next] = order.len() as u32;
        for &c in &entries[old].children {
            if c >= n || new_of[c] != u32::MAX {
                return Err(BuildError::BadChild {
                    parent: old,
                    child: c,
                });
            }
            new_of[c] = order.len() as u32;
            parent_of[order.len()] = next as u32;
            order.push(c);
        }
        next += 1;
    }
    // Entries unreachable from the root are dropped: they cannot be named anyway.
    let count = order.len();

    let hash_slots = (count * 2).next_power_of_two().max(2) as u32;
    let ring_cap = spec.ring_cap.max(2).next_power_of_two();
    let strings_len: usize = order
        .iter()
        .map(|&o| entries[o].rel_path.len() + entries[o].link_target.len())
        .sum();
    if strings_len > u32::MAX as usize {
        return Err(BuildError::StringsTooLarge);
    }

    let entries_off = HEADER_LEN;
    let states_off = entries_off + count * ENTRY_LEN;
    let hash_off = states_off + count * STATE_LEN;
    let strings_off = align8(hash_off + hash_slots as usize * 4);
    let ring_off = align8(strings_off + strings_len);
    let stats_off = ring_off + RING_SLOTS + ring_cap as usize * RING_SLOT_LEN;
    // Chunk bitmaps: regular files larger than one chunk. Offset 0 means "none", so the
    // section starts with one unused word.
    let bitmap_words = |e: &CatalogEntry| -> usize {
        if spec.chunk_size == 0 || !e.stat.is_file() || e.stat.size <= spec.chunk_size {
            0
        } else {
            chunk_count(e.stat.size, spec.chunk_size).div_ceil(64) as usize
        }
    };
    let chunks_off = stats_off + spec.job_slots as usize * JOB_STATS_LEN;
    let chunks_len = 8 + order
        .iter()
        .map(|&o| bitmap_words(&entries[o]) * 8)
        .sum::<usize>();
    let transient_off = chunks_off + align8(chunks_len);
    let total = (transient_off + transient_words(count) * 8).div_ceil(4096) * 4096;

    let mut img = Image(vec![0u8; total]);
    img.put_u64(H_MAGIC, MAGIC);
    img.put_u32(H_VERSION, VERSION);
    img.put_u32(H_FLAGS, FLAG_VALID);
    img.put_u64(H_TOTAL_LEN, total as u64);
    img.put_u32(H_ENTRY_COUNT, count as u32);
    img.put_u32(H_HASH_SLOTS, hash_slots);
    img.put_u64(H_ENTRIES_OFF, entries_off as u64);
    img.put_u64(H_STATES_OFF, states_off as u64);
    img.put_u64(H_HASH_OFF, hash_off as u64);
    img.put_u64(H_STRINGS_OFF, strings_off as u64);
    img.put_u64(H_STRINGS_LEN, strings_len as u64);
    img.put_u64(H_RING_OFF, ring_off as u64);
    img.put_u32(H_RING_CAP, ring_cap);
    img.put_u32(H_JOB_SLOTS, spec.job_slots);
    img.put_u64(H_STATS_OFF, stats_off as u64);
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
    img.put_u64(H_CHUNKS_OFF, chunks_off as u64);
    img.put_u64(H_CHUNKS_LEN, chunks_len as u64);
    img.put_u64(H_TRANSIENT_OFF, transient_off as u64);
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

    let mut str_pos = 0usize;
    let mut chunk_pos = 8usize;
    let mask = hash_slots - 1;
    for (new, &old) in order.iter().enumerate() {
        let src = &entries[old];
        let path_off = str_pos as u32;
        img.put(strings_off + str_pos, &src.rel_path);
        str_pos += src.rel_path.len();
        let link_off = str_pos as u32;
        img.put(strings_off + str_pos, &src.link_target);
        str_pos += src.link_target.len();
        let name_off = src
            .rel_path
            .iter()
            .rposition(|&b| b == b'/')
            .map_or(0, |p| p + 1) as u32;
        let rec = EntryRec {
            path_off,
            path_len: src.rel_path.len() as u32,
            name_off,
            parent: parent_of[new],
            first_child: first_child[new],
            child_count: src.children.len() as u32,
            link_off,
            link_len: src.link_target.len() as u32,
            object: object_id(&src.rel_path),
            stat: src.stat,
        };
        img.put_entry(entries_off + new * ENTRY_LEN, &rec);
        let state_block = states_off + new * STATE_LEN;
        img.put_u64(state_block + STATE_WORD, src.state);
        img.put_u64(state_block + STATE_CHECKSUM, src.checksum);
        img.put_u64(state_block + STATE_COPY_INO, src.copy_ino);
        img.put_u64(state_block + STATE_COPY_CTIME, src.copy_ctime);
        let words = bitmap_words(src);
        if words > 0 {
            img.put_u64(state_block + STATE_CHUNKS, chunk_pos as u64);
            for (i, w) in src.chunks.iter().take(words).enumerate() {
                img.put_u64(chunks_off + chunk_pos + i * 8, *w);
            }
            chunk_pos += words * 8;
        }

        let mut slot = path_hash(&src.rel_path) as u32 & mask;
        loop {
            let off = hash_off + slot as usize * 4;
            if img.0[off..off + 4] == [0; 4] {
                img.put_u32(off, new as u32 + 1);
                break;
            }
            slot = (slot + 1) & mask;
        }
    }
    for pos in 0..ring_cap as u64 {
        img.put_u64(ring_off + RING_SLOTS + pos as usize * RING_SLOT_LEN, pos);
    }
    Ok(img.0)
}
