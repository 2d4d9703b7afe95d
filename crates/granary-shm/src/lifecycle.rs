//! The life of a catalog entry: the one module that makes and writes an entry's state word (a
//! new table's initial words too: `initial`, `initial_void`, `carried`), and the rules that
//! decide when the catalog may answer for it.
//!
//! Several parties move an entry at once — the preload library in every process of a job, the
//! agent's ring consumer, its placement workers, its validator — so each transition is one
//! compare-and-swap from an exact expected word (exactly one party wins each step), except the
//! two a client makes when the source changed, which are stores that nothing may undo:
//!
//! ```text
//!              claim              begin                  complete
//!   UNPLACED ─────────▶ QUEUED ─────────▶ PLACING|t ──────────────▶ PLACED|t
//!      ▲  ▲    unclaim    │                 │  │ cut_partial           │
//!      │  └───────────────┘                 │  └──────▶ PARTIAL|t ─────┤ withdraw / evict
//!      │             give_up (SOURCE_ONLY,  │             │ drop       │ (damaged copy,
//!      │             STALE, UNPLACED) ◀─────┘             ▼            │  known-order)
//!      └──────────────────────────────────────────────────────────────┘
//!
//!   any ──source_changed──▶ STALE     any ──removed──▶ GONE        (terminal for this table)
//! ```
//!
//! Validation (per attach): an entry is served from the catalog — metadata or a copy — only once
//! it was checked against the source in this attach (`is_validated`), by the agent's background
//! validator or inline by the client that needs it first (`check`). Where the source is declared
//! immutable, a directory whose identity is unchanged vouches for every non-directory in it.
//!
//! The logic is written against `Cell` so the concurrency tests run it over Shuttle's atomics;
//! production runs it over the shared table (`EntryCell`).

use crate::layout::{request, StatRec};
use crate::state::{State, StateWord};
use crate::table::Table;

/// One entry's state word.
pub trait Cell {
    fn load(&self) -> StateWord;
    /// Compare-and-swap; false if the word was not `from`.
    fn cas(&self, from: StateWord, to: StateWord) -> bool;
    fn store(&self, word: StateWord);
}

/// An entry of a mapped table.
#[derive(Clone, Copy)]
pub struct EntryCell<'a> {
    pub table: &'a Table,
    pub idx: u32,
}

impl Cell for EntryCell<'_> {
    fn load(&self) -> StateWord {
        self.table.state(self.idx)
    }
    fn cas(&self, from: StateWord, to: StateWord) -> bool {
        self.table.swap_state(self.idx, from, to)
    }
    fn store(&self, word: StateWord) {
        self.table.set_state(self.idx, word)
    }
}

const fn w(s: State) -> StateWord {
    StateWord::new(s, 0)
}

/// The word an entry of a table being built starts with: a regular file `Unplaced` (its first
/// open asks for a copy), anything else `SourceOnly` (answered from the catalog's metadata,
/// opened on the source).
pub fn initial(stat: &StatRec) -> StateWord {
    if stat.is_file() {
        w(State::Unplaced)
    } else {
        w(State::SourceOnly)
    }
}

/// The word a table's root starts with: answered from the catalog's metadata, never copied.
pub const fn initial_root() -> StateWord {
    w(State::SourceOnly)
}

/// The word of an entry the catalog must never answer for, from the start (its record does not
/// fit the table, its listing was incomplete, the pack does not hold all of a directory).
pub const fn initial_void() -> StateWord {
    StateWord::VOID
}

/// A copy an earlier table recorded, taken over by a table being built: its complete copy
/// (`Placed`) or chunk file (`Partial`) on tier `tier` of the new table. `None` for any other
/// state (nothing to take over).
pub fn carried(earlier: StateWord, tier: u8) -> Option<StateWord> {
    match earlier.state() {
        s @ (State::Placed | State::Partial) => Some(StateWord::new(s, tier)),
        _ => None,
    }
}

/// A client opened an unplaced file: true if the caller is the one to enqueue its copy.
pub fn claim(c: &impl Cell) -> bool {
    c.cas(w(State::Unplaced), w(State::Queued))
}

/// The known-order policy queues a file ahead of the program: from UNPLACED, or from
/// SOURCE_ONLY (once per epoch: there may be room now). `from` is the word it inspected.
pub fn claim_ahead(c: &impl Cell, from: StateWord) -> bool {
    matches!(from.state(), State::Unplaced | State::SourceOnly) && c.cas(from, w(State::Queued))
}

