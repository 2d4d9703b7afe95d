//! The synchronisation primitives of the agent's concurrent core (tier accounting, the state
//! transitions that decide who copies a file), behind one name so the core can be run under
//! [Shuttle](https://docs.rs/shuttle): normally these are `std::sync`'s; with the `shuttle`
//! feature they are Shuttle's, whose every operation is a scheduling point, so
//! `tests/shuttle.rs` can explore thread interleavings of the real code.
//!
//! Shuttle's primitives only work inside a Shuttle test: with the feature on, run only
//! `--test shuttle` (`cargo test -p granary-core --features shuttle --test shuttle`).
//!
//! `Arc` is std's in both cases (Shuttle re-exports it), so `Arc<Tier>` is the same type for
//! the agent crate either way.

#[cfg(not(feature = "shuttle"))]
pub use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(feature = "shuttle")]
pub use shuttle::sync::{Arc, Mutex, MutexGuard};

pub mod atomic {
    #[cfg(not(feature = "shuttle"))]
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    #[cfg(feature = "shuttle")]
    pub use shuttle::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
}
