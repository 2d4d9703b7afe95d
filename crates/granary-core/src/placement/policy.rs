//! Placement policies: where a copy goes, what to fetch before it is asked for, and what may
//! be evicted to make room.
//!
//! `FillHighestFirst` (default): the fastest tier with room, spill to the next, never evict —
//! with every file read once per epoch in random order, evicting only adds source traffic.
//! `KnownOrder`: the program's access order is known (a file list, like NoPFS's shuffle seed),
//! so the agent keeps a window of upcoming files placed and may evict files the program has
//! already read in the current epoch, furthest-next-use first.

use std::collections::HashMap;
use std::path::Path;

use crate::sync::Mutex;
use crate::tiers::{Reservation, Tiers};

/// Chooses where a file goes: the tiers to try, in order.
pub trait Policy: Send + Sync {
    fn tiers_for(&self, size: u64, tiers: &Tiers) -> Vec<usize>;

    /// The tier for a chunk file when no tier has room for the whole file: the one with most
    /// free space (chunks are charged one by one as they are fetched).
    fn chunk_tier(&self, tiers: &Tiers) -> Option<usize> {
        most_free(tiers)
    }

    /// The program opened entry `idx` (an OPEN_UNPLACED or another notification).
    fn observe(&self, _idx: u32) {}

    /// Entries to place before they are requested, in order; `placed(idx)` says whether an
    /// entry is already placed (or on its way).
    fn prefetch(&self, _placed: &dyn Fn(u32) -> bool) -> Vec<u32> {
        Vec::new()
    }

    /// Placed entries that may be evicted to free `need` bytes, best victim first; empty if
    /// the policy never evicts or has nothing it may evict.
    fn victims(&self, _need: u64, _placed: &dyn Fn(u32) -> bool) -> Vec<u32> {
        Vec::new()
    }
}

/// Free bytes of each tier (capacity − committed − reserved).
pub fn free_space(tiers: &Tiers) -> Vec<u64> {
    tiers
        .usage()
        .iter()
        .map(|u| u.capacity.saturating_sub(u.used + u.reserved))
        .collect()
}

/// The tier with the most free space (the fastest among equals).
pub fn most_free(tiers: &Tiers) -> Option<usize> {
    let free = free_space(tiers);
    (0..tiers.placeable()).rev().max_by_key(|&t| free[t])
}

/// Reserves room for `size` on the first of the policy's tiers that has it.
pub fn reserve_first<'a>(
    policy: &dyn Policy,
    tiers: &'a Tiers,
    size: u64,
) -> Option<Reservation<'a>> {
    policy
        .tiers_for(size, tiers)
        .into_iter()
        .find_map(|t| tiers.reserve(t, size))
}

/// The fastest tier with room, then the next: tiers are configured fastest first (staging tiers
/// excluded: `Tiers::placeable`).
#[derive(Debug, Default, Clone, Copy)]
pub struct FillHighestFirst;

impl Policy for FillHighestFirst {
    fn tiers_for(&self, _size: u64, tiers: &Tiers) -> Vec<usize> {
        (0..tiers.placeable()).collect()
    }
}

/// A known access order, repeated every epoch.
#[derive(Debug)]
pub struct KnownOrder {
    /// (entry, size) in the order the program reads them.
    order: Vec<(u32, u64)>,
    pos_of: HashMap<u32, usize>,
    /// Bytes of upcoming files to keep placed ahead of the program.
    window: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OrderState {
    /// Epochs begun (0 before the first open).
    pub epoch: u64,
    /// The furthest position the program reached in this epoch.
    pub pos: Option<usize>,
}

#[derive(Debug, Default)]
struct Inner {
    st: OrderState,
    /// Positions opened in this epoch. Only these may be evicted: "before the furthest" is not
    /// evidence enough, DataLoader workers open a few files out of order.
    read: Vec<bool>,
}

impl KnownOrder {
    /// From `(entry, size)` pairs in access order (an entry listed twice keeps its first place).
    pub fn new(order: Vec<(u32, u64)>, window: u64) -> KnownOrder {
        let mut pos_of = HashMap::new();
        let mut uniq = Vec::with_capacity(order.len());
        for (e, s) in order {
            if let std::collections::hash_map::Entry::Vacant(v) = pos_of.entry(e) {
                v.insert(uniq.len());
                uniq.push((e, s));
            }
        }
        let n = uniq.len();
        KnownOrder {
            order: uniq,
            pos_of,
            window,
            inner: Mutex::new(Inner {
                st: OrderState::default(),
                read: vec![false; n],
            }),
        }
    }

