//! Queue pairs: state, attributes, queues, and the three state machines of the
//! transport, as rxe splits them —
//! `requester` (builds request packets; normal, retransmit or RNR-wait mode),
//! `completer` (processes answers, runs the ACK timer, counts retries) and
//! `responder` (checks, executes and answers requests).
//!
//! Each machine owns its state. What it works with besides — the send or receive
//! queue, the attributes, the device's memory and CQs — is lent to each call, and
//! what the others must do as a result comes back as a verdict that the QP applies
//! here: the completer's tells the requester to move its cursor on or back or wait
//! out an RNR NAK, and the QP to fail a WQE; the responder's moves the QP to ERR.
//! `modify.rs` holds `modify_qp`, `lifecycle.rs` errors, flushes and completions.

pub mod attr;
pub(crate) mod completer;
mod lifecycle;
mod modify;
pub(crate) mod queues;
mod recovery;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod selective;
pub mod state;

pub use modify::ModifyQpError;
pub(crate) use recovery::RecoveryTiming;

use crate::node::Route;
use crate::shared::Shared;
use crate::time::Instant;
use crate::types::{QpHandle, QpState, QpType};
use crate::wc::WcStatus;
use attr::{QpAttr, QpInitAttr};
use completer::{CompleteCtx, Completer};
use queues::{RecvQueue, SendQueue};
use requester::{SendCtx, Sent, Skip};
use responder::{AnswerCtx, Polled, RecvCtx};
use selective::Peer;
use softverbs_wire::{Qpn, RocePacket, Transport};
use std::net::SocketAddr;

pub(crate) use requester::Requester;
pub(crate) use responder::Responder;

pub(crate) struct Qp {
    pub handle: QpHandle,
    pub qpn: Qpn,
    pub init: QpInitAttr,
    pub attr: QpAttr,
    pub sq: SendQueue,
    pub rq: RecvQueue,
    pub req: Requester,
    pub comp: Completer,
    pub resp: Responder,
    /// In the engine's transmit queue.
    pub scheduled: bool,
    /// The deadline this QP has in the engine's timer heap.
    pub timer_entry: Option<Instant>,
    /// Most unacknowledged PSNs in flight.
    pub req_window: u32,
    /// Bytes of READ responses that may be asked for beyond the in-flight cap
    /// (`EngineConfig::read_budget`).
    pub read_budget: u32,
    /// The port's MTU (UD messages are at most this long).
    pub port_mtu: crate::types::Mtu,
    /// The shared receive queue this QP takes receive WQEs from, if any.
    pub srq: Option<crate::types::SrqHandle>,
    /// A completion of this QP was lost to a full CQ: the QP goes to ERR once the
    /// operation under way is over (see `Engine::after_activity`).
    pub lost_completion: bool,
    /// Request packets in flight, as last counted in the engine's total.
    pub inflight: u32,
    /// In the engine's list of QPs waiting for room under the device window.
    pub device_blocked: bool,
    /// Communication Established was reported since the QP last entered RTR.
    pub comm_established: bool,
    /// The driver negotiated the same-host path with the peer (`engine/placed.rs`).
    pub same_host: bool,
    /// In the engine's list of QPs whose held WQEs may be placed now
    /// (`Engine::poll_held_ready`).
    pub held_queued: bool,
}

impl Qp {
    pub fn new(
        handle: QpHandle,
        qpn: Qpn,
        init: QpInitAttr,
        req_window: u32,
        read_budget: u32,
        timing: RecoveryTiming,
        selective_repeat: bool,
    ) -> Qp {
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
            comp: Completer::new(timing, selective_repeat),
            resp: Responder::new(0),
            scheduled: false,
            timer_entry: None,
            req_window,
            read_budget,
            port_mtu: crate::types::Mtu::Mtu4096,
            srq: None,
            lost_completion: false,
            inflight: 0,
            device_blocked: false,
            comm_established: false,
            same_host: false,
            held_queued: false,
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

    /// Whether the QP type is one this engine implements.
    pub fn supported(qp_type: QpType) -> bool {
        matches!(qp_type, QpType::Rc | QpType::Uc | QpType::Ud)
    }

    /// The transport this QP's packets use.
    pub fn transport(&self) -> Transport {
        match self.init.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        }
    }

    // ----- lending the machines what they work with -----