/// A queued copy is dropped (its table retired, or the policy declined): it may be asked again.
pub fn unclaim(c: &impl Cell) -> bool {
    c.cas(w(State::Queued), w(State::Unplaced))
}

/// A worker starts copying into `tier` (a large file's partial copy is readable from then on):
/// from QUEUED, or from PARTIAL when a chunked file turns out to fit whole. False if the entry
/// moved meanwhile.
pub fn begin(c: &impl Cell, from: StateWord, tier: u8) -> bool {
    matches!(from.state(), State::Queued | State::Partial)
        && c.cas(from, StateWord::new(State::Placing, tier))
}

/// The worker gives up (`to` = SOURCE_ONLY, STALE or UNPLACED). False if a client invalidated
/// meanwhile.
pub fn give_up(c: &impl Cell, to: State) -> bool {
    let cur = c.load();
    cur.state() == State::Placing && c.cas(cur, w(to))
}

/// A complete copy is in place (renamed, identity recorded): PLACED on `tier`. False if a
/// client took the entry away meanwhile — the copy is then void.
pub fn complete(c: &impl Cell, tier: u8) -> bool {
    let cur = c.load();
    cur.state() == State::Placing && c.cas(cur, StateWord::new(State::Placed, tier))
}

/// A file too large for any tier's free space is cached in chunks on `tier`.
pub fn cut_partial(c: &impl Cell, placing: StateWord, tier: u8) -> bool {
    placing.state() == State::Placing && c.cas(placing, StateWord::new(State::Partial, tier))
}

/// A chunk file is dropped (damaged, or its tier lost): the file is unplaced again.
pub fn drop_partial(c: &impl Cell, partial: StateWord) -> bool {
    partial.state() == State::Partial && c.cas(partial, w(State::Unplaced))
}

/// `drop_partial` on a table entry, its chunk bits cleared with it (a later chunk file starts
/// with none present) and its copy identity forgotten.
pub fn unplace_partial(table: &Table, idx: u32, partial: StateWord) -> bool {
    if !drop_partial(&EntryCell { table, idx }, partial) {
        return false;
    }
    for k in 0..table.chunk_count(idx) {
        table.set_chunk(idx, k, false);
    }
    table.set_copy_identity(idx, 0, 0);
    true
}

/// A placed copy is taken back (damaged, evicted by the known-order policy): only the party that
/// moves `placed` (the word it inspected) deletes the copy and releases its space.
pub fn withdraw(c: &impl Cell, placed: StateWord) -> bool {
    placed.state() == State::Placed && c.cas(placed, w(State::Unplaced))
}

/// The agent's INVALIDATE handler, for a copy a client did not void itself: PLACED → STALE.
pub fn invalidate_placed(c: &impl Cell) -> bool {
    let cur = c.load();
    cur.state() == State::Placed && c.cas(cur, w(State::Stale))
}

/// A worker hands its entry back to the queue without a copy (cluster mode: the peer that was to
/// send it went silent, so the source will be read instead): PLACING → QUEUED. The caller has
/// unlinked its partial copy; progress and the part's identity are cleared before the state
/// moves, so a client never measures a later copy against them. False if the entry moved.
pub fn requeue(table: &Table, idx: u32) -> bool {
    let cur = table.state(idx);
    if cur.state() != State::Placing {
        return false;
    }
    table.reset_progress(idx);
    table.set_copy_identity(idx, 0, 0);
    table.swap_state(idx, cur, w(State::Queued))
}

/// A worker takes its queued copy: QUEUED → PLACING (no tier yet). Any progress left from an
/// earlier attempt is cleared first, so it is never read against a new partial copy.
pub fn start(table: &Table, idx: u32) -> bool {
    table.reset_progress(idx);
    begin(&EntryCell { table, idx }, w(State::Queued), 0)
}

/// The worker's partial copy (`<object>.part`, inode `part_ino`) is on `tier` and readable up to
/// its progress: recorded before the state names the tier (clients check the part they open
/// against it), then PLACING|tier. False if the entry moved meanwhile.
pub fn announce_part(table: &Table, idx: u32, tier: u8, part_ino: u64) -> bool {
    table.set_copy_identity(idx, part_ino, 0);
    table.reset_progress(idx);
    let cur = table.state(idx);
    cur.state() == State::Placing
        && table.swap_state(idx, cur, StateWord::new(State::Placing, tier))
}

