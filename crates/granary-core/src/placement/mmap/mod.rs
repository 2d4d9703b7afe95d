//! Following programs through their mappings, and reading the source ahead of them
//! (docs/placement.md, "Follower").
//!
//! A program that reads a file through `mmap` makes no call granary can see: its reads are page
//! faults. The preload library maps what the tier holds over the source and tells the agent
//! which process mapped something (`request::MAPPED`); from then on the agent:
//!
//! - reads `/proc/<pid>/maps` (again every second: `munmap`, `exec` and exit end the following)
//!   and groups the process's mappings of catalogued files (`proc_maps`);
//! - looks at the process's page tables (`/proc/<pid>/pagemap`, the present bit: readable for
//!   the same user, no privilege) around where the reader was and, a slice per tick, the rest
//!   of each mapping: pages that became present are the pages the program touched — including
//!   those a system call touched for it;
//! - decides with Haderbache et al.'s rules (`window`) when to read ahead and what, and issues
//!   `readahead(2)` on the source for the pages of that range the mapping takes from the source
//!   and the page cache lacks (`mincore`): large requests, issued at once, that the program's
//!   faults then find in the page cache or in flight;
//! - counts what the program touched: from tier files, from the source, and of those the pages
//!   no read of the agent had asked for (the job's `MAP_*` counters).
//!
//! Why not guard pages and a SIGSEGV handler (Haderbache et al.): a page made inaccessible is
//! inaccessible to the kernel too — `write(fd, map, n)` fails with EFAULT —, a handler must be
//! chained under every program that installs its own (a JVM, Python's faulthandler), and a
//! program that installs it with a raw system call would receive our faults. Following the page
//! tables from outside costs the program nothing and changes nothing it can observe. Why not
//! `userfaultfd`: unprivileged users may not use it on most systems
//! (`vm.unprivileged_userfaultfd = 0`), it needs a handler thread in the program, and it does not
//! serve regular files' pages.
//!
//! What the follower of a source holds — the processes, their readers, the files read ahead —
//! is `follower`'s (`SourceCtx::mmap` holds it; it knows nothing of `SourceCtx`); making cached
//! pages look used is `keep_cached`'s; here: what follows the programs each tick.

mod config;
pub(super) mod follower;
pub mod in_flight;
mod keep_cached;
pub mod lmdb_index;
pub mod page_order;
mod proc_maps;
mod reader_pace;
pub mod window;

pub use config::{
    MmapConfig, MmapParams, Mode, DEFAULT_DISTANCE, DEFAULT_SIZE, DEFAULT_THRESHOLD_PCT,
};
pub use follower::{register_follower, Follower, Steering};
pub use page_order::PageOrder;
pub use window::{Shape, Window};

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use granary_shm::{job, State};

use follower::{
    bit, set_bit, stop_at, wake, FileKey, Followed, Proc, Reader, RecordOrder, Source,
    CACHED_EVERY, CACHED_WINDOWS, LEAD_MAX, PAGE, THROUGH,
};
use keep_cached::{touch, TOUCH_WITHIN};

use super::source_ctx::SourceCtx;
use crate::stats::AgentCounters;
use crate::sync::atomic::Ordering;
use crate::sync::{lock, thread, Arc};
use crate::sys;

/// A reader that stops for this many untouched pages has ended its run (it may skip a few
/// pages: a record's padding, a B-tree page it did not need).
const GAP_PAGES: u64 = 32;
/// Pages looked at per tick: around each reader (following its run), and of the rest of each
/// mapping (to find readers that jumped).
const HOT_PAGES: u64 = 16 << 10;
const HOT_PIECE: u64 = 1 << 10;
const SWEEP_PAGES: u64 = 4 << 10;
/// Pages newly touched away from a reader that make it a jump.
const JUMP_MIN_PAGES: u64 = 16;
/// Looks without progress after which the sweep starts over at the top of the mapping.
const STALL_LOOKS: u32 = 3;
/// One `readahead(2)` call at most: the kernel caps each at its largest request.
const RA_PIECE: u64 = in_flight::MAX_PIECE;
/// Follower are read again this often (unmapped, exited, exec'd).
const MAPS_EVERY: Duration = Duration::from_secs(1);

fn file_key(e: &granary_shm::EntryRec) -> FileKey {
    (e.stat.ino, e.stat.size, e.stat.ctime.sec, e.stat.ctime.nsec)
}

/// Files smaller than this get no record index (looked for only in mappings of whole files).
const INDEX_MIN: u64 = 4 << 20;

/// Tree pages read to build an index, at most: a thirty-second of the file, between 1 and
/// 16 MiB (4,096 random page reads: a few seconds on a PFS, ~80 GB of 192 KiB values).
fn index_budget(len: u64) -> u64 {
    (len / 32).clamp(1 << 20, 16 << 20)
}

/// Readers that did not move for this long are idle: the fetch stops waiting for them.
const IDLE_AFTER: Duration = Duration::from_secs(1);

