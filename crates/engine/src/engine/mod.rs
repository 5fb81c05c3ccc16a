//! The engine: one softverbs device's objects and transport, driven from outside.
//!
//! Inputs are verbs calls, [`Engine::handle_datagram`] and
//! [`Engine::handle_timeout`]; outputs are [`Engine::poll_transmit`],
//! completions ([`Engine::poll_cq`]), async events ([`Engine::poll_event`]), CQ
//! notifications ([`Engine::poll_cq_notification`]) and the next deadline
//! ([`Engine::poll_timeout`]). Nothing here does I/O or reads a clock.
//!
//! The verbs calls live in `resources` (PD, MR, MW, CQ, SRQ) and `qps`; what
//! arrives from the wire is checked and dispatched in `receive` (unicast) and
//! `multicast`; `schedule` keeps the timers and the queue of QPs with something to
//! send.

use crate::closed::ClosedQps;
use crate::config::EngineConfig;
use crate::counters::Counters;
use crate::mr::{MrTable, Pd};
use crate::node::{Node, Transmit};
use crate::qp::Qp;
use crate::shared::Shared;
use crate::slab::{RawHandle, Slab};
use crate::time::Instant;
use crate::types::QpHandle;
use softverbs_wire::Qpn;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;

mod errors;
mod multicast;
mod placed;
mod qps;
mod receive;
mod resources;
mod schedule;

pub use errors::{PostError, ResourceError};
pub use placed::{HeldWr, PlacedTarget};

/// QPN layout: 14 bits of slot index and 10 bits of slot generation, so a QPN is
/// not reused by the next QP in the same slot.
const QPN_INDEX_BITS: u32 = 14;
const QPN_INDEX_MASK: u32 = (1 << QPN_INDEX_BITS) - 1;

fn qpn_of(h: RawHandle) -> Qpn {
    Qpn::new(((h.generation & 0x3ff) << QPN_INDEX_BITS) | h.index)
}

/// One softverbs device: its objects and transport state.
pub struct Engine {
    shared: Shared,
    pds: Slab<Pd>,
    qps: Slab<Qp>,
    /// QPs with something to send, in the order they get to send it.
    ready: VecDeque<QpHandle>,
    /// Each QP's earliest deadline (later moves are lazy: see `schedule`).
    timers: BinaryHeap<Reverse<(Instant, QpHandle)>>,
    /// Multicast attachments: (group address, UD QP), each pair at most once.
    mcast: Vec<(SocketAddr, QpHandle)>,
    /// Destroyed RC QPs that still re-acknowledge duplicates.
    closed: ClosedQps,
    /// Request packets in flight across every QP (see `EngineConfig::device_window`).
    inflight: u64,
    /// QPs with requests to send that wait for room under the device window.
    blocked: VecDeque<QpHandle>,
    /// RC and UC QPs that entered RTR since the driver last asked (`placed.rs`).
    entered_rtr: VecDeque<QpHandle>,
    /// QPs whose held WQEs may be placed now, for the driver (`placed.rs`).
    held_ready: VecDeque<QpHandle>,
}

impl Engine {
    /// A device with no objects.
    pub fn new(config: EngineConfig) -> Engine {
        let max_qp = (config.max_qp as usize).min(QPN_INDEX_MASK as usize - 1);
        Engine {
            pds: Slab::new(config.max_pd as usize, 0),
            qps: Slab::new(max_qp, 2),
            ready: VecDeque::with_capacity(64),
            timers: BinaryHeap::with_capacity(64),
            mcast: Vec::new(),
            closed: ClosedQps::default(),
            inflight: 0,
            blocked: VecDeque::with_capacity(64),
            entered_rtr: VecDeque::new(),
            held_ready: VecDeque::new(),
            shared: Shared {
                mrs: MrTable::new(config.max_mr as usize),
                cqs: Slab::new(config.max_cq as usize, 0),
                events: VecDeque::with_capacity(16),
                notifications: VecDeque::with_capacity(16),
                counters: Counters::default(),
                srqs: Slab::new(config.max_qp as usize, 0),
                placed_changes: VecDeque::new(),
                config,
            },
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.shared.counters
    }

    /// Request packets in flight (sent, not yet acknowledged) across every RC QP:
    /// what [`EngineConfig::device_window`] bounds.
    pub fn packets_in_flight(&self) -> u64 {
        self.inflight
    }

    /// The live QP numbered `qpn` (how the connection manager, which names QPs by
    /// number, reaches the QP it drives).
    pub fn qp_by_qpn(&self, qpn: Qpn) -> Option<QpHandle> {
        let index = qpn.value() & QPN_INDEX_MASK;
        let (h, q) = self.qps.get_by_index(index)?;
        (q.qpn == qpn).then_some(QpHandle(h))
    }
}

/// The engine as the simulator drives it: each datagram is sent alone, so it is
/// sealed for IPv4 Identification 0 (see [`Transmit::seal`]).
impl Node for Engine {
    fn local_addr(&self) -> SocketAddr {
        self.shared.config.local_addr
    }
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        Engine::handle_datagram(self, now, src, data)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Engine::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = Engine::poll_transmit(self, now, buf)?;
        t.seal(buf, 0);
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Engine::poll_timeout(self)
    }
}