    /// Parses a listing: one path per line, relative to the source or absolute under
    /// `source_root`; blank lines and `#` comments are skipped. `lookup(rel)` gives a file's
    /// (entry, size). Lines naming nothing in the catalog are returned as the second value.
    pub fn parse_listing(
        text: &str,
        source_root: &Path,
        lookup: impl Fn(&[u8]) -> Option<(u32, u64)>,
    ) -> (Vec<(u32, u64)>, Vec<String>) {
        use std::os::unix::ffi::OsStrExt;
        let mut out = Vec::new();
        let mut unknown = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let p = Path::new(line);
            let rel = if p.is_absolute() {
                match p.strip_prefix(source_root) {
                    Ok(r) => r,
                    Err(_) => {
                        unknown.push(line.to_string());
                        continue;
                    }
                }
            } else {
                p
            };
            let rel = rel.strip_prefix("./").unwrap_or(rel);
            match lookup(rel.as_os_str().as_bytes()) {
                Some(x) => out.push(x),
                None => unknown.push(line.to_string()),
            }
        }
        (out, unknown)
    }

    pub fn state(&self) -> OrderState {
        self.lock().st
    }

    /// How many files of the order, from position `start` on (wrapping), the window holds:
    /// bytes of the order, placed or not, so that once they are all placed there is nothing to
    /// do. The very next file counts even when it alone is larger than the window.
    fn window_len(&self, start: usize) -> usize {
        let n = self.order.len();
        let mut bytes = 0u64;
        for i in 0..n {
            let s = self.order[(start + i) % n].1;
            if bytes.saturating_add(s) > self.window && i > 0 {
                return i;
            }
            bytes = bytes.saturating_add(s);
        }
        n
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Policy for KnownOrder {
    fn tiers_for(&self, _size: u64, tiers: &Tiers) -> Vec<usize> {
        (0..tiers.placeable()).collect()
    }

    /// Moves the position forward; a file far behind it (at least half the order back) means
    /// the program wrapped around: a new epoch begins, and nothing counts as read any more.
    fn observe(&self, idx: u32) {
        let Some(&p) = self.pos_of.get(&idx) else {
            return;
        };
        let mut g = self.lock();
        match g.st.pos {
            None => {
                g.st.epoch = g.st.epoch.max(1);
                g.st.pos = Some(p);
            }
            Some(cur) if p > cur => g.st.pos = Some(p),
            Some(cur) if 2 * (cur - p) >= self.order.len() => {
                g.st.epoch += 1;
                g.st.pos = Some(p);
                g.read.iter_mut().for_each(|r| *r = false);
            }
            Some(_) => {}
        }
        g.read[p] = true;
    }

    /// The files after the position, wrapping into the next epoch, up to `window` bytes.
    fn prefetch(&self, placed: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let n = self.order.len();
        let start = self.state().pos.map_or(0, |p| p + 1);
        (0..self.window_len(start))
            .map(|i| self.order[(start + i) % n].0)
            .filter(|&e| !placed(e))
            .collect()
    }

    /// Placed files already read this epoch, needed again furthest in the future first (the
    /// latest read: its next use is next epoch at the same place), until `need` bytes.
    fn victims(&self, need: u64, placed: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let g = self.lock();
        let Some(upto) = g.st.pos else {
            return Vec::new();
        };
        // A file read early in this epoch may already be in the window again (it wraps into
        // the next epoch): evicting it would throw away a copy wanted before the one it makes
        // room for.
        let n = self.order.len();
        let start = upto + 1;
        let in_window = self.window_len(start);
        let mut freed = 0u64;
        let mut out = Vec::new();
        for (p, &(e, s)) in self.order[..=upto].iter().enumerate().rev() {
            if freed >= need {
                break;
            }
            if (p + n - start % n) % n < in_window {
                continue;
            }
            if g.read[p] && placed(e) {
                out.push(e);
                freed += s;
            }
        }
        out
    }
}
