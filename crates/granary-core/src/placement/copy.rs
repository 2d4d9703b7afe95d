//! What large-file fetches and small-file copies share: claiming the entry, reserving room
//! (before anything touches the source), opening the source, trying the policy's tiers, and
//! publishing a finished copy.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use granary_shm::{object_name, EntryRec, State, Table};

use granary_shm::lifecycle::{self, EntryCell};

use super::outcome::PlaceOutcome;
use super::source_ctx::SourceCtx;
use super::states::{self, Finish};
use crate::cache::copies::Record;
use crate::stats::AgentCounters;
use crate::sys;
use crate::tiers::Reservation;

/// Why one attempt to write a copy failed.
pub(super) enum CopyError {
    /// The source changed (size, mtime) while we read it: the entry becomes STALE.
    Changed,
    /// Reading the source failed: no tier will do better, the entry stays on the source.
    Source(std::io::Error),
    /// Writing the tier failed: release, maybe mark the tier full, try the next one.
    Tier(std::io::Error),
    /// Someone else moved the entry's state (a client invalidated it): stop, publish nothing.
    Lost,
}

/// An entry this worker owns (moved QUEUED → PLACING); its source not opened yet.
pub(super) struct Started {
    pub idx: u32,
    pub entry: EntryRec,
    pub path: PathBuf,
}

/// An entry this worker owns, with its source open.
pub(super) struct Opened {
    pub idx: u32,
    pub entry: EntryRec,
    pub path: PathBuf,
    pub src: File,
    /// The source's data extents (`sys::data_extents`): copies keep its holes.
    pub extents: Vec<(u64, u64)>,
}

impl Opened {
    /// True if the source has holes the copy must keep.
    pub fn sparse(&self) -> bool {
        self.extents.as_slice() != [(0, self.entry.stat.size)]
    }
}

/// A finished copy under its temporary name, as `place_on_tiers`' writer returns it.
pub(super) struct Written {
    pub name: Vec<u8>,
    pub sum: u64,
    pub file: File,
}

/// Moves `idx` QUEUED → PLACING. Touches nothing on the source: the caller reserves room
/// first, so a file that cannot be placed costs the source no open (a metadata operation on
/// a PFS). `Err` when there is nothing to do (the outcome says why; the state is final).
pub(super) fn begin(ctx: &SourceCtx, idx: u32) -> Result<Started, PlaceOutcome> {
    let t = &ctx.table;
    let cell = EntryCell { table: t, idx };
    if ctx.work.is_retired() {
        lifecycle::unclaim(&cell);
        return Err(PlaceOutcome::Skipped);
    }
    if !lifecycle::start(t, idx) {
        return Err(PlaceOutcome::Skipped);
    }
    let Some((entry, rel)) = t
        .entry(idx)
        .and_then(|e| t.rel_path_vec(idx).map(|r| (e, r)))
    else {
        lifecycle::give_up(&cell, State::SourceOnly);
        return Err(PlaceOutcome::SourceOnly);
    };
    let path = ctx.source_real.join(std::ffi::OsStr::from_bytes(&rel));
    Ok(Started { idx, entry, path })
}

/// Opens the source of an entry the caller owns, read-only, never through a symlink and never
/// blocking (a FIFO put in its place opens at once and then fails `matches_catalog`).
pub(super) fn open_source(
    counters: &AgentCounters,
    path: &std::path::Path,
) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    AgentCounters::add(&counters.source_opens, 1);
    sys::set_nonblock(&f, false)?;
    Ok(f)
}

/// Opens the source of a begun entry and checks it still matches the catalog.
pub(super) fn open_started(ctx: &SourceCtx, b: Started) -> Result<Opened, PlaceOutcome> {
    let src = match open_source(&ctx.counters, &b.path) {
        Ok(f) => f,
        Err(err) => {
            tracing::debug!("placement: cannot open {}: {err}", b.path.display());
            return Err(source_only(ctx, b.idx));
        }
    };
    if !matches_catalog(&src, &b.entry) {
        tracing::debug!("placement: {} changed since the walk", b.path.display());
        return Err(stale(ctx, b.idx));
    }
    let extents = sys::data_extents(&src, b.entry.stat.size);
    Ok(Opened {
        idx: b.idx,
        entry: b.entry,
        path: b.path,
        src,
        extents,
    })
}

/// No tier has room for the whole file: SOURCE_ONLY, counted as `no_room` (not a failure),
/// without a single call on the source.
pub(super) fn no_room(ctx: &SourceCtx, idx: u32) -> PlaceOutcome {
    AgentCounters::add(&ctx.counters.no_room, 1);
    lifecycle::give_up(
        &EntryCell {
            table: &ctx.table,
            idx,
        },
        State::SourceOnly,
    );
    PlaceOutcome::SourceOnly
}

