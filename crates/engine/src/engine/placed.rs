//! The same-host path's share of the engine: RDMA WRITEs and READs whose bytes the
//! driver moved itself, straight between the two processes' registered memory, before
//! posting them.
//!
//! When the driver has negotiated the same-host path with the peer of an RC QP
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
//! The peer's side of a placed WRITE is its acceptance: [`Engine::set_accepts_placed`],
//! and every later change of that QP's state or access flags, queued for the driver to
//! republish ([`Engine::poll_placed_change`]); a QP entering ERR stops accepting.

use super::{Engine, PostError, ResourceError};
use crate::types::{QpHandle, QpState, QpType};
use crate::wr::{Payload, SendOp, SendWr};

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
        let len = match wr.payload {
            Payload::Sges(list) => list.iter().map(|s| s.length as usize).sum(),
            Payload::Inline(d) => d.len(),
            Payload::InlineParts(parts) => parts.iter().map(|p| p.len()).sum(),
        };
        Some(PlacedTarget {
            remote_addr,
            rkey: rkey.0,
            len,
            write,
        })
    }
}

impl Engine {
    /// Turns the same-host path of an RC QP on or off (the driver negotiated it with
    /// the peer): its responder accepts header-only placed WRITEs, and
    /// [`Engine::post_send_placed`] accepts work. Cleared when the QP goes to RESET.
    pub fn set_same_host(&mut self, qp: QpHandle, on: bool) -> Result<(), ResourceError> {
        let q = self.qps.get_mut(qp.0).ok_or(ResourceError::UnknownObject)?;
        if q.init.qp_type != QpType::Rc {
            return Err(ResourceError::Unsupported(
                "the same-host path is for RC QPs",
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
        if q.init.qp_type != QpType::Rc {
            return Err(ResourceError::Unsupported(
                "the same-host path is for RC QPs",
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

    /// The next RC QP that entered RTR (its peer is known now), for the driver to
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
        q.same_host
            && q.state() == QpState::Rts
            && (q.sq.head..q.sq.tail).all(|seq| q.sq.get(seq).placed)
    }

    /// Whether the QP has the same-host path and placement waits only for RDMA WRITEs
    /// (without immediate) and READs that went by UDP (posted before the path was up,
    /// say): those complete without the peer application doing anything, so a poster
    /// may wait for them rather than send one more by UDP behind them, and again, for
    /// as long as the application keeps the queue full.
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
    /// local error it deserves).
    pub fn placement_sink(
        &self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        out: &mut Vec<(u64, usize)>,
    ) -> bool {
        self.sge_pieces(qp, wr, crate::types::AccessFlags::LOCAL_WRITE, out)
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
        self.post_send_inner(qp, wr, true)
    }
}
