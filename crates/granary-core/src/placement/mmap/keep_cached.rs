//! Keeping cached what lies in a reader's way, far ahead of it.
//!
//! Readers of contiguous shares of one file (MPI-Caffe's ranks, `--procs 3` on one LMDB) each
//! start by touching pages around their share's start — their cursor's B-tree descent, the
//! kernel's 128 KiB read-around of each fault, the whole-file fetch reading where a reader was
//! first seen — and some of those pages lie in the share of the reader before, which gets there
//! seconds later. Under memory pressure the kernel has evicted them by then (the page cache
//! turns over in 3–4 s at the source's speed under a 256 MiB cap), and that reader reads them
//! from the source again: page-cache tracepoints showed 1–4 MB of a 384 MiB LMDB read twice in
//! nearly every 3-process job this way (MiB 119, 127, 238–241, 255: the shares start at 128 and
//! 256), against a bar of 1 %. So every `EVERY` the follower reads again — from the page cache
//! only, without waiting (`RWF_NOWAIT`), twice, which puts them on the kernel's active list — the
//! pages `mincore` shows cached between what was read ahead for each streaming reader and where
//! it stops (`stop_at`: another reader's start, or the end), nearest first, at most `BUDGET` a
//! reader. Nothing is read from the source for it; what the kernel deactivates in between is
//! activated again at the next round, long before it reaches the end of the inactive list.

use std::collections::HashMap;
use std::time::Duration;

use super::follower::{stop_at, Proc, Source, CACHED_WINDOWS, PAGE, THROUGH};
use super::window;
use crate::sys;

/// How often what lies cached in the readers' way is made to look used again.
pub const EVERY: Duration = Duration::from_millis(250);
/// At most this much per reader and round (the pages nearest to it first).
const BUDGET: u64 = 8 << 20;
/// `mincore` is asked this much at a time…
const SPAN: u64 = 16 << 20;
/// …and at most this far past the reader's read-ahead: about what the page cache turns over
/// in the time a reader takes to get there at a source's speed (a huge file with a single
/// reader is not scanned to its end four times a second).
const SCAN: u64 = 256 << 20;

/// One round over every streaming reader; returns the bytes made to look used.
pub(super) fn round(
    procs: &HashMap<u32, Proc>,
    files: &HashMap<u32, Source>,
    starts: &HashMap<u32, Vec<u64>>,
    buf: &mut Vec<u8>,
) -> u64 {
    let mut kept = 0;
    let mut res = Vec::new();
    for r in procs.values().flat_map(|pr| pr.readers.iter()) {
        let window::Phase::Streaming { front, .. } = r.win.phase else {
            continue;
        };
        if r.cached_windows >= CACHED_WINDOWS || r.page_order.is_some() {
            // Its windows find everything cached: nothing to keep for it. Or it reads in record
            // order (`page_order`): what lies in its way is not a file range, and readers of
            // contiguous shares of an LMDB in random key order have no pages in each other's
            // way to speak of.
            continue;
        }
        let Some(c) = files
            .get(&r.m.idx)
            .and_then(|s| s.cache.as_ref().map(|c| (s, c)))
        else {
            continue;
        };
        let (src, c) = c;
        // Past what was read ahead for it (made to look used when it arrived, `touch`).
        let from = (r.win.pos.max(r.issued_to.min(front))).div_ceil(PAGE) * PAGE;
        // A little past another reader's start, too: where a share ends is known to a page or
        // so only (that reader's first fault read 128 KiB around it; fault-around shows pages
        // present up to 64 KiB early), and the pages just past it are the ones that reader
        // consumed first, which the whole-file fetch may not have copied yet.
        let to = stop_at(starts, r)
            .saturating_add(THROUGH)
            .min(r.len)
            .min(r.m.end)
            .min(from.saturating_add(SCAN));
        let mut at = from;
        let mut left = BUDGET;
        while at < to && left > 0 {
            let n = SPAN.min(to - at);
            if c.resident(at, n, &mut res).is_err() {
                break;
            }
            for (s, e) in cached_runs(&res) {
                if left == 0 {
                    break;
                }
                let a = at + s as u64 * PAGE;
                let b = (at + e as u64 * PAGE).min(to).min(a + left);
                // Only what the mapping takes from the source: a tier file's pages are not
                // read again from the source.
                if r.m.local.iter().any(|&(x, y)| x <= a && b <= y) || a >= b {
                    continue;
                }
                make_used(src, a, b, buf);
                kept += b - a;
                left -= b - a;
            }
            at += n;
        }
    }
    kept
}

/// A read-ahead piece that arrived this soon after it was issued is made to look used
/// (`touch`); one that took longer was most likely read by its reader's own faults meanwhile.
pub(super) const TOUCH_WITHIN: Duration = Duration::from_secs(1);

