//! The on-memory layout of a catalog table, version 15.
//!
//! A table is one file (normally under `/dev/shm/granary-<uid>/`) that the node agent writes and
//! every process of a job maps with `MAP_SHARED`. Everything a hook needs is reachable from the
//! header by offsets, so a lookup is a few loads and one hash — no syscall, no lock, no allocation.
//!
//! ```text
//! 0              header (HEADER_LEN bytes: fixed fields, then PATH_SLOTS slots of PATH_SLOT_LEN)
//! entries_off    entry_count × DiskEntry (96 B)   immutable: name, parent, compact stat record,
//!                                                  the path's two hashes
//! states_off     entry_count × 24 bytes           mutable, atomics only: [state word, copy
//!                                                  inode, copy ctime]
//! checksums_off  entry_count × u64                xxh3 of each placed copy (agent only)
//! hash_off       hash_slots × 8 bytes             open addressing (4/3 of the entries, linear
//!                                                  probing from `home_slot`): u32s [tag (high 32
//!                                                  bits of the path hash), entry index + 1
//!                                                  (0 = empty; `SLOT_LINK` set for a
//!                                                  symlink, `SLOT_SMALL_FILE` for a small file)]
//! strings_off    strings_len bytes                names (last components) and symlink targets
//! ring_off       request ring                     clients → agent (see `ring`)
//! stats_off      job_slots × JobStats             per-job counters, atomics only (256-aligned;
//!                                                  `JOB_STATS_LEN`: words, then per-process shards)
//! large_off      large_count × 16 bytes           per large file: [progress, chunk bitmap offset]
//! chunks_off     chunks_len bytes                 chunk bitmaps of files larger than a chunk
//! transient_off  ⌈entry_count / 64⌉ × u64         one bit per entry: its copy's pages are dropped
//!                                                  after use (`residency`)
//! valid_off      2 × ⌈entry_count / 64⌉ × u64     one bit per entry: checked against the source
//!                                                  in this attach (`lifecycle::validated`); then
//!                                                  one bit per entry: being checked now (`lifecycle::claim_check`)
//! classes_off    class_count × StatClass (56 B)   the stat fields entries share (mode, owner,
//!                                                  device, block size, …), interned
//! copy_bits_off  copy_bits / 8 bytes              one bit per path-hash value (4 per entry, a
//!                                                  power of two): a copy of a file hashing there
//!                                                  may exist (`H_COPY_BITS_OFF`)
//! ```
//! Entries of one directory are contiguous (`first_child .. first_child + child_count`), in the
//! order the source's `readdir` returned them, so a listing is a slice walk. Entry 0 is the root;
//! a parent always precedes its children. Only names are stored: a path is its ancestors' names.
//!
//! Invariant the resolver relies on: every ancestor of a catalogued path is a real directory (the
//! walk never descends a symlink), so lexical `..` inside the catalog is exact.
//!
//! A lookup (docs/decisions.md, "Catalog lookup", "A lookup confirms a path by a second
//! hash"): the hash slot, whose tag turns away every other path without touching its entry,
//! then the entry's record, state and checksum lines all at once (two misses deep); the
//! record's two hashes of the path (`object`, `check`) confirm it, no name is read.
//!
//! Size at a million files of ImageNet-like names (20 bytes) in 1,000 directories: 96 (entry) +
//! 24 (state) + 8 (checksum) + ~11 (hash slots) + 20 (name) + 2 bits + ~4 bits (copy bitmap)
//! ≈ 160 bytes per file.

pub const MAGIC: u64 = u64::from_le_bytes(*b"GRNRYT01");
/// Version 5: compact entries (names only, interned stat classes, times in ns), per-attach
/// validation bits, progress and chunk bitmaps only for large files. Version 6: per-job words for
/// container visibility (`SEEN`, `EXECS`) and mapping traffic (`MAP_*`).
/// Version 7: a second bit per entry beside the validation bit, set while one process checks
/// the entry against the source, so an entry costs the source one call per attach even when the
/// program and a validator reach it at once. Version 8: per-job words naming the first program
/// the job started that granary could not serve although it was given a dataset path
/// (`job::UNSERVED*`). Version 9: tagged 64-bit hash slots (4/3 of the entries, any count), so
/// a lookup reads no entry but its own. Version 10: 12-byte hash slots that also say where
/// the entry's name lies, so a lookup loads the entry and its name at once. Version 11: the job
/// counters every process adds to at each open and read are sharded by process
/// (`COUNTER_SHARDS`). Version 12: the request ring is sharded by process (`RING_SHARDS`), and
/// a copy bitmap (`H_COPY_BITS_OFF`) says which files can have no copy. Version 13: a hash
/// slot says whether its entry is a symlink (`SLOT_LINK`), whose copy is named by its target's
/// path, not its own, or a small file (`SLOT_SMALL_FILE`). Tables of earlier versions are
/// rejected (`TableError::BadVersion`): the agent then walks the source again. Version 14: an
/// entry holds a second hash of its path (`DiskEntry::check`, `path_check`), which a lookup
/// compares instead of the entry's names; hash slots are two `u32`s again (no name offset).
/// Version 15: that second hash is keyed with a secret seed drawn for each table
/// (`H_CHECK_SEED`).
pub const VERSION: u32 = 15;

