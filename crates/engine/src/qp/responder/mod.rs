//! The responder: executes incoming requests and answers them (IBA 9.7.5.1).
//!
//! A new request goes through an ordered chain of checks — PSN here, then opcode
//! sequence, QP permissions, resources and length (`checks.rs`), then R_Key, access
//! and bounds where memory is reached (`execute.rs`) — and the first that fails
//! decides the answer, through one table ([`checks::Refusal::verdict`]): an RNR NAK
//! for a missing receive WQE, NAK Invalid Request, NAK Remote Access Error or NAK
//! Remote Operational Error. Duplicates are answered without being executed again
//! (`duplicates.rs`). Answers leave in PSN order through one queue (`answers.rs`).
//! With a requester doing selective repeat (`qp/selective.rs`), packets that arrive
//! ahead of the expected PSN are placed where they can be and committed in order
//! later (`ahead.rs`) instead of dropped after one sequence NAK.
//!
//! The responder owns its state (expected PSN, MSN, the message in progress, the
//! answer queue, the duplicate cache). What it works with besides — the QP's
//! attributes and receive queue, the device's memory and CQs — is lent to each call
//! as a [`RecvCtx`]; what the QP must do afterwards is returned as a [`Verdict`].

mod ahead;
mod answers;
pub use answers::AnswerQueue;
mod checks;
mod duplicates;
mod execute;

pub(crate) use answers::{AnswerCtx, Polled};

use crate::event::AsyncEvent;
use crate::node::Route;
use crate::qp::attr::QpAttr;
use crate::qp::queues::RecvQueue;
use crate::qp::selective::Reorder;
use crate::shared::Shared;
use crate::types::{CqHandle, PdHandle, QpHandle, QpState, SrqHandle};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use answers::Answers;
use checks::{Answer, Refusal};
use duplicates::ExecutedCache;
use softverbs_wire::ip::GRH_LEN;
use softverbs_wire::{AethSyndrome, NakCode, OpcodeInfo, Psn, Qpn, Rkey, RocePacket};

/// A multi-packet message being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InMessage {
    /// A SEND into the receive WQE the message claimed.
    Send { received: u32 },
    /// An RDMA WRITE described by the RETH of its first packet.
    Write {
        va: u64,
        rkey: Rkey,
        dma_len: u32,
        received: u32,
    },
}

/// A request packet as the responder reads it, its fields taken once.
pub(super) struct Request<'a> {
    pub pkt: &'a RocePacket<&'a [u8]>,
    pub info: &'static OpcodeInfo,
    pub psn: Psn,
    pub payload: &'a [u8],
}

impl<'a> Request<'a> {
    fn new(pkt: &'a RocePacket<&'a [u8]>) -> Self {
        Request {
            pkt,
            info: pkt.info(),
            psn: pkt.bth().psn(),
            payload: pkt.payload(),
        }
    }
}

/// Responder state of one QP.
pub(crate) struct Responder {
    /// PSN expected next.
    pub epsn: Psn,
    /// Same-host path negotiated with the peer: an RDMA WRITE Only without payload
    /// whose RETH names a longer range was placed by the requester already (see
    /// `engine/placed.rs`); it is checked, not copied.
    pub accept_placed: bool,
    /// Message sequence number: messages completed (24 bits).
    pub msn: u32,
    msg: Option<InMessage>,
    /// The PSN of the first packet of the message in progress.
    msg_first: Psn,
    /// Selective repeat: packets kept ahead of `epsn` (see `qp/selective.rs`).
    sr: Reorder,
    /// Selective repeat: the newest PSN that arrived ahead of `epsn`.
    highest_ahead: Option<Psn>,
    /// Selective repeat: the newest packet ahead that arrived and was not kept.
    dropped_ahead: Option<Psn>,
    /// Selective repeat: the expected PSN when dropped packets were last asked for.
    asked_from: Option<Psn>,
    /// A sequence-error or RNR NAK was sent; stay quiet until `epsn` arrives.
    nak_outstanding: bool,
    /// A refusal moved the QP to ERR: the answers queued before its NAK still go
    /// out, in PSN order, then the NAK.
    refused: bool,
    answers: Answers,
    executed: ExecutedCache,
}

/// What the responder works with besides its own state, lent for one call.
pub(crate) struct RecvCtx<'a> {
    pub shared: &'a mut Shared,
    /// The QP's receive queue (for a QP on an SRQ: the one WQE it claimed).
    pub rq: &'a mut RecvQueue,
    pub srq: Option<SrqHandle>,
    pub attr: &'a QpAttr,
    pub pd: PdHandle,
    pub recv_cq: CqHandle,
    pub qpn: Qpn,
    pub handle: QpHandle,
    pub mtu: u32,
    /// Set when a completion was lost to a full CQ.
    pub lost_completion: &'a mut bool,
}

