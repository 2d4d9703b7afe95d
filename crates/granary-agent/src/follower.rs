//! The follower thread: every few milliseconds, each source's followed mappings are looked at
//! and read ahead of (`granary_core::placement::mmap`). It sleeps until a `MAPPED` request
//! wakes it when nothing is followed, and ticks slower when no reader moved for a while.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use granary_core::memlimit::Probe;
use granary_core::placement::mmap;

use crate::agent::Agent;

/// While some reader moves.
const FAST: Duration = Duration::from_millis(10);
/// While processes are followed but none moved for `SLOW_AFTER`.
const SLOW: Duration = Duration::from_millis(50);
const SLOW_AFTER: Duration = Duration::from_secs(1);
/// Nothing followed: only a request (which unparks the thread) brings work.
const IDLE: Duration = Duration::from_millis(500);
/// How often the page cache's room is measured.
const ROOM_EVERY: Duration = Duration::from_millis(250);

pub fn follow(agent: Arc<Agent>) {
    mmap::register_follower();
    let probe = Probe::find();
    let mut room = 0u64;
    let mut room_at: Option<Instant> = None;
    let mut moved_at = Instant::now();
    while !agent.stopping.load(Ordering::Acquire) {
        let Some(setup) = agent.setup.get() else {
            std::thread::park_timeout(IDLE);
            continue;
        };
        if room_at.is_none_or(|t| t.elapsed() >= ROOM_EVERY) {
            room = probe.sample().map_or(u64::MAX, |r| r.for_files());
            room_at = Some(Instant::now());
        }
        let mut followed = 0;
        for ctx in agent.tables() {
            if ctx.mmap.tick(&ctx, &setup.mmap, room, setup.block_size) {
                moved_at = Instant::now();
            }
            followed += ctx.mmap.followed();
        }
        let pause = if followed == 0 {
            IDLE
        } else if moved_at.elapsed() < SLOW_AFTER {
            FAST
        } else {
            SLOW
        };
        std::thread::park_timeout(pause);
    }
}
