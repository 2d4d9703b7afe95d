//! Client → agent request ring in shared memory: many producers (every hooked process), one
//! consumer (the agent). A bounded sequence-numbered queue (D. Vyukov's design): a producer
//! claims a position by CAS on the tail and publishes by bumping the slot's sequence.
//!
//! Processes die at any instruction (kill -9, a forked worker exiting), so the consumer must
//! survive a producer that claimed a slot and never published it: `skip_stuck` lets the agent
//! step over such a slot after a grace period. A late producer then loses its CAS and its request
//! is dropped — requests are hints, never facts the agent trusts without checking.

use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::layout::{
    RING_BELL, RING_HEAD, RING_PLACED, RING_PLACED_WAITERS, RING_SLOTS, RING_SLOT_LEN, RING_TAIL,
};
use crate::region::Region;

pub(crate) struct Ring<'a> {
    region: &'a Region,
    off: usize,
    cap: u64,
}

impl<'a> Ring<'a> {
    pub(crate) fn new(region: &'a Region, off: usize, cap: u32) -> Ring<'a> {
        Ring {
            region,
            off,
            cap: cap as u64,
        }
    }

    fn head(&self) -> Option<&AtomicU64> {
        self.region.atomic_u64(self.off + RING_HEAD)
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

    fn tail(&self) -> Option<&AtomicU64> {
        self.region.atomic_u64(self.off + RING_TAIL)
    }

    fn slot(&self, pos: u64) -> Option<(&AtomicU64, &AtomicU64)> {
        let base = self.off + RING_SLOTS + (pos & (self.cap - 1)) as usize * RING_SLOT_LEN;
        Some((
            self.region.atomic_u64(base)?,
            self.region.atomic_u64(base + 8)?,
        ))
    }

    pub(crate) fn push(&self, value: u64) -> bool {
        let Some(tail) = self.tail() else {
            return false;
        };
        let mut pos = tail.load(Ordering::Relaxed);
        // Bounded: a hook must never spin for long.
        for _ in 0..64 {
            let Some((seq, val)) = self.slot(pos) else {
                return false;
            };
            let s = seq.load(Ordering::Acquire);
            if s == pos {
                match tail.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => {
                        val.store(value, Ordering::Relaxed);
                        // Publish; fails only if the consumer already skipped us as stuck.
                        return seq
                            .compare_exchange(pos, pos + 1, Ordering::Release, Ordering::Relaxed)
                            .is_ok();
                    }
                    Err(now) => pos = now,
                }
            } else if s < pos {
                return false; // full
            } else {
                pos = tail.load(Ordering::Relaxed);
            }
        }
        false
    }

    /// Empties the ring: only for a table nobody else uses (a saved one being loaded).
    pub(crate) fn reset(&self) {
        let (Some(head), Some(tail)) = (self.head(), self.tail()) else {
            return;
        };
        head.store(0, Ordering::Relaxed);
        tail.store(0, Ordering::Relaxed);
        for pos in 0..self.cap {
            if let Some((seq, val)) = self.slot(pos) {
                seq.store(pos, Ordering::Relaxed);
                val.store(0, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn pop(&self) -> Option<u64> {
        let head = self.head()?;
        let pos = head.load(Ordering::Relaxed);
        let (seq, val) = self.slot(pos)?;
        if seq.load(Ordering::Acquire) != pos + 1 {
            return None;
        }
        let value = val.load(Ordering::Relaxed);
        seq.store(pos + self.cap, Ordering::Release);
        head.store(pos + 1, Ordering::Relaxed);
        Some(value)
    }

    /// Positions claimed by producers and not yet consumed or skipped (tail − head). Counts
    /// claimed-but-unpublished slots too, so it errs towards "not yet drained".
    pub(crate) fn backlog(&self) -> u64 {
        let (Some(head), Some(tail)) = (self.head(), self.tail()) else {
            return 0;
        };
        // Head first: both only grow and head never passes tail, so reading tail afterwards can
        // only overstate the backlog, never report it drained while a request is still there.
        let h = head.load(Ordering::Acquire);
        let t = tail.load(Ordering::Acquire);
        t.saturating_sub(h)
    }

    /// True if the head slot is claimed (tail moved past it) but unpublished and was skipped.
    /// Call only after the head has looked stuck for a while.
    pub(crate) fn skip_stuck(&self) -> bool {
        let (Some(head), Some(tail)) = (self.head(), self.tail()) else {
            return false;
        };
        let pos = head.load(Ordering::Relaxed);
        if tail.load(Ordering::Relaxed) <= pos {
            return false;
        }
        let Some((seq, _)) = self.slot(pos) else {
            return false;
        };
        if seq
            .compare_exchange(pos, pos + self.cap, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            head.store(pos + 1, Ordering::Relaxed);
            return true;
        }
        false
    }
}