impl RecvCtx<'_> {
    /// Delivers a receive completion.
    fn complete(&mut self, wc: WorkCompletion) {
        // Receive completions free nothing when polled: receive queue slots are
        // free once consumed.
        if !self.shared.complete(self.recv_cq, wc, None) {
            *self.lost_completion = true;
        }
    }
}

/// What the QP must do after the responder handled a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing: the responder did what was needed.
    Done,
    /// A refusal with an error NAK (queued): the QP goes to ERR, raising `event`.
    Fatal(AsyncEvent),
}

impl Responder {
    pub fn new(epsn: u32) -> Self {
        Responder {
            epsn: Psn::new(epsn),
            accept_placed: false,
            msn: 0,
            msg: None,
            msg_first: Psn::new(epsn),
            sr: Reorder::default(),
            highest_ahead: None,
            dropped_ahead: None,
            asked_from: None,
            nak_outstanding: false,
            refused: false,
            answers: Answers::default(),
            executed: ExecutedCache::default(),
        }
    }

    /// What selective repeat holds ahead of the expected PSN.
    pub fn held_ahead(&self) -> crate::qp::selective::HeldAhead {
        self.sr.usage()
    }

    /// How full the answer queue is.
    pub fn answer_queue(&self) -> AnswerQueue {
        self.answers.usage()
    }

    /// Sizes the duplicate cache and the answer queue once, so the data path does
    /// not allocate.
    pub fn reserve(&mut self, max_dest_rd_atomic: usize) {
        self.executed.reserve(max_dest_rd_atomic);
        self.answers.reserve(max_dest_rd_atomic);
    }

    /// The QP went to ERR: the message in progress is abandoned. After a refusal
    /// everything queued still goes out (the NAK last); otherwise only NAKs owed.
    pub fn on_qp_error(&mut self) {
        self.msg = None;
        self.sr.clear();
        self.highest_ahead = None;
        if !self.refused {
            self.answers.keep_naks();
        }
    }

    /// Whether answers wait to be sent.
    pub fn has_output(&self, state: QpState) -> bool {
        self.answers.has_output(state == QpState::Err)
    }

