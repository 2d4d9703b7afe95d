//! Reading, checksumming and compressing on every core, writing in order on one thread.
//!
//! A feeder hands out jobs (a file, or a 16-frame piece of a large one) in data order, holding
//! back while the bytes in flight exceed a budget; workers read and encode; the writer puts the
//! results back in order and appends them to the current partition. Output never depends on
//! which worker finished first.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use crossbeam_channel::{bounded, unbounded};
use xxhash_rust::xxh3::Xxh3;

use crate::codec::{frame_count, Encoder};
use crate::error::{PackError, Result};
use crate::format::entry::codec;
use crate::format::header::PARTITION_HEADER_LEN;
use crate::format::{checksum, partition_file, PartitionRec, Stat};
use crate::sys::{open_under, statx_at};
use crate::writer::options::Options;
use crate::writer::plan::{Cutter, Item};
use crate::writer::progress::Progress;
use crate::writer::walk::Source;

/// Frames per job of a large file.
const FRAMES_PER_JOB: u64 = 16;
/// Bytes read but not yet written, at most (a single larger job may exceed it alone).
const BUDGET: u64 = 128 << 20;
const WRITE_BUFFER: usize = 8 << 20;

/// Where an item's stored bytes ended up.
#[derive(Clone, Copy, Debug, Default)]
pub struct Loc {
    pub partition: u32,
    pub offset: u64,
    pub stored_len: u64,
    pub codec: u8,
    pub checksum: u64,
}

pub struct Written {
    pub locs: Vec<Option<Loc>>,
    pub partitions: Vec<PartitionRec>,
    pub files: Vec<File>,
}

/// One piece of one file for a worker to read, checksum and encode.
struct PieceTask {
    seq: u64,
    item: u32,
    piece: u64,
    pieces: u64,
    off: u64,
    len: u64,
}

struct Done {
    seq: u64,
    item: u32,
    piece: u64,
    pieces: u64,
    len: u64,
    codec: u8,
    bytes: Vec<u8>,
    /// Large framed files: this piece's frame words and its raw bytes (hashed in order by the
    /// writer).
    words: Vec<u32>,
    raw: Option<Vec<u8>>,
    /// Whole files: the checksum of their bytes.
    hash: Option<u64>,
}

/// Counts bytes in flight; the feeder waits here.
struct Budget {
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    fn take(&self, n: u64, stop: &AtomicBool) -> bool {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && *used + n > BUDGET {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            used = self
                .freed
                .wait_timeout(used, std::time::Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *used += n;
        !stop.load(Ordering::Relaxed)
    }
    fn give(&self, n: u64) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

fn changed(path: PathBuf, what: &str) -> PackError {
    PackError::Changed {
        path,
        what: what.into(),
    }
}

fn check_same(path: &Path, walked: &Stat, now: &Stat) -> Result<()> {
    if walked.same_identity(now) {
        Ok(())
    } else {
        Err(changed(
            path.to_path_buf(),
            "identity (inode, size, mtime or ctime) differs from the walk",
        ))
    }
}

fn work(
    src: &Source,
    items: &[Item],
    job: &PieceTask,
    enc: &mut Encoder,
    block: u32,
) -> Result<Done> {
    let it = &items[job.item as usize];
    let path = src.path_of(&it.rel);
    let io = |e| PackError::io(&path, e);
    let f = open_under(&src.fd, &it.rel, false).map_err(io)?;
    check_same(&path, &it.stat, &statx_at(&f, b"").map_err(io)?)?;
    let mut raw = vec![0u8; job.len as usize];
    f.read_exact_at(&mut raw, job.off).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            changed(path.clone(), "shrank")
        } else {
            PackError::io(&path, e)
        }
    })?;
    let last = job.piece + 1 == job.pieces;
    if last && f.read_at(&mut [0u8; 1], it.stat.size).map_err(io)? != 0 {
        return Err(changed(path, "grew"));
    }
    let holes = it.stat.blocks.saturating_mul(512) < it.stat.size;
    let mut done = Done {
        seq: job.seq,
        item: job.item,
        piece: job.piece,
        pieces: job.pieces,
        len: job.len,
        codec: codec::NONE,
        bytes: Vec::new(),
        words: Vec::new(),
        raw: None,
        hash: None,
    };
    if job.pieces == 1 {
        done.hash = Some(checksum(&raw));
        let e = enc.file(&raw, block, holes).map_err(io)?;
        done.codec = e.codec;
        done.bytes = e.bytes;
    } else if enc.compresses() || holes {
        done.codec = codec::FRAMED;
        for chunk in raw.chunks(block as usize) {
            done.words
                .push(enc.block(chunk, holes, &mut done.bytes).map_err(io)?);
        }
        done.raw = Some(raw);
    } else {
        done.bytes = raw;
    }
    check_same(&path, &it.stat, &statx_at(&f, b"").map_err(io)?)?;
    Ok(done)
}

