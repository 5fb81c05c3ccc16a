//! One datagram rsocket's state, sans-IO (rdma-core 44 rsocket.c's `ds_*` rules).
//!
//! A datagram rsocket is a UDP socket (its descriptor, and how peers first reach it) plus a
//! UD QP (Q_Key `RDMA_UDP_QKEY`). Datagrams go as UD SENDs of [`DsHeader`] + data to a
//! destination whose QP is known, and over UDP with a DATA [`UdpHeader`] to one that is not
//! yet. A peer receiving DATA over UDP answers with CTRL (its QPN, and in softverbs its
//! device), after which the sender's datagrams take the UD path; the datagram itself is
//! delivered to the application as if it had come over UD.
//!
//! The driver owns the sockets, the QP, the registered send and receive slots
//! ([`SLOT_SIZE`] bytes each) and the blocking; this core decides which path a datagram
//! takes, which send slot it uses, what a received UDP datagram or UD message means, and
//! keeps the queue of received datagrams.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use thiserror::Error;

use super::header::{
    gid_of_ip, DeviceTrailer, DsHeader, HeaderError, UdpHeader, UdpOp, DS_IPV4_HDR_LEN,
};

/// Bytes of one send or receive slot (`RS_SNDLOWAT`): a datagram and its [`DsHeader`] must
/// fit in one.
pub const SLOT_SIZE: usize = 2048;
/// The most destinations (peer socket addresses) one rsocket remembers; datagrams from
/// further new sources are dropped rather than let a flood grow the table without end.
pub const MAX_DESTS: usize = 4096;

/// Queue and buffer sizes as the application configured them (rsocket defaults: 384
/// entries, 128 KiB buffers; `SO_SNDBUF`/`SO_RCVBUF` give twice their value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DgramConfig {
    /// Send queue entries asked for (`RDMA_SQSIZE`).
    pub sq_size: u32,
    /// Receive queue entries asked for (`RDMA_RQSIZE`).
    pub rq_size: u32,
    /// Send buffer bytes.
    pub sbuf_size: u32,
    /// Receive buffer bytes.
    pub rbuf_size: u32,
}

impl Default for DgramConfig {
    fn default() -> Self {
        DgramConfig {
            sq_size: 384,
            rq_size: 384,
            sbuf_size: 128 << 10,
            rbuf_size: 128 << 10,
        }
    }
}

/// Queue sizes in effect: one slot per queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DgramSizes {
    /// Send queue entries = send slots.
    pub sq_size: u32,
    /// Receive queue entries = receive slots.
    pub rq_size: u32,
}

impl DgramConfig {
    /// rsocket.c's `ds_set_qp_size`: each queue is capped by the device's QP size and by
    /// its buffer (one [`SLOT_SIZE`] slot per entry); at least one entry each.
    pub fn sizes(&self, max_qp_size: u32) -> DgramSizes {
        let fit =
            |entries: u32, buf: u32| entries.min(max_qp_size).min(buf / SLOT_SIZE as u32).max(1);
        DgramSizes {
            sq_size: fit(self.sq_size, self.sbuf_size),
            rq_size: fit(self.rq_size, self.rbuf_size),
        }
    }
}

/// This rsocket's own QP and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalQp {
    /// Its UD QP number.
    pub qpn: u32,
    /// The GID of the device it is on.
    pub gid: [u8; 16],
}

/// How to reach a peer's QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The peer device's GID.
    pub gid: [u8; 16],
    /// The peer's UD QP number.
    pub qpn: u32,
}

/// What this rsocket knows of one peer socket address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    /// The address this side sends from towards it (its [`DsHeader`]).
    src: SocketAddr,
    /// Its QP, once learned.
    route: Option<Route>,
}

/// Where a received datagram's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// In receive slot `slot`, `len` bytes from `offset` (past the GRH area is the
    /// driver's business: offsets count from the start of the UD payload). The slot goes
    /// back to the receive queue once the datagram is taken.
    Slot {
        /// The receive slot.
        slot: u32,
        /// Where the data starts in the UD payload.
        offset: usize,
        /// How many bytes.
        len: usize,
    },
    /// Arrived over UDP: the bytes themselves.
    Bytes(Vec<u8>),
}

impl Payload {
    /// The datagram's length.
    pub fn len(&self) -> usize {
        match self {
            Payload::Slot { len, .. } => *len,
            Payload::Bytes(b) => b.len(),
        }
    }

    /// Whether the datagram is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A received datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Who sent it (the peer's socket address).
    pub src: SocketAddr,
    /// Its bytes.
    pub payload: Payload,
}

