//! Executing a request that passed the checks: placing SEND and RDMA WRITE data,
//! queueing READ responses, carrying out atomics, and completing receive WQEs. The
//! R_Key, access and bounds checks (IBA 9.7.5.1.3, checks 6 to 8) happen here, where
//! the memory is reached.

use super::answers::Outgoing;
use super::checks::Refusal;
use super::duplicates::Executed;
use super::{InMessage, RecvCtx, Request, Responder};
use crate::qp::queues::RecvWqe;
use crate::types::AccessFlags;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::Sge;
use softverbs_wire::{OpKind, Qpn, Rkey, RocePacket};

impl RecvCtx<'_> {
    /// The receive WQE the message arriving now uses, with its SGEs: the head of the
    /// QP's receive queue, which for a QP on an SRQ holds the WQE it claimed.
    pub(super) fn recv_head(&self) -> Option<(&RecvWqe, &[Sge])> {
        self.rq.front()
    }

    /// Makes sure a receive WQE is there for the message that starts now; false if
    /// none is (receiver not ready). A QP on an SRQ takes the SRQ's head WQE, with
    /// its SGEs, into its own one-entry receive queue when a message starts and
    /// keeps it until the message completes (IBA 10.2.9.5), so QPs receiving at once
    /// never share a buffer; taking it may raise SRQ_LIMIT_REACHED.
    pub(super) fn recv_claim(&mut self) -> bool {
        if self.rq.front().is_some() {
            return true;
        }
        let Some(h) = self.srq else {
            return false;
        };
        let Some(srq) = self.shared.srqs.get_mut(h.0) else {
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
            self.shared
                .events
                .push_back(crate::event::AsyncEvent::SrqLimitReached(h));
        }
        true
    }

    /// Completes the current message's receive WQE with an error status.
    pub(super) fn fail_recv(&mut self, status: WcStatus) {
        if let Some(wqe) = self.rq.pop() {
            let wc = WorkCompletion {
                wr_id: wqe.wr_id,
                status,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..WorkCompletion::default()
            };
            self.complete(wc);
        }
    }

    /// Completes the current message's receive WQE successfully, for a last
    /// packet that was kept ahead (selective repeat) and is committed now.
    pub(super) fn complete_held(&mut self, done: Received, h: &crate::qp::selective::Held) {
        let Some(wqe) = self.rq.pop() else {
            return;
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: done.opcode,
            byte_len: done.byte_len,
            imm_data: h.imm,
            invalidated_rkey: done.invalidated_rkey,
            qp_num: self.qpn,
            src_qp: Qpn::new(self.attr.dest_qp_num),
            solicited: h.solicited,
            src_addr: None,
            grh: false,
        };
        self.complete(wc);
    }

    /// Completes the current message's receive WQE successfully.
    pub(super) fn complete_recv(&mut self, done: Received, pkt: &RocePacket<&[u8]>) {
        let Some(wqe) = self.rq.pop() else {
            return;
        };
        let wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: done.opcode,
            byte_len: done.byte_len,
            imm_data: pkt.immdt().map(|h| h.imm()),
            invalidated_rkey: done.invalidated_rkey,
            qp_num: self.qpn,
            src_qp: Qpn::new(self.attr.dest_qp_num),
            solicited: pkt.bth().solicited(),
            // Connected QPs know their peer; only UD completions say where
            // the message came from.
            src_addr: None,
            grh: false,
        };
        self.complete(wc);
    }
}

/// A message received whole.
pub(super) struct Received {
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub invalidated_rkey: Option<Rkey>,
}

impl Responder {
    /// Executes the packet with the expected PSN that passed checks 2 to 5.
    #[inline]
    pub(super) fn execute(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        req: &Request<'_>,
    ) -> Result<(), Refusal> {
        let (pkt, psn) = (req.pkt, req.psn);
        match req.info.kind {
            OpKind::RdmaWrite => self.execute_write(ctx, req)?,
            OpKind::Send => self.execute_send(ctx, req)?,
            // A READ or an atomic takes its PSNs and is answered from the answer
            // queue; no ACK of its own.
            OpKind::RdmaReadRequest => return self.execute_read(ctx, pkt),
            OpKind::CompareSwap | OpKind::FetchAdd => return self.execute_atomic(ctx, pkt),
            _ => return Err(Refusal::UnsupportedOpcode),
        }
        self.epsn = psn.next();
        if pkt.bth().ack_req() {
            self.answers.push_ack(psn, self.msn);
        }
        Ok(())
    }

