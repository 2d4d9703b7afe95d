//! The PARTIAL entries of one table the agent has touched (`Partials`, `SourceCtx::partials`):
//! per entry its chunk file, tier and chunks in flight; what works on them is `partial`'s.

use std::collections::HashMap;

use crate::placement::chunks::ChunkFile;
use crate::sync::{Arc, Mutex};

/// The PARTIAL entries of one table the agent has touched, by entry index.
#[derive(Debug, Default)]
pub struct Partials {
    pub(super) map: Mutex<HashMap<u32, Arc<Mutex<Slot>>>>,
}

#[derive(Debug)]
pub(super) struct Slot {
    /// `None` once the chunk file was dropped: jobs still running commit nothing.
    pub(super) file: Option<Arc<ChunkFile>>,
    pub(super) tier: usize,
    /// Chunks queued or being fetched (so a CHUNK request for them is ignored).
    pub(super) busy: Vec<bool>,
}
