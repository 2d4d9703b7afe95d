//! The partition streamer of one table as the agent holds it (`Streamer`, `SourceCtx::pack`):
//! the pack's segments, which are this node's, which are done, and the partition files opened;
//! what streams them is `pack_streamer`'s.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::time::Duration;

use granary_shm::Table;

use crate::packed_source::damage::Damage;
use crate::packed_source::Partitions;
use crate::placement::buffers::DIRECT_ALIGN;
use crate::placement::work::Work;
use crate::stats::{AgentCounters, PackDamage};
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{lock, Arc, Condvar, Mutex};
use crate::sys;

pub(super) const TODO: u8 = 0;
pub(super) const TAKEN: u8 = 1;
pub(super) const DONE: u8 = 2;
/// Taken, and asked for again meanwhile (a file it did not place then): streamed once more.
pub(super) const AGAIN: u8 = 3;
pub(super) const NONE: u32 = u32::MAX;
/// Most stored bytes one segment spans (unless one file is larger): what a program waiting for
/// one file makes the source read first. A shuffled first epoch waits on one file after
/// another, so what it gets is as many files a second as the source serves such reads: a read
/// should cost the source no more than its request does. The emulated PFS of the benchmark
/// serves 67 MB/s and 150 requests/s — one request's worth is ~450 KB — so segments of up to
/// 512 KiB (~450 KB on average for 110 KB files) are served at the request rate, at full
/// bandwidth, where 1 MiB ones came at 64 a second (docs/decisions.md, "Packs").
const SEGMENT_SPAN: u64 = 512 << 10;

/// After a segment a program waited on, how long a streamer waits for that program's next
/// request before it starts a sweep read. A shuffled first epoch's loader asks for one file
/// after another: its next request comes within a millisecond of its copy's publication,
/// while a sweep read started in that gap holds the source for a whole `block` (125 ms for
/// the default 8 MiB at the benchmark's 64 MiB/s), and the program waits behind it. A program that does
/// not ask again costs the sweep this much once per waited-for segment. Shuttle cannot time a
/// wait out (`crate::sync`): none there.
const URGENT_GRACE: Option<Duration> = if cfg!(feature = "shuttle") {
    None
} else {
    Some(Duration::from_millis(2))
};

pub(super) struct Segment {
    pub(super) part: u32,
    /// Stored bytes `[start, end)` of the partition file.
    pub(super) start: u64,
    pub(super) end: u64,
    /// Into `Streamer::members`.
    pub(super) members: Range<u32>,
}

pub(super) enum PartFile {
    Unopened,
    Open(Arc<File>),
    /// The partition does not match the index (or cannot be opened): never read.
    Refused,
}

/// The partition streamer of one table (`SourceCtx::pack`).
pub struct Streamer {
    pub(super) pack: Partitions,
    pub(super) block: u64,
    pub(super) segments: Vec<Segment>,
    /// Table entries, grouped by segment, in data order.
    pub(super) members: Vec<u32>,
    /// Segment of each table entry (`NONE`: not packed).
    pub(super) segment_of: Vec<u32>,
    /// Per table entry: this node streams it (every packed file on one node; in cluster mode
    /// the files it owns, and those it took over from nodes that could not send them).
    pub(super) mine: Vec<AtomicBool>,
    pub(super) seg_state: Vec<AtomicU8>,
    /// Each partition's segments, and the next one its sweep looks at.
    pub(super) parts: Vec<Range<u32>>,
    cursor: Vec<AtomicUsize>,
    started: Vec<AtomicBool>,
    files: Vec<Mutex<PartFile>>,
    /// Segments a program waits on, first come first served.
    pub(super) urgent: Mutex<VecDeque<u32>>,
    pub(super) wake: Condvar,
    /// Partitions refused and files found damaged, for the jobs' reports.
    pub(super) damage: Damage,
    /// Segments not done; while any are, the table has placement work pending (`SourceCtx::work`).
    pub(super) remaining: AtomicUsize,
    held: AtomicBool,
}

