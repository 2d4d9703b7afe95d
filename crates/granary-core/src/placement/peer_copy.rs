//! Copies whose bytes come from somewhere other than the source: another node of a cluster-mode
//! job (`granary serve`, crates/granary/src/cluster). They are published exactly like a fetch
//! from the source — a `.part` announced with its inode, progress after every piece, the
//! reservation committed, the rename, the identity and checksum recorded, then PLACED — so the
//! preload library serves them as any copy (a real local fd, checked at every open).
//!
//! The other side of a cluster is reached through `Remote`, which the pool asks before it reads
//! the source for a fetch (`pool::worker`), the ring consumer for a packed file another node
//! streams (`requests::handle_request`), and which is told of every entry a client voided.

use std::fs::File;
use std::os::fd::OwnedFd;

use granary_shm::lifecycle::{self, EntryCell};
use granary_shm::{object_name, part_name, EntryRec, State, Table};

use super::copy::{begin, publish, write_all_at};
use super::outcome::PlaceOutcome;
use super::source_ctx::SourceCtx;
use super::space::Space;
use super::states::{self, Finish};
use crate::stats::AgentCounters;
use crate::sync::Arc;
use crate::sys;

/// Why `receive` did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotStarted {
    /// The entry is not ours to place (not QUEUED, table retired).
    Skipped(PlaceOutcome),
    /// None of the tiers has room; the entry is QUEUED again (the caller decides).
    NoRoom,
}

/// A copy being received: the entry is PLACING (ours), room is reserved on its tier, and the
/// part file exists once the first piece arrives.
///
/// It owns its context (the table's `Arc`), so it can move between threads and outlive the
/// caller that started it: a program's remote read is started by the thread that takes the
/// program's request and finished by the communication thread as the last piece lands.
pub struct Receiving {
    ctx: Arc<SourceCtx>,
    idx: u32,
    entry: EntryRec,
    /// The reservation on `tier` (`Reservation::set_apart`: held until committed or released).
    res: Option<(usize, u64)>,
    /// The reservation's tier (kept once the reservation is committed or released).
    tier: usize,
    part: Option<File>,
    written: u64,
    /// xxh3-64 (the value placement records), with the CPU's vector unit chosen at run time:
    /// on a remote read's critical path it costs as much as the transfer in SSE2.
    hasher: twox_hash::XxHash3_64,
    /// Time spent hashing so far.
    hashing: std::time::Duration,
    /// The published copy's file, once `finish` placed it.
    kept: Option<File>,
}

/// Takes entry `idx` (QUEUED → PLACING) and reserves room for it on the first of `tiers` that
/// has it. Nothing is written yet.
pub fn receive(ctx: &Arc<SourceCtx>, idx: u32, tiers: &[usize]) -> Result<Receiving, NotStarted> {
    let b = begin(ctx, idx).map_err(NotStarted::Skipped)?;
    let Some(res) = ctx.space.reserve_on(tiers, b.entry.stat.size) else {
        lifecycle::requeue(&ctx.table, idx);
        return Err(NotStarted::NoRoom);
    };
    Ok(Receiving {
        ctx: ctx.clone(),
        idx,
        entry: b.entry,
        tier: res.tier(),
        res: Some(res.set_apart()),
        part: None,
        written: 0,
        hasher: twox_hash::XxHash3_64::new(),
        hashing: std::time::Duration::ZERO,
        kept: None,
    })
}

/// Why a received copy was not published.
#[derive(Debug)]
pub enum ReceiveError {
    /// Writing the tier failed (the tier may be full: marked so).
    Tier(std::io::Error),
    /// More bytes than the catalog's size, or fewer at the end, or another checksum: the sender
    /// does not hold this version.
    Mismatch(&'static str),
    /// A client took the entry away meanwhile (INVALIDATE).
    Lost,
}

impl std::fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReceiveError::Tier(e) => write!(f, "writing the tier: {e}"),
            ReceiveError::Mismatch(what) => write!(f, "received copy has another {what}"),
            ReceiveError::Lost => write!(f, "the entry was invalidated meanwhile"),
        }
    }
}

