//! A validated view of a mapped catalog table: lookups, placement state, counters.
//!
//! Everything here is allocation-free and lock-free, so the preload library can call it from
//! inside any hook (including a vfork child).

use core::sync::atomic::{AtomicU64, Ordering};

use crate::layout::*;

use crate::region::Region;
use crate::state::{State, StateWord};

/// What the copy bitmap says of a path (`Table::copy_hint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyHint {
    /// No copy of it can exist.
    NoCopy,
    /// A copy may exist.
    Maybe,
    /// The path is a symlink's (its hash slot says so): a copy of what it leads to may exist,
    /// named by the target's path, never by the link's.
    Link,
    /// The table has no bitmap.
    Unknown,
}

/// Why a mapping is not usable as a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableError {
    TooShort,
    BadMagic,
    BadVersion(u32),
    BadLayout(&'static str),
}

impl core::fmt::Display for TableError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TableError::TooShort => write!(f, "table file is shorter than its header"),
            TableError::BadMagic => write!(f, "not a granary table (bad magic)"),
            TableError::BadVersion(v) => {
                write!(f, "table version {v}, this build reads version {VERSION}")
            }
            TableError::BadLayout(what) => write!(f, "table layout is inconsistent: {what}"),
        }
    }
}

impl std::error::Error for TableError {}

#[derive(Clone, Copy)]
pub struct Table {
    region: Region,
    /// The copy bitmap (`H_COPY_BITS_OFF`); `copy_bits` 0: none.
    copy_bits_off: usize,
    copy_bits: u64,
    entry_count: u32,
    hash_slots: u32,
    entries_off: usize,
    states_off: usize,
    hash_off: usize,
    strings_off: usize,
    strings_len: usize,
    ring_off: usize,
    ring_cap: u32,
    job_slots: u32,
    stats_off: usize,
    tier_count: u32,
    chunks_off: usize,
    chunks_len: usize,
    transient_off: usize,
    checksums_off: usize,
    large_off: usize,
    large_count: u32,
    valid_off: usize,
    classes_off: usize,
    class_count: u32,
    /// The pack section (`layout::pack`), 0 when the table serves no pack.
    pack_off: usize,
    locators_off: usize,
    /// The path slot `source_root` answers with: the user's spelling (`SLOT_SOURCE`), or the
    /// real root once this process found the spelling no longer names it (`forget_spelling`).
    source_slot: usize,
    /// Both root spellings are normal absolute paths (`roots_normal`).
    roots_normal: bool,
    /// The seed of the entries' `path_check` (`H_CHECK_SEED`), read once at the mapping.
    check_seed: u64,
}

/// `/`, or an absolute path of named components only.
fn normal_abs(p: &[u8]) -> bool {
    p == b"/"
        || p.len() > 1
            && p[0] == b'/'
            && p[1..]
                .split(|&b| b == b'/')
                .all(|c| !matches!(c, b"" | b"." | b".."))
}

/// A request taken off the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub kind: u8,
    pub entry: u32,
    /// Kind-specific (the chunk index of `request::CHUNK`).
    pub arg: u32,
}

/// The programs a job started that granary could not serve although their arguments named a
/// dataset path (`Table::unserved`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    /// How many such starts.
    pub count: u64,
    /// The first one's reason, a `seen::EXEC_*` bit.
    pub why: u64,
    /// Its program as the start named it, and the argument that named a dataset path (their
    /// last bytes, after `…`, when they were longer than the table keeps).
    pub program: Vec<u8>,
    pub arg: Vec<u8>,
}

fn section(
    region: &Region,
    off: usize,
    count: usize,
    item: usize,
    what: &'static str,
) -> Result<usize, TableError> {
    let len = count.checked_mul(item).ok_or(TableError::BadLayout(what))?;
    let end = off.checked_add(len).ok_or(TableError::BadLayout(what))?;
    if off < HEADER_LEN || end > region.len() || off % 8 != 0 {
        return Err(TableError::BadLayout(what));
    }
    Ok(off)
}

impl Table {
    /// Validates the header and every section's bounds once, so later accessors only need
    /// per-index checks.
    pub fn new(region: Region) -> Result<Table, TableError> {
        if region.len() < HEADER_LEN {
            return Err(TableError::TooShort);
        }
        let u32_at = |off| region.u32_at(off).ok_or(TableError::TooShort);
        let u64_at = |off| region.u64_at(off).ok_or(TableError::TooShort);
        if u64_at(H_MAGIC)? != MAGIC {
            return Err(TableError::BadMagic);
        }
        let version = u32_at(H_VERSION)?;
        if version != VERSION {
            return Err(TableError::BadVersion(version));
        }
        if u64_at(H_TOTAL_LEN)? as usize != region.len() {
            return Err(TableError::BadLayout(
                "total length differs from the file's",
            ));
        }
        let entry_count = u32_at(H_ENTRY_COUNT)?;
        let hash_slots = u32_at(H_HASH_SLOTS)?;
        if entry_count == 0 || hash_slots <= entry_count {
            return Err(TableError::BadLayout("entry count or hash slots"));
        }
        let n = entry_count as usize;
        let entries_off = section(
            &region,
            u64_at(H_ENTRIES_OFF)? as usize,
            n,
            ENTRY_LEN,
            "entries",
        )?;
        let states_off = section(
            &region,
            u64_at(H_STATES_OFF)? as usize,
            n,
            STATE_LEN,
            "states",
        )?;
        let hash_off = section(
            &region,
            u64_at(H_HASH_OFF)? as usize,
            hash_slots as usize,
            SLOT_LEN,
            "hash",
        )?;
        let strings_len = u64_at(H_STRINGS_LEN)? as usize;
        let strings_off = section(
            &region,
            u64_at(H_STRINGS_OFF)? as usize,
            strings_len,
            1,
            "strings",
        )?;
        let ring_cap = u32_at(H_RING_CAP)?;
        if !ring_cap.is_power_of_two() || (ring_cap as usize) < RING_SHARDS {
            return Err(TableError::BadLayout("ring capacity"));
        }
        let ring_off = section(
            &region,
            u64_at(H_RING_OFF)? as usize,
            RING_SLOTS + ring_cap as usize * RING_SLOT_LEN,
            1,
            "ring",
        )?;
        let job_slots = u32_at(H_JOB_SLOTS)?;
        let stats_off = section(
            &region,
            u64_at(H_STATS_OFF)? as usize,
            job_slots as usize,
            JOB_STATS_LEN,
            "stats",
        )?;
        let tier_count = u32_at(H_TIER_COUNT)?;
        if tier_count as usize > MAX_TIERS {
            return Err(TableError::BadLayout("tier count"));
        }
        let chunks_len = u64_at(H_CHUNKS_LEN)? as usize;
        let chunks_off = section(
            &region,
            u64_at(H_CHUNKS_OFF)? as usize,
            chunks_len,
            1,
            "chunks",
        )?;
        if u64_at(H_CHUNK_SIZE)? % 4096 != 0 {
            return Err(TableError::BadLayout("chunk size"));
        }
        let words = bitmap_words(n);
        let transient_off = section(
            &region,
            u64_at(H_TRANSIENT_OFF)? as usize,
            words,
            8,
            "transient bitmap",
        )?;
        let valid_off = section(
            &region,
            u64_at(H_VALID_OFF)? as usize,
            2 * words,
            8,
            "validation bitmap",
        )?;
        let checksums_off = section(
            &region,
            u64_at(H_CHECKSUMS_OFF)? as usize,
            n,
            8,
            "checksums",
        )?;
        let large_count = u32_at(H_LARGE_COUNT)?;
        let large_off = section(
            &region,
            u64_at(H_LARGE_OFF)? as usize,
            large_count as usize,
            LARGE_LEN,
            "large records",
        )?;
        let class_count = u32_at(H_CLASS_COUNT)?;
        let classes_off = section(
            &region,
            u64_at(H_CLASSES_OFF)? as usize,
            class_count as usize,
            CLASS_LEN,
            "stat classes",
        )?;
        let (pack_off, locators_off) = match u64_at(H_PACK_OFF)? as usize {
            0 => (0, 0),
            off => {
                let off = section(&region, off, pack::HEADER_LEN, 1, "pack section")?;
                if region.u64_at(off + pack::F_MAGIC) != Some(pack::MAGIC) {
                    return Err(TableError::BadLayout("pack section magic"));
                }
                let loc = u64_at(off + pack::F_LOCATORS)? as usize;
                (
                    off,
                    section(&region, loc, n, pack::LOCATOR_LEN, "pack locators")?,
                )
            }
        };
        // Tables made before the copy bitmap have zeros here: none, every open looks up.
        let (copy_bits_off, copy_bits) =
            match (u64_at(H_COPY_BITS_OFF)? as usize, u64_at(H_COPY_BITS)?) {
                (0, _) => (0, 0),
                (off, bits) => {
                    if !bits.is_power_of_two() || bits < 64 {
                        return Err(TableError::BadLayout("copy bitmap length"));
                    }
                    let words = usize::try_from(bits / 64)
                        .map_err(|_| TableError::BadLayout("copy bitmap length"))?;
                    (section(&region, off, words, 8, "copy bitmap")?, bits)
                }
            };
        let check_seed = u64_at(H_CHECK_SEED)?;
        Ok(Table {
            source_slot: SLOT_SOURCE,
            check_seed,
            copy_bits_off,
            copy_bits,
            pack_off,
            locators_off,
            region,
            entry_count,
            hash_slots,
            entries_off,
            states_off,
            hash_off,
            strings_off,
            strings_len,
            ring_off,
            ring_cap,
            job_slots,
            stats_off,
            tier_count,
            chunks_off,
            chunks_len,
            transient_off,
            checksums_off,
            large_off,
            large_count,
            valid_off,
            classes_off,
            class_count,
            roots_normal: false,
        }
        .with_roots_checked())
    }