// Header fields: byte offsets from the start of the table.
pub const H_MAGIC: usize = 0;
pub const H_VERSION: usize = 8;
/// `AtomicU32`; bit `FLAG_VALID` cleared by the agent when the table must no longer be trusted;
/// bit `FLAG_REPORT_OPENS` set by the agent when it wants `request::OPENED`; bit
/// `FLAG_IMMUTABLE` while the current attach validates directories only.
pub const H_FLAGS: usize = 12;
pub const H_TOTAL_LEN: usize = 16;
pub const H_ENTRY_COUNT: usize = 24;
pub const H_HASH_SLOTS: usize = 28;
pub const H_ENTRIES_OFF: usize = 32;
pub const H_STATES_OFF: usize = 40;
pub const H_HASH_OFF: usize = 48;
pub const H_STRINGS_OFF: usize = 56;
pub const H_STRINGS_LEN: usize = 64;
pub const H_RING_OFF: usize = 72;
pub const H_RING_CAP: usize = 80;
pub const H_JOB_SLOTS: usize = 84;
pub const H_STATS_OFF: usize = 88;
pub const H_TIER_COUNT: usize = 96;
pub const H_AGENT_PID: usize = 100;
/// `st_ino` of the source root's parent, for the `..` entry of a listing of the root.
pub const H_ROOT_PARENT_INO: usize = 104;
/// `AtomicU64`; bumped by the agent whenever it replaces a cache object (diagnostics only).
pub const H_GENERATION: usize = 120;

/// `AtomicU64`: CLOCK_MONOTONIC nanoseconds, bumped by the agent every `HEARTBEAT_PERIOD_MS`. A
/// client waiting for the agent gives up when it is older than `HEARTBEAT_STALE_MS`.
pub const H_HEARTBEAT: usize = 128;
/// Files at least this large are fetched whole by the agent from their first open, and the
/// program's reads are served from the partial copy (docs/placement.md).
pub const H_PREFETCH_MIN_SIZE: usize = 136;
/// Chunk size of partially cached files (`State::Partial`), a multiple of 4096.
pub const H_CHUNK_SIZE: usize = 144;
pub const H_CHUNKS_OFF: usize = 152;
pub const H_CHUNKS_LEN: usize = 160;
/// Bitmap of transient entries, one bit each (`Table::is_transient`); its length follows from
/// the entry count.
pub const H_TRANSIENT_OFF: usize = 168;
/// Who the agent is, as the kernel sees it when it walks and copies: `uid: u32`, `gid: u32`,
/// then a hash of the sorted supplementary groups (`u64`). The catalog answers permission
/// questions with what the agent could do, so a process with other credentials must not use it.
pub const H_CREDS: usize = 176;
pub const H_CLASSES_OFF: usize = 192;
pub const H_CLASS_COUNT: usize = 200;
pub const H_CHECKSUMS_OFF: usize = 208;
pub const H_LARGE_OFF: usize = 216;
pub const H_LARGE_COUNT: usize = 224;
/// Bitmap of entries validated in the current attach (`lifecycle::validated`), followed by the
/// bitmap of entries being checked (`lifecycle::claim_check`), as long.
pub const H_VALID_OFF: usize = 232;
/// `AtomicU64`: the attach epoch, bumped each time a job attaches to an idle source and the
/// validation bits start over (diagnostics and tests).
pub const H_EPOCH: usize = 240;
/// Offset of the pack section (`pack`) when the table serves a pack (`granary run --pack`),
/// 0 otherwise. In the 8 bytes tables without one leave zero, so no version change.
pub const H_PACK_OFF: usize = 248;
/// Tier `t`'s object directory identity (`st_dev: u64`, `st_ino: u64`) at
/// `H_TIER_DIR_IDS + 16 t`: a client opens copies only through a directory fd that is this one.
pub const H_TIER_DIR_IDS: usize = 256;
/// What reading an extended attribute a file does not have answers on the source's file system,
/// probed by the agent at each attach (`crate::xattr::Absent`); zero (tables that never had it
/// included): nothing is known, every such call passes through. 24 bytes, all `AtomicU32`:
/// flags (`xattr::ABSENT_*`), the probed device (major, minor), then one word per file type
/// (`xattr::TYPES`) holding one errno byte per name (`xattr::NAMES`, 0: not answered).
pub const H_XATTR: usize = 256 + 16 * MAX_TIERS;
/// Offset of the copy bitmap (`u64`; 0: none, every open looks its file up): one
/// bit per path hash value modulo its length, set before an entry whose path hashes there is
/// first `Placed` (and for symlinks from the start), never cleared while the table lives. A
/// clear bit proves no copy of any such entry exists, so a client opens the source without
/// waiting for the entry's lines (`Table::no_copy_yet`); the bitmap is small enough (4 bits
/// per entry) to stay in the cache, where the hash slots do not.
pub const H_COPY_BITS_OFF: usize = H_XATTR + 32;
/// The copy bitmap's length in bits (`u64`, a power of two).
pub const H_COPY_BITS: usize = H_XATTR + 40;
/// The seed of every entry's `path_check` (`u64`): drawn from the kernel's random source when
/// the catalog is made (`Catalog::new`), never changed while the table lives, carried with the
/// image wherever it goes (a saved catalog loaded again, rank 0's table adopted by another
/// rank), secret to whoever cannot read the table (the file is the agent user's, mode 0600).
pub const H_CHECK_SEED: usize = H_XATTR + 48;

/// The copy bitmap's bit for path hash `hash` of a bitmap of `bits` bits (a power of two):
/// its high half, as the hash slots' tags, so the slots' positions (from the low half) do not
/// decide it.
#[inline]
pub const fn copy_bit(hash: u64, bits: u64) -> u64 {
    (hash >> 32) & (bits - 1)
}

/// Where `copy_bit` lies: the byte offset of its `u64` word in the bitmap, and its mask there.
#[inline]
pub const fn copy_word(hash: u64, bits: u64) -> (usize, u64) {
    let bit = copy_bit(hash, bits);
    ((bit / 64) as usize * 8, 1 << (bit % 64))
}

