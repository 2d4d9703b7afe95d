//! The record of a source's copies in one tier: `<tier>/<source id>/copies`, written for every
//! tier of a source each time the agent saves its catalog (the last job detached, the agent
//! stops, the source moves to other tiers, another mode of the dataset takes its copies), and
//! when the journal beside it (`journal`, the copies published since) grew large.
//!
//! It is what makes the copies the user's rather than one table's: whichever table of the
//! source comes next — on other tiers, after a restart — takes over each copy recorded here or
//! in the journal whose file it holds in the same version (`adopt`), and `granary cache` lists,
//! verifies and removes copies with no agent running. A copy nobody records is one no table can
//! vouch for (one whose journal record a killed agent never wrote): the next sweep removes it.
//!
//! Format, little-endian, version 1:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `GRNCOPYS` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | record length (80) |
//! | 16 | 8 | record count *n* |
//! | 24 | 8 | the source's last use (a job attached or detached): Unix time in ns |
//! | 32 | 4 | uid of the agent that saved it |
//! | 36 | 4 | mount (1: only the pack exists, the source path is where programs read it) |
//! | 40 | 16 | the dataset's root: device major, minor (u32), inode (u64) |
//! | 56 | 4 | source path length *s* |
//! | 60 | 4 | pack directory length *p* (0: not served from a pack) |
//! | 64 | 16 | reserved (0) |
//! | 80 | *s* + *p* | source path, pack directory; then zeros to a multiple of 8 |
//! | … | 80 × *n* | records |
//! | end − 8 | 8 | xxh3-64 of every byte before |
//!
//! A record: object id (u64), the file's identity when copied (inode u64, size u64, mtime s
//! i64, ctime s i64, mtime ns u32, ctime ns u32, device major u32, minor u32), the copy's xxh3
//! (u64, as placement recorded it) and the copy's own identity (inode u64, ctime ns u64).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use granary_shm::{StatRec, State, Table, Ts};

use crate::sync::statics;

/// The record's name in a source's directory of a tier.
pub const FILE: &str = "copies";

const MAGIC: &[u8; 8] = b"GRNCOPYS";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 80;
const RECORD_LEN: usize = 80;
/// Larger than any record file of a real dataset (80 bytes a copy): not read.
const MAX_LEN: u64 = 16 << 30;

/// Which dataset a table serves: its root's device and inode. Plain, packed and mounted tables
/// of one tree agree on it (a pack records the tree's root as it was packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RootId {
    pub dev_major: u32,
    pub dev_minor: u32,
    pub ino: u64,
}

impl RootId {
    pub fn of(t: &Table) -> RootId {
        t.entry(0).map_or(RootId::default(), |e| RootId {
            dev_major: e.stat.dev_major,
            dev_minor: e.stat.dev_minor,
            ino: e.stat.ino,
        })
    }
}

/// Whom the copies are of.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    /// When a job last used the source (Unix ns): attached, or detached.
    pub saved_ns: u64,
    pub uid: u32,
    pub root: RootId,
    /// The source's resolved path (with `mount`: where programs read the pack's tree).
    pub source: PathBuf,
    pub pack: Option<PathBuf>,
    pub mount: bool,
}

/// One complete copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub object: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub dev: (u32, u32),
    pub checksum: u64,
    /// The copy file's inode and ctime (ns), as clients check them.
    pub copy: (u64, u64),
}

impl Record {
    /// The placed copy of entry `idx` (complete, checksummed, its identity recorded).
    pub fn of_entry(t: &Table, idx: u32) -> Option<Record> {
        if t.state(idx).state() != State::Placed {
            return None;
        }
        let e = t.entry(idx)?;
        let (sum, copy) = (t.checksum(idx), t.copy_identity(idx));
        if !e.stat.is_file() || sum == 0 || copy.0 == 0 {
            return None;
        }
        Some(Record {
            object: e.object,
            ino: e.stat.ino,
            size: e.stat.size,
            mtime: (e.stat.mtime.sec, e.stat.mtime.nsec),
            ctime: (e.stat.ctime.sec, e.stat.ctime.nsec),
            dev: (e.stat.dev_major, e.stat.dev_minor),
            checksum: sum,
            copy,
        })
    }