impl Streamer {
    /// Segments of every packed file of `table` (the locators), cut at `SEGMENT_SPAN` bytes
    /// (at most `block`), read by sweeps of up to `block` bytes.
    pub fn new(table: &Table, pack: Partitions, block: u64) -> Streamer {
        let block = block.max(DIRECT_ALIGN as u64);
        let span = block.min(SEGMENT_SPAN);
        let n = table.entry_count();
        let mut files: Vec<(u32, u64, u64, u32)> = (0..n)
            .filter_map(|i| {
                let l = table.locator(i)?;
                Some((l.partition, l.offset, l.offset + l.stored_len, i))
            })
            .collect();
        files.sort_unstable();
        let parts_n = pack.records.len();
        let mut segments: Vec<Segment> = Vec::new();
        let mut members = Vec::with_capacity(files.len());
        let mut segment_of = vec![NONE; n as usize];
        for (part, start, end, idx) in files {
            let extend = segments.last().is_some_and(|s| {
                s.part == part && start >= s.start && end.max(s.end) - s.start <= span
            });
            if !extend {
                let at = members.len() as u32;
                segments.push(Segment {
                    part,
                    start,
                    end,
                    members: at..at,
                });
            }
            let seg = segments.len() - 1;
            let s = &mut segments[seg];
            s.end = s.end.max(end);
            members.push(idx);
            s.members.end = members.len() as u32;
            segment_of[idx as usize] = seg as u32;
        }
        let mut parts = vec![0u32..0u32; parts_n];
        for (k, s) in segments.iter().enumerate() {
            if let Some(r) = parts.get_mut(s.part as usize) {
                if r.start == r.end {
                    *r = k as u32..k as u32;
                }
                r.end = k as u32 + 1;
            }
        }
        let count = segments.len();
        Streamer {
            pack,
            block,
            seg_state: (0..count).map(|_| AtomicU8::new(TODO)).collect(),
            segments,
            members,
            segment_of,
            mine: (0..n).map(|_| AtomicBool::new(true)).collect(),
            cursor: parts
                .iter()
                .map(|r| AtomicUsize::new(r.start as usize))
                .collect(),
            started: (0..parts_n).map(|_| AtomicBool::new(false)).collect(),
            files: (0..parts_n)
                .map(|_| Mutex::new(PartFile::Unopened))
                .collect(),
            parts,
            urgent: Mutex::default(),
            wake: Condvar::new(),
            damage: Damage::default(),
            remaining: AtomicUsize::new(count),
            held: AtomicBool::new(false),
        }
    }

    /// Segments in all (for the log).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// The pack's partitions as this streamer opens and checks them.
    pub fn partitions(&self) -> &Partitions {
        &self.pack
    }

    /// What was found damaged in the pack so far (`None`: nothing).
    pub fn damage(&self) -> Option<PackDamage> {
        self.damage.report(&self.pack.dir)
    }

    /// Files of the table in partition `n`.
    fn files_in(&self, n: u32) -> u64 {
        let Some(r) = self.parts.get(n as usize) else {
            return 0;
        };
        self.segments[r.start as usize..r.end as usize]
            .iter()
            .map(|s| u64::from(s.members.end - s.members.start))
            .sum()
    }

