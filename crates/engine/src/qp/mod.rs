//! Queue pairs: state, attributes and the three halves of the RC transport —
//! [`requester`] (builds request packets), [`responder`] (executes requests and
//! answers them) and [`completer`] (processes answers, retries, completes WQEs).

pub mod attr;
pub(crate) mod completer;
pub(crate) mod queues;
pub(crate) mod requester;
pub(crate) mod responder;
pub mod state;

use crate::cq::Reclaim;
use crate::event::AsyncEvent;
use crate::shared::Shared;
use crate::time::Instant;
use crate::types::{QpHandle, QpState, QpType};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::SendOp;
use attr::{QpAttr, QpAttrMask as M, QpInitAttr};
use queues::{RecvQueue, SendQueue};
use softverbs_wire::{packet, Psn, Qpn};
use std::net::SocketAddr;

pub(crate) use requester::Requester;
pub(crate) use responder::Responder;

/// Why `modify_qp` refused; the QP is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModifyQpError {
    /// The QP does not exist.
    #[error("no such QP")]
    UnknownQp,
    /// `cur_qp_state` does not match the QP's state.
    #[error("cur_qp_state {given:?} does not match the QP's state {actual:?}")]
    CurrentStateMismatch {
        /// What the caller said.
        given: QpState,
        /// What the QP is in.
        actual: QpState,
    },
    /// IBA defines no transition between these states for this QP type.
    #[error("no transition from {from:?} to {to:?}")]
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition requires attributes the mask lacks.
    #[error("transition requires attributes {0:?}")]
    MissingAttributes(M),
    /// The mask names attributes the transition does not allow.
    #[error("transition does not allow attributes {0:?}")]
    ForbiddenAttributes(M),
    /// An attribute's value is out of range.
    #[error("invalid value for {0}")]
    InvalidValue(&'static str),
    /// The attribute is valid but softverbs does not implement it.
    #[error("{0} is not supported")]
    Unsupported(&'static str),
}

pub(crate) struct Qp {
    pub handle: QpHandle,
    pub qpn: Qpn,
    pub init: QpInitAttr,
    pub attr: QpAttr,
    pub sq: SendQueue,
    pub rq: RecvQueue,
    pub req: Requester,
    pub resp: Responder,
    /// In the engine's transmit queue.
    pub scheduled: bool,
    /// The deadline this QP has in the engine's timer heap.
    pub timer_entry: Option<Instant>,
    /// Most unacknowledged PSNs in flight.
    pub req_window: u32,
    /// The port's MTU (UD messages are at most this long).
    pub port_mtu: crate::types::Mtu,
    /// The shared receive queue this QP takes receive WQEs from, if any.
    pub srq: Option<crate::types::SrqHandle>,
    /// A completion of this QP was lost to a full CQ: the QP goes to ERR once the
    /// operation under way is over (see `Engine::after_activity`).
    pub lost_completion: bool,
}

impl Qp {
    pub fn new(handle: QpHandle, qpn: Qpn, init: QpInitAttr, req_window: u32) -> Qp {
        let cap = init.cap;
        Qp {
            handle,
            qpn,
            init,
            attr: QpAttr {
                cap,
                ..QpAttr::default()
            },
            sq: SendQueue::new(
                cap.max_send_wr as usize,
                cap.max_send_sge as usize,
                cap.max_inline_data as usize,
            ),
            rq: RecvQueue::new(cap.max_recv_wr as usize, cap.max_recv_sge as usize),
            req: Requester::default(),
            resp: Responder::new(0),
            scheduled: false,
            timer_entry: None,
            req_window,
            port_mtu: crate::types::Mtu::Mtu4096,
            srq: None,
            lost_completion: false,
        }
    }

    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub fn mtu(&self) -> u32 {
        match self.init.qp_type {
            QpType::Ud => self.port_mtu.bytes(),
            _ => self.attr.path_mtu.bytes(),
        }
    }

    /// The peer's address, once the QP has one.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.attr.av
    }

    /// Validates and applies `modify_qp`; on error nothing changes.
    pub fn modify(
        &mut self,
        shared: &mut Shared,
        attr: &QpAttr,
        mask: M,
        now: Instant,
    ) -> Result<(), ModifyQpError> {
        let from = self.state();
        if mask.contains(M::CUR_STATE) && attr.cur_qp_state != from {
            return Err(ModifyQpError::CurrentStateMismatch {
                given: attr.cur_qp_state,
                actual: from,
            });
        }
        let to = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            from
        };
        state::check(self.init.qp_type, from, to, mask).map_err(|e| match e {
            state::TransitionError::Invalid => ModifyQpError::InvalidTransition { from, to },
            state::TransitionError::Missing(m) => ModifyQpError::MissingAttributes(m),
            state::TransitionError::Forbidden(m) => ModifyQpError::ForbiddenAttributes(m),
        })?;
        self.validate(shared, attr, mask)?;

        // Everything checked: apply.
        let a = &mut self.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(M::AV) {
            a.av = attr.av;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xff_ffff;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xff_ffff;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }

        if mask.contains(M::RQ_PSN) {
            self.resp = Responder::new(self.attr.rq_psn);
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            self.resp.reserve(usize::from(self.attr.max_dest_rd_atomic));
        }
        if mask.contains(M::SQ_PSN) {
            self.req.reset(Psn::new(self.attr.sq_psn), self.sq.head);
        }
        if mask.intersects(M::RETRY_CNT | M::RNR_RETRY) {
            self.req.retry_left = self.attr.retry_cnt;
            self.req.rnr_retry_left = self.attr.rnr_retry;
        }

        self.attr.qp_state = to;
        self.attr.sq_draining = to == QpState::Sqd;
        match to {
            QpState::Reset if from != QpState::Reset => self.reset(),
            QpState::Err if from != QpState::Err => self.enter_error(shared),
            QpState::Sqd => {
                self.req.sqd_notified = false;
                self.check_drained(shared);
            }
            _ => {}
        }
        let _ = now;
        Ok(())
    }

    fn validate(&self, shared: &Shared, attr: &QpAttr, mask: M) -> Result<(), ModifyQpError> {
        let cfg = &shared.config;
        if mask.contains(M::ALT_PATH) {
            return Err(ModifyQpError::Unsupported("alternate path (APM)"));
        }
        if mask.contains(M::PATH_MIG_STATE) {
            return Err(ModifyQpError::Unsupported("path migration state"));
        }
        if mask.contains(M::CAP) {
            return Err(ModifyQpError::Unsupported("resizing QP capacities"));
        }
        if mask.contains(M::PORT) && attr.port_num != 1 {
            return Err(ModifyQpError::InvalidValue(
                "port_num (softverbs devices have port 1)",
            ));
        }
        if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(ModifyQpError::InvalidValue(
                "pkey_index (the P_Key table has one entry)",
            ));
        }
        if mask.contains(M::AV) && attr.av.is_none() {
            return Err(ModifyQpError::InvalidValue(
                "ah_attr (no destination address)",
            ));
        }
        if mask.contains(M::DEST_QPN) && attr.dest_qp_num > 0xff_ffff {
            return Err(ModifyQpError::InvalidValue("dest_qp_num"));
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > cfg.max_qp_rd_atom {
            return Err(ModifyQpError::InvalidValue("max_rd_atomic"));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > cfg.max_qp_rd_atom {
            return Err(ModifyQpError::InvalidValue("max_dest_rd_atomic"));
        }
        if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
            return Err(ModifyQpError::InvalidValue("timeout"));
        }
        if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
            return Err(ModifyQpError::InvalidValue("retry_cnt"));
        }
        if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
            return Err(ModifyQpError::InvalidValue("rnr_retry"));
        }
        if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(ModifyQpError::InvalidValue("min_rnr_timer"));
        }
        Ok(())
    }

    /// Back to RESET: queues emptied without completions (IBA 10.3.1).
    fn reset(&mut self) {
        self.sq.head = self.sq.tail;
        self.sq.reclaimed = self.sq.tail;
        self.rq.head = self.rq.tail;
        let cap = self.attr.cap;
        self.attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        self.req = Requester::default();
        self.req.reset(Psn::new(0), self.sq.head);
        self.resp = Responder::new(0);
    }

    /// Retires every outstanding send WR: those already transport-complete with their own
    /// status, the rest with WR_FLUSH_ERR, in order (IBA 10.8.3.3); the requester starts
    /// over after them.
    fn flush_send_queue(&mut self, shared: &mut Shared) {
        while self.sq.head < self.sq.tail {
            let seq = self.sq.head;
            let status = self.sq.get(seq).done.unwrap_or(WcStatus::WrFlushErr);
            self.retire_send(shared, seq, status);
            self.sq.head += 1;
        }
        self.req.reset(self.req.next_psn, self.sq.head);
    }

    /// Moves the QP to ERR and flushes every outstanding work request.
    pub fn enter_error(&mut self, shared: &mut Shared) {
        self.attr.qp_state = QpState::Err;
        self.attr.sq_draining = false;
        self.req.retrans_deadline = None;
        self.req.rnr_deadline = None;
        self.flush_send_queue(shared);
        while let Some(wqe) = self.rq.pop() {
            let wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..WorkCompletion::default()
            };
            self.complete(shared, self.init.recv_cq, wc, None);
        }
        self.resp.abort_message();
        // A QP on an SRQ takes no more WQEs from it (IBA 11.6.3.2).
        if self.srq.is_some() {
            shared
                .events
                .push_back(AsyncEvent::LastWqeReached(self.handle));
        }
    }

    /// The receive WQE the message arriving now uses, with its SGEs: the head of
    /// this QP's receive queue, or for a QP on an SRQ the WQE it claimed (see
    /// [`Qp::recv_claim`]).
    pub fn recv_head(&self) -> Option<(&queues::RecvWqe, &[crate::wr::Sge])> {
        self.rq.front()
    }

    /// Makes sure a receive WQE is there for the message that starts now; false if
    /// none is (receiver not ready). A QP on an SRQ takes the SRQ's head WQE, with
    /// its SGEs, into its own one-entry receive queue when a message starts and
    /// keeps it until the message completes (IBA 10.2.9.5), so QPs receiving at
    /// once never share a buffer; taking it may raise SRQ_LIMIT_REACHED.
    pub fn recv_claim(&mut self, shared: &mut Shared) -> bool {
        if self.rq.front().is_some() {
            return true;
        }
        let Some(h) = self.srq else {
            return false;
        };
        let Some(srq) = shared.srqs.get_mut(h.0) else {
            return false;
        };
        let Some((wqe, sges)) = srq.rq.front() else {
            return false;
        };
        if self.rq.post(wqe.wr_id, sges).is_err() {
            return false; // cannot happen: sized for the SRQ's max_sge
        }
        srq.rq.pop();
        if srq.crossed_limit() {
            shared.events.push_back(AsyncEvent::SrqLimitReached(h));
        }
        true
    }

    /// Takes the receive WQE the current message used (see [`Qp::recv_claim`]).
    pub fn recv_take(&mut self) -> Option<queues::RecvWqe> {
        self.rq.pop()
    }

    /// Reports a send WQE's completion if it is an error or signaled.
    pub fn retire_send(&mut self, shared: &mut Shared, seq: u64, status: WcStatus) {
        let wqe = *self.sq.get(seq);
        let signaled = self.init.sq_sig_all || wqe.flags.contains(crate::wr::SendFlags::SIGNALED);
        if status == WcStatus::Success && !signaled {
            return;
        }
        let (opcode, byte_len) = match wqe.op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::UdSend { .. } => (WcOpcode::Send, 0),
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => (WcOpcode::RdmaWrite, 0),
            SendOp::RdmaRead { .. } => (WcOpcode::RdmaRead, wqe.length),
            SendOp::AtomicCmpSwap { .. } => (WcOpcode::CompSwap, 8),
            SendOp::AtomicFetchAdd { .. } => (WcOpcode::FetchAdd, 8),
            SendOp::BindMw { .. } => (WcOpcode::BindMw, 0),
            SendOp::LocalInv { .. } => (WcOpcode::LocalInv, 0),
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status,
            opcode,
            byte_len,
            qp_num: self.qpn,
            ..WorkCompletion::default()
        };
        // Polling it frees this WQE's slot and those of the unsignaled ones before.
        let reclaim = Reclaim {
            qp: self.handle,
            upto: seq + 1,
        };
        self.complete(shared, self.init.send_cq, wc, Some(reclaim));
    }

    /// After an operation that lost a completion to a full CQ (the CQ error event is
    /// raised): the QP goes to ERR rather than go on losing them unnoticed.
    pub fn stop_if_completion_lost(&mut self, shared: &mut Shared) {
        if self.lost_completion {
            if self.state() != QpState::Err {
                self.enter_error(shared);
            }
            self.lost_completion = false;
        }
    }

    /// Delivers a completion of this QP. One lost to a full CQ moves the QP to ERR
    /// when the current operation is over: the completions that follow must not
    /// vanish unnoticed (IBA 11.4.2.1; the CQ error event is raised too).
    pub fn complete(
        &mut self,
        shared: &mut Shared,
        cq: crate::types::CqHandle,
        wc: WorkCompletion,
        reclaim: Option<Reclaim>,
    ) {
        if !shared.complete(cq, wc, reclaim) {
            self.lost_completion = true;
        }
    }

    /// In SQD with nothing outstanding: raise SQ_DRAINED once if asked to.
    pub fn check_drained(&mut self, shared: &mut Shared) {
        if self.state() == QpState::Sqd
            && self.attr.sq_draining
            && self.sq.head == self.req.started
            && !self.req.sqd_notified
        {
            self.req.sqd_notified = true;
            self.attr.sq_draining = false;
            if self.attr.en_sqd_async_notify {
                shared.events.push_back(AsyncEvent::SqDrained(self.handle));
            }
        }
    }

    /// The earliest timer this QP has armed.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.req.retrans_deadline, self.req.rnr_deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the QP type is one this engine implements.
    pub fn supported(qp_type: QpType) -> bool {
        matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud)
    }

    /// The transport this QP's packets use.
    pub fn transport(&self) -> softverbs_wire::Transport {
        match self.init.qp_type {
            QpType::Rc => softverbs_wire::Transport::Rc,
            QpType::Uc => softverbs_wire::Transport::Uc,
            QpType::Ud => softverbs_wire::Transport::Ud,
        }
    }

    /// A UC send queue error (IBA 10.3.1, SQE): the failed WQE reports its
    /// status, the rest of the send queue is flushed; receiving goes on.
    pub fn enter_send_queue_error(&mut self, shared: &mut Shared) {
        self.attr.qp_state = QpState::Sqe;
        self.attr.sq_draining = false;
        self.flush_send_queue(shared);
    }

    /// Pads and appends the ICRC placeholder to a packet with `header_len` header
    /// and `payload_len` payload bytes already in `buf`; returns its length. The
    /// packet leaves unsealed: the driver seals it (see [`crate::Transmit::seal`]).
    pub fn finish_packet(buf: &mut [u8], header_len: usize, payload_len: usize) -> Option<usize> {
        packet::finish(buf, header_len, payload_len).ok()
    }
}
