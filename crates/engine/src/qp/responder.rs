//! The responder: executes incoming requests and answers them (IBA 9.7.5.1).
//!
//! A new request goes through an ordered chain of checks — PSN, opcode sequence,
//! QP permissions, resources, length, R_Key, access, bounds — and the first that
//! fails decides the answer, named after its IBA error class: an RNR NAK for a
//! missing receive WQE, NAK Invalid Request, NAK Remote Access Error or NAK Remote
//! Operational Error. Duplicates are answered without being executed again: SEND
//! and WRITE are re-ACKed, READ responses are regenerated from memory, atomic
//! results are replayed from a cache sized by max_dest_rd_atomic.
//!
//! Answers leave in PSN order through one queue, so an ACK never overtakes the
//! READ responses before it.

use super::Qp;
use crate::event::AsyncEvent;
use crate::mr::KeyError;
use crate::node::Route;
use crate::shared::Shared;
use crate::types::{AccessFlags, QpState};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use softverbs_wire::ip::GRH_LEN;
use softverbs_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, BthRepr, HeaderSet, NakCode, OpKind, Opcode,
    PacketRepr, Position, Psn, Qpn, Rkey, RocePacket, Transport,
};
use std::collections::VecDeque;

/// A multi-packet message being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InMessage {
    /// A SEND into the receive WQE at the head of the RQ.
    Send { received: u32 },
    /// An RDMA WRITE described by the RETH of its first packet.
    Write {
        va: u64,
        rkey: Rkey,
        dma_len: u32,
        received: u32,
    },
}

/// An answer waiting to be sent, in PSN order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outgoing {
    Ack {
        psn: Psn,
        msn: u32,
    },
    Nak {
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    },
    /// READ responses still to send: the next one has `psn` and reads `va`.
    Read {
        psn: Psn,
        va: u64,
        rkey: Rkey,
        remaining: u32,
        first: bool,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// A READ or atomic the responder executed, kept to answer duplicates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Executed {
    first_psn: Psn,
    npsn: u32,
    /// The original value an atomic returned; `None` for READs.
    atomic_orig: Option<u64>,
    /// A READ's address, R_Key and length, which a duplicate must repeat.
    read: Option<(u64, Rkey, u32)>,
}

/// Responder state of one QP.
pub(crate) struct Responder {
    /// PSN expected next.
    pub epsn: Psn,
    /// Message sequence number: messages completed (24 bits).
    pub msn: u32,
    pub msg: Option<InMessage>,
    /// A sequence-error or RNR NAK was sent; stay quiet until `epsn` arrives.
    pub nak_outstanding: bool,
    pub out: VecDeque<Outgoing>,
    executed: VecDeque<Executed>,
    executed_cap: usize,
}

/// Why a new request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Receiver not ready: no receive WQE.
    Rnr,
    /// An error NAK; the responder QP goes to ERR.
    Nak(NakCode),
}

impl Responder {
    pub fn new(epsn: u32) -> Self {
        Responder {
            epsn: Psn::new(epsn),
            msn: 0,
            msg: None,
            nak_outstanding: false,
            out: VecDeque::new(),
            executed: VecDeque::new(),
            executed_cap: 0,
        }
    }

    /// Sizes the duplicate cache and the answer queue once, so the data path does
    /// not allocate.
    pub fn reserve(&mut self, max_dest_rd_atomic: usize) {
        self.executed_cap = max_dest_rd_atomic;
        self.executed.reserve(max_dest_rd_atomic);
        self.out.reserve(2 * max_dest_rd_atomic + 8);
    }

    pub fn abort_message(&mut self) {
        self.msg = None;
        self.out.retain(|o| matches!(o, Outgoing::Nak { .. }));
    }

