//! The job's warnings about what kept granary from serving the program: plain sentences, each
//! with its cause and its fix, made from the job's counters in the table (what the preload
//! library saw in each process: `job::PROCESSES`, `EXECS`, `SEEN`, `CREDS_MISMATCH`) and from
//! the program's file and command line. Empty when every process of the program was served.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use granary_core::stats::TierReport;
use granary_shm::{job, layout::MAX_TIERS, seen, Table, Unserved};

use super::program::why_not_loaded;

/// What the warnings are made from.
pub struct Job<'a> {
    pub table: &'a Table,
    pub slot: u32,
    pub program: &'a OsStr,
    pub args: &'a [OsString],
    pub source: &'a Path,
    pub tiers: &'a [TierReport],
    /// The agent's runtime directory (holds the table) and the preload library.
    pub runtime: &'a Path,
    pub preload: &'a Path,
}

/// `apptainer --bind P`, `docker run -v P:P`: how to show `p` inside a container.
fn flags_for(p: &Path) -> String {
    let p = p.display();
    format!("apptainer --bind {p}, docker/podman -v {p}:{p}")
}

fn bind_hint(p: &Path) -> String {
    format!("bind it at the same path ({})", flags_for(p))
}

pub fn of(j: &Job) -> Vec<String> {
    let c = |w: usize| j.table.job_value(j.slot, w);
    let (processes, execs, seen, creds) = (
        c(job::PROCESSES),
        c(job::EXECS),
        c(job::SEEN),
        c(job::CREDS_MISMATCH),
    );
    let mut out = Vec::new();
    let src = j.source.display();
    if processes == 0 {
        let why = why_not_loaded(j.program, j.args, j.source).unwrap_or_else(|| {
            format!(
                "its environment may have been cleared (env -i, a container's --cleanenv), it \
                 may be static or setuid, or the library did not load: it needs glibc 2.28 or \
                 later, and inside a container it must be visible at {} (bind {} at the same \
                 path: {}); GRANARY_LOG=debug shows what the library does",
                j.preload.display(),
                j.preload.parent().unwrap_or(Path::new("/")).display(),
                flags_for(j.preload.parent().unwrap_or(Path::new("/")))
            )
        });
        out.push(format!(
            "no process of the program loaded granary's preload library, so all of {src} came \
             from the source: {why}"
        ));
        return out;
    }
    if seen & seen::SOURCE_ELSEWHERE != 0 {
        out.push(format!(
            "the container shows the source {src} at another path, and granary serves reads of \
             {src} only: nothing it read there was served; {}",
            bind_hint(j.source)
        ));
    } else if seen & seen::SOURCE_HIDDEN != 0 {
        out.push(format!(
            "a process of the program did not see the source {src} at that path (a container \
             that does not bind it there, or it was moved): it read nothing through granary; {}",
            bind_hint(j.source)
        ));
    }
    for t in j.tiers.iter().take(MAX_TIERS) {
        if seen & (seen::TIER_HIDDEN << t.index) != 0 {
            let p = Path::new(&t.path);
            out.push(format!(
                "tier {} ({}) was not visible to the program (a container that does not bind \
                 it): its copies were read from the source instead; {}",
                t.index,
                t.path,
                bind_hint(p)
            ));
        }
    }
    if let Some(u) = j.table.unserved(j.slot) {
        out.push(unserved(&u, seen));
    }
    let missing = (1 + execs).saturating_sub(processes);
    if missing > 0 {
        let rt = j.runtime.display();
        let closed = if seen & seen::FD_LOST != 0 {
            ", and a process of the program closed the table fd (GRANARY_TABLE_FD) before \
             starting another"
        } else {
            ""
        };
        let lib = j.preload.parent().unwrap_or(Path::new("/"));
        out.push(format!(
            "{missing} program(s) started with granary's preload library did not attach to the \
             job, so what they read came from the source. Either a container hid the catalog \
             (its own /dev/shm, and no table fd{closed}): bind the runtime directory {rt} at the \
             same path ({}); or the library did not load there: it needs glibc 2.28 or later \
             and must be visible at {}: bind {} at the same path ({})",
            flags_for(j.runtime),
            j.preload.display(),
            lib.display(),
            flags_for(lib)
        ));
    }
    if creds > 0 {
        out.push(format!(
            "{creds} process(es) of the program ran with credentials other than the agent's (a \
             setuid program, changed groups, or a user namespace mapping other ids or hiding \
             groups): the catalog answers for the agent's permissions only, so they read from \
             the source; run them as the user who runs granary, with the same groups"
        ));
    }
    out
}

/// A program the job started that granary could not serve although it was given a path of the
/// dataset (`Table::unserved`): named, with why and the fix; `seen` says whether others had
/// other reasons.
fn unserved(u: &Unserved, seen: u64) -> String {
    let program = String::from_utf8_lossy(&u.program);
    let arg = String::from_utf8_lossy(&u.arg);
    let reasons = [seen::EXEC_STATIC, seen::EXEC_SECURE, seen::EXEC_ENV_CLEARED]
        .iter()
        .filter(|&&b| seen & b != 0)
        .count();
    let others = match u.count {
        1 => String::new(),
        n if reasons > 1 => format!(
            " ({} more such program start(s), some for other reasons: static, setuid or a \
             cleared environment)",
            n - 1
        ),
        n => format!(" ({} more such program start(s))", n - 1),
    };
    match u.why {
        seen::EXEC_STATIC => format!(
            "a process of the program started {program}, which is statically linked and cannot \
             load granary's library, with a path of the dataset ({arg}): what it read there came \
             from the source, not the tiers{others}; granary serves dynamically linked programs \
             only"
        ),
        seen::EXEC_SECURE => format!(
            "a process of the program started {program}, which is setuid, setgid or has file \
             capabilities, so the dynamic loader ignores LD_PRELOAD for it, with a path of the \
             dataset ({arg}): what it read there came from the source, not the tiers{others}; \
             run it without that bit"
        ),
        _ => format!(
            "a process of the program started {program} with an environment cleared of \
             granary's variables, which could not be put back (granary's library is not visible \
             where it runs, or there was no room: over 1,000 variables, or an LD_PRELOAD over 4 \
             KiB), with a path of the dataset ({arg}): what it read there came from the source, \
             not the tiers{others}; keep LD_PRELOAD, GRANARY_TABLE, GRANARY_TABLE_FD, \
             GRANARY_TABLE_ID and GRANARY_JOB_SLOT in its environment"
        ),
    }
}
