//! `granary status` (the running agent: sources, tiers, files placed, jobs; with `--json`, the
//! agent's answer as is) and `granary stop`.

use anyhow::Result;
use granary_agent::client::{self, Stopped};
use granary_agent::protocol::ClusterStatus;
use granary_core::runtime::Runtime;
use granary_core::size::format_size;

use crate::flags::StatusArgs;
use crate::output::{out, say};

/// `granary stop`: the agent saves its catalogs and exits; waits until it is gone.
pub fn stop() -> Result<i32> {
    let rt = Runtime::open()?;
    match client::stop(&rt)? {
        Stopped::NotRunning => say(format!("granary: no agent running{}", dead_tables(&rt))),
        // An agent that had to be killed leaves its tables.
        Stopped::Stopped => say(format!("granary: agent stopped{}", dead_tables(&rt))),
    }
    Ok(0)
}

/// Removes what a killed agent left in the runtime directory (no agent is running); what to
/// add to "no agent running".
fn dead_tables(rt: &Runtime) -> String {
    match client::remove_dead_tables(rt) {
        0 => String::new(),
        n => format!(
            "; removed {n} table(s) a killed agent left in {}",
            rt.dir.display()
        ),
    }
}

pub fn main(args: StatusArgs) -> Result<i32> {
    let json = args.json;
    if let Some(p) = &args.metrics_file {
        crate::preflight::check_output("--metrics-file", p)?;
    }
    let rt = Runtime::open()?;
    let s = match client::status(&rt) {
        Ok(Some(s)) => s,
        Ok(None) => {
            if let Some(p) = &args.metrics_file {
                write_atomically(p, &granary_agent::metrics::render(None))?;
            }
            let note = dead_tables(&rt);
            out(&if json {
                "null".to_string()
            } else {
                format!("granary: no agent running{note}")
            });
            return Ok(0);
        }
        Err(e) if client::silent_pid(&e).is_some() => {
            say(format!("granary: {e}; `granary stop` ends it"));
            return Ok(1);
        }
        Err(e) => return Err(e),
    };
    if let Some(p) = &args.metrics_file {
        write_atomically(p, &granary_agent::metrics::render(Some(&s)))?;
    }
    if json {
        out(&serde_json::to_string_pretty(&s)?);
        return Ok(0);
    }
    out(&format!(
        "agent pid {}, up {:.0} s, {} job(s) attached, {}, runtime {}",
        s.pid,
        s.uptime_s,
        s.jobs,
        if s.cluster.is_some() {
            "serving until stopped".to_string()
        } else {
            let queued: u64 = s.sources.iter().map(|x| x.pending).sum();
            if s.jobs == 0 && queued > 0 {
                format!(
                    "idle timeout {:.0} s once its {queued} queued copies are done (at most {} min more)",
                    s.idle_timeout_s,
                    granary_agent::daemon::MAX_FINISHING.as_secs() / 60
                )
            } else {
                format!("idle timeout {:.0} s", s.idle_timeout_s)
            }
        },
        s.runtime_dir.display()
    ));
    if let Some(c) = &s.cluster {
        print_cluster(c);
    }
    if let Some(p) = &s.placement {
        out(&format!(
            "placement: {} workers, source reads of {}{}",
            p.workers,
            format_size(p.block_size),
            p.memory_limit
                .map(|l| format!(" (sized for a memory cgroup limit of {})", format_size(l)))
                .unwrap_or_default()
        ));
        if let Some(pc) = &p.page_cache {
            out(&format!(
                "page cache ({}): {} of copies resident, {}{}; {} demoted, {} promoted",
                pc.budget,
                format_size(pc.resident),
                pc.target
                    .map(|t| format!("{} may be", format_size(t)))
                    .unwrap_or_else(|| "no limit".into()),
                if pc.room > 0 {
                    format!(" ({} of room for file pages)", format_size(pc.room))
                } else {
                    String::new()
                },
                pc.demoted,
                pc.promoted
            ));
        }
    }
    // Tier numbers belong to a source (its table's tier t): the directories are listed by path.
    for t in &s.tiers {
        out(&format!(
            "tier directory {}: {} used of {} ({} reserved)",
            t.path.display(),
            format_size(t.used),
            format_size(t.capacity),
            format_size(t.reserved)
        ));
    }
    for src in &s.sources {
        let catalog = if src.busy {
            "catalog busy (being listed or saved)".to_string()
        } else {
            format!(
                "{} files, {}",
                src.catalog.files,
                format_size(src.catalog.bytes)
            )
        };
        out(&format!(
            "source {} ({}): {catalog}; {} placed ({}), {} pending; {} job(s){}",
            src.source.display(),
            src.id,
            src.files_placed_now,
            format_size(src.bytes_placed_now),
            src.pending,
            src.jobs,
            if src.busy { " or more" } else { "" }
        ));
        out(&format!(
            "  served: {} opens from tiers ({}), {} from the source ({})",
            src.served.tier_opens,
            format_size(src.served.tier_bytes),
            src.served.source_opens,
            format_size(src.served.source_bytes)
        ));
        for (i, t) in src.tiers.iter().enumerate() {
            out(&format!("  tier {i}: {}", t.path.display()));
        }
        if let Some(v) = &src.validation {
            out(&format!(
                "  validation of attach {}{}: {} directories and {} files checked, {} changed{}",
                v.epoch,
                if v.immutable { " (immutable)" } else { "" },
                v.dirs_checked,
                v.files_checked,
                v.changed,
                if v.done { ", done" } else { ", running" }
            ));
        }
        if src.held_dirs + src.held_files > 0 {
            out(&format!(
                "  held in the kernel's cache between jobs: {} directories and {} files",
                src.held_dirs, src.held_files
            ));
        }
        for w in &src.warnings {
            out(&format!("  warning: {w}"));
        }
    }
    Ok(0)
}