impl Follower {
    /// One round: new processes, mappings re-read when due, every reader looked at and read
    /// ahead of. Returns true if some reader moved (the caller ticks again soon).
    /// `room`: what the page cache can hold (read-ahead is sized to it); `block`: the size of
    /// the agent's source reads (a whole-file fetch reads one ahead of its progress).
    pub fn tick(&self, ctx: &SourceCtx, p: &MmapParams, room: u64, block: u64) -> bool {
        let mut pending = std::mem::take(&mut *lock(&self.pending));
        // Every `munmap` of a followed process asks again: once per tick is enough.
        pending.sort_unstable();
        pending.dedup_by_key(|p| p.0);
        let mut st = lock(&self.state);
        let now = Instant::now();
        for (pid, slot) in pending {
            refresh(ctx, &mut st, pid, Some(slot), now);
        }
        let due: Vec<u32> = st
            .procs
            .iter()
            .filter(|(_, pr)| now.duration_since(pr.maps_at) >= MAPS_EVERY)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in due {
            refresh(ctx, &mut st, pid, None, now);
        }
        if p.mode != Mode::Off && p.lmdb_index {
            self.apply_orders(ctx, &mut st, now);
        }
        let mut moved = false;
        let readers: usize = st.procs.values().map(|pr| pr.readers.len()).sum();
        // Read-ahead that memory cannot hold until the reader gets there is read twice.
        let size = p.size.min((room / 8 / readers.max(1) as u64).max(RA_PIECE));
        if readers > 0 && self.last_size.swap(size, Ordering::Relaxed) != size {
            tracing::debug!(
                "mappings: {readers} readers, page-cache room {room}: windows of {size}"
            );
        }
        if p.mode != Mode::Off {
            let shape = Shape {
                distance: p.distance,
                size,
                threshold_pct: p.threshold_pct,
            };
            {
                let Followed { procs, files, .. } = &mut *st;
                // What completed since the last tick leaves room at the source.
                let arrived = self.flight.retire(now, |pc| {
                    let mut res = Vec::new();
                    let last = (pc.off + pc.len - 1) / PAGE * PAGE;
                    files
                        .get(&pc.idx)
                        .and_then(|s| s.cache.as_ref())
                        .is_none_or(|c| {
                            c.resident(last, PAGE, &mut res).is_err()
                                || res.first().is_some_and(|&m| m & 1 == 1)
                        })
                });
                // Read ahead and arrived: made to look used, so that the kernel keeps them
                // until their reader comes (`touch`).
                let mut buf = Vec::new();
                for pc in arrived {
                    if now.duration_since(pc.at) < TOUCH_WITHIN {
                        if let Some(src) = files.get(&pc.idx) {
                            touch(src, pc.off, pc.len, &mut buf);
                        }
                    }
                }
                for pr in procs.values_mut() {
                    moved |= follow(ctx, pr, files, &shape, p.mode == Mode::Prefetch, block);
                }
            }
            if p.mode == Mode::Prefetch {
                issue(ctx, &mut st, &self.flight);
                if st
                    .kept_at
                    .is_none_or(|t| now.duration_since(t) >= keep_cached::EVERY)
                {
                    st.kept_at = Some(now);
                    let Followed {
                        procs,
                        files,
                        starts,
                        ..
                    } = &*st;
                    let kept = keep_cached::round(procs, files, starts, &mut Vec::new());
                    if kept > 0 {
                        tracing::trace!("mappings: {kept} bytes in the readers' way kept cached");
                    }
                }
                let f = &self.flight;
                tracing::trace!(
                    "mappings: source at {} B/s, {} of {} in flight",
                    f.bps(),
                    f.in_flight(),
                    f.cap()
                );
            }
        }
        // What a reader read stays cached about this long behind it: half of what the page
        // cache holds beside every reader's read-ahead, shared among the readers.
        let behind =
            (room.saturating_sub(readers as u64 * size) / 2 / readers.max(1) as u64).max(size);
        let mut steer: HashMap<u32, Steering> = HashMap::new();
        for r in st.procs.values().flat_map(|pr| pr.readers.iter()) {
            let s = steer.entry(r.m.idx).or_insert_with(|| Steering {
                readers: Vec::new(),
                window: behind,
                lead: p.distance.min(size),
                idle: true,
                fits: false,
            });
            if p.mode == Mode::Off {
                // Not followed: where they read is unknown, the fetch reads in sequence (and
                // keeps what it read for them).
                s.idle = false;
                continue;
            }
            let (from, pos) = if r.win.phase == window::Phase::Unseen {
                (r.m.start, r.m.start)
            } else {
                (r.win.start, r.win.pos)
            };
            s.readers.push(if r.page_order.is_some() {
                // In file order it is where its current page is, not read ahead of.
                let at = r.file_off(pos) / PAGE * PAGE;
                super::whole_file::order::Reader {
                    from: at,
                    pos: at,
                    streaming: false,
                    ahead: at,
                    scattered: false,
                }
            } else {
                super::whole_file::order::Reader {
                    from,
                    pos,
                    streaming: matches!(r.win.phase, window::Phase::Streaming { .. }),
                    // What was issued for it (not past one window: it may have jumped since).
                    ahead: r.issued_to.clamp(pos, pos.saturating_add(size)),
                    scattered: r.win.scattered(),
                }
            });
            s.idle &= now.duration_since(r.moved_at) >= IDLE_AFTER;
        }
        // The mapped files fit in the page cache with a quarter of it to spare (the copies
        // being written, the programs' own files): nothing the fetch reads for them is evicted
        // before they fault it, so the fetch reads at the source's bandwidth and their faults
        // find its pages, where waiting for them left each fault a request of the source's
        // (a shuffled Arrow reader's epoch 1 over 322 MB under a 768 MiB cap: 2.3 × the
        // bandwidth's time, the program faulting 286 MB of 307 itself).
        let mapped: u64 = steer
            .keys()
            .filter_map(|&idx| ctx.table.entry(idx).map(|e| e.stat.size))
            .sum();
        let fits = room > 0 && mapped <= room / 4 * 3;
        for s in steer.values_mut() {
            s.fits = fits;
        }
        st.files.retain(|idx, _| steer.contains_key(idx));
        st.starts.retain(|idx, _| steer.contains_key(idx));
        *lock(&self.steer) = steer;
        moved
    }
}

