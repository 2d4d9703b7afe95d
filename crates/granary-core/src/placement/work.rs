//! The placement work the agent holds for one table, and whether the table is withdrawn
//! (`Work`).

use crate::cache::journal::Journal;
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Arc, OnceLock};

/// The placement work the agent holds for one table — jobs queued or running in the pool, a
/// request the ring consumer has popped and not yet handed on, a streamer's or a fetcher's file
/// — and whether the table is withdrawn from placement (`SourceCtx::retire`).
#[derive(Default)]
pub struct Work {
    pub(super) retired: AtomicBool,
    held: AtomicUsize,
    /// The table's journal of copies (`cache::journal`), written when `SourceCtx::pending` finds
    /// nothing pending: once the agent reports that, every copy published is in it. (Written
    /// at the release of the last work held before, it cost a program reading remote files one
    /// by one a `write` per file.) Set before any work is held (unset: no journal, as in tests
    /// of the placement).
    pub journal: OnceLock<Arc<Journal>>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("retired", &self.retired)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
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
