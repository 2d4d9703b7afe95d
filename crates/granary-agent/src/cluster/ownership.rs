//! Which rank holds which file: decided by every rank alone from the catalog they share (the
//! same table image, so the same entries in the same order), with no message exchanged.
//!
//! Files are dealt out largest first to the rank holding the fewest bytes so far (ties: the
//! smaller object id, then the lower rank), so every rank holds its share of the bytes within one
//! file — a hash modulo the ranks would leave a rank several files above its share on a small
//! dataset (a binomial spread) and a dataset's large files wherever they land. Files of equal
//! size (a FanStore directory) go round the ranks in the order of their object ids, which are
//! path hashes: each directory is spread over every rank. With `--replicas K` the next K − 1
//! ranks hold a file too; `--replicate GLOB` files are held by every rank (read from the source
//! once, by their first owner, and copied to the others).
//!
//! A pack's files (`granary serve --pack`) are dealt out in **units**: runs of consecutive
//! files in the order their bytes lie in the pack (partition, offset), each run at most
//! `unit_size` bytes (a larger file is a unit of its own), in pack order each to the rank holding
//! the fewest bytes so far. A unit is what a rank's partition streamer reads from the PFS in
//! a few large requests; every byte of the pack is read once for the job, by its unit's rank.
//! Units rather than whole partitions or one stretch per rank: a pack lays files out in path
//! order, so a directory (a class, one of FanStore's file sizes) is one stretch of it; dealt in
//! stretches, one rank would hold — and serve every other rank — all of it. Units of about a
//! sixteenth of a rank's share spread every directory over every rank, whatever the pack's
//! partition count (one partition, or fewer than the ranks, balance alike), and each rank
//! holds its share of the bytes within one unit. Files served from the source (changed since
//! packing) are then dealt as files onto the least loaded rank; files the pack marks
//! `--replicate` are held by every rank, read by the rank of the unit they lie in.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use granary_shm::layout::pack::LOC_REPLICATE;
use granary_shm::Table;

/// No rank: not a regular file (or an empty one), or void.
pub const NONE: u16 = u16::MAX;

pub struct Ownership {
    ranks: u32,
    replicas: u32,
    /// Per entry: its first owner (`NONE` for entries nobody holds).
    primary: Vec<u16>,
    /// Per entry: held by every rank (`--replicate`).
    everywhere: Vec<bool>,
}

impl Ownership {
    /// Deals the live regular files of `t` out to `ranks` ranks; `replicate(rel_path)` says
    /// whether a file is held by every rank.
    pub fn assign(
        t: &Table,
        ranks: u32,
        replicas: u32,
        replicate: impl Fn(&[u8]) -> bool,
    ) -> Ownership {
        let ranks = ranks.clamp(1, NONE as u32);
        let n = t.entry_count() as usize;
        let mut primary = vec![NONE; n];
        let mut everywhere = vec![false; n];
        let mut dealt = Vec::new();
        let mut spread = Vec::new();
        // Packed files: (partition, offset, entry, size, held everywhere).
        let mut packed = Vec::new();
        for i in 0..t.entry_count() {
            let Some(e) = t.entry(i) else { continue };
            if !e.stat.is_file() || e.stat.size == 0 || t.state(i).is_void() {
                continue;
            }
            let rel = t.rel_path_vec(i).unwrap_or_default();
            let loc = t.locator(i);
            let all = replicate(&rel) || loc.is_some_and(|l| l.flags & LOC_REPLICATE != 0);
            everywhere[i as usize] = all;
            match loc {
                Some(l) => packed.push((l.partition, l.offset, i, e.stat.size, all)),
                None if all => spread.push((e.object, i)),
                None => dealt.push((Reverse(e.stat.size), e.object, i)),
            }
        }
        let held = deal_units(&mut packed, ranks, &mut primary);
        dealt.sort_unstable();
        let mut load: BinaryHeap<Reverse<(u64, u32)>> =
            (0..ranks).map(|r| Reverse((held[r as usize], r))).collect();
        for (Reverse(size), _, i) in dealt {
            if let Some(Reverse((bytes, r))) = load.pop() {
                primary[i as usize] = r as u16;
                load.push(Reverse((bytes + size, r)));
            }
        }
        // Files every rank holds: who reads each from the source, round the ranks.
        spread.sort_unstable();
        for (k, (_, i)) in spread.into_iter().enumerate() {
            primary[i as usize] = (k as u32 % ranks) as u16;
        }
        Ownership {
            ranks,
            replicas: replicas.clamp(1, ranks),
            primary,
            everywhere,
        }
    }

