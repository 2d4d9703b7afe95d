//! What the follower of one source holds (`Follower`, `SourceCtx::mmap`): the processes that
//! mapped its files, their readers (`Reader`: where each is, its read-ahead window and pace),
//! the files read ahead (`Source`), record orders, and what is in flight; knowing nothing of
//! `SourceCtx`. What follows the programs is `mmap`'s.

use std::collections::HashMap;
use std::fs::File;
use std::time::Instant;

use super::page_order::PageOrder;
use super::window::Window;
use super::{in_flight, proc_maps, reader_pace};
use crate::sync::atomic::AtomicU64;
use crate::sync::statics::{self, OnceLock, Thread};
use crate::sync::{lock, Arc, Mutex};
use crate::sys;

pub(super) const PAGE: u64 = 4096;

/// A reader whose last windows all found the file cached is looked at every
/// `CACHED_EVERY` ticks only (until a window finds something to read).
pub(super) const CACHED_WINDOWS: u32 = 2;
pub(super) const CACHED_EVERY: u32 = 8;

/// The follower thread, woken when a request arrives.
static FOLLOWER: OnceLock<Thread> = OnceLock::new();

/// The calling thread is the agent's follower (`wake` unparks it).
pub fn register_follower() {
    let _ = FOLLOWER.set(statics::current());
}

pub(super) fn wake() {
    if let Some(t) = FOLLOWER.get() {
        t.unpark();
    }
}

/// The follower of one source: the programs' mappings of its files the agent follows, where
/// their readers are, and what it has in flight at the source (`SourceCtx::mmap`).
#[derive(Debug, Default)]
pub struct Follower {
    /// `(pid, job slot)` of processes that mapped something, not looked at yet.
    pub(super) pending: Mutex<Vec<(u32, u32)>>,
    /// Entries some followed process maps now, and where their readers are: a whole-file
    /// fetch of such an entry reads where they read (`whole_file::order`) and keeps those pages.
    pub(super) steer: Mutex<HashMap<u32, Steering>>,
    pub(super) state: Mutex<Followed>,
    /// The read-ahead window last used (logged when it changes).
    pub(super) last_size: AtomicU64,
    /// What the agent has in flight at this source, and may have (`in_flight`).
    pub(super) flight: in_flight::Flight,
    /// Per entry, its record order (`lmdb_index`), built once per version of the file.
    pub(super) orders: Arc<Mutex<HashMap<u32, RecordOrder>>>,
}

/// The record order of an entry: being built, or built for the file of `key` (`None`: it has
/// none worth following — not an LMDB, or one in about its own order).
#[derive(Debug, Clone)]
pub(super) enum RecordOrder {
    Building,
    Built {
        key: FileKey,
        page_order: Option<Arc<PageOrder>>,
    },
}

/// The version of a catalogued file an order was built for.
pub(super) type FileKey = (u64, u64, i64, u32);

/// The readers of one entry, for its whole-file fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steering {
    pub readers: Vec<crate::placement::whole_file::order::Reader>,
    /// How far behind a reader its pages are likely still cached.
    pub window: u64,
    /// How far ahead of a reader not read ahead of yet the fetch reads for it (`distance`).
    pub lead: u64,
    /// No reader moved for a while.
    pub idle: bool,
}

/// What the tracker follows: the mapping processes, the mapped files, where readers started.
#[derive(Debug, Default)]
pub(super) struct Followed {
    pub(super) procs: HashMap<u32, Proc>,
    pub(super) files: HashMap<u32, Source>,
    /// Per entry, where readers started reading in sequence (kept after they end, until a
    /// reader reads through: `issue`).
    pub(super) starts: HashMap<u32, Vec<u64>>,
    /// When what lies cached in the readers' way was last made to look used (`keep_cached`).
    pub(super) kept_at: Option<Instant>,
}

#[derive(Debug)]
pub(super) struct Proc {
    pub(super) slot: u32,
    /// Its page tables (`None`: they cannot be read — not dumpable —, not followed).
    pub(super) pagemap: Option<File>,
    pub(super) maps_at: Instant,
    pub(super) readers: Vec<Reader>,
}

/// One mapping of one process.
#[derive(Debug)]
pub(super) struct Reader {
    pub(super) m: proc_maps::Mapped,
    /// The file's size: nothing past it is followed (with a page order: its pages).
    pub(super) len: u64,
    /// The order it reads the file in, when not the file's (`page_order`): then its positions,
    /// windows and `seen` bits are offsets in that order, translated at the page tables, the
    /// read-ahead and the counters. `order_known`: looked up (a mapping of the whole file
    /// only; until its entry's order is built, it is followed in file order).
    pub(super) page_order: Option<Arc<PageOrder>>,
    pub(super) order_known: bool,
    /// One bit per page of `[m.start, end)`: present at the last look.
    pub(super) seen: Vec<u64>,
    pub(super) win: Window,
    /// Where the next sweep slice starts (file offset).
    pub(super) sweep: u64,
    /// Looks in a row in which the reader did not move on.
    pub(super) stalled: u32,
    /// When it last touched a new page (or was first seen).
    pub(super) moved_at: Instant,
    /// Read-ahead windows in a row that found everything cached, and ticks since it was
    /// first followed.
    pub(super) cached_windows: u32,
    pub(super) ticks: u32,
    /// What is left to read ahead of the last window (issued a piece at a time as the source
    /// has room: `in_flight`), and what that window wanted from the source and issued so far.
    pub(super) pending: Option<(u64, u64)>,
    pub(super) win_wanted: u64,
    pub(super) win_issued: u64,
    /// Where the run of pages it read since it was last found elsewhere starts (at or before
    /// `win.start`: the pages it touched on its way there in the same look).
    pub(super) run_from: u64,
    /// Read-ahead pieces it may have in flight (`LEAD_MIN` doubling up to `LEAD_MAX` each
    /// time it is found past what was issued for it: it faulted the source itself), and where
    /// what was issued (or found local or cached) for it ends.
    pub(super) lead: u64,
    pub(super) issued_to: u64,
    /// How fast it reads: read-ahead runs at most `reader_pace::AHEAD` of it ahead (`issue`).
    pub(super) pace: reader_pace::Pace,
}

