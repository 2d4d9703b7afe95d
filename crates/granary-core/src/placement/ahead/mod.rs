//! Read-ahead across files: a program that opens a directory's files one after the other in
//! name order (DLIO's default loader, `for f in sorted(os.listdir(d))`) gets the next ones
//! fetched while it works on the current one (docs/placement.md, "Read-ahead in name order").
//!
//! Without it, a single reader of mid-size files leaves the source idle between two files for
//! as long as it takes to decode one (DLIO's reader: `numpy.load` plus its own per-sample work),
//! and epoch 1 runs at fetch + decode per file instead of at the source's bandwidth.
//!
//! - **Detection** (`on_open`, from the ring consumer): per directory, its children sorted by
//!   name (made once, when a file of it is first opened). A *run* follows a stretch of one
//!   directory being opened: an open at most `SPAN` places behind or ahead of its furthest file
//!   keeps the run (several workers of one loader open a few files out of order), any other open
//!   starts a new one. Up to `RUNS` runs are followed at once (several readers), the least
//!   recent replaced first. A run is sequential once it spans at least `MIN_OPENS` files and
//!   its opens cover at least three quarters of them: a reader in name order opens every file
//!   of its stretch, a random order hitting the same stretch leaves most of it unopened.
//! - **Read-ahead**: the files after the furthest one, in name order, that the agent fetches
//!   whole and in one request (the source's whole-fetch size up to `DIRECT_FETCH_MAX`: larger
//!   ones are already read in large blocks, smaller ones the program reads itself), up to
//!   `WINDOW` bytes of them, are claimed (UNPLACED → QUEUED, as a known-order prefetch claims)
//!   and queued for the pool ahead of small copies, behind fetches a program waits on. Only
//!   while a tier has room for them without eviction; a read-ahead never evicts.
//! - **Position**: opens of files already placed or claimed reach the agent only as
//!   `request::OPENED`, which clients push while the table asks for them
//!   (`FLAG_REPORT_OPENS`): asked for while a sequential run has files left to fetch, and no
//!   longer once none has (a later epoch over placed files costs the program no request).
//!
//! What it costs when the guess is wrong: at most `WINDOW` bytes per run read for files the
//! program then does not open (in an epoch that reads the whole directory, none).
//!
//! - `name_order`: the runs followed and the detection (`NameOrder::observe`), knowing nothing
//!   of `SourceCtx`; here: what the ring consumer calls on an open (`NameOrder::on_open`).

pub(super) mod name_order;

pub use name_order::{Ahead, NameOrder, MIN_OPENS, RUNS, SPAN, WINDOW};

use super::pool::{CopyMethod, CopyTask, Pool};
use super::source_ctx::SourceCtx;
use crate::sync::Arc;

impl NameOrder {
    /// A program opened entry `idx` (`OPEN_UNPLACED` or `OPENED`): follows the runs, claims what
    /// to fetch ahead and hands it to `pool`, and asks clients for their opens while a run has
    /// files left to fetch.
    pub fn on_open(&self, ctx: &Arc<SourceCtx>, idx: u32, pool: &Pool) {
        let t = &ctx.table;
        let room = |size: u64| {
            super::policy::free_space(&ctx.space.tiers)
                .iter()
                .enumerate()
                .any(|(i, &f)| f >= ctx.space.tiers.charge(i, size) && !ctx.space.tiers.is_full(i))
        };
        let ahead = self.observe(t, idx, &room);
        for e in ahead.claimed {
            pool.submit(CopyTask {
                ctx: ctx.clone(),
                entry: e,
                method: CopyMethod::Ahead,
                slot: 0,
            });
        }
        if t.reports_opens() != ahead.want_opens && ctx.order.is_none() {
            t.set_reports_opens(ahead.want_opens);
        }
    }
}
