//! Doorbells: a UDP datagram that wakes another rank's communication thread when a message for
//! it was just sent over MPI. MPI has no wait that sleeps, so without them the thread polls MPI
//! on a timer: every nap that ends by itself costs ~20 µs of CPU on a VM (a timer's expiry,
//! `bench/floor/wakeups.c`), against 2.5–3 µs for a thread another wakes, and a peer's message
//! waits for the end of the nap (while serving, 100 µs on average). With doorbells the thread sleeps in `ppoll`
//! on its socket: a peer's message wakes it (the datagram goes out right after the message was
//! handed to MPI), so does a command of its own node (an eventfd polled beside the socket, `Bell`).
//!
//! Only an optimisation, never counted on: a datagram can be lost, blocked by a firewall, or
//! overtake its MPI message (a transport that sends from its progress engine). So a rank trusts
//! a peer's doorbells only while they arrive (one within `TRUST_FOR`), and then still looks at
//! MPI by itself every `SAFETY_NAP` (a lost doorbell costs that much latency at most); after a
//! doorbell that found nothing yet it polls as without doorbells for `RUNG_FOR`. Untrusted
//! peers are polled for as before (`transport`'s naps).
//!
//! Datagrams carry the receiver's token (random, told only to the other ranks over MPI at
//! start, `wire::Msg::Door`), the sender's rank and, ringing for a message, how many messages
//! the sender has handed to MPI for the receiver so far: MPI matches one sender's messages in
//! the order they were sent, so a receiver that has matched that many from it already found the
//! message (awake, it probed before it read the datagram) and does not poll for it. Anything
//! else is read and ignored.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A peer's doorbells are trusted this long after its last one arrived.
pub const TRUST_FOR: Duration = Duration::from_secs(5);
/// The longest a rank trusting its peers' doorbells goes without looking at MPI while it
/// awaits a transfer.
pub const SAFETY_NAP: Duration = Duration::from_millis(1);
/// After a doorbell whose message is not there yet, how long the rank polls for it.
pub const RUNG_FOR: Duration = Duration::from_millis(1);

const DATAGRAM: usize = 21;

/// What a doorbell says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A message for the receiver was handed to MPI.
    Message = 0,
    /// The ringer started receiving the receiver's data and the receive did not complete at
    /// once: it may wait on the receiver's progress (a rendezvous over TCP), which then polls
    /// MPI until its sends to the ringer complete. No message follows. A receive that completes
    /// as it starts (shared memory's single copy) rings nothing: the sender finds its send
    /// complete at its next turn, whenever something else wakes it.
    Progress = 1,
}

/// This rank's doorbell socket and what it knows of the others'.
pub struct Door {
    sock: UdpSocket,
    /// This node's own ring (`ring_self`): an eventfd the thread polls beside the socket. A
    /// datagram to itself went through the loopback's network stack on the ringing thread and
    /// a `recvmmsg` on the woken one, for each command handed over (two per remote read).
    own: File,
    /// Whether the last `wait` saw a datagram waiting (or none was waited for): `drain` reads
    /// the socket only then.
    sock_rung: AtomicBool,
    rank: u32,
    token: u64,
    /// The address it tells the others (and rings itself at).
    public: SocketAddr,
    peers: Mutex<Vec<Option<(SocketAddr, u64)>>>,
}

/// What draining the socket found.
#[derive(Default)]
pub struct Rung {
    /// This node rang (`ring_self`): a command is queued.
    pub own: bool,
    /// Peers whose doorbell rang, what for, and the highest count of messages they said they
    /// had sent (`Door::ring`).
    pub peers: Vec<(u32, Kind, u64)>,
}

