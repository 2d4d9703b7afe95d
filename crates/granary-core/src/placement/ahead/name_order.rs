//! Which runs of a directory's files programs open in name order, and what to fetch ahead of
//! them (`NameOrder`, the state `SourceCtx::ahead` holds; what the agent does with it is
//! `ahead`'s).

use std::collections::HashMap;

use granary_shm::{lifecycle, State, Table};

use crate::sync::{lock, Arc, Mutex, OnceLock};

/// Opens this many places behind or ahead of a run's furthest file keep the run.
pub const SPAN: usize = 16;
/// Files a run must span before it counts as sequential.
pub const MIN_OPENS: usize = 6;
/// Runs followed at once.
pub const RUNS: usize = 4;
/// Bytes of files fetched ahead of a run's furthest file.
pub const WINDOW: u64 = 8 << 20;

/// Name-order read-ahead of one table (`SourceCtx::ahead`).
#[derive(Default)]
pub struct NameOrder {
    inner: Mutex<Inner>,
    /// Whether any file of the table is one the read-ahead fetches (`may_fetch`).
    fetches: OnceLock<bool>,
}

#[derive(Default)]
struct Inner {
    /// Directory entry → its children (entry indices), sorted by name.
    sorted: HashMap<u32, Arc<Sorted>>,
    runs: Vec<Run>,
    /// Orders the runs by last use.
    clock: u64,
}

struct Sorted {
    /// Children in name order (empty without `any_fetched`: never needed).
    order: Vec<u32>,
    /// `rank[child - first_child]`: the child's place in `order` (empty likewise).
    rank: Vec<u32>,
    first_child: u32,
    /// Some child is a file the read-ahead fetches (`fetched_ahead`): without one, an open
    /// there has nothing to follow or claim, and returns at once — the scan after each open
    /// (every later child of the directory) took the ring consumer a core in a directory of a
    /// thousand small files, and sorting them ~1 µs per file opened.
    any_fetched: bool,
}

struct Run {
    dir: u32,
    /// The first and the furthest rank opened, and the opens that fell in the run.
    start: usize,
    furthest: usize,
    opens: usize,
    used: u64,
    /// The window after `furthest` held a file not yet placed when last looked at.
    fetching: bool,
}

impl Run {
    /// Opened in name order: a stretch of `MIN_OPENS` files or more, three quarters opened.
    fn sequential(&self) -> bool {
        let spanned = self.furthest - self.start + 1;
        spanned >= MIN_OPENS && 4 * self.opens >= 3 * spanned
    }
}

/// What `on_open` decided: files to fetch ahead, claimed already.
pub struct Ahead {
    pub claimed: Vec<u32>,
    /// Some sequential run still has files to fetch: clients should report their opens.
    pub want_opens: bool,
}

impl NameOrder {
    /// `on_open` without the pool: follows the runs and claims the files to fetch ahead.
    /// `room(size)`: a tier can take `size` more bytes now.
    pub fn observe(&self, t: &Table, idx: u32, room: &dyn Fn(u64) -> bool) -> Ahead {
        let mut none = Ahead {
            claimed: Vec::new(),
            want_opens: false,
        };
        let mut g = lock(&self.inner);
        let Some(dir) = t.parent_of(idx) else {
            return none;
        };
        let Some(sorted) = g.sorted_children(t, dir) else {
            return none;
        };
        if !sorted.any_fetched {
            // Nothing in this directory is ever read ahead: no run to follow here (and none of
            // the runs that do fetch is displaced by it); clients keep reporting opens while one
            // of those still has files on their way.
            none.want_opens = g.runs.iter().any(|r| r.sequential() && r.fetching);
            return none;
        }
        let Some(rank) = sorted.rank_of(idx) else {
            return none;
        };
        g.clock += 1;
        let now = g.clock;
        let run =
            match g.runs.iter().position(|r| {
                r.dir == dir && rank + SPAN >= r.furthest && rank <= r.furthest + SPAN
            }) {
                Some(i) => {
                    let r = &mut g.runs[i];
                    r.start = r.start.min(rank);
                    r.furthest = r.furthest.max(rank);
                    r.opens += 1;
                    r.used = now;
                    i
                }
                None => {
                    let r = Run {
                        dir,
                        start: rank,
                        furthest: rank,
                        opens: 1,
                        used: now,
                        fetching: false,
                    };
                    if g.runs.len() < RUNS {
                        g.runs.push(r);
                        g.runs.len() - 1
                    } else {
                        let lru = (0..g.runs.len())
                            .min_by_key(|&i| g.runs[i].used)
                            .unwrap_or(0);
                        g.runs[lru] = r;
                        lru
                    }
                }
            };
        let r = &mut g.runs[run];
        r.fetching = false;
        if r.sequential() && sorted.any_fetched {
            let (claimed, fetching) = claim_after(t, &sorted, r.furthest, room);
            none.claimed = claimed;
            r.fetching = fetching;
        }
        // Clients report their opens while a sequential run has files on their way after it.
        none.want_opens = g.runs.iter().any(|r| r.sequential() && r.fetching);
        none
    }
}