/// The agent's handle on a source file it reads ahead.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) file: File,
    pub(super) cache: Option<sys::CachedPages>,
    /// One bit per page: asked for by a read-ahead.
    pub(super) fetched: Vec<u64>,
}

pub(super) fn bit(v: &[u64], i: u64) -> bool {
    v.get((i / 64) as usize)
        .is_some_and(|w| w & (1 << (i % 64)) != 0)
}

pub(super) fn set_bit(v: &mut [u64], i: u64, on: bool) {
    if let Some(w) = v.get_mut((i / 64) as usize) {
        if on {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }
}

impl Follower {
    /// `request::MAPPED`: process `pid` (job slot `slot`) mapped something of this source.
    pub fn request(&self, pid: u32, slot: u32) {
        lock(&self.pending).push((pid, slot));
        wake();
    }

    /// True while a followed process maps entry `idx`.
    pub fn is_mapped(&self, idx: u32) -> bool {
        lock(&self.steer).contains_key(&idx)
    }

    /// Where the readers of entry `idx` are, if a followed process maps it.
    pub fn steering(&self, idx: u32) -> Option<Steering> {
        lock(&self.steer).get(&idx).cloned()
    }

    /// Processes followed now.
    pub fn followed(&self) -> usize {
        lock(&self.state).procs.len()
    }

    /// What the agent has in flight at this source (a whole-file fetch counts its reads).
    pub fn flight(&self) -> &in_flight::Flight {
        &self.flight
    }
}

impl Reader {
    pub(super) fn new(
        m: proc_maps::Mapped,
        len: u64,
        now: Instant,
        page_order: Option<Arc<PageOrder>>,
    ) -> Reader {
        let len = match &page_order {
            Some(_) => len.div_ceil(PAGE) * PAGE,
            None => len,
        };
        let pages = (m.end.min(len).saturating_sub(m.start)).div_ceil(PAGE);
        Reader {
            sweep: m.start,
            m,
            len,
            order_known: page_order.is_some(),
            page_order,
            seen: vec![0; pages.div_ceil(64) as usize],
            win: Window::default(),
            stalled: 0,
            moved_at: now,
            cached_windows: 0,
            ticks: 0,
            pending: None,
            win_wanted: 0,
            win_issued: 0,
            run_from: 0,
            lead: LEAD_MIN,
            issued_to: 0,
            pace: reader_pace::Pace::default(),
        }
    }

    /// The size of its file (`len` is its pages' with a page order).
    pub(super) fn file_len(&self) -> u64 {
        self.page_order.as_ref().map_or(self.len, |l| l.file_len())
    }

    /// The file offset of its offset `v`.
    pub(super) fn file_off(&self, v: u64) -> u64 {
        self.page_order.as_ref().map_or(v, |l| l.to_file(v))
    }

    /// The file ranges of its range `[a, b)`.
    pub(super) fn file_runs(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        match &self.page_order {
            Some(l) => l.file_runs(a, b),
            None if a < b => vec![(a, b)],
            None => Vec::new(),
        }
    }
}

/// Where the read-ahead of `r` stops: the nearest start of another reader's run in its way
/// (`issue`), or never.
pub(super) fn stop_at(starts: &HashMap<u32, Vec<u64>>, r: &Reader) -> u64 {
    let own = r.run_from.min(r.win.start);
    starts
        .get(&r.m.idx)
        .into_iter()
        .flatten()
        // Another's start past its own, not read through by it: a reader that reached
        // another's start has read its share. Reached, not only ahead: its last pages and
        // the other's first ones show present up to 64 KiB early (the kernel maps the cached
        // pages around a fault, `fault_around_bytes`), so a reader at its share's end is seen
        // a little past the next one's start (measured: 16 pages; its window then ran on
        // through the start of the other's share, read seconds earlier and evicted since).
        .filter(|&&x| x > own.saturating_add(THROUGH) && x.saturating_add(THROUGH) > r.win.pos)
        .min()
        .copied()
        .unwrap_or(u64::MAX)
}

/// Read-ahead pieces a reader may have in flight: at first, and at most.
pub(super) const LEAD_MIN: u64 = 2;
pub(super) const LEAD_MAX: u64 = 16;

/// A reader that read this far from where it started started a run there; one that read this
/// far past another's start did not stop there.
pub(super) const THROUGH: u64 = 1 << 20;
