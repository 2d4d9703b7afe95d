//! The known-order policy of one table as the agent holds it (`Prefetcher`, `SourceCtx::order`):
//! the access order read from its file, the window, and what the prefetch thread waits on;
//! what drives it is `known_order`'s.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use granary_shm::Table;
use serde::{Deserialize, Serialize};

use crate::placement::policy::KnownOrder;
use crate::sync::{Condvar, Mutex};

/// What a job asks for when it wants the known-order policy (`--access-order`, or
/// `[placement] policy = "known-order"`); sent in the attach request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderSpec {
    /// The access-order file: one path per line (relative to the source, or absolute under it),
    /// in the order the program opens them; repeated epochs may be listed or not.
    pub access_order: PathBuf,
    /// Bytes of upcoming files kept placed; `None`: 25 % of the source's first tier.
    pub prefetch_window: Option<u64>,
}

/// The default window: a quarter of the first tier, so three quarters stay for files the
/// program reads again next epoch (what the window costs in evictions).
pub fn default_window(first_tier_capacity: u64) -> u64 {
    first_tier_capacity / 4
}

/// The known-order policy of one table, and what drives it.
pub struct Prefetcher {
    pub order: KnownOrder,
    pub window: u64,
    /// Distinct files listed, and the lines that named nothing in the catalog (reported to the job).
    pub listed: usize,
    pub unknown: Vec<String>,
    /// Set by `on_request` when the position may have moved; the prefetch thread waits on it.
    pub(super) wake: (Mutex<bool>, Condvar),
    /// Entries taken back from SOURCE_ONLY (no room at the time) and the epoch they were:
    /// retried once per epoch, so a file that truly cannot be read costs one open per epoch.
    pub(super) retried: Mutex<HashMap<u32, u64>>,
}

impl Prefetcher {
    /// Reads and resolves the access-order file against the published table. Paths may be
    /// absolute under the source as named (`source`) or as resolved (`source_real`).
    pub fn build(
        spec: &OrderSpec,
        table: &Table,
        source: &Path,
        source_real: &Path,
        first_tier_capacity: u64,
    ) -> io::Result<Prefetcher> {
        let text = std::fs::read_to_string(&spec.access_order).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("access order {}: {e}", spec.access_order.display()),
            )
        })?;
        // `parse_listing` strips one root; map the other spelling onto it first.
        let text: String = text
            .lines()
            .map(|l| {
                let p = Path::new(l.trim());
                match p.strip_prefix(source_real) {
                    Ok(r) if p.is_absolute() && source_real != source => {
                        source.join(r).to_string_lossy().into_owned()
                    }
                    _ => l.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let (order, unknown) = KnownOrder::parse_listing(&text, source, |rel| {
            let idx = table.lookup(rel)?;
            let e = table.entry(idx)?;
            e.stat.is_file().then_some((idx, e.stat.size))
        });
        let window = spec
            .prefetch_window
            .unwrap_or_else(|| default_window(first_tier_capacity));
        let listed = order
            .iter()
            .map(|&(e, _)| e)
            .collect::<std::collections::HashSet<_>>()
            .len();
        Ok(Prefetcher {
            listed,
            order: KnownOrder::new(order, window),
            window,
            unknown,
            wake: (Mutex::new(false), Condvar::new()),
            retried: Mutex::default(),
        })
    }
}
