//! `granary pack verify`: every checksum of a pack — the index's (checked when it opens), each
//! partition's header, every file's bytes and every symlink's target — and that the files'
//! stored bytes tile each partition exactly (no byte of a partition is unchecked). With a
//! source, every file is also compared byte for byte with the file it came from.
//!
//! What is wrong is reported once where it is: a partition that cannot be used (missing,
//! truncated, another pack's, its header damaged) in one line, then every file that cannot be
//! read from the pack in one line each, named — the files of such a partition (no reader uses
//! any of its bytes) and the files whose own bytes fail their checksum.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::error::{PackError, Result};
use crate::format::{checksum, partition_file};
use crate::listing::escape;
use crate::reader::Pack;
use crate::sys::open_under;
use crate::writer::walk::Source;

#[derive(Debug, Default)]
pub struct Report {
    pub files: u64,
    pub bytes: u64,
    pub partitions: u32,
    /// Files compared with the source.
    pub compared: u64,
    /// One line per problem: partitions that cannot be used, then files and symlinks in the
    /// index's order, each named once (escaped like `ls -b`).
    pub problems: Vec<String>,
    /// Partitions no reader uses (every file of them is in `damaged_files`).
    pub refused_partitions: u32,
    /// Files that cannot be read from the pack: in a refused partition, or their bytes damaged.
    pub damaged_files: u64,
    /// Files whose bytes are intact but differ from the source (or that it lacks).
    pub differing_files: u64,
}

impl Report {
    /// True when the pack can be served as it is (and matches the source, if one was given).
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// What became of one file.
enum Outcome {
    Intact { compared: bool },
    Damaged(String),
    Differs(String),
}

/// Checks everything; problems are collected, not fatal. `done` counts bytes checked. Only a
/// `source` that cannot be opened is an error.
pub fn verify(pack: &Pack, source: Option<&Path>, done: &AtomicU64) -> Result<Report> {
    let ix = pack.index();
    let src = source.map(Source::open).transpose()?;
    let mut report = Report {
        partitions: ix.header().partition_count,
        ..Default::default()
    };
    let mut problems = Vec::new();
    // Stored ranges per partition, to check that they tile it.
    let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); ix.header().partition_count as usize];
    let mut files = Vec::new();
    let mut links = BTreeMap::new();
    for i in 0..ix.len() {
        let Some(e) = ix.entry(i) else { continue };
        if e.stat.is_symlink() && checksum(ix.link_target(&e)) != e.checksum {
            links.insert(
                i,
                format!(
                    "{}: symlink target checksum mismatch",
                    escape(&ix.path_of(i))
                ),
            );
        }
        if e.stat.is_file() {
            files.push((i, e.partition));
            if !e.is_hardlink() {
                if let Some(r) = ranges.get_mut(e.partition as usize) {
                    r.push((e.offset, e.stored_len));
                }
            }
        }
    }
    // Partitions no reader will use: their number → the partition's file name.
    let mut refused = BTreeMap::new();
    for (n, mut r) in ranges.into_iter().enumerate() {
        let n = n as u32;
        let p = match pack.partition(n) {
            Ok(p) => p,
            Err(e) => {
                let count = files.iter().filter(|f| f.1 == n).count();
                problems.push(match count {
                    1 => format!("{e}; its one file cannot be read from the pack"),
                    n => format!("{e}; none of its {n} files can be read from the pack"),
                });
                refused.insert(n, partition_file(n));
                continue;
            }
        };
        r.sort_unstable();
        let mut at = p.header.header_len as u64;
        for (off, len) in r {
            if off != at {
                problems.push(format!(
                    "{}: {} at byte {at} (files must tile the partition)",
                    pack.partition_path(n).display(),
                    if off > at {
                        "unaccounted bytes"
                    } else {
                        "overlapping files"
                    }
                ));
            }
            at = off + len;
        }
        if at != p.header.header_len as u64 + p.header.data_len {
            problems.push(format!(
                "{}: unaccounted bytes at the end",
                pack.partition_path(n).display()
            ));
        }
    }
    report.refused_partitions = refused.len() as u32;
    let outcomes: Vec<(u32, Outcome)> = files
        .par_iter()
        .map(|&(i, part)| {
            let o = match refused.get(&part) {
                Some(name) => Outcome::Damaged(format!(
                    "{}: cannot be read: its partition {name} is damaged",
                    escape(&ix.path_of(i))
                )),
                None => check_file(pack, i, src.as_ref(), done),
            };
            (i, o)
        })
        .collect();
    // Files and symlinks in the index's order.
    let mut lines: BTreeMap<u32, String> = links;
    for (i, o) in outcomes {
        match o {
            Outcome::Intact { compared } => report.compared += u64::from(compared),
            Outcome::Damaged(l) => {
                report.damaged_files += 1;
                lines.insert(i, l);
            }
            Outcome::Differs(l) => {
                report.differing_files += 1;
                lines.insert(i, l);
            }
        }
    }
    problems.extend(lines.into_values());
    report.problems = problems;
    report.files = files.len() as u64;
    report.bytes = done.load(Ordering::Relaxed);
    Ok(report)
}

/// Checks one file (and compares it with the source when given).
fn check_file(pack: &Pack, i: u32, src: Option<&Source>, done: &AtomicU64) -> Outcome {
    let ix = pack.index();
    let rel = ix.path_of(i);
    let shown = escape(&rel);
    // The reader's errors name the file first (`stream`); others get its name here.
    let damaged = |e: PackError| {
        Outcome::Damaged(match e {
            PackError::Corrupt { path, what } => format!("{what} ({})", path.display()),
            e => format!("{shown}: {e}"),
        })
    };
    let count = |b: &[u8]| {
        done.fetch_add(b.len() as u64, Ordering::Relaxed);
    };
    let Some(src) = src else {
        return match pack.stream(i, &mut |b| {
            count(b);
            Ok(())
        }) {
            Ok(()) => Outcome::Intact { compared: false },
            Err(e) => damaged(e),
        };
    };
    let f = open_under(&src.fd, &rel, false);
    let mut at = 0u64;
    let mut same = f.is_ok();
    let mut buf = Vec::new();
    let streamed = pack.stream(i, &mut |b| {
        count(b);
        if let (true, Ok(f)) = (same, &f) {
            buf.resize(b.len(), 0);
            same = f.read_exact_at(&mut buf, at).is_ok() && buf == b;
        }
        at += b.len() as u64;
        Ok(())
    });
    if let Err(e) = streamed {
        return damaged(e);
    }
    let f = match f {
        Ok(f) => f,
        Err(e) => return Outcome::Differs(format!("{shown}: source: {e}")),
    };
    let longer = f.read_at(&mut [0u8; 1], at).map(|n| n > 0).unwrap_or(true);
    if !same || longer {
        return Outcome::Differs(format!("{shown}: differs from the source"));
    }
    Outcome::Intact { compared: true }
}
