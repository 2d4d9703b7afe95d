//! The agent's side of `granary cache` and of sharing copies between the ways one dataset is
//! served: it knows which tables use which source directories, so it is the one that lets
//! them go — never one a job is attached to.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use granary_core::cache::remove;

use crate::agent::Agent;
use crate::protocol::{CacheInUse, CacheRefused, CacheTaken, Reply};
use crate::source::SourceState;

/// `Request::Cache`: every source's copies recorded as they are now, then each directory in
/// `clean` that no job uses taken away (renamed to trash, which the caller deletes).
pub(crate) fn serve(agent: &Agent, clean: &[PathBuf]) -> Reply {
    let sources = agent.source_states();
    for s in &sources {
        // Under the source's lock, as every other save: one attaching (a walk may take
        // minutes) saves its records itself when it is done.
        if let (Ok(_g), Some(ctx)) = (s.inner.try_lock(), s.ctx()) {
            s.save_records(&ctx);
        }
    }
    let in_use = sources
        .iter()
        .filter_map(|s| {
            let ctx = s.ctx()?;
            Some(CacheInUse {
                id: s.id.clone(),
                source: s.source.clone(),
                jobs: s.jobs_now.load(Ordering::Acquire),
                tiers: ctx
                    .space
                    .tiers
                    .specs()
                    .into_iter()
                    .map(|t| t.path)
                    .collect(),
            })
        })
        .collect();
    let (mut taken, mut refused) = (Vec::new(), Vec::new());
    for dir in clean {
        match take(agent, dir) {
            Ok(Some(trash)) => taken.push(CacheTaken {
                dir: dir.clone(),
                trash,
            }),
            Ok(None) => {}
            Err(reason) => refused.push(CacheRefused {
                dir: dir.clone(),
                reason,
            }),
        }
    }
    Reply::Cache {
        in_use,
        taken,
        refused,
        tiers: agent.registry.usage().into_iter().map(|t| t.path).collect(),
    }
}

/// Takes the source directory `dir` (`<tier root>/<source id>`) away unless a job uses a table
/// of its source id; an idle table of it is withdrawn first (it would claim copies that are gone).
fn take(agent: &Agent, dir: &Path) -> Result<Option<PathBuf>, String> {
    let (Some(root), Some(id)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str())) else {
        return Err("not a source directory".into());
    };
    let holders = |agent: &Agent| -> Vec<Arc<SourceState>> {
        agent
            .source_states()
            .into_iter()
            .filter(|s| s.id == id)
            .collect()
    };
    let mine = holders(agent);
    let mut guards = Vec::new();
    for s in &mine {
        let busy = || {
            format!(
                "in use by a job of {} (`granary status`); run the clean again once it ends",
                s.source.display()
            )
        };
        // A job joining a source keeps its tiers: one whose table lives in other tiers is no
        // obstacle.
        let uses = uses_root(s, root);
        if s.jobs_now.load(Ordering::Acquire) > 0 {
            if uses {
                return Err(busy());
            }
            continue;
        }
        // A job attaching holds this lock for its whole attach: busy too. One that just ended
        // holds it while its catalog is saved: worth a short wait.
        let mut g = lock_within(&s.inner, SAVE_WAIT).ok_or_else(busy)?;
        if g.jobs > 0 {
            if uses {
                return Err(busy());
            }
            continue;
        }
        if uses {
            s.retire(&mut g, false);
        }
        guards.push(g);
    }
    // New sources are made under the map's lock: with it held and every holder's lock, no job
    // can start a table of this id before the directory is gone.
    let map = agent.sources.lock().unwrap_or_else(|e| e.into_inner());
    let now: Vec<_> = map.values().filter(|s| s.id == id).cloned().collect();
    if now.iter().any(|s| !mine.iter().any(|m| Arc::ptr_eq(m, s))) {
        return Err("a job is starting on it; run the clean again".into());
    }
    let r = remove::take_away(root, id).map_err(|e| e.to_string());
    drop(map);
    drop(guards);
    r
}

/// How long a clean waits for a source's lock held by a job that ended (saving its catalog).
const SAVE_WAIT: Duration = Duration::from_secs(10);

/// `m` locked, if it comes free within `wait`.
fn lock_within<T>(m: &Mutex<T>, wait: Duration) -> Option<MutexGuard<'_, T>> {
    let until = Instant::now() + wait;
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// True if `s`'s current table has a tier at `root`.
fn uses_root(s: &SourceState, root: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let root = canon(root);
    s.ctx().is_some_and(|c| {
        (0..c.space.tiers.len()).any(|t| canon(&c.space.tiers.spec(t).path) == root)
    })
}

/// `SourceWishes`' release for the same dataset served another way: the source directories of
/// id `id` may give their copies to `me` once no job uses a table of them; an idle one records
/// its copies and is withdrawn first. (A job may attach to it right after: its table then finds
/// some copies gone and reads those files from the source — slower, never wrong.)
pub(crate) fn release(agent: &Agent, me: &Arc<SourceState>, id: &str) -> bool {
    for s in agent.source_states() {
        if Arc::ptr_eq(&s, me) || s.id != id {
            continue;
        }
        if s.jobs_now.load(Ordering::Acquire) > 0 {
            return false;
        }
        let Ok(mut g) = s.inner.try_lock() else {
            return false;
        };
        if g.jobs > 0 {
            return false;
        }
        s.retire(&mut g, true);
    }
    true
}
