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
//! A pack's files (`granary serve --pack`) are dealt out as **runs**: the packed files in the
//! order their bytes lie in the pack (partition, offset) are cut into one contiguous stretch per
//! rank, each holding its share of the bytes within one file (a file belongs to the rank whose
//! stretch holds its middle byte). Each rank then reads its stretch from the PFS in large
//! sequential reads, each byte of the pack once for the job, whatever the pack's partition
//! count — one partition, or fewer than the ranks, balance as well as a pack cut per node; a
//! pack of P × N equal partitions gives each rank P of them. Files served from the source
//! (changed since packing) are then dealt as files onto the least loaded rank; files the pack
//! marks `--replicate` are held by every rank, read by the rank whose stretch they lie in.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use granary_shm::layout::pack::LOC_REPLICATE;
use granary_shm::{state, Table};

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
            if !e.stat.is_file() || e.stat.size == 0 || state::is_void(state::state_of(t.state(i)))
            {
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
        deal_runs(&mut packed, ranks, &mut primary);
        dealt.sort_unstable();
        let mut held = vec![0u64; ranks as usize];
        for &(_, _, i, size, all) in &packed {
            if !all {
                held[primary[i as usize] as usize] += size;
            }
        }
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

/// The packed files (sorted here into the pack's order) cut into `ranks` contiguous runs of
/// equal bytes: each file's rank into `primary`. A file held everywhere adds nothing to a run
/// and goes to the run it lies in.
fn deal_runs(packed: &mut [(u32, u64, u32, u64, bool)], ranks: u32, primary: &mut [u16]) {
    packed.sort_unstable();
    let total: u128 = packed.iter().filter(|f| !f.4).map(|f| f.3 as u128).sum();
    let mut before = 0u128;
    for &(_, _, i, size, all) in packed.iter() {
        let middle = if all {
            before
        } else {
            before + size as u128 / 2
        };
        let r = (middle * ranks as u128)
            .checked_div(total)
            .unwrap_or(0)
            .min(ranks as u128 - 1);
        primary[i as usize] = r as u16;
        if !all {
            before += size as u128;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_shm::layout::pack::LOC_PACKED;
    use granary_shm::{build_catalog, Catalog, CatalogEntry, Locator, Mapping, PackSpec};
    use granary_shm::{StatRec, TableSpec};
    use proptest::prelude::*;
    use std::os::fd::AsRawFd;

    fn table(sizes: &[(String, u64)]) -> (Mapping, Table, tempfile::NamedTempFile) {
        packed_table(sizes, &|_| None)
    }

    /// A table serving a pack: `loc(name)` is a file's (partition, offset, flags) in it, `None`
    /// for a file served from the source.
    fn packed_table(
        sizes: &[(String, u64)],
        loc: &dyn Fn(&[u8]) -> Option<(u32, u64, u8)>,
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

    /// Each rank's packed files, in the pack's order, are one contiguous stretch.
    fn contiguous(o: &Ownership, t: &Table) -> bool {
        let mut order: Vec<(u32, u64, u32)> = (0..t.entry_count())
            .filter_map(|i| t.locator(i).map(|l| (l.partition, l.offset, i)))
            .collect();
        order.sort_unstable();
        let ranks: Vec<u32> = order.iter().filter_map(|&(_, _, i)| o.primary(i)).collect();
        ranks.windows(2).all(|w| w[0] <= w[1])
    }

    #[test]
    fn a_pack_is_dealt_in_contiguous_runs_of_equal_bytes() {
        let files = fanstore();
        let total: u64 = files.iter().map(|f| f.1).sum();
        let largest = files.iter().map(|f| f.1).max().unwrap();
        // The pack's order is not the names' (the packer's), in one partition or three.
        for parts in [1u32, 3] {
            let pos = |name: &[u8]| {
                let k = files.iter().position(|f| f.0.as_bytes() == name)? as u64;
                let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                Some(((h % parts as u64) as u32, h << 12, 0))
            };
            let (_m, t, _f) = packed_table(&files, &pos);
            for ranks in [1, 2, 3, 5, 8] {
                let o = Ownership::assign(&t, ranks, 1, |_| false);
                assert!(contiguous(&o, &t), "{parts} partitions, {ranks} ranks");
                for r in 0..ranks {
                    let h = held(&o, &t, r);
                    assert!(
                        h.abs_diff(total / ranks as u64) <= largest,
                        "{parts} partitions, {ranks} ranks, rank {r}: {h}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_pack_cut_for_the_job_gives_each_rank_whole_partitions() {
        // 6 partitions of 8 equal files: with 3 ranks each streams 2 partitions, alone.
        let files: Vec<(String, u64)> = (0..48).map(|i| (format!("f{i:02}"), 1 << 20)).collect();
        let pos = |name: &[u8]| {
            let k: u64 = std::str::from_utf8(name.get(1..)?).ok()?.parse().ok()?;
            Some(((k / 8) as u32, (k % 8) << 20, 0))
        };
        let (_m, t, _f) = packed_table(&files, &pos);
        let o = Ownership::assign(&t, 3, 1, |_| false);
        for i in 1..t.entry_count() {
            let l = t.locator(i).unwrap();
            assert_eq!(o.primary(i), Some(l.partition / 2), "entry {i}");
        }
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
        assert_eq!(
            o.primary(val),
            Some(2),
            "read by the rank whose stretch it ends"
        );
        // Served from the source: dealt as a file, onto a least loaded rank.
        let changed = t.lookup(b"changed").unwrap();
        assert!(t.locator(changed).is_none() && o.owners(changed).len() == 1);
        let total: u64 = files.iter().map(|f| f.1).sum::<u64>() - (3 << 20);
        for r in 0..3 {
            let h = held(&o, &t, r) - (3 << 20);
            assert!(h.abs_diff(total / 3) <= 8 << 20, "rank {r}: {h}");
        }
        assert!(contiguous(&o, &t));
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
