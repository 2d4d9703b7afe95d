//! How far a pack is, for a progress display, and the caller's way to stop it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use crate::error::{PackError, Result};

/// What the pack is doing (`Progress::phase`).
pub mod phase {
    pub const WALKING: u8 = 0;
    pub const PACKING: u8 = 1;
    pub const FINISHING: u8 = 2;
}

/// Live counters for a progress display, and the caller's way to stop the pack.
#[derive(Debug, Default)]
pub struct Progress {
    pub phase: AtomicU8,
    pub dirs: AtomicU64,
    pub files_total: AtomicU64,
    pub bytes_total: AtomicU64,
    pub files_done: AtomicU64,
    pub bytes_done: AtomicU64,
    /// Set by the caller (Ctrl-C): the pack stops within a directory or a piece of a file and
    /// returns `PackError::Interrupted`, its temporary directory removed.
    pub stop: AtomicBool,
}

impl Progress {
    /// `Err(Interrupted)` once `stop` is set.
    pub fn check_stop(&self) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            Err(PackError::Interrupted)
        } else {
            Ok(())
        }
    }
}