impl Receiving {
    /// The entry being received.
    pub fn idx(&self) -> u32 {
        self.idx
    }

    pub fn size(&self) -> u64 {
        self.entry.stat.size
    }

    /// Bytes appended so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Time spent checksumming the bytes so far (one thread).
    pub fn hashing(&self) -> std::time::Duration {
        self.hashing
    }

    pub fn tier(&self) -> usize {
        self.tier
    }

    fn dir(&self) -> Option<&OwnedFd> {
        self.ctx.space.dir(self.tier())
    }

    /// Creates the part file and announces it (PLACING | tier): from here on clients may read
    /// it up to the progress.
    fn open_part(&mut self) -> Result<(), ReceiveError> {
        let dir = self.dir().ok_or(ReceiveError::Lost)?;
        let name = part_name(self.entry.object);
        let _ = sys::unlink_at(dir, &name);
        let out = sys::create_excl_at(dir, &name, 0o600).map_err(ReceiveError::Tier)?;
        let (ino, _) = sys::copy_identity(&out).map_err(ReceiveError::Tier)?;
        self.part = Some(out);
        if !lifecycle::announce_part(&self.ctx.table, self.idx, self.tier() as u8, ino) {
            return Err(ReceiveError::Lost);
        }
        Ok(())
    }

    /// The part file, created and announced, at its final length (holes until written): for a
    /// sender that writes the bytes into it itself (a mapping). Report them with `landed`.
    pub fn part_file(&mut self) -> Result<&File, ReceiveError> {
        if self.part.is_none() {
            self.open_part()?;
            let out = self.part.as_ref().ok_or(ReceiveError::Lost)?;
            if sys::allocate(out, self.size()).is_err() {
                out.set_len(self.size()).map_err(ReceiveError::Tier)?;
            }
        }
        self.part.as_ref().ok_or(ReceiveError::Lost)
    }

    /// The part file made of `file`, a file of the agent's own named `from` in this copy's tier
    /// directory that nobody else has open (a recycled copy, `evict_to`, or one made ahead):
    /// renamed to the part's name (unless it has it already: a recycled copy renamed straight
    /// to it), cut or grown to the copy's size, and announced. Its pages are reused as they are
    /// (every byte is written before the copy is published). `known`: its inode and length,
    /// when the caller has just read them (a rename changes neither): one `fstat` less on a
    /// program's critical path.
    pub fn part_from(
        &mut self,
        file: File,
        from: &[u8],
        known: Option<(u64, u64)>,
    ) -> Result<&File, ReceiveError> {
        if self.part.is_some() {
            return Err(ReceiveError::Lost);
        }
        let dir = self.dir().ok_or(ReceiveError::Lost)?;
        let name = part_name(self.entry.object);
        if from != name.as_slice() {
            // Over a part a killed agent may have left: rename replaces it.
            sys::rename_at(dir, from, &name).map_err(ReceiveError::Tier)?;
        }
        let (ino, len) = match known {
            Some(k) => k,
            None => {
                use std::os::unix::fs::MetadataExt;
                let md = file.metadata().map_err(ReceiveError::Tier)?;
                (md.ino(), md.len())
            }
        };
        // Cut to the copy's size; or grown, its new pages allocated in one call if it can be.
        let grown = len < self.size() && sys::allocate(&file, self.size()).is_ok();
        if len != self.size() && !grown {
            file.set_len(self.size()).map_err(ReceiveError::Tier)?;
        }
        self.part = Some(file);
        if !lifecycle::announce_part(&self.ctx.table, self.idx, self.tier() as u8, ino) {
            return Err(ReceiveError::Lost);
        }
        self.part.as_ref().ok_or(ReceiveError::Lost)
    }

