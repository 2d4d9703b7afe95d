//! The record-offset index of an LMDB data file (LMDBIO's lesson, without code changes): the
//! pages a cursor reads, in the order it reads them — the B-tree's branch pages, then each leaf
//! page followed by the overflow pages of its large values, in key order, every database of
//! the environment in turn. The follower reads ahead in that order (`page_order`), so a cursor over
//! an LMDB written in random key order streams like one written in order.
//!
//! Built by reading the tree's branch pages and — when the tree holds values in overflow pages
//! or named databases, and its leaves are a small part of the file — its leaf pages: for an
//! environment of large values (images) that is well under 1 % of the file, read once, pages a
//! reader's first descents read too. An environment of small values is its leaves: they are not
//! read, the lowest branch pages give their order. Only LMDB 0.9's format (data version 1) is
//! understood; anything else, a page that does not parse, or a tree larger than the budget
//! gives no index. A wrong index (a writer changed the tree since) costs read-ahead in the wrong
//! place, never a wrong byte: the index only steers `readahead(2)`.

use std::collections::HashSet;

const MAGIC: u32 = 0xBEEF_C0DE;
const DATA_VERSION: u32 = 1;
/// `offsetof(MDB_page, mp_ptrs)` on a 64-bit build.
const PAGE_HDR: usize = 16;
const NODE_HDR: usize = 8;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_LEAF2: u16 = 0x20;
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
/// `MDB_db` (48 bytes): `md_pad u32, md_flags u16, md_depth u16, md_branch_pages,
/// md_leaf_pages, md_overflow_pages, md_entries, md_root` (u64 each).
const DB_SIZE: usize = 48;
const MDB_DUPSORT: u16 = 0x04;
const P_INVALID: u64 = u64::MAX;

