//! How ranks talk: one communication thread per rank owns every MPI call after start-up
//! (`MPI_THREAD_SERIALIZED`; `mpi::comm_thread`), and the rest of the node reaches it through a
//! channel (`Comm`). Why one thread: MPI progress happens inside MPI calls, so one loop that
//! polls everything (new messages, receives and sends in flight) keeps every transfer moving
//! without any thread ever blocking in MPI — a peer that stops answering can never hang a
//! thread, a transfer is given up by its waiter's own deadline — and no MPI library needs
//! `MPI_THREAD_MULTIPLE`.
//!
//! Messages: control records (`wire::Msg`, tag `wire::CTRL`) and file bytes, sent in pieces of
//! up to `PIECE` bytes with the transfer's own tag, non-blocking (`MPI_Isend`, several in flight
//! per transfer, bounded node-wide by `Budget`), received without a copy into pooled buffers
//! (`MPI_Improbe` + `MPI_Imrecv` of exactly the probed size). Each transfer's events (`Event`)
//! reach its waiter in order: a thread waiting on a channel, or — a program's remote read — the
//! transfer itself, carried on by the communication thread as they arrive (`Transfer`), so no
//! thread hand-off stands between the request and the MPI call, nor between the last piece
//! landing and the copy's publication that wakes the program.

use std::collections::HashSet;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::doorbell::Door;
use super::wire::{Answer, Msg, CTRL, DATA_TAG0, DATA_TAGS};

/// Bytes of file data per message: large enough that the per-message cost is small against the
/// copy (a few µs against ~1 ms for 4 MiB), small enough that a transfer is pipelined (the owner
/// reads the next piece while the last one travels, the receiver writes one while it receives
/// the next) and a file of a few MiB starts arriving at once.
pub const PIECE: usize = 4 << 20;

/// Bytes of file data a rank has in flight to others at once.
pub const IN_FLIGHT: u64 = 64 << 20;

/// Bytes handed to MPI to send, kept alive (with the communication thread) until the send
/// completes.
pub enum Payload {
    /// A control message or a piece read into a buffer.
    Owned(Vec<u8>),
    /// A piece of a copy, sent from its mapping: no copy into a buffer (with a single-copy
    /// transport the receiver copies straight from the page cache).
    Mapped {
        map: Arc<memmap2::MmapRaw>,
        off: usize,
        len: usize,
    },
}

impl Payload {
    /// `len` bytes of `map` at `off` (`None` beyond its end).
    pub fn mapped(map: &Arc<memmap2::MmapRaw>, off: usize, len: usize) -> Option<Payload> {
        (off.checked_add(len)? <= map.len()).then(|| Payload::Mapped {
            map: map.clone(),
            off,
            len,
        })
    }

    /// Start and length of the bytes (valid while `self` lives).
    pub fn bytes(&self) -> (*const u8, usize) {
        match self {
            Payload::Owned(v) => (v.as_ptr(), v.len()),
            Payload::Mapped { map, off, len } => (map.as_ptr().wrapping_add(*off), *len),
        }
    }
}

/// Where a transfer's data lands: the receiving copy's part file, sized and mapped. MPI writes
/// each piece straight into it (no buffer, no write call); the communication thread holds it
/// while a receive into it is in flight, so a transfer given up early never leaves MPI writing
/// into memory that is gone.
pub struct Landing {
    map: Arc<memmap2::MmapRaw>,
    /// The copy's size (the mapping may be longer: a recycled file's).
    len: usize,
    /// Its pages are mapped already (a recycled or ready-made staging file's mapping).
    mapped: bool,
}

impl Landing {
    /// Maps `file` (already its final length).
    pub fn over(file: &std::fs::File) -> std::io::Result<Landing> {
        let map = memmap2::MmapOptions::new().map_raw(file)?;
        let len = map.len();
        Ok(Landing {
            map: Arc::new(map),
            len,
            mapped: false,
        })
    }

    /// The first `len` bytes of `map`, a mapping of the part file (a recycled file's, its pages
    /// mapped already: no fault per page as the pieces land).
    pub fn on(map: Arc<memmap2::MmapRaw>, len: usize) -> Option<Landing> {
        (len <= map.len()).then_some(Landing {
            map,
            len,
            mapped: true,
        })
    }