/// How to send one datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendPlan {
    /// A UD SEND of `header` + data from send slot `slot` to `route` (Q_Key
    /// `RDMA_UDP_QKEY`); the slot comes back with [`DgramCore::send_done`].
    Ud {
        /// The send slot to stage it in.
        slot: u32,
        /// The header bytes to put first.
        header: Vec<u8>,
        /// Where to send it.
        route: Route,
    },
    /// Over the UDP socket to the destination: `header` + data.
    Udp {
        /// The header bytes to put first.
        header: Vec<u8>,
    },
}

/// Why a datagram cannot be sent now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SendError {
    /// The destination is not known yet: the driver finds the local source address towards
    /// it and calls [`DgramCore::add_dest`] first.
    #[error("unknown destination")]
    UnknownDest,
    /// No free send slot (EWOULDBLOCK, or wait for a send completion).
    #[error("no free send slot")]
    WouldBlock,
    /// Larger than a slot holds with its header (EMSGSIZE; rsocket.c does not check and
    /// overruns its slot).
    #[error("{len} bytes: at most {max} fit in one datagram")]
    TooLong {
        /// The datagram's length.
        len: usize,
        /// The most that fits.
        max: usize,
    },
}

/// What a UDP datagram on the rsocket's socket asks of the driver.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UdpOutcome {
    /// A CTRL datagram to send back to its source.
    pub reply: Option<Vec<u8>>,
    /// Whether it queued a datagram for the application.
    pub queued: bool,
}

/// Why a UDP datagram was ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum UdpError {
    /// Its header is invalid.
    #[error("bad header: {0}")]
    Header(#[from] HeaderError),
    /// It came from a new source while [`MAX_DESTS`] are known.
    #[error("too many peers")]
    TooManyPeers,
}

/// What happened to a UD receive completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdVerdict {
    /// Queued for the application: the slot stays taken until the datagram is read.
    Queued,
    /// Not queued (bad header, or the queue is full): post the slot again at once.
    Repost,
}

/// Counters of what was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DgramStats {
    /// UDP datagrams ignored (bad header, too many peers).
    pub bad_udp: u64,
    /// UD messages with a bad header.
    pub bad_ud: u64,
    /// Datagrams dropped because the receive queue was full.
    pub dropped_full: u64,
}

/// One datagram rsocket's protocol state.
#[derive(Debug)]
pub struct DgramCore {
    local: LocalQp,
    sizes: DgramSizes,
    dests: HashMap<SocketAddr, Dest>,
    free_slots: Vec<u32>,
    queue: VecDeque<Datagram>,
    stats: DgramStats,
}

impl DgramCore {
    /// A core for the QP `local`, with `sizes` slots (every receive slot is posted by the
    /// driver; every send slot is free).
    pub fn new(local: LocalQp, sizes: DgramSizes) -> DgramCore {
        DgramCore {
            local,
            sizes,
            dests: HashMap::new(),
            free_slots: (0..sizes.sq_size).rev().collect(),
            queue: VecDeque::new(),
            stats: DgramStats::default(),
        }
    }

    /// The queue sizes.
    pub fn sizes(&self) -> DgramSizes {
        self.sizes
    }

    /// What was dropped so far.
    pub fn stats(&self) -> DgramStats {
        self.stats
    }

    /// Whether `addr` is a known destination.
    pub fn knows(&self, addr: SocketAddr) -> bool {
        self.dests.contains_key(&addr)
    }

    /// The route to `addr`, when learned.
    pub fn route(&self, addr: SocketAddr) -> Option<Route> {
        self.dests.get(&addr).and_then(|d| d.route)
    }

    /// Records `addr` as a destination this side sends to from `src` (rsocket.c's
    /// `ds_get_dest`); a known one keeps what it has. False when [`MAX_DESTS`] are known.
    pub fn add_dest(&mut self, addr: SocketAddr, src: SocketAddr) -> bool {
        if self.dests.contains_key(&addr) {
            return true;
        }
        if self.dests.len() >= MAX_DESTS {
            return false;
        }
        self.dests.insert(addr, Dest { src, route: None });
        true
    }

    /// The longest datagram that can be sent from `src`.
    pub fn max_payload(src: SocketAddr) -> usize {
        SLOT_SIZE - DsHeader { src }.len()
    }

    /// Plans sending a `len`-byte datagram to `dst` (rsocket.c's `dsend`): UD when the
    /// peer's QP is known (taking a send slot), else UDP.
    pub fn plan_send(&mut self, dst: SocketAddr, len: usize) -> Result<SendPlan, SendError> {
        let dest = *self.dests.get(&dst).ok_or(SendError::UnknownDest)?;
        let max = Self::max_payload(dest.src);
        if len > max {
            return Err(SendError::TooLong { len, max });
        }
        match dest.route {
            Some(route) => {
                let slot = self.free_slots.pop().ok_or(SendError::WouldBlock)?;
                let mut header = Vec::with_capacity(DS_IPV4_HDR_LEN);
                DsHeader { src: dest.src }.emit(&mut header);
                Ok(SendPlan::Ud {
                    slot,
                    header,
                    route,
                })
            }
            None => {
                let mut header = Vec::new();
                UdpHeader {
                    op: UdpOp::Data,
                    qpn: self.local.qpn,
                    addr: dest.src.ip(),
                }
                .emit(&mut header);
                Ok(SendPlan::Udp { header })
            }
        }
    }

