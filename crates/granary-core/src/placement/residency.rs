//! Page-cache residency: which placed copies keep their pages in the page cache.
//!
//! The node's RAM is the fastest tier, but the kernel manages it, and its LRU is at its worst on
//! a training loop: a shuffled pass over a dataset larger than the cache evicts pages just
//! before they are needed again, so each epoch hits only a fraction of what the cache holds
//! (the benchmark's 346 MB of small files read from local disk in a 256 MiB cgroup: 139–233 MB
//! of misses per epoch, varying run to run and epoch to epoch).
//! The fill-highest-first policy applied to RAM does better: a fixed set of copies — as many
//! bytes as the cache can hold — stays *resident*; every other copy is *transient*: whoever
//! finishes reading it (the preload library at `close`, the agent after writing it) drops its
//! pages, so transient reads never push resident pages out. Each epoch then misses exactly the
//! transient bytes (docs/placement.md, "Page-cache residency").
//!
//! The budget follows the memory the page cache has (`memlimit::Probe`): the binding cgroup's
//! limit, or the node's memory, less everything that is not a file page, less a reserve. It is
//! re-measured every `REBALANCE_PERIOD`; when the program grows, resident copies are demoted
//! (their pages dropped), when room comes back, transient ones are promoted (their pages stay
//! from their next read on). A copy on a memory file system (a `/dev/shm` tier) is in RAM by
//! construction and never counted.

use std::time::Duration;

use crate::memlimit::{Probe, Room};
use crate::sync::atomic::{AtomicU64, Ordering};

/// How often the budget is re-measured and the resident set adjusted.
pub const REBALANCE_PERIOD: Duration = Duration::from_millis(500);
/// The page cache keeps this share of its room (and at least `MIN_RESERVE`) for what is not a
/// resident copy: the program's own files, pages being read or written, readahead. In the
/// benchmark's 256 MiB cgroup `granary status` showed 228.5 MiB of room, a 212.5 MiB target.
pub const RESERVE_SHARE: u64 = 16;
pub const MIN_RESERVE: u64 = 16 << 20;
/// Promotion waits until resident bytes are this share of the target below it, so a budget
/// that wobbles by a page does not flip copies back and forth.
pub const SLACK_SHARE: u64 = 32;

/// `[placement] page_cache`: `"auto"`, `"off"` or a size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Every copy may stay cached (the kernel decides, as without granary).
    Off,
    /// Measured from the memory limit (the default).
    #[default]
    Auto,
    /// A fixed number of bytes of resident copies.
    Fixed(u64),
}

impl Budget {
    /// `auto`, `off`, or a size like `200G` (`0`: every copy transient).
    pub fn parse(text: &str) -> Option<Budget> {
        match text.trim() {
            "auto" => Some(Budget::Auto),
            "off" => Some(Budget::Off),
            t => crate::size::parse_size(t).map(Budget::Fixed),
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Off => f.write_str("off"),
            Budget::Auto => f.write_str("auto"),
            Budget::Fixed(n) => f.write_str(&crate::size::format_size(*n)),
        }
    }
}

/// Bytes of resident copies the page cache can hold, given its room.
pub fn target_for(room: Room) -> u64 {
    let files = room.for_files();
    files.saturating_sub((files / RESERVE_SHARE).max(MIN_RESERVE))
}

/// The agent's residency state, shared by every source (they share the node's memory).
pub struct Residency {
    budget: Budget,
    probe: Probe,
    /// Bytes resident copies may take; `u64::MAX`: no limit.
    target: AtomicU64,
    /// Bytes of resident copies (PLACING or PLACED on a page-cache tier, not transient): raised
    /// by `admit`, recounted by every `rebalance`.
    resident: AtomicU64,
    /// The page cache's room at the last measurement (0: not measured).
    room: AtomicU64,
    pub demoted: AtomicU64,
    pub promoted: AtomicU64,
}