    /// After `finish` placed the copy: its file, still open for reading and writing (for a
    /// caller that recycles copies' pages).
    pub fn take_file(&mut self) -> Option<File> {
        self.kept.take()
    }

    /// The next piece is in the part file already (written through a mapping of `part_file`):
    /// these are its bytes, as written. Publishes them (progress).
    pub fn landed(&mut self, bytes: &[u8]) -> Result<(), ReceiveError> {
        let end = self.written + bytes.len() as u64;
        if self.part.is_none() || end > self.size() {
            return Err(ReceiveError::Mismatch("size"));
        }
        self.publish_piece(bytes, end)
    }

    /// `bytes`, now in the part file up to `end`, become readable (progress); false if a client
    /// took the entry away meanwhile.
    fn publish_piece(&mut self, bytes: &[u8], end: u64) -> Result<(), ReceiveError> {
        let t = std::time::Instant::now();
        std::hash::Hasher::write(&mut self.hasher, bytes);
        self.hashing += t.elapsed();
        lifecycle::progress(&self.ctx.table, self.idx, end);
        self.written = end;
        if self.ctx.table.state(self.idx).state() != State::Placing {
            return Err(ReceiveError::Lost);
        }
        Ok(())
    }

    /// Appends the next piece of the file and publishes it (progress).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), ReceiveError> {
        if self.part.is_none() {
            self.open_part()?;
        }
        let end = self.written + bytes.len() as u64;
        if end > self.size() {
            return Err(ReceiveError::Mismatch("size"));
        }
        let out = self.part.as_ref().ok_or(ReceiveError::Lost)?;
        write_all_at(out, bytes, self.written).map_err(ReceiveError::Tier)?;
        self.publish_piece(bytes, end)
    }

    /// The whole file arrived: checked against its size and the sender's checksum (`xxh3`, as
    /// the sender recorded it at placement; 0 = none recorded), then published PLACED. On an
    /// error the caller `abandon`s it.
    pub fn finish(&mut self, sender_sum: u64) -> Result<PlaceOutcome, ReceiveError> {
        if self.part.is_none() {
            self.open_part()?;
        }
        if self.written != self.size() {
            return Err(ReceiveError::Mismatch("size"));
        }
        let sum = std::hash::Hasher::finish(&self.hasher).max(1);
        if sender_sum != 0 && sender_sum != sum {
            return Err(ReceiveError::Mismatch("checksum"));
        }
        let (ctx, idx, tier) = (&*self.ctx, self.idx, self.tier());
        let Some(dir) = ctx.space.dir(tier) else {
            return Err(ReceiveError::Lost);
        };
        let Some(res) = self.res.take() else {
            return Err(ReceiveError::Lost);
        };
        let res = ctx.space.tiers.resume(res);
        let file = self.part.take().ok_or(ReceiveError::Lost)?;
        let (part, name) = (part_name(self.entry.object), object_name(self.entry.object));
        match publish(ctx, idx, res, dir, (&part, &name), &file, sum) {
            Finish::Placed { .. } => {
                self.kept = Some(file);
                Ok(PlaceOutcome::Placed {
                    tier,
                    bytes: self.size(),
                })
            }
            Finish::RenameFailed => {
                let _ = sys::unlink_at(dir, &part);
                Err(ReceiveError::Tier(std::io::Error::other("rename failed")))
            }
            Finish::Invalidated => Ok(PlaceOutcome::Skipped),
        }
    }

    /// Gives the entry back (QUEUED) without a copy: the part is removed before that, the room
    /// released, so the caller can read the source instead. A tier error marks the tier full.
    pub fn abandon(mut self, why: &ReceiveError) {
        if let ReceiveError::Tier(e) = why {
            self.ctx.space.tier_failed(self.tier(), e);
        }
        if self.part.take().is_some() {
            if let Some(dir) = self.dir() {
                let _ = sys::unlink_at(dir, &part_name(self.entry.object));
            }
        }
        self.release();
        lifecycle::requeue(&self.ctx.table, self.idx);
    }
}

