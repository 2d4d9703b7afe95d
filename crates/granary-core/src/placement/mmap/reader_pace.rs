//! How fast a reader consumes its file, and so how far ahead of it read-ahead may run.
//!
//! Read-ahead that arrived waits in the page cache until its reader comes. Under memory
//! pressure that wait is what gets it evicted: at the first reclaim under a memory cgroup's cap,
//! pages read ahead and not used yet go first, and when the readers slow down at that moment
//! (reclaim stalls their own allocations too) their read-ahead waited 1–2 s and was evicted
//! before they came, then faulted from the source again (page-cache tracepoints, 3 processes on
//! a 384 MiB LMDB under a 256 MiB cap: up to 11 MB a job). So what is issued ahead of a reader
//! is bounded by time as well as by the window: at most `AHEAD` of its measured rate past its
//! position, and never less than `FLOOR_PIECES` pieces (a reader that stood still a moment
//! must not have to fault the source itself when it moves on). A reader moving at its usual
//! pace is not held back: the windows are sized to memory, not to time, and hold about 0.3–0.5 s
//! of a reader's consumption at the source's speed.

use std::time::{Duration, Instant};

/// Read-ahead issued for a reader runs at most this long of its rate ahead of it.
pub const AHEAD: Duration = Duration::from_millis(500);
/// …and never less than this many pieces.
pub const FLOOR_PIECES: u64 = 2;
/// The rate follows a reader that speeds up within about this long…
const RISE: Duration = Duration::from_millis(100);
/// …and one that slows down within about this long.
const FALL: Duration = Duration::from_millis(250);
/// Forward moves larger than this in one look are jumps, not consumption.
const JUMP: u64 = 64 << 20;

/// A reader's consumption rate (bytes per second of forward progress), smoothed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pace {
    at: Option<(Instant, u64)>,
    rate: f64,
}

impl Pace {
    /// The reader was at `pos` at `now` (its furthest position since its last jump).
    pub fn observe(&mut self, now: Instant, pos: u64) {
        let Some((t, p)) = self.at else {
            self.at = Some((now, pos));
            return;
        };
        let dt = now.duration_since(t);
        if dt.is_zero() {
            return;
        }
        if pos < p || pos - p > JUMP {
            // Found elsewhere: a new baseline, the same reader's pace.
            self.at = Some((now, pos));
            return;
        }
        let inst = (pos - p) as f64 / dt.as_secs_f64();
        let tau = if inst > self.rate { RISE } else { FALL };
        let k = (dt.as_secs_f64() / tau.as_secs_f64()).min(1.0);
        self.rate += (inst - self.rate) * k;
        self.at = Some((now, pos));
    }

    /// The reader jumped to `pos`: progress is counted from there.
    pub fn jump(&mut self, now: Instant, pos: u64) {
        self.at = Some((now, pos));
    }

    /// Bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate as u64
    }

    /// How far past its position read-ahead may be issued for the reader, with pieces of
    /// `piece` bytes.
    pub fn ahead(&self, piece: u64) -> u64 {
        let by_time = (self.rate * AHEAD.as_secs_f64()) as u64;
        by_time.max(FLOOR_PIECES * piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_steady_reader_is_allowed_half_a_second_of_its_rate() {
        let t0 = Instant::now();
        let mut p = Pace::default();
        // 20 MB/s, looked at every 10 ms.
        for k in 0..200u64 {
            p.observe(at(t0, 10 * k), k * 200_000);
        }
        let r = p.rate();
        assert!((19_000_000..21_000_000).contains(&r), "{r}");
        let a = p.ahead(MB);
        assert!((9_500_000..10_500_000).contains(&a), "{a}");
    }

    #[test]
    fn a_reader_that_stops_is_soon_allowed_only_the_floor() {
        let t0 = Instant::now();
        let mut p = Pace::default();
        for k in 0..100u64 {
            p.observe(at(t0, 10 * k), k * 200_000);
        }
        let pos = 99 * 200_000;
        for k in 100..200u64 {
            p.observe(at(t0, 10 * k), pos);
        }
        assert_eq!(p.ahead(MB), FLOOR_PIECES * MB);
    }

    #[test]
    fn a_reader_that_moves_on_again_is_followed_within_a_few_looks() {
        let t0 = Instant::now();
        let mut p = Pace::default();
        p.observe(t0, 0);
        for k in 1..100u64 {
            p.observe(at(t0, 10 * k), 0);
        }
        assert_eq!(p.rate(), 0);
        // 60 MB/s from 1 s on: within 0.2 s most of it.
        for k in 0..20u64 {
            p.observe(at(t0, 1000 + 10 * k), k * 600_000);
        }
        assert!(p.rate() > 50_000_000, "{}", p.rate());
    }

    #[test]
    fn jumps_are_not_consumption() {
        let t0 = Instant::now();
        let mut p = Pace::default();
        p.observe(t0, 0);
        p.observe(at(t0, 10), 300 * MB);
        p.observe(at(t0, 20), 0);
        p.jump(at(t0, 30), 200 * MB);
        p.observe(at(t0, 40), 200 * MB);
        assert_eq!(p.rate(), 0);
    }
}