/// Bits of the copy bitmap of a table of `entries` entries.
pub const fn copy_bits_of(entries: usize) -> u64 {
    let b = (entries as u64 * 4).next_power_of_two();
    if b < 64 {
        64
    } else {
        b
    }
}

/// A table serving a pack: where the pack is, whether the tree exists anywhere else, and per
/// entry where its stored bytes are (`Locator`). Written once by the agent; only `F_STREAMED`
/// changes afterwards.
///
/// ```text
/// +0     magic `GRNPACK1`
/// +8     flags: u32 (`FLAG_MOUNT`)
/// +12    block size of framed files (u32, the pack's)
/// +16    partition count (u32)
/// +24    streamed: AtomicU64, bytes the agent has read from partitions (waiting clients watch it)
/// +32    locators offset (u64, from the table's start): entry_count × LOCATOR_LEN
/// +40    pack id (16 bytes)
/// +64    path slot: the pack directory (absolute; u32 length, bytes)
/// +64 + PATH_SLOT_LEN   path slot: an empty directory whose fds stand for the tree's
///        directories when the tree exists only in the pack (`FLAG_MOUNT`)
/// ```
pub mod pack {
    use crate::layout::PATH_SLOT_LEN;
    pub const MAGIC: u64 = u64::from_le_bytes(*b"GRNPACK1");
    pub const F_MAGIC: usize = 0;
    pub const F_FLAGS: usize = 8;
    pub const F_BLOCK: usize = 12;
    pub const F_PARTITIONS: usize = 16;
    pub const F_STREAMED: usize = 24;
    pub const F_LOCATORS: usize = 32;
    pub const F_ID: usize = 40;
    pub const F_DIR: usize = 64;
    pub const F_EMPTY: usize = 64 + PATH_SLOT_LEN;
    pub const HEADER_LEN: usize = 64 + 2 * PATH_SLOT_LEN;
    /// Only the pack exists (`--mount`): nothing is ever passed through to the tree's path.
    pub const FLAG_MOUNT: u32 = 1;
    /// Per entry: stored-bytes offset in its partition file (u64), stored length (u64), xxh3 of
    /// the file's bytes (u64), partition (u32), codec (u8, the pack's), flags (u8).
    pub const LOCATOR_LEN: usize = 32;
    /// Locator flag: the entry's bytes are in the pack (otherwise it is served from the source:
    /// not packed, or changed since).
    pub const LOC_PACKED: u8 = 1;
    /// Locator flag: the file has holes (its copy keeps them).
    pub const LOC_SPARSE: u8 = 2;
    /// Locator flag: packed with `granary pack --replicate`: in cluster mode every node holds
    /// a copy (`granary serve`, like its own `--replicate`).
    pub const LOC_REPLICATE: u8 = 4;
}

/// Where a packed file's stored bytes are (`pack::LOCATOR_LEN` bytes in the table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Locator {
    pub offset: u64,
    pub stored_len: u64,
    pub checksum: u64,
    pub partition: u32,
    pub codec: u8,
    pub flags: u8,
}

impl Locator {
    pub fn is_packed(&self) -> bool {
        self.flags & pack::LOC_PACKED != 0
    }
}

pub const HEARTBEAT_PERIOD_MS: u64 = 100;
pub const HEARTBEAT_STALE_MS: u64 = 2000;

pub const FLAG_VALID: u32 = 1;
/// The agent follows the program's position (known-order placement): clients push
/// `request::OPENED` after opening a catalogued file, placed or not. Clear (the default), the
/// hooks cost one relaxed load and push nothing, so unplaced-only traffic stays as it was.
pub const FLAG_REPORT_OPENS: u32 = 2;
/// The source is declared immutable for this attach: a directory whose own identity (device,
/// inode, mtime, ctime) is unchanged vouches for every file in it, so validation costs one
/// metadata call per directory (`lifecycle`).
pub const FLAG_IMMUTABLE: u32 = 4;
/// Cluster mode (`granary serve`): a file is held by some node of the job, so a read-only open
/// of a file at least `prefetch_min_size` long that is not placed here yet waits (bounded, like
/// a read waiting on a fetch) for the agent to place it, then opens the copy — the program does
/// not open the source, which every node would otherwise do once per file.
pub const FLAG_CLUSTER: u32 = 8;
/// `[mmap] sequential_advice = false`: the preload advises no `MADV_SEQUENTIAL` on followed
/// mappings (`map_advice` in the preload). Clear (the default, and in tables of agents that
/// predate the setting), it advises. Set by the agent at every attach.
pub const FLAG_NO_SEQUENTIAL_ADVICE: u32 = 16;

/// Path slots hold absolute paths the hooks need: `len: u32` at +0, bytes from +8.
pub const PATHS_OFF: usize = 4096;
pub const PATH_SLOT_LEN: usize = 4096;
pub const PATH_MAX_LEN: usize = PATH_SLOT_LEN - 8;
/// The source root as the user named it, lexically normalised, absolute.
pub const SLOT_SOURCE: usize = 0;
/// The source root with symlinks resolved (`realpath`); may equal `SLOT_SOURCE`.
pub const SLOT_SOURCE_REAL: usize = 1;
/// Tier `t`'s object directory lives in slot `SLOT_TIER0 + t`.
pub const SLOT_TIER0: usize = 2;
pub const MAX_TIERS: usize = 8;
pub const PATH_SLOTS: usize = SLOT_TIER0 + MAX_TIERS;
pub const HEADER_LEN: usize = PATHS_OFF + PATH_SLOTS * PATH_SLOT_LEN;

/// Seconds and nanoseconds, as in `struct statx_timestamp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ts {
    pub sec: i64,
    pub nsec: u32,
    pub _pad: u32,
}

