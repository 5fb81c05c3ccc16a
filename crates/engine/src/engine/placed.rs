//! The same-host path's share of the engine: RDMA WRITEs and READs whose bytes the
//! driver moved itself, straight between the two processes' registered memory, before
//! posting them.
//!
//! When the driver has negotiated the same-host path with the peer of an RC or UC QP
//! ([`Engine::set_same_host`]), it may move an RDMA WRITE's or READ's bytes with
//! `process_vm_writev`/`process_vm_readv` after checking the peer's published memory
//! region table, and then post the work request *placed*
//! ([`Engine::post_send_placed`]). A placed WQE keeps its place in the send queue's
//! order:
//!
//! - a placed RDMA WRITE (without immediate) is carried out by the requester itself,
//!   like a local operation: it takes no PSN, sends nothing, and completes in order,
//!   once every earlier WQE has. The driver places one only after reading, in the
//!   peer's published table, that the peer QP is connected to this one, accepts
//!   placed WRITEs and allows remote writes (the responder's checks, made by the
//!   requester: the region's key, PD, access and bounds from the same
//!   table); else the WRITE goes by UDP and the responder gives the status IBA
//!   defines. Nothing at the target has to see it: RC WRITE without immediate
//!   consumes no receive WQE and makes no completion there;
//! - a placed WRITE with immediate is one RDMA WRITE Only packet with its immediate,
//!   whose RETH names the whole range but which carries no payload. The peer's
//!   responder, told of the path too, runs its usual checks on the RETH's range (key,
//!   PD, access, bounds) and writes nothing; so the ACK, the requester's completion,
//!   and the target's receive completion (its byte_len from the RETH) come as on the
//!   UDP path, after the bytes landed;
//! - a placed READ is carried out by the requester itself, like a local operation: the
//!   driver read its bytes straight into the local SGEs (which [`Engine::placement_sink`]
//!   resolved, with LOCAL_WRITE, in the QP's PD) before posting it; it takes no PSN,
//!   sends nothing, and completes in order, once every earlier WQE has. When it runs,
//!   its SGEs are checked again: a region deregistered meanwhile completes it with
//!   LOC_PROT_ERR, as a NIC's READ into a vanished region would.
//!
//! Ordering (IBA 9.5: a responder executes requests in the order they were sent): the driver
//! moves bytes only while every WQE not yet retired on the QP is itself placed
//! ([`Engine::placement_ready`]), so no earlier SEND, atomic or packet-borne WRITE can
//! still be executed after the bytes of a later WRITE landed; and every packet posted
//! later (a SEND, an atomic, a WRITE with immediate) is built after the bytes of every
//! earlier placed WRITE landed (the system call returned before the WR was posted), so
//! the target sees them before it executes that packet: a WRITE is visible before a
//! later SEND is received, and a WRITE with immediate's completion comes after its data.
//! A locally completed WRITE's completion means what an RC ACK means: its bytes are in
//! the target's memory. Anything else goes the UDP way.
//!
//! Held WQEs: a WRITE or READ posted while the only WQEs ahead of it that are not
//! placed are WRITEs and READs that went by UDP (posted before the path was up, say)
//! is *held* ([`Engine::post_send_held`]) rather than sent by UDP behind them: an
//! application that keeps its send queue full (as perftest does) would otherwise
//! keep the QP off the path for good. The post returns at once (verbs: posting
//! never waits for the transport). The requester starts nothing while its cursor is
//! on a held WQE, so nothing posted after it is sent before it. Once every WQE
//! ahead of the first held one is placed or retired, the QP is reported
//! ([`Engine::poll_held_ready`]); the driver moves the bytes of the held WQEs
//! ([`Engine::held_ready`], [`Engine::held_source`], [`Engine::held_sink`]) and
//! settles each ([`Engine::settle_held`]): placed, or released to go by UDP (its
//! bytes could not move: the responder then gives the status IBA defines). A QP
//! entering ERR flushes held WQEs with the rest (WR_FLUSH_ERR).
//!
//! The peer's side of a placed WRITE is its acceptance: [`Engine::set_accepts_placed`],
//! and every later change of that QP's state or access flags, queued for the driver to
//! republish ([`Engine::poll_placed_change`]); a QP entering ERR stops accepting.

