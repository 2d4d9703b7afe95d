//! What a rank knows of the others: when each was last heard from (any message counts; every
//! rank sends a heartbeat every `BEAT_PERIOD`), and the numbers of its last heartbeat.
//!
//! A rank not heard from for `SUSPECT_AFTER`, or whose transfer just timed out, is down: nothing
//! is asked of it (its files come from a replica or the source) until it is heard from again.
//! So a rank that is stopped (SIGSTOP), hung or dead costs each other rank one bounded wait,
//! and one that comes back is used again after its next heartbeat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::wire::Beat;

pub const BEAT_PERIOD: Duration = Duration::from_millis(250);
pub const SUSPECT_AFTER: Duration = Duration::from_millis(3000);

pub struct Peers {
    me: u32,
    start: Instant,
    /// Per rank: milliseconds since `start` when last heard from, + 1 (0: written off).
    heard: Vec<AtomicU64>,
    beats: Vec<Mutex<Beat>>,
}

impl Peers {
    pub fn new(me: u32, ranks: u32) -> Peers {
        Peers {
            me,
            start: Instant::now(),
            // Everyone counts as alive at start: the catalog broadcast just reached them all.
            heard: (0..ranks).map(|_| AtomicU64::new(1)).collect(),
            beats: (0..ranks).map(|_| Mutex::default()).collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// A message from `rank` arrived.
    pub fn heard(&self, rank: u32) {
        if let Some(h) = self.heard.get(rank as usize) {
            h.store(self.now_ms(), Ordering::Release);
        }
    }

    /// A heartbeat from `rank`.
    pub fn beat(&self, rank: u32, b: Beat) {
        self.heard(rank);
        if let Some(m) = self.beats.get(rank as usize) {
            *m.lock().unwrap_or_else(|e| e.into_inner()) = b;
        }
    }

    /// `rank` did not deliver in time: down until heard from again.
    pub fn failed(&self, rank: u32) {
        if rank == self.me {
            return;
        }
        if let Some(h) = self.heard.get(rank as usize) {
            if h.swap(0, Ordering::AcqRel) != 0 {
                tracing::warn!("rank {rank} did not answer in time: its files come from elsewhere until it is heard from again");
            }
        }
    }

    /// How long ago `rank` was heard from (`None`: written off since).
    pub fn silence(&self, rank: u32) -> Option<Duration> {
        let h = self.heard.get(rank as usize)?.load(Ordering::Acquire);
        (h != 0).then(|| Duration::from_millis(self.now_ms().saturating_sub(h)))
    }

    pub fn alive(&self, rank: u32) -> bool {
        rank == self.me || self.silence(rank).is_some_and(|s| s < SUSPECT_AFTER)
    }

    pub fn last_beat(&self, rank: u32) -> Beat {
        self.beats
            .get(rank as usize)
            .map(|m| *m.lock().unwrap_or_else(|e| e.into_inner()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rank_is_down_until_heard_from() {
        let p = Peers::new(0, 3);
        assert!(p.alive(1) && p.alive(2));
        p.failed(1);
        assert!(!p.alive(1) && p.alive(2));
        p.failed(0);
        assert!(p.alive(0), "a rank never writes itself off");
        p.heard(1);
        assert!(p.alive(1));
        p.beat(
            2,
            Beat {
                jobs: 3,
                ..Beat::default()
            },
        );
        assert_eq!(p.last_beat(2).jobs, 3);
        assert!(!p.alive(7) && p.silence(7).is_none(), "no such rank");
    }
}