/// `granary status`'s lines for the cluster.
fn print_cluster(c: &ClusterStatus) {
    out(&format!(
        "cluster: rank {} of {} serving {}{}{}; held here: {} files ({}); replicas {}{}{}",
        c.rank,
        c.ranks,
        c.source.display(),
        match &c.pack {
            Some(p) if c.mount => format!(" from pack {} (only the pack exists)", p.display()),
            Some(p) => format!(" from pack {}", p.display()),
            None => String::new(),
        },
        if c.ready {
            ""
        } else {
            " (waiting for the catalog)"
        },
        c.files_owned,
        format_size(c.bytes_owned),
        c.replicas,
        if c.replicate.is_empty() {
            String::new()
        } else {
            format!(", on every rank: {}", c.replicate.join(" "))
        },
        if c.copies_pending > 0 {
            format!(", {} copies still to make", c.copies_pending)
        } else {
            String::new()
        }
    ));
    if let Some(ms) = c.mpi_stuck_ms {
        out(&format!(
            "  MPI stuck for {:.0} s on this rank (the MPI library does not return): it serves \
             what its tiers hold and reads the rest from the source",
            ms as f64 / 1000.0
        ));
    }
    for p in &c.peers {
        let (alive, silent, p_rank) = (p.alive, p.silent_ms, p.rank);
        let p = &p.numbers;
        out(&format!(
            "  rank {}: {}, holds {} files ({}), staged {}; from others {} ({}), to others {} \
             ({}); PFS {}, from the source instead {}; through buffers {}; {} job(s)",
            p_rank,
            match (alive, silent) {
                (true, _) => "alive".to_string(),
                (false, Some(ms)) => format!("silent for {:.1} s", ms as f64 / 1000.0),
                (false, None) => "written off".to_string(),
            },
            p.files_held,
            format_size(p.bytes_held),
            format_size(p.bytes_staged),
            p.remote_files,
            format_size(p.remote_bytes),
            p.peer_files,
            format_size(p.peer_bytes),
            format_size(p.pfs_bytes),
            p.fallbacks,
            format_size(p.bounce_bytes),
            p.jobs
        ));
    }
}

/// Writes `text` to `path` through a temporary file in its directory and a rename, so a
/// collector reading it never sees half a file.
fn write_atomically(path: &std::path::Path, text: &str) -> Result<()> {
    use anyhow::Context;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("--metrics-file {}", path.display()))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    // A collector runs as another user: the file is readable, as its directory says.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )?;
    tmp.persist(path)
        .with_context(|| format!("--metrics-file {}", path.display()))?;
    Ok(())
}