/// The entry's state is whatever PLACING word this copy announced last; any other word means
/// a client took it away (INVALIDATE).
pub(super) fn still_ours(t: &Table, idx: u32) -> bool {
    t.state(idx).state() == State::Placing
}

pub(super) fn stale(ctx: &SourceCtx, idx: u32) -> PlaceOutcome {
    AgentCounters::add(&ctx.counters.stale, 1);
    lifecycle::give_up(
        &EntryCell {
            table: &ctx.table,
            idx,
        },
        State::Stale,
    );
    PlaceOutcome::Stale
}

pub(super) fn source_only(ctx: &SourceCtx, idx: u32) -> PlaceOutcome {
    AgentCounters::add(&ctx.counters.failures, 1);
    lifecycle::give_up(
        &EntryCell {
            table: &ctx.table,
            idx,
        },
        State::SourceOnly,
    );
    PlaceOutcome::SourceOnly
}

/// Writes the copy on `first` (reserved by the caller before the source was opened), then on
/// the policy's later tiers if a tier write fails: `write` makes the copy under a temporary
/// name in the tier's object directory and returns (that name, xxh3 of the bytes). Publishes
/// the first that succeeds through `states::finish` (commit, rename, PLACED — in that order); a
/// tier write error (ENOSPC, EIO, EDQUOT) marks that tier full. No error reaches a client: the
/// worst outcome is SOURCE_ONLY.
///
/// Before the first byte is written the copy is admitted to the page cache's resident set or
/// marked transient (`residency`), so the writer knows whether to keep its pages.
pub(super) fn place_on_tiers(
    ctx: &SourceCtx,
    cl: &mut Opened,
    order: &[usize],
    first: Reservation<'_>,
    write: impl FnMut(&mut Opened, usize, &OwnedFd) -> Result<Written, CopyError>,
) -> PlaceOutcome {
    let size = cl.entry.stat.size;
    let resident = ctx.residency.admit(size);
    lifecycle::set_transient(&ctx.table, cl.idx, !resident);
    let out = write_and_publish(ctx, cl, order, first, write);
    if resident && !matches!(out, PlaceOutcome::Placed { .. }) {
        ctx.residency.forget(size);
    }
    out
}

fn write_and_publish(
    ctx: &SourceCtx,
    cl: &mut Opened,
    order: &[usize],
    first: Reservation<'_>,
    mut write: impl FnMut(&mut Opened, usize, &OwnedFd) -> Result<Written, CopyError>,
) -> PlaceOutcome {
    let idx = cl.idx;
    let size = cl.entry.stat.size;
    let name = object_name(cl.entry.object);
    let mut next = Some(first);
    while let Some(res) = next.take() {
        let tier = res.tier();
        let Some(dir) = ctx.space.dir(tier) else {
            break;
        };
        let Written {
            name: tmp,
            sum,
            file,
        } = match write(cl, tier, dir) {
            Ok(x) => x,
            Err(CopyError::Changed) => return stale(ctx, idx),
            Err(CopyError::Lost) => return PlaceOutcome::Skipped,
            Err(CopyError::Source(err)) => {
                tracing::debug!("placement: reading {} failed: {err}", cl.path.display());
                return source_only(ctx, idx);
            }
            Err(CopyError::Tier(err)) => {
                drop(res);
                ctx.space.tier_failed(tier, &err);
                next = ctx.space.reserve_after(order, tier, size);
                continue;
            }
        };
        // The bytes we copied are the catalog's only if the source is still what it described.
        if !matches_catalog(&cl.src, &cl.entry) {
            let _ = sys::unlink_at(dir, &tmp);
            return stale(ctx, idx);
        }
        let out = publish(ctx, idx, res, dir, (&tmp, &name), &file, sum);
        match out {
            Finish::Placed { .. } => {
                return PlaceOutcome::Placed { tier, bytes: size };
            }
            Finish::RenameFailed => {
                tracing::debug!("placement: rename in tier {tier} failed");
                let _ = sys::unlink_at(dir, &tmp);
                next = ctx.space.reserve_after(order, tier, size);
            }
            // A client invalidated the file while we copied: the copy is void, and whoever
            // unlinked it (we or the INVALIDATE handler) gave the space back.
            Finish::Invalidated => return PlaceOutcome::Skipped,
        }
    }
    source_only(ctx, idx)
}