use super::{Engine, PostError, ResourceError};
use crate::qp::Qp;
use crate::types::{AccessFlags, QpHandle, QpState, QpType};
use crate::wr::{Payload, SendFlags, SendOp, SendWr, Sge};

/// How a send WR enters the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Posting {
    /// For the transport (UDP).
    Usual,
    /// Its bytes moved already.
    Placed,
    /// Held until it may be placed.
    Held,
}

/// A held WQE that may be placed now ([`Engine::held_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldWr {
    /// Its place in the send queue (for [`Engine::settle_held`]).
    pub seq: u64,
    /// Where its bytes go or come from.
    pub target: PlacedTarget,
}

impl Qp {
    /// The first held WQE, if every WQE ahead of it is placed and placement may go
    /// on (the same-host path, RTS).
    pub(crate) fn first_held_ready(&self) -> Option<u64> {
        if self.sq.held == 0 || !self.same_host || self.state() != QpState::Rts {
            return None;
        }
        for seq in self.sq.head..self.sq.tail {
            let w = self.sq.get(seq);
            if w.held {
                return Some(seq);
            }
            if !w.placed {
                return None;
            }
        }
        None
    }

    /// Whether every WQE not yet retired is placed.
    fn all_placed(&self) -> bool {
        (self.sq.head..self.sq.tail).all(|seq| self.sq.get(seq).placed)
    }
}

/// Where a WRITE or READ the driver may place goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedTarget {
    /// The peer's virtual address.
    pub remote_addr: u64,
    /// The peer's R_Key.
    pub rkey: u32,
    /// Bytes to move.
    pub len: usize,
    /// A WRITE (`true`) or a READ.
    pub write: bool,
}

impl PlacedTarget {
    /// The target of `wr`, if it is an RDMA WRITE (with or without immediate) or READ.
    pub fn of(wr: &SendWr<'_>) -> Option<PlacedTarget> {
        let (remote_addr, rkey, write) = match wr.op {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => (remote_addr, rkey, true),
            SendOp::RdmaRead { remote_addr, rkey } => (remote_addr, rkey, false),
            _ => return None,
        };
        let len = wr.payload.len();
        Some(PlacedTarget {
            remote_addr,
            rkey: rkey.0,
            len,
            write,
        })
    }
}

impl Engine {
    /// Turns the same-host path of an RC or UC QP on or off (the driver negotiated it with
    /// the peer): its responder accepts header-only placed WRITEs, and
    /// [`Engine::post_send_placed`] accepts work. Cleared when the QP goes to RESET.
    pub fn set_same_host(&mut self, qp: QpHandle, on: bool) -> Result<(), ResourceError> {
        let q = self.qps.get_mut(qp.0).ok_or(ResourceError::UnknownObject)?;
        if !matches!(q.init.qp_type, QpType::Rc | QpType::Uc) {
            return Err(ResourceError::Unsupported(
                "the same-host path is for RC and UC QPs",
            ));
        }
        q.same_host = on;
        q.resp.accept_placed = on;
        self.shared.placed_changes.push_back(qp);
        Ok(())
    }

    /// Lets the QP's responder accept placed WRITEs from its peer (the peer may place
    /// into this QP's memory), without placing itself.
    pub fn set_accepts_placed(&mut self, qp: QpHandle, on: bool) -> Result<(), ResourceError> {
        let q = self.qps.get_mut(qp.0).ok_or(ResourceError::UnknownObject)?;
        if !matches!(q.init.qp_type, QpType::Rc | QpType::Uc) {
            return Err(ResourceError::Unsupported(
                "the same-host path is for RC and UC QPs",
            ));
        }
        q.resp.accept_placed = on;
        self.shared.placed_changes.push_back(qp);
        Ok(())
    }

    /// Whether the QP accepts placed WRITEs from its peer now: it agreed
    /// ([`Engine::set_accepts_placed`]) and its responder executes requests (RTR, RTS,
    /// SQD or SQE; IBA 10.3.1).
    pub fn accepts_placed(&self, qp: QpHandle) -> bool {
        self.qps.get(qp.0).is_some_and(|q| {
            q.resp.accept_placed
                && matches!(
                    q.state(),
                    QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
                )
        })
    }