    /// The rank that reads `idx` from the source — from the pack, for a packed file (`None`:
    /// nobody holds it).
    pub fn primary(&self, idx: u32) -> Option<u32> {
        match self.primary.get(idx as usize) {
            Some(&r) if r != NONE => Some(r as u32),
            _ => None,
        }
    }

    /// True if every rank holds `idx` (`--replicate`).
    pub fn everywhere(&self, idx: u32) -> bool {
        self.everywhere.get(idx as usize).copied().unwrap_or(false)
    }

    /// The ranks holding `idx`, in the order to ask them: its first owner, then its replicas.
    pub fn owners(&self, idx: u32) -> Vec<u32> {
        let Some(p) = self.primary(idx) else {
            return Vec::new();
        };
        let k = if self.everywhere(idx) {
            self.ranks
        } else {
            self.replicas
        };
        (0..k).map(|j| (p + j) % self.ranks).collect()
    }

    /// True if `rank` holds `idx`.
    pub fn holds(&self, rank: u32, idx: u32) -> bool {
        self.owners(idx).contains(&rank)
    }

    /// Entries `rank` holds without reading them from the source itself (replicas and files
    /// every rank holds): copied from their first owner when the serve starts.
    pub fn copies_of_others(&self, rank: u32) -> Vec<u32> {
        (0..self.primary.len() as u32)
            .filter(|&i| self.primary(i).is_some_and(|p| p != rank) && self.holds(rank, i))
            .collect()
    }
}

/// Units per rank a pack is cut into (module comment), unless they would be smaller than
/// `MIN_UNIT`: one read of the PFS at the default block size.
const UNITS_PER_RANK: u64 = 16;
const MIN_UNIT: u64 = 8 << 20;

/// The largest run of consecutive packed files that makes one unit, for `total` bytes dealt
/// out to `ranks` ranks.
pub fn unit_size(total: u64, ranks: u32) -> u64 {
    (total / (ranks.max(1) as u64 * UNITS_PER_RANK)).max(MIN_UNIT)
}

