//! granary's node agent, as a library: the `granary` binary turns its flags into the typed
//! configurations here (`config::AgentConfig`, `cluster::ServeConfig`) and calls in.
//!
//! - The agent (`agent`, `daemon`): one per node and user. It owns the catalogs (`source`),
//!   tier accounting and the placement pool; jobs attach over a Unix socket (`server`,
//!   `protocol`) and then find files through the shared table without round trips. Its threads:
//!   the request ring (`ring`), the page-cache residency keeper (`residency_keeper`), the tier
//!   watch (`tierwatch`), the mapping follower (`follower`).
//! - Cluster mode (`cluster`): one serving agent per node, started by an MPI launcher; every
//!   node's tiers become one cache of the dataset (MPI with the `mpi` feature only).
//! - The client side (`client`): connecting to the agent (starting it, or replacing one that
//!   does not answer), `stop`, `status`; a job's side (`job`): attaching, its table and
//!   counters, its report and warnings.
//! - `logging`: `GRANARY_LOG`, shared by the agent and the commands; `metrics`: the agent's
//!   status as metrics text (Prometheus format).

pub mod agent;
mod cache;
pub mod client;
pub mod cluster;
pub mod config;
pub mod daemon;
mod follower;
pub mod job;
pub mod logging;
pub mod metrics;
pub mod protocol;
mod residency_keeper;
mod ring;
pub mod server;
pub mod serving;
pub mod source;
mod tierwatch;

pub use agent::Agent;
pub use config::AgentConfig;
pub use serving::Serving;
