//! The order in which a whole-file fetch reads its file: from the start, in sequence, while no
//! program maps it; behind the programs that map it, while some do.
//!
//! A program reading through a mapping faults the source's pages itself (and the agent reads
//! ahead of it, `placement::mmap`); the fetch reads through the page cache, so what the
//! reader just read is what the fetch finds there — as long as it is still there. So, while
//! readers are known:
//!
//! - a reader the agent does not read ahead of (it has not read one distance in sequence yet:
//!   it just mapped the file) is served where it is, up to one distance ahead of it (the fetch
//!   reads those bytes for the copy anyway); a reader of scattered records (`scattered`: runs
//!   shorter than a piece, one place after another) is not: what lies past the record it just
//!   read is not what it reads next, and under a page cache too small for the mapped files the
//!   kernel evicts those pages (read once, on its inactive list) before the reader comes. Read
//!   for it, they cost the source a request each and saved the program none (a shuffled pass
//!   over 322 MB of Arrow shards under a 256 MiB cap: the fetch read 243 MB in 311 requests
//!   while the program faulted as many as directly); it faults its records itself, as without
//!   granary, and the copy takes what it faulted (`cached`) or waits for it to stop;
//! - otherwise the next read is the missing piece nearest behind a reader among what it read lately (the
//!   pages most likely still cached: the copy costs the source nothing more), the reader with
//!   the nearest such piece first — readers starting mid-file, or several readers in different
//!   parts of the file (MPI-Caffe's contiguous shares), are each copied where they are;
//! - but first, what is all in the page cache already around a reader — what the agent read ahead
//!   of it, once it arrived, and what it read itself — is copied (`cached`): the copy costs the
//!   source nothing while those pages are there, and under memory pressure the kernel evicts
//!   read-ahead pages and pages a reader consumed within a second or two. A copy behind the
//!   readers found them gone and read them again (measured: 6–15 % of a 384 MiB LMDB read by 3
//!   processes under a 256 MiB cap);
//! - nothing ahead of a reader that is not in the page cache, and nothing it did not read, is
//!   read by the fetch meanwhile: what is read ahead of a reader is read once, for the reader;
//! - when no reader moved for a while, the rest is read in sequence.

/// A program reading the file through a mapping, as the agent follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reader {
    /// Where it started reading in sequence (where it was found last), and where it is.
    pub from: u64,
    pub pos: u64,
    /// The agent reads ahead of it (it has read one distance in sequence).
    pub streaming: bool,
    /// Where what the agent read ahead of it ends (`pos` when nothing was).
    pub ahead: u64,
    /// It reads scattered records (`mmap::Window::scattered`): nothing is read where it is.
    pub scattered: bool,
}

/// What to read next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// `[off, off + len)`, and whether its pages stay cached: a reader needs them or brought
    /// them in (`keep_cached`), or only the copy needed them.
    Read { off: u64, len: u64, keep: bool },
    /// Everything left is ahead of the readers' windows: wait for them to move.
    Wait,
    /// The whole file was read.
    Done,
}

#[derive(Clone, Debug)]
pub struct Order {
    unit: u64,
    size: u64,
    done: Vec<bool>,
    /// Units done from the start.
    prefix: usize,
    /// Where sequential reading continues.
    cursor: usize,
}

impl Order {
    /// A file of `size` bytes read in pieces of `unit`; `holes` (ranges without data) need no
    /// read where they cover whole pieces.
    pub fn new(size: u64, unit: u64, data: &[(u64, u64)]) -> Order {
        let unit = unit.max(4096);
        let n = size.div_ceil(unit) as usize;
        let done = (0..n)
            .map(|u| {
                let (a, b) = (u as u64 * unit, ((u as u64 + 1) * unit).min(size));
                !data.iter().any(|&(s, e)| s < b && a < e)
            })
            .collect();
        let mut o = Order {
            unit,
            size,
            done,
            prefix: 0,
            cursor: 0,
        };
        o.advance_prefix();
        o
    }

    fn advance_prefix(&mut self) {
        while self.done.get(self.prefix) == Some(&true) {
            self.prefix += 1;
        }
    }

    /// Bytes done from the start (what the part holds for readers of it).
    pub fn prefix_bytes(&self) -> u64 {
        (self.prefix as u64 * self.unit).min(self.size)
    }

    pub fn complete(&self) -> bool {
        self.prefix == self.done.len()
    }

