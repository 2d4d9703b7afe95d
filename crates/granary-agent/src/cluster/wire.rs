//! The control messages serving ranks exchange (tag `CTRL`): small, fixed little-endian
//! records, one per MPI message. File bytes travel in messages of their own, tagged with the
//! transfer's tag (`DATA_TAG0..`), with no header: they go straight into the receiving copy.

use std::io::{Error, ErrorKind, Result};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Tag of control messages.
pub const CTRL: i32 = 1;
/// Data tags: `DATA_TAG0 + k`, k a transfer slot of the receiving rank. 32767 is the smallest
/// `MPI_TAG_UB` the standard allows.
pub const DATA_TAG0: i32 = 2;
pub const DATA_TAGS: i32 = 32767 - DATA_TAG0;

/// How a provider answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The file follows (`size` bytes in data messages), its copy's checksum `sum` (0: none).
    Coming { sum: u64 },
    /// Still fetching it from the source: keep waiting (a keepalive).
    Wait,
    /// No copy here and none to be had (no room, a chunked copy): read the source.
    NotHeld,
    /// The source changed (the entry is void here): void it there too.
    Stale,
}

pub use crate::protocol::Beat;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// "Send me entry `idx`" (its object id and size, so a table of another walk cannot be
    /// mistaken for ours), data with tag `tag`.
    Request {
        tag: i32,
        idx: u32,
        object: u64,
        size: u64,
    },
    /// The answer to the request of tag `tag`.
    Reply { tag: i32, answer: Answer },
    /// The requester gave up on `tag`: send no more.
    Cancel { tag: i32 },
    /// Alive, with this node's numbers (to the successor on the ring; to the asker of `Ask`).
    Heartbeat(Beat),
    /// The sender learnt it was written off and begins life `life` (`peers`): to every rank,
    /// with its numbers. Only this brings back a rank written off on a `Down`.
    Back { life: u32, beat: Beat },
    /// "Send me your numbers" (`granary status`): answered with a heartbeat.
    Ask,
    /// The sender wrote rank `rank` off in its life `life` (its predecessor went silent, or a
    /// transfer from it timed out).
    Down { rank: u32, life: u32 },
    /// Entry `idx` (object id `object`) changed on the source: `gone` = its name leads nowhere.
    Invalidate { idx: u32, object: u64, gone: bool },
    /// `granary stop` on one node: every rank stops.
    Stop,
    /// The sender's doorbell (`doorbell`): where to ring it, with which token. Sent to every
    /// rank at start.
    Door { addr: SocketAddr, token: u64 },
    /// Where the sender runs (`direct`): its host's key (boot, PID namespace, host name) and
    /// its process id. Sent to every rank at start.
    Near { host: u64, pid: u32 },
    /// Mappings of the sender's copies that a rank on its host may read directly (`direct`).
    Mapped(Vec<Mapped>),
}

/// One of an owner's kept mappings (`direct`): entry `idx` (object id, size), mapped at `addr`
/// in the owner's address space from its file descriptor `fd`, with the checksum its copy was
/// placed with and the copy's identity (`ino`, `ctime`: `granary_core::sys::copy_identity`). A
/// rank that takes the descriptor checks the identity: the owner may have closed it since and
/// its number may name another file by then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mapped {
    pub idx: u32,
    pub object: u64,
    pub size: u64,
    pub addr: u64,
    pub fd: u32,
    pub sum: u64,
    pub ino: u64,
    pub ctime: u64,
}

/// `Mapped` records per message (56 bytes each): a control message stays below a shared-memory
/// transport's eager limit (4 KiB with OpenMPI's), so it is here once matched.
pub const MAPPED_PER_MSG: usize = 64;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;
const CANCEL: u8 = 3;
const HEARTBEAT: u8 = 4;
const INVALIDATE: u8 = 5;
const STOP: u8 = 6;
const ASK: u8 = 7;
const DOWN: u8 = 8;
const DOOR: u8 = 9;
const NEAR: u8 = 10;
const MAPPED: u8 = 11;
const BACK: u8 = 12;

const COMING: u8 = 1;
const WAIT: u8 = 2;
const NOT_HELD: u8 = 3;
const STALE: u8 = 4;

struct Out(Vec<u8>);

impl Out {
    fn u8(mut self, v: u8) -> Out {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn beat(self, b: Beat) -> Out {
        self.u64(b.files_held)
            .u64(b.bytes_held)
            .u64(b.bytes_staged)
            .u64(b.remote_files)
            .u64(b.remote_bytes)
            .u64(b.peer_files)
            .u64(b.peer_bytes)
            .u64(b.pfs_bytes)
            .u64(b.fallbacks)
            .u64(b.jobs)
            .u64(b.bounce_bytes)
    }
    fn addr(mut self, a: SocketAddr) -> Out {
        let (family, ip) = match a.ip() {
            IpAddr::V4(v) => (4u8, v.to_ipv6_mapped().octets()),
            IpAddr::V6(v) => (6u8, v.octets()),
        };
        self.0.push(family);
        self.0.extend_from_slice(&ip);
        self.0.extend_from_slice(&a.port().to_le_bytes());
        self
    }
}

struct In<'a>(&'a [u8]);

