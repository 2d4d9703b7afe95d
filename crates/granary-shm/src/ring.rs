//! Client → agent request ring in shared memory: many producers (every hooked process), one
//! consumer (the agent). `RING_SHARDS` bounded sequence-numbered queues (D. Vyukov's design): a
//! producer claims a position of its process's shard by CAS on the shard's tail and publishes by
//! bumping the slot's sequence; the consumer drains every shard.
//!
//! Processes die at any instruction (kill -9, a forked worker exiting), so the consumer must
//! survive a producer that claimed a slot and never published it: `skip_stuck` lets the agent
//! step over such a slot after a grace period. A late producer then loses its CAS and its request
//! is dropped — requests are hints, never facts the agent trusts without checking.

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::layout::{
    RING_BELL, RING_PLACED, RING_PLACED_WAITERS, RING_SHARDS, RING_SHARDS_AT, RING_SHARD_HEAD,
    RING_SHARD_LEN, RING_SHARD_TAIL, RING_SLOTS, RING_SLOT_LEN,
};
use crate::region::Region;

/// Where the consumer starts its next look, so no shard waits behind a busy one.
static NEXT_SHARD: AtomicU32 = AtomicU32::new(0);

pub(crate) struct Ring<'a> {
    region: &'a Region,
    off: usize,
    /// Slots per shard (a power of two).
    cap: u64,
}

impl<'a> Ring<'a> {
    /// `cap`: the ring's slots, all shards together (a power of two, at least `RING_SHARDS`).
    pub(crate) fn new(region: &'a Region, off: usize, cap: u32) -> Ring<'a> {
        Ring {
            region,
            off,
            cap: (cap as u64 / RING_SHARDS as u64).max(1),
        }
    }

    fn shard_word(&self, shard: usize, at: usize) -> Option<&AtomicU64> {
        self.region
            .atomic_u64(self.off + RING_SHARDS_AT + shard * RING_SHARD_LEN + at)
    }

    fn head(&self, shard: usize) -> Option<&AtomicU64> {
        self.shard_word(shard, RING_SHARD_HEAD)
    }

    fn tail(&self, shard: usize) -> Option<&AtomicU64> {
        self.shard_word(shard, RING_SHARD_TAIL)
    }

    fn bell(&self) -> Option<&AtomicU32> {
        self.region.atomic_u32(self.off + RING_BELL)
    }

    /// Producer, after a push: wakes the consumer if it sleeps on the doorbell (one system
    /// call then; a load otherwise).
    pub(crate) fn ring_bell(&self) {
        let Some(b) = self.bell() else { return };
        // Pairs with the fence in `sleep`: either the consumer sees our request before it
        // sleeps, or we see its 1 and wake it.
        fence(Ordering::SeqCst);
        if b.load(Ordering::Relaxed) != 0 && b.swap(0, Ordering::AcqRel) != 0 {
            crate::region::futex_wake(b);
        }
    }

    /// Consumer, with nothing to pop: sleeps until a producer rings or `timeout` passes. Returns
    /// at once if a request is pushed (or being pushed) already.
    pub(crate) fn sleep(&self, timeout: core::time::Duration) {
        let Some(b) = self.bell() else {
            std::thread::sleep(timeout);
            return;
        };
        b.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.backlog() > 0 {
            // A producer between its claim and its publication (or one that died there, until
            // the consumer skips its slot): nap instead of spinning on it — briefly, since it
            // will not ring for a request it is still publishing.
            b.store(0, Ordering::Relaxed);
            std::thread::sleep(timeout.min(core::time::Duration::from_millis(1)));
            return;
        }
        let _ = crate::region::futex_wait(b, 1, timeout);
        b.store(0, Ordering::Relaxed);
    }

    /// Agent: a copy was published; wakes the clients waiting for one.
    pub(crate) fn notify_placed(&self) {
        let (Some(n), Some(w)) = (
            self.region.atomic_u32(self.off + RING_PLACED),
            self.region.atomic_u32(self.off + RING_PLACED_WAITERS),
        ) else {
            return;
        };
        n.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        if w.load(Ordering::Relaxed) != 0 {
            crate::region::futex_wake_all(n);
        }
    }

    /// Client: the count of published copies (to wait on with `wait_placed`).
    pub(crate) fn placed_count(&self) -> u32 {
        self.region
            .atomic_u32(self.off + RING_PLACED)
            .map_or(0, |n| n.load(Ordering::Acquire))
    }

    /// Client: sleeps until a copy is published after `seen` was read (`placed_count`), or
    /// `timeout` passes; true if a signal ended the wait.
    pub(crate) fn wait_placed(&self, seen: u32, timeout: core::time::Duration) -> bool {
        let (Some(n), Some(w)) = (
            self.region.atomic_u32(self.off + RING_PLACED),
            self.region.atomic_u32(self.off + RING_PLACED_WAITERS),
        ) else {
            return false;
        };
        w.fetch_add(1, Ordering::AcqRel);
        fence(Ordering::SeqCst);
        let interrupted = crate::region::futex_wait(n, seen, timeout);
        w.fetch_sub(1, Ordering::AcqRel);
        interrupted
    }

    fn slot(&self, shard: usize, pos: u64) -> Option<(&AtomicU64, &AtomicU64)> {
        let index = shard as u64 * self.cap + (pos & (self.cap - 1));
        let base = self.off + RING_SLOTS + index as usize * RING_SLOT_LEN;
        Some((
            self.region.atomic_u64(base)?,
            self.region.atomic_u64(base + 8)?,
        ))
    }

    /// Pushes into this process's shard (`crate::shard::process_shard`); false if it is full.
    pub(crate) fn push(&self, value: u64) -> bool {
        self.push_at(value).is_some()
    }

    /// `push`, saying at which position of the shard the value went.
    pub(crate) fn push_at(&self, value: u64) -> Option<u64> {
        let shard = crate::shard::process_shard() % RING_SHARDS;
        let tail = self.tail(shard)?;
        let mut pos = tail.load(Ordering::Relaxed);
        // Bounded: a hook must never spin for long.
        for _ in 0..64 {
            let (seq, val) = self.slot(shard, pos)?;
            let s = seq.load(Ordering::Acquire);
            if s == pos {
                match tail.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => {
                        val.store(value, Ordering::Relaxed);
                        // Publish; fails only if the consumer already skipped us as stuck.
                        return seq
                            .compare_exchange(pos, pos + 1, Ordering::Release, Ordering::Relaxed)
                            .is_ok()
                            .then_some(pos);
                    }
                    Err(now) => pos = now,
                }
            } else if s < pos {
                return None; // full
            } else {
                pos = tail.load(Ordering::Relaxed);
            }
        }
        None
    }

