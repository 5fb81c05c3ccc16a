//! The engine: one softverbs device's objects and transport, driven from outside.
//!
//! Inputs are verbs calls, [`Engine::handle_datagram`] and
//! [`Engine::handle_timeout`]; outputs are [`Engine::poll_transmit`],
//! completions ([`Engine::poll_cq`]), async events ([`Engine::poll_event`]), CQ
//! notifications ([`Engine::poll_cq_notification`]) and the next deadline
//! ([`Engine::poll_timeout`]). Nothing here does I/O or reads a clock.

use crate::closed::{ClosedQp, ClosedQps, FarewellAck};
use crate::config::{EngineConfig, IcrcPolicy};
use crate::counters::Counters;
use crate::cq::Cq;
use crate::event::AsyncEvent;
use crate::memory::MemorySpan;
use crate::mr::{Mr, MrTable, Pd};
use crate::node::{Node, Transmit, MAX_DATAGRAM};
use crate::qp::attr::{QpAttr, QpAttrMask, QpInitAttr};
use crate::qp::queues::{can_post_recv, can_post_send, PostRefused};
use crate::qp::{ModifyQpError, Qp};
use crate::shared::Shared;
use crate::slab::{RawHandle, Slab};
use crate::srq::{SrqAttr, SrqInitAttr};
use crate::time::Instant;
use crate::types::{
    AccessFlags, CqHandle, MrHandle, MrInfo, PdHandle, QpHandle, QpState, QpType, SrqHandle,
};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{Payload, RecvWr, SendFlags, SendWr};
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::{headers::bth::DEFAULT_PKEY, Qpn, RocePacket, Transport};
use softverbs_wire::{AethRepr, AethSyndrome, BthRepr, Opcode, PacketRepr};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::SocketAddr;

/// Errors of object creation and destruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A handle names no live object.
    #[error("no such object")]
    UnknownObject,
    /// The device limit for this kind of object is reached.
    #[error("device limit reached")]
    LimitReached,
    /// A size or count is zero or beyond the device's limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Other objects still use this one.
    #[error("object in use")]
    Busy,
    /// softverbs does not implement this.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

/// Errors of `post_send` and `post_recv`; nothing is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The QP does not exist.
    #[error("no such QP")]
    UnknownQp,
    /// The QP's state does not accept this queue's work requests.
    #[error("QP in state {0:?} does not accept this work request")]
    InvalidState(QpState),
    /// The queue is full.
    #[error("queue full")]
    QueueFull,
    /// More SGEs than the QP was created with.
    #[error("too many SGEs")]
    TooManySge,
    /// More inline data than max_inline_data.
    #[error("inline data longer than max_inline_data")]
    InlineTooLong,
    /// The QP takes its receives from an SRQ: post them there.
    #[error("the QP uses a shared receive queue; post receives to the SRQ")]
    UsesSrq,
    /// The operation does not exist for this QP type.
    #[error("operation not valid for this QP type")]
    InvalidOpcode,
}