struct Part {
    out: BufWriter<File>,
    pos: u64,
    rec: PartitionRec,
}

fn new_part(dir: &Path, n: u32) -> Result<Part> {
    let path = dir.join(partition_file(n));
    let f = File::create_new(&path).map_err(|e| PackError::io(&path, e))?;
    let mut out = BufWriter::with_capacity(WRITE_BUFFER, f);
    // The header is written last, once the pack id is known.
    out.write_all(&[0u8; PARTITION_HEADER_LEN])
        .map_err(|e| PackError::io(&path, e))?;
    Ok(Part {
        out,
        pos: PARTITION_HEADER_LEN as u64,
        rec: PartitionRec::default(),
    })
}

/// The large file being written piece by piece.
struct Open {
    start: u64,
    table_at: u64,
    words: Vec<u32>,
    hash: Xxh3,
}

pub fn run(
    src: &Source,
    items: &[Item],
    dir: &Path,
    opts: &Options,
    progress: &Progress,
) -> Result<Written> {
    let block = opts.block_size;
    let piece_len = block as u64 * FRAMES_PER_JOB;
    let threads = opts.threads.max(1);
    let stop = AtomicBool::new(false);
    let budget = Budget {
        used: Mutex::new(0),
        freed: Condvar::new(),
    };
    let (job_tx, job_rx) = bounded::<PieceTask>(threads * 2);
    let (done_tx, done_rx) = unbounded::<Result<Done>>();
    let total_raw: u64 = items
        .iter()
        .filter(|i| i.link_to.is_none())
        .map(|i| i.stat.size)
        .sum();
    let data_files = items.iter().filter(|i| i.link_to.is_none()).count() as u64;

    std::thread::scope(|s| {
        let feeder_stop = &stop;
        let budget = &budget;
        s.spawn(move || {
            let mut seq = 0;
            for (i, it) in items.iter().enumerate() {
                if it.link_to.is_some() {
                    continue;
                }
                let pieces = it.stat.size.div_ceil(piece_len).max(1);
                for piece in 0..pieces {
                    let off = piece * piece_len;
                    let len = (it.stat.size - off.min(it.stat.size)).min(piece_len);
                    if progress.stop.load(Ordering::Relaxed) || !budget.take(len, feeder_stop) {
                        return;
                    }
                    let job = PieceTask {
                        seq,
                        item: i as u32,
                        piece,
                        pieces,
                        off,
                        len,
                    };
                    seq += 1;
                    if job_tx.send(job).is_err() {
                        return;
                    }
                }
            }
        });
        for _ in 0..threads {
            let job_rx = job_rx.clone();
            let done_tx = done_tx.clone();
            let stop = &stop;
            s.spawn(move || {
                let mut enc = match Encoder::new(opts.compression) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = done_tx.send(Err(PackError::Invalid(format!("compressor: {e}"))));
                        return;
                    }
                };
                for job in job_rx.iter() {
                    if stop.load(Ordering::Relaxed) {
                        continue;
                    }
                    let r = progress
                        .check_stop()
                        .and_then(|()| work(src, items, &job, &mut enc, block));
                    if done_tx.send(r).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        drop(job_rx);
        let r = write_in_order(
            items, dir, opts, progress, &done_rx, budget, total_raw, data_files,
        );
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
            budget.freed.notify_all();
        }
        // Unblocks workers still sending, then the scope joins everyone.
        drop(done_rx);
        r
    })
}

#[allow(clippy::too_many_arguments)]
fn write_in_order(
    items: &[Item],
    dir: &Path,
    opts: &Options,
    progress: &Progress,
    done_rx: &crossbeam_channel::Receiver<Result<Done>>,
    budget: &Budget,
    total_raw: u64,
    data_files: u64,
) -> Result<Written> {
    let block = opts.block_size;
    let mut cutter = Cutter::new(total_raw, data_files, opts.partitions, opts.partition_size);
    let mut parts = vec![new_part(dir, 0)?];
    let mut locs: Vec<Option<Loc>> = vec![None; items.len()];
    let mut pending: BTreeMap<u64, Done> = BTreeMap::new();
    let mut next = 0u64;
    let mut open: Option<Open> = None;
    let ppath = |n: usize| dir.join(partition_file(n as u32));
    for r in done_rx.iter() {
        let d = r?;
        pending.insert(d.seq, d);
        while let Some(d) = pending.remove(&next) {
            next += 1;
            let it = &items[d.item as usize];
            if d.piece == 0 && cutter.cut_before(it.stat.size) {
                let n = parts.len();
                parts.push(new_part(dir, n as u32)?);
            }
            let pn = parts.len() - 1;
            let io = |e| PackError::io(ppath(pn), e);
            let part = parts.last_mut().expect("partition 0 exists");
            if d.pieces == 1 {
                part.out.write_all(&d.bytes).map_err(io)?;
                locs[d.item as usize] = Some(Loc {
                    partition: pn as u32,
                    offset: part.pos,
                    stored_len: d.bytes.len() as u64,
                    codec: d.codec,
                    checksum: d.hash.unwrap_or(0),
                });
                part.pos += d.bytes.len() as u64;
                part.rec.file_count += 1;
                part.rec.raw_bytes += it.stat.size;
                cutter.stored(it.stat.size, d.bytes.len() as u64);
            } else {
                if d.piece == 0 {
                    let framed = d.codec == codec::FRAMED;
                    let table = if framed {
                        frame_count(it.stat.size, block) * 4
                    } else {
                        0
                    };
                    open = Some(Open {
                        start: part.pos,
                        table_at: part.pos,
                        words: Vec::new(),
                        hash: Xxh3::new(),
                    });
                    part.out.write_all(&vec![0u8; table as usize]).map_err(io)?;
                    part.pos += table;
                }
                let o = open.as_mut().expect("opened at piece 0");
                o.hash.update(d.raw.as_deref().unwrap_or(&d.bytes));
                o.words.extend_from_slice(&d.words);
                part.out.write_all(&d.bytes).map_err(io)?;
                part.pos += d.bytes.len() as u64;
                if d.piece + 1 == d.pieces {
                    let o = open.take().expect("opened at piece 0");
                    if d.codec == codec::FRAMED {
                        let table: Vec<u8> = o.words.iter().flat_map(|w| w.to_le_bytes()).collect();
                        part.out.flush().map_err(io)?;
                        part.out
                            .get_ref()
                            .write_all_at(&table, o.table_at)
                            .map_err(io)?;
                    }
                    let stored = part.pos - o.start;
                    locs[d.item as usize] = Some(Loc {
                        partition: pn as u32,
                        offset: o.start,
                        stored_len: stored,
                        codec: d.codec,
                        checksum: o.hash.digest(),
                    });
                    part.rec.file_count += 1;
                    part.rec.raw_bytes += it.stat.size;
                    cutter.stored(it.stat.size, stored);
                }
            }
            budget.give(d.len);
            progress.bytes_done.fetch_add(d.len, Ordering::Relaxed);
            if d.piece + 1 == d.pieces {
                progress.files_done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // Stopped: the feeder and the workers gave up early, which is no error of theirs.
    progress.check_stop()?;
    let expected = items.iter().filter(|i| i.link_to.is_none()).count();
    if locs.iter().filter(|l| l.is_some()).count() != expected {
        return Err(PackError::Invalid("a packing worker stopped early".into()));
    }
    let mut out = Written {
        locs,
        partitions: Vec::new(),
        files: Vec::new(),
    };
    for (n, mut p) in parts.into_iter().enumerate() {
        p.out.flush().map_err(|e| PackError::io(ppath(n), e))?;
        p.rec.data_len = p.pos - PARTITION_HEADER_LEN as u64;
        out.partitions.push(p.rec);
        let f = p
            .out
            .into_inner()
            .map_err(|e| PackError::io(ppath(n), e.into_error()))?;
        out.files.push(f);
    }
    // Hard links share their first name's data.
    for (i, it) in items.iter().enumerate() {
        if let Some(p) = it.link_to {
            out.locs[i] = out.locs[p as usize];
        }
    }
    Ok(out)
}
