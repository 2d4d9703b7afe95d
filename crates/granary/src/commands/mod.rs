//! One module per command. A command may use the binary's shared pieces (`crate::output`,
//! `signals`, `preload`, `jobenv`, `preflight`) and the flags, never another command.

pub mod agent;
pub mod cache;
pub mod container_flags;
pub mod demo;
pub mod pack;
pub mod run;
pub mod serve;
pub mod status;
