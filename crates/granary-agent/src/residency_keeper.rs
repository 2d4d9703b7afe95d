//! The residency keeper: every `REBALANCE_PERIOD`, re-measures the page cache's room and moves
//! copies between resident and transient across every source's table
//! (`granary_core::placement::residency`); the pages of a demoted copy are dropped here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use granary_core::placement::residency::{Copies, CopyView, REBALANCE_PERIOD};
use granary_core::placement::SourceCtx;
use granary_core::sys;
use granary_shm::{object_name, State};

use crate::agent::Agent;

/// The keeper thread's loop.
pub fn keep(agent: Arc<Agent>) {
    while !agent.stopping.load(Ordering::Acquire) {
        std::thread::sleep(REBALANCE_PERIOD);
        rebalance(&agent);
    }
}

/// One rebalance over every current table. Also run when a table is published, before any
/// client maps it: its copies reused from an earlier job start resident, and a program reading
/// them before the next period would fill the page cache with them.
pub fn rebalance(agent: &Agent) {
    let Some(setup) = agent.setup.get() else {
        return;
    };
    let ctxs = agent.tables();
    let sets: Vec<_> = ctxs.iter().map(|c| TableCopies::new(c)).collect();
    // One rebalance at a time: the keeper and a publishing attach may both get here.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let m = setup
        .residency
        .rebalance(&sets, |k, i| sets[k].drop_pages(i));
    if m.demoted + m.promoted > 0 {
        tracing::debug!(
            "residency: target {} bytes, {} resident; {} copies demoted, {} promoted",
            setup.residency.target(),
            m.resident,
            m.demoted,
            m.promoted
        );
    }
}

/// One table's copies; tiers on memory file systems are left out (in RAM by construction).
struct TableCopies<'a> {
    ctx: &'a SourceCtx,
    cached_tier: Vec<bool>,
}

impl<'a> TableCopies<'a> {
    fn new(ctx: &'a SourceCtx) -> TableCopies<'a> {
        let cached_tier = ctx
            .space
            .dirs()
            .iter()
            .map(|d| d.as_ref().is_some_and(|d| !sys::is_memory_fs(d)))
            .collect();
        TableCopies { ctx, cached_tier }
    }

    fn drop_pages(&self, i: u32) {
        let t = &self.ctx.table;
        let w = t.state(i);
        let Some(e) = t.entry(i) else { return };
        if let Some(dir) = self.ctx.space.dir(w.tier() as usize) {
            if let Ok(f) = sys::open_read_at(dir, &object_name(e.object)) {
                sys::fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

impl Copies for TableCopies<'_> {
    fn count(&self) -> u32 {
        self.ctx.table.entry_count()
    }

    fn copy(&self, i: u32) -> Option<CopyView> {
        let w = self.ctx.table.state(i);
        let placed = match w.state() {
            State::Placed => true,
            State::Placing => false,
            _ => return None,
        };
        if !self.cached_tier.get(w.tier() as usize).copied()? {
            return None;
        }
        let size = self.ctx.table.entry(i)?.stat.size;
        Some(CopyView { size, placed })
    }

    fn is_transient(&self, i: u32) -> bool {
        self.ctx.table.is_transient(i)
    }

    fn set_transient(&self, i: u32, transient: bool) {
        granary_shm::lifecycle::set_transient(&self.ctx.table, i, transient);
    }
}