    /// Notes whether both spellings of the source root are normal absolute paths
    /// (`roots_normal`); the header's path slots never change once the table is made.
    fn with_roots_checked(mut self) -> Table {
        self.roots_normal = normal_abs(self.source_root()) && normal_abs(self.source_real_root());
        self
    }

    /// True if both the spelled and the real source root are normal absolute paths: `/`, or
    /// named components only (no empty, `.` or `..` one, no trailing `/`) — the lexical form
    /// that locating a path gives (`granary_core::source::normalize` makes both so).
    pub fn roots_normal(&self) -> bool {
        self.roots_normal
    }

    /// The seed of this table's `path_check`s (`H_CHECK_SEED`): a lookup keys the path's
    /// second hash with it.
    pub fn check_seed(&self) -> u64 {
        self.check_seed
    }

    pub fn region(&self) -> Region {
        self.region
    }

    /// False once the agent has withdrawn the table; clients then pass everything through.
    pub fn is_valid(&self) -> bool {
        self.region
            .atomic_u32(H_FLAGS)
            .is_some_and(|f| f.load(Ordering::Acquire) & FLAG_VALID != 0)
    }

    pub fn set_valid(&self, valid: bool) {
        if let Some(f) = self.region.atomic_u32(H_FLAGS) {
            if valid {
                f.fetch_or(FLAG_VALID, Ordering::Release);
            } else {
                f.fetch_and(!FLAG_VALID, Ordering::Release);
            }
        }
    }

    /// True if the agent asked for `request::OPENED` (`FLAG_REPORT_OPENS`). One relaxed load:
    /// the hooks call it on every open, and a stale answer costs at most one request.
    pub fn reports_opens(&self) -> bool {
        self.region
            .atomic_u32(H_FLAGS)
            .is_some_and(|f| f.load(Ordering::Relaxed) & FLAG_REPORT_OPENS != 0)
    }

    /// Agent side: ask clients for (or stop) `request::OPENED`. Leaves the other flags alone.
    pub fn set_reports_opens(&self, on: bool) {
        if let Some(f) = self.region.atomic_u32(H_FLAGS) {
            if on {
                f.fetch_or(FLAG_REPORT_OPENS, Ordering::Release);
            } else {
                f.fetch_and(!FLAG_REPORT_OPENS, Ordering::Release);
            }
        }
    }

    /// True on a cluster-mode table (`FLAG_CLUSTER`): opens of unplaced files wait for the copy.
    pub fn cluster(&self) -> bool {
        self.region
            .atomic_u32(H_FLAGS)
            .is_some_and(|f| f.load(Ordering::Relaxed) & FLAG_CLUSTER != 0)
    }

    /// Agent side: mark (or unmark) the table as served in cluster mode.
    pub fn set_cluster(&self, on: bool) {
        if let Some(f) = self.region.atomic_u32(H_FLAGS) {
            if on {
                f.fetch_or(FLAG_CLUSTER, Ordering::Release);
            } else {
                f.fetch_and(!FLAG_CLUSTER, Ordering::Release);
            }
        }
    }

    /// False if the agent turned the sequential advice on followed mappings off
    /// (`FLAG_NO_SEQUENTIAL_ADVICE`). One relaxed load.
    pub fn sequential_advice(&self) -> bool {
        self.region
            .atomic_u32(H_FLAGS)
            .is_some_and(|f| f.load(Ordering::Relaxed) & FLAG_NO_SEQUENTIAL_ADVICE == 0)
    }

    /// Agent side: whether the preload advises `MADV_SEQUENTIAL` on followed mappings.
    pub fn set_sequential_advice(&self, on: bool) {
        if let Some(f) = self.region.atomic_u32(H_FLAGS) {
            if on {
                f.fetch_and(!FLAG_NO_SEQUENTIAL_ADVICE, Ordering::Release);
            } else {
                f.fetch_or(FLAG_NO_SEQUENTIAL_ADVICE, Ordering::Release);
            }
        }
    }

    pub fn entry_count(&self) -> u32 {
        self.entry_count
    }

    pub fn tier_count(&self) -> u32 {
        self.tier_count
    }

    pub fn job_slots(&self) -> u32 {
        self.job_slots
    }

    pub fn agent_pid(&self) -> u32 {
        self.region.u32_at(H_AGENT_PID).unwrap_or(0)
    }

    pub fn root_parent_ino(&self) -> u64 {
        self.region.u64_at(H_ROOT_PARENT_INO).unwrap_or(0)
    }