impl Follower {
    /// Readers of whole-file mappings take their entry's record order once it is known; the
    /// first reader of an entry has it built (on a thread of its own: it reads the tree's
    /// pages from the source, which may be slow, and the follower must not wait for that).
    fn apply_orders(&self, ctx: &SourceCtx, st: &mut Followed, now: Instant) {
        let mut orders = lock(&self.orders);
        let mut switched = Vec::new();
        for r in st.procs.values_mut().flat_map(|pr| pr.readers.iter_mut()) {
            if r.order_known {
                continue;
            }
            let Some(e) = ctx.table.entry(r.m.idx) else {
                r.order_known = true;
                continue;
            };
            if r.m.start != 0 || r.m.end < e.stat.size || e.stat.size < INDEX_MIN {
                // Part of the file, or a file one fetch request reads: followed in file order.
                r.order_known = true;
                continue;
            }
            let key = file_key(&e);
            match orders.get(&r.m.idx) {
                Some(RecordOrder::Building) => {}
                Some(RecordOrder::Built { key: k, page_order }) if *k == key => {
                    r.order_known = true;
                    if let Some(l) = page_order {
                        // Followed in record order from now on; what it touched so far stays
                        // seen (it is not counted again).
                        let mut n = Reader::new(r.m.clone(), e.stat.size, now, Some(l.clone()));
                        let pages = (r.m.end.min(r.len).saturating_sub(r.m.start)).div_ceil(PAGE);
                        for k in 0..pages {
                            if bit(&r.seen, k) {
                                set_bit(&mut n.seen, l.to_virtual(k * PAGE) / PAGE, true);
                            }
                        }
                        *r = n;
                        switched.push(r.m.idx);
                    }
                }
                _ => {
                    let started = self.build_order(ctx, r.m.idx, e.stat.size, key);
                    orders.insert(
                        r.m.idx,
                        if started {
                            RecordOrder::Building
                        } else {
                            RecordOrder::Built {
                                key,
                                page_order: None,
                            }
                        },
                    );
                }
            }
        }
        for idx in switched {
            st.starts.remove(&idx);
        }
    }

    /// Starts building entry `idx`'s order; false if no thread could be started.
    fn build_order(&self, ctx: &SourceCtx, idx: u32, len: u64, key: FileKey) -> bool {
        let orders = Arc::clone(&self.orders);
        let counters = Arc::clone(&ctx.counters);
        let file = open_catalogued(ctx, idx).map(|(f, _)| f);
        let built = thread::Builder::new()
            .name("granary-index".into())
            .spawn(move || {
                let page_order = file.and_then(|f| record_order(&f, idx, len, &counters));
                let found = page_order.is_some();
                lock(&orders).insert(idx, RecordOrder::Built { key, page_order });
                if found {
                    // Its readers change order at the next tick (no order: nothing changes,
                    // the follower keeps its pace).
                    wake();
                }
            });
        built.is_ok()
    }
}

