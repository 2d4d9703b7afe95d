//! The journal of copies: `<tier>/<source id>/copies.journal`, the copies a table published on
//! that tier since its record (`copies`) was last saved, so that an agent killed between two
//! saves (SIGKILL, the OOM killer, a node's job ended by the batch system) costs the user none of
//! the copies whose record reached the file.
//!
//! - **Written as copies land, in batches.** Publishing a copy (`placement::copy::publish`)
//!   appends its record to a buffer of its tier; the buffer is written with one `write(2)`
//!   (`O_APPEND`, never synced) when it holds `BATCH` records, when it is older than
//!   `FLUSH_AFTER` (the agent's journal thread), and when the table is found with nothing
//!   pending (`SourceCtx::pending`): once the agent reports nothing pending, every copy it
//!   published is in the file. No call per copy, also when copies come one at a time (a program
//!   reading remote files one by one); a write a second at most besides. An agent killed within
//!   `FLUSH_AFTER` of its last copies, before anyone asked, loses their records: those copies
//!   are placed again.
//!   What is in the file survives the agent's death (it is in the kernel's page cache); a node
//!   that loses power loses what was not written back, as it may lose the copies themselves.
//! - **Folded at each save.** Saving the record (`Journal::save`) writes everything buffered,
//!   notes where the file ends, saves the record (which holds every copy published before that
//!   point, the table being read after it), and only then drops what the journal held up to that
//!   point (records written meanwhile are kept). A journal grown past `fold_after` records (a
//!   long job's churn of evictions and placements) is folded the same way by the agent's journal
//!   thread: its size stays proportional to the copies made since, and the cost of each fold is
//!   paid for by the records it drops. A fold that failed (a full or read-only tier) is tried
//!   again after `FOLD_RETRY`, not at the thread's next pass.
//! - **Read by the next table** (`cache::adopt::own`), after the record: each object's records,
//!   the record's first and then the journal's in order, are tried from the last; the first that
//!   is a copy of the file the table holds in the same version *and* names the copy on disk (a
//!   regular file of the user's, of the recorded size, inode and ctime) is taken. A copy evicted,
//!   replaced or moved after its record fails the second test; a file changed at the source
//!   fails the first (and its attach's validation). So the journal never vouches for a wrong
//!   copy: at worst a copy is placed again.
//! - **Damage costs copies, never bytes.** Records are fixed-size, each with its own magic,
//!   version and checksum: a torn tail (an agent killed inside a write) is ignored, a damaged or
//!   foreign record (garbage, another build's format) is skipped and counted in the log, and a
//!   file larger than any journal the table could have written is not read at all (logged). The
//!   record of copies is used in every case; nothing is deleted because of the journal. A build
//!   from before journals neither reads nor empties one: the records it leaves behind are checked
//!   on disk like any other when a later build reads them.
//!
//! Two agents of one user appending to one source's journal on one tier (two runtime
//! directories on a node) interleave whole batches; a fold by one drops the other's records,
//! which then costs copies, as two saves of the record always did (the last one wins).
//!
//! Format, little-endian, version 1: records of `ENTRY_LEN` (96) bytes, no header:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `GRNJRNL1` (version 1) |
//! | 8 | 80 | the copy, as a record of copies holds it (`copies::Record`) |
//! | 88 | 8 | xxh3-64 of the 88 bytes before |

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::copies::{self, Copies, Record};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{lock, Mutex};

/// The journal's name in a source's directory of a tier.
pub const FILE: &str = "copies.journal";

const MAGIC: &[u8; 8] = b"GRNJRNL1";
/// Bytes of one journal record.
pub const ENTRY_LEN: usize = 96;
/// Records buffered before they are written (12 KiB).
const BATCH: usize = 128;
/// A buffer older than this is written by the agent's journal thread (`flush_older`).
pub const FLUSH_AFTER: Duration = Duration::from_secs(1);
/// After a fold that failed (the record could not be saved: a full or read-only tier), the
/// journal thread asks for none for this long; each try reads the whole table.
const FOLD_RETRY: Duration = Duration::from_secs(60);
/// Records a journal may hold beyond twice the table's entries before it is folded
/// (`fold_after`), and beyond four times when read (`max_records`).
const SLACK: u64 = 100_000;

