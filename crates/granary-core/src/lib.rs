//! granary's node-agent model: configuration, the catalog (walk, persistence, reuse), tiers and
//! capacity accounting, placement, and the counters the agent and `granary run` report.
//!
//! The binary crate (`granary`) owns processes, sockets and the CLI; everything here is a library
//! that returns errors instead of exiting, so it can be tested in-process.

pub mod cache;
pub mod catalog;
pub mod config;
pub mod memlimit;
pub mod packed_source;
pub mod placement;
pub mod runtime;
pub mod size;
pub mod source;
pub mod stats;
pub mod sync;
pub mod sys;
pub mod tierdir;
pub mod tiers;

pub use config::{Config, TierConfig};
pub use tiers::{Reservation, Tiers};
