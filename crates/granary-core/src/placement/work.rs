//! The placement work the agent holds for one table, and whether the table is withdrawn
//! (`Work`).

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The placement work the agent holds for one table — jobs queued or running in the pool, a
/// request the ring consumer has popped and not yet handed on, a streamer's or a fetcher's file
/// — and whether the table is withdrawn from placement (`SourceCtx::retire`).
#[derive(Debug, Default)]
pub struct Work {
    pub(super) retired: AtomicBool,
    held: AtomicUsize,
}

impl Work {
    /// True once the table is withdrawn: queued work is dropped, running work stops.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// One more piece of work held.
    pub fn hold(&self) {
        self.held.fetch_add(1, Ordering::AcqRel);
    }

    /// A piece of work done or dropped.
    pub fn release(&self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }

    /// Work held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}