/// The record order of entry `idx`'s file `f` (`lmdb_index`), if it is an LMDB whose pages are
/// not in about key order already.
fn record_order(f: &File, idx: u32, len: u64, counters: &AgentCounters) -> Option<Arc<PageOrder>> {
    let t0 = Instant::now();
    // One page per read: the kernel's read-ahead around each would read 32 times more.
    sys::fadvise(f, 0, 0, libc::POSIX_FADV_RANDOM);
    let mut bytes = 0u64;
    let built = lmdb_index::build(len, index_budget(len), |off, buf| {
        bytes += buf.len() as u64;
        f.read_exact_at(buf, off).is_ok()
    });
    AgentCounters::add(&counters.source_bytes, bytes);
    let ix = match built {
        Ok(ix) => ix,
        Err(lmdb_index::NoIndex::NotLmdb) => return None,
        Err(why) => {
            tracing::info!("entry {idx}: an LMDB data file without a record index ({why:?})");
            return None;
        }
    };
    let per = ix.page_size / PAGE;
    let extents: Vec<(u64, u64)> = ix
        .extents
        .iter()
        .map(|&(p, n)| (p * per, n * per))
        .collect();
    let page_order = PageOrder::new(&extents, len);
    tracing::info!(
        "entry {idx}: an LMDB data file, {} tree pages read in {:?}: {}",
        ix.pages_read,
        t0.elapsed(),
        match &page_order {
            Some(l) => format!("followed in key order ({} runs)", l.extents()),
            None => "its pages are in key order".to_string(),
        }
    );
    page_order.map(Arc::new)
}

/// (Re-)reads `pid`'s mappings; readers that are still mapped the same way keep their state.
fn refresh(ctx: &SourceCtx, st: &mut Followed, pid: u32, slot: Option<u32>, now: Instant) {
    let Some(found) = proc_maps::of_process(pid, &ctx.table, &ctx.source_real) else {
        st.procs.remove(&pid);
        return;
    };
    let found: Vec<_> = found
        .into_iter()
        .filter(|m| {
            ctx.table
                .entry(m.idx)
                .is_some_and(|e| m.start < e.stat.size)
        })
        .collect();
    if found.is_empty() {
        st.procs.remove(&pid);
        return;
    }
    let pr = st.procs.entry(pid).or_insert_with(|| {
        // The present bits of the page tables of a process of the same user: no privilege
        // needed, unless it made itself undumpable (then it is not followed).
        let pagemap = File::open(format!("/proc/{pid}/pagemap")).ok();
        if pagemap.is_none() {
            tracing::info!("process {pid}: its page tables cannot be read, not followed");
        }
        Proc {
            slot: slot.unwrap_or(0),
            pagemap,
            maps_at: now,
            readers: Vec::new(),
        }
    });
    if let Some(s) = slot {
        pr.slot = s;
    }
    pr.maps_at = now;
    let mut old = std::mem::take(&mut pr.readers);
    for m in found {
        let len = ctx.table.entry(m.idx).map_or(0, |e| e.stat.size);
        let same = old.iter().position(|r| {
            (r.m.idx, r.m.base, r.m.start, r.m.end) == (m.idx, m.base, m.start, m.end)
        });
        let r = match same {
            Some(i) => {
                let mut r = old.swap_remove(i);
                r.m.local = m.local;
                r
            }
            None => {
                tracing::debug!(
                    "process {pid} maps entry {} [{}, {}), local {:?}",
                    m.idx,
                    m.start,
                    m.end,
                    m.local
                );
                Reader::new(m, len, now, None)
            }
        };
        pr.readers.push(r);
    }
}

/// Looks at one process's page tables; reads ahead where its readers stream. True if a reader
/// touched something new.
fn follow(
    ctx: &SourceCtx,
    pr: &mut Proc,
    files: &mut HashMap<u32, Source>,
    shape: &Shape,
    prefetch: bool,
    block: u64,
) -> bool {
    let Some(pm) = pr.pagemap.as_ref() else {
        return false;
    };
    let mut moved = false;
    for r in &mut pr.readers {
        // A reader followed in record order is not read ahead of while a whole-file fetch
        // reads its file (in file order: what the follower read ahead in record order would be
        // read again by the fetch once evicted); the fetch serves it where it is.
        let prefetch = prefetch
            && !(r.page_order.is_some() && ctx.table.state(r.m.idx).state() == State::Placing);
        // A reader whose last windows found everything cached has nothing to gain: it is
        // looked at less often (following costs the program a share of a CPU).
        r.ticks = r.ticks.wrapping_add(1);
        if r.cached_windows >= CACHED_WINDOWS && r.ticks % CACHED_EVERY != 0 {
            continue;
        }
        let Some(look) = look(pm, r) else {
            continue;
        };
        account(ctx, pr.slot, r, &look, files, block);
        if look.hot_new > 0 || look.jump.is_some() {
            r.moved_at = Instant::now();
        }
        // Past what was issued for it, into pages the mapping takes from the source, while its
        // window was still being issued: the source's bursts outran the pieces in flight.
        if prefetch
            && look.hot_new > 0
            && r.issued_to > 0
            && look.hot_end > r.issued_to
            && r.pending.is_some()
            && takes_source(r, r.issued_to, look.hot_end)
        {
            r.lead = (r.lead * 2).min(LEAD_MAX);
        }
        let now = Instant::now();
        let ahead = if look.hot_new > 0 {
            moved = true;
            r.win.advance(look.hot_end, look.hot_new, r.len, shape)
        } else if let Some((at, new)) = look.jump {
            moved = true;
            r.run_from = look.jump_from.min(at);
            r.win.jump(at);
            r.pace.jump(now, at);
            r.win.advance(at, new, r.len, shape)
        } else {
            None
        };
        r.pace.observe(now, r.win.pos);
        if look.jump.is_some() && look.hot_new == 0 {
            // Found elsewhere: what was left for where it was is not wanted any more.
            r.pending = None;
        }
        if let (true, Some((a, b))) = (prefetch, ahead) {
            // The last window, judged: everything it wanted was cached.
            if r.win_wanted > 0 {
                r.cached_windows = if r.win_issued == 0 {
                    r.cached_windows.saturating_add(1)
                } else {
                    0
                };
            }
            r.win_wanted = 0;
            r.win_issued = 0;
            tracing::debug!(
                "mmap read-ahead of entry {}: [{a}, {b}) for a reader at {}: issued a piece at a \
                 time as the source has room",
                r.m.idx,
                r.win.pos
            );
            // Windows follow each other without gaps; what is left of the last one is read
            // first.
            r.pending = match r.pending {
                Some((x, y)) if x <= a && a <= y => Some((x, b.max(y))),
                _ => Some((a, b)),
            };
        }
    }
    moved
}

