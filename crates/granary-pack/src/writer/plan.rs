//! The data order and the partition cuts. Files are stored in path order (depth first, names
//! sorted: a directory's files end up next to each other), or in the `--files` order; a hard
//! link's later names share the first one's data. Cuts depend only on sizes, so the same tree
//! always gives the same partitions.

use std::collections::HashMap;

use crate::format::Stat;
use crate::writer::walk::Node;

/// A regular file to store, in data order.
#[derive(Debug)]
pub struct Item {
    pub rel: Vec<u8>,
    pub stat: Stat,
    /// A further name of an earlier item's inode: no data of its own.
    pub link_to: Option<u32>,
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = rel.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Appends the regular files below `node` (at `rel`) in path order, each once, without
/// recursion (trees may be thousands of levels deep).
fn subtree<'a>(
    node: &'a Node,
    rel: Vec<u8>,
    items: &mut Vec<Item>,
    seen: &mut HashMap<Vec<u8>, u32>,
) {
    let mut stack: Vec<(&'a Node, Vec<u8>)> = vec![(node, rel)];
    while let Some((n, rel)) = stack.pop() {
        if n.stat.is_file() {
            if !seen.contains_key(&rel) {
                seen.insert(rel.clone(), items.len() as u32);
                items.push(Item {
                    rel,
                    stat: n.stat,
                    link_to: None,
                });
            }
        } else {
            // Reversed so that children pop in name order.
            for (name, child) in n.children.iter().rev() {
                stack.push((child, join(&rel, name)));
            }
        }
    }
}

/// The regular files of `root` in data order, and each one's position by path.
pub fn order(root: &Node, list: Option<&[Vec<u8>]>) -> (Vec<Item>, HashMap<Vec<u8>, u32>) {
    let mut items = Vec::new();
    let mut seen = HashMap::new();
    match list {
        None => subtree(root, Vec::new(), &mut items, &mut seen),
        Some(paths) => {
            for rel in paths {
                let mut node = Some(root);
                for part in rel.split(|&b| b == b'/') {
                    node = node.and_then(|n| n.children.get(part));
                }
                if let Some(n) = node {
                    subtree(n, rel.clone(), &mut items, &mut seen);
                }
            }
        }
    }
    // Hard links: the first name in data order holds the data.
    let mut first: HashMap<(u32, u32, u64), u32> = HashMap::new();
    for (i, it) in items.iter_mut().enumerate() {
        if it.stat.nlink > 1 {
            let key = (it.stat.dev_major, it.stat.dev_minor, it.stat.ino);
            match first.get(&key) {
                Some(&p) => it.link_to = Some(p),
                None => {
                    first.insert(key, i as u32);
                }
            }
        }
    }
    (items, seen)
}

/// Decides where partitions end, from what was stored so far.
pub struct Cutter {
    /// Partitions wanted (balanced by size).
    target: u64,
    /// Hard cap on a partition's data (`--partition-size`), if any.
    max: Option<u64>,
    total_raw: u64,
    done_raw: u64,
    done_stored: u64,
    part_stored: u64,
    part_files: u64,
    part_number: u64,
}

impl Cutter {
    pub fn new(
        total_raw: u64,
        data_files: u64,
        partitions: Option<u32>,
        max: Option<u64>,
    ) -> Cutter {
        let target = match (partitions, max) {
            (Some(n), _) => n as u64,
            (None, Some(m)) => total_raw.div_ceil(m.max(1)),
            (None, None) => total_raw.div_ceil(crate::writer::options::DEFAULT_PARTITION_SIZE),
        };
        Cutter {
            target: target.clamp(1, data_files.max(1)),
            max,
            total_raw,
            done_raw: 0,
            done_stored: 0,
            part_stored: 0,
            part_files: 0,
            part_number: 0,
        }
    }

    /// Whether a file of `raw` bytes starts a new partition.
    pub fn cut_before(&mut self, raw: u64) -> bool {
        if self.part_files == 0 {
            return false;
        }
        let ratio = if self.done_raw == 0 {
            1.0
        } else {
            self.done_stored as f64 / self.done_raw as f64
        };
        let est = raw as f64 * ratio;
        let over_max = self
            .max
            .is_some_and(|m| self.part_stored as f64 + est > m as f64);
        let est_total = self.done_stored as f64 + (self.total_raw - self.done_raw) as f64 * ratio;
        let boundary = (self.part_number + 1) as f64 * est_total / self.target as f64;
        let past_boundary =
            self.part_number + 1 < self.target && self.done_stored as f64 + est / 2.0 > boundary;
        let cut = over_max || past_boundary;
        if cut {
            self.part_number += 1;
            self.part_stored = 0;
            self.part_files = 0;
        }
        cut
    }

    /// Records a stored file.
    pub fn stored(&mut self, raw: u64, stored: u64) {
        self.done_raw += raw;
        self.done_stored += stored;
        self.part_stored += stored;
        self.part_files += 1;
    }
}