/// The inode of a file the agent is still writing (`.part`, `.chunks`): clients check what they
/// open against it (no ctime: it changes with every write).
pub fn record_part(table: &Table, idx: u32, ino: u64) {
    table.set_copy_identity(idx, ino, 0);
}

/// Bytes of the partial copy written and readable (only ever grows).
pub fn progress(table: &Table, idx: u32, bytes: u64) {
    table.set_progress(idx, bytes);
}

/// A complete copy's identity and checksum, recorded before `complete` publishes it: clients
/// check what they open against the identity from then on.
pub fn record_copy(table: &Table, idx: u32, ino: u64, ctime_ns: u64, checksum: u64) {
    table.set_checksum(idx, checksum);
    table.set_copy_identity(idx, ino, ctime_ns);
}

/// A file too large for any tier's free space becomes a chunk file (inode `ino`) on `tier`:
/// PLACING → PARTIAL|tier, the identity recorded first. False if the entry moved meanwhile.
pub fn to_partial(table: &Table, idx: u32, placing: StateWord, tier: u8, ino: u64) -> bool {
    table.set_copy_identity(idx, ino, 0);
    cut_partial(&EntryCell { table, idx }, placing, tier)
}

/// Chunk `k` of a PARTIAL entry is complete in its chunk file (after its bytes are written), or
/// not any more.
pub fn chunk(table: &Table, idx: u32, k: u64, present: bool) {
    table.set_chunk(idx, k, present);
}

/// Page-cache residency: whether the entry's copy is dropped from the page cache after use.
/// Returns what it was.
pub fn set_transient(table: &Table, idx: u32, transient: bool) -> bool {
    table.set_transient(idx, transient)
}

/// A copy found complete by other means than this agent's placement (a test fixture, a tool):
/// identity and checksum recorded, then UNPLACED → PLACED|tier. False if the entry was not
/// unplaced.
pub fn adopt_placed(
    table: &Table,
    idx: u32,
    tier: u8,
    checksum: u64,
    ino: u64,
    ctime_ns: u64,
) -> bool {
    record_copy(table, idx, ino, ctime_ns, checksum);
    table.swap_state(idx, w(State::Unplaced), StateWord::new(State::Placed, tier))
}

/// A table saved for the next agent (or loaded from one): what belonged to this run goes —
/// validation and transient bits, progress, and copies in progress, which become unplaced
/// (their temporary files are swept). Complete copies keep tier, checksum and identity.
pub fn forget_run(t: &Table) {
    t.clear_validated();
    for i in 0..t.entry_count() {
        t.set_transient(i, false);
        t.reset_progress(i);
        if matches!(t.state(i).state(), State::Queued | State::Placing) {
            t.set_state(i, w(State::Unplaced));
            t.set_copy_identity(i, 0, 0);
        }
    }
}

/// A catalog adopted from another node (cluster mode: rank 0's walk, broadcast to every rank):
/// its entries and its validation hold on this node too, nothing about copies does. Every live
/// regular file becomes unplaced (a file another node could not place may fit here), with its
/// copy identity, checksum, progress, chunk bits and transient bit cleared; void entries stay
/// void, directories and symlinks as they are. Runs before the table is published.
pub fn forget_placement(t: &Table) {
    let unplaced = w(State::Unplaced);
    for i in 0..t.entry_count() {
        let Some(e) = t.entry(i) else { continue };
        if !e.stat.is_file() {
            continue;
        }
        t.set_transient(i, false);
        t.reset_progress(i);
        for k in 0..t.chunk_count(i) {
            t.set_chunk(i, k, false);
        }
        t.set_copy_identity(i, 0, 0);
        t.set_checksum(i, 0);
        if !t.state(i).is_void() {
            t.set_state(i, unplaced);
        }
    }
}

/// A PARTIAL entry's chunk file ctime, recorded when the table is saved (`ctime_ns`) and cleared
/// when it is loaded (0: while in use its ctime moves with every chunk written).
pub fn seal_partial(t: &Table, idx: u32, ctime_ns: u64) {
    let (ino, _) = t.copy_identity(idx);
    t.set_copy_identity(idx, ino, ctime_ns);
}

/// How a change through the program (or one found by validation) leaves an entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Void {
    /// Its contents or attributes changed: everything about it passes through.
    Stale,
    /// The name no longer leads to it: it and everything under it pass through.
    Gone,
}

