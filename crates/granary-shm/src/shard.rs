//! Which shard of the shared words this process uses: its job counters' shard and its request
//! ring shard, both keyed by its pid, so a loader's fork workers (consecutive pids) count and
//! ask apart (`layout::COUNTER_SHARDS`, `layout::RING_SHARDS`).

use core::sync::atomic::{AtomicU32, Ordering};

/// This process's shard key (its pid).
static KEY: AtomicU32 = AtomicU32::new(0);

/// Makes this process count in shard `pid % COUNTER_SHARDS` and push requests into ring shard
/// `pid % RING_SHARDS`: the preload library calls it at start and in every fork child.
pub fn set_counter_shard(pid: u32) {
    KEY.store(pid, Ordering::Relaxed);
}

/// This process's shard key (its pid, as `set_counter_shard` was told).
#[inline]
pub(crate) fn process_shard() -> usize {
    KEY.load(Ordering::Relaxed) as usize
}
