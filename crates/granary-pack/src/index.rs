//! The index as a view over its bytes (a `Vec` or a mapping): nothing is decoded up front
//! beyond one validating pass, and any entry, listing or path lookup is then reached directly —
//! entries are fixed-size records, each directory's children one sorted slice.
//!
//! `Index::parse` checks everything a reader relies on, so no later access can index out of
//! range, loop, or see two entries under one name: the header's and every section's checksum,
//! then the structure (every entry but the root listed by exactly one directory, children after
//! their parent, names valid and strictly sorted, data inside its partition, hard links to real
//! data, symlink targets inside the names section).

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::codec::frame_count;
use crate::error::{PackError, Result};
use crate::format::entry::{codec, flags, INDEX_ENTRY_LEN};
use crate::format::header::{PARTITION_HEADER_LEN, PARTITION_REC_LEN};
use crate::format::name::{component_problem, split_relative};
use crate::format::{
    checksum, IndexEntry, IndexHeader, PartitionRec, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};

pub struct Index<B = Vec<u8>> {
    buf: B,
    path: PathBuf,
    hdr: IndexHeader,
}

/// The pack id an index's header must carry: ties partitions to exactly this index.
pub fn pack_id(hdr: &IndexHeader) -> [u8; 16] {
    let mut b = Vec::with_capacity(40);
    for v in [
        hdr.partitions.sum,
        hdr.entries.sum,
        hdr.names.sum,
        hdr.entry_count,
        hdr.partition_count as u64,
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_128(&b).to_le_bytes()
}

impl<B: AsRef<[u8]>> Index<B> {
    /// Checks `buf` completely (see the module's doc); `path` names it in errors.
    pub fn parse(buf: B, path: &Path) -> Result<Index<B>> {
        let hdr = IndexHeader::decode(buf.as_ref(), path)?;
        let ix = Index {
            buf,
            path: path.to_path_buf(),
            hdr,
        };
        ix.check_sections()?;
        ix.check_entries()?;
        Ok(ix)
    }

    fn bad(&self, what: impl Into<String>) -> PackError {
        PackError::corrupt(&self.path, what)
    }

    fn bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &IndexHeader {
        &self.hdr
    }

    /// Number of entries (the root included).
    pub fn len(&self) -> u32 {
        self.hdr.entry_count as u32
    }

    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    fn check_sections(&self) -> Result<()> {
        let h = &self.hdr;
        let file_len = self.bytes().len() as u64;
        if !h.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&h.block_size)
        {
            return Err(self.bad(format!("block size {}", h.block_size)));
        }
        if (h.entry_len as usize) < INDEX_ENTRY_LEN || h.entry_len % 8 != 0 {
            return Err(self.bad(format!("entry length {}", h.entry_len)));
        }
        if (h.partition_rec_len as usize) < PARTITION_REC_LEN || h.partition_rec_len % 8 != 0 {
            return Err(self.bad(format!("partition record length {}", h.partition_rec_len)));
        }
        if h.entry_count == 0 || h.entry_count >= u32::MAX as u64 {
            return Err(self.bad(format!("entry count {}", h.entry_count)));
        }
        let expect = [
            (
                "partition table",
                h.partitions,
                (h.partition_count as u64).checked_mul(h.partition_rec_len as u64),
            ),
            (
                "entries",
                h.entries,
                h.entry_count.checked_mul(h.entry_len as u64),
            ),
            ("names", h.names, Some(h.names.len)),
        ];
        for (what, s, len) in expect {
            let end = s.off.checked_add(s.len);
            if len != Some(s.len) || s.off < h.header_len as u64 || end.is_none_or(|e| e > file_len)
            {
                return Err(self.bad(format!(
                    "{what} section out of range (offset {}, {} bytes, index file {file_len} bytes)",
                    s.off, s.len
                )));
            }
            if checksum(&self.bytes()[s.off as usize..(s.off + s.len) as usize]) != s.sum {
                return Err(self.bad(format!("{what} checksum mismatch")));
            }
        }
        if pack_id(h) != h.pack_id {
            return Err(self.bad("pack id does not match the index's sections"));
        }
        Ok(())
    }

    /// Entry `i`, or `None` past the end.
    pub fn entry(&self, i: u32) -> Option<IndexEntry> {
        if i as u64 >= self.hdr.entry_count {
            return None;
        }
        let off = self.hdr.entries.off as usize + i as usize * self.hdr.entry_len as usize;
        self.bytes()
            .get(off..off + INDEX_ENTRY_LEN)
            .map(IndexEntry::decode)
    }

    fn names_slice(&self, off: u64, len: u32) -> Option<&[u8]> {
        let end = off.checked_add(len as u64)?;
        if end > self.hdr.names.len {
            return None;
        }
        let base = self.hdr.names.off;
        self.bytes()
            .get((base + off) as usize..(base + end) as usize)
    }

    /// The entry's own name (empty for the root).
    pub fn name(&self, e: &IndexEntry) -> &[u8] {
        self.names_slice(e.name_off, e.name_len).unwrap_or_default()
    }

    /// A symlink's target as `readlink` returns it.
    pub fn link_target(&self, e: &IndexEntry) -> &[u8] {
        self.names_slice(e.link_off, e.link_len).unwrap_or_default()
    }

    pub fn children(&self, e: &IndexEntry) -> Range<u32> {
        if !e.stat.is_dir() {
            return 0..0;
        }
        e.first_child..e.first_child.saturating_add(e.child_count)
    }

    pub fn partition(&self, n: u32) -> Option<PartitionRec> {
        if n >= self.hdr.partition_count {
            return None;
        }
        let off =
            self.hdr.partitions.off as usize + n as usize * self.hdr.partition_rec_len as usize;
        self.bytes()
            .get(off..off + PARTITION_REC_LEN)
            .map(PartitionRec::decode)
    }

    fn check_entries(&self) -> Result<()> {
        let n = self.len();
        let root = self.entry(0).ok_or_else(|| self.bad("no root entry"))?;
        if !root.stat.is_dir() || root.parent != 0 || root.name_len != 0 {
            return Err(self.bad("entry 0 is not the root directory"));
        }
        // Each entry on its own first, so an error names what is wrong with it…
        for i in 0..n {
            let e = self
                .entry(i)
                .ok_or_else(|| self.bad("entry out of range"))?;
            let at = |what: &str| self.bad(format!("entry {i}: {what}"));
            if e.flags & !flags::KNOWN != 0 {
                return Err(at("unknown flags"));
            }
            if i > 0 {
                let name = self
                    .names_slice(e.name_off, e.name_len)
                    .ok_or_else(|| at("name outside the names section"))?;
                if let Some(p) = component_problem(name) {
                    return Err(at(p));
                }
            }
            if !e.stat.is_dir() && e.child_count != 0 {
                return Err(at("children on a non-directory"));
            }
            if e.stat.is_file() {
                self.check_data(i, &e)?;
            } else if e.flags & flags::HARDLINK != 0 {
                return Err(at("hard link flag on a non-file"));
            }
            if e.stat.is_symlink() {
                let t = self
                    .names_slice(e.link_off, e.link_len)
                    .ok_or_else(|| at("symlink target outside the names section"))?;
                if t.is_empty() || t.contains(&0) {
                    return Err(at("empty symlink target or NUL in it"));
                }
            }
        }
        // …then the tree: every entry but the root listed exactly once, after its directory.
        let mut listed: u64 = 0;
        for i in 0..n {
            let e = self
                .entry(i)
                .ok_or_else(|| self.bad("entry out of range"))?;
            if e.stat.is_dir() && e.child_count > 0 {
                let end = e.first_child.checked_add(e.child_count);
                if e.first_child <= i || end.is_none_or(|end| end > n) {
                    return Err(self.bad(format!(
                        "entry {i}: children out of range or before their directory"
                    )));
                }
                listed += e.child_count as u64;
                if listed > n as u64 - 1 {
                    return Err(self.bad(format!(
                        "entry {i}: entries listed by more than one directory"
                    )));
                }
                self.check_listing(i, &e)?;
            }
        }
        if listed != n as u64 - 1 {
            return Err(self.bad(format!(
                "{} entries are listed by no directory",
                n as u64 - 1 - listed
            )));
        }
        Ok(())
    }

    /// Every child names `dir` as its parent (so no entry is listed twice) and names strictly
    /// increase (so no name appears twice and lookups may bisect).
    fn check_listing(&self, dir: u32, e: &IndexEntry) -> Result<()> {
        let mut prev: Option<&[u8]> = None;
        for c in self.children(e) {
            let child = self
                .entry(c)
                .ok_or_else(|| self.bad("child out of range"))?;
            if child.parent != dir {
                return Err(self.bad(format!(
                    "entry {c} is listed by directory {dir} but names {} as its parent",
                    child.parent
                )));
            }
            let name = self.names_slice(child.name_off, child.name_len);
            if name.is_none() || prev.is_some_and(|p| Some(p) >= name) {
                return Err(self.bad(format!(
                    "directory {dir}: names not strictly sorted (duplicate or out of order) at entry {c}"
                )));
            }
            prev = name;
        }
        Ok(())
    }

    fn check_data(&self, i: u32, e: &IndexEntry) -> Result<()> {
        let at = |what: String| self.bad(format!("entry {i}: {what}"));
        if e.is_hardlink() {
            let t = self
                .entry(e.link_entry)
                .filter(|_| e.link_entry != i)
                .ok_or_else(|| at("hard link to a missing entry".into()))?;
            let same = t.stat.is_file()
                && !t.is_hardlink()
                && (
                    t.partition,
                    t.offset,
                    t.stored_len,
                    t.codec,
                    t.checksum,
                    t.stat.size,
                ) == (
                    e.partition,
                    e.offset,
                    e.stored_len,
                    e.codec,
                    e.checksum,
                    e.stat.size,
                );
            if !same {
                return Err(at(format!(
                    "hard link to entry {} whose data differs",
                    e.link_entry
                )));
            }
            return Ok(());
        }
        let p = self
            .partition(e.partition)
            .ok_or_else(|| at(format!("partition {} does not exist", e.partition)))?;
        let data_end = (PARTITION_HEADER_LEN as u64).checked_add(p.data_len);
        let end = e.offset.checked_add(e.stored_len);
        if e.offset < PARTITION_HEADER_LEN as u64
            || end.is_none()
            || data_end.is_none()
            || end > data_end
        {
            return Err(at(format!(
                "data at {}+{} outside partition {}",
                e.offset, e.stored_len, e.partition
            )));
        }
        match e.codec {
            codec::NONE if e.stored_len == e.stat.size => Ok(()),
            codec::FRAMED
                if e.stat.size > 0
                    && frame_count(e.stat.size, self.hdr.block_size)
                        .checked_mul(4)
                        .is_some_and(|t| t <= e.stored_len) =>
            {
                Ok(())
            }
            c => Err(at(format!(
                "codec {c} with {} stored bytes for {} bytes",
                e.stored_len, e.stat.size
            ))),
        }
    }

    /// The entry at `path` (relative to the pack's root; symlinks are not followed).
    pub fn lookup(&self, path: &[u8]) -> Result<u32> {
        let parts = split_relative(path).map_err(PackError::Invalid)?;
        let mut cur = 0u32;
        for (k, part) in parts.iter().enumerate() {
            let e = self
                .entry(cur)
                .ok_or_else(|| self.bad("entry out of range"))?;
            let not_found = || {
                PackError::NotFound(String::from_utf8_lossy(&parts[..=k].join(&b'/')).into_owned())
            };
            if !e.stat.is_dir() {
                return Err(not_found());
            }
            cur = self.find_child(&e, part).ok_or_else(not_found)?;
        }
        Ok(cur)
    }

    /// Binary search of a directory's sorted children.
    pub fn find_child(&self, dir: &IndexEntry, name: &[u8]) -> Option<u32> {
        let r = self.children(dir);
        let (mut lo, mut hi) = (r.start, r.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = self.entry(mid)?;
            match self.name(&e).cmp(name) {
                std::cmp::Ordering::Equal => return Some(mid),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }

    /// The entry's path relative to the root (`""` for the root).
    pub fn path_of(&self, mut i: u32) -> Vec<u8> {
        let mut parts = Vec::new();
        // Parents have smaller indexes (checked by `parse`), so this ends.
        while i != 0 {
            let Some(e) = self.entry(i) else { break };
            parts.push(self.name(&e));
            if e.parent >= i {
                break;
            }
            i = e.parent;
        }
        parts.reverse();
        parts.join(&b'/')
    }
}