    /// Maps every page of a fresh landing for writing, in one call, before a copy made in this
    /// process writes it: each page it would otherwise fault on (a trap per 4 KiB) costs more
    /// than the kernel's own mapping of it. A C loop of first reads of 128 KiB files into fresh
    /// tmpfs pages (docs/cluster.md): 70–73 µs per file with a `memcpy` faulting them, 50–52 µs
    /// populated first, against 54–55 µs for `process_vm_readv` (whose copy faults them in the
    /// kernel). Nothing to do for a recycled file's mapping; an older kernel (before 5.14)
    /// faults them as before.
    pub fn map_pages(&self) {
        if !self.mapped && self.len > 0 {
            let _ = self
                .map
                .advise_range(memmap2::Advice::PopulateWrite, 0, self.len);
        }
    }

    /// The mapping (kept with the copy's file for its pages to be reused).
    pub fn map(&self) -> Arc<memmap2::MmapRaw> {
        self.map.clone()
    }

    /// Where `len` bytes at `off` go (`None` beyond the end).
    pub fn dest(&self, off: usize, len: usize) -> Option<*mut u8> {
        (off.checked_add(len)? <= self.len).then(|| self.map.as_mut_ptr().wrapping_add(off))
    }

    /// The bytes that landed at `[off, off + len)` — only after `Event::Landed` for that range,
    /// which no receive writes again (or after a direct read wrote it: `direct`).
    pub fn landed(&self, off: usize, len: usize) -> &[u8] {
        if self.dest(off, len).is_none() || len == 0 {
            return &[];
        }
        // SAFETY: in bounds of a live mapping (checked above); the range was written by a
        // completed receive (the Landed event happens after MPI_Test reported completion) and is
        // never written again, so nothing mutates it while this shared view lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) }
    }
}

/// What the communication thread is asked to do.
pub enum Cmd {
    /// Send `data` to `to` with `tag`; `credit` bytes of the `Budget` are given back when the
    /// send completes (0 for control messages).
    Send {
        to: u32,
        tag: i32,
        data: Payload,
        credit: u64,
    },
    /// A liveness or status message (`Msg::liveness`) to `to`: not activity.
    Quiet { to: u32, data: Vec<u8> },
    /// Messages from `from` with data tag `tag` (and replies naming it) go to `waiter`; its data
    /// waits (matched, not received) until `Land` gives it a landing.
    Expect { from: u32, tag: i32, waiter: Waiter },
    /// `(from, tag)`'s pieces go into `landing`, one after the other; `transfer`: the
    /// communication thread carries the transfer on itself from here (`Waiter::Inline`).
    Land {
        from: u32,
        tag: i32,
        landing: Arc<Landing>,
        transfer: Option<Box<dyn Transfer>>,
    },
    /// No more interest in `(from, tag)`: what still arrives for it is received and dropped.
    Forget { from: u32, tag: i32 },
    /// Finish what is in flight (bounded) and leave MPI.
    Stop,
}

/// Who receives a transfer's events.
pub enum Waiter {
    /// A thread waiting on a channel (a copy made at start, a fetcher's slow path).
    Channel(Sender<Event>),
    /// The communication thread itself, through the `Transfer` that `Cmd::Land` attaches; the
    /// events that come before it are kept for it.
    Inline,
}

/// A transfer the communication thread carries on by itself (a program's remote read,
/// `fetch::Inline`): every event is handed to it as it arrives, on that thread, so it must
/// never block (no source read, no wait on another thread).
pub trait Transfer: Send {
    /// The transfer's next event. `Flow::Done`: it is over and its tag no longer expected
    /// (what still arrives for it is received and dropped).
    fn event(&mut self, ev: Event) -> Flow;
    /// A turn of the loop without an event for it: its own deadline (an owner gone silent).
    fn tick(&mut self, now: Instant) -> Flow;
}

/// Whether a `Transfer` goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    More,
    Done,
}

/// What a transfer's waiter receives, in order.
pub enum Event {
    Reply(Answer),
    /// A piece, in a pooled buffer (a transfer without a landing).
    Data(Vec<u8>),
    /// A piece written into the landing at `[off, off + len)`.
    Landed {
        off: usize,
        len: usize,
    },
    /// More bytes arrived than the landing holds: the sender is not sending this file.
    Overflow,
}

/// The rest of the node, as the communication thread sees it.
pub trait Inbox: Send + Sync {
    /// A message from `from` arrived (any message: the rank is alive).
    fn heard(&self, from: u32);
    /// A control message no transfer of ours waits for (requests, heartbeats, invalidations).
    fn control(&self, from: u32, msg: Msg);
    /// An MPI call involving `rank` failed.
    fn failed(&self, rank: u32);
}