    /// Cluster mode, before `spawn`: this node streams only the entries `mine` says it owns;
    /// segments without one are never read here.
    pub fn restrict(&self, mine: impl Fn(u32) -> bool) {
        for (i, m) in self.mine.iter().enumerate() {
            m.store(mine(i as u32), Ordering::Release);
        }
        for (k, s) in self.segments.iter().enumerate() {
            let members = &self.members[s.members.start as usize..s.members.end as usize];
            if !members.iter().any(|&i| self.streams(i))
                && self.seg_state[k]
                    .compare_exchange(TODO, DONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.remaining.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// True if this node streams entry `idx` itself.
    pub fn streams(&self, idx: u32) -> bool {
        self.mine
            .get(idx as usize)
            .is_some_and(|m| m.load(Ordering::Acquire))
    }

    /// Wakes the idle streamers (the table was retired: they stop now, not at their next
    /// timeout).
    pub fn wake_all(&self) {
        let _q = lock(&self.urgent);
        self.wake.notify_all();
    }

    pub(super) fn urge(&self, seg: u32) {
        lock(&self.urgent).push_back(seg);
        self.wake.notify_all();
    }

    pub(super) fn hold(&self, work: &Work) {
        if !self.held.swap(true, Ordering::AcqRel) {
            work.hold();
        }
        // Retiring waits for the work held to drain: never hold a retired table.
        if work.is_retired() {
            self.unhold(work);
        }
    }

    pub(super) fn unhold(&self, work: &Work) {
        if self.held.swap(false, Ordering::AcqRel) {
            work.release();
        }
    }

    pub(super) fn take(&self, seg: u32) -> bool {
        self.seg_state[seg as usize]
            .compare_exchange(TODO, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(super) fn done(&self, work: &Work, seg: u32) {
        let st = &self.seg_state[seg as usize];
        loop {
            let cas = |from, to| {
                st.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            };
            if cas(AGAIN, TODO) {
                self.urge(seg);
                return;
            }
            if cas(TAKEN, DONE) {
                break;
            }
            if !matches!(st.load(Ordering::Acquire), TAKEN | AGAIN) {
                return; // not taken (cannot happen): nothing to count
            }
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.unhold(work);
        }
    }

    /// The next segments for a streamer sweeping `current`: a segment a program waits on,
    /// else the next of the current partition with as many after it as one `block` read
    /// spans, else the first of a partition nobody sweeps. All taken, all of one partition.
    /// `after_urgent`: the caller just streamed a segment a program waited on; the sweep then
    /// waits up to `URGENT_GRACE` for the program's next one first. Segments a program waits
    /// on are marked `true`.
    pub(super) fn next(
        &self,
        current: &mut Option<usize>,
        after_urgent: bool,
    ) -> Option<(Range<u32>, bool)> {
        let mut q = lock(&self.urgent);
        let mut grace = URGENT_GRACE.filter(|_| after_urgent);
        loop {
            while let Some(seg) = q.pop_front() {
                if self.take(seg) {
                    return Some((seg..seg + 1, true));
                }
            }
            let Some(wait) = grace.take() else { break };
            q = match self.wake.wait_timeout(q, wait) {
                Ok((q, _)) => q,
                Err(e) => e.into_inner().0,
            };
        }
        drop(q);
        loop {
            if let Some(p) = *current {
                let r = &self.parts[p];
                loop {
                    let c = self.cursor[p].fetch_add(1, Ordering::AcqRel);
                    if c >= r.end as usize {
                        break;
                    }
                    if self.take(c as u32) {
                        let first = c as u32;
                        let mut end = first + 1;
                        while end < r.end
                            && self.segments[end as usize].end - self.segments[first as usize].start
                                <= self.block
                            && self.take(end)
                        {
                            end += 1;
                        }
                        self.cursor[p].fetch_max(end as usize, Ordering::AcqRel);
                        return Some((first..end, false));
                    }
                }
                *current = None;
            }
            let p =
                (0..self.parts.len()).find(|&p| !self.started[p].swap(true, Ordering::AcqRel))?;
            *current = Some(p);
        }
    }

    /// Partition `n`, opened and checked against the index once (header, pack id, length).
    pub(super) fn part_file(&self, counters: &AgentCounters, n: u32) -> Option<Arc<File>> {
        let mut f = lock(self.files.get(n as usize)?);
        match &*f {
            PartFile::Open(file) => return Some(file.clone()),
            PartFile::Refused => return None,
            PartFile::Unopened => {}
        }
        let path = self.pack.partition_path(n);
        let rec = self.pack.records.get(n as usize).copied()?;
        // No readahead from the first read on (the header's): a window the kernel opened
        // then goes on reading ahead of later reads whatever they advise, past the runs this
        // node reads — into other nodes' bytes, in cluster mode (`SourceReader`).
        let opened = File::open(&path).map_err(|e| granary_pack::PackError::io(&path, e));
        let checked = opened.and_then(|f| {
            sys::fadvise(&f, 0, 0, libc::POSIX_FADV_RANDOM);
            granary_pack::partition::check(f, &path, n, &self.pack.header, &rec)
        });
        match checked {
            Ok(p) => {
                AgentCounters::add(&counters.source_opens, 1);
                let file = Arc::new(p.file);
                *f = PartFile::Open(file.clone());
                Some(file)
            }
            Err(e) => {
                tracing::warn!("{e}; its files are served from the source");
                self.damage.partition(n, self.files_in(n), e.to_string());
                *f = PartFile::Refused;
                None
            }
        }
    }
}