/// Marks an entry void — never making a `GONE` entry merely `STALE` again — and returns true if
/// this call changed it (the caller then tells the agent, which drops a copy).
pub fn void(c: &impl Cell, how: Void) -> bool {
    let to = match how {
        Void::Stale => State::Stale,
        Void::Gone => State::Gone,
    };
    for _ in 0..64 {
        let cur = c.load();
        let s = cur.state();
        if s == State::Gone || s == to {
            return false;
        }
        if c.cas(cur, w(to)) {
            return true;
        }
    }
    // Contended beyond reason: a plain store is still correct (void states are terminal).
    c.store(w(to));
    true
}

/// `void` on a table entry, with the agent told (it drops a file's copy, and in cluster mode
/// tells the other nodes, directories included).
pub fn void_entry(table: &Table, idx: u32, how: Void) -> bool {
    let changed = void(&EntryCell { table, idx }, how);
    if changed {
        table.push_request(request::INVALIDATE, idx);
    }
    changed
}

/// What the source says now about an entry, compared with the catalog.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// The same version: the catalog may answer for it.
    Same,
    /// Another version (any identity field differs: device, inode, type, size, mtime, ctime).
    Changed,
    /// The path names nothing now.
    Gone,
    /// The source could not say (permission, I/O error): the entry is left to pass through for
    /// this call, without a verdict.
    Unknown,
}

/// The verdict of a `statx` (`AT_SYMLINK_NOFOLLOW`) of the entry's path: `Ok(now)` or the errno.
pub fn verdict(catalogued: &StatRec, now: Result<&StatRec, i32>) -> Verdict {
    match now {
        Ok(now) if catalogued.same_version(now) => Verdict::Same,
        Ok(_) => Verdict::Changed,
        Err(e) if e == libc::ENOENT || e == libc::ENOTDIR => Verdict::Gone,
        Err(_) => Verdict::Unknown,
    }
}

/// `verdict` for an entry that may be a directory: a directory that is another directory now,
/// has another owner or mode, or that these credentials can no longer list and search (an ACL
/// changed: only its ctime shows it, so the kernel is asked, `may_list`) is `Gone` — nothing
/// below it may be answered from the catalog any more; one whose names merely changed is
/// `Changed` (its listing passes through, its children are checked one by one).
pub fn verdict_with(
    catalogued: &StatRec,
    now: Result<&StatRec, i32>,
    may_list: impl FnOnce() -> bool,
) -> Verdict {
    let v = verdict(catalogued, now);
    let (Verdict::Changed, Ok(now)) = (v, now) else {
        return v;
    };
    if !catalogued.is_dir() {
        return v;
    }
    let same_dir = now.is_dir()
        && now.ino == catalogued.ino
        && (now.dev_major, now.dev_minor) == (catalogued.dev_major, catalogued.dev_minor)
        && now.mode == catalogued.mode
        && (now.uid, now.gid) == (catalogued.uid, catalogued.gid);
    if !same_dir || !may_list() {
        return Verdict::Gone;
    }
    v
}

/// Applies a verdict on entry `idx` (a file, symlink or directory): `Same` validates it — and
/// for a directory of an immutable source, every non-directory child with it; `Changed` voids it
/// (a directory's listing then passes through, its children are checked one by one); `Gone`
/// voids it and everything below. Returns true if the catalog may now answer for it.
pub fn apply(table: &Table, idx: u32, v: Verdict) -> bool {
    match v {
        Verdict::Same => {
            mark_validated(table, idx);
            true
        }
        Verdict::Changed => {
            void_entry(table, idx, Void::Stale);
            false
        }
        Verdict::Gone => {
            void_entry(table, idx, Void::Gone);
            false
        }
        Verdict::Unknown => false,
    }
}

/// Marks entry `idx` validated in this attach; a directory of an immutable source vouches for
/// its non-directory children too.
pub fn mark_validated(table: &Table, idx: u32) {
    table.set_validated(idx);
    if !table.immutable() {
        return;
    }
    let Some(e) = table.entry(idx) else { return };
    if !e.stat.is_dir() {
        return;
    }
    for c in e.first_child..e.first_child.saturating_add(e.child_count) {
        if table.entry(c).is_some_and(|k| !k.stat.is_dir()) {
            table.set_validated(c);
        }
    }
}

/// True if the catalog may answer for entry `idx` without asking the source first.
#[inline]
pub fn is_validated(table: &Table, idx: u32) -> bool {
    table.is_validated(idx)
}