    /// Queues the responses to an RDMA READ of `dma_len` bytes at `va`, from `psn` on.
    fn queue_read(&mut self, psn: Psn, va: u64, rkey: Rkey, dma_len: u32) {
        let msn = self.msn;
        self.out.push_back(Outgoing::Read {
            psn,
            va,
            rkey,
            remaining: dma_len,
            first: true,
            msn,
        });
    }

    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Outgoing::Ack { psn: p, msn: m }) = self.out.back_mut() {
            // Coalesce: one ACK covers everything before it (IBA 9.7.5.1.6).
            *p = psn;
            *m = msn;
            return;
        }
        self.out.push_back(Outgoing::Ack { psn, msn });
    }

    fn remember(&mut self, e: Executed) {
        // The cap may have been lowered (SQD -> SQD): trim down to it.
        while self.executed.len() >= self.executed_cap.max(1) {
            self.executed.pop_front();
        }
        if self.executed_cap == 0 {
            return;
        }
        self.executed.push_back(e);
    }

    pub fn has_output(&self, state: QpState) -> bool {
        if state == QpState::Err {
            self.out.iter().any(|o| matches!(o, Outgoing::Nak { .. }))
        } else {
            !self.out.is_empty()
        }
    }
}

/// Whether a duplicate READ request at `psn` for `dma_len` bytes at `va` through
/// `rkey` asks for the rest of `original` from `psn` on: the same key, the address
/// advanced by the packets before `psn`, and the rest of the length.
fn repeats_read(
    original: &Executed,
    psn: Psn,
    mtu: u32,
    va: u64,
    rkey: Rkey,
    dma_len: u32,
) -> bool {
    let Some((orig_va, orig_rkey, orig_len)) = original.read else {
        return false;
    };
    let skipped = u64::from(original.first_psn.distance_to(psn)) * u64::from(mtu);
    rkey == orig_rkey
        && u64::from(dma_len) + skipped == u64::from(orig_len).max(skipped)
        && va == orig_va.wrapping_add(skipped)
}

fn key_error_nak(_: KeyError) -> Refusal {
    // R_Key, PD, access and bounds violations are all Remote Access Errors
    // (IBA 9.7.5.1.3, C9-88).
    Refusal::Nak(NakCode::RemoteAccessError)
}

impl Qp {
    /// A request packet arrived for this QP's responder.
    pub fn handle_request(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>, route: Route) {
        match self.transport() {
            Transport::Uc => return self.handle_uc_request(shared, pkt),
            Transport::Ud => return self.handle_ud_request(shared, pkt, route),
            _ => {}
        }
        if !matches!(self.state(), QpState::Rtr | QpState::Rts | QpState::Sqd) {
            shared.counters.drop_bad_state += 1;
            return;
        }
        let psn = pkt.bth().psn();
        let epsn = self.resp.epsn;
        // Check 1, PSN (IBA 9.7.5.1.1): expected, duplicate, or out of sequence.
        if psn != epsn {
            if psn.before(epsn) {
                self.handle_duplicate(shared, pkt);
            } else if !self.resp.nak_outstanding {
                self.resp.nak_outstanding = true;
                let msn = self.resp.msn;
                self.resp.out.push_back(Outgoing::Nak {
                    psn: epsn,
                    syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
                    msn,
                });
                shared.counters.nak_seq_sent += 1;
            } else {
                shared.counters.drop_out_of_sequence += 1;
            }
            return;
        }
        match self.execute(shared, pkt) {
            Ok(()) => self.resp.nak_outstanding = false,
            Err(Refusal::Rnr) => {
                self.resp.nak_outstanding = true;
                let (msn, timer) = (self.resp.msn, self.attr.min_rnr_timer);
                self.resp.out.push_back(Outgoing::Nak {
                    psn,
                    syndrome: AethSyndrome::RnrNak { timer },
                    msn,
                });
                shared.counters.rnr_nak_sent += 1;
            }
            Err(Refusal::Nak(code)) => {
                shared.counters.nak_error_sent += 1;
                let event = match code {
                    NakCode::RemoteAccessError => AsyncEvent::QpAccessError(self.handle),
                    NakCode::RemoteOperationalError => AsyncEvent::QpFatal(self.handle),
                    _ => AsyncEvent::QpRequestError(self.handle),
                };
                shared.events.push_back(event);
                // Answers still queued belong to requests executed before this one
                // (an atomic already changed memory): they go out ahead of the NAK,
                // in PSN order. Nothing else will be answered.
                let owed = std::mem::take(&mut self.resp.out);
                self.enter_error(shared);
                self.resp.out = owed;
                let msn = self.resp.msn;
                self.resp.out.push_back(Outgoing::Nak {
                    psn,
                    syndrome: AethSyndrome::Nak(code),
                    msn,
                });
            }
        }
    }

