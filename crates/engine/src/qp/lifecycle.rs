//! The QP's ways out of normal operation — ERR (IBA 10.3.1: every outstanding work
//! request flushed), the UC send queue error SQE, SQD's drained event — and its
//! completions, including a completion lost to a full CQ.

use super::Qp;
use crate::cq::Reclaim;
use crate::event::AsyncEvent;
use crate::shared::Shared;
use crate::types::QpState;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::SendOp;

impl Qp {
    /// Retires every outstanding send WR: those already transport-complete with their own
    /// status, the rest with WR_FLUSH_ERR, in order (IBA 10.8.3.3); the requester starts
    /// over after them.
    pub(super) fn flush_send_queue(&mut self, shared: &mut Shared) {
        while self.sq.head < self.sq.tail {
            let seq = self.sq.head;
            let status = self.sq.get(seq).done.unwrap_or(WcStatus::WrFlushErr);
            self.retire_send(shared, seq, status);
            self.sq.head += 1;
        }
        // Held WQEs were flushed with the rest.
        self.sq.held = 0;
        let psn = self.req.next_psn;
        self.req.reset(psn, self.sq.head);
        self.comp.reset(psn);
    }

    /// A WR posted in ERR (or to a UC send queue in SQE) completes at once with a
    /// flush error (IBA 10.8.3.3; everything before it was flushed already).
    pub fn flush_posted(&mut self, shared: &mut Shared, seq: u64) {
        self.sq.head = seq;
        self.retire_send(shared, seq, WcStatus::WrFlushErr);
        self.sq.head = seq + 1;
        let psn = self.req.next_psn;
        self.req.reset(psn, self.sq.head);
        self.comp.reset(psn);
    }

    /// Moves the QP to ERR and flushes every outstanding work request.
    pub fn enter_error(&mut self, shared: &mut Shared) {
        if self.resp.accept_placed {
            // Its peer must stop completing WRITEs locally (`engine/placed.rs`).
            shared.placed_changes.push_back(self.handle);
        }
        self.attr.qp_state = QpState::Err;
        self.attr.sq_draining = false;
        self.comp.stop_timer();
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
        self.resp.on_qp_error();
        // A QP on an SRQ takes no more WQEs from it (IBA 11.6.3.2).
        if self.srq.is_some() {
            shared
                .events
                .push_back(AsyncEvent::LastWqeReached(self.handle));
        }
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

    /// A UC send queue error (IBA 10.3.1, SQE): the failed WQE reports its
    /// status, the rest of the send queue is flushed; receiving goes on.
    pub fn enter_send_queue_error(&mut self, shared: &mut Shared) {
        self.attr.qp_state = QpState::Sqe;
        self.attr.sq_draining = false;
        self.flush_send_queue(shared);
    }
}