impl In<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.0.len() < N {
            return Err(Error::new(ErrorKind::InvalidData, "short control message"));
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().unwrap_or([0; N]))
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn beat(&mut self) -> Result<Beat> {
        Ok(Beat {
            files_held: self.u64()?,
            bytes_held: self.u64()?,
            bytes_staged: self.u64()?,
            remote_files: self.u64()?,
            remote_bytes: self.u64()?,
            peer_files: self.u64()?,
            peer_bytes: self.u64()?,
            pfs_bytes: self.u64()?,
            fallbacks: self.u64()?,
            jobs: self.u64()?,
            bounce_bytes: self.u64()?,
        })
    }
    fn addr(&mut self) -> Result<SocketAddr> {
        let family = self.u8()?;
        let v6 = Ipv6Addr::from(self.take::<16>()?);
        let port = u16::from_le_bytes(self.take()?);
        let ip = match (family, v6.to_ipv4_mapped()) {
            (4, Some(v4)) => IpAddr::V4(v4),
            (6, _) => IpAddr::V6(v6),
            _ => return Err(Error::new(ErrorKind::InvalidData, "bad address")),
        };
        Ok(SocketAddr::new(ip, port))
    }
}

impl Msg {
    /// Liveness and status traffic: not activity (an idle rank's communication thread keeps
    /// its longest nap).
    pub fn liveness(&self) -> bool {
        matches!(
            self,
            Msg::Heartbeat(_)
                | Msg::Back { .. }
                | Msg::Ask
                | Msg::Down { .. }
                | Msg::Door { .. }
                | Msg::Near { .. }
                | Msg::Mapped(_)
        )
    }

    pub fn encode(&self) -> Vec<u8> {
        let o = Out(Vec::with_capacity(96));
        match *self {
            Msg::Request {
                tag,
                idx,
                object,
                size,
            } => o.u8(REQUEST).u32(tag as u32).u32(idx).u64(object).u64(size),
            Msg::Reply { tag, answer } => {
                let o = o.u8(REPLY).u32(tag as u32);
                match answer {
                    Answer::Coming { sum } => o.u8(COMING).u64(sum),
                    Answer::Wait => o.u8(WAIT).u64(0),
                    Answer::NotHeld => o.u8(NOT_HELD).u64(0),
                    Answer::Stale => o.u8(STALE).u64(0),
                }
            }
            Msg::Cancel { tag } => o.u8(CANCEL).u32(tag as u32),
            Msg::Heartbeat(b) => o.u8(HEARTBEAT).beat(b),
            Msg::Back { life, beat } => o.u8(BACK).u32(life).beat(beat),
            Msg::Ask => o.u8(ASK),
            Msg::Down { rank, life } => o.u8(DOWN).u32(rank).u32(life),
            Msg::Invalidate { idx, object, gone } => {
                o.u8(INVALIDATE).u32(idx).u64(object).u8(gone as u8)
            }
            Msg::Stop => o.u8(STOP),
            Msg::Door { addr, token } => o.u8(DOOR).addr(addr).u64(token),
            Msg::Near { host, pid } => o.u8(NEAR).u64(host).u32(pid),
            Msg::Mapped(ref v) => {
                let mut o = o.u8(MAPPED).u32(v.len() as u32);
                for m in v {
                    o = o
                        .u32(m.idx)
                        .u64(m.object)
                        .u64(m.size)
                        .u64(m.addr)
                        .u32(m.fd)
                        .u64(m.sum)
                        .u64(m.ino)
                        .u64(m.ctime);
                }
                o
            }
        }
        .0
    }