    fn undone_from(&self, u: usize) -> Option<usize> {
        (u..self.done.len()).find(|&k| !self.done[k])
    }

    /// The run of missing pieces from unit `u`, at most `max` bytes, ending before `limit`.
    fn run(&self, u: usize, max: u64, limit: u64) -> (u64, u64) {
        let off = u as u64 * self.unit;
        let mut end = off;
        let mut k = u;
        while k < self.done.len() && !self.done[k] && end - off < max && end < limit {
            end = ((k as u64 + 1) * self.unit).min(self.size);
            k += 1;
        }
        (off, end.min(self.size).max(off + 1).min(self.size) - off)
    }

    /// The next read, given the readers, how far behind a reader its pages are still cached
    /// (`window`) and how far ahead of one that is not read ahead of yet the fetch reads for it
    /// (`lead`), and whether they all stopped moving. `max`: the largest read. `cached(off,
    /// len)`: every page of `[off, off + len)` is in the page cache now.
    pub fn next(
        &self,
        readers: &[Reader],
        window: u64,
        lead: u64,
        idle: bool,
        max: u64,
        cached: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Next {
        if self.complete() {
            return Next::Done;
        }
        let max = max.max(self.unit);
        if readers.is_empty() || idle {
            let u = self
                .undone_from(self.cursor)
                .or_else(|| self.undone_from(0))
                .unwrap_or(0);
            let (off, len) = self.run(u, max, u64::MAX);
            return Next::Read {
                off,
                len,
                keep: false,
            };
        }
        // What is in the page cache first: a copy of it takes a moment, a read for a reader the
        // source's time (measured: readers starting mid-file kept the fetch reading for them
        // for 2 s, while a third one's read-ahead arrived, was passed, and left the window).
        if let Some((off, len)) = self.arrived(readers, window, max, cached) {
            return Next::Read {
                off,
                len,
                keep: true,
            };
        }
        // A reader not read ahead of yet (the agent waits until it has read one distance in
        // sequence) is served where it is, the nearest first; one reading scattered records
        // never is (see the top).
        let ahead = readers
            .iter()
            .filter(|r| !r.streaming && !r.scattered)
            .filter_map(|r| {
                let u = self.undone_from((r.pos / self.unit) as usize)?;
                let at = u as u64 * self.unit;
                (at < r.pos.saturating_add(lead)).then_some((at - r.pos.min(at), u, r.pos))
            })
            .min();
        if let Some((_, u, pos)) = ahead {
            let (off, len) = self.run(u, max, pos.saturating_add(lead));
            return Next::Read {
                off,
                len,
                keep: true,
            };
        }
        // The missing piece nearest behind a reader, among what it read lately.
        let behind = readers
            .iter()
            .filter_map(|r| {
                let lo = r.from.max(r.pos.saturating_sub(window)).div_ceil(self.unit) as usize;
                let below = ((r.pos / self.unit) as usize).min(self.done.len());
                let k = (lo..below).rev().find(|&k| !self.done[k])?;
                Some((r.pos - (k as u64 + 1) * self.unit, k, lo))
            })
            .min();
        let Some((_, k, lo)) = behind else {
            return Next::Wait;
        };
        // The run of missing pieces that ends there, at most `max`.
        let mut start = k;
        while start > lo && !self.done[start - 1] && ((k - start + 1) as u64) * self.unit < max {
            start -= 1;
        }
        let (off, len) = self.run(start, max, (k as u64 + 1) * self.unit);
        // A reader brought these pages in: they stay for whoever maps the file next, as they
        // would without granary.
        Next::Read {
            off,
            len,
            keep: true,
        }
    }

    /// The missing pieces all in the page cache around the readers, from what it read lately
    /// (two `window`s back) to where what was read ahead of it ends: the run (at most `max`)
    /// that starts furthest behind its reader (the longest in the page cache, the first the
    /// kernel evicts).
    fn arrived(
        &self,
        readers: &[Reader],
        window: u64,
        max: u64,
        cached: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Option<(u64, u64)> {
        let unit_len =
            |k: usize| ((k as u64 + 1) * self.unit).min(self.size) - k as u64 * self.unit;
        let mut best: Option<(u64, usize)> = None;
        for r in readers {
            let lo = (r.from.max(r.pos.saturating_sub(2 * window)) / self.unit) as usize;
            let hi = (r.ahead.max(r.pos).div_ceil(self.unit) as usize).min(self.done.len());
            let Some(k) = (lo..hi)
                .filter(|&k| !self.done[k])
                .find(|&k| cached(k as u64 * self.unit, unit_len(k)))
            else {
                continue;
            };
            // How far behind its reader (ahead of it: the least).
            let behind = r.pos.saturating_sub(k as u64 * self.unit);
            if best.is_none_or(|(b, _)| behind > b) {
                best = Some((behind, k));
            }
        }
        let (_, k) = best?;
        let mut end = k + 1;
        while end < self.done.len()
            && !self.done[end]
            && ((end - k + 1) as u64) * self.unit <= max
            && cached(end as u64 * self.unit, unit_len(end))
        {
            end += 1;
        }
        let off = k as u64 * self.unit;
        Some((off, (end as u64 * self.unit).min(self.size) - off))
    }

    /// `[off, off + len)` was read and written.
    pub fn mark(&mut self, off: u64, len: u64) {
        let first = (off / self.unit) as usize;
        let last = (off + len).div_ceil(self.unit) as usize;
        for k in first..last.min(self.done.len()) {
            self.done[k] = true;
        }
        self.cursor = last;
        self.advance_prefix();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn r(from: u64, pos: u64) -> Reader {
        Reader {
            from,
            pos,
            streaming: true,
            ahead: pos,
            scattered: false,
        }
    }

    fn none(_: u64, _: u64) -> bool {
        false
    }

    fn drive(o: &mut Order, readers: &[Reader], idle: bool) -> Vec<(u64, u64, bool)> {
        let mut out = vec![];
        while let Next::Read { off, len, keep } =
            o.next(readers, 16 * MB, 8 * MB, idle, 8 * MB, &mut none)
        {
            out.push((off, len, keep));
            o.mark(off, len);
        }
        out
    }

    #[test]
    fn without_readers_the_file_is_read_in_sequence() {
        let mut o = Order::new(20 * MB + 5, MB, &[(0, 20 * MB + 5)]);
        let reads = drive(&mut o, &[], false);
        assert_eq!(reads.first(), Some(&(0, 8 * MB, false)));
        let mut at = 0;
        for &(off, len, _) in &reads {
            assert_eq!(off, at);
            at += len;
        }
        assert_eq!(at, 20 * MB + 5);
        assert!(o.complete() && o.prefix_bytes() == 20 * MB + 5);
    }

    #[test]
    fn a_reader_mid_file_is_copied_behind_where_it_is() {
        let mut o = Order::new(64 * MB, MB, &[(0, 64 * MB)]);
        // Just found there, not read ahead of yet: one distance from where it is, for it.
        let fresh = [Reader {
            from: 40 * MB,
            pos: 40 * MB,
            streaming: false,
            ahead: 40 * MB,
            scattered: false,
        }];
        assert_eq!(
            o.next(&fresh, 16 * MB, 2 * MB, false, 8 * MB, &mut none),
            Next::Read {
                off: 40 * MB,
                len: 2 * MB,
                keep: true
            }
        );
        o.mark(40 * MB, 2 * MB);
        assert_eq!(
            o.next(&fresh, 16 * MB, 2 * MB, false, 8 * MB, &mut none),
            Next::Wait
        );
        // Read ahead of now, at 45 MiB and a bit: what it read behind it, nothing before where
        // it started, nothing ahead.
        let at = [r(40 * MB, 45 * MB + 5)];
        assert_eq!(drive(&mut o, &at, false), vec![(42 * MB, 3 * MB, true)]);
        assert_eq!(
            o.next(&at, 16 * MB, 8 * MB, false, 8 * MB, &mut none),
            Next::Wait
        );
        // Stopped for good: the rest in sequence.
        let rest = drive(&mut o, &at, true);
        assert_eq!(rest.first().map(|r| r.0), Some(45 * MB));
        assert!(o.complete());
    }

    #[test]
    fn several_readers_are_each_copied_behind_and_nothing_is_read_twice() {
        let size = 90 * MB;
        let mut o = Order::new(size, MB, &[(0, size)]);
        let starts = [0, 30 * MB, 60 * MB];
        let mut pos = starts;
        let mut seen = vec![0u32; (size / MB) as usize];
        for _ in 0..400 {
            let readers: Vec<_> = starts.iter().zip(pos).map(|(&f, p)| r(f, p)).collect();
            match o.next(&readers, 16 * MB, 8 * MB, false, 4 * MB, &mut none) {
                Next::Read { off, len, .. } => {
                    for u in off / MB..(off + len).div_ceil(MB) {
                        seen[u as usize] += 1;
                    }
                    // Only what some reader already read.
                    assert!(
                        readers.iter().any(|r| r.from <= off && off + len <= r.pos),
                        "{off} {len} {readers:?}"
                    );
                    o.mark(off, len);
                }
                Next::Wait => {
                    for (p, s) in pos.iter_mut().zip(starts) {
                        *p = (*p + 3 * MB).min(s + 30 * MB);
                    }
                }
                Next::Done => break,
            }
        }
        assert!(o.complete(), "{:?}", o.prefix_bytes());
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    }

    #[test]
    fn what_is_in_the_page_cache_around_a_reader_is_copied_first() {
        let mut o = Order::new(64 * MB, MB, &[(0, 64 * MB)]);
        // One reader at 10 MiB, read ahead of up to 20 MiB, of which 12–16 MiB arrived; what it
        // read is still cached. Another just found at 40 MiB, not read ahead of yet.
        let readers = [
            Reader {
                from: 0,
                pos: 10 * MB,
                streaming: true,
                ahead: 20 * MB,
                scattered: false,
            },
            Reader {
                from: 40 * MB,
                pos: 40 * MB,
                streaming: false,
                ahead: 40 * MB,
                scattered: false,
            },
        ];
        let mut cached =
            |off: u64, len: u64| off + len <= 10 * MB || (12 * MB <= off && off + len <= 16 * MB);
        let mut reads = vec![];
        while let Next::Read { off, len, keep } =
            o.next(&readers, 16 * MB, 2 * MB, false, 8 * MB, &mut cached)
        {
            reads.push((off, len, keep));
            o.mark(off, len);
        }
        // What it read first (the longest cached), then what arrived ahead of it, then the
        // other reader's next pieces; nothing in flight, nothing past what was read ahead.
        assert_eq!(
            reads,
            vec![
                (0, 8 * MB, true),
                (8 * MB, 2 * MB, true),
                (12 * MB, 4 * MB, true),
                (40 * MB, 2 * MB, true)
            ]
        );
        // Nothing cached: no piece ahead of the streaming reader is read by the fetch.
        let mut o = Order::new(64 * MB, MB, &[(0, 64 * MB)]);
        o.mark(0, 10 * MB);
        assert_eq!(
            o.next(&readers[..1], 16 * MB, 2 * MB, false, 8 * MB, &mut none),
            Next::Wait
        );
    }

    #[test]
    fn nothing_is_read_where_a_scattered_reader_is_but_what_it_faulted_is_copied() {
        let o = Order::new(64 * MB, MB, &[(0, 64 * MB)]);
        // It just read a record ending at 40 MiB + 100 KiB, and before that others elsewhere.
        let at = 40 * MB + (100 << 10);
        let scattered = [Reader {
            from: at,
            pos: at,
            streaming: false,
            ahead: at,
            scattered: true,
        }];
        assert_eq!(
            o.next(&scattered, 16 * MB, 8 * MB, false, 8 * MB, &mut none),
            Next::Wait
        );
        // The piece around it is all in the page cache (it and the kernel's read-around brought
        // it in): copied, at no cost to the source.
        let mut cached = |off: u64, len: u64| 40 * MB <= off && off + len <= 41 * MB;
        assert_eq!(
            o.next(&scattered, 16 * MB, 8 * MB, false, 8 * MB, &mut cached),
            Next::Read {
                off: 40 * MB,
                len: MB,
                keep: true
            }
        );
        // Once it stopped, the rest in sequence.
        assert_eq!(
            o.next(&scattered, 16 * MB, 8 * MB, true, 8 * MB, &mut none),
            Next::Read {
                off: 0,
                len: 8 * MB,
                keep: false
            }
        );
    }

    #[test]
    fn holes_are_not_read() {
        let size = 16 * MB;
        let mut o = Order::new(size, MB, &[(0, 2 * MB), (10 * MB, 11 * MB + 10)]);
        let reads = drive(&mut o, &[], false);
        assert_eq!(reads, vec![(0, 2 * MB, false), (10 * MB, 2 * MB, false)]);
        assert!(o.complete());
    }
}
