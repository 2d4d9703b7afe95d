//! `granary pack verify`: every checksum of a pack — the index's (checked when it opens), each
//! partition's header, every file's bytes and every symlink's target — and that the files'
//! stored bytes tile each partition exactly (no byte of a partition is unchecked). With a
//! source, every file is also compared byte for byte with the file it came from.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::format::checksum;
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
    pub problems: Vec<String>,
}

/// Checks everything; problems are collected, not fatal. `done` counts bytes checked.
pub fn verify(pack: &Pack, source: Option<&Path>, done: &AtomicU64) -> Report {
    let ix = pack.index();
    let mut report = Report {
        partitions: ix.header().partition_count,
        ..Default::default()
    };
    let src = match source.map(Source::open).transpose() {
        Ok(s) => s,
        Err(e) => {
            report.problems.push(e.to_string());
            None
        }
    };
    // Stored ranges per partition, to check that they tile it.
    let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); ix.header().partition_count as usize];
    let mut files = Vec::new();
    for i in 0..ix.len() {
        let Some(e) = ix.entry(i) else { continue };
        if e.stat.is_symlink() && checksum(ix.link_target(&e)) != e.checksum {
            report.problems.push(format!(
                "{}: symlink target checksum mismatch",
                escape(&ix.path_of(i))
            ));
        }
        if e.stat.is_file() {
            files.push(i);
            if !e.is_hardlink() {
                if let Some(r) = ranges.get_mut(e.partition as usize) {
                    r.push((e.offset, e.stored_len));
                }
            }
        }
    }
    for (n, mut r) in ranges.into_iter().enumerate() {
        let p = match pack.partition(n as u32) {
            Ok(p) => p,
            Err(e) => {
                report.problems.push(e.to_string());
                continue;
            }
        };
        r.sort_unstable();
        let mut at = p.header.header_len as u64;
        for (off, len) in r {
            if off != at {
                report.problems.push(format!(
                    "{}: {} at byte {at} (files must tile the partition)",
                    pack.partition_path(n as u32).display(),
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
            report.problems.push(format!(
                "{}: unaccounted bytes at the end",
                pack.partition_path(n as u32).display()
            ));
        }
    }
    let compared = AtomicU64::new(0);
    let problems: Vec<String> = files
        .par_iter()
        .filter_map(|&i| {
            let r = check_file(pack, i, src.as_ref(), done);
            if r.as_ref().is_ok_and(|c| *c) {
                compared.fetch_add(1, Ordering::Relaxed);
            }
            r.err()
        })
        .collect();
    report.problems.extend(problems);
    report.files = files.len() as u64;
    report.bytes = done.load(Ordering::Relaxed);
    report.compared = compared.load(Ordering::Relaxed);
    report
}

/// Checks one file (and compares it with the source when given); `Ok(true)` if compared.
fn check_file(pack: &Pack, i: u32, src: Option<&Source>, done: &AtomicU64) -> Result<bool, String> {
    let ix = pack.index();
    let rel = ix.path_of(i);
    let shown = escape(&rel);
    let Some(src) = src else {
        pack.stream(i, &mut |b| {
            done.fetch_add(b.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        return Ok(false);
    };
    let f = open_under(&src.fd, &rel, false).map_err(|e| format!("{shown}: source: {e}"))?;
    let mut at = 0u64;
    let mut same = true;
    let mut buf = Vec::new();
    pack.stream(i, &mut |b| {
        done.fetch_add(b.len() as u64, Ordering::Relaxed);
        buf.resize(b.len(), 0);
        if same && (f.read_exact_at(&mut buf, at).is_err() || buf != b) {
            same = false;
        }
        at += b.len() as u64;
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    let longer = f.read_at(&mut [0u8; 1], at).map(|n| n > 0).unwrap_or(true);
    if !same || longer {
        return Err(format!("{shown}: differs from the source"));
    }
    Ok(true)
}
