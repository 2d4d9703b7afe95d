//! `[mmap]` in the configuration file, and its values resolved (`MmapParams`):
//!
//! ```toml
//! [mmap]
//! mode = "prefetch"   # follow programs through their mappings and read ahead of them;
//!                     # "watch": follow and count, read nothing ahead; "off": follow nothing
//! distance = "8M"     # a reader is read ahead of once it has read this much forward
//! size = "50M"        # bytes read ahead at a time (less when memory is tight)
//! threshold = 75      # percent of the last window passed before the next is read
//! lmdb_index = true   # follow cursors over an LMDB in key order, not the file's page order
//! sequential_advice = true  # the preload advises MADV_SEQUENTIAL on followed read-only
//!                           # mappings that are not LMDB (faults read ahead, not around)
//! ```
//! Defaults are the best values of Haderbache et al.'s mmap pre-caching (distance 8–10 MiB,
//! size 50 MiB, threshold 75 %).

use serde::{Deserialize, Serialize};

/// What a configuration file (or a job) asks; unset keys take the defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmapConfig {
    pub mode: Option<Mode>,
    pub distance: Option<u64>,
    pub size: Option<u64>,
    pub threshold_pct: Option<u64>,
    pub lmdb_index: Option<bool>,
    pub sequential_advice: Option<bool>,
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
            sequential_advice: self.sequential_advice.or(under.sequential_advice),
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
            sequential_advice: self.sequential_advice.unwrap_or(d.sequential_advice),
        }
    }
}

/// What the agent does for mappings (`[mmap] mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Follow readers and read the source ahead of them.
    #[default]
    Prefetch,
    /// Follow readers (and count what they touch), read nothing ahead.
    Watch,
    /// Follow nothing.
    Off,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "prefetch" => Some(Mode::Prefetch),
            "watch" => Some(Mode::Watch),
            "off" => Some(Mode::Off),
            _ => None,
        }
    }
}

/// `[mmap]`, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmapParams {
    pub mode: Mode,
    /// How far a reader must read forward before it is read ahead of (the checkpoint
    /// distance of Haderbache et al., 8–10 MiB best).
    pub distance: u64,
    /// Bytes read ahead at a time (Haderbache et al.: 50 MiB best); less when memory is tight.
    pub size: u64,
    /// Percent of the last window the reader passes before the next is read (Haderbache: 75).
    pub threshold_pct: u64,
    /// Readers of an LMDB whose pages are not in key order are followed in key order
    /// (`lmdb_index`, `page_order`).
    pub lmdb_index: bool,
    /// The preload advises `MADV_SEQUENTIAL` on a program's read-only mapping of a followed file
    /// that is not an LMDB data file (docs/placement.md, "Faults read ahead of the row"): the
    /// table header carries it (`FLAG_NO_SEQUENTIAL_ADVICE` when off).
    pub sequential_advice: bool,
}

pub const DEFAULT_DISTANCE: u64 = 8 << 20;
pub const DEFAULT_SIZE: u64 = 50 << 20;
pub const DEFAULT_THRESHOLD_PCT: u64 = 75;

impl Default for MmapParams {
    fn default() -> MmapParams {
        MmapParams {
            mode: Mode::Prefetch,
            distance: DEFAULT_DISTANCE,
            size: DEFAULT_SIZE,
            threshold_pct: DEFAULT_THRESHOLD_PCT,
            lmdb_index: true,
            sequential_advice: true,
        }
    }
}
