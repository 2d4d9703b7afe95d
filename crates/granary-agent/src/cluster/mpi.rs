//! Everything that calls MPI (built with the `mpi` feature only): start-up (`MPI_Init_thread`,
//! rank and size), the catalog broadcast, and the communication thread's loop
//! (`transport` says why one thread). The loop uses the C API directly: its requests outlive
//! any scope rsmpi's safe wrappers could tie a buffer to (a receive matched now completes after
//! many turns of the loop, with its buffer owned by the loop meanwhile).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbeam_channel::{Receiver, TryRecvError};
use mpi::ffi;
use mpi::traits::*;

use super::doorbell::{self, Door, Kind, Trust};
use super::transport::{
    Bell, Budget, Buffers, Cmd, Event, Flow, Inbox, Landing, Payload, Pulse, Transfer, Waiter,
    ACTIVE_FOR, ACTIVE_NAP, BUSY_NAP, IDLE_NAP, IDLE_NAP_MAX,
};
use super::wire::{Msg, CTRL};

/// This process's place in the MPI job, and MPI itself (finalized when dropped).
pub struct Mpi {
    universe: mpi::environment::Universe,
    pub rank: u32,
    pub ranks: u32,
}

/// `MPI_Init_thread(SERIALIZED)`: after start-up only the communication thread calls MPI.
pub fn init() -> Result<Mpi> {
    let Some((universe, got)) = mpi::initialize_with_threading(mpi::Threading::Serialized) else {
        bail!("MPI was already initialized in this process");
    };
    if matches!(got, mpi::Threading::Single | mpi::Threading::Funneled) {
        bail!("the MPI library offers threading level {got:?}; granary serve needs SERIALIZED");
    }
    let world = universe.world();
    let (rank, ranks) = (world.rank() as u32, world.size() as u32);
    // Errors come back as codes (the peer is then written off) instead of aborting the job.
    // SAFETY: MPI is initialized; the world communicator and the predefined handler are valid.
    unsafe {
        ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
    }
    Ok(Mpi {
        universe,
        rank,
        ranks,
    })
}

impl Mpi {
    /// Rank 0's `image` reaches every rank (its length first; 0 means rank 0 has none to give,
    /// and every rank gets an empty vector). Collective: every rank calls it once.
    pub fn broadcast(&self, image: Vec<u8>) -> Result<Vec<u8>> {
        let world = self.universe.world();
        let root = world.process_at_rank(0);
        let mut len = image.len() as u64;
        // Ranks other than 0 wait here while rank 0 walks the source: polled with naps (a
        // blocking broadcast would spin on a core the walk needs).
        mpi::request::scope(|sc| {
            let mut req = root.immediate_broadcast_into(sc, &mut len);
            loop {
                match req.test() {
                    Ok(_) => break,
                    Err(r) => {
                        req = r;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            }
        });
        let mut buf = if self.rank == 0 {
            image
        } else {
            vec![0u8; usize::try_from(len).context("catalog image larger than memory")?]
        };
        // MPI counts are ints: pieces of 1 GiB.
        for piece in buf.chunks_mut(1 << 30) {
            root.broadcast_into(piece);
        }
        Ok(buf)
    }

    /// Runs the communication loop until `Cmd::Stop`, then leaves MPI (`MPI_Finalize`).
    pub fn serve(
        self,
        inbox: Arc<dyn Inbox>,
        cmds: Receiver<Cmd>,
        bell: Arc<Bell>,
        bufs: Arc<Buffers>,
        budget: Arc<Budget>,
        pulse: Arc<Pulse>,
    ) {
        set_timer_slack();
        let mut l = Loop {
            door: bell.door.clone(),
            trust: Trust::new(self.ranks),
            to_ring: Vec::new(),
            bells: Vec::new(),
            waiting: Vec::new(),
            asked_by: vec![None; self.ranks as usize],
            sent: vec![0; self.ranks as usize],
            got: vec![0; self.ranks as usize],
            inbox,
            bufs,
            budget,
            pulse,
            expect: HashMap::new(),
            orphans: Vec::new(),
            sends: Vec::new(),
        };
        if let Some(d) = &l.door {
            let (addr, token) = d.card();
            let card = Msg::Door { addr, token }.encode();
            for r in (0..self.ranks).filter(|&r| r != self.rank) {
                l.send(r, CTRL, Payload::Owned(card.clone()), 0, false);
            }
        }
        l.run(&cmds, &bell);
        l.drain(Duration::from_secs(5));
        tracing::info!("leaving MPI");
        drop(self.universe);
    }
}

/// Timer slack of this thread: 1 µs instead of 50 µs, so its short naps are short.
fn set_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
    }
}