/// Makes the cached pages of an arrived read-ahead piece look used twice — two reads from the
/// page cache, without waiting (`RWF_NOWAIT`), of the pages `mincore` shows there: nothing is
/// read from the source for it —, so the kernel moves them to its active list. Under memory
/// pressure it evicts from the inactive list first, and there, otherwise, a page read ahead and
/// not used yet goes before the pages the readers consumed and still map (their page-table
/// references keep those a round longer): read-ahead was evicted 0.1–1 s after it arrived,
/// before its reader came (which faulted it from the source again) or before the whole-file
/// fetch copied it (which read it again). Pages on the active list age out in their turn, the
/// oldest activation first. Measured (3 processes reading a 384 MiB LMDB under a 256 MiB cap,
/// 8 jobs each, page-cache tracepoints): bytes read twice per job 12.8 MB → 3.6 MB, of which
/// read-ahead re-read by a reader 5.7 → 1.6 MB and by the fetch 3.0 → 0.3 MB.
pub(super) fn touch(src: &Source, off: u64, len: u64, buf: &mut Vec<u8>) {
    let Some(c) = src.cache.as_ref() else {
        return;
    };
    let mut res = Vec::new();
    if c.resident(off / PAGE * PAGE, len, &mut res).is_err() {
        return;
    }
    let base = off / PAGE * PAGE;
    for (s, e) in cached_runs(&res) {
        let (a, b) = (
            base + s as u64 * PAGE,
            (base + e as u64 * PAGE).min(off + len),
        );
        make_used(src, a, b, buf);
    }
}

/// The runs `[s, e)` of cached pages in a `mincore` answer (bit 0 of each page's byte).
fn cached_runs(res: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < res.len() && res[i] & 1 == 0 {
            i += 1;
        }
        if i >= res.len() {
            return None;
        }
        let s = i;
        while i < res.len() && res[i] & 1 == 1 {
            i += 1;
        }
        Some((s, i))
    })
}

/// Reads `[a, b)` of the source twice from the page cache, without waiting and never from the
/// source (`RWF_NOWAIT`): the kernel moves those pages to its active list.
fn make_used(src: &Source, a: u64, b: u64, buf: &mut Vec<u8>) {
    buf.resize((b - a) as usize, 0);
    for _ in 0..2 {
        let _ = sys::pread_nowait(&src.file, buf, a);
    }
}

#[cfg(test)]
mod tests {
    use super::super::follower::Reader;
    use super::super::{proc_maps, Window};
    use super::*;
    use crate::sys;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

    const MB: u64 = 1 << 20;
    const KB: u64 = 1 << 10;

    fn reader(phase: window::Phase, pos: u64, issued_to: u64, len: u64) -> Reader {
        let m = proc_maps::Mapped {
            idx: 0,
            base: 0,
            start: 0,
            end: len,
            local: vec![(20 * MB, 22 * MB)],
        };
        let mut r = Reader::new(m, len, Instant::now(), None);
        r.win = Window {
            phase,
            pos,
            start: 0,
            short_runs: 0,
        };
        r.ticks = 1;
        r.issued_to = issued_to;
        r
    }

    #[test]
    fn what_is_cached_in_a_readers_way_up_to_the_next_start_is_kept() {
        let len = 32 * MB;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; len as usize]).unwrap();
        f.sync_all().unwrap();
        sys::fadvise(&f, 0, len, libc::POSIX_FADV_DONTNEED);
        // Exactly the pages read below: no read-ahead around them.
        sys::fadvise(&f, 0, len, libc::POSIX_FADV_RANDOM);
        // Cached: behind the reader, its read-ahead, a B-tree page in its way, a range its
        // mapping takes from a tier file, the first pages of the next reader's share, and
        // pages past that.
        let cached = [
            (MB, MB),
            (5 * MB, MB),
            (10 * MB, 128 * KB),
            (21 * MB, 512 * KB),
            (24 * MB + 512 * KB, 64 * KB),
            (26 * MB, MB),
        ];
        let mut buf = vec![0u8; MB as usize];
        for &(off, n) in &cached {
            f.read_exact_at(&mut buf[..n as usize], off).unwrap();
        }
        let src = Source {
            cache: sys::CachedPages::of(&f).ok(),
            file: f,
            fetched: Vec::new(),
        };
        let mut res = Vec::new();
        let c = src.cache.as_ref().unwrap();
        c.resident(0, len, &mut res).unwrap();
        let resident = res.iter().filter(|&&m| m & 1 == 1).count() as u64 * PAGE;
        assert_eq!(
            resident,
            3 * MB + 704 * KB,
            "the page cache did not drop the file"
        );
        let files = HashMap::from([(0u32, src)]);
        let streaming = window::Phase::Streaming {
            front: 6 * MB,
            trigger: 5 * MB,
        };
        let procs = |r: Reader| {
            HashMap::from([(
                1u32,
                Proc {
                    slot: 0,
                    pagemap: None,
                    maps_at: Instant::now(),
                    readers: vec![r],
                },
            )])
        };
        // Another reader started at 24 MiB: this one's way ends there (and a little past it).
        let starts = HashMap::from([(0u32, vec![0, 24 * MB])]);
        let mut buf = Vec::new();
        let r = reader(streaming, 4 * MB, 6 * MB, len);
        assert_eq!(
            round(&procs(r), &files, &starts, &mut buf),
            128 * KB + 64 * KB
        );
        // No other reader: its way runs to the end of the file.
        let r = reader(streaming, 4 * MB, 6 * MB, len);
        assert_eq!(
            round(&procs(r), &files, &HashMap::new(), &mut buf),
            128 * KB + 64 * KB + MB
        );
        // A reader not streaming, or whose windows find everything cached: nothing.
        let r = reader(window::Phase::Unseen, 4 * MB, 0, len);
        assert_eq!(round(&procs(r), &files, &starts, &mut buf), 0);
        let mut r = reader(streaming, 4 * MB, 6 * MB, len);
        r.cached_windows = CACHED_WINDOWS;
        assert_eq!(round(&procs(r), &files, &starts, &mut buf), 0);
    }
}
