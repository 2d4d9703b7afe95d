//! The memory limit of the cgroup the agent runs in, and what it means for the copy buffers.
//!
//! The agent usually lives in the job's memory cgroup (a Slurm job's, or the one `granary run`
//! was started in). Its copy buffers (one block per worker) are memory the job did not budget
//! for: with 8 MiB blocks and the 64 MiB cap of the benchmark's quick preset, a job that fit on
//! its own was OOM-killed under granary. So under a limit the buffers get at most
//! 1/`BUDGET_SHARE` of it: blocks shrink first (down to `MIN_BLOCK`), then workers.

use std::path::{Path, PathBuf};

/// The copy buffers may take this fraction of the cgroup's limit.
pub const BUDGET_SHARE: u64 = 16;
/// Smaller reads than this cost a PFS more per byte than they save us.
pub const MIN_BLOCK: u64 = 1 << 20;

/// cgroup v1 reports "no limit" as a huge page-aligned number; anything above this is no limit.
const UNLIMITED: u64 = 1 << 60;

/// The tightest memory limit on this process's cgroup and its ancestors, if any.
pub fn cgroup_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v1, v2) = parse_proc_cgroup(&text);
    if let Some(p) = v1 {
        // `hierarchical_memory_limit` already takes the ancestors into account.
        let dir = Path::new("/sys/fs/cgroup/memory").join(p.trim_start_matches('/'));
        if let Some(l) = std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|s| v1_hierarchical_limit(&s))
        {
            return Some(l);
        }
    }
    let p = v2?;
    let mut dir = PathBuf::from("/sys/fs/cgroup").join(p.trim_start_matches('/'));
    let mut best: Option<u64> = None;
    loop {
        if let Some(l) = std::fs::read_to_string(dir.join("memory.max"))
            .ok()
            .and_then(|s| parse_limit(&s))
        {
            best = Some(best.map_or(l, |b| b.min(l)));
        }
        if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
            return best;
        }
    }
}

/// The memory controller's path (cgroup v1) and the unified path (cgroup v2) from
/// `/proc/self/cgroup`.
pub fn parse_proc_cgroup(text: &str) -> (Option<&str>, Option<&str>) {
    let (mut v1, mut v2) = (None, None);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2 = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        }
    }
    (v1, v2)
}

/// `hierarchical_memory_limit` from a v1 `memory.stat`; `None` when unlimited.
pub fn v1_hierarchical_limit(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
        .and_then(parse_limit)
}

/// A limit file's value (`max` or a byte count); `None` when unlimited.
pub fn parse_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < UNLIMITED).then_some(v)
}

/// Workers and block size whose buffers fit `limit / BUDGET_SHARE`: the block shrinks first (to
/// whole MiB, not below `MIN_BLOCK`), then the workers (not below one). Unchanged without a
/// limit or when they fit.
pub fn fit(workers: usize, block: u64, limit: Option<u64>) -> (usize, u64) {
    let Some(limit) = limit else {
        return (workers, block);
    };
    let budget = limit / BUDGET_SHARE;
    let workers = workers.max(1);
    if workers as u64 * block <= budget {
        return (workers, block);
    }
    let per = budget / workers as u64 / MIN_BLOCK * MIN_BLOCK;
    if per >= MIN_BLOCK {
        return (workers, per.min(block));
    }
    let block = block.min(MIN_BLOCK);
    (((budget / block) as usize).clamp(1, workers), block)
}
