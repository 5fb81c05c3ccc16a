//! Selective repeat at the responder (see `qp/selective.rs` for the protocol and
//! the IBA rules it relaxes): packets that arrive ahead of the expected PSN from a
//! requester that offered it are placed now, if their place is known, and
//! committed in PSN order when the expected PSN reaches them.

use super::answers::Outgoing;
use super::checks::{check_operation_enabled, Refusal};
use super::{InMessage, RecvCtx, Request, Responder};
use crate::qp::selective::{offered_index, AheadWrite, Held, WINDOW};
use crate::types::AccessFlags;
use crate::wc::WcOpcode;
use softverbs_wire::{OpKind, Position, Psn};

impl Responder {
    /// A request `psn` ahead of the expected PSN, from a requester doing selective
    /// repeat: kept if it can be placed, and reported either way.
    pub(super) fn handle_ahead(&mut self, ctx: &mut RecvCtx<'_>, req: &Request<'_>) {
        let psn = req.psn;
        if self.epsn.distance_to(psn) >= WINDOW {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        self.note_message(ctx, req);
        let held = if self.sr.get(psn).is_some() {
            // A copy of a packet already placed: never placed twice.
            ctx.shared.counters.duplicate_requests += 1;
            true
        } else {
            match self.place_ahead(ctx, req) {
                Ok(h) => {
                    self.sr.hold(h);
                    ctx.shared.counters.sr_held_ahead += 1;
                    true
                }
                Err(_) => {
                    ctx.shared.counters.drop_out_of_sequence += 1;
                    false
                }
            }
        };
        // Report the first packet after a hole at once (the requester resends the
        // hole), with the run held before the hole; and the run held up to a
        // packet that asked for an ACK. Packets not kept are not reported one by
        // one: once the gap before them is filled, the responder asks for them
        // with one selective ACK (see `ask_for_dropped`).
        let cumulative = self.epsn.sub(1);
        let newest = match self.highest_ahead {
            Some(h) if cumulative.before(h) => h,
            _ => cumulative,
        };
        let after_hole = psn.sub(1) != newest && newest.before(psn);
        if newest.before(psn) {
            self.highest_ahead = Some(psn);
        }
        if !held && self.dropped_ahead.is_none_or(|d| d.before(psn)) {
            self.dropped_ahead = Some(psn);
        }
        if after_hole {
            let before = psn.sub(1);
            let gap_end = (0..WINDOW)
                .map(|k| before.sub(k))
                .take_while(|&q| q != cumulative)
                .find(|&q| self.sr.get(q).is_some());
            if let Some(last) = gap_end {
                let (seen, held) = self.sr.run_ending_at(last);
                self.sack(ctx, seen, held);
            }
        }
        if held && (after_hole || req.pkt.bth().ack_req()) {
            let (seen, n) = self.sr.run_ending_at(psn);
            self.sack(ctx, seen, n);
        } else if after_hole {
            self.sack(ctx, psn, 0);
        }
    }

    /// After the expected PSN moved on: if it now names a packet that arrived
    /// ahead but could not be kept, ask for it and the others not kept, up to
    /// the newest of them, with one selective ACK saying that one was seen and
    /// not kept: the requester resends what this responder does not hold up to
    /// there, and nothing after it. (A sequence NAK would make it go back over
    /// everything it sent since, a window's worth of packets still in flight
    /// that arrive and are kept: a go-back storm per NAK in a long SEND stream.)
    pub(super) fn ask_for_dropped(&mut self, ctx: &mut RecvCtx<'_>) {
        let Some(h) = self.highest_ahead else {
            return;
        };
        if !self.epsn.before(h.next()) {
            self.highest_ahead = None;
            self.dropped_ahead = None;
            return;
        }
        let Some(dropped) = self.dropped_ahead else {
            return;
        };
        if !self.epsn.before(dropped.next()) {
            // What was dropped came again and was committed.
            self.dropped_ahead = None;
        } else if self.asked_from != Some(self.epsn) {
            self.dropped_ahead = None;
            self.asked_from = Some(self.epsn);
            self.sack(ctx, dropped, 0);
        }
    }

    /// Queues a selective ACK of `held` packets from `seen` on (0: `seen` arrived
    /// and was not kept).
    fn sack(&mut self, ctx: &mut RecvCtx<'_>, seen: Psn, held: u32) {
        // Advice only: with no room it is dropped as if lost (the requester's
        // timer resends what it would have asked for).
        if !self.answers.has_room_for_duplicate() {
            ctx.shared.counters.drop_answer_queue_full += 1;
            return;
        }
        self.answers.push(Outgoing::Sack {
            cumulative: self.epsn.sub(1),
            seen,
            held,
        });
        ctx.shared.counters.sack_sent += 1;
    }

    /// Places a packet ahead of the expected PSN, with the checks an in-order one
    /// passes for what it touches: operation enabled, length, R_Key, access and
    /// bounds. Receive WQEs, opcode sequence and completions wait for the commit.
    fn place_ahead(&mut self, ctx: &mut RecvCtx<'_>, req: &Request<'_>) -> Result<Held, Refusal> {
        let (pkt, info, psn, payload) = (req.pkt, req.info, req.psn, req.payload);
        check_operation_enabled(ctx, info.kind)?;
        let mtu = ctx.mtu;
        let len = payload.len() as u32;
        let pos = info.position;
        let len_ok = match pos {
            Position::First | Position::Middle => len == mtu,
            Position::Last => (1..=mtu).contains(&len),
            Position::Only => len <= mtu,
        };
        if !len_ok {
            return Err(Refusal::PacketLength);
        }
        let index = offered_index(pkt.bth().resv7());
        match info.kind {
            OpKind::RdmaWrite => {
                let (write, offset) = if let Some(reth) = pkt.reth() {
                    let w = AheadWrite {
                        first: psn,
                        va: reth.va(),
                        rkey: reth.rkey(),
                        dma_len: reth.dma_len(),
                    };
                    (w, 0)
                } else {
                    let k = index.ok_or(Refusal::OpcodeOutOfSequence)?;
                    let first = psn.sub(k);
                    let w = self
                        .write_starting(first)
                        .ok_or(Refusal::OpcodeOutOfSequence)?;
                    (w, k.checked_mul(mtu).ok_or(Refusal::PacketLength)?)
                };
                let end = offset.checked_add(len).ok_or(Refusal::PacketLength)?;
                let fits = if pos.ends_message() {
                    end == write.dma_len
                } else {
                    end < write.dma_len
                };
                if !fits {
                    return Err(Refusal::WriteLengthMismatch);
                }
                // A first packet checks the whole message's range, as in order.
                let check_len = if pos.starts_message() {
                    write.dma_len
                } else {
                    len
                };
                if check_len > 0 {
                    let at = write.va.wrapping_add(u64::from(offset));
                    let mem = ctx
                        .shared
                        .mrs
                        .resolve_remote(
                            write.rkey.0,
                            ctx.pd,
                            ctx.handle,
                            at,
                            check_len as usize,
                            AccessFlags::REMOTE_WRITE,
                        )
                        .map_err(Refusal::RemoteKey)?;
                    if !mem.write(0, payload) {
                        return Err(Refusal::RemoteKey(crate::mr::KeyError::OutOfBounds));
                    }
                }
                if pos.starts_message() && !self.sr.add_write(write) {
                    return Err(Refusal::OpcodeOutOfSequence);
                }
            }
            OpKind::Send => {
                let k = index.ok_or(Refusal::OpcodeOutOfSequence)?;
                let first = psn.sub(k);
                // The receive WQE the message takes: the one in progress, or the
                // one as many after the head as messages before it take.
                let in_progress =
                    matches!(self.msg, Some(InMessage::Send { .. })) && self.msg_first == first;
                let n = if in_progress {
                    0
                } else {
                    self.wqe_index_of(first).ok_or(Refusal::NoReceiveWqe)?
                };
                // A QP on an SRQ holds one WQE at a time: only the next message's.
                if n == 0 && !ctx.recv_claim() || n > 0 && ctx.srq.is_some() {
                    return Err(Refusal::NoReceiveWqe);
                }
                let offset = k.checked_mul(mtu).ok_or(Refusal::PacketLength)?;
                let (wqe, sges) = ctx.rq.nth(u64::from(n)).ok_or(Refusal::NoReceiveWqe)?;
                if offset.saturating_add(len) > wqe.length {
                    return Err(Refusal::SendLongerThanReceive);
                }
                if ctx.shared.scatter(ctx.pd, sges, offset, payload).is_err() {
                    return Err(Refusal::ReceiveBufferUnwritable);
                }
            }
            _ => return Err(Refusal::UnsupportedOpcode),
        }
        Ok(Held {
            psn,
            opcode: info.opcode,
            len,
            imm: pkt.immdt().map(|h| h.imm()),
            ieth: pkt.ieth().map(|h| h.rkey()),
            ack_req: pkt.bth().ack_req(),
            solicited: pkt.bth().solicited(),
        })
    }

    /// Notes what a packet arriving ahead says of its message: its start (from
    /// the index the requester sent), its end and whether it takes a receive WQE.
    fn note_message(&mut self, ctx: &RecvCtx<'_>, req: &Request<'_>) {
        let Some(k) = offered_index(req.pkt.bth().resv7()) else {
            return;
        };
        let (info, psn) = (req.info, req.psn);
        let first = psn.sub(k);
        let ends = info.position.ends_message();
        let (last, takes_wqe) = match info.kind {
            OpKind::Send => (ends.then_some(psn), Some(true)),
            OpKind::RdmaWrite => (ends.then_some(psn), ends.then_some(info.needs_recv_wqe)),
            OpKind::RdmaReadRequest => {
                let len = req.pkt.reth().map_or(0, |r| r.dma_len());
                let npsn = crate::qp::requester::packets_for(len, ctx.mtu);
                (Some(psn.add(npsn - 1)), Some(false))
            }
            _ => (Some(psn), Some(false)),
        };
        let in_progress = self.msg.map(|_| self.msg_first);
        self.sr
            .note_message(self.epsn, in_progress, psn, first, last, takes_wqe);
        // A message starting right after the expected PSN, with a message in
        // progress: the expected packet (lost) is that message's last, so it ends
        // there. (Anything else between could be whole messages nothing is known
        // of.)
        if info.position.starts_message() && psn.sub(1) == self.epsn {
            let in_progress = match self.msg {
                Some(InMessage::Send { .. }) => Some(Some(true)),
                // Whether a WRITE takes a WQE shows in its last packet's opcode.
                Some(InMessage::Write { .. }) => Some(None),
                None => None,
            };
            if let Some(takes_wqe) = in_progress {
                let first = self.msg_first;
                self.sr.note_message(
                    self.epsn,
                    Some(first),
                    self.epsn,
                    first,
                    Some(self.epsn),
                    takes_wqe,
                );
            }
        }
    }

    /// How many receive WQEs the messages before the one starting at `first`
    /// take from the head of the queue, if every message between the expected
    /// PSN and it is known (a packet of each arrived, its last one included).
    fn wqe_index_of(&self, first: Psn) -> Option<u32> {
        let (mut at, mut n) = match self.msg {
            None => (self.epsn, 0),
            Some(m) => {
                let known = self.sr.message(self.msg_first);
                let takes = match m {
                    InMessage::Send { .. } => true,
                    InMessage::Write { .. } => known?.takes_wqe?,
                };
                // The packet before the expected one did not end the message in
                // progress: if a message starts right after the expected PSN, the
                // expected packet is this one's last.
                let last = match known.and_then(|k| k.last) {
                    Some(last) => last,
                    None if self.sr.message(self.epsn.next()).is_some() => self.epsn,
                    None => return None,
                };
                (last.next(), u32::from(takes))
            }
        };
        for _ in 0..WINDOW {
            if at == first {
                return Some(n);
            }
            if !at.before(first) {
                return None;
            }
            let m = self.sr.message(at)?;
            n += u32::from(m.takes_wqe?);
            at = m.last?.next();
        }
        None
    }

    /// The RDMA WRITE whose first packet is `first`: the message in progress, or
    /// one whose first packet was kept ahead.
    fn write_starting(&self, first: Psn) -> Option<AheadWrite> {
        match self.msg {
            Some(InMessage::Write {
                va, rkey, dma_len, ..
            }) if self.msg_first == first => Some(AheadWrite {
                first,
                va,
                rkey,
                dma_len,
            }),
            _ => self.sr.write_from(first),
        }
    }

    /// Commits, in PSN order, the packets held from the expected PSN on.
    pub(super) fn commit_held(&mut self, ctx: &mut RecvCtx<'_>) -> Result<(), Refusal> {
        while let Some(h) = self.sr.get(self.epsn) {
            self.commit_one(ctx, h)?;
            self.sr.take(h.psn);
        }
        Ok(())
    }

    /// The in-order steps of a packet placed ahead, now that it is expected: opcode
    /// sequence, the receive WQE, the message's end (completion, MSN), the ACK.
    fn commit_one(&mut self, ctx: &mut RecvCtx<'_>, h: Held) -> Result<(), Refusal> {
        let info = h.opcode.info();
        let (kind, pos) = (info.kind, info.position);
        self.check_opcode_sequence(kind, pos)?;
        match kind {
            OpKind::RdmaWrite => {
                let (va, rkey, dma_len, received) = match self.msg {
                    Some(InMessage::Write {
                        va,
                        rkey,
                        dma_len,
                        received,
                    }) => (va, rkey, dma_len, received),
                    _ => {
                        let w = self
                            .sr
                            .write_from(h.psn)
                            .ok_or(Refusal::OpcodeOutOfSequence)?;
                        self.msg_first = h.psn;
                        (w.va, w.rkey, w.dma_len, 0)
                    }
                };
                if pos.ends_message() && info.needs_recv_wqe && !ctx.recv_claim() {
                    return Err(Refusal::NoReceiveWqe);
                }
                self.sr.drop_write(h.psn);
                self.msg = Some(InMessage::Write {
                    va,
                    rkey,
                    dma_len,
                    received: received.saturating_add(h.len),
                });
                if pos.ends_message() {
                    self.msg = None;
                    if h.imm.is_some() {
                        let done = super::execute::Received {
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: dma_len,
                            invalidated_rkey: None,
                        };
                        ctx.complete_held(done, &h);
                    }
                    self.message_done();
                }
            }
            OpKind::Send => {
                let received = match self.msg {
                    Some(InMessage::Send { received }) => received,
                    None if pos.starts_message() => {
                        // Its WQE is the head now (its data went there).
                        if !ctx.recv_claim() {
                            return Err(Refusal::NoReceiveWqe);
                        }
                        self.msg_first = h.psn;
                        0
                    }
                    _ => return Err(Refusal::OpcodeOutOfSequence),
                };
                let total = received.saturating_add(h.len);
                if pos.ends_message() {
                    if let Some(rkey) = h.ieth {
                        if !ctx
                            .shared
                            .mrs
                            .may_invalidate_remotely(rkey.0, ctx.pd, ctx.handle)
                        {
                            return Err(Refusal::InvalidateNotAllowed);
                        }
                        ctx.shared.mrs.invalidate_remotely(rkey.0);
                    }
                    self.msg = None;
                    let done = super::execute::Received {
                        opcode: WcOpcode::Recv,
                        byte_len: total,
                        invalidated_rkey: h.ieth,
                    };
                    ctx.complete_held(done, &h);
                    self.message_done();
                } else {
                    self.msg = Some(InMessage::Send { received: total });
                }
            }
            _ => return Err(Refusal::UnsupportedOpcode),
        }
        self.epsn = h.psn.next();
        if h.ack_req {
            self.answers.push_ack(h.psn, self.msn);
        }
        Ok(())
    }
}