/// Publishes a complete copy of `idx` written under `names.0` in the reservation's tier
/// directory `dir`: renamed to `names.1`, its identity and checksum recorded, then PLACED
/// (`states::finish`), counted. Clients check what they open against the identity recorded
/// here, after the rename (which changes the ctime) and before PLACED; the checksum is read once
/// PLACED.
pub(super) fn publish(
    ctx: &SourceCtx,
    idx: u32,
    res: Reservation<'_>,
    dir: &OwnedFd,
    names: (&[u8], &[u8]),
    file: &File,
    sum: u64,
) -> Finish {
    let (t, tier) = (&ctx.table, res.tier());
    let size = t.entry(idx).map_or(0, |e| e.stat.size);
    let out = states::finish(
        &EntryCell { table: t, idx },
        &ctx.space.tiers,
        res,
        || {
            sys::rename_at(dir, names.0, names.1)?;
            let (ino, ctime) = sys::copy_identity(file)?;
            lifecycle::record_copy(t, idx, ino, ctime, sum);
            Ok(())
        },
        || sys::unlink_at(dir, names.1).is_ok(),
    );
    if let Finish::Placed { .. } = out {
        // Journaled before programs wake; written at the latest when this work is released.
        if let (Some(j), Some(r)) = (ctx.work.journal.get(), Record::of_entry(t, idx)) {
            j.placed(tier, &r);
        }
        t.notify_placed();
        let c = &ctx.counters;
        AgentCounters::add(&c.files_placed, 1);
        AgentCounters::add(&c.bytes_placed, size);
        AgentCounters::add(&c.tier_files[tier], 1);
        AgentCounters::add(&c.tier_bytes[tier], size);
    }
    out
}

/// True if the open source file is still the version the catalog describes: device, inode,
/// type, size, mtime and ctime (`StatRec::same_version`).
pub(super) fn matches_catalog(f: &File, e: &EntryRec) -> bool {
    sys::statx_fd(f).is_ok_and(|now| now.same_version(&e.stat))
}

/// `pwrite(2)` all of `buf` at `off`, retrying on EINTR; a short write of 0 is ENOSPC.
pub(super) fn write_all_at(out: &File, buf: &[u8], off: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match out.write_at(&buf[done..], off + done as u64) {
            Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Feeds `len` zero bytes (a hole of the source) to the copy's checksum.
pub(super) fn hash_zeros(h: &mut xxhash_rust::xxh3::Xxh3, mut len: u64) {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let n = len.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..n]);
        len -= n as u64;
    }
}

/// `sync_file_range` flags that start write-back of a range and wait until it is on the device.
pub(super) const SETTLE: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

/// Where tier `t`'s objects of a source live: `<tier path>/<source id>/objects`.
pub fn object_dir(tier_path: &std::path::Path, source_id: &str) -> PathBuf {
    tier_path.join(source_id).join("objects")
}

/// The agent's reads of a source file: through the page cache, with `POSIX_FADV_RANDOM` (no
/// kernel readahead: the agent's own block-sized reads are the requests, and every byte the
/// device gives it is counted as a source byte), in large reads (the kernel issues them as
/// requests of its largest size). Not `O_DIRECT`: a program that maps the file faults the source's pages itself and
/// must find the ones the agent read (or is reading) in the page cache, or every such byte is
/// read twice; the callers drop what they read behind them when no program maps the file.
pub(super) struct SourceReader;

impl SourceReader {
    pub fn new_buffered(file: &File) -> SourceReader {
        // A descriptor the agent opened itself: never O_DIRECT, but say so explicitly.
        let _ = sys::set_direct(file, false);
        // No readahead: the agent asks for whole blocks itself, and pages the kernel read ahead
        // for it would later pass for pages a program's reads brought in (`cached`), hiding
        // source bytes from the counters and reading past what a partial fetch needs.
        sys::fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM);
        // The agent's reads must not make pages look used: a page it copies after a program
        // read it would be kept over pages read ahead of that program (Linux ≥ 6.3).
        sys::fadvise(file, 0, 0, libc::POSIX_FADV_NOREUSE);
        SourceReader
    }

    /// One read at `off` (retried on EINTR).
    pub fn read_at(&mut self, file: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        loop {
            match file.read_at(buf, off) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    /// What of `[off, off + buf.len())` is in the page cache from `off` on, without a device
    /// read (`preadv2(RWF_NOWAIT)`). Returns the bytes copied into `buf` (0: nothing cached at
    /// `off`, or the file system cannot tell).
    pub fn cached(&mut self, file: &File, buf: &mut [u8], off: u64) -> usize {
        let mut got = 0;
        while got < buf.len() {
            match sys::pread_nowait(file, &mut buf[got..], off + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        got
    }

    /// Reads exactly `len` bytes at `off` into `buf`. Returns the number of read calls. A
    /// source shorter than `off + len` is `UnexpectedEof`.
    pub fn read_exact_at(
        &mut self,
        file: &File,
        buf: &mut [u8],
        off: u64,
        len: usize,
    ) -> std::io::Result<u64> {
        let mut done = 0usize;
        let mut calls = 0;
        while done < len {
            let at = off + done as u64;
            let n = self.read_at(file, &mut buf[done..len], at)?;
            calls += 1;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n.min(len - done);
        }
        Ok(calls)
    }
}
