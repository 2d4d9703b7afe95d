//! What `granary run` adds to the job's report from what it can observe itself.

pub mod program;
pub mod warnings;