/// Everything `statx(2)` told the walk about one path (with `AT_SYMLINK_NOFOLLOW`), and what its
/// `llistxattr(2)` told (`xattrs`). `struct stat` and `struct statx` answers are both derived
/// from it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatRec {
    /// `stx_mask`: which fields the source filled in.
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: Ts,
    pub btime: Ts,
    pub ctime: Ts,
    pub mtime: Ts,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// What the walk learnt of the path's extended attributes (`crate::xattr::NONE_LISTED`);
    /// 0: nothing (a record from `statx` alone). Not part of the file's identity: any change
    /// of an attribute moves the ctime, which is.
    pub xattrs: u32,
}

impl StatRec {
    /// The record of what `statx(2)` answered.
    pub fn from_statx(sx: &libc::statx) -> StatRec {
        let ts = |t: libc::statx_timestamp| Ts {
            sec: t.tv_sec,
            nsec: t.tv_nsec,
            _pad: 0,
        };
        StatRec {
            mask: sx.stx_mask,
            blksize: sx.stx_blksize,
            attributes: sx.stx_attributes,
            nlink: sx.stx_nlink,
            uid: sx.stx_uid,
            gid: sx.stx_gid,
            mode: sx.stx_mode as u32,
            ino: sx.stx_ino,
            size: sx.stx_size,
            blocks: sx.stx_blocks,
            attributes_mask: sx.stx_attributes_mask,
            atime: ts(sx.stx_atime),
            btime: ts(sx.stx_btime),
            ctime: ts(sx.stx_ctime),
            mtime: ts(sx.stx_mtime),
            rdev_major: sx.stx_rdev_major,
            rdev_minor: sx.stx_rdev_minor,
            dev_major: sx.stx_dev_major,
            dev_minor: sx.stx_dev_minor,
            xattrs: 0,
        }
    }

    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }
    /// `d_type` for a directory listing.
    pub fn dirent_type(&self) -> u8 {
        match self.file_type() {
            libc::S_IFREG => libc::DT_REG,
            libc::S_IFDIR => libc::DT_DIR,
            libc::S_IFLNK => libc::DT_LNK,
            libc::S_IFCHR => libc::DT_CHR,
            libc::S_IFBLK => libc::DT_BLK,
            libc::S_IFIFO => libc::DT_FIFO,
            libc::S_IFSOCK => libc::DT_SOCK,
            _ => libc::DT_UNKNOWN,
        }
    }
    pub fn mtime_ns(&self) -> i128 {
        self.mtime.sec as i128 * 1_000_000_000 + self.mtime.nsec as i128
    }
    pub fn ctime_ns(&self) -> i128 {
        self.ctime.sec as i128 * 1_000_000_000 + self.ctime.nsec as i128
    }
    /// True if `other` describes the same version of the same file: device, inode, type, size,
    /// mtime and ctime. A copy is valid only while this holds: `cp -p`, `rsync -t`, `tar x` and
    /// `touch -d` restore mtime, but nothing restores ctime, and a replaced file has another inode.
    pub fn same_version(&self, other: &StatRec) -> bool {
        self.dev_major == other.dev_major
            && self.dev_minor == other.dev_minor
            && self.ino == other.ino
            && self.file_type() == other.file_type()
            && self.size == other.size
            && self.mtime == other.mtime
            && self.ctime == other.ctime
    }
}

impl Ts {
    /// Nanoseconds since the epoch; `None` outside what an `i64` of nanoseconds holds (the years
    /// 1678–2262): such an entry's metadata is not catalogued.
    pub fn to_ns(self) -> Option<i64> {
        self.sec
            .checked_mul(1_000_000_000)?
            .checked_add(self.nsec as i64)
    }
    pub fn from_ns(ns: i64) -> Ts {
        Ts {
            sec: ns.div_euclid(1_000_000_000),
            nsec: ns.rem_euclid(1_000_000_000) as u32,
            _pad: 0,
        }
    }
}

/// One catalogued path as the hooks see it, decoded from its `DiskEntry` and `StatClass`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryRec {
    /// Name of the cached copy in a tier's object directory (`object_name`): the hash of the
    /// path relative to the source root, which is also its hash-table key.
    pub object: u64,
    /// Index of the parent directory (the root is its own parent).
    pub parent: u32,
    /// The last component (the name a listing shows), in the string pool; empty for the root.
    pub name_off: u32,
    pub name_len: u32,
    /// Directories: children are entries `first_child .. first_child + child_count`.
    pub first_child: u32,
    pub child_count: u32,
    /// Symlinks: the target as `readlink` returns it, in the string pool.
    pub link_off: u32,
    pub link_len: u32,
    /// Files with a large record (progress of a whole-file fetch, chunk bitmap): its index + 1.
    pub large: u32,
    pub stat: StatRec,
}

impl EntryRec {
    pub fn is_root(&self) -> bool {
        self.name_len == 0
    }
}

/// An entry as stored: 96 bytes, immutable once the table is built. The fields most entries
/// share (type and permissions, owner, device, block size, attributes) are one `StatClass`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskEntry {
    pub object: u64,
    /// A second hash of the path relative to the source root (`path_check`): with `object`,
    /// 128 bits that confirm a lookup's path is this entry's without comparing names.
    pub check: u64,
    pub parent: u32,
    pub name_off: u32,
    pub name_len: u16,
    /// Index into the class section (see `Catalog::node` for records that do not fit).
    pub class: u16,
    pub nlink: u32,
    /// Directories: first child; symlinks: target offset; files: large record index + 1 (0: none).
    pub aux: u32,
    /// Directories: child count; symlinks: target length.
    pub aux2: u32,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime_ns: i64,
    pub btime_ns: i64,
    pub ctime_ns: i64,
    pub mtime_ns: i64,
}

pub const CLASS_NONE: u16 = u16::MAX;

