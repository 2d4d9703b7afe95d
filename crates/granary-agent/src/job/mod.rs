//! A job's side of the agent (`granary run`): attaching — the agent walks the source or finds
//! its catalog meanwhile, and says how far it is — the job's table mapped with its counter slot,
//! and once the program exited the job's report: the program's I/O from the table's counters,
//! the agent's work on the source, and what kept granary from serving all of it (`warnings`,
//! from the program's file and command line: `program`).

pub mod program;
pub mod warnings;

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use granary_core::stats::{
    CatalogStats, JobPlaced, JobReport, MmapReport, PackDamage, PlacementStats, SourceReport,
};
use granary_core::tiers::TierUsage;
use granary_shm::{job, layout::MAX_TIERS, Mapping, Table};

use crate::client::Conn;
use crate::protocol::{Reply, Request};

/// A job attached to the agent: its table mapped, its counter slot, the agent's counters at
/// the start. The connection is the job's lease: dropping the `Job` detaches it.
pub struct Job {
    conn: Conn,
    pub table_path: PathBuf,
    pub slot: u32,
    /// The source's tiers as the agent uses them (another job's, if it was first).
    pub tiers: Vec<TierUsage>,
    pub catalog: CatalogStats,
    before: PlacementStats,
    _mapping: Mapping,
    pub table: Table,
    /// The agent's runtime directory (holds the table).
    pub runtime: PathBuf,
    /// What the agent warned about at attach (tiers refused or lost), and noted (another job's
    /// tiers or policy in use).
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

/// The walk's progress, as the agent reports it while a job waits for its table.
pub struct Walking {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// Sends the attach `request` and waits for the table (`progress` sees the walk's counts, and
/// may end the wait with an error), then maps it.
pub fn attach(
    mut conn: Conn,
    request: &Request,
    runtime: PathBuf,
    progress: &mut dyn FnMut(&Walking) -> Result<()>,
) -> Result<Job> {
    conn.send(request)?;
    loop {
        match conn.recv()? {
            Reply::Progress { files, dirs, bytes } => {
                progress(&Walking { files, dirs, bytes })?;
            }
            Reply::Attached {
                table,
                job_slot,
                tiers,
                notes,
                warnings,
                catalog,
                placement,
                ..
            } => {
                let (mapping, mapped) = map_table(&table)?;
                return Ok(Job {
                    conn,
                    table_path: table,
                    slot: job_slot,
                    tiers,
                    catalog,
                    before: placement,
                    _mapping: mapping,
                    table: mapped,
                    runtime,
                    warnings,
                    notes,
                });
            }
            Reply::Error {
                message,
                pack_damage,
            } => {
                return Err(Refused {
                    message,
                    pack_damage,
                }
                .into())
            }
            other => bail!("unexpected reply from the agent: {other:?}"),
        }
    }
}

/// The agent refused the attach: its message, and the damage of the pack (`--pack`) when that
/// was the cause (its index is damaged), for the report of the job run without granary.
#[derive(Debug)]
pub struct Refused {
    pub message: String,
    pub pack_damage: Option<PackDamage>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "agent: {}", self.message)
    }
}

impl std::error::Error for Refused {}

fn map_table(path: &Path) -> Result<(Mapping, Table)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening table {}", path.display()))?;
    let len = f.metadata()?.len() as usize;
    Mapping::map(std::os::fd::AsRawFd::as_raw_fd(&f), len)
        .with_context(|| format!("mapping table {}", path.display()))
}

/// How the job's program ran, for its report.
pub struct Ended<'a> {
    pub source: &'a Path,
    /// The pack the job was served from (`--pack`), as given.
    pub pack: Option<&'a Path>,
    /// Only the pack holds the tree (`--mount`).
    pub mount: bool,
    pub program: &'a OsStr,
    pub args: &'a [OsString],
    /// The preload library the program was given.
    pub preload: &'a Path,
    pub exit_status: i32,
    pub wall_time_s: f64,
}

/// A job's report, with the warnings that came up since the attach: from the agent (a tier
/// lost during the job), and about the program's processes (`warnings::of`) and the pack it
/// was served from (damaged: `PackDamage::warning`).
pub struct Reported {
    pub report: JobReport,
    pub agent_warnings: Vec<String>,
    pub program_warnings: Vec<String>,
}

