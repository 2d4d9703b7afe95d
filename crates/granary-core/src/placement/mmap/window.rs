//! When to read ahead of a reader, and what: the mmap pre-caching rules of Haderbache et al.
//! (Fujitsu), driven by what the reader touched instead of guard pages.
//!
//! Haderbache et al. put a checkpoint every *distance* bytes; the first checkpoint the reader hit
//! triggered a pre-cache of the next *size* bytes, and so did the first hit past the
//! *threshold* (75 %) of the last pre-cached range, each from where the last one ended. Here
//! the agent sees every page the reader touched (`follow`), so:
//!
//! - a reader is *streaming* once it has read one `distance` of new pages forward from where it
//!   was first seen (or from where it jumped to): only then is the next `size` read ahead, from
//!   its position. A reader that only touches scattered records (random `get`s) never is, and
//!   costs nothing; what a reader reads before that is their "non-cached distance", at
//!   most one `distance`;
//! - once the reader passes `threshold` of the last window, the next window is read from where
//!   that one ended (no overlap) to `size` ahead of the reader (a reader that caught up with
//!   its window gets a whole one again), or from the reader if it got ahead of it;
//! - a jump (the follower found the reader elsewhere: a new epoch, a seek) starts over;
//! - a reader found elsewhere again and again, each time after a run shorter than `SHORT_RUN`,
//!   reads scattered records (a shuffled pass over Arrow rows, random `get`s): `scattered`.

/// A run shorter than this before a jump is a scattered record, not a reader moving on: reading
/// a whole-file fetch's piece (1 MiB) where such a reader is finds little of what it reads next.
pub const SHORT_RUN: u64 = 1 << 20;
/// Jumps in a row after short runs that make a reader `scattered`.
const SHORT_RUNS: u32 = 2;

/// The parameters, in bytes (`threshold_pct` in percent of `size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub distance: u64,
    pub size: u64,
    pub threshold_pct: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    /// Not seen yet.
    #[default]
    Unseen,
    /// Seen at `anchor`; `run` bytes of new pages read forward from there.
    Probing { anchor: u64, run: u64 },
    /// Read ahead up to `front`; the next window starts when the reader passes `trigger`.
    Streaming { front: u64, trigger: u64 },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub phase: Phase,
    /// The furthest position seen since the last jump.
    pub pos: u64,
    /// Where the reader was found at the last jump: it read `[start, pos)` since.
    pub start: u64,
    /// Jumps in a row that ended runs shorter than `SHORT_RUN`.
    pub short_runs: u32,
}

impl Window {
    /// The reader was found at `pos`, away from where it was followed.
    pub fn jump(&mut self, pos: u64) {
        if self.phase != Phase::Unseen {
            self.short_runs = if self.pos.saturating_sub(self.start) < SHORT_RUN {
                self.short_runs.saturating_add(1)
            } else {
                0
            };
        }
        self.phase = Phase::Probing {
            anchor: pos,
            run: 0,
        };
        self.pos = pos;
        self.start = pos;
    }

    /// The reader continued to `pos` (the end of the run of pages it touched from its last
    /// position), touching `new` bytes of pages it had not touched before, in a file of `len`
    /// bytes. Returns the range to read ahead now, if any.
    pub fn advance(&mut self, pos: u64, new: u64, len: u64, s: &Shape) -> Option<(u64, u64)> {
        if self.phase == Phase::Unseen {
            self.jump(pos);
        }
        self.pos = self.pos.max(pos);
        let pos = self.pos;
        if pos.saturating_sub(self.start) >= SHORT_RUN {
            self.short_runs = 0;
        }
        let size = s.size.max(1);
        let window = |start: u64| {
            let end = start.saturating_add(size).min(len);
            let trigger = start + (end.saturating_sub(start)) * s.threshold_pct.min(100) / 100;
            (end, trigger)
        };
        match self.phase {
            Phase::Probing { anchor, run } => {
                let run = run + new;
                if run < s.distance.max(1) {
                    self.phase = Phase::Probing { anchor, run };
                    return None;
                }
                let (front, trigger) = window(pos);
                self.phase = Phase::Streaming { front, trigger };
                (pos < front).then_some((pos, front))
            }
            Phase::Streaming { front, trigger } if pos >= trigger && front.max(pos) < len => {
                // From where the last window ended, topped up to a whole window ahead of the
                // reader: a reader that caught up (its window was in flight when it passed the
                // threshold) never finds the next one shorter.
                let start = front.max(pos);
                let end = pos.saturating_add(size).min(len).max(start);
                let trigger = pos + (end - pos) * s.threshold_pct.min(100) / 100;
                self.phase = Phase::Streaming {
                    front: end,
                    trigger,
                };
                (start < end).then_some((start, end))
            }
            _ => None,
        }
    }