    /// A request packet of an RC QP in `state` (IBA 9.7.5.1).
    #[inline]
    pub fn handle_rc(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        state: QpState,
        pkt: &RocePacket<&[u8]>,
    ) -> Verdict {
        if !matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            ctx.shared.counters.drop_bad_state += 1;
            return Verdict::Done;
        }
        let psn = pkt.bth().psn();
        let epsn = self.epsn;
        // A softverbs requester offering selective repeat (see `qp/selective.rs`).
        if pkt.bth().resv7() != 0 && ctx.shared.config.selective_repeat {
            self.sr.activate();
        }
        // Check 1, PSN (IBA 9.7.5.1.1): expected, duplicate, or out of sequence.
        if psn != epsn {
            if psn.before(epsn) {
                self.handle_duplicate(ctx, pkt);
            } else if self.sr.active && !self.nak_outstanding {
                // Selective repeat relaxes 9.7.5.1.1 here: kept, not dropped. (Not
                // while an RNR NAK is outstanding: the requester comes back to the
                // refused packet and nothing behind it is placed meanwhile.)
                self.handle_ahead(ctx, &Request::new(pkt));
            } else if !self.nak_outstanding {
                self.nak_outstanding = true;
                self.answers
                    .push_nak(epsn, AethSyndrome::Nak(NakCode::PsnSequenceError), self.msn);
                ctx.shared.counters.nak_seq_sent += 1;
            } else {
                ctx.shared.counters.drop_out_of_sequence += 1;
            }
            return Verdict::Done;
        }
        // A requester past its READ/atomic limit, its answers not leaving: the
        // request is dropped unexecuted, as if lost (the queue stays bounded).
        if !self.answers.has_room_for_new() {
            ctx.shared.counters.drop_answer_queue_full += 1;
            return Verdict::Done;
        }
        // The packet itself replaces any copy kept ahead of it (and what was noted
        // of the WRITE it starts).
        if self.sr.count > 0 && self.sr.take(psn).is_some() {
            self.sr.drop_write(psn);
        }
        let executed = self.check_and_execute(ctx, &Request::new(pkt));
        // Packets kept ahead that are next now are committed in order.
        let executed = executed.and_then(|()| {
            if self.sr.count > 0 {
                self.commit_held(ctx)
            } else {
                Ok(())
            }
        });
        let refusal = match executed {
            Ok(()) => {
                self.nak_outstanding = false;
                if self.sr.active {
                    self.ask_for_dropped(ctx);
                }
                return Verdict::Done;
            }
            Err(refusal) => refusal,
        };
        // The packet refused: this one, or one kept ahead that was next.
        let psn = self.epsn;
        let verdict = refusal.verdict();
        if let Some(status) = verdict.recv_status {
            ctx.fail_recv(status);
            self.msg = None;
        }
        match verdict.answer {
            Answer::ReceiverNotReady => {
                self.nak_outstanding = true;
                let syndrome = AethSyndrome::RnrNak {
                    timer: ctx.attr.min_rnr_timer,
                };
                self.answers.push_nak(psn, syndrome, self.msn);
                ctx.shared.counters.rnr_nak_sent += 1;
                Verdict::Done
            }
            Answer::Nak(code) => {
                ctx.shared.counters.nak_error_sent += 1;
                // Answers still queued belong to requests executed before this one
                // (an atomic already changed memory): they go out ahead of the NAK,
                // in PSN order. Nothing else will be answered.
                self.refused = true;
                self.msg = None;
                self.answers
                    .push_nak(psn, AethSyndrome::Nak(code), self.msn);
                // IBA 11.6.3.1: the responder's affiliated error event.
                let event = match code {
                    NakCode::RemoteAccessError => AsyncEvent::QpAccessError(ctx.handle),
                    NakCode::RemoteOperationalError => AsyncEvent::QpFatal(ctx.handle),
                    _ => AsyncEvent::QpRequestError(ctx.handle),
                };
                Verdict::Fatal(event)
            }
        }
    }

    /// A UC request (IBA 9.8.3): no ACK or NAK ever. A packet whose PSN is not the
    /// expected one means packets were lost: the message in progress is dropped
    /// (its receive WQE stays at the head of the queue to be reused), and reception
    /// resumes at the next First or Only packet. A message that fails any check is
    /// dropped silently too.
    pub fn handle_uc(&mut self, ctx: &mut RecvCtx<'_>, state: QpState, pkt: &RocePacket<&[u8]>) {
        if !matches!(
            state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.shared.counters.drop_bad_state += 1;
            return;
        }
        let psn = pkt.bth().psn();
        if psn != self.epsn {
            self.msg = None;
            if !pkt.info().position.starts_message() {
                ctx.shared.counters.drop_out_of_sequence += 1;
                return;
            }
            self.epsn = psn;
        }
        if let Err(refusal) = self.check_and_execute(ctx, &Request::new(pkt)) {
            if let Some(status) = refusal.verdict().recv_status {
                ctx.fail_recv(status);
            }
            self.msg = None;
            self.epsn = psn.next();
            ctx.shared.counters.uc_messages_dropped += 1;
        }
        // Nothing is ever sent back on UC, whatever the packet asked for.
        self.answers.clear();
    }

    /// A UD SEND (IBA 9.8.4, 10.2.4): checked against the QP's Q_Key, placed after
    /// the 40-byte GRH area at the start of the receive buffer (IBA 11.4.1.1: verbs
    /// leave room for the GRH; for RoCEv2 it holds the IP header the message came
    /// with, rebuilt from `route`). Anything that does not fit is dropped silently,
    /// as UD is.
    pub fn handle_ud(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        state: QpState,
        pkt: &RocePacket<&[u8]>,
        route: Route,
    ) {
        if !matches!(
            state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.shared.counters.drop_bad_state += 1;
            return;
        }
        let Some(deth) = pkt.deth() else { return };
        if deth.qkey().0 != ctx.attr.qkey {
            ctx.shared.counters.ud_messages_dropped += 1;
            return;
        }
        let payload = pkt.payload();
        let total = GRH_LEN + payload.len();
        let grh = softverbs_wire::ip::grh(route.src, route.dst, pkt.as_bytes().len());
        let claimed = ctx.recv_claim();
        let placed = match ctx.recv_head().filter(|_| claimed) {
            None => {
                ctx.shared.counters.ud_messages_dropped += 1;
                return;
            }
            Some((wqe, _)) if total > wqe.length as usize => Err(WcStatus::LocLenErr),
            Some((_, sges)) => {
                let pd = ctx.pd;
                if ctx.shared.scatter(pd, sges, 0, &grh).is_ok()
                    && ctx
                        .shared
                        .scatter(pd, sges, GRH_LEN as u32, payload)
                        .is_ok()
                {
                    Ok(())
                } else {
                    Err(WcStatus::LocProtErr)
                }
            }
        };
        if let Err(status) = placed {
            if status == WcStatus::LocLenErr {
                ctx.shared.counters.ud_messages_dropped += 1;
            }
            ctx.fail_recv(status);
            self.msg = None;
            return;
        }
        let Some(wqe) = ctx.rq.pop() else {
            return;
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm_data: pkt.immdt().map(|h| h.imm()),
            qp_num: ctx.qpn,
            src_qp: deth.src_qp(),
            solicited: pkt.bth().solicited(),
            src_addr: Some(route.src),
            grh: true,
            ..WorkCompletion::default()
        };
        ctx.complete(wc);
    }

    /// Checks 2 to 8 and execution, for the packet with the expected PSN.
    #[inline]
    fn check_and_execute(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        req: &Request<'_>,
    ) -> Result<(), Refusal> {
        let info = req.info;
        self.check_opcode_sequence(info.kind, info.position)?;
        checks::check_operation_enabled(ctx, info.kind)?;
        checks::check_resources(ctx, info)?;
        self.check_length(ctx, req)?;
        self.execute(ctx, req)
    }
}
