//! What a rank knows of the others: which are alive, when each was last heard from (any message
//! counts), and the numbers of its last heartbeat.
//!
//! **Liveness is a ring.** Every `BEAT_PERIOD` each rank sends one heartbeat, to its successor
//! (the next rank it holds alive, cyclically), and watches only its predecessor: a rank sends and
//! receives O(1) liveness messages per second however many ranks there are (all-to-all beats
//! cost 2,044 messages per rank per second at 512 ranks). A predecessor silent for
//! `SUSPECT_AFTER` is asked for a sign of life (`Msg::Ask`, which its communication thread
//! answers with a heartbeat) and written off if nothing came from it within `ASK_GRACE` more;
//! the watcher then tells every rank (`Msg::Down`, one message per rank per failure); the dead
//! rank's predecessor then beats to its new successor, which watches it from then on. A
//! transfer whose owner went silent writes it off the same way (`Patience`). A rank that learns
//! it was written off (a stopped rank, continued) begins a new **life** and tells every rank it
//! is back (`Msg::Back`, its life's number, to each). Only that announcement brings back a rank
//! written off on a failure told to every rank: a dead rank's last messages, sent before it
//! died, can be received after it was written off, and must not count it on again (every
//! `Down` carries the life it ends, so a `Down` received after the rank's announcement of a
//! later life is stale, and one received before the announcement of the life it names ends that
//! life here all the same). A rank this rank wrote off by itself alone (its own MPI calls stuck,
//! nobody told) is back at its next message, unless a failure is told of it meanwhile. A rank
//! written off on a told failure and heard from anyway is told again (`tell_again`): the `Down`
//! sent to it may never have reached it. And one heard from by nobody is told again all the same
//! (`retell_due`, from `RETELL_MIN` after the write-off, the interval doubling up to
//! `RETELL_MAX`): when the `Down`s of a rank that died were only partly sent, two live ranks can
//! each hold the other written off, neither told of it, neither sending to the other — without
//! the re-tell they would stay apart for good, each reading the other's share from the source.
//!
//! Why ask first: on a loaded node a live rank's threads can wait seconds for a core, and a
//! rank written off while alive costs the source a read of every file of its that is asked for
//! meanwhile (its stand-in reads it again).
//!
//! Detection delay: `SUSPECT_AFTER` + `ASK_GRACE` (4 s) for one dead rank, plus one message to
//! each rank; a transfer from it is given up after twice the peer timeout (2 s) already. k
//! consecutive dead ranks on the ring are found one after the other, within k × 4 s. Numbers of
//! ranks other than the predecessor are asked for when `granary status` runs (`Msg::Ask`), not
//! sent periodically.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::wire::Beat;

pub const BEAT_PERIOD: Duration = Duration::from_millis(250);
pub const SUSPECT_AFTER: Duration = Duration::from_millis(3000);
/// How long a suspected predecessor has to answer an `Ask`.
pub const ASK_GRACE: Duration = Duration::from_millis(1000);
/// The first re-tell of a rank written off on a told failure (`retell_due`), after the write-off.
pub const RETELL_MIN: Duration = Duration::from_secs(2);
/// The longest interval between re-tells: a dead rank costs one message a minute or so.
pub const RETELL_MAX: Duration = Duration::from_secs(64);
/// The longest a transfer waits on an owner that is heard from but does not deliver.
pub const PATIENCE_MAX: Duration = Duration::from_secs(30);