    /// The next QP whose acceptance of placed WRITEs ([`Engine::accepts_placed`]) or
    /// access flags may have changed since the driver last asked (its entering ERR
    /// included): the driver republishes it for its peer.
    pub fn poll_placed_change(&mut self) -> Option<QpHandle> {
        self.shared.placed_changes.pop_front()
    }

    /// The next RC or UC QP that entered RTR (its peer is known now), for the driver to
    /// offer the same-host path to.
    pub fn poll_entered_rtr(&mut self) -> Option<QpHandle> {
        self.entered_rtr.pop_front()
    }

    /// Whether the QP has the same-host path.
    pub fn same_host(&self, qp: QpHandle) -> bool {
        self.qps.get(qp.0).is_some_and(|q| q.same_host)
    }

    /// Whether a WRITE or READ posted now may be placed: the QP has the same-host path,
    /// is in RTS, and every WQE not yet retired is placed itself (see the module
    /// comment for why).
    pub fn placement_ready(&self, qp: QpHandle) -> bool {
        let Some(q) = self.qps.get(qp.0) else {
            return false;
        };
        q.same_host && q.state() == QpState::Rts && q.all_placed()
    }

    /// Whether the QP has the same-host path and placement waits only for RDMA WRITEs
    /// (without immediate) and READs that went by UDP (posted before the path was up,
    /// say): those complete without the peer application doing anything, so a WRITE
    /// or READ posted now may be held until they did ([`Engine::post_send_held`])
    /// rather than sent by UDP behind them, and again, for as long as the
    /// application keeps the queue full.
    pub fn placement_waits_for_one_sided(&self, qp: QpHandle) -> bool {
        let Some(q) = self.qps.get(qp.0) else {
            return false;
        };
        q.same_host
            && q.state() == QpState::Rts
            && (q.sq.head..q.sq.tail).any(|seq| !q.sq.get(seq).placed)
            && (q.sq.head..q.sq.tail).all(|seq| {
                let w = q.sq.get(seq);
                w.placed
                    || matches!(w.op, SendOp::RdmaWrite { .. } | SendOp::RdmaRead { .. })
                        && w.done.is_none_or(|s| s == crate::wc::WcStatus::Success)
            })
    }

    /// How many WRITEs and READs may be placed now: 0 unless
    /// [`Engine::placement_ready`], else the send queue's free slots (a WR whose bytes
    /// moved must find a slot, or a WRITE would land without being posted).
    pub fn placement_room(&self, qp: QpHandle) -> usize {
        if !self.placement_ready(qp) {
            return 0;
        }
        self.qps.get(qp.0).map_or(0, |q| q.sq.free() as usize)
    }

    /// The local memory a WRITE sends from, as (address, length) pieces, when it
    /// gathers from SGEs that resolve in the QP's PD; `false` otherwise (inline data:
    /// see [`Engine::gather_for_placement`]; bad keys: the UDP path reports them).
    pub fn placement_source(
        &self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        out: &mut Vec<(u64, usize)>,
    ) -> bool {
        self.sge_pieces(qp, wr, crate::types::AccessFlags::EMPTY, out)
    }

    /// Copies the bytes a WRITE sends (from its SGEs, which must resolve in the QP's
    /// PD, or its inline data) into `out`. `false` if they do not resolve: the WR then
    /// goes the UDP way and completes with the local error it deserves.
    pub fn gather_for_placement(&self, qp: QpHandle, wr: &SendWr<'_>, out: &mut Vec<u8>) -> bool {
        let Some(q) = self.qps.get(qp.0) else {
            return false;
        };
        out.clear();
        match wr.payload {
            Payload::Sges(list) => {
                let len: usize = list.iter().map(|s| s.length as usize).sum();
                out.resize(len, 0);
                self.shared.gather(q.init.pd, list, 0, out).is_ok()
            }
            Payload::Inline(d) => {
                out.extend_from_slice(d);
                true
            }
            Payload::InlineParts(parts) => {
                for p in parts {
                    out.extend_from_slice(p);
                }
                true
            }
        }
    }