/// Issues read-ahead pieces for the readers' pending windows while the source has room
/// (`in_flight`): the piece nearest ahead of its reader first, so a reader about to wait is served
/// before one that has a lead.
///
/// A window stops where another reader of the file started reading in sequence (`stop`):
/// readers of contiguous shares (MPI-Caffe's ranks, `--procs 3`) each read up to the next
/// one's start, and what lies past it that reader already read — cached still, or evicted and
/// then not worth reading again for a reader that most likely stops there (measured: 2–3 % of
/// the file read twice, all of it at the shares' starts). A reader that does go on is read
/// ahead of again once it passed that start.
fn issue(ctx: &SourceCtx, st: &mut Followed, flight: &in_flight::Flight) {
    let Followed {
        procs,
        files,
        starts,
        ..
    } = st;
    let piece = flight.piece();
    // A reader that read on for a while started a run; a reader that read through a start
    // (a reader that did not stop there) makes it no start any more.
    for r in procs.values().flat_map(|pr| pr.readers.iter()) {
        if r.win.phase == window::Phase::Unseen {
            continue;
        }
        let (from, pos) = (r.run_from.min(r.win.start), r.win.pos);
        let s = starts.entry(r.m.idx).or_default();
        s.retain(|&x| !(from < x && pos > x.saturating_add(THROUGH)));
        if pos >= from.saturating_add(THROUGH) && !s.iter().any(|&x| x.abs_diff(from) < THROUGH) {
            s.push(from);
        }
    }
    let stop = |r: &Reader| stop_at(starts, r);
    let waiting: u64 = procs
        .values()
        .flat_map(|pr| pr.readers.iter())
        .filter(|r| r.pending.is_some())
        .map(|r| r.lead)
        .sum();
    let mut room = flight.room(waiting);
    while room > 0 {
        let next = procs
            .values_mut()
            .flat_map(|pr| pr.readers.iter_mut())
            .filter_map(|r| {
                let (a, b) = r.pending?;
                // What the reader already passed it faulted itself.
                let a = a.max(r.win.pos / PAGE * PAGE);
                if a >= b.min(r.len) {
                    r.pending = None;
                    return None;
                }
                r.pending = Some((a, b));
                let stop = stop(r);
                // Not more than its pace allows ahead of it: read-ahead waiting long in the page
                // cache is what the kernel evicts first (`reader_pace`). A whole piece once allowed.
                let paced = r.win.pos.saturating_add(r.pace.ahead(piece));
                (a < stop.min(paced)).then_some((a - r.win.pos.min(a), stop, r))
            })
            .min_by_key(|(lead, _, _)| *lead);
        let Some((_, stop, r)) = next else {
            break;
        };
        let Some((a, b)) = r.pending else {
            break;
        };
        let mut end = (a + piece.min(room.max(MIN_ISSUE))).min(b).min(stop);
        if let Some(l) = &r.page_order {
            // Not a record cut in two requests: to the end of the run the piece ends in.
            let e = l.run_end(end - 1).min(b).min(stop);
            if e - end <= RA_PIECE / 2 {
                end = e;
            }
        }
        tracing::trace!(
            "entry {}: reader [{}, {}) run from {}, at {} B/s, piece [{a}, {end}) of [{a}, {b}), \
             starts {:?}",
            r.m.idx,
            r.win.start,
            r.win.pos,
            r.run_from,
            r.pace.rate(),
            starts.get(&r.m.idx)
        );
        let (wanted, issued) = read_ahead(ctx, r, files, flight, a, end);
        if r.win_issued == 0 && issued > 0 {
            AgentCounters::add(&ctx.counters.mmap_windows, 1);
        }
        r.win_wanted += wanted;
        r.win_issued += issued;
        r.pending = (end < b).then_some((end, b));
        r.issued_to = end;
        room = room.saturating_sub(issued);
        if issued == 0 && wanted == 0 && files.get(&r.m.idx).is_none() {
            // The source cannot be opened: nothing to read ahead for this reader.
            r.pending = None;
        }
    }
}