    /// A send slot's SEND completed (or failed to post): it is free again. A slot that is
    /// not a send slot, or is already free, is ignored.
    pub fn send_done(&mut self, slot: u32) {
        if slot < self.sizes.sq_size && !self.free_slots.contains(&slot) {
            self.free_slots.push(slot);
        }
    }

    /// Whether a send slot is free (rsocket.c's `ds_can_send`, POLLOUT).
    pub fn can_send(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// Whether every send slot is free (nothing in flight).
    pub fn all_sends_done(&self) -> bool {
        self.free_slots.len() as u32 == self.sizes.sq_size
    }

    /// Whether a datagram waits (POLLIN).
    pub fn readable(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Whether the queue has room for another datagram (else UD completions are better
    /// left in the CQ, as rsocket.c does, than dropped).
    pub fn has_room(&self) -> bool {
        self.queue.len() < self.sizes.rq_size as usize
    }

    /// The next datagram, left queued (MSG_PEEK).
    pub fn peek(&self) -> Option<&Datagram> {
        self.queue.front()
    }

    /// Takes the next datagram; a [`Payload::Slot`] one's slot is the driver's to post again.
    pub fn pop(&mut self) -> Option<Datagram> {
        self.queue.pop_front()
    }

    /// A datagram arrived on the UDP socket from `from`. `src_towards` gives the local
    /// address this side would send to `from` from, should `from` be new.
    ///
    /// DATA is answered with CTRL and queued as if it had come over UD (rsocket.c forwards
    /// it through its own QP); CTRL teaches the sender's QP: its device from softverbs'
    /// trailer, else the GID of its IP address (a RoCE peer). DATA from a QP other than the
    /// one learned forgets the route (the peer's rsocket is a new one), so replies go over
    /// UDP until its CTRL says where it is now.
    pub fn handle_udp(
        &mut self,
        from: SocketAddr,
        bytes: &[u8],
        src_towards: impl FnOnce(SocketAddr) -> SocketAddr,
    ) -> Result<UdpOutcome, UdpError> {
        let (header, body_at) = UdpHeader::parse(bytes, from).inspect_err(|_| {
            self.stats.bad_udp += 1;
        })?;
        if !self.dests.contains_key(&from) && !self.add_dest(from, src_towards(from)) {
            self.stats.bad_udp += 1;
            return Err(UdpError::TooManyPeers);
        }
        let body = &bytes[body_at..];
        let dest = self.dests.get_mut(&from).expect("added above");
        let mut outcome = UdpOutcome::default();
        match header.op {
            UdpOp::Data => {
                if dest.route.is_some_and(|r| r.qpn != header.qpn) {
                    dest.route = None;
                }
                let mut reply = Vec::new();
                UdpHeader {
                    op: UdpOp::Ctrl,
                    qpn: self.local.qpn,
                    addr: dest.src.ip(),
                }
                .emit(&mut reply);
                DeviceTrailer {
                    gid: self.local.gid,
                }
                .emit(&mut reply);
                outcome.reply = Some(reply);
                if self.queue.len() < self.sizes.rq_size as usize {
                    self.queue.push_back(Datagram {
                        src: from,
                        payload: Payload::Bytes(body.to_vec()),
                    });
                    outcome.queued = true;
                } else {
                    self.stats.dropped_full += 1;
                }
            }
            UdpOp::Ctrl | UdpOp::Other(_) => {
                let gid = DeviceTrailer::parse(body)
                    .map(|t| t.gid)
                    .unwrap_or_else(|| gid_of_ip(from.ip()));
                dest.route = Some(Route {
                    gid,
                    qpn: header.qpn,
                });
            }
        }
        Ok(outcome)
    }

    /// A UD receive completed successfully in receive slot `slot` with `payload` (the bytes
    /// after the GRH area). Queued when its header is valid and the queue has room.
    pub fn handle_ud(&mut self, slot: u32, payload: &[u8]) -> UdVerdict {
        let Ok((header, offset)) = DsHeader::parse(payload) else {
            self.stats.bad_ud += 1;
            return UdVerdict::Repost;
        };
        if !self.has_room() {
            self.stats.dropped_full += 1;
            return UdVerdict::Repost;
        }
        self.queue.push_back(Datagram {
            src: header.src,
            payload: Payload::Slot {
                slot,
                offset,
                len: payload.len() - offset,
            },
        });
        UdVerdict::Queued
    }
}
