//! Lays the tree out as an index: entries breadth first (each directory's children contiguous,
//! in name order, after their parent), names and symlink targets in one pool, then the header
//! with every section's checksum and the pack id derived from them.

use std::collections::{HashMap, VecDeque};
use std::os::unix::ffi::OsStrExt;

use globset::GlobSet;

use crate::error::{PackError, Result};
use crate::format::entry::{flags, NO_LINK};
use crate::format::header::{Section, INDEX_HEADER_LEN, PARTITION_REC_LEN};
use crate::format::{checksum, IndexEntry, IndexHeader, PartitionRec};
use crate::index::pack_id;
use crate::writer::pipeline::Loc;
use crate::writer::plan::Item;
use crate::writer::walk::Node;

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn align8(v: &mut Vec<u8>) {
    while v.len() % 8 != 0 {
        v.push(0);
    }
}

/// What the index records about the pack as a whole.
pub struct Meta {
    pub replicate: GlobSet,
    pub block_size: u32,
    /// `format::header::info` bits.
    pub info: u32,
}

pub struct Built {
    pub bytes: Vec<u8>,
    pub header: IndexHeader,
}

pub fn build(
    root: &Node,
    items: &[Item],
    by_path: &HashMap<Vec<u8>, u32>,
    locs: &[Option<Loc>],
    partitions: &[PartitionRec],
    meta: &Meta,
) -> Result<Built> {
    let (replicate, block_size, info) = (&meta.replicate, meta.block_size, meta.info);
    let mut entries: Vec<IndexEntry> = Vec::new();
    let mut names: Vec<u8> = Vec::new();
    let mut entry_of_item: Vec<u32> = vec![NO_LINK; items.len()];
    let mut counts = (0u64, 0u64, 0u64); // files, dirs, symlinks
                                         // (node, its path, its entry index)
    let mut queue: VecDeque<(&Node, Vec<u8>, u32)> = VecDeque::new();
    entries.push(IndexEntry {
        stat: root.stat,
        link_entry: NO_LINK,
        ..Default::default()
    });
    queue.push_back((root, Vec::new(), 0));
    while let Some((node, rel, idx)) = queue.pop_front() {
        if !node.stat.is_dir() {
            continue;
        }
        counts.1 += 1;
        let first = entries.len() as u32;
        entries[idx as usize].first_child = first;
        entries[idx as usize].child_count = node.children.len() as u32;
        if entries.len() + node.children.len() >= u32::MAX as usize {
            return Err(PackError::Invalid("more than 4 billion entries".into()));
        }
        for (name, child) in &node.children {
            let i = entries.len() as u32;
            let path = join(&rel, name);
            let mut e = IndexEntry {
                name_off: names.len() as u64,
                name_len: name.len() as u32,
                parent: idx,
                stat: child.stat,
                link_entry: NO_LINK,
                ..Default::default()
            };
            names.extend_from_slice(name);
            if let Some(target) = &child.link {
                e.link_off = names.len() as u64;
                e.link_len = target.len() as u32;
                e.checksum = checksum(target);
                names.extend_from_slice(target);
                counts.2 += 1;
            }
            if child.stat.is_file() {
                counts.0 += 1;
                if let Some(&item) = by_path.get(&path) {
                    entry_of_item[item as usize] = i;
                    let loc = locs[item as usize]
                        .ok_or_else(|| PackError::Invalid("a file was not stored".into()))?;
                    e.partition = loc.partition;
                    e.offset = loc.offset;
                    e.stored_len = loc.stored_len;
                    e.codec = loc.codec;
                    e.checksum = loc.checksum;
                    if child.stat.blocks.saturating_mul(512) < child.stat.size {
                        e.flags |= flags::SPARSE;
                    }
                }
            }
            if replicate.is_match(std::path::Path::new(std::ffi::OsStr::from_bytes(&path))) {
                e.flags |= flags::REPLICATE;
            }
            entries.push(e);
            queue.push_back((child, path, i));
        }
    }
    for (item, it) in items.iter().enumerate() {
        if let Some(p) = it.link_to {
            let e = &mut entries[entry_of_item[item] as usize];
            e.flags |= flags::HARDLINK;
            e.link_entry = entry_of_item[p as usize];
        }
    }

    let mut table = Vec::with_capacity(partitions.len() * PARTITION_REC_LEN);
    for p in partitions {
        table.extend_from_slice(&p.encode());
    }
    let mut body = Vec::new();
    let part_off = INDEX_HEADER_LEN as u64;
    body.extend_from_slice(&table);
    align8(&mut body);
    let entries_off = INDEX_HEADER_LEN as u64 + body.len() as u64;
    for e in &entries {
        body.extend_from_slice(&e.encode());
    }
    let names_off = INDEX_HEADER_LEN as u64 + body.len() as u64;
    body.extend_from_slice(&names);
    let entries_len = (names_off - entries_off) as usize;
    let e0 = (entries_off - INDEX_HEADER_LEN as u64) as usize;
    let mut header = IndexHeader {
        header_len: INDEX_HEADER_LEN as u32,
        entry_count: entries.len() as u64,
        partition_count: partitions.len() as u32,
        block_size,
        partitions: Section {
            off: part_off,
            len: table.len() as u64,
            sum: checksum(&table),
        },
        entries: Section {
            off: entries_off,
            len: entries_len as u64,
            sum: checksum(&body[e0..e0 + entries_len]),
        },
        names: Section {
            off: names_off,
            len: names.len() as u64,
            sum: checksum(&names),
        },
        entry_len: crate::format::entry::INDEX_ENTRY_LEN as u32,
        partition_rec_len: PARTITION_REC_LEN as u32,
        file_count: counts.0,
        raw_bytes: partitions.iter().map(|p| p.raw_bytes).sum(),
        stored_bytes: partitions.iter().map(|p| p.data_len).sum(),
        dir_count: counts.1,
        symlink_count: counts.2,
        info,
        ..Default::default()
    };
    header.pack_id = pack_id(&header);
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(&body);
    Ok(Built { bytes, header })
}