pub struct Peers {
    me: u32,
    start: Instant,
    /// Per rank: milliseconds since `start` when last heard from, + 1 (0: written off).
    heard: Vec<AtomicU64>,
    /// Per rank: the latest life it announced (`Msg::Back`); this rank's own at `me`.
    lives: Vec<AtomicU32>,
    /// Per rank: written off on a failure told to every rank (`Down`), so back only by its
    /// announcement of a later life.
    told: Vec<AtomicBool>,
    /// Per rank: when it was last told again that it is written off (`tell_again`; ms since
    /// `start`, + 1; 0: never).
    told_again: Vec<AtomicU64>,
    /// Per rank: how many times it was re-told since it was last written off, and when last
    /// (ms since `start`, + 1; at first the write-off's time) (`retell_due`).
    retold: Vec<AtomicU32>,
    retold_at: Vec<AtomicU64>,
    /// Per rank: its last heartbeat's numbers, and when it arrived (ms since `start`, + 1).
    beats: Mutex<Vec<(Beat, u64)>>,
    beat_cv: Condvar,
    /// When the watch of the current predecessor began (ms since `start`, + 1): a rank that
    /// just became the predecessor, or a watcher that was itself stopped, is given a full
    /// `SUSPECT_AFTER` from then.
    watch_from: AtomicU64,
    /// When the silent predecessor was asked for a sign of life (ms since `start`, + 1; 0: not).
    asked: AtomicU64,
}

/// What the watch of the predecessor found (`Peers::check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    Fine,
    /// Silent for `SUSPECT_AFTER`: ask it for a sign of life.
    Ask(u32),
    /// No answer to that either: written off now (the caller tells the others).
    Down(u32),
}