/// The packed files (`(partition, offset, entry, size, held everywhere)`, sorted here into the
/// pack's order) cut into units and dealt out: each file's rank into `primary`. Returns the
/// bytes each rank holds. A file held everywhere weighs nothing in its unit's size.
fn deal_units(
    packed: &mut [(u32, u64, u32, u64, bool)],
    ranks: u32,
    primary: &mut [u16],
) -> Vec<u64> {
    packed.sort_unstable();
    let weight = |f: &(u32, u64, u32, u64, bool)| if f.4 { 0 } else { f.3 };
    let unit = unit_size(packed.iter().map(weight).sum(), ranks);
    // The least loaded rank, the lowest of equals: equal units go round the ranks.
    let mut load: BinaryHeap<Reverse<(u64, u32)>> =
        (0..ranks).map(|r| Reverse((0u64, r))).collect();
    let mut deal = |files: &[(u32, u64, u32, u64, bool)]| {
        if let Some(Reverse((held, r))) = load.pop() {
            for f in files {
                primary[f.2 as usize] = r as u16;
            }
            load.push(Reverse((held + files.iter().map(weight).sum::<u64>(), r)));
        }
    };
    let (mut from, mut bytes) = (0, 0);
    for k in 0..packed.len() {
        let f = &packed[k];
        let other_partition = k > from && packed[k - 1].0 != f.0;
        if k > from && (other_partition || bytes + weight(f) > unit) {
            deal(&packed[from..k]);
            (from, bytes) = (k, 0);
        }
        bytes += weight(f);
    }
    if from < packed.len() {
        deal(&packed[from..]);
    }
    let mut held = vec![0u64; ranks as usize];
    for Reverse((bytes, r)) in load {
        held[r as usize] = bytes;
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::layout::pack::LOC_PACKED;
    use granary_shm::{build_catalog, Catalog, CatalogEntry, Locator, Mapping, PackSpec};
    use granary_shm::{StatRec, TableSpec};
    use proptest::prelude::*;
    use std::os::fd::AsRawFd;

    /// Where a file lies in a pack: (partition, offset, locator flags).
    type Loc = Option<(u32, u64, u8)>;
    /// A packed dataset: its files and where each lies.
    type Packed = (Vec<(String, u64)>, Box<dyn Fn(&[u8]) -> Loc>);

    fn table(sizes: &[(String, u64)]) -> (Mapping, Table, tempfile::NamedTempFile) {
        packed_table(sizes, &|_| None)
    }

    /// A table serving a pack: `loc(name)` is a file's (partition, offset, flags) in it, `None`
    /// for a file served from the source.
    fn packed_table(
        sizes: &[(String, u64)],
        loc: &dyn Fn(&[u8]) -> Loc,
    ) -> (Mapping, Table, tempfile::NamedTempFile) {
        let dir = |ino| StatRec {
            mode: libc::S_IFDIR | 0o755,
            ino,
            nlink: 2,
            ..Default::default()
        };
        let mut entries = vec![CatalogEntry {
            stat: dir(1),
            ..Default::default()
        }];
        for (k, (name, size)) in sizes.iter().enumerate() {
            entries.push(CatalogEntry {
                rel_path: name.as_bytes().to_vec(),
                stat: StatRec {
                    mode: libc::S_IFREG | 0o644,
                    ino: 10 + k as u64,
                    size: *size,
                    nlink: 1,
                    ..Default::default()
                },
                ..Default::default()
            });
            entries[0].children.push(k + 1);
        }
        let spec = TableSpec {
            source: b"/s".to_vec(),
            source_real: b"/s".to_vec(),
            ring_cap: 4,
            job_slots: 2,
            ..Default::default()
        };
        let mut cat = Catalog::from_entries(&entries).unwrap();
        cat.locators = (0..cat.len())
            .map(|i| match loc(cat.name(i)) {
                Some((partition, offset, flags)) if i > 0 => Locator {
                    partition,
                    offset,
                    flags: LOC_PACKED | flags,
                    ..Default::default()
                },
                _ => Locator::default(),
            })
            .collect();
        let mut spec = spec;
        if cat.locators.iter().any(|l| l.is_packed()) {
            spec.pack = Some(PackSpec {
                dir: b"/s.granary".to_vec(),
                partitions: 8,
                ..Default::default()
            });
        }
        let img = build_catalog(&spec, &cat).unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, &img).unwrap();
        let (m, t) = Mapping::map(f.as_file().as_raw_fd(), img.len()).unwrap();
        (m, t, f)
    }

    fn held(o: &Ownership, t: &Table, rank: u32) -> u64 {
        (0..t.entry_count())
            .filter(|&i| o.holds(rank, i))
            .map(|i| t.entry(i).unwrap().stat.size)
            .sum()
    }

    /// FanStore's micro-benchmark at 1/1024: 128 × 128K, 32 × 512K, 8 × 2M, 2 × 8M.
    fn fanstore() -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for (n, size) in [
            (128, 128 << 10),
            (32, 512 << 10),
            (8, 2 << 20),
            (2, 8 << 20),
        ] {
            for i in 0..n {
                v.push((format!("s{size}-f{i:06}"), size));
            }
        }
        v
    }

    #[test]
    fn each_rank_holds_its_share_within_one_file() {
        let files = fanstore();
        let (_m, t, _f) = table(&files);
        let total: u64 = files.iter().map(|f| f.1).sum();
        let largest = files.iter().map(|f| f.1).max().unwrap();
        for ranks in [1, 2, 3, 5, 8] {
            let o = Ownership::assign(&t, ranks, 1, |_| false);
            for r in 0..ranks {
                let h = held(&o, &t, r) as f64;
                let share = total as f64 / ranks as f64;
                assert!(
                    (h - share).abs() <= largest as f64,
                    "{ranks} ranks, rank {r}: {h} vs {share}"
                );
            }
            // Every file has exactly one owner.
            for i in 1..t.entry_count() {
                assert_eq!((0..ranks).filter(|&r| o.holds(r, i)).count(), 1);
            }
        }
    }

    #[test]
    fn replicas_and_replicated_files() {
        let mut files = fanstore();
        files.push(("val-a".into(), 1000));
        files.push(("val-b".into(), 3000));
        let (_m, t, _f) = table(&files);
        let o = Ownership::assign(&t, 3, 2, |p| p.starts_with(b"val-"));
        for i in 1..t.entry_count() {
            let owners = o.owners(i);
            let name = t.rel_path_vec(i).unwrap();
            if name.starts_with(b"val-") {
                assert_eq!(owners.len(), 3, "held by every rank");
                assert!(o.everywhere(i));
            } else {
                assert_eq!(owners.len(), 2);
                assert_ne!(owners[0], owners[1]);
                assert_eq!(owners[1], (owners[0] + 1) % 3);
            }
        }
        let copies: usize = (0..3).map(|r| o.copies_of_others(r).len()).sum();
        assert_eq!(
            copies,
            (t.entry_count() as usize - 3) + 2 * 2,
            "one replica each, val twice"
        );
        // Replicas cannot exceed the ranks.
        assert_eq!(Ownership::assign(&t, 2, 5, |_| false).owners(1).len(), 2);
    }

    /// FanStore's set at 1/64 (2048 × 128K … 32 × 8M, 1 GiB), laid out in the pack by path
    /// (each size one stretch, as `granary pack` lays out a tree), in `parts` partitions.
    fn fanstore_pack(parts: u64) -> Packed {
        let mut files = Vec::new();
        for (n, size) in [
            (2048, 128 << 10),
            (512, 512 << 10),
            (128, 2 << 20),
            (32, 8 << 20),
        ] {
            for i in 0..n {
                files.push((format!("s{size:08}/f{i:06}"), size));
            }
        }
        let mut at = 0u64;
        let pos: std::collections::HashMap<Vec<u8>, u64> = files
            .iter()
            .map(|(name, size)| {
                at += size;
                (name.as_bytes().to_vec(), at - size)
            })
            .collect();
        let part = at.div_ceil(parts);
        let loc = move |name: &[u8]| {
            let off = *pos.get(name)?;
            Some(((off / part) as u32, off % part, 0))
        };
        (files, Box::new(loc))
    }

    #[test]
    fn a_pack_is_dealt_in_units_that_spread_every_directory_over_every_rank() {
        for parts in [1, 3] {
            let (files, loc) = fanstore_pack(parts);
            let (_m, t, _f) = packed_table(&files, &*loc);
            let total: u64 = files.iter().map(|f| f.1).sum();
            for ranks in [1, 2, 3, 5, 8] {
                let o = Ownership::assign(&t, ranks, 1, |_| false);
                let unit = unit_size(total, ranks);
                for r in 0..ranks {
                    let h = held(&o, &t, r);
                    assert!(
                        h.abs_diff(total / ranks as u64) <= unit.max(8 << 20),
                        "{parts} partitions, {ranks} ranks, rank {r}: {h} of {total}"
                    );
                }
                // Every size (a directory) on every rank: no rank serves all of one.
                for size in [128 << 10, 512 << 10, 2 << 20, 8 << 20] {
                    let of_size: Vec<u32> = (1..t.entry_count())
                        .filter(|&i| t.entry(i).is_some_and(|e| e.stat.size == size))
                        .collect();
                    let bytes = of_size.len() as u64 * size;
                    if bytes < 2 * ranks as u64 * unit.max(size) {
                        continue; // fewer units of this size than ranks
                    }
                    for r in 0..ranks {
                        let n = of_size.iter().filter(|&&i| o.holds(r, i)).count();
                        assert!(
                            n > 0,
                            "{ranks} ranks: rank {r} holds no file of size {size}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_unit_is_a_run_of_the_pack_within_one_partition() {
        // 40 files of 1 MiB in 2 partitions, 2 ranks: units of 8 MiB (the smallest), never
        // across the partitions' boundary, going round the ranks.
        let files: Vec<(String, u64)> = (0..40).map(|i| (format!("f{i:02}"), 1 << 20)).collect();
        let pos = |name: &[u8]| {
            let k: u64 = std::str::from_utf8(name.get(1..)?).ok()?.parse().ok()?;
            Some(((k / 20) as u32, (k % 20) << 20, 0))
        };
        let (_m, t, _f) = packed_table(&files, &pos);
        let o = Ownership::assign(&t, 2, 1, |_| false);
        let rank_of = |k: usize| o.primary(t.lookup(files[k].0.as_bytes()).unwrap()).unwrap();
        let ranks: Vec<u32> = (0..40).map(rank_of).collect();
        let want: Vec<u32> = [(8, 0), (8, 1), (4, 0), (8, 1), (8, 0), (4, 1)]
            .iter()
            .flat_map(|&(n, r)| std::iter::repeat_n(r, n))
            .collect();
        assert_eq!(ranks, want);
    }

    #[test]
    fn replicated_and_changed_files_of_a_pack() {
        let mut files = fanstore();
        files.push(("val-a".into(), 3 << 20));
        files.push(("changed".into(), 5 << 20));
        let pos = |name: &[u8]| match name {
            b"changed" => None,
            b"val-a" => Some((0, 1 << 40, LOC_REPLICATE)),
            _ => {
                let k = files.iter().position(|f| f.0.as_bytes() == name)? as u64;
                Some((0, k << 20, 0))
            }
        };
        let (_m, t, _f) = packed_table(&files, &pos);
        let o = Ownership::assign(&t, 3, 1, |_| false);
        let val = t.lookup(b"val-a").unwrap();
        assert!(o.everywhere(val) && o.owners(val).len() == 3);
        assert!(o.primary(val).is_some(), "read by the rank of its unit");
        // Served from the source: dealt as a file, onto a least loaded rank.
        let changed = t.lookup(b"changed").unwrap();
        assert!(t.locator(changed).is_none() && o.owners(changed).len() == 1);
        let total: u64 = files.iter().map(|f| f.1).sum::<u64>() - (3 << 20);
        for r in 0..3 {
            let h = held(&o, &t, r) - (3 << 20);
            assert!(h.abs_diff(total / 3) <= 8 << 20, "rank {r}: {h}");
        }
    }

    proptest! {
        #[test]
        fn any_dataset_is_balanced_and_deterministic(
            sizes in proptest::collection::vec(0u64..(16 << 20), 1..200),
            ranks in 1u32..9,
        ) {
            let files: Vec<_> = sizes.iter().enumerate().map(|(i, s)| (format!("f{i}"), *s)).collect();
            let (_m, t, _f) = table(&files);
            let a = Ownership::assign(&t, ranks, 1, |_| false);
            let b = Ownership::assign(&t, ranks, 1, |_| false);
            prop_assert_eq!(&a.primary, &b.primary);
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().copied().max().unwrap_or(0);
            for r in 0..ranks {
                let h = held(&a, &t, r);
                prop_assert!(h.abs_diff(total / ranks as u64) <= largest + 1);
            }
            for i in 1..t.entry_count() {
                let empty = t.entry(i).unwrap().stat.size == 0;
                prop_assert_eq!(a.primary(i).is_none(), empty);
            }
        }
    }
}