/// The `statx` fields entries share, interned once per table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StatClass {
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub attributes_mask: u64,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    /// `StatRec::xattrs`: entries with and without attributes are of different classes.
    pub xattrs: u32,
}

impl StatClass {
    pub fn of(s: &StatRec) -> StatClass {
        StatClass {
            mask: s.mask,
            blksize: s.blksize,
            attributes: s.attributes,
            attributes_mask: s.attributes_mask,
            uid: s.uid,
            gid: s.gid,
            mode: s.mode,
            rdev_major: s.rdev_major,
            rdev_minor: s.rdev_minor,
            dev_major: s.dev_major,
            dev_minor: s.dev_minor,
            xattrs: s.xattrs,
        }
    }
}

impl DiskEntry {
    /// The full record from the entry and its class.
    pub fn stat(&self, c: &StatClass) -> StatRec {
        StatRec {
            mask: c.mask,
            blksize: c.blksize,
            attributes: c.attributes,
            nlink: self.nlink,
            uid: c.uid,
            gid: c.gid,
            mode: c.mode,
            ino: self.ino,
            size: self.size,
            blocks: self.blocks,
            attributes_mask: c.attributes_mask,
            atime: Ts::from_ns(self.atime_ns),
            btime: Ts::from_ns(self.btime_ns),
            ctime: Ts::from_ns(self.ctime_ns),
            mtime: Ts::from_ns(self.mtime_ns),
            rdev_major: c.rdev_major,
            rdev_minor: c.rdev_minor,
            dev_major: c.dev_major,
            dev_minor: c.dev_minor,
            xattrs: c.xattrs,
        }
    }
}

pub const ENTRY_LEN: usize = core::mem::size_of::<DiskEntry>();
pub const CLASS_LEN: usize = core::mem::size_of::<StatClass>();
/// Per entry, all `AtomicU64`: the state word (`state::StateWord`); the copy's identity as the agent wrote it — its
/// inode (set before the state names a tier, valid for the `.part` file and, after the rename,
/// the complete copy) and its ctime in nanoseconds (set before PLACED; 0 while PLACING). A client
/// checks both with `fstat` on what it opened: anything else (damaged, replaced, truncated) is
/// not the agent's copy.
pub const STATE_LEN: usize = 24;
pub const STATE_WORD: usize = 0;
pub const STATE_COPY_INO: usize = 8;
pub const STATE_COPY_CTIME: usize = 16;
/// Per large file (`EntryRec::large`), both `AtomicU64`: `progress` — bytes of the partial copy
/// (`<object>.part`) written and readable while the state is PLACING, only ever increasing; and
/// the offset of its chunk bitmap in the chunk section (0 = none).
pub const LARGE_LEN: usize = 16;
pub const LARGE_PROGRESS: usize = 0;
pub const LARGE_CHUNKS: usize = 8;

/// The cached copy's file name inside a tier's object directory: 16 lowercase hex digits.
pub fn object_name(object: u64) -> [u8; 16] {
    // Eight nibbles to eight bytes (the most significant in the highest byte), then each byte
    // to its hex digit at once: every open of a copy names it, so no loop and no table.
    fn hex8(x: u32) -> [u8; 8] {
        const ONES: u64 = 0x0101_0101_0101_0101;
        let mut v = x as u64;
        v = (v | v << 16) & 0x0000_ffff_0000_ffff;
        v = (v | v << 8) & 0x00ff_00ff_00ff_00ff;
        v = (v | v << 4) & 0x0f0f_0f0f_0f0f_0f0f;
        // 1 in each byte whose nibble is 10 or more: adding 6 carries it into bit 4.
        let letters = ((v + 6 * ONES) >> 4) & ONES;
        (v + b'0' as u64 * ONES + (b'a' - b'0' - 10) as u64 * letters).to_be_bytes()
    }
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hex8((object >> 32) as u32));
    out[8..].copy_from_slice(&hex8(object as u32));
    out
}

/// The object id a name made by `object_name` stands for (`None` for any other name).
pub fn parse_object_name(name: &[u8]) -> Option<u64> {
    if name.len() != 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in name {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = v << 4 | d as u64;
    }
    Some(v)
}

/// Name of the partial copy being written (PLACING): renamed to `object_name` when complete,
/// so an fd opened on it stays valid and becomes the complete copy.
pub fn part_name(object: u64) -> [u8; 21] {
    suffixed(object, b".part")
}

/// Name of the chunk file of a partially cached file (`State::Partial`).
pub fn chunks_name(object: u64) -> [u8; 23] {
    suffixed(object, b".chunks")
}

fn suffixed<const N: usize>(object: u64, suffix: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..16].copy_from_slice(&object_name(object));
    out[16..16 + suffix.len()].copy_from_slice(suffix);
    out
}

/// Chunk files: a header (`CHUNK_MAGIC`, version, chunk size, the source version they were cut
/// from — size, mtime, ctime, device, inode — chunk count, then one xxh3 per chunk, 0 = absent)
/// padded to 4096 bytes, then chunk `k` at `chunk_data_offset + k × chunk_size` (a sparse file:
/// absent chunks take no space).
pub const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"GRNCHK01");
pub const CHUNK_VERSION: u32 = 2;
pub const CHUNK_HEADER_FIXED: usize = 96;

pub const fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    if chunk_size == 0 {
        return 0;
    }
    size.div_ceil(chunk_size)
}

/// Words of a per-entry bitmap (transient, validated) of a table with `entries` entries.
pub const fn bitmap_words(entries: usize) -> usize {
    entries.div_ceil(64)
}

/// Where chunk data starts in a chunk file.
pub const fn chunk_data_offset(size: u64, chunk_size: u64) -> u64 {
    (CHUNK_HEADER_FIXED as u64 + 8 * chunk_count(size, chunk_size)).div_ceil(4096) * 4096
}

