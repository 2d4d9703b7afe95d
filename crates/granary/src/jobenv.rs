//! Reaching the job from inside a container. The program gets the table twice (see the preload
//! library's `discover`): as an fd it inherits across `exec` — which survives a container's own
//! `/dev/shm`, PID, user and network namespaces as long as the container is started by fork and
//! exec (bwrap, Apptainer, podman) — and as a path. Apptainer and Singularity get the variables
//! again as `APPTAINERENV_*`/`SINGULARITYENV_*`, which they set inside the container even with
//! `--cleanenv` or `--containall` (and which a setuid starter does not strip as it does
//! `LD_PRELOAD`).
//!
//! A container a daemon starts (`docker run`) inherits neither: `granary container-flags` prints
//! the binds and `-e` variables it needs, the table reached by its path in the bound runtime
//! directory.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use granary_agent::job::program::{launcher, Launcher};

/// The variables a process of the job needs, as `granary run` gives them to the program.
pub const JOB_VARS: [&str; 6] = [
    "LD_PRELOAD",
    "GRANARY_TABLE",
    "GRANARY_TABLE_FD",
    "GRANARY_TABLE_ID",
    "GRANARY_JOB_SLOT",
    "GRANARY_SOURCE",
];

/// The table fd the program inherits, open while it runs.
pub struct Handover {
    fd: OwnedFd,
    id: (u64, u64),
}

impl Handover {
    /// Opens the job's table for the program: read-write (it is mapped shared and written),
    /// inheritable, at a high number so the program's own fds keep the numbers they would have
    /// without granary.
    pub fn open(table: &Path) -> Result<Handover> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(table)
            .with_context(|| format!("opening table {}", table.display()))?;
        let id = granary_core::sys::dev_ino(&f)?;
        let floor = (granary_core::sys::open_files_limit() / 2).clamp(3, 1000) as i32;
        let fd = granary_core::sys::dup_inheritable(&f, floor)?;
        Ok(Handover { fd, id })
    }
}

/// Sets the job's variables on `cmd` (`ld_preload` is the full `LD_PRELOAD` value); without a
/// handover the program finds the table by its path only.
pub fn job_env(
    cmd: &mut std::process::Command,
    handover: Option<&Handover>,
    program: &OsStr,
    ld_preload: &OsStr,
    table: &Path,
    slot: u32,
    source: &Path,
) {
    let mut vars: Vec<(&str, OsString)> = vec![
        ("LD_PRELOAD", ld_preload.to_os_string()),
        ("GRANARY_TABLE", table.as_os_str().to_os_string()),
        ("GRANARY_JOB_SLOT", slot.to_string().into()),
    ];
    // The source as this job names it: a table made for a job that named it otherwise (the
    // real path, another symlink) serves this spelling too, once the library proved it leads
    // to the catalogued directory.
    if let Ok(s) = granary_core::source::normalize(source) {
        vars.push(("GRANARY_SOURCE", s.into_os_string()));
    }
    if let Some(h) = handover {
        vars.push(("GRANARY_TABLE_FD", h.fd.as_raw_fd().to_string().into()));
        vars.push(("GRANARY_TABLE_ID", format!("{}:{}", h.id.0, h.id.1).into()));
    }
    // Processes in this mount namespace see what the agent sees: they skip the visibility
    // checks (a metadata call on the source each).
    if let Ok(ns) = std::fs::metadata("/proc/self/ns/mnt") {
        vars.push((
            "GRANARY_MNT_NS",
            std::os::unix::fs::MetadataExt::ino(&ns).to_string().into(),
        ));
    }
    let prefixes: &[&str] = match launcher(program) {
        Some(Launcher::Apptainer) => &["APPTAINERENV_", "SINGULARITYENV_"],
        _ => &[],
    };
    for (k, v) in &vars {
        cmd.env(k, v);
        for p in prefixes {
            cmd.env(format!("{p}{k}"), v);
        }
    }
}