/// Pooled message buffers: a fresh multi-MiB allocation costs a page fault per 4 KiB.
pub struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
}

const POOLED: usize = 48;

impl Buffers {
    pub fn new() -> Buffers {
        Buffers {
            free: Mutex::default(),
        }
    }

    /// An empty buffer with room for at least `len` bytes.
    pub fn get(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|b| b.capacity() >= len) {
            Some(k) => {
                let mut b = free.swap_remove(k);
                b.clear();
                b
            }
            None => Vec::with_capacity(len.max(64 << 10)),
        }
    }

    pub fn put(&self, b: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < POOLED && b.capacity() <= PIECE {
            free.push(b);
        }
    }
}

/// Bytes of data in flight from this rank (`IN_FLIGHT`): a provider waits for room before it
/// reads the next piece, so a slow or stopped receiver costs bounded memory.
pub struct Budget {
    max: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    pub fn new(max: u64) -> Budget {
        Budget {
            max,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Takes `n` bytes, waiting until `deadline` at most; false if there was no room by then.
    pub fn acquire(&self, n: u64, deadline: Instant) -> bool {
        let n = n.min(self.max);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used + n > self.max {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            used = self
                .freed
                .wait_timeout(used, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *used += n;
        true
    }

    pub fn release(&self, n: u64) {
        let n = n.min(self.max);
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

/// Data tags of transfers this rank receives, per sending rank. A tag whose transfer did not
/// complete (the sender went silent) is never used again with that sender: its late pieces
/// must not land in a later transfer.
pub struct Tags {
    next: Vec<AtomicU32>,
    /// Tags retired so far, per sending rank.
    retired: Vec<AtomicU32>,
    state: Mutex<TagState>,
}

/// `(rank, tag)` pairs in use, and retired for good.
#[derive(Default)]
struct TagState {
    busy: HashSet<(u32, i32)>,
    retired: HashSet<(u32, i32)>,
}

impl Tags {
    pub fn new(ranks: u32) -> Tags {
        Tags {
            next: (0..ranks).map(|_| AtomicU32::new(0)).collect(),
            retired: (0..ranks).map(|_| AtomicU32::new(0)).collect(),
            state: Mutex::default(),
        }
    }

    /// A free tag for a transfer from `from` (`None`: every tag is busy or retired).
    pub fn take(&self, from: u32) -> Option<i32> {
        let next = self.next.get(from as usize)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..DATA_TAGS {
            let k = next.fetch_add(1, Ordering::Relaxed) % DATA_TAGS as u32;
            let tag = DATA_TAG0 + k as i32;
            if !st.busy.contains(&(from, tag)) && !st.retired.contains(&(from, tag)) {
                st.busy.insert((from, tag));
                return Some(tag);
            }
        }
        None
    }

    /// The transfer of `tag` is over; `clean`: every piece it announced arrived.
    pub fn give_back(&self, from: u32, tag: i32, clean: bool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.busy.remove(&(from, tag));
        if !clean && st.retired.insert((from, tag)) {
            if let Some(n) = self.retired.get(from as usize) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// True while at most a quarter of the tags for transfers from `from` are retired: a
    /// request may then be sent before its landing is ready, at the risk of a cancel (which
    /// retires its tag) if the landing cannot be made.
    pub fn plenty(&self, from: u32) -> bool {
        self.retired
            .get(from as usize)
            .is_some_and(|n| n.load(Ordering::Relaxed) < DATA_TAGS as u32 / 4)
    }
}

/// When the communication thread last came round its loop. Every turn is short (nothing
/// blocks in MPI, and an idle thread sleeps at most `IDLE_NAP_MAX`), so a thread that has not
/// come round for long is stuck inside the MPI library: OpenMPI 4.1's TCP transport, when a
/// peer dies in the middle of a message to it, can leave the survivor's progress engine
/// deadlocked or spinning (docs/cluster.md, "Faults").
pub struct Pulse {
    start: Instant,
    /// Milliseconds since `start` at the last turn.
    last: AtomicU64,
}

impl Pulse {
    fn new() -> Pulse {
        Pulse {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// A turn of the loop.
    pub fn beat(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the last turn.
    pub fn silent(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

/// A communication thread that has not come round its loop for this long is stuck in MPI
/// (`Pulse`): its node stops counting on any peer until it moves again.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);

/// How the communication thread naps and is woken. With a doorbell (`doorbell::Door`), it
/// sleeps in `ppoll` on the doorbell's socket — other ranks' doorbells wake it, and so does a
/// datagram this node sends itself when it queues a command. Without, it is parked (a futex,
/// `thread::park_timeout`) and unparked by whoever queues a command. Either way its `asleep`
/// flag says when a command must wake it. Not a channel's timed receive: crossbeam's spins and
/// yields the core (`sched_yield`) several times before it sleeps, and the thread naps
/// thousands of times a second while a job reads — half of its CPU went there (perf, 128 KiB
/// remote reads).
pub struct Bell {
    thread: OnceLock<Thread>,
    asleep: AtomicBool,
    pub door: Option<Arc<Door>>,
}

impl Bell {
    fn new(door: Option<Arc<Door>>) -> Bell {
        Bell {
            thread: OnceLock::new(),
            asleep: AtomicBool::new(false),
            door,
        }
    }

    /// A command was queued: wakes the thread if it naps.
    fn ring(&self) {
        // Pairs with the fence in `nap`: either the napper sees the command queued, or this
        // sees it asleep.
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) {
            match &self.door {
                Some(d) => d.ring_self(),
                None => {
                    if let Some(t) = self.thread.get() {
                        t.unpark();
                    }
                }
            }
        }
    }

    /// The communication thread naps up to `wait` unless `pending()` (a command queued); a
    /// command queued meanwhile, or a doorbell, ends the nap at once. True if datagrams wait on
    /// the doorbell (or it could not tell): only then does the caller read them (`Door::drain`),
    /// not on every turn — two `recvfrom`s for nothing each time.
    pub fn nap(&self, wait: Duration, pending: impl Fn() -> bool) -> bool {
        let _ = self.thread.set(std::thread::current());
        self.asleep.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut rung = self.door.is_some();
        if !pending() {
            // Wakes early when rung (or spuriously): the caller looks at its commands and MPI
            // either way.
            match &self.door {
                Some(d) => rung = d.wait(wait),
                None => std::thread::park_timeout(wait),
            }
        }
        self.asleep.store(false, Ordering::Relaxed);
        rung
    }
}

/// The node's handle on the communication thread.
#[derive(Clone)]
pub struct Comm {
    tx: Sender<Cmd>,
    pub bell: Arc<Bell>,
    pub bufs: Arc<Buffers>,
    pub budget: Arc<Budget>,
    pub pulse: Arc<Pulse>,
}

impl Comm {
    /// A handle and the receiving end the communication thread drains; `door`: this rank's
    /// doorbell, if it has one.
    pub fn new(door: Option<Arc<Door>>) -> (Comm, Receiver<Cmd>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            Comm {
                tx,
                bell: Arc::new(Bell::new(door)),
                bufs: Arc::new(Buffers::new()),
                budget: Arc::new(Budget::new(IN_FLIGHT)),
                pulse: Arc::new(Pulse::new()),
            },
            rx,
        )
    }

    /// Queues `cmd` for the communication thread and wakes it if it naps.
    fn push(&self, cmd: Cmd) {
        let _ = self.tx.send(cmd);
        self.bell.ring();
    }

    pub fn ctrl(&self, to: u32, msg: &Msg) {
        self.push(Cmd::Send {
            to,
            tag: CTRL,
            data: Payload::Owned(msg.encode()),
            credit: 0,
        });
    }

    /// A liveness or status message: sent, without keeping the communication thread's naps
    /// short.
    pub fn quiet(&self, to: u32, msg: &Msg) {
        self.push(Cmd::Quiet {
            to,
            data: msg.encode(),
        });
    }

    pub fn data(&self, to: u32, tag: i32, data: Payload, credit: u64) {
        self.push(Cmd::Send {
            to,
            tag,
            data,
            credit,
        });
    }

    /// Registers interest in `(from, tag)` before the request goes out (commands are handled
    /// in order, so nothing of the answer can arrive unclaimed).
    pub fn expect(&self, from: u32, tag: i32) -> Receiver<Event> {
        let (sink, events) = crossbeam_channel::unbounded();
        self.push(Cmd::Expect {
            from,
            tag,
            waiter: Waiter::Channel(sink),
        });
        events
    }

    /// As `expect`, for a transfer the communication thread will carry on itself (`carry`).
    pub fn expect_inline(&self, from: u32, tag: i32) {
        self.push(Cmd::Expect {
            from,
            tag,
            waiter: Waiter::Inline,
        });
    }

    /// Where `(from, tag)`'s data goes: it can be attached after the request went out (the
    /// pieces that arrived meanwhile wait for it, matched but not received).
    pub fn land(&self, from: u32, tag: i32, landing: Arc<Landing>) {
        self.push(Cmd::Land {
            from,
            tag,
            landing,
            transfer: None,
        });
    }

    /// `land`, and from here the communication thread carries the transfer on itself (an
    /// `expect_inline` one): its events so far, then each as it arrives.
    pub fn carry(&self, from: u32, tag: i32, landing: Arc<Landing>, transfer: Box<dyn Transfer>) {
        self.push(Cmd::Land {
            from,
            tag,
            landing,
            transfer: Some(transfer),
        });
    }

    pub fn forget(&self, from: u32, tag: i32) {
        self.push(Cmd::Forget { from, tag });
    }

    pub fn stop(&self) {
        self.push(Cmd::Stop);
    }
}

/// How long the communication thread naps when nothing moved (`mpi::Loop::run`): while a
/// transfer of its own is awaited, from `BUSY_NAP` after activity doubling up to `ACTIVE_NAP`;
/// while it serves other ranks (asked within `ACTIVE_FOR`, or pieces of its in flight),
/// `ACTIVE_NAP` (another rank's request waits that long at most); idle, from `IDLE_NAP`
/// doubling up to `IDLE_NAP_MAX`, parked (`Bell`: a command from this node wakes it at once;
/// another rank's first request waits one nap at most). Every nap that ends by itself is a
/// wake-up, 19–29 µs of CPU on this VM (`bench/floor/wakeups.c`; a sleep another thread ends:
/// 2.5–3 µs): an owner serving one reader's 2 MiB files polls ~5 times per file at 200 µs, ~10
/// at 100 µs.
pub const BUSY_NAP: Duration = Duration::from_micros(20);
pub const ACTIVE_NAP: Duration = Duration::from_micros(200);
pub const ACTIVE_FOR: Duration = Duration::from_millis(500);
pub const IDLE_NAP: Duration = Duration::from_millis(2);
pub const IDLE_NAP_MAX: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_not_given_back_clean_is_never_reused_with_that_rank() {
        let t = Tags::new(2);
        let a = t.take(1).unwrap();
        t.give_back(1, a, false);
        let mut seen = HashSet::new();
        for _ in 0..DATA_TAGS - 1 {
            let k = t.take(1).unwrap();
            assert_ne!(k, a);
            assert!(seen.insert(k), "busy tags are not handed out twice");
        }
        assert_eq!(t.take(1), None, "every tag busy or retired");
        assert!(t.take(0).is_some(), "another rank has its own tags");
        t.give_back(1, DATA_TAG0 + 5, true);
        assert!(t.take(1).is_some());
    }

    #[test]
    fn cancels_stop_sending_requests_first_before_they_use_up_a_rank_s_tags() {
        let t = Tags::new(2);
        let limit = DATA_TAGS as u32 / 4;
        for i in 0..limit {
            assert!(t.plenty(1), "{i} retired");
            let k = t.take(1).unwrap();
            t.give_back(1, k, false);
            // A tag given back twice is counted once.
            t.give_back(1, k, false);
        }
        assert!(!t.plenty(1), "a quarter of rank 1's tags retired");
        assert!(t.plenty(0), "another rank's are its own");
        let k = t.take(1).unwrap();
        t.give_back(1, k, true);
        assert!(
            !t.plenty(1),
            "a clean transfer retires nothing, and gives nothing back"
        );
        assert!(t.take(1).is_some(), "three quarters are left");
    }

    #[test]
    fn the_budget_bounds_bytes_in_flight() {
        let b = Budget::new(10);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(b.acquire(6, soon));
        assert!(!b.acquire(6, soon), "no room until released");
        b.release(6);
        assert!(b.acquire(6, soon) && b.acquire(4, soon));
        assert!(b.acquire(0, soon));
    }

    #[test]
    fn buffers_are_reused() {
        let p = Buffers::new();
        let mut b = p.get(1000);
        b.extend_from_slice(&[1, 2, 3]);
        let ptr = b.as_ptr();
        p.put(b);
        let b = p.get(10);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 0));
    }
}
