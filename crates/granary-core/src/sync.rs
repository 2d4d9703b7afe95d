//! The synchronisation primitives and threads of the agent's concurrent core, behind one name so
//! the core can be run under [Shuttle](https://docs.rs/shuttle): normally these are std's; with
//! the `shuttle` feature they are Shuttle's, whose every operation is a scheduling point, so
//! `tests/shuttle.rs` can explore thread interleavings of the real code — tier accounting, the
//! state transitions that decide who copies a file, the placement pool, the partition streamer,
//! in-flight tracking. No module of this crate names `std::sync` or spawns a `std::thread`
//! itself.
//!
//! Shuttle's primitives only work inside a Shuttle test: with the feature on, run only
//! `--test shuttle` (`cargo test -p granary-core --features shuttle --test shuttle`).
//!
//! Three things are std's in both builds, each for a reason:
//! - `Arc` (Shuttle re-exports it), so `Arc<Tier>` is the same type for the agent crate either way;
//! - `OnceLock` (Shuttle has none): set once, before the threads that read it exist
//!   (`SourceCtx::pack`, `SourceCtx::remote`), so there is no interleaving to explore;
//! - `statics`: what lives in a `static` — a Shuttle primitive belongs to one test execution, a
//!   static to all of them — and only makes names unique or remembers the process's start.

#[cfg(not(feature = "shuttle"))]
pub use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

#[cfg(feature = "shuttle")]
pub use shuttle::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

pub use std::sync::OnceLock;

/// Locks `m`, recovering the data from a poisoned lock: a panicking worker must not take every
/// later placement down with it (the state it guarded is re-checked by whoever uses it next).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub mod atomic {
    #[cfg(not(feature = "shuttle"))]
    pub use std::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };

    #[cfg(feature = "shuttle")]
    pub use shuttle::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
}

/// Threads of the concurrent core (placement workers, the pool's timer, partition streamers),
/// so a Shuttle test that starts them schedules them too. Shuttle does not model time: its
/// `sleep` is a yield, and a `Condvar::wait_timeout` never times out — a wait that only ends by
/// its timeout is reported as a deadlock.
pub mod thread {
    #[cfg(not(feature = "shuttle"))]
    pub use std::thread::{scope, sleep, yield_now, Builder, JoinHandle};

    #[cfg(feature = "shuttle")]
    pub use shuttle::thread::{scope, sleep, yield_now, Builder, JoinHandle};
}

/// For `static`s only, std's in both builds (see the module's documentation).
pub mod statics {
    pub use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::OnceLock;
    /// The agent's follower thread, woken by whoever has work for it.
    pub use std::thread::{current, Thread};
}