/// Object id of a relative path: its hash-table key, so a copy's name leads back to its entry
/// (`Table::lookup_object`, for fds a process inherited across `exec`). Stable across catalog
/// rebuilds, so a cache survives them.
pub fn object_id(rel_path: &[u8]) -> u64 {
    path_hash(rel_path)
}

/// The groups part of `H_CREDS`: xxh3 of the supplementary group ids, sorted (in place) and
/// deduplicated, as native-endian `u32`s. Agent and clients compute it the same way.
pub fn groups_hash(groups: &mut [u32]) -> u64 {
    groups.sort_unstable();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut last = None;
    for &g in groups.iter() {
        if last != Some(g) {
            h.update(&g.to_ne_bytes());
            last = Some(g);
        }
    }
    h.digest()
}

/// Hash-table key of a relative path.
pub fn path_hash(rel_path: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(rel_path)
}

/// A second 64-bit hash of a path relative to the source root, keyed with the table's secret
/// seed (`H_CHECK_SEED`; xxh3-64 with that seed), stored in its entry (`DiskEntry::check`). A
/// lookup takes an entry for a path when its slot leads there, the entry's `object` is the
/// path's `path_hash` and its `check` the path's `path_check` with the table's seed: 128 bits,
/// so another path is taken for it with probability 2^-128 by chance. `path_hash` has no key,
/// so a path colliding with a catalogued one in it can be computed; in `path_check` it cannot
/// without the seed, which only those who can read the table know (docs/reliability.md).
#[inline]
pub fn path_check(rel_path: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(rel_path, seed)
}

/// A seed for `path_check` of a new table: 64 bits from the kernel's random source
/// (`getrandom(2)`, else `/dev/urandom`), else from the standard library's randomly keyed
/// hasher (which has the same sources).
pub fn new_check_seed() -> u64 {
    if let Some(s) = crate::random::getrandom_u64() {
        return s;
    }
    let mut b = [0u8; 8];
    let urandom = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    if urandom.is_ok() {
        return u64::from_ne_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6772_616e_6172_7931);
    h.finish()
}

/// The slot a path hashing to `hash` starts probing at, of `slots`: its low 32 bits scaled to
/// the slot count (multiply and shift), so the count need not be a power of two and the
/// tag (the high bits) is independent of the position.
#[inline]
pub const fn home_slot(hash: u64, slots: u32) -> u32 {
    ((hash as u32 as u64 * slots as u64) >> 32) as u32
}

/// The slot after `slot` in a probe sequence over `slots` slots.
#[inline]
pub const fn next_slot(slot: u32, slots: u32) -> u32 {
    if slot + 1 >= slots {
        0
    } else {
        slot + 1
    }
}

/// Bytes of a hash slot: two `u32`s, `hash_slot`'s.
pub const SLOT_LEN: usize = 8;

/// The bit of a hash slot's index word set when its entry is a symlink: an open sees it in the
/// slot it loads with the copy bitmap's word, before any entry (`Table::copy_hint`).
pub const SLOT_LINK: u32 = 1 << 31;

/// The bit of a hash slot's index word set when its entry is a regular file smaller than the
/// table's whole-fetch size (`H_PREFETCH_MIN_SIZE`), one the agent copies after its close.
pub const SLOT_SMALL_FILE: u32 = 1 << 30;

/// The index word's flag bits; entry indices stay below them (`MAX_ENTRIES`).
pub const SLOT_FLAGS: u32 = SLOT_LINK | SLOT_SMALL_FILE;

/// Most entries a table holds: their index + 1 fits below the slot's flag bits.
pub const MAX_ENTRIES: usize = (SLOT_SMALL_FILE - 2) as usize;

/// A hash slot's words for entry `idx` whose path hashes to `hash`: the hash's high 32 bits,
/// the tag (the slot's position comes from its low bits); the index + 1 (0: an empty slot),
/// with `SLOT_LINK` for a symlink and `SLOT_SMALL_FILE` for a `small` file.
pub const fn hash_slot(hash: u64, idx: u32, link: bool, small: bool) -> [u32; 2] {
    let link = if link { SLOT_LINK } else { 0 };
    let small = if small { SLOT_SMALL_FILE } else { 0 };
    [(hash >> 32) as u32, idx.wrapping_add(1) | link | small]
}

/// Whether a slot whose words are `tag` and `idx1` may hold the path hashing to `hash` (its tag
/// matches), and which entry: `Some(idx)`; `None` for another path's slot. A tag match is not a
/// path match: the caller compares the entry.
#[inline]
pub const fn slot_entry(tag: u32, idx1: u32, hash: u64) -> Option<u32> {
    if tag == (hash >> 32) as u32 {
        Some((idx1 & !SLOT_FLAGS).wrapping_sub(1))
    } else {
        None
    }
}