/// The journal records a table of `entries` entries is folded after.
pub fn fold_after(entries: u32) -> u64 {
    2 * entries as u64 + SLACK
}

/// The most records a journal of a table of `entries` entries can hold (folds lag a little
/// behind `fold_after`); a larger file is not read.
pub fn max_records(entries: u32) -> u64 {
    4 * entries as u64 + 2 * SLACK
}

/// The journals of one table, one per usable tier.
pub struct Journal {
    tiers: Vec<Option<Tier>>,
    /// Held across a fold: one fold at a time (a save and the journal thread's).
    fold: Mutex<()>,
    /// Set when the table is withdrawn: no write or fold after (a later table of the same
    /// tiers has the file).
    closed: AtomicBool,
}

struct Tier {
    dir: PathBuf,
    state: Mutex<TierState>,
}

#[derive(Default)]
struct TierState {
    /// Opened at the first write.
    file: Option<File>,
    buf: Vec<u8>,
    /// When the oldest buffered record was added.
    since: Option<Instant>,
    /// Records in the file (this process's count; the file's size when opened).
    records: u64,
    /// A write failed: said once in the log.
    failed: bool,
    /// When a save of this tier's record, or the journal's fold after it, last failed.
    fold_failed: Option<Instant>,
}

impl Journal {
    /// The journals of the source directories `dirs` (`<tier root>/<source id>` of each tier;
    /// `None`: a tier never placed on).
    pub fn new(dirs: Vec<Option<PathBuf>>) -> Journal {
        Journal {
            tiers: dirs
                .into_iter()
                .map(|d| {
                    d.map(|dir| Tier {
                        dir,
                        state: Mutex::new(TierState::default()),
                    })
                })
                .collect(),
            fold: Mutex::new(()),
            closed: AtomicBool::new(false),
        }
    }

    /// A copy published on `tier` (buffered; written when the batch is full).
    pub fn placed(&self, tier: usize, r: &Record) {
        let Some(Some(t)) = self.tiers.get(tier) else {
            return;
        };
        let mut s = lock(&t.state);
        s.buf.extend_from_slice(&encode(r));
        s.since.get_or_insert_with(Instant::now);
        if s.buf.len() >= BATCH * ENTRY_LEN {
            self.write(t, &mut s);
        }
    }

    /// Writes every buffered record.
    pub fn flush(&self) {
        for t in self.tiers.iter().flatten() {
            let mut s = lock(&t.state);
            if !s.buf.is_empty() {
                self.write(t, &mut s);
            }
        }
    }

    /// Writes the buffers holding a record older than `age` (the journal thread's pass; a
    /// buffer being written by a publisher is left to it).
    pub fn flush_older(&self, age: Duration) {
        for t in self.tiers.iter().flatten() {
            let Ok(mut s) = t.state.try_lock() else {
                continue;
            };
            if s.since.is_some_and(|at| at.elapsed() >= age) {
                self.write(t, &mut s);
            }
        }
    }

    /// True if the journal of a tier holds more records than a fold is worth
    /// (`fold_after(entries)`).
    pub fn wants_fold(&self, entries: u32) -> bool {
        !self.closed.load(Ordering::Acquire)
            && self.tiers.iter().flatten().any(|t| {
                let s = lock(&t.state);
                s.records > fold_after(entries)
                    && s.fold_failed.is_none_or(|at| at.elapsed() >= FOLD_RETRY)
            })
    }

