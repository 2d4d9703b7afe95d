//! How many of the pool's idle-class workers (small copies) may copy at once: about as many as
//! the node has cores that the program leaves free, never fewer than one.
//!
//! The workers run in the `SCHED_IDLE` class, so their own CPU time never delays the program.
//! What the class does not cover is the work each copy starts elsewhere: its write-back's block
//! I/O, interrupts and completions (ext4 converting the copy's unwritten extents, a loop
//! device's worker) run in the kernel's threads at the program's priority, on any core. Two
//! workers copying on the one core a one-process reader leaves free of two cost that reader
//! the second worker's write-back too, and buy no copy that would not come a little later
//! anyway (nobody waits for a small copy). So the number of workers that copy follows the CPU
//! the program uses, sampled from the node's and the agent's own CPU time every `PERIOD`:
//! the cores not busy, plus those the agent itself keeps busy, rounded to the nearest whole
//! core. A program that leaves the node idle (epoch 1 waiting on a slow PFS) gets every worker.
//!
//! `/proc/stat` is the node's CPU time (a container sees the host's); `/proc/self/stat` the
//! agent's, both in clock ticks. Anything unreadable: every worker copies (as before).

use std::time::{Duration, Instant};

use crate::sync::{lock, Mutex};

/// How often the share is measured again (and how long a worker over the share naps before it
/// looks again).
pub const PERIOD: Duration = Duration::from_millis(100);

/// CPU time in clock ticks: the node's busy and total, the agent's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    pub busy: u64,
    pub total: u64,
    pub own: u64,
}

pub struct CoreShare {
    /// The most workers that may copy at once (the pool's idle-class workers).
    max: usize,
    /// Cores of the node (`cpuN` lines of `/proc/stat`): `Ticks::total` counts all of them.
    cores: usize,
    state: Mutex<State>,
}

struct State {
    at: Option<Instant>,
    last: Option<Ticks>,
    allowed: usize,
}

impl CoreShare {
    pub fn new(max: usize) -> CoreShare {
        let max = max.max(1);
        CoreShare {
            max,
            cores: node_cores().unwrap_or(0),
            state: Mutex::new(State {
                at: None,
                last: None,
                allowed: max,
            }),
        }
    }

    /// Workers that may copy now, measured again when the last measure is `PERIOD` old.
    pub fn allowed(&self) -> usize {
        // Shuttle runs a test's threads one at a time and models no time: every worker.
        if cfg!(feature = "shuttle") || self.cores == 0 {
            return self.max;
        }
        let mut st = lock(&self.state);
        let now = Instant::now();
        if st.at.is_some_and(|at| now.duration_since(at) < PERIOD) {
            return st.allowed;
        }
        st.at = Some(now);
        let ticks = read_ticks();
        if let (Some(before), Some(after)) = (st.last, ticks) {
            let allowed = share(before, after, self.cores, self.max);
            if allowed != st.allowed {
                tracing::debug!("small copies: {allowed} of {} workers copy", self.max);
            }
            st.allowed = allowed;
        }
        st.last = ticks;
        st.allowed
    }
}

/// Workers allowed between two samples: the node's free cores over the interval (idle time plus
/// the agent's own busy time, in cores), rounded, within `1..=max`. No ticks passed (a clock
/// tick is 10 ms): as many as before is unknown, so `max`.
pub fn share(before: Ticks, after: Ticks, cores: usize, max: usize) -> usize {
    let total = after.total.saturating_sub(before.total);
    if total == 0 || cores == 0 {
        return max;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own).min(busy);
    let free = (total - busy.min(total) + own) as f64 / total as f64 * cores as f64;
    (free.round() as usize).clamp(1, max)
}

/// The node's and the agent's CPU time now.
fn read_ticks() -> Option<Ticks> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (busy, total) = parse_node(&stat)?;
    Some(Ticks {
        busy,
        total,
        own: parse_own(&own)?,
    })
}

fn node_cores() -> Option<usize> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let n = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    (n > 0).then_some(n)
}

/// `/proc/stat`'s first line: `cpu user nice system idle iowait irq softirq steal guest
/// guest_nice`. Busy = all but idle and iowait (guest time is inside user's already).
pub fn parse_node(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let idle = v[3] + v[4];
    let total: u64 = v.iter().sum();
    Some((total - idle, total))
}

/// `/proc/self/stat`: utime + stime (fields 14 and 15), counted after the command's closing
/// parenthesis (the command may hold spaces and parentheses).
pub fn parse_own(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    // After ")": state is field 3, so utime (14) is the 12th from here.
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(busy: u64, total: u64, own: u64) -> Ticks {
        Ticks { busy, total, own }
    }

    #[test]
    fn free_cores_decide() {
        // 2 cores, 100 ticks each over the interval.
        let z = t(0, 0, 0);
        // Nothing runs: both workers.
        assert_eq!(share(z, t(0, 200, 0), 2, 2), 2);
        // A one-process program on one core: one worker.
        assert_eq!(share(z, t(100, 200, 0), 2, 2), 1);
        // The agent's own copying is not the program's.
        assert_eq!(share(z, t(190, 200, 90), 2, 2), 1);
        assert_eq!(share(z, t(180, 200, 180), 2, 2), 2);
        // Every core busy with the program: still one, at idle priority.
        assert_eq!(share(z, t(200, 200, 0), 2, 2), 1);
        // Within max; no tick passed: max.
        assert_eq!(share(z, t(0, 800, 0), 8, 3), 3);
        assert_eq!(share(t(5, 10, 1), t(5, 10, 1), 2, 2), 2);
        // Counters that went backwards (never, but): no panic.
        assert_eq!(share(t(50, 100, 50), t(0, 200, 0), 2, 2), 2);
    }

    #[test]
    fn proc_files_parse() {
        let stat = "cpu  4705 150 1120 16250 520 0 30 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 1 2 3 4 5 6 7 8 0 0\nintr 1\n";
        assert_eq!(parse_node(stat), Some((4705 + 150 + 1120 + 30, 22775)));
        assert_eq!(parse_node("intr 1\n"), None);
        let own = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 300 0 0 0 17 5 0 0 20 0 9 0 100";
        assert_eq!(parse_own(own), Some(22));
        assert_eq!(parse_own("4242 (x) S 1"), None);
        // This process's own files parse.
        assert!(read_ticks().is_some());
        assert!(node_cores().unwrap() >= 1);
    }
}