    /// One of the header's path slots (`SLOT_*`), without a trailing NUL.
    pub fn path_slot(&self, slot: usize) -> Option<&[u8]> {
        if slot >= PATH_SLOTS {
            return None;
        }
        let off = PATHS_OFF + slot * PATH_SLOT_LEN;
        let len = self.region.u32_at(off)? as usize;
        if len > PATH_MAX_LEN {
            return None;
        }
        self.region.bytes(off + 8, len)
    }

    /// The source root as the user named it when the table was made (lexically normalised,
    /// absolute; a symlink to `source_real_root` or the same path), unless this view forgot it
    /// (`forget_spelling`): then the real root.
    pub fn source_root(&self) -> &[u8] {
        self.path_slot(self.source_slot).unwrap_or(b"")
    }

    /// This view stops taking the recorded spelling for the source (`source_root` becomes the
    /// real root, for every lookup and link target): a process that found the spelling naming
    /// another directory than the catalogued one (a symlink retargeted since the table was
    /// made) must not read the catalogued directory's copies under that name.
    pub fn forget_spelling(&mut self) {
        self.source_slot = SLOT_SOURCE_REAL;
    }

    pub fn source_real_root(&self) -> &[u8] {
        self.path_slot(SLOT_SOURCE_REAL).unwrap_or(b"")
    }

    /// Tier `t`'s object directory as the agent created it: `(st_dev, st_ino)`.
    pub fn tier_dir_id(&self, tier: u32) -> Option<(u64, u64)> {
        if tier >= self.tier_count {
            return None;
        }
        let off = H_TIER_DIR_IDS + 16 * tier as usize;
        Some((self.region.u64_at(off)?, self.region.u64_at(off + 8)?))
    }

    /// The agent's credentials: `(uid, gid, hash of the sorted supplementary groups)`.
    pub fn agent_creds(&self) -> (u32, u32, u64) {
        (
            self.region.u32_at(H_CREDS).unwrap_or(u32::MAX),
            self.region.u32_at(H_CREDS + 4).unwrap_or(u32::MAX),
            self.region.u64_at(H_CREDS + 8).unwrap_or(0),
        )
    }

    /// Object directory of tier `t`.
    pub fn tier_dir(&self, tier: u32) -> Option<&[u8]> {
        if tier >= self.tier_count {
            return None;
        }
        self.path_slot(SLOT_TIER0 + tier as usize)
    }

    /// The stored record of entry `idx`.
    pub fn disk_entry(&self, idx: u32) -> Option<DiskEntry> {
        if idx >= self.entry_count {
            return None;
        }
        self.region
            .read(self.entries_off + idx as usize * ENTRY_LEN)
    }

    fn class(&self, ix: u16) -> Option<StatClass> {
        if ix as u32 >= self.class_count {
            return None;
        }
        self.region.read(self.classes_off + ix as usize * CLASS_LEN)
    }

    /// Entry `idx`, decoded. `None` for an index out of range or a damaged record.
    pub fn entry(&self, idx: u32) -> Option<EntryRec> {
        let d = self.disk_entry(idx)?;
        let c = self.class(d.class)?;
        let stat = d.stat(&c);
        let (mut e, kind) = (
            EntryRec {
                object: d.object,
                parent: d.parent,
                name_off: d.name_off,
                name_len: d.name_len as u32,
                stat,
                ..EntryRec::default()
            },
            stat.file_type(),
        );
        match kind {
            libc::S_IFDIR => {
                e.first_child = d.aux;
                e.child_count = d.aux2;
            }
            libc::S_IFLNK => {
                e.link_off = d.aux;
                e.link_len = d.aux2;
            }
            libc::S_IFREG => e.large = d.aux,
            _ => {}
        }
        Some(e)
    }

    /// Entry `idx`'s object id, size and class index, read from its stored record alone.
    #[inline]
    pub fn file_fields(&self, idx: u32) -> Option<(u64, u64, u16)> {
        if idx >= self.entry_count {
            return None;
        }
        let rec = self.entries_off + idx as usize * ENTRY_LEN;
        let class = u16::from_ne_bytes(
            self.region
                .bytes(rec + core::mem::offset_of!(DiskEntry, class), 2)?
                .try_into()
                .ok()?,
        );
        Some((
            self.region
                .u64_at(rec + core::mem::offset_of!(DiskEntry, object))?,
            self.region
                .u64_at(rec + core::mem::offset_of!(DiskEntry, size))?,
            class,
        ))
    }

    /// `st_mode` and `st_uid` of class `ix`; `None` where `class` is (out of range).
    #[inline]
    pub(crate) fn class_mode_uid(&self, ix: u16) -> Option<(u32, u32)> {
        if ix as u32 >= self.class_count {
            return None;
        }
        let at = self.classes_off + ix as usize * CLASS_LEN;
        Some((
            self.region
                .u32_at(at + core::mem::offset_of!(StatClass, mode))?,
            self.region
                .u32_at(at + core::mem::offset_of!(StatClass, uid))?,
        ))
    }

    fn string(&self, off: u32, len: u32) -> Option<&[u8]> {
        let end = (off as usize).checked_add(len as usize)?;
        if end > self.strings_len {
            return None;
        }
        self.region
            .bytes(self.strings_off + off as usize, len as usize)
    }

    /// The parent of entry `idx` (the root is its own), read without decoding the entry.
    #[inline]
    pub fn parent_of(&self, idx: u32) -> Option<u32> {
        if idx >= self.entry_count {
            return None;
        }
        self.region.u32_at(
            self.entries_off + idx as usize * ENTRY_LEN + core::mem::offset_of!(DiskEntry, parent),
        )
    }

    /// Last component of an entry's path: the name a listing shows ("" for the root).
    pub fn name(&self, e: &EntryRec) -> Option<&[u8]> {
        self.string(e.name_off, e.name_len)
    }

    fn disk_name(&self, d: &DiskEntry) -> Option<&[u8]> {
        self.string(d.name_off, d.name_len as u32)
    }

    /// Target of a symlink entry, as `readlink` returns it.
    pub fn link_target(&self, e: &EntryRec) -> Option<&[u8]> {
        if !e.stat.is_symlink() {
            return None;
        }
        self.string(e.link_off, e.link_len)
    }

    /// Length of entry `idx`'s path relative to the source root ("" for the root); `None` for a
    /// damaged chain of parents or a path longer than `PATH_MAX_LEN`.
    pub fn rel_path_len(&self, idx: u32) -> Option<usize> {
        let mut len = 0usize;
        let mut cur = idx;
        for _ in 0..PATH_MAX_LEN {
            if cur == 0 {
                return (len <= PATH_MAX_LEN).then_some(len.saturating_sub(1));
            }
            let d = self.disk_entry(cur)?;
            len += d.name_len as usize + 1;
            if d.parent >= cur || len > PATH_MAX_LEN + 1 {
                return None;
            }
            cur = d.parent;
        }
        None
    }

    /// Writes entry `idx`'s path relative to the source root into `out` and returns its length:
    /// allocation-free, from the last component backwards (a parent precedes its children, so
    /// the chain ends at the root).
    pub fn write_rel_path(&self, idx: u32, out: &mut [u8]) -> Option<usize> {
        let len = self.rel_path_len(idx)?;
        let out = out.get_mut(..len)?;
        self.rel_path_pieces(idx, len, |at, piece| {
            if let Some(dst) = out.get_mut(at..at + piece.len()) {
                dst.copy_from_slice(piece);
            }
        })?;
        Some(len)
    }