    /// Saves the record of tier `tier` with `save` and drops from its journal what the record
    /// now holds (see the module comment for the order). `save` reads the table: it runs after
    /// everything published so far is written. With no journal on `tier`, `save` alone; once
    /// closed, nothing (the record of a withdrawn table is not saved over a later table's).
    pub fn save(&self, tier: usize, save: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let _fold = lock(&self.fold);
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(Some(t)) = self.tiers.get(tier) else {
            return save();
        };
        let upto = {
            let mut s = lock(&t.state);
            if !s.buf.is_empty() {
                self.write(t, &mut s);
            }
            // An earlier table's journal this one has not opened yet counts as written: the
            // table it is read into holds what it vouches for.
            match s.file.as_ref() {
                Some(f) => f.metadata()?.len(),
                None => std::fs::symlink_metadata(t.dir.join(FILE)).map_or(0, |m| m.len()),
            }
        };
        if let Err(e) = save() {
            lock(&t.state).fold_failed = Some(Instant::now());
            return Err(e);
        }
        // The record is saved: what follows only drops what it now holds from the journal. A
        // failure there is the journal's, not the record's, and costs nothing (records kept
        // are checked on disk when read).
        let dropped = self.drop_saved(t, upto);
        lock(&t.state).fold_failed = dropped.is_err().then(Instant::now);
        if let Err(e) = dropped {
            tracing::warn!(
                "cannot empty the journal of copies in {}: {e}",
                t.dir.display()
            );
        }
        Ok(())
    }

    /// Drops from `t`'s journal the records before `upto` (the record just saved holds them).
    fn drop_saved(&self, t: &Tier, upto: u64) -> io::Result<()> {
        let mut s = lock(&t.state);
        if !s.buf.is_empty() {
            self.write(t, &mut s);
        }
        let Some(f) = s.file.as_ref() else {
            // Never written by this table: a journal left by an earlier one, now in the record.
            return remove_leftover(&t.dir);
        };
        let end = f.metadata()?.len();
        if end <= upto {
            f.set_len(0)?;
            s.records = 0;
            return Ok(());
        }
        // Published while the record was saved: kept, in a journal of their own.
        let mut kept = vec![0u8; (end - upto) as usize];
        f.read_exact_at(&mut kept, upto)?;
        let file = replace(&t.dir, &kept)?;
        s.records = kept.len() as u64 / ENTRY_LEN as u64;
        s.file = Some(file);
        Ok(())
    }

    /// The table is withdrawn: what is buffered is written, and nothing more is, by this
    /// journal.
    pub fn close(&self) {
        let _fold = lock(&self.fold);
        self.flush();
        self.closed.store(true, Ordering::Release);
        for t in self.tiers.iter().flatten() {
            lock(&t.state).file = None;
        }
    }

    /// Writes `s`'s buffer (one `write(2)`); a failure is logged once and costs the records
    /// (their copies are placed again after a crash), never the journal's alignment.
    fn write(&self, t: &Tier, s: &mut TierState) {
        let buf = std::mem::take(&mut s.buf);
        s.since = None;
        if self.closed.load(Ordering::Acquire) || buf.is_empty() {
            return;
        }
        let res = (|| -> io::Result<()> {
            if s.file.is_none() {
                let (f, records) = open_append(&t.dir)?;
                s.file = Some(f);
                s.records = records;
            }
            let f = s.file.as_ref().ok_or_else(|| io::Error::other("no file"))?;
            write_whole(f, &buf)?;
            s.records += (buf.len() / ENTRY_LEN) as u64;
            Ok(())
        })();
        match res {
            Ok(()) => s.failed = false,
            Err(e) => {
                if !s.failed {
                    tracing::warn!(
                        "cannot write the journal of copies in {}: {e}; the copies placed since \
                         the last save are placed again if the agent dies before the next",
                        t.dir.display()
                    );
                }
                s.failed = true;
                // An agent restarted may still use it: dropped, reopened at the next write.
                s.file = None;
            }
        }
    }
}

/// One `write(2)` of whole records at the end of `f`; a short write (a full tier) is cut back to
/// the last whole record, so later batches stay aligned.
fn write_whole(f: &File, buf: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut w = f;
    match w.write(buf) {
        Ok(n) if n == buf.len() => Ok(()),
        Ok(_) | Err(_) => {
            let end = f.metadata()?.len();
            f.set_len(end - end % ENTRY_LEN as u64)?;
            Err(io::Error::other("short write"))
        }
    }
}