fn byte() -> ffi::MPI_Datatype {
    // SAFETY: a predefined datatype handle, valid while MPI is initialized.
    unsafe { ffi::RSMPI_UINT8_T }
}

fn world() -> ffi::MPI_Comm {
    // SAFETY: the predefined world communicator, valid while MPI is initialized.
    unsafe { ffi::RSMPI_COMM_WORLD }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: a predefined handle.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn empty_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Where a receive in flight writes: memory that belongs to MPI until the request completes.
enum Into {
    /// A pooled buffer (its length is set to `len` once complete).
    Buffer(Vec<u8>),
    /// The transfer's landing, at `off` (kept mapped by `_map`).
    Landing { _map: Arc<Landing>, off: usize },
}

struct Recv {
    req: ffi::MPI_Request,
    into: Into,
    len: usize,
}

struct Send {
    req: ffi::MPI_Request,
    data: Payload,
    credit: u64,
    to: u32,
    since: Instant,
}

/// Who gets a transfer's events (`Waiter`, with the inline transfer once attached).
enum To {
    Channel(crossbeam_channel::Sender<Event>),
    Inline {
        transfer: Option<Box<dyn Transfer>>,
        /// Events that came before the transfer was attached, in order.
        early: Vec<Event>,
    },
}

struct Expecting {
    to: To,
    /// Its landing, once the waiter attached it (`Cmd::Land`); until then its pieces are
    /// matched but not received (`parked`): they go straight into it when it comes.
    landing: Option<Arc<Landing>>,
    parked: VecDeque<(ffi::MPI_Message, usize)>,
    /// Where the next piece lands.
    next: usize,
    /// Data matched for it, in matching order (delivered in that order).
    queue: VecDeque<Recv>,
}

struct Loop {
    /// This rank's doorbell (`doorbell`), and which peers' doorbells it trusts.
    door: Option<Arc<Door>>,
    trust: Trust,
    /// Doorbells to ring at the end of this turn.
    to_ring: Vec<(u32, Kind)>,
    /// Peers whose doorbell rang for a message not seen yet, and when.
    bells: Vec<(u32, Instant)>,
    /// Peers whose receives of this rank's data wait on its progress (they rang
    /// `Kind::Progress`): polled for as for an untrusted peer while sends to them are in flight.
    waiting: Vec<u32>,
    /// Messages handed to MPI for each rank, and matched from each rank, so far: a doorbell
    /// says how many its ringer had sent (`doorbell`), so one whose message was matched already
    /// is not polled for.
    sent: Vec<u64>,
    got: Vec<u64>,
    /// When each rank last asked this one for something (a request, a cancel, an
    /// invalidation; not liveness, not a reply to this rank's own requests).
    asked_by: Vec<Option<Instant>>,
    inbox: Arc<dyn Inbox>,
    bufs: Arc<Buffers>,
    budget: Arc<Budget>,
    pulse: Arc<Pulse>,
    expect: HashMap<(u32, i32), Expecting>,
    /// Data nobody waits for any more (a transfer given up): received, then dropped.
    orphans: Vec<Recv>,
    sends: Vec<Send>,
}

impl Expecting {
    fn new(waiter: Waiter) -> Expecting {
        Expecting {
            to: match waiter {
                Waiter::Channel(sink) => To::Channel(sink),
                Waiter::Inline => To::Inline {
                    transfer: None,
                    early: Vec::new(),
                },
            },
            landing: None,
            parked: VecDeque::new(),
            next: 0,
            queue: VecDeque::new(),
        }
    }

    /// Hands `ev` to the waiter: sent to its thread, or carried on here. `Done`: the transfer
    /// is over (the caller forgets it).
    fn deliver(&mut self, ev: Event) -> Flow {
        match &mut self.to {
            To::Channel(sink) => {
                let _ = sink.send(ev);
                Flow::More
            }
            To::Inline {
                transfer: Some(t), ..
            } => t.event(ev),
            To::Inline { early, .. } => {
                early.push(ev);
                Flow::More
            }
        }
    }
}

/// A send not completed after this long (its receiver is stopped or gone) no longer counts
/// against the budget: its buffer stays with MPI until it completes, if ever.
const WRITE_OFF: Duration = Duration::from_secs(5);

/// `MPI_Test`: true once the request completed (it is then MPI_REQUEST_NULL); an error counts
/// as completed (the peer is told `failed`).
fn test(req: &mut ffi::MPI_Request) -> Result<bool, i32> {
    let mut flag = 0;
    let mut st = empty_status();
    // SAFETY: `req` is a request this loop started (or null); flag and status are locals.
    let rc = unsafe { ffi::MPI_Test(req, &mut flag, &mut st) };
    if rc != 0 {
        return Err(rc);
    }
    Ok(flag != 0)
}

impl Loop {
    fn run(&mut self, cmds: &Receiver<Cmd>, bell: &Bell) {
        // While a transfer of this rank's is awaited, naps double from BUSY_NAP after each
        // activity up to ACTIVE_NAP (its answer is picked up within that). While this rank
        // serves others (asked within ACTIVE_FOR, or pieces of its going out), it naps
        // ACTIVE_NAP: another rank's next request waits that long at most, and the short naps
        // after each activity bought nothing there but wake-ups (three per request served).
        // Otherwise it is idle — its own programs reading count for nothing here, their
        // requests wake it (`Bell`) — and sleeps IDLE_NAP, doubling up to IDLE_NAP_MAX: MPI has
        // no wait that sleeps (OpenMPI's and MPICH's blocking calls spin on a core), so a
        // peer's first request to an idle rank waits that long at most, and the rank serves
        // from then on. Liveness traffic (heartbeats, status questions) is not activity.
        // Peers whose doorbells ring (`doorbell`) wake it when they send: while it waits only
        // on such peers, a nap is a safety net (`nap`).
        let mut nap = BUSY_NAP;
        // Datagrams may wait on the doorbell (`Bell::nap` says; a datagram that comes while
        // the thread is awake makes the next nap return at once).
        let mut rung = true;
        loop {
            self.pulse.beat();
            let mut moved = rung && self.doorbells();
            rung = false;
            loop {
                match cmds.try_recv() {
                    Ok(Cmd::Stop) | Err(TryRecvError::Disconnected) => return,
                    Ok(cmd) => moved |= self.command(cmd),
                    Err(TryRecvError::Empty) => break,
                }
            }
            moved |= self.probe();
            moved |= self.progress();
            self.tick();
            self.ring();
            if moved {
                nap = BUSY_NAP;
                continue;
            }
            let wait = self.nap(nap);
            // Parked or in `ppoll` (`Bell`), not a channel's timed receive: a command or a
            // doorbell wakes it at once, and the next turn takes it.
            let napped = Instant::now();
            rung = bell.nap(wait, || !cmds.is_empty());
            if cmds.is_empty() && napped.elapsed() >= wait {
                nap = (wait * 2).min(IDLE_NAP_MAX);
            }
        }
    }

    /// How long to nap now (`nap`: the doubling nap of the caller), from what this rank waits
    /// for, and whether the peers it waits on ring doorbells (`doorbell`: then a timer is only
    /// a safety net).
    fn nap(&mut self, nap: Duration) -> Duration {
        let now = Instant::now();
        self.bells
            .retain(|(_, at)| now.duration_since(*at) < doorbell::RUNG_FOR);
        let door = self.door.is_some();
        let trusted = |r: u32| door && self.trust.trusts(r, now);
        let idle = nap.clamp(IDLE_NAP, IDLE_NAP_MAX);
        let mut wait = idle;
        let askers: Vec<u32> = (0..self.asked_by.len() as u32)
            .filter(|&r| {
                self.asked_by[r as usize].is_some_and(|at| now.duration_since(at) < ACTIVE_FOR)
            })
            .collect();
        if !askers.is_empty() && !askers.iter().all(|&r| trusted(r)) {
            wait = wait.min(ACTIVE_NAP);
        }
        // Pieces of its in flight: a transport may need this side's progress to move them (a
        // rendezvous over TCP). A receiver whose doorbells it trusts rings when its receive
        // waits (`Kind::Progress`); otherwise the pieces have arrived or will without this
        // side (shared memory's single copy: read by the receiver as its receive starts), and
        // only the send's completion is left, which frees its budget and its buffer or
        // mapping: picked up at the next turn, within SAFETY_NAP. Before, every receiver rang
        // once its pieces arrived, and the owner woke once more per remote read for that.
        for s in self.sends.iter().filter(|s| s.credit > 0) {
            let polled = !trusted(s.to) || self.waiting.contains(&s.to);
            wait = wait.min(if polled {
                ACTIVE_NAP
            } else {
                doorbell::SAFETY_NAP
            });
        }
        if !self.expect.is_empty() {
            let all = self.expect.keys().all(|&(from, _)| trusted(from));
            wait = wait.min(if all {
                doorbell::SAFETY_NAP
            } else {
                nap.min(ACTIVE_NAP)
            });
        }
        if !self.bells.is_empty() {
            // A doorbell's message not here yet (it overtook it): polled for.
            wait = wait.min(nap.min(ACTIVE_NAP));
        }
        wait
    }

    /// Reads this rank's doorbells: peers that rang are trusted, and a message they rang for
    /// is looked for. True if any rang for a message or progress.
    fn doorbells(&mut self) -> bool {
        let Some(d) = &self.door else {
            return false;
        };
        let rung = d.drain();
        let now = Instant::now();
        for &(p, kind, sent) in &rung.peers {
            self.trust.rang(p, now);
            // Its message matched already (found by a probe before this datagram was read,
            // while the thread was awake): nothing to poll for. Before the count, such a bell
            // kept the requester polling with 20 µs naps after most remote reads.
            let matched = self.got.get(p as usize).is_some_and(|&n| n >= sent);
            if kind == Kind::Message && !matched {
                self.bells.push((p, now));
            }
            if kind == Kind::Progress && !self.waiting.contains(&p) {
                self.waiting.push(p);
            }
        }
        !rung.peers.is_empty()
    }

    /// Rings the doorbells of the peers this turn sent messages to or received data from.
    fn ring(&mut self) {
        let Some(d) = &self.door else {
            self.to_ring.clear();
            return;
        };
        for (p, kind) in self.to_ring.drain(..) {
            let sent = self.sent.get(p as usize).copied().unwrap_or(0);
            d.ring(p, kind, sent);
        }
    }

    fn ring_later(&mut self, rank: u32, kind: Kind) {
        if self.door.is_some() && !self.to_ring.contains(&(rank, kind)) {
            self.to_ring.push((rank, kind));
        }
    }

    /// Carries out `cmd`; true if it is activity (anything but liveness traffic).
    fn command(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Send {
                to,
                tag,
                data,
                credit,
            } => {
                self.send(to, tag, data, credit, true);
            }
            Cmd::Quiet { to, data } => {
                self.send(to, CTRL, Payload::Owned(data), 0, false);
                return false;
            }
            Cmd::Expect { from, tag, waiter } => {
                if let Some(old) = self.expect.insert((from, tag), Expecting::new(waiter)) {
                    // Never with tags handed out once at a time; if it were, what is in flight
                    // for the old one must stay owned until it completes.
                    self.drop_expecting(from, tag, old);
                }
            }
            Cmd::Land {
                from,
                tag,
                landing,
                transfer,
            } => self.land(from, tag, landing, transfer),
            Cmd::Forget { from, tag } => self.forget(from, tag),
            Cmd::Stop => {}
        }
        true
    }

    /// Hands `data` to MPI for `to`; `ring`: and rings its doorbell (all but liveness).
    fn send(&mut self, to: u32, tag: i32, data: Payload, credit: u64, ring: bool) {
        let mut req = null_request();
        let (ptr, len) = data.bytes();
        // SAFETY: the bytes belong to `data` (a buffer, or a mapping held by its Arc), which
        // stays in `self.sends`, unmoved and unfreed, until the request completes; count is its
        // length (pieces are at most PIECE bytes, far below i32::MAX).
        let rc = unsafe {
            ffi::MPI_Isend(
                ptr.cast(),
                len as i32,
                byte(),
                to as i32,
                tag,
                world(),
                &mut req,
            )
        };
        if rc != 0 {
            tracing::debug!("MPI_Isend to rank {to} failed ({rc})");
            self.budget.release(credit);
            self.inbox.failed(to);
            return;
        }
        if let Some(n) = self.sent.get_mut(to as usize) {
            *n += 1;
        }
        self.sends.push(Send {
            req,
            data,
            credit,
            to,
            since: Instant::now(),
        });
        if ring {
            self.ring_later(to, Kind::Message);
        }
    }

    /// Matches arriving messages: control messages are received at once (small, already
    /// here), data into a pooled buffer of exactly its size. True if any arrived but liveness
    /// traffic.
    fn probe(&mut self) -> bool {
        let mut any = false;
        // MPI_Improbe matches what earlier progress queued, then progresses: what arrived
        // during a nap is seen by the second call. Without it every message waited one more
        // nap (a control round trip between two ranks napping 100 µs: ~510 µs against ~170 µs
        // here, bench/floor/mpi_latency.c).
        let mut again = true;
        for _ in 0..64 {
            let mut flag = 0;
            // SAFETY: a predefined handle.
            let mut msg: ffi::MPI_Message = unsafe { ffi::RSMPI_MESSAGE_NULL };
            let mut st = empty_status();
            // SAFETY: valid communicator; flag, message and status are locals.
            let rc = unsafe {
                ffi::MPI_Improbe(
                    ffi::RSMPI_ANY_SOURCE,
                    ffi::RSMPI_ANY_TAG,
                    world(),
                    &mut flag,
                    &mut msg,
                    &mut st,
                )
            };
            if rc == 0 && flag == 0 && std::mem::take(&mut again) {
                continue;
            }
            if rc != 0 || flag == 0 {
                break;
            }
            let (from, tag) = (st.MPI_SOURCE as u32, st.MPI_TAG);
            if let Some(n) = self.got.get_mut(from as usize) {
                *n += 1;
            }
            let mut count = 0;
            // SAFETY: `st` is the status MPI_Improbe just filled.
            unsafe { ffi::MPI_Get_count(&st, byte(), &mut count) };
            let len = count.max(0) as usize;
            self.inbox.heard(from);
            self.bells.retain(|(p, _)| *p != from);
            if tag == CTRL {
                let mut buf = vec![0u8; len];
                let mut st = empty_status();
                // SAFETY: receives the matched message into `buf`, exactly its size. A control
                // message is small and sent eagerly: it is here already, so this cannot wait.
                let rc = unsafe {
                    ffi::MPI_Mrecv(buf.as_mut_ptr().cast(), count, byte(), &mut msg, &mut st)
                };
                if rc != 0 {
                    self.inbox.failed(from);
                    continue;
                }
                let msg = Msg::decode(&buf);
                any |= !matches!(msg, Ok(ref m) if m.liveness());
                match msg {
                    Ok(Msg::Reply { tag, answer }) => {
                        self.deliver(from, tag, Event::Reply(answer));
                    }
                    Ok(Msg::Door { addr, token }) => {
                        if let Some(d) = &self.door {
                            d.learn(from, addr, token);
                        }
                    }
                    Ok(m) => {
                        if !m.liveness() {
                            if let Some(x) = self.asked_by.get_mut(from as usize) {
                                *x = Some(Instant::now());
                            }
                        }
                        self.inbox.control(from, m)
                    }
                    Err(e) => tracing::warn!("bad control message from rank {from}: {e}"),
                }
                continue;
            }
            any = true;
            match self.expect.get_mut(&(from, tag)) {
                Some(e) if e.landing.is_none() => e.parked.push_back((msg, len)),
                _ => self.receive(from, tag, msg, len),
            }
        }
        any
    }

    /// Starts receiving the matched data message `msg` (`len` bytes from `from`, `tag`): into
    /// its transfer's landing when it has room for it, else into a buffer (a transfer nobody
    /// waits for any more, or more than its landing holds).
    fn receive(&mut self, from: u32, tag: i32, mut msg: ffi::MPI_Message, len: usize) {
        let landing = self.expect.get(&(from, tag)).and_then(|e| {
            let l = e.landing.as_ref()?;
            Some((l.clone(), e.next, l.dest(e.next, len)))
        });
        let (into, ptr) = match landing {
            Some((l, off, Some(ptr))) => (Into::Landing { _map: l, off }, ptr),
            other => {
                if other.is_some() {
                    self.deliver(from, tag, Event::Overflow);
                }
                let mut b = self.bufs.get(len);
                let p = b.as_mut_ptr();
                (Into::Buffer(b), p)
            }
        };
        let mut req = null_request();
        // SAFETY: `ptr` has room for `len` bytes (a buffer of that capacity, or a landing range
        // checked by `dest`); that memory is owned by the pending receive (`into`: the Vec, or
        // an Arc of the mapping) until the request completes, and nothing else reads or writes
        // it meanwhile. `msg` is a matched message not received yet; count is its probed size.
        let rc = unsafe { ffi::MPI_Imrecv(ptr.cast(), len as i32, byte(), &mut msg, &mut req) };
        if rc != 0 {
            self.inbox.failed(from);
            return;
        }
        let mut r = Recv { req, into, len };
        let Some(e) = self.expect.get_mut(&(from, tag)) else {
            self.orphans.push(r);
            self.ring_later(from, Kind::Progress);
            return;
        };
        let Into::Landing { off, .. } = r.into else {
            e.queue.push_back(r);
            self.ring_later(from, Kind::Progress);
            return;
        };
        e.next += len;
        if !e.queue.is_empty() {
            e.queue.push_back(r);
            self.ring_later(from, Kind::Progress);
            return;
        }
        // A transport that copies as the receive starts (shared memory's single copy: the
        // sender's pages read with `process_vm_readv` inside `MPI_Imrecv`) has completed it
        // already: delivered now, so the transfer hashes this piece right after its copy, while
        // its bytes are in the core's caches — before the next piece is received, not after
        // every piece was copied. A transport that moves the bytes later (a NIC) keeps all
        // pieces in flight at once, tested in `progress`.
        let flow = match test(&mut r.req) {
            Ok(false) => {
                e.queue.push_back(r);
                self.ring_later(from, Kind::Progress);
                return;
            }
            Ok(true) => e.deliver(Event::Landed { off, len }),
            Err(rc) => {
                tracing::debug!("receive from rank {from} failed ({rc})");
                self.inbox.failed(from);
                return;
            }
        };
        if flow == Flow::Done {
            self.forget(from, tag);
        }
    }

    /// No more interest in `(from, tag)`: what is in flight or matched for it is received into
    /// buffers and dropped.
    fn forget(&mut self, from: u32, tag: i32) {
        if let Some(e) = self.expect.remove(&(from, tag)) {
            self.drop_expecting(from, tag, e);
        }
    }

    fn drop_expecting(&mut self, from: u32, tag: i32, e: Expecting) {
        self.orphans.extend(e.queue);
        for (msg, len) in e.parked {
            self.receive(from, tag, msg, len);
        }
    }

    /// Hands `ev` to `(from, tag)`'s waiter, if any; forgets the transfer when it is over.
    fn deliver(&mut self, from: u32, tag: i32, ev: Event) {
        let done = self
            .expect
            .get_mut(&(from, tag))
            .is_some_and(|e| e.deliver(ev) == Flow::Done);
        if done {
            self.forget(from, tag);
        }
    }

    /// `(from, tag)`'s landing (and, inline, its transfer, which gets the events that came
    /// before it); then its pieces that waited, matched, go into the landing.
    fn land(
        &mut self,
        from: u32,
        tag: i32,
        landing: Arc<Landing>,
        transfer: Option<Box<dyn Transfer>>,
    ) {
        let Some(e) = self.expect.get_mut(&(from, tag)) else {
            return;
        };
        e.landing = Some(landing);
        let mut flow = Flow::More;
        if let (
            To::Inline {
                transfer: slot,
                early,
            },
            Some(mut t),
        ) = (&mut e.to, transfer)
        {
            for ev in std::mem::take(early) {
                flow = t.event(ev);
                if flow == Flow::Done {
                    break;
                }
            }
            *slot = Some(t);
        }
        if flow == Flow::Done {
            self.forget(from, tag);
            return;
        }
        let parked = std::mem::take(&mut e.parked);
        for (msg, len) in parked {
            self.receive(from, tag, msg, len);
        }
    }

    /// Inline transfers' deadlines (one look per turn of the loop).
    fn tick(&mut self) {
        let now = Instant::now();
        let done: Vec<(u32, i32)> = self
            .expect
            .iter_mut()
            .filter_map(|(&k, e)| match &mut e.to {
                To::Inline {
                    transfer: Some(t), ..
                } => (t.tick(now) == Flow::Done).then_some(k),
                _ => None,
            })
            .collect();
        for (from, tag) in done {
            self.forget(from, tag);
        }
    }

    /// Tests receives and sends in flight; delivers completed data in order. True if a receive
    /// completed.
    fn progress(&mut self) -> bool {
        let mut any = false;
        let mut failed = Vec::new();
        let mut done = Vec::new();
        for (&(from, tag), e) in self.expect.iter_mut() {
            while let Some(head) = e.queue.front_mut() {
                match test(&mut head.req) {
                    Ok(false) => break,
                    Ok(true) => {
                        any = true;
                        let Some(r) = e.queue.pop_front() else { break };
                        let ev = match r.into {
                            Into::Buffer(mut b) => {
                                // SAFETY: the receive completed: MPI wrote exactly `len` bytes
                                // (the probed size) into the buffer's capacity.
                                unsafe { b.set_len(r.len) };
                                Event::Data(b)
                            }
                            Into::Landing { off, .. } => Event::Landed { off, len: r.len },
                        };
                        if e.deliver(ev) == Flow::Done {
                            done.push((from, tag));
                            break;
                        }
                    }
                    Err(rc) => {
                        tracing::debug!("receive from rank {from} failed ({rc})");
                        e.queue.pop_front();
                        failed.push(from);
                    }
                }
            }
        }
        for (from, tag) in done {
            self.forget(from, tag);
        }
        let bufs = &self.bufs;
        self.orphans.retain_mut(|r| match test(&mut r.req) {
            Ok(false) => true,
            Ok(true) | Err(_) => {
                any = true;
                if let Into::Buffer(b) = &mut r.into {
                    bufs.put(std::mem::take(b));
                }
                false
            }
        });
        let budget = &self.budget;
        let now = Instant::now();
        self.sends.retain_mut(|s| match test(&mut s.req) {
            Ok(false) => {
                if s.credit > 0 && now.duration_since(s.since) > WRITE_OFF {
                    budget.release(std::mem::take(&mut s.credit));
                }
                true
            }
            // A completed send is not activity: nothing waits on it but the budget (a provider
            // with more to send, which a nap of ACTIVE_NAP delays little), and counting it kept
            // an owner napping 20 µs after every piece it served.
            Ok(true) => {
                budget.release(s.credit);
                if let Payload::Owned(b) = &mut s.data {
                    bufs.put(std::mem::take(b));
                }
                false
            }
            Err(rc) => {
                tracing::debug!("send to rank {} failed ({rc})", s.to);
                failed.push(s.to);
                budget.release(s.credit);
                false
            }
        });
        let sends = &self.sends;
        self.waiting
            .retain(|&p| sends.iter().any(|s| s.to == p && s.credit > 0));
        for r in failed {
            self.inbox.failed(r);
        }
        any
    }

    /// At stop: what is in flight gets `limit` to complete (a stopped peer's never will);
    /// arriving messages are still matched and dropped meanwhile.
    fn drain(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let keys: Vec<_> = self.expect.keys().copied().collect();
        for (from, tag) in keys {
            self.forget(from, tag);
        }
        loop {
            self.probe();
            self.progress();
            if (self.sends.is_empty() && self.orphans.is_empty()) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(BUSY_NAP);
        }
        // Requests that never completed keep their buffers: leaked on purpose (MPI may still
        // write into them until the process exits).
        for r in self.orphans.drain(..) {
            std::mem::forget(r.into);
        }
        for s in self.sends.drain(..) {
            std::mem::forget(s.data);
        }
    }
}
