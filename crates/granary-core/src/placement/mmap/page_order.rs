//! The order in which a reader of a file reads its pages, when it is not the file's own order.
//!
//! A cursor over an LMDB written in random key order (keys `"1"`, `"10"`, `"100"` … inserted
//! as integers count up; hashes; a shuffled conversion) reads its leaf and overflow pages in key
//! order, which jumps around the file: the follower sees scattered reads and reads nothing
//! ahead. A `PageOrder` is a permutation of the file's pages — the record order first
//! (`lmdb_index`), then every page it does not name in file order — so that the follower can
//! follow the reader in *its* order: positions, windows and the `seen` bits of a reader with a
//! layout are in record order ("virtual" offsets), and only the page tables, the read-ahead
//! and the counters are in file offsets.

const PAGE: u64 = 4096;

/// A permutation of the pages of a file of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct PageOrder {
    /// `(virtual page, file page, pages)`, by virtual page, contiguous from 0.
    by_virtual: Vec<(u64, u64, u64)>,
    /// The same extents by file page, as `(file page, virtual page, pages)`.
    by_file: Vec<(u64, u64, u64)>,
    len: u64,
}

/// A layout is followed when its runs (pages in order in both the file and the reading order)
/// are shorter than this on average: a file written in about the order it is read (an LMDB
/// written in key order: a jump at each leaf page, every ~100 records) is followed in its own
/// order, as before — the follower passes over a few pages out of place.
const RUN_PAGES: u64 = 256;

impl PageOrder {
    /// The layout that reads `extents` (`(file page, pages)`, in reading order) first, then the
    /// pages they do not name in file order. Pages named twice, or past the end, are taken the
    /// first time, within the file. `None` when it is (nearly) the file's own order
    /// (`RUN_PAGES`).
    pub fn new(extents: &[(u64, u64)], len: u64) -> Option<PageOrder> {
        let pages = len.div_ceil(PAGE);
        let mut taken = vec![false; pages as usize];
        let mut by_virtual: Vec<(u64, u64, u64)> = Vec::new();
        let mut v = 0u64;
        let push = |by_virtual: &mut Vec<(u64, u64, u64)>, f: u64, n: u64, v: &mut u64| {
            match by_virtual.last_mut() {
                Some(last) if last.1 + last.2 == f => last.2 += n,
                _ => by_virtual.push((*v, f, n)),
            }
            *v += n;
        };
        // The named pages, then the whole file: what was not named yet, in file order.
        for &(f, n) in extents.iter().chain(std::iter::once(&(0, pages))) {
            let end = f.saturating_add(n).min(pages);
            let mut p = f.min(end);
            while p < end {
                if taken[p as usize] {
                    p += 1;
                    continue;
                }
                let s = p;
                while p < end && !taken[p as usize] {
                    taken[p as usize] = true;
                    p += 1;
                }
                push(&mut by_virtual, s, p - s, &mut v);
            }
        }
        if pages / (by_virtual.len() as u64).max(1) >= RUN_PAGES {
            return None;
        }
        let mut by_file: Vec<_> = by_virtual.iter().map(|&(v, f, n)| (f, v, n)).collect();
        by_file.sort_unstable();
        Some(PageOrder {
            by_virtual,
            by_file,
            len,
        })
    }

    /// The extents, in reading order.
    pub fn extents(&self) -> usize {
        self.by_virtual.len()
    }

    /// The file's size (the virtual space is its pages, rounded up).
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// The file offset of virtual offset `v` (page-wise: the offset within a page is kept).
    pub fn to_file(&self, v: u64) -> u64 {
        translate(&self.by_virtual, v)
    }

    /// The virtual offset of file offset `f`.
    pub fn to_virtual(&self, f: u64) -> u64 {
        translate(&self.by_file, f)
    }

    /// The virtual offset where the run holding virtual offset `v` ends (pages in order in
    /// both the file and the reading order: one request can read it).
    pub fn run_end(&self, v: u64) -> u64 {
        let i = self.by_virtual.partition_point(|e| e.0 <= v / PAGE);
        match i.checked_sub(1).map(|i| self.by_virtual[i]) {
            Some((vs, _, n)) => (vs + n) * PAGE,
            None => v,
        }
    }