/// True if the mapping of `r` takes some of `[a, b)` (in its order) from the source (not from a
/// tier).
fn takes_source(r: &Reader, a: u64, b: u64) -> bool {
    r.file_runs(a, b)
        .into_iter()
        .any(|(a, b)| takes_source_in_file(r, a, b))
}

fn takes_source_in_file(r: &Reader, a: u64, b: u64) -> bool {
    let mut at = a;
    let mut local: Vec<(u64, u64)> =
        r.m.local
            .iter()
            .copied()
            .filter(|&(s, e)| s < b && a < e)
            .collect();
    local.sort_unstable();
    for (s, e) in local {
        if s > at {
            return true;
        }
        at = at.max(e);
    }
    at < b
}

/// The smallest piece issued when the source has little room left.
const MIN_ISSUE: u64 = in_flight::MIN_PIECE;

/// What one look at a reader's page tables found.
struct Look {
    /// The end of the run of touched pages from the reader's position, and the bytes in it
    /// touched since the last look.
    hot_end: u64,
    hot_new: u64,
    /// Elsewhere: the furthest newly touched page of the sweep slice, and the new bytes there;
    /// and where the run of touched pages that ends there starts (`jump_from`).
    jump: Option<(u64, u64)>,
    jump_from: u64,
    /// Pages that became present (file offsets), for the counters.
    new_pages: Vec<u64>,
}

/// The present bits of pages `[from, to)` of `r` (in its order), one bool per page.
fn present(pm: &File, r: &Reader, from: u64, to: u64, buf: &mut Vec<u8>) -> Option<Vec<bool>> {
    let to = to.min(r.m.end).min(r.len.div_ceil(PAGE) * PAGE);
    let mut out = Vec::new();
    for (a, b) in r.file_runs(from, to) {
        let want = (b - a).div_ceil(PAGE) as usize;
        let got = present_in_file(pm, r, a, b, buf)?;
        let short = got.len() < want;
        out.extend(got);
        if short {
            break;
        }
    }
    Some(out)
}

/// The present bits of file pages `[from, to)` of `r`'s mapping.
fn present_in_file(
    pm: &File,
    r: &Reader,
    from: u64,
    to: u64,
    buf: &mut Vec<u8>,
) -> Option<Vec<bool>> {
    let pages = (to - from).div_ceil(PAGE);
    buf.resize(pages as usize * 8, 0);
    let va = r.m.base.wrapping_add(from);
    let mut got = 0usize;
    while got < buf.len() {
        match pm.read_at(&mut buf[got..], (va / PAGE) * 8 + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(
        buf[..got]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) >> 63 == 1)
            .collect(),
    )
}

/// Records whether file page `off` of `r` is present now; true if it became present since the
/// last look (the program touched it).
fn observe(r: &mut Reader, off: u64, on: bool) -> bool {
    let k = (off - r.m.start) / PAGE;
    let was = bit(&r.seen, k);
    set_bit(&mut r.seen, k, on);
    on && !was
}