    /// An RDMA WRITE packet: its payload goes where the message's RETH said, past
    /// what earlier packets placed.
    #[inline]
    fn execute_write(&mut self, ctx: &mut RecvCtx<'_>, req: &Request<'_>) -> Result<(), Refusal> {
        let (pkt, pos, payload) = (req.pkt, req.info.position, req.payload);
        let len = payload.len() as u32;
        let (va, rkey, dma_len, received) = match (self.msg, pkt.reth()) {
            (
                Some(InMessage::Write {
                    va,
                    rkey,
                    dma_len,
                    received,
                }),
                _,
            ) => (va, rkey, dma_len, received),
            (_, Some(reth)) => (reth.va(), reth.rkey(), reth.dma_len(), 0),
            _ => return Err(Refusal::MissingHeader),
        };
        // The first packet checks the whole message's range (nothing is written of a
        // WRITE that would not fit); later ones their own part. A zero-length WRITE
        // names no memory (IBA 9.7.5.1.3: no key check for zero-length transfers).
        if len > 0 || pos.starts_message() && dma_len > 0 {
            let check_len = if pos.starts_message() { dma_len } else { len };
            let at = va.wrapping_add(u64::from(received));
            let mem = ctx
                .shared
                .mrs
                .resolve_remote(
                    rkey.0,
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
        if pos.starts_message() {
            self.msg_first = req.psn;
        }
        self.msg = Some(InMessage::Write {
            va,
            rkey,
            dma_len,
            received: received + len,
        });
        if pos.ends_message() {
            self.msg = None;
            if pkt.immdt().is_some() {
                let done = Received {
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: dma_len,
                    invalidated_rkey: None,
                };
                ctx.complete_recv(done, pkt);
            }
            self.message_done();
        }
        Ok(())
    }

    /// A SEND packet: its payload goes into the receive WQE's SGEs, past what earlier
    /// packets placed.
    fn execute_send(&mut self, ctx: &mut RecvCtx<'_>, req: &Request<'_>) -> Result<(), Refusal> {
        let (pkt, pos, payload) = (req.pkt, req.info.position, req.payload);
        let inv = pkt.ieth().map(|h| h.rkey());
        if let Some(rkey) = inv {
            // The key must name memory this PD allows peers to invalidate (or a type
            // 2 memory window bound through this QP).
            if !ctx
                .shared
                .mrs
                .may_invalidate_remotely(rkey.0, ctx.pd, ctx.handle)
            {
                return Err(Refusal::InvalidateNotAllowed);
            }
        }
        let received = match self.msg {
            Some(InMessage::Send { received }) => received,
            _ => 0,
        };
        let (_, sges) = ctx.recv_head().ok_or(Refusal::NoReceiveWqe)?;
        if ctx.shared.scatter(ctx.pd, sges, received, payload).is_err() {
            return Err(Refusal::ReceiveBufferUnwritable);
        }
        let total = received + payload.len() as u32;
        if pos.ends_message() {
            self.msg = None;
            if let Some(rkey) = inv {
                ctx.shared.mrs.invalidate_remotely(rkey.0);
            }
            let done = Received {
                opcode: WcOpcode::Recv,
                byte_len: total,
                invalidated_rkey: inv,
            };
            ctx.complete_recv(done, pkt);
            self.message_done();
        } else {
            if pos.starts_message() {
                self.msg_first = req.psn;
            }
            self.msg = Some(InMessage::Send { received: total });
        }
        Ok(())
    }

    /// An RDMA READ request: checked against the memory now, answered from the
    /// answer queue (responses are read from memory as they are sent).
    fn execute_read(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        pkt: &RocePacket<&[u8]>,
    ) -> Result<(), Refusal> {
        let Some(reth) = pkt.reth() else {
            return Err(Refusal::MissingHeader);
        };
        let psn = pkt.bth().psn();
        let (va, rkey, dma_len) = (reth.va(), reth.rkey(), reth.dma_len());
        if dma_len > 0 {
            ctx.shared
                .mrs
                .resolve_remote(
                    rkey.0,
                    ctx.pd,
                    ctx.handle,
                    va,
                    dma_len as usize,
                    AccessFlags::REMOTE_READ,
                )
                .map_err(Refusal::RemoteKey)?;
        }
        let npsn = crate::qp::requester::packets_for(dma_len, ctx.mtu);
        self.executed
            .remember(Executed::read(psn, npsn, va, rkey, dma_len));
        self.message_done_with(npsn);
        self.answers.queue_read(psn, va, rkey, dma_len, self.msn);
        Ok(())
    }

    /// An atomic: carried out once; its result is kept for duplicates.
    fn execute_atomic(
        &mut self,
        ctx: &mut RecvCtx<'_>,
        pkt: &RocePacket<&[u8]>,
    ) -> Result<(), Refusal> {
        let Some(a) = pkt.atomic_eth() else {
            return Err(Refusal::MissingHeader);
        };
        let psn = pkt.bth().psn();
        let mem = ctx
            .shared
            .mrs
            .resolve_remote(
                a.rkey().0,
                ctx.pd,
                ctx.handle,
                a.va(),
                8,
                AccessFlags::REMOTE_ATOMIC,
            )
            .map_err(Refusal::RemoteKey)?;
        let orig = if pkt.info().kind == OpKind::CompareSwap {
            mem.compare_swap(a.compare(), a.swap_add())
        } else {
            mem.fetch_add(a.swap_add())
        }
        .ok_or(Refusal::AtomicFailed)?;
        self.executed.remember(Executed::atomic(psn, orig));
        self.message_done_with(1);
        self.answers.push(Outgoing::Atomic {
            psn,
            orig,
            msn: self.msn,
        });
        Ok(())
    }

    pub(super) fn message_done(&mut self) {
        self.msn = (self.msn + 1) & 0xff_ffff;
    }

    /// A READ or atomic was accepted: it takes `npsn` PSNs.
    fn message_done_with(&mut self, npsn: u32) {
        self.message_done();
        self.epsn = self.epsn.add(npsn);
    }
}