    /// True if `s` is the version of the file this is a copy of (the identity of preload rule
    /// 11: device, inode, size, mtime, ctime).
    pub fn is_copy_of(&self, s: &StatRec) -> bool {
        s.is_file()
            && (s.dev_major, s.dev_minor) == self.dev
            && s.ino == self.ino
            && s.size == self.size
            && s.mtime == ts(self.mtime)
            && s.ctime == ts(self.ctime)
    }
}

fn ts((sec, nsec): (i64, u32)) -> Ts {
    Ts { sec, nsec, _pad: 0 }
}

/// A store's record: who and what.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Copies {
    pub header: Header,
    pub records: Vec<Record>,
}

impl Copies {
    /// The copies `t` holds on tier `tier`, as of now; a job last used the source at
    /// `last_use_ns` (Unix ns).
    pub fn of_table(t: &Table, tier: u32, last_use_ns: u64) -> Copies {
        let header = Header {
            saved_ns: last_use_ns,
            uid: crate::sys::uid(),
            root: RootId::of(t),
            source: path_of(t.source_real_root()),
            pack: t.pack_dir().map(path_of),
            mount: t.pack_mount(),
        };
        let records = (0..t.entry_count())
            .filter(|&i| t.state(i).tier() as u32 == tier)
            .filter_map(|i| Record::of_entry(t, i))
            .collect();
        Copies { header, records }
    }

    pub fn encode(&self) -> Vec<u8> {
        let h = &self.header;
        let src = h.source.as_os_str().as_bytes();
        let pack = h
            .pack
            .as_deref()
            .map_or(&b""[..], |p| p.as_os_str().as_bytes());
        let strings = (src.len() + pack.len()).next_multiple_of(8);
        let mut b = Vec::with_capacity(HEADER_LEN + strings + RECORD_LEN * self.records.len() + 8);
        b.extend_from_slice(MAGIC);
        put32(&mut b, VERSION);
        put32(&mut b, RECORD_LEN as u32);
        put64(&mut b, self.records.len() as u64);
        put64(&mut b, h.saved_ns);
        put32(&mut b, h.uid);
        put32(&mut b, h.mount as u32);
        put32(&mut b, h.root.dev_major);
        put32(&mut b, h.root.dev_minor);
        put64(&mut b, h.root.ino);
        put32(&mut b, src.len() as u32);
        put32(&mut b, pack.len() as u32);
        b.resize(HEADER_LEN, 0);
        b.extend_from_slice(src);
        b.extend_from_slice(pack);
        b.resize(HEADER_LEN + strings, 0);
        for r in &self.records {
            b.extend_from_slice(&encode_record(r));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        put64(&mut b, sum);
        b
    }

    /// The record in `b`, checked whole (magic, version, lengths, checksum).
    pub fn decode(b: &[u8]) -> Result<Copies, Error> {
        let header = decode_header(b)?;
        let n = u64_at(b, 16) as usize;
        let strings = (u32_at(b, 56) as usize + u32_at(b, 60) as usize).next_multiple_of(8);
        let start = HEADER_LEN + strings;
        let want = n
            .checked_mul(RECORD_LEN)
            .and_then(|r| r.checked_add(start + 8))
            .ok_or(Error::Damaged)?;
        if b.len() != want {
            return Err(Error::Damaged);
        }
        let body = &b[..b.len() - 8];
        if xxhash_rust::xxh3::xxh3_64(body) != u64_at(b, b.len() - 8) {
            return Err(Error::Damaged);
        }
        let records = body[start..]
            .chunks_exact(RECORD_LEN)
            .map(decode_record)
            .collect();
        Ok(Copies { header, records })
    }
}

/// One record's bytes, as the record file and the journal (`journal`) hold them.
pub(super) fn encode_record(r: &Record) -> [u8; RECORD_LEN] {
    let mut b = Vec::with_capacity(RECORD_LEN);
    put64(&mut b, r.object);
    put64(&mut b, r.ino);
    put64(&mut b, r.size);
    put64(&mut b, r.mtime.0 as u64);
    put64(&mut b, r.ctime.0 as u64);
    put32(&mut b, r.mtime.1);
    put32(&mut b, r.ctime.1);
    put32(&mut b, r.dev.0);
    put32(&mut b, r.dev.1);
    put64(&mut b, r.checksum);
    put64(&mut b, r.copy.0);
    put64(&mut b, r.copy.1);
    let mut out = [0u8; RECORD_LEN];
    out.copy_from_slice(&b);
    out
}

/// The record in `r` (`RECORD_LEN` bytes; the caller checked them).
pub(super) fn decode_record(r: &[u8]) -> Record {
    Record {
        object: u64_at(r, 0),
        ino: u64_at(r, 8),
        size: u64_at(r, 16),
        mtime: (u64_at(r, 24) as i64, u32_at(r, 40)),
        ctime: (u64_at(r, 32) as i64, u32_at(r, 44)),
        dev: (u32_at(r, 48), u32_at(r, 52)),
        checksum: u64_at(r, 56),
        copy: (u64_at(r, 64), u64_at(r, 72)),
    }
}

/// Why a record file is not used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a record of copies, or of another version")]
    Foreign,
    #[error("damaged (its checksum does not match)")]
    Damaged,
    #[error("not a regular file of yours")]
    NotYours,
}