/// Opens (creating) the journal of `dir` for appending: a regular file of the user's, never
/// through a symlink; a torn tail an agent killed inside a write left is cut off. Returns it
/// and the records it holds.
fn open_append(dir: &Path) -> io::Result<(File, u64)> {
    // Readable too: a save copies out what landed while it ran (`Journal::save`).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join(FILE))?;
    let md = f.metadata()?;
    if !md.is_file() || md.uid() != crate::sys::uid() {
        return Err(io::Error::other("not a regular file of yours"));
    }
    let whole = md.len() - md.len() % ENTRY_LEN as u64;
    if whole != md.len() {
        f.set_len(whole)?;
    }
    Ok((f, whole / ENTRY_LEN as u64))
}

/// Makes `kept` the journal of `dir` (a new file renamed over it); returns it open for
/// appending.
fn replace(dir: &Path, kept: &[u8]) -> io::Result<File> {
    copies::replace_file(dir, FILE, kept, false)?;
    open_append(dir).map(|(f, _)| f)
}

/// Empties a journal an earlier table left in `dir` (its records are in the record just
/// saved); none is fine, and so is something else at its path (a symlink, a FIFO, a
/// directory: no table wrote it, none reads it).
fn remove_leftover(dir: &Path) -> io::Result<()> {
    let path = dir.join(FILE);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Ok(());
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => {
            let md = f.metadata()?;
            if md.is_file() && md.uid() == crate::sys::uid() && md.len() > 0 {
                f.set_len(0)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn encode(r: &Record) -> [u8; ENTRY_LEN] {
    let mut b = [0u8; ENTRY_LEN];
    b[..8].copy_from_slice(MAGIC);
    b[8..88].copy_from_slice(&copies::encode_record(r));
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..88]);
    b[88..].copy_from_slice(&sum.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Record> {
    if b.len() != ENTRY_LEN || &b[..8] != MAGIC {
        return None;
    }
    let sum = u64::from_le_bytes(b[88..].try_into().ok()?);
    (xxhash_rust::xxh3::xxh3_64(&b[..88]) == sum).then(|| copies::decode_record(&b[8..88]))
}

/// What a journal holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Its whole, undamaged records, in the order written.
    pub records: Vec<Record>,
    /// Records skipped: damaged, or of another format.
    pub damaged: u64,
    /// Bytes of a torn last record (an agent killed inside a write), ignored.
    pub torn: u64,
}

/// Why a journal is not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a regular file of yours")]
    NotYours,
    #[error("{0} bytes, more than a journal of this table can hold ({1} records)")]
    TooLarge(u64, u64),
}

/// The journal of the source directory `dir`, if it has one: a regular file of the user's,
/// never read through a symlink, of at most `max_records` records, read in pieces.
pub fn read(dir: &Path, max_records: u64) -> Result<Replay, ReadError> {
    use std::io::Read;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join(FILE))
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replay::default()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(ReadError::NotYours),
        Err(e) => return Err(e.into()),
    };
    let md = f.metadata()?;
    if !md.is_file() || md.uid() != crate::sys::uid() {
        return Err(ReadError::NotYours);
    }
    if md.len() / ENTRY_LEN as u64 > max_records {
        return Err(ReadError::TooLarge(md.len(), max_records));
    }
    let mut out = Replay::default();
    let mut r = std::io::BufReader::with_capacity(ENTRY_LEN * 1024, f.take(md.len()));
    let mut b = [0u8; ENTRY_LEN];
    loop {
        let mut got = 0;
        while got < ENTRY_LEN {
            match r.read(&mut b[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got < ENTRY_LEN {
            out.torn = got as u64;
            return Ok(out);
        }
        match decode(&b) {
            Some(rec) => out.records.push(rec),
            None => out.damaged += 1,
        }
    }
}

/// A source directory's record and journal, read together.
#[derive(Debug, Default)]
pub struct Merged {
    /// The record, without the objects its journal names.
    pub base: Option<Copies>,
    /// For each object the journal names, the last of its records (the record's, then the
    /// journal's) that is the copy on disk (`copies::is_the_copy`); an object none of whose
    /// records is, is in neither list.
    pub journaled: Vec<Record>,
    /// Why the journal, or some of it, was not used (for the log or the listing).
    pub problem: Option<String>,
}

impl Merged {
    /// Every copy vouched for, the record's and the journal's.
    pub fn all(&self) -> impl Iterator<Item = &Record> {
        self.base
            .iter()
            .flat_map(|c| c.records.iter())
            .chain(&self.journaled)
    }
}

/// Reads the journal of `dir` (at most `max_records`) over its record `rec` (see `Merged`):
/// one `fstatat` in `objects` per object the journal names, none for the others.
pub fn merge(dir: &Path, objects: &OwnedFd, rec: Option<Copies>, max_records: u64) -> Merged {
    let mut m = Merged {
        base: rec,
        ..Merged::default()
    };
    let replay = match read(dir, max_records) {
        Ok(r) => r,
        Err(e) => {
            m.problem = Some(format!("journal of copies not used: {e}"));
            return m;
        }
    };
    if replay.damaged > 0 {
        m.problem = Some(format!(
            "{} damaged or foreign records skipped in the journal of copies",
            replay.damaged
        ));
    }
    if replay.records.is_empty() {
        return m;
    }
    let mut later: HashMap<u64, Vec<Record>> = HashMap::new();
    for r in replay.records {
        later.entry(r.object).or_default().push(r);
    }
    if let Some(c) = m.base.as_mut() {
        c.records.retain(|r| match later.get_mut(&r.object) {
            Some(cands) => {
                cands.insert(0, *r);
                false
            }
            None => true,
        });
    }
    // One file per object name: at most one candidate is the copy on disk.
    m.journaled = later
        .into_values()
        .filter_map(|cands| {
            cands
                .into_iter()
                .rev()
                .find(|r| copies::is_the_copy(objects, r))
        })
        .collect();
    m
}

/// Empties the journal of `dir` once its record holds what it vouched for (copies moved out of
/// a directory no table uses).
pub fn discard(dir: &Path) -> io::Result<()> {
    remove_leftover(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u64) -> Record {
        copies::sample_record(i)
    }

    fn journal(d: &Path) -> Journal {
        Journal::new(vec![Some(d.to_path_buf())])
    }

    #[test]
    fn every_damage_is_refused_and_only_that_record_is_lost() {
        let b = encode(&rec(3));
        assert_eq!(decode(&b), Some(rec(3)));
        for i in 0..ENTRY_LEN {
            let mut d = b;
            d[i] ^= 0x01;
            assert_eq!(decode(&d), None, "byte {i} flipped went unnoticed");
        }
        let d = tempfile::tempdir().unwrap();
        let mut file = Vec::new();
        for i in 0..5 {
            file.extend_from_slice(&encode(&rec(i)));
        }
        file[2 * ENTRY_LEN + 40] ^= 0xff;
        file.extend_from_slice(&encode(&rec(9))[..50]);
        std::fs::write(d.path().join(FILE), &file).unwrap();
        let r = read(d.path(), 100).unwrap();
        assert_eq!(r.records, vec![rec(0), rec(1), rec(3), rec(4)]);
        assert_eq!((r.damaged, r.torn), (1, 50));
        assert!(matches!(read(d.path(), 4), Err(ReadError::TooLarge(..))));
        // Garbage of another format: every record skipped, nothing taken.
        std::fs::write(d.path().join(FILE), vec![0x5a; 10 * ENTRY_LEN + 3]).unwrap();
        let r = read(d.path(), 100).unwrap();
        assert_eq!((r.records.len(), r.damaged, r.torn), (0, 10, 3));
    }

    #[test]
    fn batches_reach_the_file_on_flush_and_when_full() {
        let d = tempfile::tempdir().unwrap();
        let j = journal(d.path());
        j.placed(0, &rec(0));
        assert_eq!(read(d.path(), 1000).unwrap().records, vec![]);
        j.flush();
        assert_eq!(read(d.path(), 1000).unwrap().records, vec![rec(0)]);
        for i in 1..=BATCH as u64 {
            j.placed(0, &rec(i));
        }
        // A full batch is written by the publisher, without a flush.
        let got = read(d.path(), 1000).unwrap().records;
        assert_eq!(got, (0..=BATCH as u64).map(rec).collect::<Vec<_>>());
        // A torn tail another agent left is cut before this one appends.
        let path = d.path().join(FILE);
        let mut b = std::fs::read(&path).unwrap();
        b.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &b).unwrap();
        let j = journal(d.path());
        j.placed(0, &rec(500));
        j.flush();
        let r = read(d.path(), 1000).unwrap();
        assert_eq!(r.records.last(), Some(&rec(500)));
        assert_eq!((r.damaged, r.torn), (0, 0));
    }

    #[test]
    fn a_save_keeps_only_what_landed_while_it_ran() {
        let d = tempfile::tempdir().unwrap();
        let j = journal(d.path());
        j.placed(0, &rec(1));
        j.placed(0, &rec(2));
        // Published while the record is saved: after the point the record holds.
        j.save(0, || {
            j.placed(0, &rec(3));
            Ok(())
        })
        .unwrap();
        assert_eq!(read(d.path(), 100).unwrap().records, vec![rec(3)]);
        j.save(0, || Ok(())).unwrap();
        assert_eq!(read(d.path(), 100).unwrap().records, vec![]);
        // A failed save drops nothing.
        j.placed(0, &rec(4));
        assert!(j.save(0, || Err(io::Error::other("full"))).is_err());
        assert_eq!(read(d.path(), 100).unwrap().records, vec![rec(4)]);
        // Closed: no more writes (a later table has the file).
        j.close();
        j.placed(0, &rec(5));
        j.flush();
        assert_eq!(read(d.path(), 100).unwrap().records, vec![rec(4)]);
        // A journal an earlier table left is emptied by a table that never wrote one.
        let j2 = journal(d.path());
        j2.save(0, || Ok(())).unwrap();
        assert_eq!(std::fs::metadata(d.path().join(FILE)).unwrap().len(), 0);
    }

    #[test]
    fn a_fold_that_failed_is_not_tried_again_at_once() {
        let d = tempfile::tempdir().unwrap();
        let j = journal(d.path());
        for i in 0..=fold_after(0) {
            j.placed(0, &rec(i % 7));
        }
        j.flush();
        assert!(j.wants_fold(0));
        // The record cannot be saved (a full tier): the journal thread would fold again at its
        // next pass, reading the whole table each time.
        assert!(j.save(0, || Err(io::Error::other("full"))).is_err());
        assert!(!j.wants_fold(0));
        // A save that works (the job's end) folds it.
        j.save(0, || Ok(())).unwrap();
        assert_eq!(read(d.path(), u64::MAX).unwrap().records, vec![]);
        assert!(!j.wants_fold(0));
    }

    #[test]
    fn something_else_at_the_journal_path_never_fails_a_save() {
        for what in ["dir", "fifo", "symlink"] {
            let d = tempfile::tempdir().unwrap();
            let path = d.path().join(FILE);
            let elsewhere = d.path().join("elsewhere");
            std::fs::write(&elsewhere, encode(&rec(1))).unwrap();
            match what {
                "dir" => std::fs::create_dir(&path).unwrap(),
                "fifo" => assert!(std::process::Command::new("mkfifo")
                    .arg(&path)
                    .status()
                    .unwrap()
                    .success()),
                _ => std::os::unix::fs::symlink(&elsewhere, &path).unwrap(),
            }
            // Saved by a table that never wrote a journal, then by one that tried to.
            let mut saved = 0;
            Journal::new(vec![Some(d.path().to_path_buf())])
                .save(0, || {
                    saved += 1;
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let j = journal(d.path());
            j.placed(0, &rec(2));
            j.save(0, || {
                saved += 1;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(saved, 2);
            assert_eq!(
                std::fs::read(&elsewhere).unwrap(),
                encode(&rec(1)),
                "{what}"
            );
            assert!(
                !std::fs::symlink_metadata(&path).unwrap().is_file(),
                "{what}"
            );
        }
    }

    #[test]
    fn never_read_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, encode(&rec(1))).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.path().join(FILE)).unwrap();
        assert!(matches!(read(d.path(), 100), Err(ReadError::NotYours)));
        let j = journal(d.path());
        j.placed(0, &rec(2));
        j.flush();
        assert_eq!(std::fs::read(&elsewhere).unwrap(), encode(&rec(1)));
    }
}