impl Residency {
    pub fn new(budget: Budget) -> Residency {
        let probe = if budget == Budget::Auto {
            Probe::find()
        } else {
            Probe::Node
        };
        let r = Residency {
            budget,
            probe,
            target: AtomicU64::new(u64::MAX),
            resident: AtomicU64::new(0),
            room: AtomicU64::new(0),
            demoted: AtomicU64::new(0),
            promoted: AtomicU64::new(0),
        };
        r.measure();
        r
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Re-measures the budget (`Auto`); returns the target.
    pub fn measure(&self) -> u64 {
        let target = match self.budget {
            Budget::Off => u64::MAX,
            Budget::Fixed(n) => n,
            Budget::Auto => match self.probe.sample() {
                Some(room) => {
                    self.room.store(room.for_files(), Ordering::Relaxed);
                    target_for(room)
                }
                None => u64::MAX,
            },
        };
        self.target.store(target, Ordering::Relaxed);
        target
    }

    pub fn target(&self) -> u64 {
        self.target.load(Ordering::Relaxed)
    }

    pub fn resident(&self) -> u64 {
        self.resident.load(Ordering::Relaxed)
    }

    /// The page cache's room at the last measurement (0 when not measured).
    pub fn room(&self) -> u64 {
        self.room.load(Ordering::Relaxed)
    }

    /// A copy of `size` bytes is about to be written: true if it may stay resident (its bytes
    /// are counted from now on), false if it is transient.
    pub fn admit(&self, size: u64) -> bool {
        let target = self.target();
        if target == u64::MAX {
            return true;
        }
        self.resident
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r.saturating_add(size) <= target).then_some(r + size)
            })
            .is_ok()
    }

    /// An admitted copy was not placed after all.
    pub fn forget(&self, size: u64) {
        let _ = self
            .resident
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(size))
            });
    }

    /// Re-measures the budget and moves copies across it; `dropped(set, entry)` is told of
    /// every PLACED copy demoted, whose pages the caller drops.
    pub fn rebalance<C: Copies>(&self, sets: &[C], dropped: impl FnMut(usize, u32)) -> Moves {
        let target = self.measure();
        let slack = if target == u64::MAX {
            0
        } else {
            target / SLACK_SHARE
        };
        let m = rebalance(sets, target, slack, dropped);
        self.resident.store(m.resident, Ordering::Relaxed);
        self.demoted.fetch_add(m.demoted, Ordering::Relaxed);
        self.promoted.fetch_add(m.promoted, Ordering::Relaxed);
        m
    }
}

/// A copy as residency sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyView {
    pub size: u64,
    /// Complete (PLACED); else still being written (PLACING), whose writer drops its pages.
    pub placed: bool,
}

/// The copies of one table.
pub trait Copies {
    fn count(&self) -> u32;
    /// Entry `i`'s copy if it is being written or complete on a page-cache tier.
    fn copy(&self, i: u32) -> Option<CopyView>;
    fn is_transient(&self, i: u32) -> bool;
    fn set_transient(&self, i: u32, transient: bool);
}

/// What one rebalance did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    /// Resident bytes afterwards.
    pub resident: u64,
    pub demoted: u64,
    pub promoted: u64,
}

/// Counts resident bytes; demotes copies from the end (last set, last entry) while they exceed
/// `target`; then, when they are more than `slack` below it, promotes transient PLACED copies
/// from the start while they fit in `target - slack` (a copy demoted a moment ago included, if
/// the demotions overshot). The order is fixed, so the resident set stays the same from one
/// call to the next unless the budget moves. `dropped` is told of the copies that end up
/// demoted and are complete, once all moves are decided.
pub fn rebalance<C: Copies>(
    sets: &[C],
    target: u64,
    slack: u64,
    mut dropped: impl FnMut(usize, u32),
) -> Moves {
    let mut m = Moves::default();
    for s in sets {
        for i in 0..s.count() {
            if let Some(c) = s.copy(i) {
                if !s.is_transient(i) {
                    m.resident += c.size;
                }
            }
        }
    }
    let mut demoted = Vec::new();
    'demote: for (k, s) in sets.iter().enumerate().rev() {
        for i in (0..s.count()).rev() {
            if m.resident <= target {
                break 'demote;
            }
            let Some(c) = s.copy(i) else { continue };
            if !s.is_transient(i) {
                s.set_transient(i, true);
                m.resident -= c.size;
                demoted.push((k, i, c.placed));
            }
        }
    }
    if m.resident.saturating_add(slack) < target {
        let room = target - slack;
        for s in sets {
            for i in 0..s.count() {
                let Some(c) = s.copy(i) else { continue };
                if c.placed && s.is_transient(i) && m.resident + c.size <= room {
                    s.set_transient(i, false);
                    m.resident += c.size;
                    m.promoted += 1;
                }
            }
        }
    }
    for (k, i, placed) in demoted {
        if sets[k].is_transient(i) {
            m.demoted += 1;
            if placed {
                dropped(k, i);
            }
        } else {
            m.promoted -= 1;
        }
    }
    m
}