/// The header alone (the start of a record file), for choosing among many.
fn decode_header(b: &[u8]) -> Result<Header, Error> {
    if b.len() < HEADER_LEN || &b[..8] != MAGIC {
        return Err(Error::Foreign);
    }
    if u32_at(b, 8) != VERSION || u32_at(b, 12) as usize != RECORD_LEN {
        return Err(Error::Foreign);
    }
    let (s, p) = (u32_at(b, 56) as usize, u32_at(b, 60) as usize);
    let strings = b
        .get(HEADER_LEN..HEADER_LEN + s + p)
        .ok_or(Error::Damaged)?;
    Ok(Header {
        saved_ns: u64_at(b, 24),
        uid: u32_at(b, 32),
        mount: u32_at(b, 36) != 0,
        root: RootId {
            dev_major: u32_at(b, 40),
            dev_minor: u32_at(b, 44),
            ino: u64_at(b, 48),
        },
        source: path_of(&strings[..s]),
        pack: (p > 0).then(|| path_of(&strings[s..])),
    })
}

/// Saves `c` as the record of the source directory `dir` (`<tier>/<source id>`): a temporary
/// file of its own (two threads may save one record at once), synced, then renamed.
pub fn save(dir: &Path, c: &Copies) -> io::Result<()> {
    replace_file(dir, FILE, &c.encode(), true)
}

/// Makes `bytes` the content of `dir/name` at once: written to a temporary file of this call's
/// own (`create_new`, never through a symlink), synced if `sync`, renamed over `name`; the
/// temporary file is removed when anything fails.
pub(super) fn replace_file(dir: &Path, name: &str, bytes: &[u8], sync: bool) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    static SEQ: statics::AtomicU64 = statics::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, statics::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{name}-{}-{n}", std::process::id()));
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|f| {
            f.write_all_at(bytes, 0)?;
            if sync {
                f.sync_data()?;
            }
            Ok(())
        })
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// True if the copy `r` records is in `dir` (a verified `objects` fd) as recorded: a regular
/// file of the user's, of the recorded size, inode and ctime — the file placement wrote.
pub fn is_the_copy(dir: &std::os::fd::OwnedFd, r: &Record) -> bool {
    crate::sys::copy_stat_at(dir, &granary_shm::object_name(r.object)).is_ok_and(|c| {
        c.is_regular
            && c.uid == crate::sys::uid()
            && c.size == r.size
            && (c.ino, c.ctime_ns) == r.copy
    })
}