    pub fn decode(buf: &[u8]) -> Result<Msg> {
        let mut i = In(buf);
        let bad = |what: &str| Error::new(ErrorKind::InvalidData, what.to_string());
        let tag = |v: u32| -> Result<i32> {
            i32::try_from(v)
                .ok()
                .filter(|t| (DATA_TAG0..DATA_TAG0 + DATA_TAGS).contains(t))
                .ok_or_else(|| Error::new(ErrorKind::InvalidData, "data tag out of range"))
        };
        let m = match i.u8()? {
            REQUEST => Msg::Request {
                tag: tag(i.u32()?)?,
                idx: i.u32()?,
                object: i.u64()?,
                size: i.u64()?,
            },
            REPLY => {
                let t = tag(i.u32()?)?;
                let kind = i.u8()?;
                let sum = i.u64()?;
                let answer = match kind {
                    COMING => Answer::Coming { sum },
                    WAIT => Answer::Wait,
                    NOT_HELD => Answer::NotHeld,
                    STALE => Answer::Stale,
                    _ => return Err(bad("unknown answer")),
                };
                Msg::Reply { tag: t, answer }
            }
            CANCEL => Msg::Cancel {
                tag: tag(i.u32()?)?,
            },
            HEARTBEAT => Msg::Heartbeat(i.beat()?),
            BACK => Msg::Back {
                life: i.u32()?,
                beat: i.beat()?,
            },
            ASK => Msg::Ask,
            DOWN => Msg::Down {
                rank: i.u32()?,
                life: i.u32()?,
            },
            INVALIDATE => Msg::Invalidate {
                idx: i.u32()?,
                object: i.u64()?,
                gone: i.u8()? != 0,
            },
            STOP => Msg::Stop,
            DOOR => Msg::Door {
                addr: i.addr()?,
                token: i.u64()?,
            },
            NEAR => Msg::Near {
                host: i.u64()?,
                pid: i.u32()?,
            },
            MAPPED => {
                let n = i.u32()? as usize;
                if n > MAPPED_PER_MSG {
                    return Err(bad("too many mappings in one message"));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(Mapped {
                        idx: i.u32()?,
                        object: i.u64()?,
                        size: i.u64()?,
                        addr: i.u64()?,
                        fd: i.u32()?,
                        sum: i.u64()?,
                        ino: i.u64()?,
                        ctime: i.u64()?,
                    });
                }
                Msg::Mapped(v)
            }
            _ => return Err(bad("unknown control message")),
        };
        if !i.0.is_empty() {
            return Err(bad("trailing bytes in a control message"));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Msg::Request {
                tag: DATA_TAG0,
                idx: 7,
                object: u64::MAX,
                size: 8 << 20,
            },
            Msg::Reply {
                tag: DATA_TAG0 + DATA_TAGS - 1,
                answer: Answer::Coming { sum: 42 },
            },
            Msg::Reply {
                tag: 9,
                answer: Answer::Wait,
            },
            Msg::Reply {
                tag: 9,
                answer: Answer::NotHeld,
            },
            Msg::Reply {
                tag: 9,
                answer: Answer::Stale,
            },
            Msg::Cancel { tag: 3 },
            Msg::Heartbeat(Beat {
                files_held: 1,
                bytes_held: 2,
                bytes_staged: 3,
                remote_files: 4,
                remote_bytes: 5,
                peer_files: 6,
                peer_bytes: 7,
                pfs_bytes: 8,
                fallbacks: 9,
                jobs: 10,
                bounce_bytes: 11,
            }),
            Msg::Ask,
            Msg::Down { rank: 511, life: 3 },
            Msg::Back {
                life: 4,
                beat: Beat {
                    jobs: 2,
                    ..Beat::default()
                },
            },
            Msg::Invalidate {
                idx: 3,
                object: 5,
                gone: true,
            },
            Msg::Stop,
            Msg::Door {
                addr: "10.1.2.3:4567".parse().unwrap(),
                token: 99,
            },
            Msg::Door {
                addr: "[fe80::1]:80".parse().unwrap(),
                token: u64::MAX,
            },
            Msg::Near {
                host: u64::MAX,
                pid: 4_000_000,
            },
            Msg::Mapped(Vec::new()),
            Msg::Mapped(vec![
                Mapped {
                    idx: 1,
                    object: 2,
                    size: 3,
                    addr: 0x7f00_0000_0000,
                    fd: 1023,
                    sum: 5,
                    ino: u64::MAX,
                    ctime: 7,
                };
                MAPPED_PER_MSG
            ]),
        ];
        for m in msgs {
            assert_eq!(Msg::decode(&m.encode()).unwrap(), m);
        }
        // A full `Mapped` message is sent eagerly (`MAPPED_PER_MSG`).
        let full = Msg::Mapped(vec![Mapped::default(); MAPPED_PER_MSG]);
        assert!(full.encode().len() <= 4096);
    }

    #[test]
    fn damaged_messages_are_refused() {
        let m = Msg::Request {
            tag: 5,
            idx: 1,
            object: 2,
            size: 3,
        }
        .encode();
        for cut in 0..m.len() {
            assert!(Msg::decode(&m[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = m.clone();
        long.push(0);
        assert!(Msg::decode(&long).is_err());
        let mut bad_tag = m.clone();
        bad_tag[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(Msg::decode(&bad_tag).is_err(), "tag 0 is not a data tag");
        assert!(Msg::decode(&[99]).is_err());
    }
}