    /// The reader reads scattered records: its last jumps each ended a short run (what is read
    /// where it is is not what it reads next).
    pub fn scattered(&self) -> bool {
        self.short_runs >= SHORT_RUNS
    }

    /// Where read-ahead for this reader ends (0 before it streams).
    pub fn front(&self) -> u64 {
        match self.phase {
            Phase::Streaming { front, .. } => front,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;
    const S: Shape = Shape {
        distance: 8 * MB,
        size: 50 * MB,
        threshold_pct: 75,
    };

    /// A reader moving `step` bytes at a time from `start` to `end`: every window read ahead.
    fn walk(w: &mut Window, start: u64, end: u64, step: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = vec![];
        let mut p = start;
        w.jump(start);
        while p < end {
            p = (p + step).min(end);
            out.extend(w.advance(p, step, len, &S));
        }
        out
    }

    #[test]
    fn sequential_reader_is_read_ahead_without_gaps_or_overlap() {
        let len = 400 * MB;
        let mut w = Window::default();
        let got = walk(&mut w, 0, len, 256 << 10, len);
        // The first window starts where the reader was one distance after it was first seen.
        assert_eq!(got[0].0, 8 * MB);
        for pair in got.windows(2) {
            assert_eq!(pair[0].1, pair[1].0, "{got:?}");
        }
        assert_eq!(got.last().unwrap().1, len);
        assert!(got.iter().all(|&(a, b)| a < b && b - a <= S.size));
    }

    #[test]
    fn each_window_is_asked_for_before_the_reader_reaches_it() {
        let len = 400 * MB;
        let mut w = Window::default();
        w.jump(0);
        let mut p = 0;
        let mut asked_at = vec![];
        while p < len {
            p += MB;
            if let Some((a, _)) = w.advance(p, MB, len, &S) {
                asked_at.push((p, a));
            }
        }
        // After the first, every window starts at least a quarter of a window ahead.
        for &(p, a) in &asked_at[1..] {
            assert!(a >= p + S.size / 4 - MB, "{asked_at:?}");
        }
    }

    #[test]
    fn scattered_reads_never_trigger() {
        let len = 400 * MB;
        let rec = 192 << 10;
        let mut w = Window::default();
        let mut x = 12345u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (x >> 20) % (len / rec) * rec;
            w.jump(at);
            assert_eq!(w.advance(at + rec, rec, len, &S), None);
        }
        assert!(w.scattered());
    }

    #[test]
    fn scattered_records_make_a_scattered_reader_and_a_run_ends_it() {
        let len = 400 * MB;
        let rec = 100 << 10;
        let mut w = Window::default();
        // First seen, then one record elsewhere: not yet.
        w.advance(10 * MB + rec, rec, len, &S);
        assert!(!w.scattered());
        w.jump(300 * MB);
        w.advance(300 * MB + rec, rec, len, &S);
        assert!(!w.scattered());
        w.jump(120 * MB);
        assert!(w.scattered());
        // It reads on from there: a run of its own.
        w.advance(120 * MB + 2 * MB, 2 * MB, len, &S);
        assert!(!w.scattered());
        // A sequential reader that starts over (the next epoch) is not.
        let mut w = Window::default();
        walk(&mut w, 0, 40 * MB, MB, len);
        walk(&mut w, 0, 40 * MB, MB, len);
        assert!(!w.scattered());
    }

    #[test]
    fn a_reader_starting_mid_file_is_read_ahead_from_where_it_is() {
        let len = 400 * MB;
        let mut w = Window::default();
        let got = walk(&mut w, 200 * MB, 300 * MB, MB, len);
        assert!(got.iter().all(|&(a, _)| a >= 200 * MB), "{got:?}");
        assert_eq!(got[0].0, 208 * MB);
    }

    #[test]
    fn the_next_epoch_is_followed_again() {
        let len = 100 * MB;
        let mut w = Window::default();
        let first = walk(&mut w, 0, len, MB, len);
        let second = walk(&mut w, 0, len, MB, len);
        assert_eq!(first, second);
        assert_eq!(second[0], (8 * MB, 58 * MB));
    }

    #[test]
    fn a_reader_ahead_of_the_window_gets_the_next_from_where_it_is() {
        let len = 400 * MB;
        let mut w = Window::default();
        w.jump(0);
        assert_eq!(w.advance(8 * MB, 8 * MB, len, &S), Some((8 * MB, 58 * MB)));
        assert_eq!(
            w.advance(70 * MB, 62 * MB, len, &S),
            Some((70 * MB, 120 * MB))
        );
        assert_eq!(w.front(), 120 * MB);
    }

    #[test]
    fn nothing_past_the_end() {
        let mut w = Window::default();
        let got = walk(&mut w, 0, 30 * MB, MB, 30 * MB);
        assert_eq!(got, vec![(8 * MB, 30 * MB)]);
    }
}
