//! Where to cache (`--tier`, `--config` and the placement flags), shared by `run`, `agent`,
//! `serve` and `container-flags`, and how they become the configuration the agent gets: the
//! configuration file (`--config`, else `$GRANARY_CONFIG`) with the flags over it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use granary_agent::config::{resolve_job_tiers, AgentConfig};
use granary_core::config::{
    parse_tier_flag, resolve_tiers, Config, TierConfig, DEFAULT_IDLE_TIMEOUT,
};
use granary_core::tiers::TierSpec;

use crate::output::say;

/// Where to cache: shared by `run`, `agent`, `serve` and `container-flags`.
#[derive(Args, Debug, Clone, Default)]
pub struct TierArgs {
    /// A tier, fastest first: PATH or PATH=SIZE (e.g. /dev/shm/granary=8G). Repeatable.
    ///
    /// Default: `granary-<user>` in the first writable of $GRANARY_CACHE_DIR, $SLURM_TMPDIR,
    /// $TMPDIR, /tmp, with 90% of its free space. Sizes: K, M, G, T, P, E (binary units).
    #[arg(long = "tier", value_name = "PATH[=SIZE]")]
    pub tiers: Vec<String>,
    /// TOML configuration: tiers, placement, idle timeout, logging (default $GRANARY_CONFIG).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Placement worker threads (default: from the core count).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..=1024),
        help_heading = "Placement tuning"
    )]
    pub workers: Option<u16>,
    /// Size of the agent's reads of the source (4K..1G, default 8M).
    ///
    /// Applies to an agent started by this command. Config: `[placement] block_size`.
    #[arg(long, value_name = "SIZE", help_heading = "Placement tuning")]
    pub block_size: Option<String>,
    /// Source reads the agent makes at once on this node, all jobs together (default 4).
    ///
    /// Applies to an agent started by this command. Config: `[placement] max_source_streams`.
    #[arg(long, value_name = "N", help_heading = "Placement tuning")]
    pub max_source_streams: Option<usize>,
    /// Bytes of copies kept in the page cache: auto (default), off, or a size like 200G.
    ///
    /// `auto`: what the memory limit of the agent's cgroup, or the node's memory, leaves for
    /// file pages, less a reserve; `off`: the kernel's LRU decides, as without granary. Copies
    /// beyond it are dropped from the page cache after each read, so a dataset larger than RAM
    /// misses only those instead of thrashing the cache. Applies to an agent started by this
    /// command. Config: `[placement] page_cache`.
    #[arg(long, value_name = "auto|off|SIZE", help_heading = "Placement tuning")]
    pub page_cache: Option<String>,
    /// The agent exits after no job used it this long (e.g. 30s, 2m; default 30s).
    #[arg(long, value_name = "DURATION", help_heading = "Placement tuning")]
    pub idle_timeout: Option<String>,
}

impl TierArgs {
    /// `--config FILE`, else `$GRANARY_CONFIG`, else nothing; the placement flags
    /// (`--block-size`, `--max-source-streams`, `--page-cache`) override the file's values.
    pub fn config(&self) -> Result<Config> {
        let file = self.config.clone().or_else(|| {
            std::env::var_os("GRANARY_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let mut cfg = match file {
            Some(f) => Config::load(&f)?,
            None => Config::default(),
        };
        if let Some(b) = &self.block_size {
            let v = granary_core::size::parse_size(b)
                .filter(|v| (4096..=1 << 30).contains(v))
                .with_context(|| {
                    format!("bad --block-size `{b}`: expected a size 4K..1G like 8M")
                })?;
            cfg.block_size = Some(v);
        }
        if let Some(n) = self.max_source_streams {
            if !(1..=1024).contains(&n) {
                bail!("bad --max-source-streams `{n}`: expected 1..1024");
            }
            cfg.max_source_streams = Some(n);
        }
        if let Some(p) = &self.page_cache {
            let b = granary_core::placement::residency::Budget::parse(p).with_context(|| {
                format!("bad --page-cache `{p}`: expected auto, off or a size like 200G")
            })?;
            cfg.page_cache = Some(b);
        }
        Ok(cfg)
    }

    /// Tiers named by flags (which win) or the configuration; empty when neither names any.
    pub fn named(&self, cfg: &Config) -> Result<Vec<TierConfig>> {
        if !self.tiers.is_empty() {
            return self
                .tiers
                .iter()
                .map(|t| parse_tier_flag(t).map_err(anyhow::Error::from))
                .collect();
        }
        Ok(cfg.tiers.clone())
    }

    /// The tiers for a job: flags, config, or the default. An unusable tier is dropped with a
    /// message (with `strict`, it is an error); none left is an error. A tier said to be larger
    /// than its file system is warned about. With each tier: whether it is worth announcing
    /// (the default tier, or a capacity left to its default), which the caller does with the
    /// capacity the agent then uses.
    pub fn job_tiers(&self, cfg: &Config, strict: bool) -> Result<Vec<(TierSpec, bool)>> {
        let r = resolve_job_tiers(&self.named(cfg)?)?;
        if let (true, Some(d)) = (strict, r.dropped.first()) {
            bail!("{d}");
        }
        for d in &r.dropped {
            say(format!("granary: {d}; not using this tier"));
        }
        for w in &r.oversized {
            say(format!("granary: warning: {w}"));
        }
        if r.specs.is_empty() {
            bail!("no usable tier");
        }
        let defaulted = r.defaulted;
        Ok(r.specs
            .into_iter()
            .zip(r.capacity_defaulted)
            .map(|(t, cap)| (t, defaulted || cap))
            .collect())
    }

    /// `--idle-timeout`, checked (the agent `granary run` starts gets it as given).
    pub fn idle_timeout(&self) -> Result<Option<std::time::Duration>> {
        self.idle_timeout
            .as_deref()
            .map(|s| {
                granary_core::size::parse_duration(s).with_context(|| {
                    format!("bad --idle-timeout `{s}`: expected a duration like 30s or 2m")
                })
            })
            .transpose()
    }

    /// `granary agent`: the agent's configuration from these flags over the file's.
    pub fn agent_config(&self) -> Result<AgentConfig> {
        let cfg = self.config()?;
        let idle_timeout = self
            .idle_timeout()?
            .unwrap_or(cfg.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT));
        let tiers = resolve_tiers(&self.named(&cfg)?)?
            .into_iter()
            .map(|t| t.0)
            .collect();
        Ok(AgentConfig {
            workers: self.workers.map(usize::from).or(cfg.workers),
            tiers,
            idle_timeout: Some(idle_timeout),
            serving: None,
            cfg,
        })
    }
}