    /// The local memory a READ lands in, as (address, length) pieces, when its SGEs
    /// resolve in the QP's PD with LOCAL_WRITE (as the UDP path requires of a READ's
    /// local SGEs); `false` otherwise (the UDP path then completes it with the
    /// local error it deserves). Never on a UC QP: UC has no READ (IBA 9.8.1), and
    /// its post fails, so no byte may move for it.
    pub fn placement_sink(
        &self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        out: &mut Vec<(u64, usize)>,
    ) -> bool {
        out.clear();
        let rc = self
            .qps
            .get(qp.0)
            .is_some_and(|q| q.init.qp_type == QpType::Rc);
        rc && self.sge_pieces(qp, wr, crate::types::AccessFlags::LOCAL_WRITE, out)
    }

    /// `wr`'s SGEs as (address, length) pieces into `out`, skipping empty ones, when
    /// every SGE resolves in the QP's PD with `access`; `false` otherwise.
    fn sge_pieces(
        &self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        access: crate::types::AccessFlags,
        out: &mut Vec<(u64, usize)>,
    ) -> bool {
        out.clear();
        let (Some(q), Payload::Sges(list)) = (self.qps.get(qp.0), wr.payload) else {
            return false;
        };
        self.list_pieces(q, list, access, out)
    }

    /// `list` as (address, length) pieces into `out` (cleared first), skipping empty
    /// SGEs, when every SGE resolves in `q`'s PD with `access`; `false` otherwise.
    fn list_pieces(
        &self,
        q: &Qp,
        list: &[Sge],
        access: AccessFlags,
        out: &mut Vec<(u64, usize)>,
    ) -> bool {
        out.clear();
        if self.shared.check_sges(q.init.pd, list, access).is_err() {
            return false;
        }
        out.extend(
            list.iter()
                .filter(|s| s.length > 0)
                .map(|s| (s.addr, s.length as usize)),
        );
        true
    }

    /// Posts an RDMA WRITE or READ whose bytes the driver moved already (a READ's
    /// into its SGEs, from [`Engine::placement_sink`]). Only while
    /// [`Engine::placement_ready`]; `InvalidOpcode` otherwise, or for any other
    /// operation, or for a READ whose payload is not SGEs.
    pub fn post_send_placed(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        if !self.placement_ready(qp) {
            return Err(PostError::InvalidOpcode);
        }
        let target = PlacedTarget::of(wr).ok_or(PostError::InvalidOpcode)?;
        if !target.write && !matches!(wr.payload, Payload::Sges(_)) {
            return Err(PostError::InvalidOpcode);
        }
        self.post_send_inner(qp, wr, Posting::Placed)
    }

    /// Whether `wr`, posted now, should be held for placement rather than sent by
    /// UDP (see the module comment): an RDMA WRITE or READ with bytes to move, on a QP
    /// with the path in RTS, behind held WQEs or behind WRITEs and READs by UDP only
    /// ([`Engine::placement_waits_for_one_sided`]).
    pub fn should_hold(&self, qp: QpHandle, wr: &SendWr<'_>) -> bool {
        let Some(q) = self.qps.get(qp.0) else {
            return false;
        };
        // (A READ only on RC: UC has none, IBA 9.8.1.)
        let rc = q.init.qp_type == QpType::Rc;
        let holds = PlacedTarget::of(wr).is_some_and(|t| {
            t.len > 0 && (t.write || rc && matches!(wr.payload, Payload::Sges(_)))
        });
        holds
            && q.same_host
            && q.state() == QpState::Rts
            && (q.sq.held > 0 || self.placement_waits_for_one_sided(qp))
    }

    /// Posts an RDMA WRITE or READ held for placement: it takes its slot in the
    /// send queue now and is sent or completed once the driver settles it
    /// ([`Engine::settle_held`]). Only on a QP with the path in RTS (else
    /// `InvalidOpcode`, as for any other operation, or a READ whose payload is not
    /// SGEs); the usual checks otherwise.
    pub fn post_send_held(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        let q = self.qps.get(qp.0).ok_or(PostError::UnknownQp)?;
        if !q.same_host || q.state() != QpState::Rts {
            return Err(PostError::InvalidOpcode);
        }
        let target = PlacedTarget::of(wr).ok_or(PostError::InvalidOpcode)?;
        if !target.write && !matches!(wr.payload, Payload::Sges(_)) {
            return Err(PostError::InvalidOpcode);
        }
        self.post_send_inner(qp, wr, Posting::Held)
    }