impl Inner {
    fn sorted_children(&mut self, t: &Table, dir: u32) -> Option<Arc<Sorted>> {
        if let Some(s) = self.sorted.get(&dir) {
            return Some(s.clone());
        }
        let d = t.entry(dir)?;
        if !d.stat.is_dir() {
            return None;
        }
        let first = d.first_child;
        let children = first..first.checked_add(d.child_count)?;
        // Looked at first, one entry each: a directory of small files (nothing fetched ahead)
        // is never sorted — sorting a thousand names decoded two entries per comparison and
        // took the ring consumer ~1 µs of CPU per file opened, beside the program on its cores.
        let any_fetched = children.clone().any(|e| fetched_ahead(t, e));
        let (order, rank) = if any_fetched {
            let mut named: Vec<(&[u8], u32)> = children
                .map(|i| (t.entry(i).and_then(|e| t.name(&e)).unwrap_or_default(), i))
                .collect();
            named.sort_unstable();
            let order: Vec<u32> = named.into_iter().map(|(_, i)| i).collect();
            let mut rank = vec![0u32; order.len()];
            for (k, &i) in order.iter().enumerate() {
                rank[(i - first) as usize] = k as u32;
            }
            (order, rank)
        } else {
            (Vec::new(), Vec::new())
        };
        let s = Arc::new(Sorted {
            order,
            rank,
            first_child: first,
            any_fetched,
        });
        self.sorted.insert(dir, s.clone());
        Some(s)
    }
}

impl Sorted {
    fn rank_of(&self, idx: u32) -> Option<usize> {
        let k = idx.checked_sub(self.first_child)? as usize;
        self.rank.get(k).map(|&r| r as usize)
    }
}

impl NameOrder {
    /// False if no file of `t` is one the read-ahead fetches: then no run is ever followed for
    /// it, and an open (or a small file's close) need not be observed at all. Looked up in the
    /// whole table once (`SourceCtx::new` asks first, off the ring consumer).
    pub fn may_fetch(&self, t: &Table) -> bool {
        *self
            .fetches
            .get_or_init(|| (0..t.entry_count()).any(|e| fetched_ahead(t, e)))
    }
}

/// Whether entry `e` is a file the agent fetches whole in one request (the only kind read ahead).
fn fetched_ahead(t: &Table, e: u32) -> bool {
    t.entry(e).is_some_and(|r| {
        r.stat.is_file()
            && r.stat.size >= t.prefetch_min_size()
            && t.prefetch_min_size() > 0
            && r.stat.size <= granary_shm::DIRECT_FETCH_MAX
            && t.locator(e).is_none()
    })
}

/// Claims the files after `furthest` in name order that the read-ahead fetches, up to `WINDOW`
/// bytes of them counting those already on their way or placed; and says whether any of them
/// is not placed yet.
fn claim_after(
    t: &Table,
    s: &Sorted,
    furthest: usize,
    room: &dyn Fn(u64) -> bool,
) -> (Vec<u32>, bool) {
    let mut claimed = Vec::new();
    let mut fetching = false;
    let mut ahead = 0u64;
    for &e in &s.order[furthest + 1..] {
        if ahead >= WINDOW {
            break;
        }
        if !fetched_ahead(t, e) {
            continue;
        }
        let Some(size) = t.entry(e).map(|r| r.stat.size) else {
            continue;
        };
        let w = t.state(e);
        match w.state() {
            State::Unplaced => {
                if !room(size) {
                    break;
                }
                if lifecycle::claim_ahead(&lifecycle::EntryCell { table: t, idx: e }, w) {
                    claimed.push(e);
                }
                fetching = true;
            }
            State::Queued | State::Placing => fetching = true,
            State::Placed => {}
            // Not ours to touch, and nothing to read ahead for.
            _ => continue,
        }
        ahead += size;
    }
    (claimed, fetching)
}