impl Receiving {
    /// Gives the reserved room back.
    fn release(&mut self) {
        if let Some(res) = self.res.take() {
            drop(self.ctx.space.tiers.resume(res));
        }
    }

    /// Ends the copy without one: `to` is SOURCE_ONLY (nobody holds the file: the program reads
    /// the source) or STALE (the source changed). The part is removed and the room released
    /// first.
    pub fn give_up(mut self, to: State) {
        if self.part.take().is_some() {
            if let Some(dir) = self.dir() {
                let _ = sys::unlink_at(dir, &part_name(self.entry.object));
            }
        }
        self.release();
        let cell = EntryCell {
            table: &self.ctx.table,
            idx: self.idx,
        };
        lifecycle::give_up(&cell, to);
        if to == State::Stale {
            AgentCounters::add(&self.ctx.counters.stale, 1);
        }
    }
}

impl Drop for Receiving {
    /// Neither finished nor abandoned (a panic, a transfer dropped on the way): the part must
    /// not stay announced, nor the room reserved.
    fn drop(&mut self) {
        if self.res.is_some() {
            if let (Some(_), Some(dir)) = (self.part.take(), self.dir()) {
                let _ = sys::unlink_at(dir, &part_name(self.entry.object));
            }
            self.release();
            lifecycle::give_up(
                &EntryCell {
                    table: &self.ctx.table,
                    idx: self.idx,
                },
                State::Unplaced,
            );
        }
    }
}

/// Drops the complete copy of `idx` (eviction: a staging tier making room): PLACED → UNPLACED
/// first, so no new client opens it, then the object is unlinked and its space given back.
/// Clients that opened it keep reading their fd. Returns the tier it was on, or `None` if the
/// entry was not PLACED any more.
pub fn evict(t: &Table, space: &Space, idx: u32) -> Option<usize> {
    states::withdraw_copy(t, space, idx, |dir, name| sys::unlink_at(dir, name).is_ok())
}

/// Evicts the complete copy of `idx` as `evict` does, but renames its file to `keep` (in the
/// same directory) instead of removing it, for its pages to be reused: its space is given back
/// to the tier all the same. `None` if the entry was not PLACED any more; else its tier and
/// whether the file was kept (else it was removed). Clients that opened it keep their fd: the
/// caller must not write into the file before it knows nobody else has it open
/// (`sys::nobody_else_has_open`); the rename changes its ctime, so a client that opens the old
/// name in that instant rejects it (the identity recorded at placement no longer matches).
pub fn evict_to(t: &Table, space: &Space, idx: u32, keep: &[u8]) -> Option<(usize, bool)> {
    let mut kept = false;
    let tier = states::withdraw_copy(t, space, idx, |dir, name| {
        kept = sys::rename_at(dir, name, keep).is_ok();
        kept || sys::unlink_at(dir, name).is_ok()
    })?;
    Some((tier, kept))
}

/// Drops every copy of a void entry on this node (another node told us the file changed).
pub fn drop_void(ctx: &SourceCtx, idx: u32) {
    if let Some(e) = ctx.table.entry(idx) {
        if e.stat.is_file() {
            super::requests::drop_all_copies(ctx, idx, &e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::Hasher;

    #[test]
    fn the_received_copy_s_checksum_is_placement_s_xxh3() {
        // Pieces of any size, hashed as they land, give the one-shot xxh3-64 placement records.
        let data: Vec<u8> = (0..(5 << 20) + 777u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for &(len, piece) in &[
            (0, 1),
            (17, 5),
            (240, 64),
            (4099, 1000),
            (data.len(), 4 << 20),
        ] {
            let mut h = twox_hash::XxHash3_64::new();
            for p in data[..len].chunks(piece) {
                h.write(p);
            }
            assert_eq!(
                h.finish(),
                xxhash_rust::xxh3::xxh3_64(&data[..len]),
                "{len}"
            );
        }
    }
}