    /// After a push at `pos` that woke nobody: true at every quarter of a shard, so a burst of
    /// such pushes wakes a sleeping consumer before it could fill the shard — without the
    /// producer reading the head, a line the consumer writes at every pop.
    pub(crate) fn quarter_mark(&self, pos: u64) -> bool {
        (pos + 1) % (self.cap / 4).max(1) == 0
    }

    /// Empties the ring: only for a table nobody else uses (a saved one being loaded).
    pub(crate) fn reset(&self) {
        for shard in 0..RING_SHARDS {
            let (Some(head), Some(tail)) = (self.head(shard), self.tail(shard)) else {
                return;
            };
            head.store(0, Ordering::Relaxed);
            tail.store(0, Ordering::Relaxed);
            for pos in 0..self.cap {
                if let Some((seq, val)) = self.slot(shard, pos) {
                    seq.store(pos, Ordering::Relaxed);
                    val.store(0, Ordering::Relaxed);
                }
            }
        }
    }

    /// The next request of any shard, each shard in turn first.
    pub(crate) fn pop(&self) -> Option<u64> {
        let first = NEXT_SHARD.load(Ordering::Relaxed) as usize;
        for k in 0..RING_SHARDS {
            let shard = (first + k) % RING_SHARDS;
            if let Some(v) = self.pop_shard(shard) {
                NEXT_SHARD.store(((shard + 1) % RING_SHARDS) as u32, Ordering::Relaxed);
                return Some(v);
            }
        }
        None
    }

    fn pop_shard(&self, shard: usize) -> Option<u64> {
        let head = self.head(shard)?;
        let pos = head.load(Ordering::Relaxed);
        let (seq, val) = self.slot(shard, pos)?;
        if seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        let value = val.load(Ordering::Relaxed);
        seq.store(pos + self.cap, Ordering::Release);
        head.store(pos + 1, Ordering::Relaxed);
        Some(value)
    }

    /// Positions claimed by producers and not yet consumed or skipped (tail − head, all
    /// shards). Counts claimed-but-unpublished slots too, so it errs towards "not yet drained".
    pub(crate) fn backlog(&self) -> u64 {
        (0..RING_SHARDS)
            .map(|shard| {
                let (Some(head), Some(tail)) = (self.head(shard), self.tail(shard)) else {
                    return 0;
                };
                // Head first: both only grow and head never passes tail, so reading tail
                // afterwards can only overstate the backlog, never report it drained while a
                // request is still there.
                let h = head.load(Ordering::Acquire);
                let t = tail.load(Ordering::Acquire);
                t.saturating_sub(h)
            })
            .sum()
    }

    /// True if a shard's head slot was claimed (tail moved past it) but unpublished at the last
    /// look too (`seen`: per shard, the head position found so then, `u64::MAX` for none), and
    /// is skipped now. Records this look's in `seen`. Called about once a second whatever the
    /// other shards do: a slot is skipped only once it has looked stuck for a whole interval,
    /// and one shard's dead producer cannot hold its shard while other processes keep the
    /// consumer busy.
    pub(crate) fn skip_stuck(&self, seen: &mut [u64; RING_SHARDS]) -> bool {
        let mut skipped = false;
        for (shard, seen) in seen.iter_mut().enumerate() {
            let last = core::mem::replace(seen, u64::MAX);
            let (Some(head), Some(tail)) = (self.head(shard), self.tail(shard)) else {
                return skipped;
            };
            let pos = head.load(Ordering::Relaxed);
            if tail.load(Ordering::Relaxed) <= pos {
                continue;
            }
            let Some((seq, _)) = self.slot(shard, pos) else {
                continue;
            };
            if seq.load(Ordering::Acquire) != pos {
                // Published (the consumer takes it) or not claimed.
                continue;
            }
            if last != pos {
                *seen = pos;
                continue;
            }
            if seq
                .compare_exchange(pos, pos + self.cap, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                head.store(pos + 1, Ordering::Relaxed);
                skipped = true;
            }
        }
        skipped
    }

    /// A producer of this process's shard that claims a slot and dies before publishing it.
    #[cfg(test)]
    pub(crate) fn claim_only(&self) -> bool {
        let shard = crate::shard::process_shard() % RING_SHARDS;
        let Some(tail) = self.tail(shard) else {
            return false;
        };
        let pos = tail.load(Ordering::Relaxed);
        matches!(self.slot(shard, pos), Some((seq, _)) if seq.load(Ordering::Acquire) == pos)
            && tail
                .compare_exchange(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
