//! The memory limit of the cgroup the agent runs in: what it means for the copy buffers, and
//! how much of it the page cache has (`Probe`, for page-cache residency).
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
        let dir = Path::new(V1_ROOT).join(p.trim_start_matches('/'));
        if let Some(l) = std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|s| v1_hierarchical_limit(&s))
        {
            return Some(l);
        }
    }
    tightest(V2_ROOT, v2?, "memory.max").map(|(l, _)| l)
}

/// The smallest limit in `file` from the cgroup `rel` under `root` up to `root`, and the
/// directory that sets it.
fn tightest(root: &str, rel: &str, file: &str) -> Option<(u64, PathBuf)> {
    let root = Path::new(root);
    let mut dir = root.join(rel.trim_start_matches('/'));
    let mut best: Option<(u64, PathBuf)> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|s| parse_limit(&s));
        if let Some(l) = limit {
            if best.as_ref().is_none_or(|(b, _)| l < *b) {
                best = Some((l, dir.clone()));
            }
        }
        if dir == root || !dir.pop() {
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

/// Where the page cache's room is measured: the cgroup directory whose limit binds (the
/// smallest up the tree), or the whole node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    V1(PathBuf),
    V2(PathBuf),
    Node,
}

/// Memory the page cache may use for files, as last sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// The binding limit (the node's `MemTotal` without one).
    pub limit: u64,
    /// Everything charged against it that is not a file page: the program's and the agent's
    /// anonymous memory, shared memory (`/dev/shm` tiers, the catalog table), kernel objects.
    pub non_file: u64,
}

impl Room {
    /// What the page cache can hold at most right now.
    pub fn for_files(&self) -> u64 {
        self.limit.saturating_sub(self.non_file)
    }
}

impl Probe {
    /// The cgroup whose memory limit binds this process, else the node.
    pub fn find() -> Probe {
        let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
            return Probe::Node;
        };
        let (v1, v2) = parse_proc_cgroup(&text);
        if let Some((_, d)) = v1.and_then(|p| tightest(V1_ROOT, p, "memory.limit_in_bytes")) {
            return Probe::V1(d);
        }
        if let Some((_, d)) = v2.and_then(|p| tightest(V2_ROOT, p, "memory.max")) {
            return Probe::V2(d);
        }
        Probe::Node
    }

    /// Reads the room now; `None` if the files are gone or unreadable.
    pub fn sample(&self) -> Option<Room> {
        let read = |dir: &Path, f: &str| std::fs::read_to_string(dir.join(f)).ok();
        match self {
            Probe::V1(d) => room_from(
                parse_limit(&read(d, "memory.limit_in_bytes")?)?,
                read(d, "memory.usage_in_bytes")?.trim().parse().ok()?,
                &read(d, "memory.stat")?,
                ["total_active_file", "total_inactive_file"],
            ),
            Probe::V2(d) => room_from(
                parse_limit(&read(d, "memory.max")?)?,
                read(d, "memory.current")?.trim().parse().ok()?,
                &read(d, "memory.stat")?,
                ["active_file", "inactive_file"],
            ),
            Probe::Node => node_room(&std::fs::read_to_string("/proc/meminfo").ok()?),
        }
    }
}

impl Probe {
    /// File pages mapped into processes now (`total_mapped_file` / `file_mapped` / `Mapped:`):
    /// pages a program reads through a mapping stay referenced there, and the kernel reclaims
    /// other file pages before them.
    pub fn mapped(&self) -> Option<u64> {
        let read = |dir: &Path, f: &str| std::fs::read_to_string(dir.join(f)).ok();
        match self {
            Probe::V1(d) => stat_value(&read(d, "memory.stat")?, "total_mapped_file"),
            Probe::V2(d) => stat_value(&read(d, "memory.stat")?, "file_mapped"),
            Probe::Node => {
                let m = std::fs::read_to_string("/proc/meminfo").ok()?;
                m.lines()
                    .find_map(|l| {
                        let v = l.strip_prefix("Mapped:")?;
                        v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
                    })
                    .map(|kb| kb * 1024)
            }
        }
    }
}

const V1_ROOT: &str = "/sys/fs/cgroup/memory";
const V2_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup's room from its limit, its usage and the file-page counters of its `memory.stat`.
pub fn room_from(limit: u64, usage: u64, stat: &str, file_keys: [&str; 2]) -> Option<Room> {
    let file = file_keys
        .iter()
        .map(|k| stat_value(stat, k))
        .sum::<Option<u64>>()?;
    Some(Room {
        limit,
        non_file: usage.saturating_sub(file),
    })
}

/// The node's room from `/proc/meminfo` (kB values): all of it but what is neither free nor a
/// file page.
pub fn node_room(meminfo: &str) -> Option<Room> {
    let kb = |k: &str| {
        meminfo.lines().find_map(|l| {
            let v = l.strip_prefix(k)?.strip_prefix(':')?;
            v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
    };
    let total = kb("MemTotal")? * 1024;
    let free = kb("MemFree")? * 1024;
    let file = (kb("Active(file)")? + kb("Inactive(file)")?) * 1024;
    Some(Room {
        limit: total,
        non_file: total.saturating_sub(free + file),
    })
}

fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}