    #[inline]
    fn send_ctx<'a>(&'a mut self, shared: &'a mut Shared) -> (&'a mut Requester, SendCtx<'a>) {
        let window = self
            .comp
            .window(self.req_window, self.read_budget / self.mtu());
        let (state, transport, mtu) = (self.state(), self.transport(), self.mtu());
        let offer_sr = transport == Transport::Rc
            && shared.config.selective_repeat
            && self.comp.sr.peer != Peer::Plain;
        let ctx = SendCtx {
            offer_sr,
            board: &self.comp.sr,
            shared,
            sq: &mut self.sq,
            attr: &self.attr,
            state,
            transport,
            pd: self.init.pd,
            handle: self.handle,
            qpn: self.qpn,
            mtu,
            window,
        };
        (&mut self.req, ctx)
    }

    #[inline]
    fn complete_ctx<'a>(
        &'a mut self,
        shared: &'a mut Shared,
    ) -> (&'a mut Completer, CompleteCtx<'a>) {
        let mtu = self.mtu();
        let ctx = CompleteCtx {
            shared,
            sq: &mut self.sq,
            attr: &self.attr,
            pd: self.init.pd,
            mtu,
            next_psn: self.req.next_psn,
            frontier: self.req.frontier(),
            started: self.req.started,
            rnr_waiting: matches!(self.req.mode(), requester::Mode::RnrWait { .. }),
        };
        (&mut self.comp, ctx)
    }

    #[inline]
    fn recv_ctx<'a>(&'a mut self, shared: &'a mut Shared) -> (&'a mut Responder, RecvCtx<'a>) {
        let mtu = self.mtu();
        let ctx = RecvCtx {
            shared,
            rq: &mut self.rq,
            srq: self.srq,
            attr: &self.attr,
            pd: self.init.pd,
            recv_cq: self.init.recv_cq,
            qpn: self.qpn,
            handle: self.handle,
            mtu,
            lost_completion: &mut self.lost_completion,
        };
        (&mut self.resp, ctx)
    }

    // ----- the requester -----

    /// Whether the requester may send under the device window: there is room, or
    /// it has nothing in flight (it is never starved), or it resends.
    #[inline]
    pub fn device_room(&self, inflight: u64, window: u32) -> bool {
        inflight < u64::from(window)
            || self.inflight == 0
            || self.req.resending(&self.sq)
            || self.req.probing()
    }

    /// Request PSNs sent and not yet acknowledged.
    pub fn outstanding(&self) -> u32 {
        let (una, frontier) = (self.comp.una, self.req.frontier());
        if self.transport() == Transport::Rc && una.before(frontier) {
            una.distance_to(frontier)
        } else {
            0
        }
    }

    /// Whether the requester has a packet it may send now.
    #[inline]
    pub fn requester_ready(&self) -> bool {
        let window = self
            .comp
            .window(self.req_window, self.read_budget / self.mtu());
        self.req
            .ready_with(self.state(), &self.sq, &self.attr, window)
    }

    /// Carries out the local operations (memory window binds, local invalidates) at
    /// the send cursor if the requester may start them now: they take effect as soon
    /// as the send queue reaches them, not at the next transmit.
    pub fn run_local_ops_now(&mut self, shared: &mut Shared) {
        if !self.req.on_local_op(&self.sq) {
            return;
        }
        let (req, mut ctx) = self.send_ctx(shared);
        if req.ready(&ctx) {
            let sent = req.run_local_ops(&mut ctx);
            self.apply_sent(shared, sent);
        }
    }

    /// Builds the next request packet into `buf` (unsealed); returns its length and
    /// destination.
    pub fn poll_request(
        &mut self,
        shared: &mut Shared,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        let (req, mut ctx) = self.send_ctx(shared);
        if !req.ready(&ctx) {
            return None;
        }
        let sent = if req.on_local_op(ctx.sq) {
            // Carry out local operations in the way, then go on to a packet.
            let sent = req.run_local_ops(&mut ctx);
            if !self.apply_sent(shared, sent) || !self.requester_ready() {
                return None;
            }
            let (req, mut ctx) = self.send_ctx(shared);
            req.poll_ready(&mut ctx, buf)
        } else {
            req.poll_ready(&mut ctx, buf)
        };
        match sent {
            Sent::Packet {
                len,
                dst,
                psn,
                ends_wqe,
                fresh,
            } => {
                if self.transport() == Transport::Rc {
                    let in_flight =
                        self.comp
                            .timer_in_flight(&self.sq, self.req.started, self.req.frontier());
                    self.comp
                        .on_request_sent(now, self.attr.timeout, psn, fresh, in_flight);
                } else {
                    // UC and UD: nothing comes back; the WQE is done once its last
                    // packet is sent.
                    self.comp.on_unreliable_sent(psn);
                    if let Some(seq) = ends_wqe {
                        self.sq.get_mut(seq).done = Some(WcStatus::Success);
                        self.retire(shared);
                    }
                }
                Some((len, dst))
            }
            other => {
                self.apply_sent(shared, other);
                None
            }
        }
    }

    /// Applies what the requester did besides sending; false if the send queue failed.
    fn apply_sent(&mut self, shared: &mut Shared, sent: Sent) -> bool {
        match sent {
            Sent::LocalOpsDone => {
                self.retire(shared);
                true
            }
            Sent::Failed { seq, status } => {
                self.fail_wqe(shared, seq, status);
                false
            }
            Sent::Packet { .. } | Sent::Nothing => true,
        }
    }

    /// Ends a WQE with an error: the QP goes to ERR and the rest is flushed. Earlier
    /// WQEs that were transport-complete keep their status; the failed one reports
    /// its error; everything after is flushed. A UC or UD QP only loses its send
    /// queue (SQE); an RC QP goes to ERR.
    pub fn fail_wqe(&mut self, shared: &mut Shared, seq: u64, status: WcStatus) {
        if seq < self.sq.tail {
            self.sq.get_mut(seq).done = Some(status);
        }
        if self.init.qp_type != QpType::Rc {
            self.enter_send_queue_error(shared);
        } else {
            self.enter_error(shared);
        }
    }

    /// Retires finished WQEs from the head of the send queue, in order.
    pub fn retire(&mut self, shared: &mut Shared) {
        while self.sq.head < self.req.started {
            let seq = self.sq.head;
            let Some(status) = self.sq.get(seq).done else {
                break;
            };
            self.retire_send(shared, seq, status);
            self.sq.head += 1;
        }
        self.req.retired(self.sq.head);
        self.check_drained(shared);
    }

    // ----- the completer -----

    /// A response packet (ACK, atomic ACK, READ response) for this QP's requester.
    pub fn handle_response(&mut self, shared: &mut Shared, now: Instant, pkt: &RocePacket<&[u8]>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            shared.counters.drop_bad_state += 1;
            return;
        }
        let (comp, mut ctx) = self.complete_ctx(shared);
        let verdict = comp.on_response(&mut ctx, now, pkt);
        self.apply_verdict(shared, verdict);
        self.retire(shared);
    }

    /// A timer of this QP may have expired.
    pub fn handle_timeout(&mut self, shared: &mut Shared, now: Instant) {
        if self.req.on_timer(now) {
            // The RNR wait is over: sending resumes from the refused packet.
            self.comp.stop_timer();
            let skipped = self.req.skip_held(&self.sq, &self.comp.sr, self.comp.una);
            shared.counters.sr_skipped += u64::from(skipped);
        }
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            if self.comp.deadline().is_some_and(|d| d <= now) {
                self.comp.stop_timer();
            }
            return;
        }
        let (comp, mut ctx) = self.complete_ctx(shared);
        let verdict = comp.on_timeout(&mut ctx, now);
        self.apply_verdict(shared, verdict);
    }

    /// Carries out a completer verdict: the requester goes back (or waits out an
    /// RNR NAK first), or moves its cursor past what was acknowledged; a WQE fails.
    fn apply_verdict(&mut self, shared: &mut Shared, v: completer::Verdict) {
        for _ in 0..v.read_atomic_done {
            self.req.read_atomic_finished();
        }
        match (v.rewind, v.rnr_until) {
            (Some(psn), Some(deadline)) => self.req.wait_rnr(&self.sq, psn, deadline),
            (Some(psn), None) => self.req.rewind(&self.sq, psn),
            _ => {}
        }
        if v.probe {
            // New data if the requester has some it could send but for the cap
            // (RFC 8985 7.3), else the newest packet again.
            let new_data = self.req.probe_with_new_data(&self.sq, self.comp.una);
            if !(new_data && self.requester_ready()) {
                self.req.probe(&self.sq, self.comp.una);
            }
        }
        if let Some((from, until)) = v.selective {
            self.req.walk(&self.sq, from, until);
        }
        if v.resend_oldest {
            self.req.resend_oldest(&self.sq, self.comp.una);
        }
        // After a go-back the cursor is at or past una; otherwise it may have been
        // left behind PSNs acknowledged since.
        if v.progress && self.req.skip_acknowledged(&self.sq, self.comp.una) == Skip::MovedToUna {
            self.comp.forget_rewind();
        }
        let skipped = self.req.skip_held(&self.sq, &self.comp.sr, self.comp.una);
        shared.counters.sr_skipped += u64::from(skipped);
        if let Some((seq, status)) = v.fail {
            self.fail_wqe(shared, seq, status);
        }
    }

    /// The earliest timer this QP has armed.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.comp.deadline(), self.req.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ----- the responder -----

    /// A request packet for this QP's responder, that travelled `route`.
    pub fn handle_request(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>, route: Route) {
        let state = self.state();
        let transport = self.transport();
        let (resp, mut ctx) = self.recv_ctx(shared);
        match transport {
            Transport::Uc => resp.handle_uc(&mut ctx, state, pkt),
            Transport::Ud => resp.handle_ud(&mut ctx, state, pkt, route),
            _ => {
                if let responder::Verdict::Fatal(event) = resp.handle_rc(&mut ctx, state, pkt) {
                    shared.events.push_back(event);
                    self.enter_error(shared);
                }
            }
        }
    }

    /// Builds the next answer packet into `buf` (unsealed); returns its length.
    pub fn poll_response(&mut self, shared: &mut Shared, buf: &mut [u8]) -> Option<usize> {
        self.peer()?;
        loop {
            let ctx = AnswerCtx {
                shared: &mut *shared,
                dest_qp: Qpn::new(self.attr.dest_qp_num),
                mtu: self.mtu(),
                pd: self.init.pd,
                handle: self.handle,
                in_error: self.state() == QpState::Err,
            };
            match self.resp.poll_answer(ctx, buf)? {
                Polled::Packet(len) => return Some(len),
                Polled::Fatal(event) => {
                    shared.events.push_back(event);
                    self.enter_error(shared);
                }
            }
        }
    }
}