    /// Calls `put(offset, bytes)` for each piece (names and the `/` between them) of entry
    /// `idx`'s relative path of length `len` (`rel_path_len`), last first: for writers into
    /// buffers that are not plain slices.
    pub fn rel_path_pieces(
        &self,
        idx: u32,
        len: usize,
        mut put: impl FnMut(usize, &[u8]),
    ) -> Option<()> {
        let mut end = len;
        let mut cur = idx;
        while cur != 0 {
            let d = self.disk_entry(cur)?;
            let name = self.disk_name(&d)?;
            let start = end.checked_sub(name.len())?;
            put(start, name);
            if start == 0 {
                break;
            }
            put(start - 1, b"/");
            end = start - 1;
            cur = d.parent;
        }
        // A consistent chain of names fills exactly `len` bytes (the loop breaks at offset 0).
        Some(())
    }

    /// Entry `idx`'s path relative to the source root, allocated (agent side only).
    pub fn rel_path_vec(&self, idx: u32) -> Option<Vec<u8>> {
        let mut v = vec![0u8; self.rel_path_len(idx)?];
        self.write_rel_path(idx, &mut v)?;
        Some(v)
    }

    /// Entry index of a path relative to the source root, without following symlinks.
    ///
    /// For a catalogued path: its hash slot, whose tag turns away every other path's slot on
    /// the way without reading its entry, then its entry's record, whose `object` (the path's
    /// `path_hash`) and `check` (its `path_check`, keyed with the table's seed) confirm the
    /// path — 128 bits, no name read (docs/decisions.md, "A lookup confirms a path by a second
    /// hash") — beside the lines of its state and checksum, which the open and the first read
    /// want next. An uncatalogued path reads only slots (but for a tag equal by chance, 1 in
    /// 2^32).
    pub fn lookup(&self, rel: &[u8]) -> Option<u32> {
        self.lookup_hashed(rel, path_hash(rel))
    }

    /// `lookup` of `rel` whose `path_hash` the caller has already.
    #[inline]
    pub fn lookup_hashed(&self, rel: &[u8], h: u64) -> Option<u32> {
        // The path's second hash, made once the first slot whose tag and entry match is found.
        let mut check = None;
        self.probe(h, |idx, _| {
            self.prefetch_entry_words(idx);
            let rec = self.entries_off + idx as usize * ENTRY_LEN;
            let object = self
                .region
                .u64_at(rec + core::mem::offset_of!(DiskEntry, object))?;
            if object != h {
                return Some(false);
            }
            let stored = self
                .region
                .u64_at(rec + core::mem::offset_of!(DiskEntry, check))?;
            Some(stored == *check.get_or_insert_with(|| path_check(rel, self.check_seed)))
        })
    }

    /// What the copy bitmap (`H_COPY_BITS_OFF`) says of the file whose path hashes to `hash`
    /// (`path_hash`): no copy of it can exist (its bit is clear), so an open of it goes to the
    /// source whatever its entry says; or one may. Either way the lines the lookup reads next
    /// start loading now (`warm_home`), so the caller's next system call (the source's open,
    /// or the copy's) overlaps them. A hint, never a fact: `Table::find` decides once the call
    /// is made.
    #[inline]
    pub fn copy_hint(&self, hash: u64) -> CopyHint {
        let Some(w) = self.copy_word(hash) else {
            return CopyHint::Unknown;
        };
        let (word, mask) = w;
        let slot = home_slot(hash, self.hash_slots);
        self.region
            .prefetch(self.hash_off + slot as usize * SLOT_LEN);
        let no_copy = word.load(Ordering::Relaxed) & mask == 0;
        // A path that may have a copy is nearly always catalogued: its probe sequence ends at
        // its own slot, and the lookup right after walks the same slots (cached by then), so
        // following it to the end costs nothing extra and finds a symlink's mark wherever its
        // slot lies. One without is mostly a path the catalog does not hold, whose sequence
        // runs to an empty slot: two slots warm most of what its lookup reads.
        let probes = if no_copy { 2 } else { self.hash_slots };
        let link = self.warm_home(hash, slot, probes);
        if no_copy {
            CopyHint::NoCopy
        } else if link {
            CopyHint::Link
        } else {
            CopyHint::Maybe
        }
    }

    /// Starts loading the lines a lookup of `hash` reads after the slot — the entry's record,
    /// state and checksum — for the first slot of its probe sequence whose tag matches,
    /// so that they load during the caller's next system call rather than after it (the slot's
    /// own line was asked for with the copy bitmap's word, and mostly came with it). Reads
    /// slots only, at most `probes`; a tag equal by chance warms another entry's lines, nothing
    /// else. True when the slot found is a symlink's (`SLOT_LINK`).
    #[inline]
    fn warm_home(&self, hash: u64, mut slot: u32, probes: u32) -> bool {
        for _ in 0..probes {
            let off = self.hash_off + slot as usize * SLOT_LEN;
            let (Some(tag), Some(idx1)) = (self.region.u32_at(off), self.region.u32_at(off + 4))
            else {
                return false;
            };
            if idx1 == 0 {
                return false;
            }
            if let Some(idx) = slot_entry(tag, idx1, hash) {
                self.prefetch_entry_words(idx);
                if idx < self.entry_count {
                    self.region
                        .prefetch(self.valid_off + (idx / 64) as usize * 8);
                }
                return idx1 & SLOT_LINK != 0;
            }
            slot = next_slot(slot, self.hash_slots);
        }
        false
    }

    /// The entry a path hashing to `hash` may name, if the first slot of its probe whose tag
    /// matches says a small file (`SLOT_SMALL_FILE`) — unverified: another path whose hash has
    /// the same high 32 bits may own that slot. Only what no byte or metadata answer rests on
    /// may use it (`ops::open`'s close hint). Reads slots only: no entry, name or state line.
    #[inline]
    pub fn small_file_slot(&self, hash: u64) -> Option<u32> {
        let mut small = false;
        let idx = self.probe(hash, |_, slot_off| {
            small = self
                .region
                .u32_at(slot_off + 4)
                .is_some_and(|w| w & SLOT_SMALL_FILE != 0);
            Some(true)
        })?;
        small.then_some(idx)
    }

    /// True if `copy_hint` says no copy of `rel` can exist.
    pub fn no_copy_yet(&self, rel: &[u8]) -> bool {
        self.copy_hint(path_hash(rel)) == CopyHint::NoCopy
    }

    /// The copy bitmap's word holding `hash`'s bit, and the bit's mask; `None` without a bitmap.
    #[inline]
    fn copy_word(&self, hash: u64) -> Option<(&AtomicU64, u64)> {
        if self.copy_bits == 0 {
            return None;
        }
        let (word, mask) = copy_word(hash, self.copy_bits);
        Some((self.region.atomic_u64(self.copy_bits_off + word)?, mask))
    }