    /// The next QP whose held WQEs may be placed now: every WQE ahead of the first
    /// held one is placed or retired ([`Engine::held_ready`] lists them).
    pub fn poll_held_ready(&mut self) -> Option<QpHandle> {
        let qp = self.held_ready.pop_front()?;
        if let Some(q) = self.qps.get_mut(qp.0) {
            q.held_queued = false;
        }
        Some(qp)
    }

    /// The held WQEs of `qp` that may be placed now, in order, into `out` (cleared
    /// first): the first held one, if every WQE ahead of it is placed, and the held
    /// ones right after it.
    pub fn held_ready(&self, qp: QpHandle, out: &mut Vec<HeldWr>) {
        out.clear();
        let Some(q) = self.qps.get(qp.0) else {
            return;
        };
        let Some(first) = q.first_held_ready() else {
            return;
        };
        for seq in first..q.sq.tail {
            let w = q.sq.get(seq);
            if !w.held {
                break;
            }
            let (remote_addr, rkey, write) = match w.op {
                SendOp::RdmaWrite { remote_addr, rkey }
                | SendOp::RdmaWriteWithImm {
                    remote_addr, rkey, ..
                } => (remote_addr, rkey, true),
                SendOp::RdmaRead { remote_addr, rkey } => (remote_addr, rkey, false),
                _ => break,
            };
            out.push(HeldWr {
                seq,
                target: PlacedTarget {
                    remote_addr,
                    rkey: rkey.0,
                    len: w.length as usize,
                    write,
                },
            });
        }
    }

    /// The held WQE `seq` of `qp`, if it is one.
    fn held_wqe(&self, qp: QpHandle, seq: u64) -> Option<&Qp> {
        let q = self.qps.get(qp.0)?;
        let held = seq >= q.sq.head && seq < q.sq.tail && q.sq.get(seq).held;
        held.then_some(q)
    }

    /// Where held WRITE `seq`'s bytes come from: its SGEs as (address, length) pieces
    /// when they resolve in the QP's PD, or a copy of its inline data in `bounce`
    /// (`pieces` empty). `false` if they do not resolve (the UDP path then
    /// completes it with the local error it deserves) or `seq` is not held.
    pub fn held_source(
        &self,
        qp: QpHandle,
        seq: u64,
        pieces: &mut Vec<(u64, usize)>,
        bounce: &mut Vec<u8>,
    ) -> bool {
        pieces.clear();
        bounce.clear();
        let Some(q) = self.held_wqe(qp, seq) else {
            return false;
        };
        if q.sq.get(seq).flags.contains(SendFlags::INLINE) {
            bounce.extend_from_slice(q.sq.inline_data(seq));
            return true;
        }
        self.list_pieces(q, q.sq.sges(seq), AccessFlags::EMPTY, pieces)
    }

    /// Where held READ `seq`'s bytes land, as (address, length) pieces, when its SGEs
    /// resolve in the QP's PD with LOCAL_WRITE; `false` otherwise, or if `seq` is not
    /// held.
    pub fn held_sink(&self, qp: QpHandle, seq: u64, pieces: &mut Vec<(u64, usize)>) -> bool {
        pieces.clear();
        let Some(q) = self.held_wqe(qp, seq) else {
            return false;
        };
        self.list_pieces(q, q.sq.sges(seq), AccessFlags::LOCAL_WRITE, pieces)
    }

    /// Ends the hold of WQE `seq`: `moved`, its bytes moved and it is placed (if
    /// every WQE ahead of it still is, on a QP that still has the path in RTS);
    /// otherwise it goes by UDP. Returns whether it ended placed; `false` too if
    /// `seq` was not held (flushed meanwhile, say).
    pub fn settle_held(&mut self, qp: QpHandle, seq: u64, moved: bool) -> bool {
        let Some(q) = self.qps.get_mut(qp.0) else {
            return false;
        };
        if seq < q.sq.head || seq >= q.sq.tail || !q.sq.get(seq).held {
            return false;
        }
        let placed = moved
            && q.same_host
            && q.state() == QpState::Rts
            && (q.sq.head..seq).all(|s| q.sq.get(s).placed);
        let w = q.sq.get_mut(seq);
        w.held = false;
        w.placed = placed;
        q.sq.held -= 1;
        self.after_activity(qp);
        placed
    }
}
