//! Notices a source's tier directory removed or renamed while the agent uses it (`rm -rf`, `mv`
//! of the tier, a tmpfs unmounted): the agent writes copies through directory fds, which keep
//! pointing at the orphan, where clients (who open copies by path, then check the directory's
//! identity) never find them. Without this, every epoch would copy every file again into a
//! directory nobody reads. A gone directory takes no more copies (`Tiers::mark_gone`) and every
//! job on the source is told.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use granary_core::placement::object_dir;

use crate::agent::Agent;

/// How often the tier directories are checked.
const PERIOD: Duration = Duration::from_secs(1);

/// Its own thread: a `stat` of a tier on a hung file system blocks here, not in the heartbeat.
pub fn watch(agent: Arc<Agent>) {
    while !agent.stopping.load(Ordering::Acquire) {
        std::thread::sleep(PERIOD);
        check(&agent);
    }
}

fn check(agent: &Agent) {
    for src in agent.source_states() {
        let Some(ctx) = src.ctx() else { continue };
        for (t, fd) in ctx.space.dirs().iter().enumerate() {
            let Some(fd) = fd else { continue };
            if ctx.space.tiers.is_gone(t) {
                continue;
            }
            let path = object_dir(&ctx.space.tiers.spec(t).path, &src.id);
            let opened = granary_core::sys::dev_ino(fd).ok();
            let there = std::fs::symlink_metadata(&path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            if opened.is_none() || opened == there || !ctx.space.tiers.mark_gone(t) {
                continue;
            }
            let w = format!(
                "tier {} ({}) was removed or renamed while in use: no more copies of {} go \
                 there (a job starting on the idle source begins afresh)",
                t,
                path.display(),
                src.source.display()
            );
            tracing::warn!("{w}");
            src.warn(w);
        }
    }
}
