//! What an agent is started with: typed configurations, resolved by the caller (the `granary`
//! binary turns its flags, the configuration file and the environment into these).

use std::time::Duration;

use granary_core::config::{default_tier, resolve_tiers, Config, TierConfig};
use granary_core::size::format_size;
use granary_core::tiers::TierSpec;

use crate::serving::Serving;

/// One node agent's configuration.
pub struct AgentConfig {
    /// The agent's own configuration (placement parameters, reuse verification, logging); for
    /// a placement key it leaves unset, the first job's value counts.
    pub cfg: Config,
    /// Tiers for a job that names none.
    pub tiers: Vec<TierSpec>,
    /// Placement workers; `None`: the first job's, else from the core count.
    pub workers: Option<usize>,
    /// The agent exits after no job used it this long; `None`: never (a serving rank).
    pub idle_timeout: Option<Duration>,
    /// Cluster mode: the rank this agent is of the serving job.
    pub serving: Option<Serving>,
}

/// A job's tiers, resolved (`resolve_job_tiers`).
pub struct JobTiers {
    pub specs: Vec<TierSpec>,
    /// No tier was named: the default tier is used.
    pub defaulted: bool,
    /// Per tier: its capacity was not given (90 % of its file system's free space).
    pub capacity_defaulted: Vec<bool>,
    /// Tiers that could not be used (not creatable, not a directory), each with why.
    pub dropped: Vec<String>,
    /// Tiers given a capacity larger than their file system: copies will stop when it is
    /// full, not at the capacity; each with the real size.
    pub oversized: Vec<String>,
}

/// The tiers named (flags or configuration), else the default tier, each made and checked. An
/// unusable tier costs speed, never the job: it is dropped, for the caller to say so (and to
/// refuse when none is left).
pub fn resolve_job_tiers(named: &[TierConfig]) -> anyhow::Result<JobTiers> {
    let mut tcfg = named.to_vec();
    let defaulted = tcfg.is_empty();
    if defaulted {
        tcfg.push(default_tier().map_err(anyhow::Error::msg)?);
    }
    let (mut specs, mut capacity_defaulted, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
    let mut oversized = Vec::new();
    for t in &tcfg {
        match resolve_tiers(std::slice::from_ref(t)) {
            Ok(r) => {
                for (spec, cap_default) in r {
                    if let Ok(total) = granary_core::sys::fs_size(&spec.path) {
                        if spec.capacity > total {
                            oversized.push(format!(
                                "tier {} is given {} but its file system holds {} in all: \
                                 copies will stop when it is full",
                                spec.path.display(),
                                format_size(spec.capacity),
                                format_size(total)
                            ));
                        }
                    }
                    specs.push(spec);
                    capacity_defaulted.push(cap_default);
                }
            }
            Err(e) => dropped.push(e.to_string()),
        }
    }
    Ok(JobTiers {
        specs,
        defaulted,
        capacity_defaulted,
        dropped,
        oversized,
    })
}