    /// Bits of the copy bitmap (`H_COPY_BITS`); 0: the table has none.
    pub fn copy_bits(&self) -> u64 {
        self.copy_bits
    }

    /// Entry `idx` is about to get a copy: the copy bitmap says so first (`copy_hint`).
    fn mark_may_be_placed(&self, idx: u32) {
        if idx >= self.entry_count {
            return;
        }
        let Some(object) = self
            .region
            .u64_at(self.entries_off + idx as usize * ENTRY_LEN)
        else {
            return;
        };
        if let Some((word, mask)) = self.copy_word(object) {
            if word.load(Ordering::Relaxed) & mask == 0 {
                word.fetch_or(mask, Ordering::SeqCst);
            }
        }
    }

    /// Walks `key`'s probe sequence: each entry whose slot tag matches `key` is asked `is`
    /// (with its slot's offset; `None`: the table cannot be read there, the walk ends). An
    /// empty slot ends it.
    #[inline]
    fn probe(&self, key: u64, mut is: impl FnMut(u32, usize) -> Option<bool>) -> Option<u32> {
        let mut slot = home_slot(key, self.hash_slots);
        for _ in 0..self.hash_slots {
            let off = self.hash_off + slot as usize * SLOT_LEN;
            let idx1 = self.region.u32_at(off + 4)?;
            if idx1 == 0 {
                return None;
            }
            if let Some(idx) = slot_entry(self.region.u32_at(off)?, idx1, key) {
                if is(idx, off)? {
                    return Some(idx);
                }
            }
            slot = next_slot(slot, self.hash_slots);
        }
        None
    }

    /// Starts loading entry `idx`'s lines: its record (which may straddle two), its state and
    /// its checksum.
    #[inline]
    fn prefetch_entry_words(&self, idx: u32) {
        if idx < self.entry_count {
            let rec = self.entries_off + idx as usize * ENTRY_LEN;
            self.region.prefetch(rec);
            self.region.prefetch(rec + ENTRY_LEN - 1);
            self.region
                .prefetch(self.states_off + idx as usize * STATE_LEN);
            self.region.prefetch(self.checksums_off + idx as usize * 8);
        }
    }

    /// Entry index of the catalogued path whose object id (`object_id`) is `object`: the path
    /// hash is the hash-table key, so this is one probe sequence.
    pub fn lookup_object(&self, object: u64) -> Option<u32> {
        self.probe(object, |idx, _| {
            Some(self.disk_entry(idx)?.object == object)
        })
    }

    fn state_block(&self, idx: u32, word: usize) -> Option<&AtomicU64> {
        if idx >= self.entry_count {
            return None;
        }
        self.region
            .atomic_u64(self.states_off + idx as usize * STATE_LEN + word)
    }

    fn state_cell(&self, idx: u32) -> Option<&AtomicU64> {
        self.state_block(idx, STATE_WORD)
    }

    fn checksum_cell(&self, idx: u32) -> Option<&AtomicU64> {
        if idx >= self.entry_count {
            return None;
        }
        self.region
            .atomic_u64(self.checksums_off + idx as usize * 8)
    }

    /// File type bits (`S_IFMT`) of a stored entry.
    fn file_type_of(&self, d: &DiskEntry) -> u32 {
        if d.class as u32 >= self.class_count {
            return 0;
        }
        self.region
            .u32_at(self.classes_off + d.class as usize * CLASS_LEN + 32)
            .map_or(0, |m| m & libc::S_IFMT)
    }

    /// A word of entry `idx`'s large record (`LARGE_*`), if it has one.
    fn large_cell(&self, idx: u32, word: usize) -> Option<&AtomicU64> {
        let d = self.disk_entry(idx)?;
        if d.aux == 0 || d.aux > self.large_count || self.file_type_of(&d) != libc::S_IFREG {
            return None;
        }
        self.region
            .atomic_u64(self.large_off + (d.aux - 1) as usize * LARGE_LEN + word)
    }

    /// True if entry `idx` has a large record: the agent can publish a whole-file fetch's
    /// progress and its chunks.
    pub fn has_large_record(&self, idx: u32) -> bool {
        self.large_cell(idx, LARGE_PROGRESS).is_some()
    }

    /// Bytes of the partial copy that are written and readable (meaningful while PLACING).
    /// Acquire: a client that sees `n` may read the first `n` bytes of `<object>.part`.
    pub fn progress(&self, idx: u32) -> u64 {
        self.large_cell(idx, LARGE_PROGRESS)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Agent side: publishes progress (never moves backwards).
    pub(crate) fn set_progress(&self, idx: u32, bytes: u64) {
        if let Some(c) = self.large_cell(idx, LARGE_PROGRESS) {
            c.fetch_max(bytes, Ordering::Release);
        }
    }

    /// Agent side: a new partial copy starts from zero.
    pub(crate) fn reset_progress(&self, idx: u32) {
        if let Some(c) = self.large_cell(idx, LARGE_PROGRESS) {
            c.store(0, Ordering::Release);
        }
    }

    /// The identity the agent recorded for the entry's copy: `(inode, ctime ns)`; the ctime is
    /// 0 while the copy is still being written (PLACING). Acquire, like `state`.
    pub fn copy_identity(&self, idx: u32) -> (u64, u64) {
        let load = |w| {
            self.state_block(idx, w)
                .map_or(0, |c| c.load(Ordering::Acquire))
        };
        (load(STATE_COPY_INO), load(STATE_COPY_CTIME))
    }

    /// Agent side: records the copy's inode (before the state word names its tier) and ctime
    /// (before PLACED).
    pub(crate) fn set_copy_identity(&self, idx: u32, ino: u64, ctime_ns: u64) {
        if let (Some(i), Some(c)) = (
            self.state_block(idx, STATE_COPY_INO),
            self.state_block(idx, STATE_COPY_CTIME),
        ) {
            i.store(ino, Ordering::Release);
            c.store(ctime_ns, Ordering::Release);
        }
    }

    pub fn chunk_size(&self) -> u64 {
        self.region.u64_at(H_CHUNK_SIZE).unwrap_or(0)
    }

    pub fn prefetch_min_size(&self) -> u64 {
        self.region.u64_at(H_PREFETCH_MIN_SIZE).unwrap_or(u64::MAX)
    }

    /// Number of chunks of an entry that has a chunk bitmap (files larger than one chunk), else 0.
    pub fn chunk_count(&self, idx: u32) -> u64 {
        let has_bitmap = self
            .large_cell(idx, LARGE_CHUNKS)
            .is_some_and(|c| c.load(Ordering::Relaxed) != 0);
        match (has_bitmap, self.disk_entry(idx)) {
            (true, Some(d)) => chunk_count(d.size, self.chunk_size()),
            _ => 0,
        }
    }

    fn chunk_word(&self, idx: u32, chunk: u64) -> Option<(&AtomicU64, u64)> {
        if chunk >= self.chunk_count(idx) {
            return None;
        }
        let base = self.large_cell(idx, LARGE_CHUNKS)?.load(Ordering::Relaxed) as usize;
        let off = base.checked_add((chunk / 64) as usize * 8)?;
        if off.checked_add(8)? > self.chunks_len {
            return None;
        }
        Some((
            self.region.atomic_u64(self.chunks_off + off)?,
            1u64 << (chunk % 64),
        ))
    }

    /// True if chunk `chunk` of a PARTIAL entry is complete in its chunk file (Acquire).
    pub fn chunk_present(&self, idx: u32, chunk: u64) -> bool {
        self.chunk_word(idx, chunk)
            .is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
    }

    /// Agent side: marks a chunk complete (Release: after its bytes are written) or absent.
    pub(crate) fn set_chunk(&self, idx: u32, chunk: u64, present: bool) {
        if let Some((w, bit)) = self.chunk_word(idx, chunk) {
            if present {
                w.fetch_or(bit, Ordering::Release);
            } else {
                w.fetch_and(!bit, Ordering::Release);
            }
        }
    }

    fn bit(&self, section: usize, idx: u32) -> Option<(&AtomicU64, u64)> {
        if idx >= self.entry_count {
            return None;
        }
        let w = self.region.atomic_u64(section + (idx / 64) as usize * 8)?;
        Some((w, 1u64 << (idx % 64)))
    }

    fn transient_word(&self, idx: u32) -> Option<(&AtomicU64, u64)> {
        self.bit(self.transient_off, idx)
    }

    /// True if entry `idx` was checked against the source in the current attach (or vouched
    /// for by its directory when the source is immutable): only then may the catalog answer for
    /// it. Acquire: pairs with the Release of whoever validated it.
    #[inline]
    pub fn is_validated(&self, idx: u32) -> bool {
        self.bit(self.valid_off, idx)
            .is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
    }

    /// Marks entry `idx` validated (`lifecycle` decides when).
    pub(crate) fn set_validated(&self, idx: u32) {
        if let Some((w, bit)) = self.bit(self.valid_off, idx) {
            w.fetch_or(bit, Ordering::Release);
        }
    }

    /// Marks entries `first .. first + count` validated (a directory's children).
    pub(crate) fn set_validated_range(&self, first: u32, count: u32) {
        let end = first.saturating_add(count).min(self.entry_count);
        let mut i = first;
        while i < end {
            let word_end = ((i / 64) + 1) * 64;
            let stop = end.min(word_end);
            let lo = i % 64;
            let n = stop - i;
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << lo
            };
            if let Some(w) = self
                .region
                .atomic_u64(self.valid_off + (i / 64) as usize * 8)
            {
                w.fetch_or(mask, Ordering::Release);
            }
            i = stop;
        }
    }

