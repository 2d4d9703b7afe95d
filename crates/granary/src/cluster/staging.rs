//! The staging tier: copies of files other ranks hold, received when this node's programs open
//! them. Bounded: when a new copy does not fit, the oldest staged copies are dropped first
//! (every file is read once per epoch in a random order, so no choice does better without the
//! order; a copy still open keeps its bytes, the next open of a dropped one fetches it again).

use std::collections::VecDeque;
use std::sync::Mutex;

use granary_core::placement::incoming;
use granary_core::placement::SourceCtx;
use granary_core::stats::AgentCounters;

#[derive(Default)]
pub struct Staging {
    /// Staged entries, oldest first.
    order: Mutex<VecDeque<u32>>,
}

impl Staging {
    /// `idx` was just staged.
    pub fn push(&self, idx: u32) {
        self.lock().push_back(idx);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<u32>> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the oldest staged copy that is still there; false if there is none to drop.
    pub fn evict_oldest(&self, ctx: &SourceCtx, staging_tier: usize) -> bool {
        loop {
            let Some(idx) = self.lock().pop_front() else {
                return false;
            };
            let w = ctx.table.state(idx);
            if granary_shm::state::state_of(w) != granary_shm::state::PLACED
                || granary_shm::state::tier_of(w) as usize != staging_tier
            {
                continue; // invalidated or evicted meanwhile
            }
            if incoming::evict(ctx, idx).is_some() {
                AgentCounters::add(&ctx.counters.staging_evictions, 1);
                return true;
            }
        }
    }

    /// Bytes of copies in the staging tier now.
    pub fn bytes(&self, ctx: &SourceCtx, staging_tier: usize) -> u64 {
        ctx.tiers.usage().get(staging_tier).map_or(0, |u| u.used)
    }
}