fn look(pm: &File, r: &mut Reader) -> Option<Look> {
    let mut buf = Vec::new();
    let mut out = Look {
        hot_end: r.win.pos,
        hot_new: 0,
        jump: None,
        jump_from: 0,
        new_pages: Vec::new(),
    };
    // Follow the reader from where it was: pages it touched since the last look extend its
    // run; pages still present from before (an earlier pass the kernel did not reclaim) are
    // passed over; a stretch of untouched pages ends it.
    if r.win.phase != window::Phase::Unseen {
        let mut from = r.win.pos.max(r.m.start) / PAGE * PAGE;
        let limit = from + HOT_PAGES * PAGE;
        let mut gap = 0;
        // In pieces: a reader that moved a little costs a little.
        'hot: while from < limit {
            let bits = present(pm, r, from, from + HOT_PIECE * PAGE, &mut buf)?;
            if bits.is_empty() {
                break;
            }
            for (i, &on) in bits.iter().enumerate() {
                let off = from + i as u64 * PAGE;
                if observe(r, off, on) {
                    gap = 0;
                    out.hot_end = off + PAGE;
                    out.hot_new += PAGE;
                    out.new_pages.push(off);
                } else if !on {
                    gap += 1;
                    if gap > GAP_PAGES {
                        break 'hot;
                    }
                }
            }
            from += bits.len() as u64 * PAGE;
        }
        r.stalled = if out.hot_new == 0 { r.stalled + 1 } else { 0 };
        if r.stalled == STALL_LOOKS {
            // Not moving on: most likely it started over (the next epoch). Look there first.
            r.sweep = r.m.start;
        }
    }
    // A slice of the rest, round robin: readers that jumped, and the first sight of one.
    let span = r.m.end.min(r.len.div_ceil(PAGE) * PAGE);
    if r.sweep >= span || r.sweep < r.m.start {
        r.sweep = r.m.start;
    }
    let from = r.sweep;
    let bits = present(pm, r, from, from + SWEEP_PAGES * PAGE, &mut buf)?;
    r.sweep = from + (bits.len() as u64).max(1) * PAGE;
    let (mut far_new, mut far_end) = (0u64, 0u64);
    let near = r.win.pos.saturating_sub(GAP_PAGES * PAGE)..out.hot_end.max(r.win.pos) + PAGE;
    let unseen = r.win.phase == window::Phase::Unseen;
    let mut far = Vec::new();
    for (i, &on) in bits.iter().enumerate() {
        let off = from + i as u64 * PAGE;
        if observe(r, off, on) {
            out.new_pages.push(off);
            if unseen || !near.contains(&off) {
                far.push(off);
            }
        }
    }
    if r.page_order.is_some() {
        // In record order, a program's fault also maps pages of the records next to it in the
        // file (the kernel maps the cached pages around a fault, up to 16, after reading
        // 128 KiB around it): single clusters scattered over the record order, which are not
        // where the reader is. Only a run of new pages longer than that is.
        if let Some((end, n)) = last_run(&far, LAYOUT_JUMP_PAGES) {
            (far_new, far_end) = (n * PAGE, end);
        }
    } else if let Some(&last) = far.last() {
        (far_new, far_end) = (far.len() as u64 * PAGE, last + PAGE);
    }
    // A few pages touched elsewhere (a B-tree page read again) do not move a reader.
    if out.hot_new == 0 && (far_new >= JUMP_MIN_PAGES * PAGE || unseen && far_new > 0) {
        out.jump = Some((far_end, far_new));
        // Back from there over touched pages (gaps of a few allowed): where that run starts.
        let mut k = ((far_end - PAGE - from) / PAGE) as usize;
        let (mut lo, mut gap) = (k, 0);
        while k > 0 && gap <= GAP_PAGES {
            k -= 1;
            if bits[k] {
                lo = k;
                gap = 0;
            } else {
                gap += 1;
            }
        }
        out.jump_from = from + lo as u64 * PAGE;
    }
    Some(out)
}

/// Pages newly touched in one run (in record order) that make a jump for a reader with a
/// page_order: more than the kernel's fault-around maps at once (16 pages).
const LAYOUT_JUMP_PAGES: u64 = 64;

/// The last run of `pages` (ascending offsets; gaps of two pages allowed) of at least `min`
/// pages: its end and its pages.
fn last_run(pages: &[u64], min: u64) -> Option<(u64, u64)> {
    let mut found = None;
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] - pages[j - 1] <= 3 * PAGE {
            j += 1;
        }
        if (j - i) as u64 >= min {
            found = Some((pages[j - 1] + PAGE, (j - i) as u64));
        }
        i = j;
    }
    found
}

/// Adds what a look found to the job's counters.
fn account(
    ctx: &SourceCtx,
    slot: u32,
    r: &Reader,
    look: &Look,
    files: &HashMap<u32, Source>,
    block: u64,
) {
    if look.new_pages.is_empty() {
        return;
    }
    let t = &ctx.table;
    let placing = t.state(r.m.idx).state() == State::Placing;
    // A whole-file fetch has read (or is reading) one block past its progress.
    let fetched_to = if placing {
        t.progress(r.m.idx).saturating_add(block)
    } else {
        0
    };
    let src = files.get(&r.m.idx);
    let (mut local, mut source, mut faulted) = (0u64, 0u64, 0u64);
    let len = r.file_len();
    for &v in &look.new_pages {
        let off = r.file_off(v);
        let n = PAGE.min(len.saturating_sub(off));
        if r.m.local.iter().any(|&(s, e)| (s..e).contains(&off)) {
            local += n;
        } else {
            source += n;
            let asked = off < fetched_to || src.is_some_and(|s| bit(&s.fetched, off / PAGE));
            if !asked {
                faulted += n;
            }
        }
    }
    t.count(slot, job::MAP_LOCAL_BYTES, local);
    t.count(slot, job::MAP_SOURCE_BYTES, source);
    t.count(slot, job::MAP_FAULTED_BYTES, faulted);
    ctx.mmap.flight().observed(faulted);
}