    /// Entry `idx`'s being-checked bit: the word after the validation bitmap's last.
    fn checking_word(&self, idx: u32) -> Option<(&AtomicU64, u64)> {
        let words = bitmap_words(self.entry_count as usize);
        self.bit(self.valid_off + words * 8, idx)
    }

    /// Sets entry `idx`'s being-checked bit; true if this call set it (no one else holds it).
    pub(crate) fn try_claim_check(&self, idx: u32) -> bool {
        self.checking_word(idx)
            .is_some_and(|(w, bit)| w.fetch_or(bit, Ordering::AcqRel) & bit == 0)
    }

    /// Clears entry `idx`'s being-checked bit. Release: the verdict's effects are visible to
    /// whoever sees it clear.
    pub(crate) fn release_check(&self, idx: u32) {
        if let Some((w, bit)) = self.checking_word(idx) {
            w.fetch_and(!bit, Ordering::Release);
        }
    }

    /// True while some process checks entry `idx` against the source.
    pub fn is_being_checked(&self, idx: u32) -> bool {
        self.checking_word(idx)
            .is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit != 0)
    }

    /// Agent side: a new attach starts — nothing is validated, nothing is being checked
    /// (`lifecycle::new_attach`).
    pub(crate) fn clear_validated(&self) {
        for k in 0..2 * bitmap_words(self.entry_count as usize) {
            if let Some(w) = self.region.atomic_u64(self.valid_off + k * 8) {
                w.store(0, Ordering::Release);
            }
        }
    }

    /// The attach epoch (`H_EPOCH`).
    pub fn epoch(&self) -> u64 {
        self.region
            .atomic_u64(H_EPOCH)
            .map_or(0, |e| e.load(Ordering::Acquire))
    }

    /// Agent side: bumps the attach epoch; returns the new one.
    pub fn bump_epoch(&self) -> u64 {
        self.region
            .atomic_u64(H_EPOCH)
            .map_or(0, |e| e.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// True while the current attach validates per directory (`FLAG_IMMUTABLE`).
    pub fn immutable(&self) -> bool {
        self.region
            .atomic_u32(H_FLAGS)
            .is_some_and(|f| f.load(Ordering::Relaxed) & FLAG_IMMUTABLE != 0)
    }

    pub fn set_immutable(&self, on: bool) {
        if let Some(f) = self.region.atomic_u32(H_FLAGS) {
            if on {
                f.fetch_or(FLAG_IMMUTABLE, Ordering::Release);
            } else {
                f.fetch_and(!FLAG_IMMUTABLE, Ordering::Release);
            }
        }
    }

    /// True if the entry's copy is transient: whoever finishes reading it drops its pages from
    /// the page cache, so that the resident copies keep theirs (`residency` in the agent).
    /// Relaxed: a stale answer costs a page-cache miss or a hit, never a wrong byte.
    pub fn is_transient(&self, idx: u32) -> bool {
        self.transient_word(idx)
            .is_some_and(|(w, bit)| w.load(Ordering::Relaxed) & bit != 0)
    }

    /// Agent side: marks the entry transient or resident; returns what it was.
    pub(crate) fn set_transient(&self, idx: u32, transient: bool) -> bool {
        self.transient_word(idx).is_some_and(|(w, bit)| {
            let old = if transient {
                w.fetch_or(bit, Ordering::Relaxed)
            } else {
                w.fetch_and(!bit, Ordering::Relaxed)
            };
            old & bit != 0
        })
    }

    /// The agent's last heartbeat (CLOCK_MONOTONIC ns); 0 before the first.
    pub fn heartbeat(&self) -> u64 {
        self.region
            .atomic_u64(H_HEARTBEAT)
            .map_or(0, |h| h.load(Ordering::Acquire))
    }

    pub fn beat(&self, now_ns: u64) {
        if let Some(h) = self.region.atomic_u64(H_HEARTBEAT) {
            h.store(now_ns, Ordering::Release);
        }
    }

    /// True if the agent beat within `HEARTBEAT_STALE_MS` of `now_ns` (CLOCK_MONOTONIC).
    pub fn agent_alive(&self, now_ns: u64) -> bool {
        let h = self.heartbeat();
        h != 0 && now_ns.saturating_sub(h) < HEARTBEAT_STALE_MS * 1_000_000
    }

    /// The entry's state word; Acquire so a `Placed` word implies the copy is complete. An index
    /// outside the table reads as `Stale` (the catalog answers nothing about it).
    pub fn state(&self, idx: u32) -> StateWord {
        self.state_cell(idx).map_or(StateWord::VOID, |c| {
            StateWord::from_bits(c.load(Ordering::Acquire))
        })
    }

    /// For `lifecycle`.
    pub(crate) fn set_state(&self, idx: u32, word: StateWord) {
        if word.state() == State::Placed {
            self.mark_may_be_placed(idx);
        }
        if let Some(c) = self.state_cell(idx) {
            c.store(word.bits(), Ordering::Release);
        }
    }

    /// Compare-and-swap of a state word, for `lifecycle`; false if it was not `from`.
    pub(crate) fn swap_state(&self, idx: u32, from: StateWord, to: StateWord) -> bool {
        if to.state() == State::Placed {
            // Before the word can say so (if the swap then fails, the bit only costs a lookup).
            self.mark_may_be_placed(idx);
        }
        self.state_cell(idx).is_some_and(|c| {
            c.compare_exchange(from.bits(), to.bits(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    pub fn checksum(&self, idx: u32) -> u64 {
        self.checksum_cell(idx)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    pub(crate) fn set_checksum(&self, idx: u32, sum: u64) {
        if let Some(c) = self.checksum_cell(idx) {
            c.store(sum, Ordering::Release);
        }
    }

    pub(crate) fn ring(&self) -> crate::ring::Ring<'_> {
        crate::ring::Ring::new(&self.region, self.ring_off, self.ring_cap)
    }

    /// Asks the agent for something (`request::*`). Never blocks; returns false if the ring is
    /// full — requests are hints, and the next open will ask again.
    pub fn push_request(&self, kind: u8, entry: u32) -> bool {
        let r = self.ring();
        let pushed = r.push(request::encode(kind, entry));
        if pushed {
            r.ring_bell();
        }
        pushed
    }

    /// A request with an argument (24 bits; see `request::encode_arg`).
    pub fn push_request_arg(&self, kind: u8, entry: u32, arg: u32) -> bool {
        let r = self.ring();
        let pushed = r.push(request::encode_arg(kind, entry, arg));
        if pushed {
            r.ring_bell();
        }
        pushed
    }

    /// A request nobody waits for (a small file closed, or opened where the agent follows opens:
    /// its copy is made later anyway), pushed without waking a sleeping consumer — no system call for the program, and
    /// the agent takes such requests in batches at its next look (within a millisecond while
    /// requests flow) — but at every quarter of its shard, so a burst is never lost to a full
    /// ring.
    pub fn push_hint_arg(&self, kind: u8, entry: u32, arg: u32) -> bool {
        let r = self.ring();
        match r.push_at(request::encode_arg(kind, entry, arg)) {
            Some(pos) => {
                if r.quarter_mark(pos) {
                    r.ring_bell();
                }
                true
            }
            None => false,
        }
    }

    /// Agent side: a copy was just published (PLACED); clients waiting for one wake up.
    pub fn notify_placed(&self) {
        self.ring().notify_placed();
    }

    /// Client side: how many copies were published so far (wrapping); read before looking at
    /// the entries waited for, then `wait_placed` sleeps only if none was published since.
    pub fn placed_count(&self) -> u32 {
        self.ring().placed_count()
    }

    /// Client side: sleeps until the agent publishes a copy after `seen` (`placed_count`), or
    /// `timeout` passes. True if a signal ended the wait.
    pub fn wait_placed(&self, seen: u32, timeout: std::time::Duration) -> bool {
        self.ring().wait_placed(seen, timeout)
    }

    /// Agent side, with the ring empty: sleeps until a client pushes a request or `timeout`
    /// passes (a client that pushes while it sleeps wakes it: no polling delay on an open).
    pub fn wait_for_requests(&self, timeout: std::time::Duration) {
        self.ring().sleep(timeout);
    }

    /// Agent side: empties the ring (a saved table's, before another agent uses it).
    pub fn reset_ring(&self) {
        self.ring().reset();
    }

    /// Agent side: names the agent that owns the table (a loaded table's new owner).
    pub fn set_agent_pid(&self, pid: u32) {
        if let Some(p) = self.region.atomic_u32(H_AGENT_PID) {
            p.store(pid, Ordering::Release);
        }
    }

    /// Agent side: the next request, if any.
    pub fn pop_request(&self) -> Option<Request> {
        self.ring().pop().map(|v| {
            let (kind, entry) = request::decode(v);
            Request {
                kind,
                entry,
                arg: request::arg_of(v),
            }
        })
    }

    /// Requests pushed (or being pushed) and not yet popped. Allocation-free; a snapshot.
    pub fn ring_backlog(&self) -> u64 {
        self.ring().backlog()
    }

    /// Agent side: skips a slot a producer claimed but never filled (it died in between), once
    /// it was found so at the last call too (`seen`, kept by the caller between calls; start
    /// with `[u64::MAX; RING_SHARDS]`).
    pub fn skip_stuck_request(&self, seen: &mut [u64; crate::layout::RING_SHARDS]) -> bool {
        self.ring().skip_stuck(seen)
    }

    /// True if the table serves a pack (`granary run --pack`): its entries' bytes come from the
    /// pack's partitions (`locator`), and the agent checked the tree per directory before the
    /// program started.
    #[inline]
    pub fn is_packed(&self) -> bool {
        self.pack_off != 0
    }

    /// True if the tree exists only in the pack (`--mount`): nothing may be passed through to
    /// its path, which names nothing on the file system.
    #[inline]
    pub fn pack_mount(&self) -> bool {
        self.pack_off != 0
            && self
                .region
                .u32_at(self.pack_off + pack::F_FLAGS)
                .is_some_and(|f| f & pack::FLAG_MOUNT != 0)
    }

    /// Raw bytes per frame of the pack's framed files.
    pub fn pack_block_size(&self) -> u32 {
        if self.pack_off == 0 {
            return 0;
        }
        self.region
            .u32_at(self.pack_off + pack::F_BLOCK)
            .unwrap_or(0)
    }

    pub fn pack_partitions(&self) -> u32 {
        if self.pack_off == 0 {
            return 0;
        }
        self.region
            .u32_at(self.pack_off + pack::F_PARTITIONS)
            .unwrap_or(0)
    }

    /// The pack id every partition header repeats.
    pub fn pack_id(&self) -> Option<&[u8]> {
        if self.pack_off == 0 {
            return None;
        }
        self.region.bytes(self.pack_off + pack::F_ID, 16)
    }

    fn pack_path(&self, field: usize) -> Option<&[u8]> {
        if self.pack_off == 0 {
            return None;
        }
        let off = self.pack_off + field;
        let len = self.region.u32_at(off)? as usize;
        if len > PATH_MAX_LEN {
            return None;
        }
        self.region.bytes(off + 8, len)
    }

    /// The pack directory (absolute).
    pub fn pack_dir(&self) -> Option<&[u8]> {
        self.pack_path(pack::F_DIR)
    }

    /// The empty directory whose fds stand for the tree's directories under `pack_mount`.
    pub fn pack_empty_dir(&self) -> Option<&[u8]> {
        self.pack_path(pack::F_EMPTY)
    }

    /// Where entry `idx`'s bytes are in the pack; `None` if the table serves no pack or the
    /// entry's bytes are not in it (not a packed regular file, or changed since packing).
    pub fn locator(&self, idx: u32) -> Option<Locator> {
        if self.pack_off == 0 || idx >= self.entry_count {
            return None;
        }
        let at = self.locators_off + idx as usize * pack::LOCATOR_LEN;
        let tail = self.region.bytes(at + 28, 2)?;
        let l = Locator {
            offset: self.region.u64_at(at)?,
            stored_len: self.region.u64_at(at + 8)?,
            checksum: self.region.u64_at(at + 16)?,
            partition: self.region.u32_at(at + 24)?,
            codec: tail[0],
            flags: tail[1],
        };
        l.is_packed().then_some(l)
    }

    /// Bytes the agent has read from the pack's partitions so far (a client waiting for a
    /// packed file gives up when this stands still).
    pub fn pack_streamed(&self) -> u64 {
        if self.pack_off == 0 {
            return 0;
        }
        self.region
            .atomic_u64(self.pack_off + pack::F_STREAMED)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Agent side: `n` more bytes read from the partitions.
    pub fn add_pack_streamed(&self, n: u64) {
        if self.pack_off == 0 {
            return;
        }
        if let Some(c) = self.region.atomic_u64(self.pack_off + pack::F_STREAMED) {
            c.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// A job word (`job::*`) of job slot `slot`; slot 0 when the slot is out of range. For the
    /// words below `job::SHARDED` this is only the part counted outside the shards: their
    /// value is `job_value`.
    pub fn counter(&self, slot: u32, word: usize) -> Option<&AtomicU64> {
        if word >= job::WORDS || self.job_slots == 0 {
            return None;
        }
        let slot = if slot < self.job_slots { slot } else { 0 };
        self.region
            .atomic_u64(self.stats_off + slot as usize * JOB_STATS_LEN + word * 8)
    }

    /// The calling process's shard of counter `word` (below `job::SHARDED`) of slot `slot`.
    #[inline]
    fn shard(&self, slot: u32, word: usize) -> Option<&AtomicU64> {
        if self.job_slots == 0 {
            return None;
        }
        let slot = if slot < self.job_slots { slot } else { 0 };
        let shard = crate::shard::process_shard() % COUNTER_SHARDS;
        self.region.atomic_u64(
            self.stats_off
                + slot as usize * JOB_STATS_LEN
                + COUNTER_SHARDS_AT
                + shard * COUNTER_SHARD_LEN
                + word * 8,
        )
    }

    /// Adds `n` to a job word: a counter below `job::SHARDED` in this process's shard.
    #[inline]
    pub fn count(&self, slot: u32, word: usize, n: u64) {
        let c = if word < job::SHARDED && word != job::OWNER {
            self.shard(slot, word)
        } else {
            self.counter(slot, word)
        };
        if let Some(c) = c {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A job word's value: for a counter below `job::SHARDED`, the sum of its shards.
    pub fn job_value(&self, slot: u32, word: usize) -> u64 {
        let Some(base) = self.counter(slot, word) else {
            return 0;
        };
        let mut v = base.load(Ordering::Relaxed);
        if word < job::SHARDED && word != job::OWNER {
            let slot = if slot < self.job_slots { slot } else { 0 };
            for k in 0..COUNTER_SHARDS {
                let off = self.stats_off
                    + slot as usize * JOB_STATS_LEN
                    + COUNTER_SHARDS_AT
                    + k * COUNTER_SHARD_LEN
                    + word * 8;
                if let Some(c) = self.region.atomic_u64(off) {
                    // An `uncount` in one shard of what another counted wraps: the sum does not.
                    v = v.wrapping_add(c.load(Ordering::Relaxed));
                }
            }
        }
        v
    }

    /// Zeroes every word of job slot `slot` but its owner, shards included (a slot taken by a
    /// new job, a table saved).
    pub fn clear_job(&self, slot: u32) {
        if slot >= self.job_slots {
            return;
        }
        let base = self.stats_off + slot as usize * JOB_STATS_LEN;
        for off in (8..JOB_STATS_LEN).step_by(8) {
            if let Some(c) = self.region.atomic_u64(base + off) {
                c.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Sets `bits` in a job's flag word (`job::SEEN`).
    pub fn mark(&self, slot: u32, word: usize, bits: u64) {
        if let Some(c) = self.counter(slot, word) {
            c.fetch_or(bits, Ordering::Relaxed);
        }
    }

    /// Records a program started by a process of job slot `slot` that granary could not serve
    /// although its argument `arg` named a dataset path (`job::UNSERVED`): `why` is its
    /// `seen::EXEC_*` bit, set in `job::SEEN` as well. The first one is described by name (the
    /// last bytes of `program` and `arg`). Allocation-free, for the preload library.
    pub fn record_unserved(&self, slot: u32, why: u64, program: &[u8], arg: &[u8]) {
        self.mark(slot, job::SEEN, why);
        let Some(n) = self.counter(slot, job::UNSERVED) else {
            return;
        };
        if n.fetch_add(1, Ordering::AcqRel) != 0 {
            return;
        }
        let len = |b: &[u8]| b.len().min(0xffff) as u64;
        if let Some(w) = self.counter(slot, job::UNSERVED_WHY) {
            w.store(
                (why & 0xffff_ffff) | len(program) << 32 | len(arg) << 48,
                Ordering::Release,
            );
        }
        self.put_name(slot, job::UNSERVED_PROGRAM, program);
        self.put_name(slot, job::UNSERVED_ARG, arg);
    }

    /// The last `NAME_WORDS * 8` bytes of `name` into the words from `first`, NUL-padded.
    fn put_name(&self, slot: u32, first: usize, name: &[u8]) {
        let room = job::NAME_WORDS * 8;
        let tail = name.get(name.len().saturating_sub(room)..).unwrap_or(b"");
        for i in 0..job::NAME_WORDS {
            let mut w = [0u8; 8];
            for (j, b) in w.iter_mut().enumerate() {
                *b = tail.get(i * 8 + j).copied().unwrap_or(0);
            }
            if let Some(c) = self.counter(slot, first + i) {
                c.store(u64::from_le_bytes(w), Ordering::Release);
            }
        }
    }

    fn name_at(&self, slot: u32, first: usize, len: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(job::NAME_WORDS * 8);
        for i in 0..job::NAME_WORDS {
            let w = self
                .counter(slot, first + i)
                .map_or(0, |c| c.load(Ordering::Acquire));
            out.extend_from_slice(&w.to_le_bytes());
        }
        let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
        out.truncate(end);
        if len as usize > out.len() {
            // Only the tail was kept.
            out.splice(0..0, "…".bytes());
        }
        out
    }

    /// The programs job slot `slot` started that granary could not serve although they were
    /// given a dataset path (`record_unserved`): how many, and the first.
    pub fn unserved(&self, slot: u32) -> Option<Unserved> {
        let count = self.counter(slot, job::UNSERVED)?.load(Ordering::Acquire);
        if count == 0 {
            return None;
        }
        let w = self
            .counter(slot, job::UNSERVED_WHY)?
            .load(Ordering::Acquire);
        Some(Unserved {
            count,
            why: w & 0xffff_ffff,
            program: self.name_at(slot, job::UNSERVED_PROGRAM, w >> 32 & 0xffff),
            arg: self.name_at(slot, job::UNSERVED_ARG, w >> 48),
        })
    }

    /// Takes back `n` of a counter (a call counted ahead that did not happen).
    pub fn uncount(&self, slot: u32, word: usize, n: u64) {
        self.count(slot, word, n.wrapping_neg());
    }
}