/// The record of the source directory `dir`, if it has one: a regular file of the user's,
/// never read through a symlink, checked whole.
pub fn read(dir: &Path) -> Result<Option<Copies>, Error> {
    match read_bytes(dir, None)? {
        Some(b) => Copies::decode(&b).map(Some),
        None => Ok(None),
    }
}

/// Only the header of `dir`'s record (not checked: for choosing which records to read whole).
pub fn read_header(dir: &Path) -> Option<Header> {
    let b = read_bytes(dir, Some(HEADER_LEN as u64 + 2 * 4096)).ok()??;
    decode_header(&b).ok()
}

fn read_bytes(dir: &Path, limit: Option<u64>) -> Result<Option<Vec<u8>>, Error> {
    use std::io::Read;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(dir.join(FILE))
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Error::NotYours),
        Err(e) => return Err(e.into()),
    };
    let md = f.metadata()?;
    if !md.is_file() || md.uid() != crate::sys::uid() {
        return Err(Error::NotYours);
    }
    if md.len() > MAX_LEN {
        return Err(Error::Damaged);
    }
    let mut b = Vec::new();
    f.take(limit.unwrap_or(u64::MAX)).read_to_end(&mut b)?;
    Ok(Some(b))
}

/// Unix time now, in ns.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap_or_default()))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
}

fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

/// A record with every field set from `i` (tests of the record and of the journal).
#[cfg(test)]
pub(crate) fn sample_record(i: u64) -> Record {
    Record {
        object: 0xabc0 + i,
        ino: 100 + i,
        size: 4096 * i,
        mtime: (1_600_000_000 + i as i64, 7),
        ctime: (1_600_000_001, 999_999_999),
        dev: (8, 1),
        checksum: 0x1234_5678 + i,
        copy: (9000 + i, 1_700_000_000_123_456_789),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Copies {
        Copies {
            header: Header {
                saved_ns: 1_700_000_000_000_000_000,
                uid: 1000,
                root: RootId {
                    dev_major: 8,
                    dev_minor: 1,
                    ino: 42,
                },
                source: PathBuf::from("/pfs/data set"),
                pack: Some(PathBuf::from("/pfs/data.granary")),
                mount: true,
            },
            records: (0..3).map(sample_record).collect(),
        }
    }

    #[test]
    fn round_trips() {
        let c = sample();
        let b = c.encode();
        assert_eq!(b.len() % 8, 0);
        assert_eq!(Copies::decode(&b).unwrap(), c);
        assert_eq!(decode_header(&b).unwrap(), c.header);
        let empty = Copies::default();
        assert_eq!(Copies::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn every_damage_is_refused() {
        let b = sample().encode();
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(
                Copies::decode(&d).is_err(),
                "byte {i} flipped went unnoticed"
            );
        }
        for len in [0, 8, HEADER_LEN, b.len() - 1] {
            assert!(Copies::decode(&b[..len]).is_err(), "cut at {len}");
        }
        let mut longer = b.clone();
        longer.extend_from_slice(&[0; 8]);
        assert!(Copies::decode(&longer).is_err());
    }

    #[test]
    fn saved_and_read_through_the_file_system() {
        let d = tempfile::tempdir().unwrap();
        assert!(read(d.path()).unwrap().is_none());
        let c = sample();
        save(d.path(), &c).unwrap();
        assert_eq!(read(d.path()).unwrap().unwrap(), c);
        assert_eq!(read_header(d.path()).unwrap(), c.header);
        // A symlink in its place is never followed.
        std::fs::remove_file(d.path().join(FILE)).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::write(&elsewhere, c.encode()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.path().join(FILE)).unwrap();
        assert!(matches!(read(d.path()), Err(Error::NotYours)));
    }
}