impl From<PostRefused> for PostError {
    fn from(r: PostRefused) -> Self {
        match r {
            PostRefused::Full => PostError::QueueFull,
            PostRefused::TooManySge => PostError::TooManySge,
            PostRefused::InlineTooLong => PostError::InlineTooLong,
        }
    }
}

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
    ready: VecDeque<QpHandle>,
    timers: BinaryHeap<Reverse<(Instant, QpHandle)>>,
    rx_ipv4_id_hint: u16,
    /// Multicast attachments: (group address, UD QP), each pair at most once.
    mcast: Vec<(SocketAddr, QpHandle)>,
    /// Destroyed RC QPs that still re-acknowledge duplicates.
    closed: ClosedQps,
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
            rx_ipv4_id_hint: 0,
            mcast: Vec::new(),
            closed: ClosedQps::default(),
            shared: Shared {
                mrs: MrTable::new(config.max_mr as usize),
                cqs: Slab::new(config.max_cq as usize, 0),
                events: VecDeque::with_capacity(16),
                notifications: VecDeque::with_capacity(16),
                counters: Counters::default(),
                srqs: Slab::new(config.max_qp as usize, 0),
                tx_ipv4_id: 0,
                rx_dst: None,
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

    // ----- protection domains and memory -----

    /// Counts one more object using `pd` (so `dealloc_pd` reports Busy).
    fn hold_pd(&mut self, pd: PdHandle) {
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
    }

    /// Counts one object fewer using `pd`.
    fn release_pd(&mut self, pd: PdHandle) {
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users -= 1;
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> Result<PdHandle, ResourceError> {
        self.pds
            .insert(Pd { users: 0 })
            .map(PdHandle)
            .ok_or(ResourceError::LimitReached)
    }

    /// Whether MRs, MWs, QPs or SRQs still use `pd` (`dealloc_pd` would fail with Busy).
    pub fn pd_in_use(&self, pd: PdHandle) -> bool {
        self.pds.get(pd.0).is_some_and(|p| p.users > 0)
    }

    /// Frees a protection domain no MR or QP uses.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), ResourceError> {
        let p = self.pds.get(pd.0).ok_or(ResourceError::UnknownObject)?;
        if p.users > 0 {
            return Err(ResourceError::Busy);
        }
        self.pds.remove(pd.0);
        Ok(())
    }

    /// Registers `len` bytes at `addr`. The region's keys work until
    /// [`Engine::dereg_mr`]; its remote address is `addr` itself.
    ///
    /// # Safety
    /// `addr..addr + len` must stay valid for reads and writes, from any thread,
    /// until the region is deregistered (or the engine dropped). The engine reads
    /// and writes it whenever local work requests or peers' RDMA operations
    /// address it, as a NIC would by DMA.
    pub unsafe fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, ResourceError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.reg_mr_with(pd, addr, len, access, false) }
    }

    /// Like [`Engine::reg_mr`], and a peer may invalidate the rkey with SEND with
    /// Invalidate (as for fast-registered memory).
    ///
    /// # Safety
    /// As for [`Engine::reg_mr`].
    pub unsafe fn reg_mr_remote_invalidate(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, ResourceError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.reg_mr_with(pd, addr, len, access, true) }
    }

    unsafe fn reg_mr_with(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        remote_invalidate: bool,
    ) -> Result<MrInfo, ResourceError> {
        if self.pds.get(pd.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        if addr.is_null() && len > 0 {
            return Err(ResourceError::InvalidArgument("null address"));
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(ResourceError::InvalidArgument(
                "region wraps the address space",
            ));
        }
        // IBA 10.6.3.1: remote write or atomic access requires local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(ResourceError::InvalidArgument(
                "remote write/atomic access requires LOCAL_WRITE",
            ));
        }
        // SAFETY: the caller promises the range stays valid while registered.
        let span = unsafe { MemorySpan::new(addr, len) };
        let mr = Mr {
            pd,
            span,
            access,
            key_byte: 0,
            remote_invalidate,
            invalidated: false,
        };
        let (h, key) = self
            .shared
            .mrs
            .insert(mr)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(MrInfo {
            handle: MrHandle(h),
            lkey: key,
            rkey: key,
            addr: addr as u64,
            length: len,
        })
    }

    /// Deregisters a region: its keys stop working at once.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), ResourceError> {
        let m = self
            .shared
            .mrs
            .remove(mr.0)
            .ok_or(ResourceError::UnknownObject)?;
        self.release_pd(m.pd);
        Ok(())
    }

    // ----- memory windows (IBA 10.6.7; see mw.rs) -----

    /// Allocates an unbound memory window in `pd`; every access through its
    /// rkey fails until it is bound.
    pub fn alloc_mw(
        &mut self,
        pd: PdHandle,
        kind: crate::mw::MwType,
    ) -> Result<crate::mw::MwInfo, ResourceError> {
        if self.pds.get(pd.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        let (h, rkey) = self
            .shared
            .mrs
            .alloc_mw(pd, kind)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(crate::mw::MwInfo {
            handle: crate::types::MwHandle(h),
            rkey,
        })
    }

    /// Frees a memory window (bound or not): its rkey stops working at once.
    pub fn dealloc_mw(&mut self, mw: crate::types::MwHandle) -> Result<(), ResourceError> {
        let w = self
            .shared
            .mrs
            .dealloc_mw(mw.0)
            .ok_or(ResourceError::UnknownObject)?;
        self.release_pd(w.pd);
        Ok(())
    }

    /// Binds a type 1 memory window (ibv_bind_mw): posts a bind work request
    /// to `qp`'s send queue and returns the rkey the window will have once it
    /// executes (a new one on every call). The bind takes effect in order with
    /// the QP's other work requests and completes with `WcOpcode::BindMw`, or
    /// `MwBindErr` if the region is not in the QP's PD, lacks MW_BIND, does
    /// not hold the range, or does not allow the rights. `info.length == 0`
    /// unbinds the window.
    pub fn bind_mw(
        &mut self,
        qp: QpHandle,
        mw: crate::types::MwHandle,
        wr_id: u64,
        flags: SendFlags,
        info: crate::mw::MwBindInfo,
    ) -> Result<softverbs_wire::Rkey, crate::mw::BindMwError> {
        use crate::mw::{BindMwError, MwType};
        match self.shared.mrs.mw_type(mw) {
            None => return Err(BindMwError::UnknownMw),
            Some(MwType::Type2) => return Err(BindMwError::WrongType),
            Some(MwType::Type1) => {}
        }
        if self.qps.get(qp.0).is_none() {
            return Err(BindMwError::Post(PostError::UnknownQp));
        }
        let rkey = self
            .shared
            .mrs
            .issue_type1_key(mw)
            .ok_or(BindMwError::UnknownMw)?;
        let rkey = softverbs_wire::Rkey(rkey);
        let wr = SendWr {
            wr_id,
            op: crate::wr::SendOp::BindMw { mw, rkey, info },
            payload: Payload::Sges(&[]),
            flags: flags.without(SendFlags::INLINE),
        };
        self.post_send_wr(qp, &wr)?;
        Ok(rkey)
    }

    // ----- completion queues -----

    /// Creates a CQ holding `cqe` completions.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle, ResourceError> {
        if cqe == 0 || cqe > self.shared.config.max_cqe {
            return Err(ResourceError::InvalidArgument("cqe"));
        }
        self.shared
            .cqs
            .insert(Cq::new(cqe as usize))
            .map(CqHandle)
            .ok_or(ResourceError::LimitReached)
    }

    /// Whether QPs still use `cq` (`destroy_cq` would fail with Busy).
    pub fn cq_in_use(&self, cq: CqHandle) -> bool {
        self.shared.cqs.get(cq.0).is_some_and(|c| c.users > 0)
    }

    /// Destroys a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), ResourceError> {
        let c = self
            .shared
            .cqs
            .get(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if c.users > 0 {
            return Err(ResourceError::Busy);
        }
        self.shared.cqs.remove(cq.0);
        Ok(())
    }

    /// Takes up to `out.len()` completions, oldest first; returns how many.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, ResourceError> {
        let c = self
            .shared
            .cqs
            .get_mut(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        let mut n = 0;
        while n < out.len() {
            let Some((wc, reclaim)) = c.pop() else {
                break;
            };
            out[n] = wc;
            n += 1;
            if let Some(r) = reclaim {
                if let Some(q) = self.qps.get_mut(r.qp.0) {
                    q.sq.reclaim(r.upto);
                }
            }
        }
        Ok(n)
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> Result<usize, ResourceError> {
        Ok(self
            .shared
            .cqs
            .get(cq.0)
            .ok_or(ResourceError::UnknownObject)?
            .len())
    }

    /// Arms a CQ: the next completion (only solicited or error ones when
    /// `solicited_only`) queues a notification for [`Engine::poll_cq_notification`].
    pub fn req_notify_cq(
        &mut self,
        cq: CqHandle,
        solicited_only: bool,
    ) -> Result<(), ResourceError> {
        let c = self
            .shared
            .cqs
            .get_mut(cq.0)
            .ok_or(ResourceError::UnknownObject)?;
        c.armed = Some(solicited_only);
        Ok(())
    }

    /// The next CQ whose armed notification fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqHandle> {
        self.shared.notifications.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.shared.events.pop_front()
    }

    // ----- queue pairs -----

    /// Creates a QP in RESET; returns its handle and QPN.
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<(QpHandle, Qpn), ResourceError> {
        if !Qp::supported(init.qp_type) {
            return Err(ResourceError::Unsupported("this QP type"));
        }
        let cfg = &self.shared.config;
        let cap = init.cap;
        if cap.max_send_wr == 0 || cap.max_recv_wr == 0 {
            return Err(ResourceError::InvalidArgument("queue depth 0"));
        }
        if cap.max_send_wr > cfg.max_qp_wr || cap.max_recv_wr > cfg.max_qp_wr {
            return Err(ResourceError::InvalidArgument(
                "queue depth beyond max_qp_wr",
            ));
        }
        if cap.max_send_sge > cfg.max_sge || cap.max_recv_sge > cfg.max_sge {
            return Err(ResourceError::InvalidArgument("SGE count beyond max_sge"));
        }
        if cap.max_inline_data > cfg.max_inline_data {
            return Err(ResourceError::InvalidArgument("max_inline_data"));
        }
        if self.pds.get(init.pd.0).is_none()
            || self.shared.cqs.get(init.send_cq.0).is_none()
            || self.shared.cqs.get(init.recv_cq.0).is_none()
        {
            return Err(ResourceError::UnknownObject);
        }
        // Build the QP completely, then make it reachable.
        let placeholder = QpHandle(RawHandle {
            index: 0,
            generation: 0,
        });
        let qp = Qp::new(placeholder, Qpn::new(0), init, cfg.send_window);
        let h = self.qps.insert(qp).ok_or(ResourceError::LimitReached)?;
        let handle = QpHandle(h);
        let qpn = qpn_of(h);
        if let Some(qp) = self.qps.get_mut(h) {
            qp.handle = handle;
            qp.qpn = qpn;
            qp.port_mtu = self.shared.config.port_mtu;
        }
        self.hold_pd(init.pd);
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.shared.cqs.get_mut(cq.0) {
                c.users += 1;
            }
        }
        Ok((handle, qpn))
    }

    /// Creates a QP in RESET that takes its receive WQEs from `srq` (IBA 10.2.9);
    /// its own receive queue is unused and `post_recv` on it is refused.
    pub fn create_qp_with_srq(
        &mut self,
        init: QpInitAttr,
        srq: SrqHandle,
    ) -> Result<(QpHandle, Qpn), ResourceError> {
        if init.qp_type == QpType::Uc {
            // IBA 10.2.9: SRQs serve RC and UD QPs.
            return Err(ResourceError::InvalidArgument(
                "an SRQ serves RC and UD QPs",
            ));
        }
        let s = self
            .shared
            .srqs
            .get(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if s.pd != init.pd {
            return Err(ResourceError::InvalidArgument(
                "the SRQ belongs to another protection domain",
            ));
        }
        let max_sge = s.max_sge as usize;
        let (qp, qpn) = self.create_qp(init)?;
        if let Some(q) = self.qps.get_mut(qp.0) {
            q.srq = Some(srq);
            // Its own receive queue holds the one SRQ WQE a message in progress
            // claimed (see `Qp::recv_claim`).
            q.rq = crate::qp::queues::RecvQueue::new(1, max_sge);
        }
        if let Some(s) = self.shared.srqs.get_mut(srq.0) {
            s.users += 1;
        }
        Ok((qp, qpn))
    }

    /// Creates a shared receive queue in `pd`.
    pub fn create_srq(
        &mut self,
        pd: PdHandle,
        attr: SrqInitAttr,
    ) -> Result<SrqHandle, ResourceError> {
        let cfg = &self.shared.config;
        if attr.max_wr == 0 || attr.max_wr > cfg.max_qp_wr {
            return Err(ResourceError::InvalidArgument("SRQ max_wr"));
        }
        if attr.max_sge == 0 || attr.max_sge > cfg.max_sge {
            return Err(ResourceError::InvalidArgument("SRQ max_sge"));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(ResourceError::InvalidArgument("srq_limit beyond max_wr"));
        }
        self.pds.get(pd.0).ok_or(ResourceError::UnknownObject)?;
        let srq = crate::srq::Srq {
            pd,
            rq: crate::qp::queues::RecvQueue::new(attr.max_wr as usize, attr.max_sge as usize),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
            users: 0,
        };
        let h = self
            .shared
            .srqs
            .insert(srq)
            .ok_or(ResourceError::LimitReached)?;
        self.hold_pd(pd);
        Ok(SrqHandle(h))
    }

    /// Arms (or disarms, with 0) the SRQ limit: when the SRQ falls below
    /// `srq_limit` WQEs, AsyncEvent::SrqLimitReached fires once (IBA 10.2.9.3).
    /// Resizing an SRQ is not supported.
    pub fn modify_srq_limit(
        &mut self,
        srq: SrqHandle,
        srq_limit: u32,
    ) -> Result<(), ResourceError> {
        let s = self
            .shared
            .srqs
            .get_mut(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if srq_limit > s.max_wr {
            return Err(ResourceError::InvalidArgument("srq_limit beyond max_wr"));
        }
        s.limit = srq_limit;
        Ok(())
    }

    /// The SRQ's attributes.
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr, ResourceError> {
        let s = self
            .shared
            .srqs
            .get(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        Ok(SrqAttr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit,
        })
    }

    /// Whether QPs still use `srq` (`destroy_srq` would fail with Busy).
    pub fn srq_in_use(&self, srq: SrqHandle) -> bool {
        self.shared.srqs.get(srq.0).is_some_and(|s| s.users > 0)
    }

    /// Destroys an SRQ no QP uses.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), ResourceError> {
        let s = self
            .shared
            .srqs
            .get(srq.0)
            .ok_or(ResourceError::UnknownObject)?;
        if s.users > 0 {
            return Err(ResourceError::Busy);
        }
        let pd = s.pd;
        self.shared.srqs.remove(srq.0);
        self.release_pd(pd);
        Ok(())
    }

    /// Queues a receive work request on an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let s = self
            .shared
            .srqs
            .get_mut(srq.0)
            .ok_or(PostError::UnknownQp)?;
        s.rq.post(wr.wr_id, wr.sges)?;
        Ok(())
    }

    /// Destroys a QP; it stops being reachable from the wire at once.
    pub fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), ResourceError> {
        let q = self.qps.remove(qp.0).ok_or(ResourceError::UnknownObject)?;
        // A connected RC QP keeps re-acknowledging duplicates of what it received, in case
        // its last ACK was lost (see `closed.rs`).
        let receiving = matches!(
            q.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if q.init.qp_type == QpType::Rc && receiving {
            if let Some(peer) = q.peer() {
                self.closed.remember(ClosedQp {
                    qpn: q.qpn,
                    peer,
                    dest_qp: Qpn::new(q.attr.dest_qp_num),
                    epsn: q.resp.epsn,
                    msn: q.resp.msn,
                    timeout: q.attr.timeout,
                });
            }
        }
        // A destroyed QP leaves its multicast groups (as rxe does).
        self.mcast.retain(|&(_, m)| m != qp);
        if let Some(s) = q.srq.and_then(|h| self.shared.srqs.get_mut(h.0)) {
            s.users -= 1;
        }
        self.release_pd(q.init.pd);
        for cq in [q.init.send_cq, q.init.recv_cq] {
            if let Some(c) = self.shared.cqs.get_mut(cq.0) {
                c.users -= 1;
            }
        }
        Ok(())
    }

    /// Bytes of heap the QP's send and receive queues take (WQE rings, SGE and
    /// inline pools): what a QP costs that depends on its capacities.
    pub fn qp_queue_bytes(&self, qp: QpHandle) -> Option<usize> {
        self.qps
            .get(qp.0)
            .map(|q| q.sq.footprint() + q.rq.footprint())
    }

    /// The QP's number.
    pub fn qp_num(&self, qp: QpHandle) -> Option<Qpn> {
        self.qps.get(qp.0).map(|q| q.qpn)
    }

    /// Changes a QP's state and attributes (IBA 11.2.4.2). On error nothing
    /// changes.
    pub fn modify_qp(
        &mut self,
        qp: QpHandle,
        attr: &QpAttr,
        mask: QpAttrMask,
        now: Instant,
    ) -> Result<(), ModifyQpError> {
        let q = self.qps.get_mut(qp.0).ok_or(ModifyQpError::UnknownQp)?;
        q.modify(&mut self.shared, attr, mask, now)?;
        self.after_activity(qp);
        Ok(())
    }

    /// The QP's current attributes.
    pub fn query_qp(&self, qp: QpHandle) -> Option<(QpAttr, QpInitAttr)> {
        self.qps.get(qp.0).map(|q| (q.attr, q.init))
    }

    /// Queues a send work request.
    pub fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        // Type 1 windows are bound only with bind_mw (IBA 10.6.7.2.1).
        if let crate::wr::SendOp::BindMw { mw, .. } = wr.op {
            if self.shared.mrs.mw_type(mw) == Some(crate::mw::MwType::Type1) {
                return Err(PostError::InvalidOpcode);
            }
        }
        self.post_send_wr(qp, wr)
    }

    fn post_send_wr(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        let q = self.qps.get_mut(qp.0).ok_or(PostError::UnknownQp)?;
        let state = q.state();
        if !can_post_send(state) {
            return Err(PostError::InvalidState(state));
        }
        // UC carries SEND and RDMA WRITE only (IBA 9.8.1, table 37).
        if q.init.qp_type == QpType::Uc && wr.op.is_read_or_atomic() {
            return Err(PostError::InvalidOpcode);
        }
        // UD sends name their destination; connected QPs cannot.
        let ud_op = matches!(wr.op, crate::wr::SendOp::UdSend { .. });
        if ud_op != (q.init.qp_type == QpType::Ud) {
            return Err(PostError::InvalidOpcode);
        }
        if matches!(wr.payload, Payload::Inline(_)) && wr.op.is_read_or_atomic() {
            return Err(PostError::InvalidOpcode);
        }
        let seq = q.sq.post(
            wr.wr_id,
            wr.op,
            wr.flags.without(SendFlags::INLINE),
            wr.payload,
        )?;
        if matches!(state, QpState::Err | QpState::Sqe) {
            // Posting to a QP in error (or a UC send queue in error) completes at
            // once with a flush error.
            q.sq.head = seq;
            q.retire_send(&mut self.shared, seq, WcStatus::WrFlushErr);
            q.sq.head = seq + 1;
            q.req.reset(q.req.next_psn, q.sq.head);
            q.stop_if_completion_lost(&mut self.shared);
            return Ok(());
        }
        self.after_activity(qp);
        Ok(())
    }

    /// Queues a receive work request.
    pub fn post_recv(&mut self, qp: QpHandle, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let q = self.qps.get_mut(qp.0).ok_or(PostError::UnknownQp)?;
        let state = q.state();
        if !can_post_recv(state) {
            return Err(PostError::InvalidState(state));
        }
        if q.srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        q.rq.post(wr.wr_id, wr.sges)?;
        if state == QpState::Err {
            q.rq.pop();
            let wc = WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: q.qpn,
                ..WorkCompletion::default()
            };
            let cq = q.init.recv_cq;
            q.complete(&mut self.shared, cq, wc, None);
        }
        Ok(())
    }

    // ----- the wire -----

    fn qp_by_qpn(&self, qpn: Qpn) -> Option<QpHandle> {
        let index = qpn.value() & QPN_INDEX_MASK;
        let (h, q) = self.qps.get_by_index(index)?;
        (q.qpn == qpn).then_some(QpHandle(h))
    }

    /// A datagram arrived from `src`.
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        self.handle_datagram_with_ipv4_id(now, src, data, 0)
    }

    /// A datagram arrived from `src`; it may have carried IPv4 Identification
    /// `ipv4_id_hint` (segment k of a GRO batch carried ID k). The ICRC is
    /// accepted if it matches with ID 0 or with the hint.
    pub fn handle_datagram_with_ipv4_id(
        &mut self,
        now: Instant,
        src: SocketAddr,
        data: &[u8],
        ipv4_id_hint: u16,
    ) {
        self.rx_ipv4_id_hint = ipv4_id_hint;
        let Some(qp) = self.dispatch_target(src, data) else {
            return;
        };
        let Ok(pkt) = RocePacket::new_checked(data) else {
            return;
        };
        let Some(q) = self.qps.get_mut(qp.0) else {
            return;
        };
        self.shared.counters.rx_packets += 1;
        self.shared.counters.rx_bytes += data.len() as u64;
        if pkt.info().is_request {
            q.handle_request(&mut self.shared, &pkt, src);
        } else {
            q.handle_response(&mut self.shared, now, &pkt);
        }
        self.after_activity(qp);
    }

    /// The transport-level checks every packet passes before a QP sees it:
    /// well-formed, ICRC, not a CNP, P_Key, a live QP of the right transport, from
    /// that QP's peer. Failures are counted and dropped.
    fn dispatch_target(&mut self, src: SocketAddr, data: &[u8]) -> Option<QpHandle> {
        let counters = &mut self.shared.counters;
        let Ok(pkt) = RocePacket::new_checked(data) else {
            counters.drop_malformed += 1;
            return None;
        };
        if !self.icrc_accepts(src, self.shared.config.local_addr, data) {
            return None;
        }
        let counters = &mut self.shared.counters;
        let info = pkt.info();
        if info.transport == Transport::Cnp {
            counters.cnp_received += 1;
            return None;
        }
        let bth = pkt.bth();
        if bth.pkey() & 0x7fff != DEFAULT_PKEY & 0x7fff {
            counters.drop_bad_pkey += 1;
            return None;
        }
        let dest_qp = bth.dest_qp();
        let Some(qp) = self.qp_by_qpn(dest_qp) else {
            let duplicate_for_closed = info.transport == Transport::Rc
                && info.is_request
                && self.closed.handle_request(src, dest_qp, bth.psn());
            if duplicate_for_closed {
                self.shared.counters.closed_qp_acks += 1;
            } else {
                self.shared.counters.drop_unknown_qp += 1;
            }
            return None;
        };
        let q = self.qps.get(qp.0)?;
        let transport_ok = matches!(
            (q.init.qp_type, info.transport),
            (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
        );
        if !transport_ok {
            self.shared.counters.drop_bad_state += 1;
            return None;
        }
        // Connected QPs take packets from their peer only; UD from anyone.
        if q.init.qp_type != QpType::Ud && q.peer() != Some(src) {
            self.shared.counters.drop_wrong_source += 1;
            return None;
        }
        Some(qp)
    }

    /// The ICRC check of a datagram from `src` to `dst` under the configured
    /// policy; counts mismatches, and `false` means drop it.
    fn icrc_accepts(&mut self, src: SocketAddr, dst: SocketAddr, data: &[u8]) -> bool {
        let counters = &mut self.shared.counters;
        if self.shared.config.icrc == IcrcPolicy::Skip {
            return true;
        }
        // The ID the datagram probably carried is checked first; failing that, the ID
        // it was sealed with is solved for in the same pass (segment k of a UDP GSO
        // send carries ID k, which a receiver without GRO cannot know). Only IDs a
        // softverbs sender uses are believed.
        let hint = self.rx_ipv4_id_hint;
        let ctx = IcrcContext {
            ipv4_id: hint,
            ..IcrcContext::new(src, dst)
        };
        match icrc::sealed_ipv4_id(&ctx, data) {
            Some(id) if id == hint => return true,
            Some(id) if usize::from(id) < icrc::GSO_MAX_SEGMENTS => {
                counters.icrc_ipv4_id_solved += 1;
                return true;
            }
            _ => {}
        }
        if self.shared.config.icrc == IcrcPolicy::Enforce {
            counters.drop_icrc += 1;
            return false;
        }
        counters.icrc_mismatch_accepted += 1;
        true
    }

    // ----- multicast -----

    /// Attaches a UD QP to the multicast group whose datagrams arrive addressed
    /// to `group`, an IP multicast address and UDP port (`ibv_attach_mcast`).
    /// Attaching twice is not an error. The caller (the driver) makes datagrams
    /// sent to `group` reach [`Engine::handle_multicast_datagram`].
    pub fn attach_mcast(&mut self, qp: QpHandle, group: SocketAddr) -> Result<(), ResourceError> {
        let q = self.qps.get(qp.0).ok_or(ResourceError::UnknownObject)?;
        if q.init.qp_type != QpType::Ud {
            return Err(ResourceError::InvalidArgument("multicast needs a UD QP"));
        }
        if !group.ip().is_multicast() {
            return Err(ResourceError::InvalidArgument(
                "not an IP multicast address",
            ));
        }
        if !self.mcast.contains(&(group, qp)) {
            self.mcast.push((group, qp));
        }
        Ok(())
    }

    /// Detaches a QP from a group it is attached to (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qp: QpHandle, group: SocketAddr) -> Result<(), ResourceError> {
        if self.qps.get(qp.0).is_none() {
            return Err(ResourceError::UnknownObject);
        }
        let before = self.mcast.len();
        self.mcast.retain(|&m| m != (group, qp));
        if self.mcast.len() == before {
            return Err(ResourceError::InvalidArgument(
                "QP not attached to the group",
            ));
        }
        Ok(())
    }

    /// The groups at least one QP is attached to, each once.
    pub fn mcast_groups(&self) -> Vec<SocketAddr> {
        let mut groups: Vec<SocketAddr> = self.mcast.iter().map(|&(g, _)| g).collect();
        groups.sort_unstable();
        groups.dedup();
        groups
    }

    /// A datagram from `src` arrived addressed to the multicast group `group`
    /// (the driver knows: it read it from that group's socket). It must be a UD
    /// request to the multicast QPN 0xFFFFFF (IBA 9.2.3); its ICRC is checked
    /// with the group as IP destination, as the sender computed it. Every QP
    /// attached to `group` gets it (IBA 10.5.2.3 / 11.3.x): each checks its own
    /// state and Q_Key and consumes its own receive WQE; the GRH area names the
    /// group as destination. Datagrams to QPN 0xFFFFFF that arrive through
    /// [`Engine::handle_datagram`] (unicast) name no QP and are dropped.
    pub fn handle_multicast_datagram(
        &mut self,
        _now: Instant,
        src: SocketAddr,
        group: SocketAddr,
        data: &[u8],
    ) {
        let Ok(pkt) = RocePacket::new_checked(data) else {
            self.shared.counters.drop_malformed += 1;
            return;
        };
        self.rx_ipv4_id_hint = 0;
        if !self.icrc_accepts(src, group, data) {
            return;
        }
        let info = pkt.info();
        let bth = pkt.bth();
        if info.transport == Transport::Cnp {
            self.shared.counters.cnp_received += 1;
            return;
        }
        if bth.pkey() & 0x7fff != DEFAULT_PKEY & 0x7fff {
            self.shared.counters.drop_bad_pkey += 1;
            return;
        }
        if info.transport != Transport::Ud || !info.is_request || bth.dest_qp() != Qpn::MULTICAST {
            self.shared.counters.drop_bad_state += 1;
            return;
        }
        let members: Vec<QpHandle> = self
            .mcast
            .iter()
            .filter(|&&(g, _)| g == group)
            .map(|&(_, qp)| qp)
            .collect();
        if members.is_empty() {
            self.shared.counters.drop_unknown_qp += 1;
            return;
        }
        self.shared.counters.rx_packets += 1;
        self.shared.counters.rx_bytes += data.len() as u64;
        self.shared.rx_dst = Some(group);
        for qp in members {
            if let Some(q) = self.qps.get_mut(qp.0) {
                q.handle_request(&mut self.shared, &pkt, src);
            }
            self.after_activity(qp);
        }
        self.shared.rx_dst = None;
    }

    /// Timers due at `now` fire.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((deadline, qp))) = self.timers.peek() {
            if deadline > now {
                break;
            }
            self.timers.pop();
            let Some(q) = self.qps.get_mut(qp.0) else {
                continue;
            };
            if q.timer_entry != Some(deadline) {
                continue; // superseded
            }
            q.timer_entry = None;
            q.handle_timeout(&mut self.shared, now);
            self.after_activity(qp);
        }
    }

    /// When [`Engine::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Like [`Engine::poll_transmit`], computing the ICRC for IPv4 Identification
    /// `ipv4_id`: the ID the datagram will carry (segment k of a UDP GSO batch
    /// sent with DF on an unconnected socket carries ID k).
    pub fn poll_transmit_with_ipv4_id(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        ipv4_id: u16,
    ) -> Option<Transmit> {
        self.shared.tx_ipv4_id = ipv4_id;
        let t = self.poll_transmit(now, buf);
        self.shared.tx_ipv4_id = 0;
        t
    }

    /// Writes the next datagram into `buf` (at least [`MAX_DATAGRAM`] bytes).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if buf.len() < MAX_DATAGRAM {
            return None;
        }
        if let Some(ack) = self.closed.poll_ack() {
            if let Some(len) = self.emit_farewell_ack(ack, buf) {
                self.shared.counters.tx_packets += 1;
                self.shared.counters.tx_bytes += len as u64;
                return Some(Transmit { dst: ack.dst, len });
            }
        }
        let mut budget = self.ready.len();
        while budget > 0 {
            budget -= 1;
            let qp = self.ready.pop_front()?;
            let Some(q) = self.qps.get_mut(qp.0) else {
                continue;
            };
            // Answers go to the QP's peer; requests say where they go (UD).
            let produced = if q.resp.has_output(q.state()) {
                q.poll_response(&mut self.shared, buf).zip(q.peer())
            } else {
                None
            };
            let produced = produced.or_else(|| q.poll_request(&mut self.shared, now, buf));
            q.stop_if_completion_lost(&mut self.shared);
            let more = q.resp.has_output(q.state()) || q.requester_ready();
            if more {
                self.ready.push_back(qp);
            } else {
                q.scheduled = false;
            }
            self.rearm(qp);
            if let Some((len, dst)) = produced {
                self.shared.counters.tx_packets += 1;
                self.shared.counters.tx_bytes += len as u64;
                return Some(Transmit { dst, len });
            }
        }
        None
    }

    /// Builds the ACK a closed QP owes into `buf`.
    fn emit_farewell_ack(&self, ack: FarewellAck, buf: &mut [u8]) -> Option<usize> {
        let bth = BthRepr::new(Opcode::RcAcknowledge, ack.dest_qp, ack.psn);
        let mut repr = PacketRepr::new(bth, &[]);
        repr.aeth = Some(AethRepr {
            syndrome: AethSyndrome::ACK_UNLIMITED,
            msn: ack.msn,
        });
        let header_len = repr.emit_headers(0, buf).ok()?;
        Qp::seal(&self.shared, ack.dst, buf, header_len, 0)
    }

    /// Whether destroyed RC QPs may still owe an ACK, and if so the largest local ACK
    /// timeout exponent among them: a driver closing the device may stay up about two
    /// such timeouts after its last datagram arrived so a peer's retransmission finds an
    /// answer (see `closed.rs`).
    pub fn closed_qp_timeout(&self) -> Option<u8> {
        self.closed.max_timeout()
    }

    /// After anything touched a QP: schedule it for transmission and re-arm its
    /// timer.
    fn after_activity(&mut self, qp: QpHandle) {
        if let Some(q) = self.qps.get_mut(qp.0) {
            q.stop_if_completion_lost(&mut self.shared);
            // Memory window binds and local invalidates take effect as soon as
            // the send queue reaches them, not at the next poll_transmit.
            q.run_local_ops_now(&mut self.shared);
            if !q.scheduled && (q.resp.has_output(q.state()) || q.requester_ready()) {
                q.scheduled = true;
                self.ready.push_back(qp);
            }
        }
        self.rearm(qp);
    }

    fn rearm(&mut self, qp: QpHandle) {
        let Some(q) = self.qps.get_mut(qp.0) else {
            return;
        };
        let Some(deadline) = q.next_deadline() else {
            return;
        };
        // One heap entry per QP at its earliest deadline; later moves are lazy.
        if q.timer_entry.is_none_or(|t| deadline < t) {
            q.timer_entry = Some(deadline);
            self.timers.push(Reverse((deadline, qp)));
        }
    }
}

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
        Engine::poll_transmit(self, now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Engine::poll_timeout(self)
    }
}