    /// The file ranges `[a, b)` of virtual range `[va, vb)`, in virtual order (page-aligned
    /// ends are kept as given within each extent).
    pub fn file_runs(&self, va: u64, vb: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if va >= vb {
            return out;
        }
        let i = self
            .by_virtual
            .partition_point(|e| e.0 <= va / PAGE)
            .saturating_sub(1);
        for &(vs, fs, n) in &self.by_virtual[i..] {
            let (s, e) = (vs * PAGE, (vs + n) * PAGE);
            if s >= vb {
                break;
            }
            let (x, y) = (va.max(s), vb.min(e));
            if x < y {
                out.push((fs * PAGE + (x - s), fs * PAGE + (y - s)));
            }
        }
        out
    }
}

/// Offset `x` through `(from page, to page, pages)` extents sorted by `from` (the offset within a
/// page is kept; an offset no extent holds is its own image).
fn translate(extents: &[(u64, u64, u64)], x: u64) -> u64 {
    let p = x / PAGE;
    let i = extents.partition_point(|e| e.0 <= p);
    match i.checked_sub(1).map(|i| extents[i]) {
        Some((from, to, n)) if p < from + n => (to + p - from) * PAGE + x % PAGE,
        _ => x,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shuffled(pages: u64) -> Vec<(u64, u64)> {
        // Records of 3 pages, read in an order far from the file's.
        let mut v: Vec<(u64, u64)> = (0..pages / 3).map(|r| (r * 3, 3)).collect();
        v.reverse();
        v
    }

    #[test]
    fn the_files_own_order_needs_no_layout() {
        let pages = 4096;
        let inorder: Vec<(u64, u64)> = (0..pages).map(|p| (p, 1)).collect();
        assert_eq!(PageOrder::new(&inorder, pages * PAGE), None);
        // An LMDB written in key order: its few branch pages come first.
        let mut btree = vec![(4000, 2)];
        btree.extend((0..4000).map(|p| (p, 1)));
        assert_eq!(PageOrder::new(&btree, pages * PAGE), None);
    }

    #[test]
    fn every_page_maps_there_and_back_once() {
        let pages = 3000;
        let len = pages * PAGE - 100;
        let mut ext = shuffled(pages);
        ext.push((5, 10)); // named twice
        ext.push((pages + 7, 4)); // past the end
        let l = PageOrder::new(&ext, len).expect("a layout");
        let mut seen = vec![false; pages as usize];
        for vp in 0..pages {
            let f = l.to_file(vp * PAGE + 17);
            assert_eq!(f % PAGE, 17);
            assert!(!seen[(f / PAGE) as usize], "file page {} twice", f / PAGE);
            seen[(f / PAGE) as usize] = true;
            assert_eq!(l.to_virtual(f), vp * PAGE + 17);
        }
        assert!(seen.iter().all(|&s| s));
        // The reading order first: the last record of the file is read first.
        assert_eq!(l.to_file(0), (pages / 3 - 1) * 3 * PAGE);
    }

    #[test]
    fn file_runs_cover_a_virtual_range_in_its_order() {
        let pages = 3000;
        let l = PageOrder::new(&shuffled(pages), pages * PAGE).expect("a layout");
        let runs = l.file_runs(PAGE + 10, 7 * PAGE);
        let total: u64 = runs.iter().map(|(a, b)| b - a).sum();
        assert_eq!(total, 6 * PAGE - 10);
        assert_eq!(runs[0].0, l.to_file(PAGE + 10));
        for w in runs.windows(2) {
            assert!(w[1].0 < w[0].0, "records read last-first: {runs:?}");
        }
        assert!(l.file_runs(5 * PAGE, 5 * PAGE).is_empty());
        // Records of 3 pages: the run holding virtual page 4 ends at page 6.
        assert_eq!(l.run_end(4 * PAGE + 5), 6 * PAGE);
        assert_eq!(l.run_end(6 * PAGE), 9 * PAGE);
    }
}
