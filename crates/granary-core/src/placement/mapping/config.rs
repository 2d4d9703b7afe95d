//! `[mmap]` in the configuration file:
//!
//! ```toml
//! [mmap]
//! mode = "prefetch"   # follow programs through their mappings and read ahead of them;
//!                     # "watch": follow and count, read nothing ahead; "off": follow nothing
//! distance = "8M"     # a reader is read ahead of once it has read this much forward
//! size = "50M"        # bytes read ahead at a time (less when memory is tight)
//! threshold = 75      # percent of the last window passed before the next is read
//! ```
//! Defaults are seed 000's best values (distance 8–10 MiB, size 50 MiB, threshold 75 %).

use serde::{Deserialize, Serialize};

use super::{MmapParams, Mode};

/// What a configuration file (or a job) asks; unset keys take the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmapConfig {
    pub mode: Option<Mode>,
    pub distance: Option<u64>,
    pub size: Option<u64>,
    pub threshold_pct: Option<u64>,
}

impl MmapConfig {
    /// `self` over `under` (the agent's own configuration over a job's).
    pub fn or(self, under: MmapConfig) -> MmapConfig {
        MmapConfig {
            mode: self.mode.or(under.mode),
            distance: self.distance.or(under.distance),
            size: self.size.or(under.size),
            threshold_pct: self.threshold_pct.or(under.threshold_pct),
        }
    }

    pub fn resolve(self) -> MmapParams {
        let d = MmapParams::default();
        MmapParams {
            mode: self.mode.unwrap_or(d.mode),
            distance: self.distance.unwrap_or(d.distance),
            size: self.size.unwrap_or(d.size),
            threshold_pct: self.threshold_pct.unwrap_or(d.threshold_pct),
        }
    }

    /// The `[mmap]` table; `err(key, what)` makes the one-line error naming the key.
    pub fn parse(
        t: &toml::Table,
        err: &dyn Fn(&str, &str) -> String,
        size: fn(&toml::Value) -> Option<u64>,
    ) -> Result<MmapConfig, String> {
        let mut c = MmapConfig::default();
        for (k, v) in t {
            let key = format!("mmap.{k}");
            match k.as_str() {
                "mode" => {
                    c.mode = Some(v.as_str().and_then(Mode::parse).ok_or_else(|| {
                        err(&key, "expected \"prefetch\", \"watch\" or \"off\" for key")
                    })?)
                }
                "distance" | "size" => {
                    let n = size(v)
                        .filter(|n| (4096..=1 << 40).contains(n))
                        .ok_or_else(|| err(&key, "expected a size 4K..1T like \"8M\" for key"))?;
                    if k == "distance" {
                        c.distance = Some(n);
                    } else {
                        c.size = Some(n);
                    }
                }
                "threshold" => {
                    let pct = match v {
                        toml::Value::Integer(n) => Some(*n),
                        toml::Value::String(s) => s.trim_end_matches('%').trim().parse().ok(),
                        _ => None,
                    }
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| err(&key, "expected a percentage 1..100 like 75 for key"))?;
                    c.threshold_pct = Some(pct as u64);
                }
                _ => return Err(err(&key, "unknown key")),
            }
        }
        Ok(c)
    }
}