/// Why no index was built (logged; the follower then follows the file's own order).
#[derive(Debug, PartialEq, Eq)]
pub enum NoIndex {
    NotLmdb,
    Unreadable,
    Malformed(&'static str),
    OverBudget,
}

/// The order of an environment's pages, as `(file page, pages)` extents, and the page size.
#[derive(Debug, PartialEq, Eq)]
pub struct LmdbIndex {
    pub page_size: u64,
    pub extents: Vec<(u64, u64)>,
    /// Tree pages read to build it.
    pub pages_read: u64,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// A database's root and what the tree holds.
#[derive(Clone, Copy, Debug)]
struct Db {
    flags: u16,
    depth: u16,
    leaf_pages: u64,
    overflow_pages: u64,
    root: u64,
}

fn db_at(b: &[u8], o: usize) -> Option<Db> {
    Some(Db {
        flags: u16_at(b, o + 4)?,
        depth: u16_at(b, o + 6)?,
        leaf_pages: u64_at(b, o + 16)?,
        overflow_pages: u64_at(b, o + 24)?,
        root: u64_at(b, o + 40)?,
    })
}

/// Builds the index of an LMDB data file of `len` bytes; `read(off, buf)` reads the file
/// (`false`: it could not). At most `budget` bytes of tree pages are read.
pub fn build(
    len: u64,
    budget: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> bool,
) -> Result<LmdbIndex, NoIndex> {
    // Page 0's meta gives the page size; the current meta is the one with the larger txnid.
    let mut head = [0u8; 160];
    if len < 2 * 4096 || !read(0, &mut head) {
        return Err(NoIndex::Unreadable);
    }
    let meta = PAGE_HDR;
    if u32_at(&head, meta) != Some(MAGIC) {
        return Err(NoIndex::NotLmdb);
    }
    if u32_at(&head, meta + 4) != Some(DATA_VERSION) {
        return Err(NoIndex::Malformed("not LMDB 0.9's data format"));
    }
    let psize = u32_at(&head, meta + 24).unwrap_or(0) as u64;
    if !(512..=65536).contains(&psize) || !psize.is_power_of_two() || len < 2 * psize {
        return Err(NoIndex::Malformed("page size"));
    }
    let mut other = [0u8; 160];
    let txn = |b: &[u8]| u64_at(b, meta + 128).unwrap_or(0);
    let cur = if read(psize, &mut other)
        && u32_at(&other, meta) == Some(MAGIC)
        && txn(&other) > txn(&head)
    {
        other
    } else {
        head
    };
    let main = db_at(&cur, meta + 24 + DB_SIZE).ok_or(NoIndex::Malformed("meta"))?;
    let mut w = Walk {
        psize,
        pages: len / psize,
        budget: budget / psize,
        page: vec![0u8; psize as usize],
        visited: HashSet::new(),
        out: Vec::new(),
        read_pages: 0,
    };
    w.tree(&main, 0, &mut read)?;
    Ok(LmdbIndex {
        page_size: psize,
        extents: w.out,
        pages_read: w.read_pages,
    })
}

struct Walk {
    psize: u64,
    pages: u64,
    budget: u64,
    page: Vec<u8>,
    visited: HashSet<u64>,
    out: Vec<(u64, u64)>,
    read_pages: u64,
}

impl Walk {
    fn load(
        &mut self,
        pgno: u64,
        read: &mut impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<Vec<u8>, NoIndex> {
        if pgno >= self.pages || !self.visited.insert(pgno) {
            return Err(NoIndex::Malformed("page number"));
        }
        if self.read_pages >= self.budget {
            return Err(NoIndex::OverBudget);
        }
        self.read_pages += 1;
        if !read(pgno * self.psize, &mut self.page) {
            return Err(NoIndex::Unreadable);
        }
        if u64_at(&self.page, 0) != Some(pgno) {
            return Err(NoIndex::Malformed("page header"));
        }
        Ok(self.page.clone())
    }

    /// Appends the pages of the tree of `db` in cursor order. Its leaves are read when they
    /// may name more pages (overflow values, named or duplicate databases) and fit the budget.
    /// `nest`: 0 for the main database (which may name the others), 1 for a named one, 2 for
    /// a key's duplicates.
    fn tree(
        &mut self,
        db: &Db,
        nest: u32,
        read: &mut impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<(), NoIndex> {
        if db.root == P_INVALID {
            return Ok(());
        }
        if nest > 2 {
            return Err(NoIndex::Malformed("databases nested too deep"));
        }
        let look_in_leaves = (db.overflow_pages > 0 || db.flags & MDB_DUPSORT != 0 || nest == 0)
            && db.leaf_pages.saturating_mul(2) <= self.budget.saturating_sub(self.read_pages);
        // (page, its level: the root is 1, leaves are at `depth`).
        let mut stack = vec![(db.root, 1u16)];
        while let Some((pgno, level)) = stack.pop() {
            if level >= db.depth.max(1) && !look_in_leaves {
                // A leaf, not read: its place in the order is what its parent said.
                self.out.push((pgno, 1));
                continue;
            }
            let p = self.load(pgno, read)?;
            self.out.push((pgno, 1));
            let flags = u16_at(&p, 10).ok_or(NoIndex::Malformed("page"))?;
            let lower = u16_at(&p, 12).unwrap_or(0) as usize;
            if lower < PAGE_HDR || lower > p.len() {
                return Err(NoIndex::Malformed("page bounds"));
            }
            let keys = (lower - PAGE_HDR) / 2;
            if flags & P_BRANCH != 0 {
                let mut children = Vec::with_capacity(keys);
                for i in 0..keys {
                    let n = node(&p, i)?;
                    let child = u16_at(&p, n).unwrap_or(0) as u64
                        | (u16_at(&p, n + 2).unwrap_or(0) as u64) << 16
                        | (u16_at(&p, n + 4).unwrap_or(0) as u64) << 32;
                    children.push((child, level + 1));
                }
                // Depth first, in key order.
                stack.extend(children.into_iter().rev());
            } else if flags & P_LEAF != 0 && flags & P_LEAF2 == 0 {
                for i in 0..keys {
                    let n = node(&p, i)?;
                    let dsize = u16_at(&p, n).unwrap_or(0) as u64
                        | (u16_at(&p, n + 2).unwrap_or(0) as u64) << 16;
                    let nflags = u16_at(&p, n + 4).unwrap_or(0);
                    let ksize = u16_at(&p, n + 6).unwrap_or(0) as usize;
                    let data = n + NODE_HDR + ksize;
                    if nflags & F_BIGDATA != 0 {
                        let first = u64_at(&p, data).ok_or(NoIndex::Malformed("node"))?;
                        // `OVPAGES(size, psize)`: the value and one page header.
                        let n = (PAGE_HDR as u64 - 1 + dsize) / self.psize + 1;
                        self.out.push((first, n));
                    } else if nflags & F_SUBDATA != 0 {
                        let sub = db_at(&p, data).ok_or(NoIndex::Malformed("node"))?;
                        self.tree(&sub, nest + 1, read)?;
                    }
                }
            } else if flags & P_LEAF2 == 0 {
                return Err(NoIndex::Malformed("not a tree page"));
            }
        }
        Ok(())
    }
}

/// The offset of node `i` of a page (`mp_ptrs[i]`), checked to lie within the page.
fn node(p: &[u8], i: usize) -> Result<usize, NoIndex> {
    let o = u16_at(p, PAGE_HDR + 2 * i).ok_or(NoIndex::Malformed("node"))? as usize;
    if o < PAGE_HDR || o + NODE_HDR > p.len() {
        return Err(NoIndex::Malformed("node offset"));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PS: usize = 4096;

    fn put16(f: &mut [u8], o: usize, v: u16) {
        f[o..o + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put64(f: &mut [u8], o: usize, v: u64) {
        f[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A page header and its nodes (`(node header fields, key, data)`), packed from the end.
    fn page(f: &mut [u8], pgno: usize, flags: u16, nodes: &[([u16; 4], &[u8], &[u8])]) {
        let p = pgno * PS;
        put64(f, p, pgno as u64);
        put16(f, p + 10, flags);
        put16(f, p + 12, (PAGE_HDR + 2 * nodes.len()) as u16);
        let mut upper = PS;
        for (i, (h, key, data)) in nodes.iter().enumerate() {
            upper -= (NODE_HDR + key.len() + data.len() + 1) & !1;
            put16(f, p + PAGE_HDR + 2 * i, upper as u16);
            for (j, v) in h.iter().enumerate() {
                put16(f, p + upper + 2 * j, *v);
            }
            let k = p + upper + NODE_HDR;
            f[k..k + key.len()].copy_from_slice(key);
            f[k + key.len()..k + key.len() + data.len()].copy_from_slice(data);
        }
        put16(f, p + 14, upper as u16);
    }

    /// An environment as LMDB 0.9 lays it out: two metas (the second the current one), a
    /// branch page (2) over two leaves (5, then 3 in key order), values in overflow pages
    /// written in another order than the keys' (7.., 10..), one value inline.
    fn env() -> Vec<u8> {
        let mut f = vec![0u8; 16 * PS];
        for (m, txn) in [(0usize, 1u64), (1, 2)] {
            let o = m * PS + PAGE_HDR;
            put64(&mut f, m * PS, m as u64);
            put16(&mut f, m * PS + 10, 0x08);
            f[o..o + 4].copy_from_slice(&MAGIC.to_le_bytes());
            f[o + 4..o + 8].copy_from_slice(&DATA_VERSION.to_le_bytes());
            f[o + 24..o + 28].copy_from_slice(&(PS as u32).to_le_bytes());
            let db = o + 24 + DB_SIZE;
            put16(&mut f, db + 6, 2); // depth
            put64(&mut f, db + 8, 1); // branch pages
            put64(&mut f, db + 16, 2); // leaf pages
            put64(&mut f, db + 24, 5); // overflow pages
            put64(&mut f, db + 32, 3); // entries
            put64(&mut f, db + 40, if m == 1 { 2 } else { P_INVALID });
            put64(&mut f, o + 128, txn);
        }
        page(
            &mut f,
            2,
            P_BRANCH,
            &[([5, 0, 0, 0], b"", b""), ([3, 0, 0, 1], b"m", b"")],
        );
        // 9,000 bytes: 3 pages with the overflow page's header.
        let big = |size: u32| -> [u16; 4] { [size as u16, (size >> 16) as u16, F_BIGDATA, 1] };
        page(&mut f, 5, P_LEAF, &[(big(9000), b"a", &7u64.to_le_bytes())]);
        page(
            &mut f,
            3,
            P_LEAF,
            &[
                (big(5000), b"m", &10u64.to_le_bytes()),
                ([3, 0, 0, 1], b"z", b"abc"),
            ],
        );
        f
    }

    fn read_from(f: &[u8]) -> impl FnMut(u64, &mut [u8]) -> bool + '_ {
        |o, b| match f.get(o as usize..o as usize + b.len()) {
            Some(s) => {
                b.copy_from_slice(s);
                true
            }
            None => false,
        }
    }

    #[test]
    fn the_index_is_the_cursors_page_order() {
        let f = env();
        let ix = build(f.len() as u64, 1 << 20, read_from(&f)).expect("an index");
        assert_eq!(ix.page_size, PS as u64);
        // The branch page, then each leaf in key order followed by its values' pages.
        assert_eq!(ix.extents, vec![(2, 1), (5, 1), (7, 3), (3, 1), (10, 2)]);
        assert_eq!(ix.pages_read, 3);
    }

    #[test]
    fn leaves_of_inline_values_are_ordered_without_being_read() {
        let mut f = env();
        for m in 0..2 {
            put64(&mut f, m * PS + PAGE_HDR + 24 + DB_SIZE + 24, 0); // no overflow pages
        }
        // A main database naming no other: its leaves are read when they are few...
        let ix = build(f.len() as u64, 1 << 20, read_from(&f)).expect("an index");
        assert_eq!(ix.pages_read, 3);
        // ...and only the branch page when they are many (here: a budget of 3 pages).
        let ix = build(f.len() as u64, 3 * PS as u64, read_from(&f)).expect("an index");
        assert_eq!(ix.pages_read, 1);
        assert_eq!(ix.extents, vec![(2, 1), (5, 1), (3, 1)]);
    }

    #[test]
    fn not_an_lmdb_gives_no_index() {
        let file = vec![7u8; 64 << 10];
        assert_eq!(
            build(file.len() as u64, 1 << 20, read_from(&file)),
            Err(NoIndex::NotLmdb)
        );
    }

    #[test]
    fn a_cyclic_tree_or_a_page_past_the_end_gives_no_index() {
        let mut f = env();
        // The branch page's second child: the branch page itself.
        let second = 2 * PS + u16_at(&f, 2 * PS + PAGE_HDR + 2).unwrap() as usize;
        put16(&mut f, second, 2);
        let mut reads = 0;
        let r = build(f.len() as u64, 1 << 20, |o, b| {
            reads += 1;
            read_from(&f)(o, b)
        });
        assert_eq!(r, Err(NoIndex::Malformed("page number")));
        assert!(reads <= 5, "{reads} reads");
        put16(&mut f, second, 99); // past the end
        let r = build(f.len() as u64, 1 << 20, read_from(&f));
        assert_eq!(r, Err(NoIndex::Malformed("page number")));
    }

    proptest! {
        /// Whatever the bytes of the tree pages, building reads within its budget and ends
        /// with an index or a reason, never a panic.
        #[test]
        fn any_corruption_is_bounded(flips in proptest::collection::vec((0usize..16 * PS, any::<u8>()), 1..64),
                                      budget_pages in 1u64..8) {
            let mut f = env();
            for (o, v) in flips {
                f[o] = v;
            }
            let mut reads = 0u64;
            let r = build(f.len() as u64, budget_pages * PS as u64, |o, b| {
                reads += 1;
                read_from(&f)(o, b)
            });
            // The two metas, then at most the budget's pages.
            prop_assert!(reads <= 2 + budget_pages, "{} reads, {:?}", reads, r);
        }
    }
}
