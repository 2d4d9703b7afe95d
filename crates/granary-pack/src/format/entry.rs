//! One entry of the index: a fixed 200-byte little-endian record per path (offsets in
//! docs/pack-format.md). Entries are stored breadth-first with each directory's children
//! contiguous and sorted by name, so a listing is one slice and a lookup a binary search.

use super::fields::*;

pub const INDEX_ENTRY_LEN: usize = 200;
/// `link_entry` of an entry that is not a second name of a hard-linked file.
pub const NO_LINK: u32 = u32::MAX;

/// How a regular file's bytes are stored in its partition.
pub mod codec {
    /// The file's bytes as they are.
    pub const NONE: u8 = 0;
    /// A table of frame words, then the frames (crate::codec).
    pub const FRAMED: u8 = 1;
}

pub mod flags {
    /// Matched a `--replicate` pattern: every node of a cluster keeps its own copy.
    pub const REPLICATE: u8 = 1;
    /// A further name of a hard-linked file: its data is `link_entry`'s.
    pub const HARDLINK: u8 = 2;
    /// The source file had holes.
    pub const SPARSE: u8 = 4;
    pub const KNOWN: u8 = REPLICATE | HARDLINK | SPARSE;
}

/// `struct statx_timestamp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

/// Every `statx` field the catalog serves, as the pack records it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// `stx_mask` as the source returned it (less `STATX_ATIME`: see `atime`).
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub attributes_mask: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// File type and permission bits.
    pub mode: u32,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// Reading a file to pack it changes its atime, so a pack records mtime here: the same tree
    /// then gives the same bytes.
    pub atime: Timestamp,
    pub btime: Timestamp,
    pub ctime: Timestamp,
    pub mtime: Timestamp,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
}

impl Stat {
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
    /// Device, inode, type, size, mtime and ctime: what says the source still holds this version
    /// (design notes, preload rule 11).
    pub fn same_identity(&self, o: &Stat) -> bool {
        self.dev_major == o.dev_major
            && self.dev_minor == o.dev_minor
            && self.ino == o.ino
            && self.file_type() == o.file_type()
            && self.size == o.size
            && self.mtime == o.mtime
            && self.ctime == o.ctime
    }
}

/// A decoded entry record. Offsets into the names section are not checked here (the index does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexEntry {
    pub name_off: u64,
    pub name_len: u32,
    /// The directory listing this entry (the root is its own parent).
    pub parent: u32,
    /// Directories: children are entries `first_child .. first_child + child_count`.
    pub first_child: u32,
    pub child_count: u32,
    pub stat: Stat,
    /// Regular files: where the stored bytes are.
    pub partition: u32,
    pub codec: u8,
    pub flags: u8,
    /// From the start of the partition file.
    pub offset: u64,
    pub stored_len: u64,
    /// xxh3-64 of the file's bytes (symlinks: of the target).
    pub checksum: u64,
    /// Symlinks: the target, in the names section.
    pub link_off: u64,
    pub link_len: u32,
    /// `flags::HARDLINK`: the entry holding the data; otherwise `NO_LINK`.
    pub link_entry: u32,
}

impl IndexEntry {
    pub fn decode(b: &[u8]) -> IndexEntry {
        let ts = |s, n| Timestamp {
            sec: get_i64(b, s),
            nsec: get_u32(b, n),
        };
        IndexEntry {
            name_off: get_u64(b, 0),
            name_len: get_u32(b, 8),
            parent: get_u32(b, 12),
            first_child: get_u32(b, 16),
            child_count: get_u32(b, 20),
            stat: Stat {
                mode: get_u32(b, 24),
                nlink: get_u32(b, 28),
                uid: get_u32(b, 32),
                gid: get_u32(b, 36),
                size: get_u64(b, 40),
                blocks: get_u64(b, 48),
                blksize: get_u32(b, 56),
                mask: get_u32(b, 60),
                attributes: get_u64(b, 64),
                attributes_mask: get_u64(b, 72),
                atime: ts(80, 112),
                mtime: ts(88, 116),
                ctime: ts(96, 120),
                btime: ts(104, 124),
                ino: get_u64(b, 128),
                dev_major: get_u32(b, 136),
                dev_minor: get_u32(b, 140),
                rdev_major: get_u32(b, 144),
                rdev_minor: get_u32(b, 148),
            },
            partition: get_u32(b, 152),
            codec: b.get(156).copied().unwrap_or(0),
            flags: b.get(157).copied().unwrap_or(0),
            offset: get_u64(b, 160),
            stored_len: get_u64(b, 168),
            checksum: get_u64(b, 176),
            link_off: get_u64(b, 184),
            link_len: get_u32(b, 192),
            link_entry: get_u32(b, 196),
        }
    }

    pub fn encode(&self) -> [u8; INDEX_ENTRY_LEN] {
        let mut b = [0u8; INDEX_ENTRY_LEN];
        let s = &self.stat;
        put_u64(&mut b, 0, self.name_off);
        put_u32(&mut b, 8, self.name_len);
        put_u32(&mut b, 12, self.parent);
        put_u32(&mut b, 16, self.first_child);
        put_u32(&mut b, 20, self.child_count);
        put_u32(&mut b, 24, s.mode);
        put_u32(&mut b, 28, s.nlink);
        put_u32(&mut b, 32, s.uid);
        put_u32(&mut b, 36, s.gid);
        put_u64(&mut b, 40, s.size);
        put_u64(&mut b, 48, s.blocks);
        put_u32(&mut b, 56, s.blksize);
        put_u32(&mut b, 60, s.mask);
        put_u64(&mut b, 64, s.attributes);
        put_u64(&mut b, 72, s.attributes_mask);
        for (i, t) in [s.atime, s.mtime, s.ctime, s.btime].into_iter().enumerate() {
            put_u64(&mut b, 80 + 8 * i, t.sec as u64);
            put_u32(&mut b, 112 + 4 * i, t.nsec);
        }
        put_u64(&mut b, 128, s.ino);
        put_u32(&mut b, 136, s.dev_major);
        put_u32(&mut b, 140, s.dev_minor);
        put_u32(&mut b, 144, s.rdev_major);
        put_u32(&mut b, 148, s.rdev_minor);
        put_u32(&mut b, 152, self.partition);
        b[156] = self.codec;
        b[157] = self.flags;
        put_u64(&mut b, 160, self.offset);
        put_u64(&mut b, 168, self.stored_len);
        put_u64(&mut b, 176, self.checksum);
        put_u64(&mut b, 184, self.link_off);
        put_u32(&mut b, 192, self.link_len);
        put_u32(&mut b, 196, self.link_entry);
        b
    }

    pub fn is_hardlink(&self) -> bool {
        self.flags & flags::HARDLINK != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let e = IndexEntry {
            name_off: 7,
            name_len: 3,
            parent: 1,
            first_child: 9,
            child_count: 2,
            stat: Stat {
                mode: 0o100644,
                size: 12345,
                mtime: Timestamp { sec: -5, nsec: 9 },
                btime: Timestamp { sec: 1, nsec: 2 },
                dev_minor: 3,
                ..Default::default()
            },
            partition: 4,
            codec: codec::FRAMED,
            flags: flags::REPLICATE,
            offset: 128,
            stored_len: 99,
            checksum: 0xdead_beef,
            link_off: 0,
            link_len: 0,
            link_entry: NO_LINK,
        };
        assert_eq!(IndexEntry::decode(&e.encode()), e);
    }
}
