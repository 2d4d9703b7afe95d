//! What the agent has in flight at the source, and how much it may have.
//!
//! A read the agent issues waits at the source (a PFS client's queue, a throttled device's FIFO)
//! behind everything issued before it, and so does the program's own read of a page that a
//! queued read covers: the kernel makes it wait for that read (killable only). A read-ahead
//! window of 50 MiB issued at once at a 64 MiB/s source makes the program's next fault — or a
//! new mapping's first one — wait most of a second; at 1.5 MiB/s, half a minute. So read-ahead
//! is issued a piece at a time, as the reader advances, and only while what the agent has in
//! flight at the source is below about `IN_FLIGHT` of the source's measured bandwidth: enough
//! to keep the source busy between two looks of the follower, little enough that a read issued
//! now is served within that time. Pages read ahead stay untouched for that long only, too, so
//! under memory pressure the kernel does not evict them before the reader gets there (it evicts
//! unreferenced pages first: read-ahead pages, not the pages readers already mapped).
//!
//! In flight: the whole-file fetches' synchronous reads (counted from the call to its return)
//! and the read-ahead pieces issued and not yet in the page cache (`mincore` says a page is
//! there once its read completed). The bandwidth is what completed per second while something
//! was in flight.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{lock, Mutex};

/// The source's time worth of bytes the agent keeps in flight.
pub const IN_FLIGHT: Duration = Duration::from_millis(64);
/// Never less in flight than this (a slow source still gets whole requests)…
pub const MIN_BYTES: u64 = 256 << 10;
/// …and read-ahead pieces between these sizes (the kernel issues each as one request).
pub const MIN_PIECE: u64 = 128 << 10;
pub const MAX_PIECE: u64 = 1 << 20;
/// The bandwidth assumed before anything was measured.
const INITIAL_BPS: u64 = 32 << 20;
/// Bandwidth is sampled over busy spells at least this long.
const SAMPLE: Duration = Duration::from_millis(200);
/// A piece not seen complete after this long is taken for done (its pages were read and
/// already evicted, or the reader's own fault read them).
const STALE: Duration = Duration::from_secs(3);

/// One read-ahead piece: entry `idx`, `[off, off + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub idx: u32,
    pub off: u64,
    pub len: u64,
    pub at: Instant,
}

#[derive(Debug, Default)]
struct Pieces {
    q: VecDeque<Piece>,
    bytes: u64,
}

#[derive(Debug)]
pub struct Flight {
    /// Bytes of synchronous reads in flight.
    sync: AtomicU64,
    /// Bytes completed, ever (synchronous reads returned, pieces retired).
    completed: AtomicU64,
    /// Estimated bandwidth, bytes per second.
    bps: AtomicU64,
    pieces: Mutex<Pieces>,
    /// The current sample: since when something was in flight, and `completed` then.
    sample: Mutex<Option<(Instant, u64)>>,
}

impl Default for Flight {
    fn default() -> Flight {
        Flight {
            sync: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            bps: AtomicU64::new(INITIAL_BPS),
            pieces: Mutex::new(Pieces::default()),
            sample: Mutex::new(None),
        }
    }
}

/// A synchronous read in flight until dropped.
pub struct SyncRead<'a> {
    f: &'a Flight,
    n: u64,
}

impl Drop for SyncRead<'_> {
    fn drop(&mut self) {
        self.f.sync.fetch_sub(self.n, Ordering::Relaxed);
        self.f.completed.fetch_add(self.n, Ordering::Relaxed);
    }
}

