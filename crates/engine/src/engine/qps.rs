//! Verbs calls on queue pairs: create, modify, query, destroy, post work.

use super::{qpn_of, Engine, PostError, ResourceError};
use crate::closed::ClosedQp;
use crate::qp::attr::{QpAttr, QpAttrMask, QpInitAttr};
use crate::qp::queues::{can_post_recv, can_post_send};
use crate::qp::{ModifyQpError, Qp};
use crate::slab::RawHandle;
use crate::time::Instant;
use crate::types::{QpHandle, QpState, QpType, SrqHandle};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{Payload, RecvWr, SendFlags, SendWr};
use softverbs_wire::Qpn;

impl Engine {
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
        let qp = Qp::new(
            placeholder,
            Qpn::new(0),
            init,
            cfg.send_window,
            cfg.read_budget,
            crate::qp::RecoveryTiming {
                min_rto: cfg.min_rto,
                peer_ack_hold: cfg.peer_ack_hold,
            },
            cfg.selective_repeat,
        );
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

    /// Destroys a QP; it stops being reachable from the wire at once.
    pub fn destroy_qp(&mut self, qp: QpHandle) -> Result<(), ResourceError> {
        let q = self.qps.remove(qp.0).ok_or(ResourceError::UnknownObject)?;
        self.inflight -= u64::from(q.inflight);
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

    /// The QP's smoothed round-trip time, once it has measured one (RC).
    pub fn qp_srtt(&self, qp: QpHandle) -> Option<core::time::Duration> {
        self.qps.get(qp.0).and_then(|q| q.comp.srtt())
    }

    /// What the QP's responder holds for packets that arrived ahead of the
    /// expected PSN (selective repeat; see [`crate::HeldAhead`]).
    pub fn qp_held_ahead(&self, qp: QpHandle) -> Option<crate::HeldAhead> {
        self.qps.get(qp.0).map(|q| q.resp.held_ahead())
    }

    /// How full the QP's answer queue is (see [`crate::AnswerQueue`]).
    pub fn qp_answer_queue(&self, qp: QpHandle) -> Option<crate::AnswerQueue> {
        self.qps.get(qp.0).map(|q| q.resp.answer_queue())
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
        let before = q.state();
        let accepted = q.resp.accept_placed;
        q.modify(&mut self.shared, attr, mask, now)?;
        if accepted || q.resp.accept_placed {
            self.shared.placed_changes.push_back(qp);
        }
        // (Connected QPs: the same-host path is for RC and UC, `placed.rs`.)
        if q.state() == QpState::Rtr
            && before != QpState::Rtr
            && matches!(q.init.qp_type, QpType::Rc | QpType::Uc)
        {
            self.entered_rtr.push_back(qp);
        }
        self.after_activity(qp);
        Ok(())
    }

    /// The QP's request PSNs sent and not yet acknowledged (RC; 0 for the other
    /// transports, whose requests nobody acknowledges; `None`: no such QP).
    pub fn qp_outstanding(&self, qp: QpHandle) -> Option<u32> {
        self.qps.get(qp.0).map(|q| q.outstanding())
    }

    /// The QP's current state (`None`: no such QP).
    pub fn qp_state(&self, qp: QpHandle) -> Option<QpState> {
        self.qps.get(qp.0).map(|q| q.state())
    }

    /// The QP's current attributes.
    pub fn query_qp(&self, qp: QpHandle) -> Option<(QpAttr, QpInitAttr)> {
        self.qps.get(qp.0).map(|q| (q.attr, q.init))
    }

    /// Queues a send work request. It takes a send queue slot until its completion
    /// (or, unsignaled, a later signaled completion of the queue) is polled; with
    /// max_send_wr slots taken it fails with [`PostError::QueueFull`].
    pub fn post_send(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        // Type 1 windows are bound only with bind_mw (IBA 10.6.7.2.1).
        if let crate::wr::SendOp::BindMw { mw, .. } = wr.op {
            if self.shared.mrs.mw_type(mw) == Some(crate::mw::MwType::Type1) {
                return Err(PostError::InvalidOpcode);
            }
        }
        self.post_send_wr(qp, wr)
    }

    pub(super) fn post_send_wr(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.post_send_inner(qp, wr, super::placed::Posting::Usual)
    }

    /// Posts `wr` the usual way, placed (its bytes were moved already) or held for
    /// placement (`placed.rs`).
    pub(super) fn post_send_inner(
        &mut self,
        qp: QpHandle,
        wr: &SendWr<'_>,
        posting: super::placed::Posting,
    ) -> Result<(), PostError> {
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
        if matches!(wr.payload, Payload::Inline(_) | Payload::InlineParts(_))
            && wr.op.is_read_or_atomic()
        {
            return Err(PostError::InvalidOpcode);
        }
        let seq = q.sq.post(
            wr.wr_id,
            wr.op,
            wr.flags.without(SendFlags::INLINE),
            wr.payload,
        )?;
        let wqe = q.sq.get_mut(seq);
        wqe.placed = posting == super::placed::Posting::Placed;
        wqe.held = posting == super::placed::Posting::Held;
        if wqe.held {
            q.sq.held += 1;
        }
        if matches!(state, QpState::Err | QpState::Sqe) {
            // Posting to a QP in error (or a UC send queue in error) completes at
            // once with a flush error.
            q.flush_posted(&mut self.shared, seq);
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
}