    /// A UD SEND (IBA 9.8.4, 10.2.4): checked against the QP's Q_Key, placed after
    /// the 40-byte GRH area at the start of the receive buffer (IBA 11.4.1.1:
    /// verbs leave room for the GRH; for RoCEv2 it holds the IP header the
    /// message came with). Anything that does not fit is dropped silently, as
    /// UD is.
    fn handle_ud_request(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>, route: Route) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            shared.counters.drop_bad_state += 1;
            return;
        }
        let Some(deth) = pkt.deth() else { return };
        if deth.qkey().0 != self.attr.qkey {
            shared.counters.ud_messages_dropped += 1;
            return;
        }
        let payload = pkt.payload();
        let total = GRH_LEN + payload.len();
        let grh = softverbs_wire::ip::grh(route.src, route.dst, pkt.as_bytes().len());
        let pd = self.init.pd;
        let claimed = self.recv_claim(shared);
        let placed = match self.recv_head().filter(|_| claimed) {
            None => {
                shared.counters.ud_messages_dropped += 1;
                return;
            }
            Some((wqe, _)) if total > wqe.length as usize => Err(WcStatus::LocLenErr),
            Some((_, sges)) => {
                if shared.scatter(pd, sges, 0, &grh).is_ok()
                    && shared.scatter(pd, sges, GRH_LEN as u32, payload).is_ok()
                {
                    Ok(())
                } else {
                    Err(WcStatus::LocProtErr)
                }
            }
        };
        if let Err(status) = placed {
            if status == WcStatus::LocLenErr {
                shared.counters.ud_messages_dropped += 1;
            }
            self.fail_recv(shared, status);
            return;
        }
        let Some(wqe) = self.recv_take() else {
            return;
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: total as u32,
            imm_data: pkt.immdt().map(|h| h.imm()),
            qp_num: self.qpn,
            src_qp: deth.src_qp(),
            solicited: pkt.bth().solicited(),
            src_addr: Some(route.src),
            grh: true,
            ..WorkCompletion::default()
        };
        self.complete(shared, self.init.recv_cq, wc, None);
    }

    /// A UC request (IBA 9.8.3): no ACK or NAK ever. A packet whose PSN is not the
    /// expected one means packets were lost: the message in progress is
    /// dropped (its receive WQE stays at the head of the queue to be reused),
    /// and reception resumes at the next First or Only packet. A message that
    /// fails any check is dropped silently too.
    fn handle_uc_request(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>) {
        if !matches!(
            self.state(),
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            shared.counters.drop_bad_state += 1;
            return;
        }
        let psn = pkt.bth().psn();
        if psn != self.resp.epsn {
            self.resp.msg = None;
            if !pkt.info().position.starts_message() {
                shared.counters.drop_out_of_sequence += 1;
                return;
            }
            self.resp.epsn = psn;
        }
        if self.execute(shared, pkt).is_err() {
            self.resp.msg = None;
            self.resp.epsn = psn.next();
            shared.counters.uc_messages_dropped += 1;
        }
        // Nothing is ever sent back on UC, whatever the packet asked for.
        self.resp.out.clear();
    }

    /// Checks 2 onwards, then execution, for the packet with the expected PSN.
    fn execute(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>) -> Result<(), Refusal> {
        let info = pkt.info();
        let (kind, pos) = (info.kind, info.position);
        let psn = pkt.bth().psn();
        let mtu = self.mtu();
        let payload = pkt.payload();
        let len = payload.len() as u32;

        // Check 2, opcode sequence (IBA 9.7.5.1.2): a message's packets arrive
        // first, middle..., last; nothing else may interleave.
        let continues = matches!(pos, Position::Middle | Position::Last);
        match (self.resp.msg, continues) {
            (Some(InMessage::Send { .. }), true) if kind == OpKind::Send => {}
            (Some(InMessage::Write { .. }), true) if kind == OpKind::RdmaWrite => {}
            (None, false) => {}
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }

        // Check 3, the QP allows the operation (IBA 10.2.4.2, qp_access_flags).
        let needed = match kind {
            OpKind::RdmaWrite => AccessFlags::REMOTE_WRITE,
            OpKind::RdmaReadRequest => AccessFlags::REMOTE_READ,
            OpKind::CompareSwap | OpKind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
            _ => AccessFlags::EMPTY,
        };
        if !self.attr.qp_access_flags.contains(needed) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }

        // Check 4, resources: a receive WQE for messages that consume one
        // (RNR NAK, IBA 9.7.5.1.4); room for READ/atomic state.
        let consumes_wqe_now = info.needs_recv_wqe
            && match kind {
                OpKind::Send => pos.starts_message(),
                _ => pos.ends_message(),
            };
        if consumes_wqe_now && !self.recv_claim(shared) {
            return Err(Refusal::Rnr);
        }
        if matches!(
            kind,
            OpKind::RdmaReadRequest | OpKind::CompareSwap | OpKind::FetchAdd
        ) && self.attr.max_dest_rd_atomic == 0
        {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }

        // Check 5, length (IBA 9.7.5.1.5): first and middle packets carry exactly
        // one MTU, last 1..=MTU, only 0..=MTU; messages fit their target.
        let len_ok = match pos {
            Position::First | Position::Middle => len == mtu,
            Position::Last => (1..=mtu).contains(&len),
            Position::Only => len <= mtu,
        };
        if info.has_payload && !len_ok {
            return Err(self.refuse_length(shared, kind));
        }
        match kind {
            OpKind::Send => {
                let received = match self.resp.msg {
                    Some(InMessage::Send { received }) => received,
                    _ => 0,
                };
                let capacity = self.recv_head().map_or(0, |(w, _)| w.length);
                if received.saturating_add(len) > capacity {
                    return Err(self.refuse_length(shared, kind));
                }
            }
            OpKind::RdmaWrite => {
                let (dma_len, received) = match (self.resp.msg, pkt.reth()) {
                    (
                        Some(InMessage::Write {
                            dma_len, received, ..
                        }),
                        _,
                    ) => (dma_len, received),
                    (None, Some(reth)) => (reth.dma_len(), 0),
                    _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
                };
                let total = received.saturating_add(len);
                let fits = if pos.ends_message() {
                    total == dma_len
                } else {
                    total < dma_len
                };
                if !fits {
                    return Err(self.refuse_length(shared, kind));
                }
            }
            OpKind::RdmaReadRequest => {
                let dma_len = pkt.reth().map_or(0, |r| r.dma_len());
                if dma_len > shared.config.max_msg_size {
                    return Err(Refusal::Nak(NakCode::InvalidRequest));
                }
                // Its responses must take less than half the PSN space, or its own
                // PSN would stop looking like a duplicate (IBA 9.7.1).
                if super::requester::packets_for(dma_len, mtu) >= Psn::HALF_SPACE {
                    return Err(Refusal::Nak(NakCode::InvalidRequest));
                }
            }
            // Atomics need an 8-byte aligned address (IBA 9.4.5).
            OpKind::CompareSwap | OpKind::FetchAdd
                if pkt.atomic_eth().is_some_and(|a| a.va() % 8 != 0) =>
            {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            _ => {}
        }

        // Checks 6-8, R_Key, access rights, bounds (IBA 9.7.5.1.3 and 10.6.3).
        let pd = self.init.pd;
        match kind {
            OpKind::RdmaWrite => {
                let (va, rkey, received) = match (self.resp.msg, pkt.reth()) {
                    (
                        Some(InMessage::Write {
                            va, rkey, received, ..
                        }),
                        _,
                    ) => (va, rkey, received),
                    (_, Some(reth)) => (reth.va(), reth.rkey(), 0),
                    _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
                };
                if len > 0 || pos.starts_message() && pkt.reth().is_some_and(|r| r.dma_len() > 0) {
                    let dma_len = pkt.reth().map_or(len, |r| r.dma_len());
                    let check_len = if pos.starts_message() { dma_len } else { len };
                    let at = va.wrapping_add(u64::from(received));
                    let mem = shared
                        .mrs
                        .resolve_remote(
                            rkey.0,
                            pd,
                            self.handle,
                            at,
                            check_len as usize,
                            AccessFlags::REMOTE_WRITE,
                        )
                        .map_err(key_error_nak)?;
                    // Execute: place the payload.
                    if !mem.write(0, payload) {
                        return Err(Refusal::Nak(NakCode::RemoteAccessError));
                    }
                }
                let dma_len = match (self.resp.msg, pkt.reth()) {
                    (Some(InMessage::Write { dma_len, .. }), _) => dma_len,
                    (_, Some(r)) => r.dma_len(),
                    _ => len,
                };
                self.resp.msg = Some(InMessage::Write {
                    va,
                    rkey,
                    dma_len,
                    received: received + len,
                });
                if pos.ends_message() {
                    self.resp.msg = None;
                    if let Some(imm) = pkt.immdt().map(|h| h.imm()) {
                        self.complete_recv(
                            shared,
                            WcOpcode::RecvRdmaWithImm,
                            dma_len,
                            Some(imm),
                            None,
                            pkt,
                        );
                    }
                    self.message_done();
                }
            }
            OpKind::Send => {
                let inv = pkt.ieth().map(|h| h.rkey());
                if let Some(rkey) = inv {
                    // The key must name memory this PD allows peers to invalidate.
                    // (or a type 2 memory window bound through this QP).
                    if !shared.mrs.may_invalidate_remotely(rkey.0, pd, self.handle) {
                        return Err(Refusal::Nak(NakCode::InvalidRequest));
                    }
                }
                let received = match self.resp.msg {
                    Some(InMessage::Send { received }) => received,
                    _ => 0,
                };
                let (_, sges) = self.recv_head().ok_or(Refusal::Rnr)?;
                if shared.scatter(pd, sges, received, payload).is_err() {
                    // The receive buffer is not writable: a responder-side error
                    // (IBA 9.7.5.1.7, NAK Remote Operational Error).
                    self.fail_recv(shared, WcStatus::LocProtErr);
                    return Err(Refusal::Nak(NakCode::RemoteOperationalError));
                }
                let total = received + len;
                if pos.ends_message() {
                    self.resp.msg = None;
                    if let Some(rkey) = inv {
                        shared.mrs.invalidate_remotely(rkey.0);
                    }
                    let imm = pkt.immdt().map(|h| h.imm());
                    self.complete_recv(shared, WcOpcode::Recv, total, imm, inv, pkt);
                    self.message_done();
                } else {
                    self.resp.msg = Some(InMessage::Send { received: total });
                }
            }
            OpKind::RdmaReadRequest => {
                let Some(reth) = pkt.reth() else {
                    return Err(Refusal::Nak(NakCode::InvalidRequest));
                };
                let (va, rkey, dma_len) = (reth.va(), reth.rkey(), reth.dma_len());
                if dma_len > 0 {
                    shared
                        .mrs
                        .resolve_remote(
                            rkey.0,
                            pd,
                            self.handle,
                            va,
                            dma_len as usize,
                            AccessFlags::REMOTE_READ,
                        )
                        .map_err(key_error_nak)?;
                }
                let npsn = super::requester::packets_for(dma_len, mtu);
                self.resp.remember(Executed {
                    first_psn: psn,
                    npsn,
                    atomic_orig: None,
                    read: Some((va, rkey, dma_len)),
                });
                self.message_done_with(npsn);
                self.resp.queue_read(psn, va, rkey, dma_len);
                return Ok(());
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let Some(a) = pkt.atomic_eth() else {
                    return Err(Refusal::Nak(NakCode::InvalidRequest));
                };
                let mem = shared
                    .mrs
                    .resolve_remote(
                        a.rkey().0,
                        pd,
                        self.handle,
                        a.va(),
                        8,
                        AccessFlags::REMOTE_ATOMIC,
                    )
                    .map_err(key_error_nak)?;
                let orig = if kind == OpKind::CompareSwap {
                    mem.compare_swap(a.compare(), a.swap_add())
                } else {
                    mem.fetch_add(a.swap_add())
                }
                .ok_or(Refusal::Nak(NakCode::InvalidRequest))?;
                self.resp.remember(Executed {
                    first_psn: psn,
                    npsn: 1,
                    atomic_orig: Some(orig),
                    read: None,
                });
                self.message_done_with(1);
                let msn = self.resp.msn;
                self.resp.out.push_back(Outgoing::Atomic { psn, orig, msn });
                return Ok(());
            }
            _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        }
        self.resp.epsn = psn.next();
        if pkt.bth().ack_req() {
            self.resp.push_ack(psn);
        }
        Ok(())
    }

    /// Length error (NAK Invalid Request); a SEND's receive WQE completes with
    /// LOC_LEN_ERR.
    fn refuse_length(&mut self, shared: &mut Shared, kind: OpKind) -> Refusal {
        if kind == OpKind::Send {
            self.fail_recv(shared, WcStatus::LocLenErr);
        }
        Refusal::Nak(NakCode::InvalidRequest)
    }

    fn fail_recv(&mut self, shared: &mut Shared, status: WcStatus) {
        if let Some(wqe) = self.recv_take() {
            let wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..WorkCompletion::default()
            };
            self.complete(shared, self.init.recv_cq, wc, None);
        }
        self.resp.msg = None;
    }

    fn complete_recv(
        &mut self,
        shared: &mut Shared,
        opcode: WcOpcode,
        byte_len: u32,
        imm_data: Option<u32>,
        invalidated_rkey: Option<Rkey>,
        pkt: &RocePacket<&[u8]>,
    ) {
        let Some(wqe) = self.recv_take() else {
            return;
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len,
            imm_data,
            invalidated_rkey,
            qp_num: self.qpn,
            src_qp: Qpn::new(self.attr.dest_qp_num),
            solicited: pkt.bth().solicited(),
            // Connected QPs know their peer; only UD completions say where
            // the message came from.
            src_addr: None,
            grh: false,
        };
        self.complete(shared, self.init.recv_cq, wc, None);
    }

    fn message_done(&mut self) {
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
    }

    /// A READ or atomic was accepted: it takes `npsn` PSNs.
    fn message_done_with(&mut self, npsn: u32) {
        self.message_done();
        self.resp.epsn = self.resp.epsn.add(npsn);
    }

    /// A request with a PSN before the expected one (IBA 9.7.5.1.1, duplicates).
    fn handle_duplicate(&mut self, shared: &mut Shared, pkt: &RocePacket<&[u8]>) {
        shared.counters.duplicate_requests += 1;
        let psn = pkt.bth().psn();
        match pkt.info().kind {
            OpKind::RdmaReadRequest => {
                let Some(reth) = pkt.reth() else { return };
                let Some(original) = self
                    .resp
                    .executed
                    .iter()
                    .find(|e| e.read.is_some() && psn.in_window(e.first_psn, e.npsn))
                    .copied()
                else {
                    return; // too old to answer: the requester will time out
                };
                let (va, rkey, dma_len) = (reth.va(), reth.rkey(), reth.dma_len());
                // It must ask again for what the original asked, from its PSN on
                // (IBA 9.7.5.1.1): anything else would answer past the original's
                // PSN span.
                if !repeats_read(&original, psn, self.mtu(), va, rkey, dma_len) {
                    shared.counters.drop_duplicate_mismatch += 1;
                    return;
                }
                if dma_len > 0
                    && shared
                        .mrs
                        .resolve_remote(
                            rkey.0,
                            self.init.pd,
                            self.handle,
                            va,
                            dma_len as usize,
                            AccessFlags::REMOTE_READ,
                        )
                        .is_err()
                {
                    return;
                }
                // Answers from `psn` on are about to be regenerated: drop queued ones.
                self.resp.out.retain(|o| match *o {
                    Outgoing::Read { psn: p, .. }
                    | Outgoing::Atomic { psn: p, .. }
                    | Outgoing::Ack { psn: p, .. } => p.before(psn),
                    Outgoing::Nak { .. } => true,
                });
                self.resp.queue_read(psn, va, rkey, dma_len);
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                // Replay, never re-execute (IBA 9.7.5.1.1, C9-?).
                let cached = self
                    .resp
                    .executed
                    .iter()
                    .find(|e| e.first_psn == psn)
                    .and_then(|e| e.atomic_orig);
                if let Some(orig) = cached {
                    let msn = self.resp.msn;
                    self.resp.out.push_back(Outgoing::Atomic { psn, orig, msn });
                }
            }
            _ => {
                let last = self.resp.epsn.sub(1);
                self.resp.push_ack(last);
            }
        }
    }

    /// Builds the next answer packet into `buf`.
    pub fn poll_response(&mut self, shared: &mut Shared, buf: &mut [u8]) -> Option<usize> {
        let dst = self.peer()?;
        let in_error = self.state() == QpState::Err;
        let dest_qp = Qpn::new(self.attr.dest_qp_num);
        loop {
            let item = *self.resp.out.front()?;
            // In ERR only a final NAK, and the answers queued ahead of it, go out.
            if in_error
                && !self
                    .resp
                    .out
                    .iter()
                    .any(|o| matches!(o, Outgoing::Nak { .. }))
            {
                self.resp.out.clear();
                return None;
            }
            match item {
                Outgoing::Ack { psn, msn } => {
                    self.resp.out.pop_front();
                    return self.emit_ack(
                        shared,
                        dst,
                        dest_qp,
                        psn,
                        AethSyndrome::ACK_UNLIMITED,
                        msn,
                        buf,
                    );
                }
                Outgoing::Nak { psn, syndrome, msn } => {
                    self.resp.out.pop_front();
                    return self.emit_ack(shared, dst, dest_qp, psn, syndrome, msn, buf);
                }
                Outgoing::Atomic { psn, orig, msn } => {
                    self.resp.out.pop_front();
                    let mut repr = PacketRepr::new(
                        BthRepr::new(Opcode::RcAtomicAcknowledge, dest_qp, psn),
                        &[],
                    );
                    repr.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::ACK_UNLIMITED,
                        msn,
                    });
                    repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                    let header_len = repr.emit_headers(0, buf).ok()?;
                    return Qp::finish_packet(buf, header_len, 0);
                }
                Outgoing::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first,
                    msn,
                } => {
                    let mtu = self.mtu();
                    let n = remaining.min(mtu);
                    let last = remaining <= mtu;
                    let pos = match (first, last) {
                        (true, true) => Position::Only,
                        (true, false) => Position::First,
                        (false, true) => Position::Last,
                        (false, false) => Position::Middle,
                    };
                    let headers = if pos == Position::Middle {
                        HeaderSet::NONE
                    } else {
                        HeaderSet::AETH
                    };
                    let opcode =
                        Opcode::find(Transport::Rc, OpKind::RdmaReadResponse, pos, headers)?;
                    let mut repr = PacketRepr::new(BthRepr::new(opcode, dest_qp, psn), &[]);
                    if headers == HeaderSet::AETH {
                        repr.aeth = Some(AethRepr {
                            syndrome: AethSyndrome::ACK_UNLIMITED,
                            msn,
                        });
                    }
                    let header_len = repr.emit_headers(n as usize, buf).ok()?;
                    let read = if n == 0 {
                        Ok(())
                    } else {
                        shared
                            .mrs
                            .resolve_remote(
                                rkey.0,
                                self.init.pd,
                                self.handle,
                                va,
                                n as usize,
                                AccessFlags::REMOTE_READ,
                            )
                            .and_then(|mem| {
                                if mem.read(0, &mut buf[header_len..header_len + n as usize]) {
                                    Ok(())
                                } else {
                                    Err(KeyError::OutOfBounds)
                                }
                            })
                    };
                    if read.is_err() {
                        // The region went away while the READ was being answered.
                        self.resp.out.pop_front();
                        let syndrome = AethSyndrome::Nak(NakCode::RemoteAccessError);
                        self.resp
                            .out
                            .push_front(Outgoing::Nak { psn, syndrome, msn });
                        shared.counters.nak_error_sent += 1;
                        shared
                            .events
                            .push_back(AsyncEvent::QpAccessError(self.handle));
                        self.enter_error(shared);
                        continue;
                    }
                    if last {
                        self.resp.out.pop_front();
                    } else if let Some(Outgoing::Read {
                        psn: p,
                        va: v,
                        remaining: r,
                        first: f,
                        ..
                    }) = self.resp.out.front_mut()
                    {
                        *p = psn.next();
                        *v = va.wrapping_add(u64::from(n));
                        *r = remaining - n;
                        *f = false;
                    }
                    return Qp::finish_packet(buf, header_len, n as usize);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_ack(
        &self,
        _shared: &Shared,
        _dst: std::net::SocketAddr,
        dest_qp: Qpn,
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
        buf: &mut [u8],
    ) -> Option<usize> {
        let mut repr = PacketRepr::new(BthRepr::new(Opcode::RcAcknowledge, dest_qp, psn), &[]);
        repr.aeth = Some(AethRepr { syndrome, msn });
        let header_len = repr.emit_headers(0, buf).ok()?;
        Qp::finish_packet(buf, header_len, 0)
    }
}