impl Peers {
    pub fn new(me: u32, ranks: u32) -> Peers {
        Peers {
            me,
            start: Instant::now(),
            // Everyone counts as alive at start: the catalog broadcast just reached them all.
            heard: (0..ranks).map(|_| AtomicU64::new(1)).collect(),
            lives: (0..ranks).map(|_| AtomicU32::new(0)).collect(),
            told: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            told_again: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
            retold: (0..ranks).map(|_| AtomicU32::new(0)).collect(),
            retold_at: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
            beats: Mutex::new(vec![(Beat::default(), 0); ranks as usize]),
            beat_cv: Condvar::new(),
            watch_from: AtomicU64::new(1),
            asked: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    fn ranks(&self) -> u32 {
        self.heard.len() as u32
    }

    /// A message from `rank` arrived. True if it had been written off by this rank alone and
    /// is back; one written off on a failure told to every rank stays written off (its message
    /// may have been sent before it died) until it announces a new life (`back`).
    pub fn heard(&self, rank: u32) -> bool {
        let (Some(h), Some(told)) = (self.heard.get(rank as usize), self.told.get(rank as usize))
        else {
            return false;
        };
        let now = self.now_ms();
        let mut cur = h.load(Ordering::Acquire);
        loop {
            // `failed` marks `told` before it clears `heard`: a rank seen written off here is
            // seen told too, when it was.
            if cur == 0 && told.load(Ordering::Acquire) {
                return false;
            }
            match h.compare_exchange_weak(cur, now, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        let back = cur == 0;
        if back {
            tracing::info!("rank {rank} is heard from again");
            // The ring changed: whoever is the predecessor now gets a full watch.
            self.rewatch();
        }
        back
    }

    /// `rank` announced life `life` (`Msg::Back`: it learnt it was written off). True if that
    /// brings it back here.
    pub fn back(&self, rank: u32, life: u32) -> bool {
        let (Some(l), Some(told)) = (self.lives.get(rank as usize), self.told.get(rank as usize))
        else {
            return false;
        };
        // An announcement seen already (or an older one) is an ordinary message.
        if rank != self.me && l.fetch_max(life, Ordering::AcqRel) < life {
            told.store(false, Ordering::Release);
        }
        self.heard(rank)
    }

    /// The life of `rank` as known here (this rank's own for `me`): a `Down` ends that life.
    pub fn life(&self, rank: u32) -> u32 {
        self.lives
            .get(rank as usize)
            .map_or(0, |l| l.load(Ordering::Acquire))
    }

    /// Another rank wrote `rank` off in its life `life` (`Msg::Down`). True if it was alive
    /// here until now; a `Down` of a life it has since left behind (its announcement came
    /// first) changes nothing. That life is over from now on, here too: its announcement, sent
    /// by another rank than the `Down` and so received after it or before it, no longer brings
    /// it back (a rank alive after all learns of the `Down` and announces the next life).
    pub fn down(&self, rank: u32, life: u32) -> bool {
        let Some(l) = self.lives.get(rank as usize) else {
            return false;
        };
        if rank == self.me || l.fetch_max(life, Ordering::AcqRel) > life {
            return false;
        }
        self.failed(rank)
    }

    /// This rank was written off in its life `life`: the life it announces now, and whether
    /// that is a new one (to tell every rank) or one announced already (to tell the sender).
    pub fn new_life(&self, life: u32) -> (u32, bool) {
        let Some(l) = self.lives.get(self.me as usize) else {
            return (0, false);
        };
        let mut cur = l.load(Ordering::Acquire);
        while life >= cur {
            match l.compare_exchange_weak(cur, life + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return (life + 1, true),
                Err(v) => cur = v,
            }
        }
        (cur, false)
    }

    /// A heartbeat from `rank` (or this rank's own numbers).
    pub fn beat(&self, rank: u32, b: Beat) -> bool {
        let back = rank != self.me && self.heard(rank);
        let mut beats = self.beats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = beats.get_mut(rank as usize) {
            *x = (b, self.now_ms());
        }
        self.beat_cv.notify_all();
        back
    }

    /// `rank` did not deliver in time (or another rank says it is down): down until it
    /// announces a new life. True if it was alive until now, or written off here alone (the
    /// caller tells the others, and `rank`: only its announcement brings it back now).
    pub fn failed(&self, rank: u32) -> bool {
        self.write_off(rank, true)
    }

    /// Every peer, when this rank's own MPI calls are stuck (nobody can be told): each one
    /// alive until now is back at its next message.
    pub fn cut_off(&self) {
        (0..self.ranks()).for_each(|r| {
            self.write_off(r, false);
        });
    }

    fn write_off(&self, rank: u32, told: bool) -> bool {
        if rank == self.me {
            return false;
        }
        let (Some(h), Some(t)) = (self.heard.get(rank as usize), self.told.get(rank as usize))
        else {
            return false;
        };
        // A rank cut off here (told false) and now failed (a transfer from it ended when the
        // cut-off wrote it off) is to be told: nobody else told it, and it would never announce
        // the life that alone brings it back.
        let newly_told = told && !t.swap(true, Ordering::AcqRel);
        if newly_told {
            // Told now (by this rank or the one whose `Down` this is): re-told from now on.
            self.retold_at[rank as usize].store(self.now_ms(), Ordering::Release);
            self.retold[rank as usize].store(0, Ordering::Release);
        }
        let was = h.swap(0, Ordering::AcqRel) != 0;
        if was {
            tracing::warn!("rank {rank} is written off: its files come from elsewhere until it is heard from again");
            self.rewatch();
        }
        was || newly_told
    }

    /// A message from `rank` arrived while it is written off on a failure told to every rank:
    /// the life to tell it was written off in (`Msg::Down` to it), at most once per
    /// `ASK_GRACE`. The `Down` addressed to it may never have reached it (the rank that wrote it
    /// off died first, or stopped sending): told nothing, a live rank would never announce the
    /// new life that alone brings it back. A dead rank's late messages cost a message or two.
    pub fn tell_again(&self, rank: u32) -> Option<u32> {
        let (Some(h), Some(t), Some(at)) = (
            self.heard.get(rank as usize),
            self.told.get(rank as usize),
            self.told_again.get(rank as usize),
        ) else {
            return None;
        };
        if rank == self.me || h.load(Ordering::Acquire) != 0 || !t.load(Ordering::Acquire) {
            return None;
        }
        let now = self.now_ms();
        let last = at.load(Ordering::Acquire);
        if last != 0 && Duration::from_millis(now.saturating_sub(last)) < ASK_GRACE {
            return None;
        }
        at.compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then(|| self.life(rank))
    }

    /// Ranks written off on a failure told to every rank that are due to be told again, with
    /// the life to name (`Msg::Down` to each): `RETELL_MIN` after the write-off, then at
    /// intervals doubling up to `RETELL_MAX`, whether or not anything came from them. A rank
    /// only `tell_again` would tell must send something first; this one does not wait for it
    /// (module comment: two live ranks each holding the other written off send each other
    /// nothing).
    pub fn retell_due(&self) -> Vec<(u32, u32)> {
        let now = self.now_ms();
        (0..self.ranks())
            .filter(|&r| r != self.me)
            .filter_map(|r| {
                let i = r as usize;
                if self.heard[i].load(Ordering::Acquire) != 0
                    || !self.told[i].load(Ordering::Acquire)
                {
                    return None;
                }
                let n = self.retold[i].load(Ordering::Acquire);
                let every = RETELL_MIN.saturating_mul(1u32 << n.min(16)).min(RETELL_MAX);
                let last = self.retold_at[i].load(Ordering::Acquire);
                if Duration::from_millis(now.saturating_sub(last)) < every {
                    return None;
                }
                self.retold_at[i]
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                    .ok()?;
                self.retold[i].fetch_add(1, Ordering::AcqRel);
                Some((r, self.life(r)))
            })
            .collect()
    }

    /// Restarts the watch of the predecessor from now.
    pub fn rewatch(&self) {
        self.watch_from.store(self.now_ms(), Ordering::Release);
    }

    /// How long ago `rank` was heard from (`None`: written off since).
    pub fn silence(&self, rank: u32) -> Option<Duration> {
        let h = self.heard.get(rank as usize)?.load(Ordering::Acquire);
        (h != 0).then(|| Duration::from_millis(self.now_ms().saturating_sub(h)))
    }

    pub fn alive(&self, rank: u32) -> bool {
        rank == self.me
            || self
                .heard
                .get(rank as usize)
                .is_some_and(|h| h.load(Ordering::Acquire) != 0)
    }

    /// The nearest live rank after this one on the ring (the one this rank beats to).
    pub fn successor(&self) -> Option<u32> {
        let n = self.ranks();
        (1..n).map(|k| (self.me + k) % n).find(|&r| self.alive(r))
    }

    /// The nearest live rank before this one on the ring (the one this rank watches).
    pub fn predecessor(&self) -> Option<u32> {
        let n = self.ranks();
        (1..n)
            .map(|k| (self.me + n - k) % n)
            .find(|&r| self.alive(r))
    }

    /// The watch of the predecessor: silent for `SUSPECT_AFTER` since it was last heard from
    /// or since the watch began, whichever is later, it is to be asked for a sign of life; and
    /// still silent `ASK_GRACE` after that, it is written off now (the caller tells the others).
    pub fn check(&self) -> Watch {
        let Some(p) = self.predecessor() else {
            return Watch::Fine;
        };
        let Some(h) = self
            .heard
            .get(p as usize)
            .map(|h| h.load(Ordering::Acquire))
        else {
            return Watch::Fine;
        };
        let now = self.now_ms();
        let since = h.max(self.watch_from.load(Ordering::Acquire));
        if Duration::from_millis(now.saturating_sub(since)) < SUSPECT_AFTER {
            self.asked.store(0, Ordering::Release);
            return Watch::Fine;
        }
        let asked = self.asked.load(Ordering::Acquire);
        if asked == 0 || asked < since {
            self.asked.store(now, Ordering::Release);
            return Watch::Ask(p);
        }
        if Duration::from_millis(now.saturating_sub(asked)) < ASK_GRACE || !self.failed(p) {
            return Watch::Fine;
        }
        self.asked.store(0, Ordering::Release);
        Watch::Down(p)
    }

    pub fn last_beat(&self, rank: u32) -> Beat {
        self.beats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(rank as usize)
            .map(|x| x.0)
            .unwrap_or_default()
    }

    /// A mark to wait for beats newer than (`await_beats`).
    pub fn mark(&self) -> u64 {
        self.now_ms()
    }

    /// Waits until every rank in `from` sent a heartbeat after `mark`, or `limit` passed.
    pub fn await_beats(&self, from: &[u32], mark: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut beats = self.beats.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let fresh = from
                .iter()
                .all(|&r| beats.get(r as usize).is_none_or(|x| x.1 >= mark));
            let left = deadline.saturating_duration_since(Instant::now());
            if fresh || left.is_zero() {
                return;
            }
            beats = self
                .beat_cv
                .wait_timeout(beats, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// A transfer's wait on its owner (module comment): the owner's next message is due within the
/// peer timeout; when it is late, an owner heard from within that time (by any message) is slow,
/// not gone, and is waited for again; one not heard from is asked for a sign of life, and is
/// written off only if nothing came from it within one more timeout. Heard from but delivering
/// nothing, it is given up on after `PATIENCE_MAX` without being written off.
pub struct Patience {
    timeout: Duration,
    since: Instant,
    deadline: Instant,
    asked: Option<Instant>,
}

/// What a late owner's silence means (`Patience::late`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// Wait on, until `Patience::deadline`.
    Wait,
    /// Ask it for a sign of life (`Msg::Ask`), and wait on.
    Ask,
    /// Nothing from it at all: write it off.
    Silent,
    /// Alive but not delivering: give up on it, without writing it off.
    Slow,
}

impl Patience {
    pub fn new(timeout: Duration) -> Patience {
        let now = Instant::now();
        Patience {
            timeout,
            since: now,
            deadline: now + timeout,
            asked: None,
        }
    }

    /// A message of the transfer arrived: the next is due a timeout from now.
    pub fn heard(&mut self) {
        self.asked = None;
        self.deadline = Instant::now() + self.timeout;
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The deadline passed (`now`): what to make of `owner`'s silence.
    pub fn late(&mut self, peers: &Peers, owner: u32, now: Instant) -> Late {
        if now < self.deadline {
            return Late::Wait;
        }
        if !peers.alive(owner) {
            return Late::Silent;
        }
        if now.duration_since(self.since) >= PATIENCE_MAX {
            return Late::Slow;
        }
        let heard_within = |d: Duration| peers.silence(owner).is_some_and(|s| s < d);
        self.deadline = now + self.timeout;
        match self.asked {
            None if heard_within(self.timeout) => Late::Wait,
            None => {
                self.asked = Some(now);
                Late::Ask
            }
            Some(at) if heard_within(now.duration_since(at)) => {
                self.asked = None;
                Late::Wait
            }
            Some(_) => Late::Silent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rank_is_down_until_heard_from() {
        let p = Peers::new(0, 3);
        assert!(p.alive(1) && p.alive(2));
        assert!(p.failed(1));
        assert!(!p.failed(1), "told once");
        assert!(!p.alive(1) && p.alive(2));
        p.failed(0);
        assert!(p.alive(0), "a rank never writes itself off");
        assert!(!p.heard(1), "a message it sent before it was written off");
        assert!(!p.alive(1));
        assert!(p.back(1, 1), "its announcement of a new life");
        assert!(p.alive(1));
        p.beat(
            2,
            Beat {
                jobs: 3,
                ..Beat::default()
            },
        );
        assert_eq!(p.last_beat(2).jobs, 3);
        assert!(!p.alive(7) && p.silence(7).is_none(), "no such rank");
    }

    #[test]
    fn lives_tell_a_dead_ranks_late_messages_from_its_return() {
        let p = Peers::new(0, 3);
        // Rank 2 tells this one that rank 1 is down in its life 0.
        assert!(p.down(1, 0));
        assert!(!p.heard(1) && !p.beat(1, Beat::default()) && !p.alive(1));
        assert!(
            !p.back(1, 0),
            "an announcement of the life that was written off"
        );
        assert!(!p.alive(1));
        assert!(p.back(1, 1) && p.alive(1) && p.life(1) == 1);
        // Rank 2's second `Down` of life 0 comes after the announcement of life 1: stale.
        assert!(!p.down(1, 0) && p.alive(1));
        assert!(p.down(1, 1) && !p.alive(1), "a write-off of its new life");
        // Written off by this rank alone (its MPI calls stuck): back at the next message.
        p.cut_off();
        assert!(!p.alive(1) && !p.alive(2) && p.alive(0));
        assert!(p.heard(2) && p.alive(2));
        assert!(
            !p.heard(1),
            "rank 1 was down before: still waits for its announcement"
        );
        // This rank's own lives: a `Down` of its current life begins the next; one of a life it
        // left already is answered with the current one.
        assert_eq!(p.new_life(0), (1, true));
        assert_eq!(p.new_life(0), (1, false));
        assert_eq!(p.new_life(1), (2, true));
    }

    #[test]
    fn the_ring_skips_ranks_written_off() {
        let p = Peers::new(2, 5);
        assert_eq!((p.predecessor(), p.successor()), (Some(1), Some(3)));
        p.failed(1);
        p.failed(3);
        assert_eq!((p.predecessor(), p.successor()), (Some(0), Some(4)));
        let alone = Peers::new(0, 1);
        assert_eq!((alone.predecessor(), alone.successor()), (None, None));
        let two = Peers::new(1, 2);
        assert_eq!((two.predecessor(), two.successor()), (Some(0), Some(0)));
    }

    #[test]
    fn only_a_silent_predecessor_is_suspected() {
        let p = Peers::new(1, 3);
        assert_eq!(p.check(), Watch::Fine, "just started");
        p.heard.iter().for_each(|h| h.store(1, Ordering::Release));
        p.watch_from.store(1, Ordering::Release);
        // Pretend SUSPECT_AFTER passed: every rank last heard at the start.
        let p = Peers {
            start: Instant::now() - SUSPECT_AFTER - Duration::from_millis(10),
            ..p
        };
        assert_eq!(p.check(), Watch::Ask(0), "the predecessor, not rank 2");
        assert_eq!(p.check(), Watch::Fine, "asked: it has ASK_GRACE to answer");
        assert!(p.alive(0));
        // Pretend ASK_GRACE passed too, with no answer.
        p.asked.store(1, Ordering::Release);
        let p = Peers {
            start: p.start - ASK_GRACE,
            ..p
        };
        p.watch_from.store(1, Ordering::Release);
        assert_eq!(p.check(), Watch::Down(0));
        assert!(!p.alive(0) && p.alive(2));
        assert_eq!(
            p.check(),
            Watch::Fine,
            "the new predecessor's watch just began"
        );
    }

    #[test]
    fn a_late_owner_heard_from_is_waited_for_one_not_heard_from_is_asked_then_written_off() {
        let peers = Peers::new(0, 3);
        let t = Duration::from_millis(100);
        let mut p = Patience::new(t);
        let now = Instant::now();
        assert_eq!(p.late(&peers, 1, now), Late::Wait, "not due yet");
        // Due, but heard from just now (another message): slow, not gone.
        peers.heard(1);
        assert_eq!(p.late(&peers, 1, now + 2 * t), Late::Wait);
        // Due again, nothing heard within the timeout: asked.
        let later = Instant::now() + 3 * t;
        let peers = Peers {
            start: peers.start - 3 * t,
            ..peers
        };
        assert_eq!(p.late(&peers, 1, later), Late::Ask);
        assert_eq!(
            p.late(&peers, 1, later + t / 2),
            Late::Wait,
            "it has a timeout to answer"
        );
        assert_eq!(p.late(&peers, 1, later + 2 * t), Late::Silent, "no answer");
        // An answer in time.
        let mut p = Patience::new(t);
        assert_eq!(p.late(&peers, 2, later), Late::Ask);
        peers.heard(2);
        assert_eq!(p.late(&peers, 2, later + 2 * t), Late::Wait);
        // A rank written off already is silent.
        peers.failed(2);
        assert_eq!(p.late(&peers, 2, later + 4 * t), Late::Silent);
    }

    #[test]
    fn a_rank_cut_off_here_then_given_up_on_by_a_transfer_is_told_down() {
        // This rank's MPI calls were stuck (every peer cut off, nobody told); a transfer from
        // rank 1 then ends silent (its owner is written off here already) and writes it off.
        let p = Peers::new(0, 3);
        p.cut_off();
        assert!(
            p.failed(1),
            "the caller must tell every rank, rank 1 too: only its announcement brings it back"
        );
        assert!(!p.failed(1), "told once");
        assert!(
            !p.heard(1) && !p.alive(1),
            "a message from before it learnt it"
        );
        assert!(p.back(1, 1) && p.alive(1));
        // Rank 2, cut off only, is back at its next message.
        assert!(p.heard(2) && p.alive(2));
    }

    #[test]
    fn a_down_ends_the_life_it_names_even_before_its_announcement_arrives() {
        // Rank 1 was stopped and continued (life 1, announced to every rank), then died. Rank
        // 2 heard the announcement and wrote rank 1 off in life 1; here that `Down` arrives
        // before the announcement itself (different senders: MPI does not order them).
        let p = Peers::new(0, 3);
        assert!(p.down(1, 1) && !p.alive(1));
        assert!(
            !p.back(1, 1),
            "the announcement of a life already ended: a dead rank's message"
        );
        assert!(!p.alive(1));
        // Alive after all: it learnt of that `Down` too, and announces the next life.
        assert!(p.back(1, 2) && p.alive(1) && p.life(1) == 2);
        assert!(!p.down(1, 1) && p.alive(1), "stale");
    }

    #[test]
    fn an_announcement_before_the_down_it_answers_leaves_the_rank_alive() {
        // Rank 2 wrote rank 1 off in life 0; rank 1 (stopped, continued) announced life 1. Here
        // the announcement arrives first, then rank 2's `Down`; a second rank's `Down` of the
        // same life even later.
        let p = Peers::new(0, 4);
        assert!(
            !p.back(1, 1) && p.alive(1),
            "alive already: nothing to bring back"
        );
        assert!(!p.down(1, 0) && p.alive(1));
        assert!(!p.down(1, 0) && p.alive(1));
        // In the other order: written off, then back.
        assert!(p.down(3, 0) && !p.alive(3));
        assert!(!p.heard(3) && !p.alive(3));
        assert!(p.back(3, 1) && p.alive(3));
        // An announcement received twice (the broadcast, and the answer to a second `Down`).
        assert!(!p.back(3, 1) && p.alive(3));
    }

    #[test]
    fn a_rank_stopped_twice_begins_a_life_each_time_it_is_told() {
        // On the stopped rank itself: two ranks wrote it off in life 0 (one `Down` each), then
        // one wrote it off again in life 1 after it was stopped a second time.
        let me = Peers::new(1, 3);
        assert_eq!(
            me.new_life(0),
            (1, true),
            "the first Down: told to every rank"
        );
        assert_eq!(
            me.new_life(0),
            (1, false),
            "the second: answered to its sender"
        );
        assert_eq!(me.new_life(1), (2, true));
        assert_eq!(me.life(1), 2);
        // Elsewhere, the same story in any order ends with it alive in life 2.
        let p = Peers::new(0, 3);
        assert!(p.down(1, 0));
        assert!(!p.down(1, 0), "the second rank's Down");
        assert!(p.back(1, 1) && p.alive(1));
        assert!(p.down(1, 1) && !p.alive(1));
        assert!(!p.back(1, 1), "the answer to a Down of life 0, late");
        assert!(p.back(1, 2) && p.alive(1));
    }

    #[test]
    fn a_message_received_while_a_transfer_writes_the_rank_off_never_brings_it_back() {
        // The communication thread counts messages from rank 1 while a transfer's thread writes
        // it off: once that returns, rank 1 is down here whatever the interleaving.
        for _ in 0..200 {
            let p = std::sync::Arc::new(Peers::new(0, 2));
            let stop = std::sync::Arc::new(AtomicBool::new(false));
            let hearer = {
                let (p, stop) = (p.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        p.heard(1);
                    }
                })
            };
            std::thread::yield_now();
            assert!(p.failed(1));
            for _ in 0..1000 {
                p.heard(1);
            }
            stop.store(true, Ordering::Release);
            hearer.join().unwrap();
            assert!(!p.alive(1));
        }
    }

    #[test]
    fn a_rank_written_off_and_heard_from_is_told_again_now_and_then() {
        // The rank that wrote rank 1 off died before its `Down` reached rank 1: rank 1 never
        // learns it, and only its announcement brings it back. Its messages here say it is
        // alive: it is told (`Msg::Down`) — not at every message.
        let p = Peers::new(0, 3);
        assert_eq!(p.tell_again(1), None, "alive");
        assert!(p.down(1, 0));
        assert!(!p.heard(1));
        assert_eq!(p.tell_again(1), Some(0));
        assert_eq!(p.tell_again(1), None, "told a moment ago");
        let p = later(p, ASK_GRACE + Duration::from_millis(10));
        assert_eq!(p.tell_again(1), Some(0), "told again later");
        assert!(p.back(1, 1) && p.alive(1));
        assert_eq!(p.tell_again(1), None);
        // Cut off here alone: back at its next message, nothing to tell.
        p.cut_off();
        assert_eq!(p.tell_again(2), None);
        assert_eq!(p.tell_again(0), None, "never itself");
    }

    /// `p` with its clock `by` later (its start moved back).
    fn later(p: Peers, by: Duration) -> Peers {
        Peers {
            start: p.start - by,
            ..p
        }
    }

    #[test]
    fn two_ranks_each_holding_the_other_written_off_are_told_again_and_come_back() {
        // Rank 1 wrote off ranks 0 and 2 and died between its `Down`s: rank 0 learnt only of
        // rank 2's failure, rank 2 only of rank 0's. Each holds the other written off, neither
        // was told, and neither sends the other anything (no successor but the dead rank 1).
        let (p0, p2) = (Peers::new(0, 3), Peers::new(2, 3));
        assert!(p0.down(2, 0) && p2.down(0, 0));
        assert!(p0.failed(1) && p2.failed(1));
        assert_eq!((p0.successor(), p2.successor()), (None, None));
        assert!(
            p0.retell_due().is_empty(),
            "not yet: the write-off has just been told"
        );
        let p0 = later(p0, RETELL_MIN);
        let due = p0.retell_due();
        assert_eq!(
            due,
            vec![(1, 0), (2, 0)],
            "every rank written off on a told failure"
        );
        assert!(p0.retell_due().is_empty(), "told a moment ago");
        // Rank 2 receives its `Down` (the agent's `Msg::Down` about itself): a new life,
        // announced to every rank, which brings it back at rank 0.
        let (life, fresh) = p2.new_life(0);
        assert!(fresh);
        assert!(p0.back(2, life) && p0.alive(2));
        // Rank 0's message reaches rank 2, which holds rank 0 written off and tells it now.
        assert!(!p2.heard(0));
        assert_eq!(p2.tell_again(0), Some(0));
        let (life, fresh) = p0.new_life(0);
        assert!(fresh);
        assert!(p2.back(0, life) && p2.alive(0));
        assert_eq!((p0.successor(), p2.successor()), (Some(2), Some(0)));
        // The dead rank 1 is re-told less and less often: 2 s, 4 s, 8 s, ... at most 64 s.
        let mut p0 = p0;
        let mut waits = vec![];
        for _ in 0..8 {
            let mut waited = Duration::ZERO;
            while p0.retell_due().is_empty() {
                p0 = later(p0, Duration::from_millis(500));
                waited += Duration::from_millis(500);
            }
            waits.push(waited.as_secs());
        }
        assert_eq!(waits, vec![4, 8, 16, 32, 64, 64, 64, 64]);
        assert!(
            p0.back(1, 1) && p0.retell_due().is_empty(),
            "back: nothing to tell"
        );
    }
}