impl Door {
    /// A socket on the first address this host's name resolves to (how the nodes of a cluster
    /// name each other; else the loopback, for ranks on one host), on a port of the kernel's
    /// choosing: only that interface is exposed.
    pub fn open(rank: u32, ranks: u32) -> std::io::Result<Door> {
        let ip = host_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let sock = UdpSocket::bind((ip, 0))?;
        sock.set_nonblocking(true)?;
        let public = sock.local_addr()?;
        let mut token = [0u8; 8];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut token))?;
        // SAFETY: eventfd takes no pointers; a valid descriptor it returns is owned by nobody
        // else, so the OwnedFd (closed with the File) is its only owner.
        let own = unsafe {
            let fd = libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            File::from(OwnedFd::from_raw_fd(fd))
        };
        Ok(Door {
            sock,
            own,
            sock_rung: AtomicBool::new(true),
            rank,
            token: u64::from_le_bytes(token),
            public,
            peers: Mutex::new(vec![None; ranks as usize]),
        })
    }

    /// What the others need to ring this rank: its address and token.
    pub fn card(&self) -> (SocketAddr, u64) {
        (self.public, self.token)
    }

    /// `rank`'s card arrived.
    pub fn learn(&self, rank: u32, addr: SocketAddr, token: u64) {
        let mut p = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = p.get_mut(rank as usize).filter(|_| rank != self.rank) {
            *slot = Some((addr, token));
        }
    }

    /// Rings `rank`'s doorbell (nothing if its card has not come; errors are ignored: the peer
    /// then finds the message by polling). `sent`: for `Kind::Message`, how many messages this
    /// rank has handed to MPI for `rank` so far, the one rung for included.
    pub fn ring(&self, rank: u32, kind: Kind, sent: u64) {
        let to = self
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(rank as usize)
            .copied()
            .flatten();
        if let Some((addr, token)) = to {
            let _ = self
                .sock
                .send_to(&datagram(token, self.rank, kind, sent), addr);
        }
    }

    /// Wakes this rank's own communication thread (a command is queued).
    pub fn ring_self(&self) {
        let _ = (&self.own).write(&1u64.to_ne_bytes());
    }

    /// Sleeps until a datagram arrives, this node rings (`ring_self`) or `timeout` passes.
    /// True if either is waiting (or the wait failed: the caller then looks).
    pub fn wait(&self, timeout: Duration) -> bool {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let mut pfd = [self.sock.as_raw_fd(), self.own.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds on descriptors this struct owns; the timeout is a local;
        // no signal mask is changed (null).
        let n = unsafe { libc::ppoll(pfd.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        self.sock_rung
            .store(n < 0 || pfd[0].revents != 0, Ordering::Relaxed);
        n != 0
    }

    /// Reads every datagram waiting: which peers rang (with this rank's token), and whether
    /// this node did. Up to `BATCH` per `recvmmsg` call: usually one call, where reading one
    /// at a time took two (the last finding none).
    pub fn drain(&self) -> Rung {
        const BATCH: usize = 16;
        let mut out = Rung {
            own: (&self.own).read(&mut [0u8; 8]).is_ok_and(|n| n == 8),
            ..Rung::default()
        };
        // The next `drain` without a `wait` before it reads the socket.
        if !self.sock_rung.swap(true, Ordering::Relaxed) {
            return out;
        }
        let mut bufs = [[0u8; 64]; BATCH];
        loop {
            // SAFETY: zeroed iovec and mmsghdr arrays are valid; each header is then pointed at
            // its own iovec, and each iovec at its own buffer, all locals that outlive the call.
            let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            for ((m, v), b) in msgs.iter_mut().zip(iov.iter_mut()).zip(bufs.iter_mut()) {
                v.iov_base = b.as_mut_ptr().cast();
                v.iov_len = b.len();
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `msgs` holds BATCH valid headers (above); non-blocking, no timeout.
            let n = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n <= 0 {
                return out;
            }
            for (m, b) in msgs.iter().zip(bufs.iter()).take(n as usize) {
                let len = (m.msg_len as usize).min(b.len());
                let Some((token, from, kind, sent)) = parse(&b[..len]) else {
                    continue;
                };
                if token != self.token {
                    continue;
                }
                if from == self.rank {
                    out.own = true;
                    continue;
                }
                match out
                    .peers
                    .iter_mut()
                    .find(|(p, k, _)| *p == from && *k == kind)
                {
                    Some(seen) => seen.2 = seen.2.max(sent),
                    None => out.peers.push((from, kind, sent)),
                }
            }
            if (n as usize) < BATCH {
                return out;
            }
        }
    }
}

fn datagram(token: u64, from: u32, kind: Kind, sent: u64) -> [u8; DATAGRAM] {
    let mut d = [0u8; DATAGRAM];
    d[..8].copy_from_slice(&token.to_le_bytes());
    d[8..12].copy_from_slice(&from.to_le_bytes());
    d[12] = kind as u8;
    d[13..].copy_from_slice(&sent.to_le_bytes());
    d
}

fn parse(d: &[u8]) -> Option<(u64, u32, Kind, u64)> {
    let d: &[u8; DATAGRAM] = d.try_into().ok()?;
    let token = u64::from_le_bytes(d[..8].try_into().ok()?);
    let from = u32::from_le_bytes(d[8..12].try_into().ok()?);
    let kind = match d[12] {
        0 => Kind::Message,
        1 => Kind::Progress,
        _ => return None,
    };
    let sent = u64::from_le_bytes(d[13..].try_into().ok()?);
    Some((token, from, kind, sent))
}

/// The first IPv4 address this host's name resolves to (how nodes of a cluster name each
/// other), else its first address of any kind.
fn host_ip() -> Option<IpAddr> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let addrs: Vec<IpAddr> = (name.trim(), 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or(addrs.first())
        .copied()
}

/// Which peers' doorbells a rank trusts: those heard ringing within `TRUST_FOR`.
pub struct Trust {
    last: Vec<Option<Instant>>,
}

impl Trust {
    pub fn new(ranks: u32) -> Trust {
        Trust {
            last: vec![None; ranks as usize],
        }
    }

    pub fn rang(&mut self, rank: u32, now: Instant) {
        if let Some(x) = self.last.get_mut(rank as usize) {
            *x = Some(now);
        }
    }

    pub fn trusts(&self, rank: u32, now: Instant) -> bool {
        self.last
            .get(rank as usize)
            .copied()
            .flatten()
            .is_some_and(|at| now.duration_since(at) < TRUST_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rung_doorbell_wakes_and_names_its_ringer() {
        let a = Door::open(0, 2).unwrap();
        let b = Door::open(1, 2).unwrap();
        let (addr, token) = b.card();
        a.learn(1, addr, token);
        a.ring(1, Kind::Progress, 0);
        assert!(b.wait(Duration::from_secs(5)));
        let r = b.drain();
        assert_eq!((r.own, r.peers), (false, vec![(0, Kind::Progress, 0)]));
        b.ring_self();
        assert!(b.wait(Duration::from_secs(5)));
        assert!(b.drain().own);
    }

    #[test]
    fn a_drain_keeps_each_peer_s_highest_count_of_messages_sent() {
        let a = Door::open(0, 2).unwrap();
        let b = Door::open(1, 2).unwrap();
        let (addr, token) = b.card();
        a.learn(1, addr, token);
        for sent in [3, 5, 4] {
            a.ring(1, Kind::Message, sent);
        }
        a.ring(1, Kind::Progress, 0);
        assert!(b.wait(Duration::from_secs(5)));
        // Loopback datagrams are queued as they are sent; the pause only guards against a
        // slow one.
        std::thread::sleep(Duration::from_millis(20));
        let r = b.drain();
        assert_eq!(r.peers, vec![(0, Kind::Message, 5), (0, Kind::Progress, 0)]);
    }

    #[test]
    fn datagrams_without_the_token_are_ignored() {
        let b = Door::open(1, 2).unwrap();
        let to = b.card().0;
        let s = UdpSocket::bind((to.ip(), 0)).unwrap();
        s.send_to(&datagram(b.card().1 ^ 1, 0, Kind::Message, 1), to)
            .unwrap();
        s.send_to(b"short", to).unwrap();
        b.wait(Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(20));
        let r = b.drain();
        assert!(!r.own && r.peers.is_empty());
    }

    #[test]
    fn trust_lasts_while_doorbells_arrive() {
        let mut t = Trust::new(3);
        let now = Instant::now();
        assert!(!t.trusts(1, now));
        t.rang(1, now);
        assert!(t.trusts(1, now) && !t.trusts(2, now));
        assert!(!t.trusts(1, now + TRUST_FOR));
    }
}
