//! The agent's coarse clock for placement's "how long ago" checks (the program's reads, a tier's
//! last lookup): one monotonic base per process.

use crate::sync::statics;

/// Nanoseconds since the first call in this process (never 0).
pub(crate) fn mono_ns() -> u64 {
    static BASE: statics::OnceLock<std::time::Instant> = statics::OnceLock::new();
    BASE.get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
        + 1
}