/// Reads `[a, b)` of the reader's file ahead, where the mapping takes it from the source and
/// the page cache lacks it; for a file cached in chunks, the missing chunks are asked for too.
/// Returns the bytes of the window the mapping takes from the source, and of those the bytes
/// it asked the source for (the rest was cached).
fn read_ahead(
    ctx: &SourceCtx,
    r: &Reader,
    files: &mut HashMap<u32, Source>,
    flight: &in_flight::Flight,
    a: u64,
    b: u64,
) -> (u64, u64) {
    let idx = r.m.idx;
    let a = a / PAGE * PAGE;
    let b = b.min(r.len);
    if a >= b {
        return (0, 0);
    }
    let src = match files.entry(idx) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => match open_source(ctx, idx) {
            Some(s) => v.insert(s),
            None => return (0, 0),
        },
    };
    let t0 = Instant::now();
    // The parts of [a, b) (in the reader's order: file ranges) the mapping takes from the
    // source.
    let flen = r.file_len();
    let mut runs: Vec<(u64, u64)> = r
        .file_runs(a, b)
        .into_iter()
        .map(|(x, y)| (x, y.min(flen)))
        .filter(|(x, y)| x < y)
        .collect();
    for &(s, e) in &r.m.local {
        runs = runs
            .into_iter()
            .flat_map(|(x, y)| {
                let mut v = vec![];
                if x < s.min(y) {
                    v.push((x, s.min(y)));
                }
                if e.max(x) < y {
                    v.push((e.max(x), y));
                }
                v
            })
            .collect();
    }
    let mut res = Vec::new();
    let mut issued = 0u64;
    let wanted: u64 = runs.iter().map(|&(x, y)| y - x).sum();
    for (x, y) in runs {
        let missing = match &src.cache {
            Some(c) if c.resident(x, y - x, &mut res).is_ok() => res
                .iter()
                .enumerate()
                .filter(|(_, &m)| m & 1 == 0)
                .map(|(i, _)| x + i as u64 * PAGE)
                .collect::<Vec<_>>(),
            _ => (x..y).step_by(PAGE as usize).collect(),
        };
        let mut i = 0;
        while i < missing.len() {
            let start = missing[i];
            let mut end = start + PAGE;
            while i + 1 < missing.len() && missing[i + 1] == end {
                i += 1;
                end += PAGE;
            }
            i += 1;
            let end = end.min(y);
            // The kernel reads at most its largest request (`max_sectors_kb`, ~1 MiB) per
            // call, in one request: so many calls, each a request large enough to reach the
            // source's bandwidth rather than its request rate.
            let mut p = start;
            while p < end {
                let n = RA_PIECE.min(end - p);
                if sys::readahead(&src.file, p, n).is_err() {
                    break;
                }
                flight.issued(in_flight::Piece {
                    idx,
                    off: p,
                    len: n,
                    at: Instant::now(),
                });
                issued += n;
                let mut q = p;
                while q < p + n {
                    set_bit(&mut src.fetched, q / PAGE, true);
                    q += PAGE;
                }
                p += n;
            }
        }
    }
    tracing::trace!(
        "mmap read-ahead piece of entry {idx}: [{a}, {b}) for a reader at {}: {issued} bytes issued \
         in {:?}, {} in flight",
        r.win.pos,
        t0.elapsed(),
        flight.in_flight()
    );
    let c = &ctx.counters;
    AgentCounters::add(&c.mmap_read_ahead, issued);
    AgentCounters::add(&c.source_bytes, issued);
    (wanted, issued)
}

/// Opens entry `idx` on the source, if it is still the catalogued file.
fn open_catalogued(ctx: &SourceCtx, idx: u32) -> Option<(File, granary_shm::EntryRec)> {
    use std::os::unix::ffi::OsStrExt;
    let e = ctx.table.entry(idx)?;
    let rel = ctx.table.rel_path_vec(idx)?;
    let path = ctx.source_real.join(std::ffi::OsStr::from_bytes(&rel));
    let file = super::copy::open_source(&ctx.counters, &path).ok()?;
    if !super::copy::matches_catalog(&file, &e) {
        return None;
    }
    AgentCounters::add(&ctx.counters.source_opens, 1);
    Some((file, e))
}

/// Opens entry `idx` on the source for read-ahead, if it is still the catalogued file.
fn open_source(ctx: &SourceCtx, idx: u32) -> Option<Source> {
    let (file, e) = open_catalogued(ctx, idx)?;
    let cache = sys::CachedPages::of(&file).ok();
    let pages = e.stat.size.div_ceil(PAGE);
    Some(Source {
        file,
        cache,
        fetched: vec![0; pages.div_ceil(64) as usize],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_in_record_order_is_a_run_not_fault_around_clusters() {
        let p = |v: &[u64]| v.iter().map(|&x| x * PAGE).collect::<Vec<_>>();
        // Clusters of 16 pages (what one fault maps around it) are no run.
        let clusters: Vec<u64> = (0..4).flat_map(|c| c * 100..c * 100 + 16).collect();
        assert_eq!(last_run(&p(&clusters), LAYOUT_JUMP_PAGES), None);
        // A reader's pages, with a page of padding skipped here and there, are; the last run
        // is where it is.
        let mut run: Vec<u64> = (1000..1080).filter(|x| x % 20 != 0).collect();
        run.extend(2000..2070);
        run.extend(3000..3010);
        assert_eq!(
            last_run(&p(&run), LAYOUT_JUMP_PAGES),
            Some((2070 * PAGE, 70))
        );
    }
}
