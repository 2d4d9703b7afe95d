//! The settings an agent takes when it starts, or when its first job starts its placement pool,
//! and keeps until it exits: a job that attaches to a running agent cannot change them. The job
//! sends the ones its configuration sets (`set_in`); the agent answers with the ones it does not
//! apply (`unapplied`), so a configuration is never ignored silently.

use super::settings::{Config, Verify};
use crate::placement::mmap::MmapConfig;
use crate::placement::residency::Budget;

/// A setting as the file spells it (`[reuse] verify`) and its value, written the same way on
/// both sides so that equal values compare equal.
pub type Setting = (String, String);

/// An exact size: the largest binary unit that divides it (`8M`), else bytes.
fn size(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n != 0 && n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

/// Every agent-wide key with `cfg`'s value, if it has one.
fn items(cfg: &Config) -> Vec<(&'static str, Option<String>)> {
    let mmap = cfg.mmap.unwrap_or_default();
    vec![
        ("[placement] workers", cfg.workers.map(|v| v.to_string())),
        ("[placement] block_size", cfg.block_size.map(size)),
        (
            "[placement] max_source_streams",
            cfg.max_source_streams.map(|v| v.to_string()),
        ),
        (
            "[placement] prefetch_min_size",
            cfg.prefetch_min_size.map(size),
        ),
        ("[placement] chunk_size", cfg.chunk_size.map(size)),
        (
            "[placement] small_copy_delay",
            cfg.small_copy_delay.map(|d| quoted(&format!("{d:?}"))),
        ),
        (
            "[placement] page_cache",
            cfg.page_cache.map(|b| match b {
                Budget::Fixed(n) => quoted(&size(n)),
                b => quoted(&b.to_string()),
            }),
        ),
        (
            "[catalog] validate_threads",
            cfg.validate_threads.map(|v| v.to_string()),
        ),
        (
            "[catalog] pin_inodes",
            cfg.pin_inodes.map(|v| v.to_string()),
        ),
        (
            "[reuse] verify",
            cfg.verify.map(|v| {
                quoted(match v {
                    Verify::Identity => "identity",
                    Verify::Checksum => "checksum",
                })
            }),
        ),
        (
            "[mmap] mode",
            mmap.mode.map(|m| quoted(&format!("{m:?}").to_lowercase())),
        ),
        ("[mmap] distance", mmap.distance.map(|v| quoted(&size(v)))),
        ("[mmap] size", mmap.size.map(|v| quoted(&size(v)))),
        (
            "[mmap] threshold",
            mmap.threshold_pct.map(|v| v.to_string()),
        ),
        ("[mmap] lmdb_index", mmap.lmdb_index.map(|v| v.to_string())),
        (
            "[mmap] sequential_advice",
            mmap.sequential_advice.map(|v| v.to_string()),
        ),
        (
            "[agent] idle_timeout",
            cfg.idle_timeout.map(|d| quoted(&format!("{d:?}"))),
        ),
        ("[agent] log_level", cfg.log_level.as_deref().map(quoted)),
        (
            "[agent] log_file",
            cfg.log_file
                .as_ref()
                .map(|p| quoted(&p.display().to_string())),
        ),
    ]
}

/// The agent-wide settings `cfg` sets.
pub fn set_in(cfg: &Config) -> Vec<Setting> {
    items(cfg)
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect()
}

/// What an agent applies, given its own settings `agent` (explicit or defaulted, as `set_in`
/// writes them): one line per setting of `job` whose value differs.
pub fn unapplied(job: &[Setting], agent: &[Setting]) -> Vec<String> {
    job.iter()
        .filter_map(|(key, want)| {
            let (_, has) = agent.iter().find(|(k, _)| k == key)?;
            (has != want).then(|| format!("{key} = {want} of this job's configuration is not applied: the running agent keeps {has}"))
        })
        .collect()
}

/// `cfg` with the mmap defaults filled in (the agent's effective `[mmap]`).
pub fn mmap_resolved(cfg: Option<MmapConfig>) -> MmapConfig {
    let p = cfg.unwrap_or_default().resolve();
    MmapConfig {
        mode: Some(p.mode),
        distance: Some(p.distance),
        size: Some(p.size),
        threshold_pct: Some(p.threshold_pct),
        lmdb_index: Some(p.lmdb_index),
        sequential_advice: Some(p.sequential_advice),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_differing_values_the_job_sets_are_unapplied() {
        let job =
            Config::parse("[reuse]\nverify = \"checksum\"\n[placement]\nblock_size = \"8M\"\n")
                .unwrap();
        let agent = Config::parse(
            "[reuse]\nverify = \"identity\"\n[placement]\nblock_size = \"8M\"\nworkers = 3\n",
        )
        .unwrap();
        let lines = unapplied(&set_in(&job), &set_in(&agent));
        assert_eq!(
            lines,
            vec!["[reuse] verify = \"checksum\" of this job's configuration is not applied: the running agent keeps \"identity\"".to_string()]
        );
        assert!(unapplied(&set_in(&agent), &set_in(&agent)).is_empty());
        assert!(set_in(&Config::default()).is_empty());
    }

    #[test]
    fn sizes_are_exact() {
        assert_eq!(size(8 << 20), "8M");
        assert_eq!(size((8 << 20) + 1), "8388609");
        assert_eq!(size(0), "0");
    }
}
