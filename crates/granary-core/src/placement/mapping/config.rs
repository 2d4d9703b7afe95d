//! `[mmap]` in the configuration file:
//!
//! ```toml
//! [mmap]
//! mode = "prefetch"   # follow programs through their mappings and read ahead of them;
//!                     # "watch": follow and count, read nothing ahead; "off": follow nothing
//! distance = "8M"     # a reader is read ahead of once it has read this much forward
//! size = "50M"        # bytes read ahead at a time (less when memory is tight)
//! threshold = 75      # percent of the last window passed before the next is read
//! lmdb_index = true   # follow cursors over an LMDB in key order, not the file's page order
//! ```
//! Defaults are the best values of Haderbache et al.'s mmap pre-caching (distance 8–10 MiB,
//! size 50 MiB, threshold 75 %).

use serde::{Deserialize, Serialize};

use super::{MmapParams, Mode};

/// What a configuration file (or a job) asks; unset keys take the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmapConfig {
    pub mode: Option<Mode>,
    pub distance: Option<u64>,
    pub size: Option<u64>,
    pub threshold_pct: Option<u64>,
    pub lmdb_index: Option<bool>,
}

impl MmapConfig {
    /// `self` over `under` (the agent's own configuration over a job's).
    pub fn or(self, under: MmapConfig) -> MmapConfig {
        MmapConfig {
            mode: self.mode.or(under.mode),
            distance: self.distance.or(under.distance),
            size: self.size.or(under.size),
            threshold_pct: self.threshold_pct.or(under.threshold_pct),
            lmdb_index: self.lmdb_index.or(under.lmdb_index),
        }
    }

    pub fn resolve(self) -> MmapParams {
        let d = MmapParams::default();
        MmapParams {
            mode: self.mode.unwrap_or(d.mode),
            distance: self.distance.unwrap_or(d.distance),
            size: self.size.unwrap_or(d.size),
            threshold_pct: self.threshold_pct.unwrap_or(d.threshold_pct),
            lmdb_index: self.lmdb_index.unwrap_or(d.lmdb_index),
        }
    }
}