/// An entry's two validation bits, as the check claim uses them: the shared table's
/// (`EntryBits`) in production, Shuttle's atomics in the concurrency tests.
pub trait CheckBits {
    fn validated(&self) -> bool;
    /// Sets the being-checked bit; true if this call set it.
    fn try_claim(&self) -> bool;
    fn release(&self);
    /// Applies a verdict (`apply`); true if the catalog may now answer.
    fn apply(&self, v: Verdict) -> bool;
}

/// Entry `idx` of a mapped table.
#[derive(Clone, Copy)]
pub struct EntryBits<'a> {
    pub table: &'a Table,
    pub idx: u32,
}

impl CheckBits for EntryBits<'_> {
    fn validated(&self) -> bool {
        self.table.is_validated(self.idx)
    }
    fn try_claim(&self) -> bool {
        self.table.try_claim_check(self.idx)
    }
    fn release(&self) {
        self.table.release_check(self.idx)
    }
    fn apply(&self, v: Verdict) -> bool {
        apply(self.table, self.idx, v)
    }
}

/// Who checks an entry against the source (`claim_check`).
pub enum Check<B: CheckBits> {
    /// Already checked in this attach: nothing to do.
    Validated,
    /// This caller checks it: make the one call, then `CheckClaim::finish`.
    Mine(CheckClaim<B>),
    /// Another process or thread is checking it now: wait (bounded) for `is_being_checked` to
    /// clear rather than asking the source a second time.
    Busy,
}

/// The right to make an entry's one check of this attach. Dropped without `finish` (a panic),
/// the claim is released and the entry left unchecked.
pub struct CheckClaim<B: CheckBits> {
    bits: B,
}

impl<B: CheckBits> CheckClaim<B> {
    /// Applies the verdict, then releases the claim; true if the catalog may answer.
    pub fn finish(self, v: Verdict) -> bool {
        self.bits.apply(v)
    }
}

impl<B: CheckBits> Drop for CheckClaim<B> {
    fn drop(&mut self) {
        self.bits.release();
    }
}

/// Claims entry `idx`'s check in this attach, so that the program and the validators reaching
/// it at the same instant cost the source one call, not two. A claim a dead process left is
/// cleared by the next attach; until then, waiters give up after their bound and check anyway.
pub fn claim_check(table: &Table, idx: u32) -> Check<EntryBits<'_>> {
    claim_check_of(EntryBits { table, idx })
}

/// `claim_check` on any entry's bits.
pub fn claim_check_of<B: CheckBits>(bits: B) -> Check<B> {
    if bits.validated() {
        return Check::Validated;
    }
    if !bits.try_claim() {
        return Check::Busy;
    }
    // Validated between the first look and the claim: the claim is not needed.
    if bits.validated() {
        bits.release();
        return Check::Validated;
    }
    Check::Mine(CheckClaim { bits })
}

/// True while some party holds entry `idx`'s check claim.
#[inline]
pub fn is_being_checked(table: &Table, idx: u32) -> bool {
    table.is_being_checked(idx)
}

/// Agent side: a job attaches to an idle source — every entry is to be checked again
/// (`immutable`: by directory); no claim survives. Returns the new attach epoch.
pub fn new_attach(table: &Table, immutable: bool) -> u64 {
    table.clear_validated();
    table.set_immutable(immutable);
    retry_source_only(table);
    table.bump_epoch()
}

/// Regular files left on the source (no tier had room, the agent could not read them) are
/// tried again from the next open: room or permissions may have changed since.
pub fn retry_source_only(table: &Table) {
    let unplaced = w(State::Unplaced);
    for idx in 0..table.entry_count() {
        let cur = table.state(idx);
        if cur.state() == State::SourceOnly && table.entry(idx).is_some_and(|e| e.stat.is_file()) {
            table.swap_state(idx, cur, unplaced);
        }
    }
}

/// Agent side: a fresh walk read these entries from the source just now.
pub fn validated_by_walk(table: &Table, fresh: &[u64]) {
    for (k, &word) in fresh.iter().enumerate() {
        if word == 0 {
            continue;
        }
        if word == u64::MAX {
            table.set_validated_range(k as u32 * 64, 64);
            continue;
        }
        for b in 0..64 {
            if word & (1 << b) != 0 {
                table.set_validated((k * 64 + b) as u32);
            }
        }
    }
}