impl Flight {
    /// A synchronous read of `n` bytes from the source starts; it ends when the guard drops.
    pub fn sync_read(&self, n: u64) -> SyncRead<'_> {
        self.sync.fetch_add(n, Ordering::Relaxed);
        SyncRead { f: self, n }
    }

    /// Bytes the programs read from the source themselves (pages they faulted that no read of
    /// the agent asked for): they took the source's time too. Without them, the agent would take
    /// its own share for the source's bandwidth, keep less in flight, leave the programs more
    /// to fault, and measure less still.
    pub fn observed(&self, n: u64) {
        self.completed.fetch_add(n, Ordering::Relaxed);
    }

    /// The estimated bandwidth of the source (bytes per second).
    pub fn bps(&self) -> u64 {
        self.bps.load(Ordering::Relaxed)
    }

    /// What may be in flight at once.
    pub fn cap(&self) -> u64 {
        cap_for(self.bps())
    }

    /// The size of one read-ahead piece, and of a fetch's reads while programs map the source.
    pub fn piece(&self) -> u64 {
        piece_for(self.cap())
    }

    /// What may be in flight while readers wait for read-ahead that want `pieces` pieces in
    /// flight between them (at least two each, more for a reader that outran its read-ahead:
    /// `mod.rs`), so that a reader that reaches the piece it waited for finds the next one issued
    /// (else it faults the source itself, in the kernel's small requests).
    pub fn cap_for_readers(&self, pieces: u64) -> u64 {
        let cap = self.cap();
        cap.max(pieces * piece_for(cap))
    }

    /// Bytes in flight now.
    pub fn in_flight(&self) -> u64 {
        self.sync.load(Ordering::Relaxed) + lock(&self.pieces).bytes
    }

    /// Room for read-ahead now, readers wanting `pieces` pieces in flight: what may still be
    /// issued. Some is always allowed while no read-ahead is in flight (a fetch's reads do not
    /// starve the readers).
    pub fn room(&self, pieces: u64) -> u64 {
        let p = lock(&self.pieces);
        let used = self.sync.load(Ordering::Relaxed) + p.bytes;
        let cap = self.cap_for_readers(pieces);
        if p.bytes == 0 {
            cap.saturating_sub(used).max(piece_for(cap))
        } else {
            cap.saturating_sub(used)
        }
    }

    /// A read-ahead piece was issued.
    pub fn issued(&self, p: Piece) {
        let mut q = lock(&self.pieces);
        q.bytes += p.len;
        q.q.push_back(p);
    }

    /// Retires the pieces that completed: `done(piece)` says whether its last page is in the
    /// page cache. The source serves its queue in order, so a piece seen complete completes
    /// every piece issued before it. Then updates the bandwidth estimate.
    pub fn retire(&self, now: Instant, mut done: impl FnMut(&Piece) -> bool) -> Vec<Piece> {
        let mut q = lock(&self.pieces);
        let newest_done =
            q.q.iter()
                .rposition(|p| done(p) || now.duration_since(p.at) >= STALE);
        let mut gone = Vec::new();
        if let Some(k) = newest_done {
            gone.extend(q.q.drain(..=k));
            let bytes: u64 = gone.iter().map(|p| p.len).sum();
            q.bytes -= bytes;
            self.completed.fetch_add(bytes, Ordering::Relaxed);
        }
        let busy = q.bytes + self.sync.load(Ordering::Relaxed) > 0;
        drop(q);
        self.sample_at(now, busy);
        gone
    }

    fn sample_at(&self, now: Instant, busy: bool) {
        let completed = self.completed.load(Ordering::Relaxed);
        let mut s = lock(&self.sample);
        match *s {
            None if busy => *s = Some((now, completed)),
            None => {}
            Some((t0, c0)) => {
                let dt = now.duration_since(t0);
                if dt >= SAMPLE {
                    let got = completed.saturating_sub(c0);
                    // Only samples that saw the source kept busy tell its bandwidth; a spell
                    // that ended idle only says it is at least this fast.
                    let rate = (got as f64 / dt.as_secs_f64()) as u64;
                    // Up quickly, down slowly: a spell in which the source served something else
                    // as well (another program's reads) says less than the source can do.
                    let old = self.bps();
                    let new = if rate >= old {
                        (old + rate) / 2
                    } else if busy {
                        old - (old - rate) / 8
                    } else {
                        old
                    };
                    if got > 0 {
                        self.bps.store(new.max(1), Ordering::Relaxed);
                    }
                    *s = busy.then_some((now, completed));
                } else if !busy && completed == c0 {
                    *s = None;
                }
            }
        }
    }
}

/// What may be in flight at a source of `bps` bytes per second.
pub fn cap_for(bps: u64) -> u64 {
    let b = (bps as u128 * IN_FLIGHT.as_millis() / 1000) as u64;
    b.max(MIN_BYTES)
}

/// One read-ahead piece under `cap`: half of it, in whole 128 KiB, within the bounds. Large
/// pieces matter: a source limited in requests per second serves small ones slower.
pub fn piece_for(cap: u64) -> u64 {
    (cap / 2 / MIN_PIECE * MIN_PIECE).clamp(MIN_PIECE, MAX_PIECE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn piece(off: u64, at: Instant) -> Piece {
        Piece {
            idx: 0,
            off,
            len: MB,
            at,
        }
    }

    #[test]
    fn cap_and_piece_follow_the_bandwidth() {
        // 64 MiB/s: about 4 MiB in flight, in 1 MiB pieces.
        assert_eq!(cap_for(64 * MB), 64 * MB * 64 / 1000);
        assert_eq!(piece_for(cap_for(64 * MB)), MB);
        // 1.5 MiB/s: the floor, in 128 KiB pieces — a read waits a fraction of a second.
        assert_eq!(cap_for(3 * MB / 2), MIN_BYTES);
        assert_eq!(piece_for(cap_for(3 * MB / 2)), MIN_PIECE);
        // 2 GB/s: 1 MiB pieces, many in flight.
        assert!(cap_for(2 << 30) > 100 * MB);
        assert_eq!(piece_for(cap_for(2 << 30)), MB);
    }

    #[test]
    fn a_piece_seen_complete_retires_those_before_it() {
        let f = Flight::default();
        let t = Instant::now();
        for k in 0..4 {
            f.issued(piece(k * MB, t));
        }
        assert_eq!(f.in_flight(), 4 * MB);
        f.retire(t, |p| p.off == 2 * MB);
        assert_eq!(f.in_flight(), MB);
        // Evicted before seen: taken for done after a while.
        f.retire(t + STALE, |_| false);
        assert_eq!(f.in_flight(), 0);
    }

    #[test]
    fn room_counts_synchronous_reads_but_never_starves_read_ahead() {
        let f = Flight::default();
        let cap = f.cap();
        let g = f.sync_read(cap * 2);
        assert_eq!(f.room(2), f.piece());
        f.issued(piece(0, Instant::now()));
        assert_eq!(f.room(2), 0);
        drop(g);
        assert_eq!(f.room(2), cap - MB);
        // Many readers: the pieces they want.
        assert_eq!(f.room(16), 16 * f.piece() - MB);
    }

    #[test]
    fn bandwidth_is_what_completes_while_busy() {
        let f = Flight::default();
        let t = Instant::now();
        // A source serving 10 MiB/s: a piece completes every 100 ms, one always queued.
        for k in 0..80u64 {
            let now = t + Duration::from_millis(100 * k);
            f.issued(piece(k * MB, now));
            f.retire(now, |p| p.off + MB <= k * MB);
        }
        let bps = f.bps();
        assert!((9 * MB..12 * MB).contains(&bps), "{bps}");
    }
}