impl Job {
    /// The job's report once its program exited; the connection is closed (the job detached).
    /// An agent that does not answer costs the report its figures, never the job.
    pub fn report(mut self, end: &Ended) -> Reported {
        let c = |w: usize| self.table.job_value(self.slot, w);
        let mut warnings = std::mem::take(&mut self.warnings);
        let mut agent_warnings = Vec::new();
        let pack = end
            .pack
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
        let req = Request::Stats {
            source: end.source.to_path_buf(),
            slot: self.slot,
            pack: pack.clone(),
        };
        let answered = self.conn.ask(&req);
        if answered.is_ok() {
            // The job ends here: the agent has counted it out when `granary run` returns.
            self.conn.leave();
        }
        let (delta, usage, mine, cluster, placing, mut pack_damage) = match answered {
            Ok(Reply::Stats {
                placement,
                tiers,
                warnings: now,
                job,
                cluster,
                placing,
                pack_damage,
                ..
            }) => {
                for w in now {
                    if !warnings.contains(&w) {
                        agent_warnings.push(w.clone());
                        warnings.push(w);
                    }
                }
                (
                    placement.since(&self.before),
                    tiers,
                    job,
                    cluster,
                    placing,
                    pack_damage,
                )
            }
            other => {
                let e = match other {
                    Err(e) => e,
                    Ok(r) => anyhow::anyhow!("unexpected reply {r:?}"),
                };
                let w = format!("{e:#}; the report lacks the agent's figures");
                agent_warnings.push(w.clone());
                warnings.push(w);
                (
                    PlacementStats::default(),
                    std::mem::take(&mut self.tiers),
                    JobPlaced::default(),
                    None,
                    0,
                    None,
                )
            }
        };
        let mut tiers = JobReport::tier_reports(&usage);
        for (i, t) in tiers.iter_mut().enumerate().take(MAX_TIERS) {
            t.files_served = c(job::TIER_FILES + i);
            t.bytes_served = c(job::TIER_BYTES + i);
            t.files_placed = mine.files.get(i).copied().unwrap_or(0);
            t.bytes_placed = mine.bytes.get(i).copied().unwrap_or(0);
        }
        let mmap = MmapReport {
            tier_bytes: c(job::MAP_LOCAL_BYTES),
            source_bytes: c(job::MAP_SOURCE_BYTES),
            faulted_bytes: c(job::MAP_FAULTED_BYTES),
            read_ahead_bytes: delta.mmap_read_ahead,
            windows: delta.mmap_windows,
            lmdb_local_locks: delta.lmdb_local_locks,
        };
        let program_warnings = warnings::of(&warnings::Job {
            table: &self.table,
            slot: self.slot,
            program: end.program,
            args: end.args,
            source: end.source,
            tiers: &tiers,
            runtime: &self.runtime,
            preload: end.preload,
        });
        let mut program_warnings = program_warnings;
        // The program's own refusals (the pack alone: the agent gone, or it found the damage).
        let refused = c(job::PACK_REFUSED);
        if let (true, Some(dir)) = (refused > 0, &pack) {
            let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
            pack_damage
                .get_or_insert_with(|| PackDamage::new(&dir))
                .refused_opens = refused;
        }
        if let Some(d) = &pack_damage {
            program_warnings.push(d.warning(end.mount));
        }
        warnings.extend(program_warnings.iter().cloned());
        // The copies are this job's; the rest of `placement` is the agent's work on the source.
        let placement = PlacementStats {
            files_placed: mine.files.iter().sum(),
            bytes_placed: mine.bytes.iter().sum(),
            tier_files_placed: mine.files.clone(),
            tier_bytes_placed: mine.bytes.clone(),
            ..delta
        };
        let report = JobReport {
            version: 1,
            source: end.source.display().to_string(),
            exit_status: end.exit_status,
            wall_time_s: end.wall_time_s,
            disabled: false,
            job_slot: self.slot,
            catalog: self.catalog.clone(),
            opens: c(job::OPENS),
            catalog_metadata_calls: c(job::CATALOG_META),
            fallbacks: c(job::FALLBACKS),
            source_io: SourceReport {
                opens: c(job::SOURCE_OPENS),
                reads: c(job::SOURCE_READS),
                bytes: c(job::SOURCE_BYTES),
                metadata_calls: c(job::SOURCE_META),
            },
            files_served_from_tiers: tiers.iter().map(|t| t.files_served).sum(),
            bytes_served_from_tiers: tiers.iter().map(|t| t.bytes_served).sum(),
            bytes_placed: placement.bytes_placed,
            tiers,
            placement,
            transient_drops: c(job::TRANSIENT_DROPS),
            fallback: None,
            fix: None,
            placing,
            pack: pack.map(|p| p.display().to_string()),
            warnings,
            mmap,
            cluster,
            pack_damage,
        };
        Reported {
            report,
            agent_warnings,
            program_warnings,
        }
    }
}