/// Requests clients push onto the ring: kind in the top byte, entry index below.
pub mod request {
    /// A client opened an unplaced file on the source: place it. `arg`: the client's job slot,
    /// which the placement is credited to. Not pushed for a small file (below the whole-fetch
    /// size) unless the header has `FLAG_REPORT_OPENS` or the table serves a pack: its CLOSED
    /// asks for the copy instead, one request per file.
    pub const OPEN_UNPLACED: u8 = 1;
    /// A client opened the file for writing: drop the copy, re-stat the source.
    pub const INVALIDATE: u8 = 2;
    /// A client found the cached copy damaged (wrong size or type): drop it, place it again.
    pub const DAMAGED: u8 = 3;
    /// A client closed a source fd of a small file it read: its pages are in the page cache now,
    /// copy it from there. `arg`: the client's job slot.
    pub const CLOSED: u8 = 4;
    /// A read of a PARTIAL file missed a chunk: fetch it (chunk index in `arg`).
    pub const CHUNK: u8 = 5;
    /// A client opened a catalogued regular file (from a tier or the source). Pushed only
    /// while the header has `FLAG_REPORT_OPENS`: the agent's known-order policy uses it to
    /// see where the program is, including opens of placed files it otherwise never sees.
    pub const OPENED: u8 = 6;
    /// A client checked an entry of this directory against the source itself (the background
    /// validation had not reached it): validate this directory next.
    pub const VALIDATE: u8 = 7;
    /// A process mapped a catalogued file (or inherited mappings across `fork`): the agent reads
    /// its `/proc/<pid>/maps` and follows where it reads in them (`placement::mmap`). The
    /// entry field carries the pid as the process sees it, `arg` its job slot.
    pub const MAPPED: u8 = 8;
    /// A program's open of an LMDB lock file was given the node-local lock file of the
    /// environment whose data file is this entry (`arg`: the job slot): counted.
    pub const LMDB_LOCK: u8 = 9;

    /// Largest `arg` a request carries (24 bits).
    pub const ARG_MAX: u32 = (1 << 24) - 1;

    pub const fn encode(kind: u8, entry: u32) -> u64 {
        encode_arg(kind, entry, 0)
    }
    /// A request with an argument; `arg` is truncated to 24 bits.
    pub const fn encode_arg(kind: u8, entry: u32, arg: u32) -> u64 {
        (kind as u64) << 56 | ((arg & ARG_MAX) as u64) << 32 | entry as u64
    }
    pub const fn decode(value: u64) -> (u8, u32) {
        ((value >> 56) as u8, value as u32)
    }
    pub const fn arg_of(value: u64) -> u32 {
        ((value >> 32) as u32) & ARG_MAX
    }
}

/// Ring layout: a line of shared words (doorbell, published copies), then `RING_SHARDS` shards,
/// each a consumer index at +0 and a producer index at +64 of its own `RING_SHARD_LEN` bytes
/// (own cache lines), then the slots: shard `k`'s `cap / RING_SHARDS` slots from
/// `RING_SLOTS + k × cap / RING_SHARDS × RING_SLOT_LEN`, each `[sequence: AtomicU64, value:
/// AtomicU64]`. A process pushes into shard `pid % RING_SHARDS` only (as it counts,
/// `COUNTER_SHARDS`), so the fork workers of a loader do not pass the producer index and the
/// slots' lines between their cores at every close; the agent drains every shard. One
/// process's requests stay in order; two processes' never had an order to keep.
pub const RING_SHARDS: usize = 8;
pub const RING_SHARDS_AT: usize = 128;
pub const RING_SHARD_LEN: usize = 128;
pub const RING_SHARD_HEAD: usize = 0;
pub const RING_SHARD_TAIL: usize = 64;
/// The consumer's doorbell (u32): 1 while the agent sleeps on it (futex), so a producer that
/// sees 1 after pushing wakes it.
pub const RING_BELL: usize = 8;
/// Copies published (u32, wrapping), and clients sleeping on it (u32): a client waiting for a
/// copy sleeps on the count (futex) and the agent wakes it when it publishes one
/// (`Table::notify_placed`), instead of the client polling.
pub const RING_PLACED: usize = 12;
pub const RING_PLACED_WAITERS: usize = 16;
pub const RING_SLOTS: usize = RING_SHARDS_AT + RING_SHARDS * RING_SHARD_LEN;
pub const RING_SLOT_LEN: usize = 16;

/// Per-job counters, `AtomicU64` each, `JOB_STATS_WORDS` per job slot. Slot 0 collects processes
/// that run without a job slot (e.g. preloaded by hand). Counted by the preload library.
pub mod job {
    /// pid of the `granary run` that owns the slot, 0 when free. Written by the agent only.
    pub const OWNER: usize = 0;
    /// Opens of catalogued regular files.
    pub const OPENS: usize = 1;
    /// Opens the program made on the source (not served from a tier).
    pub const SOURCE_OPENS: usize = 2;
    /// `read`-family calls on fds opened on the source, and the bytes they returned.
    pub const SOURCE_READS: usize = 3;
    pub const SOURCE_BYTES: usize = 4;
    /// Metadata calls on dataset paths that went to the source (stat, access, readdir, …).
    pub const SOURCE_META: usize = 5;
    /// Metadata calls answered from the catalog.
    pub const CATALOG_META: usize = 6;
    /// Times a placed copy could not be used and the call went to the source instead.
    pub const FALLBACKS: usize = 7;
    /// Files opened from tier `t`: `TIER_FILES + t`; bytes read from them: `TIER_BYTES + t`.
    pub const TIER_FILES: usize = 8;
    pub const TIER_BYTES: usize = TIER_FILES + crate::layout::MAX_TIERS;
    /// Closes of transient copies whose pages the client dropped (page-cache residency).
    pub const TRANSIENT_DROPS: usize = TIER_BYTES + crate::layout::MAX_TIERS;
    /// Words below this (but `OWNER`) are counted in the counting process's shard
    /// (`layout::COUNTER_SHARDS`): read them with `Table::job_value`.
    pub const SHARDED: usize = TRANSIENT_DROPS + 1;
    /// Processes that mapped the table with this job slot (each counts once, at start).
    pub const PROCESSES: usize = TRANSIENT_DROPS + 1;
    /// Processes that passed everything through because their credentials are not the agent's.
    pub const CREDS_MISMATCH: usize = TRANSIENT_DROPS + 2;
    /// Copies the agent completed at this job's request (written by the agent).
    pub const FILES_PLACED: usize = TRANSIENT_DROPS + 3;
    pub const BYTES_PLACED: usize = TRANSIENT_DROPS + 4;
    /// What the job's processes could not see or lost (`seen::*` bits, set with `fetch_or`):
    /// tiers and the source hidden by a container, programs started without granary.
    pub const SEEN: usize = TRANSIENT_DROPS + 5;
    /// Programs started (`exec`, `posix_spawn`) by a process of the job that should load the
    /// preload library and attach (environment kept, dynamic, not setuid): each should count
    /// one `PROCESSES`. Counted before the call, taken back when it fails.
    pub const EXECS: usize = TRANSIENT_DROPS + 6;
    /// Bytes the program touched through mappings of catalogued files (page faults), as the
    /// agent's mapping follower saw them appear in its page tables: pages backed by a tier
    /// file (`MAP_LOCAL_BYTES`), pages backed by the source (`MAP_SOURCE_BYTES`), and of those
    /// the ones no read of the agent had brought in first (`MAP_FAULTED_BYTES`: the program's
    /// own faults reached the source, or found the pages cached by someone else). Written by
    /// the agent.
    pub const MAP_LOCAL_BYTES: usize = TRANSIENT_DROPS + 7;
    pub const MAP_SOURCE_BYTES: usize = TRANSIENT_DROPS + 8;
    pub const MAP_FAULTED_BYTES: usize = TRANSIENT_DROPS + 9;
    /// Opens of packed files that failed with EIO because the pack's bytes could not be used
    /// (a partition missing, cut or another pack's, or the file's bytes failing their
    /// checksum) and nothing else holds them (the pack alone, `--mount`).
    pub const PACK_REFUSED: usize = TRANSIENT_DROPS + 10;
    /// Programs started by a process of the job that granary could not serve (static, run in
    /// secure mode, or started with granary's variables cleared from an environment they could
    /// not be put back into) and whose arguments named a path of the dataset. The first such
    /// start is described in the next words: `UNSERVED_WHY` holds its `seen::EXEC_*` bit in
    /// the low 32 bits and the full lengths of its program (bits 32..48) and of the argument
    /// that named the path (bits 48..64); `UNSERVED_PROGRAM` and `UNSERVED_ARG` hold their last
    /// `NAME_WORDS * 8` bytes, NUL-padded. Written by the process that counted it first.
    pub const UNSERVED: usize = TRANSIENT_DROPS + 12;
    pub const UNSERVED_WHY: usize = TRANSIENT_DROPS + 13;
    pub const UNSERVED_PROGRAM: usize = TRANSIENT_DROPS + 14;
    pub const UNSERVED_ARG: usize = UNSERVED_PROGRAM + NAME_WORDS;
    pub const NAME_WORDS: usize = 32;
    pub const WORDS: usize = UNSERVED_ARG + NAME_WORDS;
}

/// Bits of the `job::SEEN` word.
pub mod seen {
    /// Tier `t`'s object directory was not the agent's at its path (`TIER_HIDDEN << t`): a
    /// container that does not bind it.
    pub const TIER_HIDDEN: u64 = 1;
    /// The source root was not the catalogued directory at its path: that process passed
    /// everything through.
    pub const SOURCE_HIDDEN: u64 = 1 << 8;
    /// ... and a mount point of that process showed the source's root directory (bound at
    /// another path).
    pub const SOURCE_ELSEWHERE: u64 = 1 << 9;
    /// A program was started with an environment that lacks the preload library or the table
    /// (`env -i`, a launcher that cleans the environment), granary could not put them back
    /// (no room), and its arguments named a dataset path (`job::UNSERVED`).
    pub const EXEC_ENV_CLEARED: u64 = 1 << 10;
    /// A program was started that the dynamic loader runs in secure mode (setuid, setgid, file
    /// capabilities): it ignores `LD_PRELOAD`; and its arguments named a dataset path.
    pub const EXEC_SECURE: u64 = 1 << 11;
    /// A statically linked program was started: no dynamic loader, no preload library; and its
    /// arguments named a dataset path.
    pub const EXEC_STATIC: u64 = 1 << 12;
    /// A program was started after the table fd (`GRANARY_TABLE_FD`) was closed or replaced:
    /// it can reach the table only by its path.
    pub const FD_LOST: u64 = 1 << 13;
}
/// A job slot's counters: its words (`job::*`), then `COUNTER_SHARDS` shards of the words every
/// process counts on its hot path (`job::SHARDED`, `COUNTER_SHARD_LEN` bytes each) — a process
/// adds to its own shard (`Table::count`), so the fork workers of a loader do not pass one cache
/// line between their cores at every open and read; readers sum them (`Table::job_value`).
pub const JOB_STATS_LEN: usize = COUNTER_SHARDS_AT + COUNTER_SHARDS * COUNTER_SHARD_LEN;
/// Where a job slot's counter shards start, 256-aligned so no shard shares the pair of cache
/// lines the adjacent-line prefetcher moves together with another.
pub const COUNTER_SHARDS_AT: usize = (job::WORDS * 8).div_ceil(256) * 256;
pub const COUNTER_SHARDS: usize = 8;
pub const COUNTER_SHARD_LEN: usize = 256;
const _: () = assert!(job::SHARDED * 8 <= COUNTER_SHARD_LEN);

const _: () = assert!(ENTRY_LEN == 96);
const _: () = assert!(CLASS_LEN == 56);
const _: () = assert!(job::EXECS < job::MAP_LOCAL_BYTES);
const _: () = assert!(job::PACK_REFUSED < job::UNSERVED);
const _: () = assert!(H_TIER_DIR_IDS + 16 * MAX_TIERS <= PATHS_OFF);
const _: () = assert!(H_EPOCH + 8 <= H_PACK_OFF && H_PACK_OFF + 8 <= H_TIER_DIR_IDS);
const _: () = assert!(HEADER_LEN % 4096 == 0);
