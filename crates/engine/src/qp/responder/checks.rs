//! The responder's checks of a new request, in IBA's order (9.7.5.1), one function
//! each, and the one table that says what each refusal means on the wire and at the
//! receive queue.
//!
//! Check 1 (PSN: expected, duplicate or out of sequence) runs before these, in
//! `mod.rs`; the R_Key, access and bounds checks (6 to 8) run where the memory is
//! reached, in `execute.rs`, and refuse with [`Refusal::RemoteKey`].

use super::{InMessage, RecvCtx, Request, Responder};
use crate::mr::KeyError;
use crate::types::AccessFlags;
use crate::wc::WcStatus;
use softverbs_wire::{NakCode, OpKind, OpcodeInfo, Position, Psn};

/// Why the responder refused a new request. Each variant says what went wrong;
/// [`Refusal::verdict`] maps it to the answer IBA prescribes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The packet does not continue the message in progress, or a Middle/Last packet
    /// arrived with none in progress (check 2).
    OpcodeOutOfSequence,
    /// The QP's access flags do not enable RDMA WRITE, READ or atomics (check 3).
    OperationNotEnabled,
    /// No receive WQE for a message that needs one (check 4).
    NoReceiveWqe,
    /// A READ or atomic reached a QP with max_dest_rd_atomic 0 (check 4).
    NoReadAtomicResources,
    /// A SEND packet's payload is not the length its position requires: a MTU for
    /// First and Middle, 1..=MTU for Last (check 5).
    SendPacketLength,
    /// Another request packet's payload is not the length its position requires
    /// (check 5).
    PacketLength,
    /// A SEND longer than its receive WQE (check 5).
    SendLongerThanReceive,
    /// An RDMA WRITE whose payload does not add up to its RETH DMA length (check 5).
    WriteLengthMismatch,
    /// A READ longer than max_msg_size, or needing half the PSN space or more in
    /// responses (check 5).
    ReadTooLong,
    /// An atomic whose address is not 8-byte aligned (check 5, IBA 9.4.5).
    MisalignedAtomic,
    /// The header the opcode carries its parameters in is missing.
    MissingHeader,
    /// An opcode the responder does not execute.
    UnsupportedOpcode,
    /// The R_Key is invalid, of another PD, lacks the right, or the range is out of
    /// bounds (checks 6 to 8).
    RemoteKey(KeyError),
    /// A SEND with Invalidate names a key this QP's peer may not invalidate.
    InvalidateNotAllowed,
    /// The receive WQE's buffer cannot be written (responder-side error).
    ReceiveBufferUnwritable,
    /// The atomic could not be carried out on the word.
    AtomicFailed,
}

/// What a refusal answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// RNR NAK: the requester waits and resends; the responder stays as it is.
    ReceiverNotReady,
    /// An error NAK: the responder QP goes to ERR after it.
    Nak(NakCode),
}

/// Everything a refusal decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RefusalVerdict {
    /// What goes back to the requester (on RC; UC never answers).
    pub answer: Answer,
    /// The status the message's receive WQE completes with, if it gives one back.
    pub recv_status: Option<WcStatus>,
}

impl Refusal {
    /// The table of IBA answers (RC responder, IBA 9.7.5.1 and table 46's NAK codes).
    pub fn verdict(self) -> RefusalVerdict {
        use Answer::{Nak, ReceiverNotReady};
        let (answer, recv_status) = match self {
            // 9.7.5.1.2 (C9-76): out-of-sequence opcodes are invalid requests.
            Refusal::OpcodeOutOfSequence => (Nak(NakCode::InvalidRequest), None),
            // 9.7.5.1.3 and 10.2.4.2: an operation the QP was not enabled for.
            Refusal::OperationNotEnabled => (Nak(NakCode::InvalidRequest), None),
            // 9.7.5.1.4: no receive WQE is "receiver not ready".
            Refusal::NoReceiveWqe => (ReceiverNotReady, None),
            // 9.7.5.1.4: no responder resources for READ/atomics: invalid request.
            Refusal::NoReadAtomicResources => (Nak(NakCode::InvalidRequest), None),
            // 9.7.5.1.5 (C9-85): length errors are invalid requests; a SEND's
            // receive WQE completes with a local length error (10.8.5).
            Refusal::SendPacketLength | Refusal::SendLongerThanReceive => {
                (Nak(NakCode::InvalidRequest), Some(WcStatus::LocLenErr))
            }
            Refusal::PacketLength
            | Refusal::WriteLengthMismatch
            | Refusal::ReadTooLong
            | Refusal::MisalignedAtomic => (Nak(NakCode::InvalidRequest), None),
            // 9.7.5.1.2: a packet without the headers its opcode calls for, or an
            // opcode not supported, is malformed: invalid request.
            Refusal::MissingHeader | Refusal::UnsupportedOpcode => {
                (Nak(NakCode::InvalidRequest), None)
            }
            // 9.7.5.1.3 (C9-88): R_Key, PD, access and bounds violations are all
            // remote access errors.
            Refusal::RemoteKey(_) => (Nak(NakCode::RemoteAccessError), None),
            // 10.6.7.2.4 / 11.4.1.1.1: invalidating a key the peer may not is an
            // invalid request.
            Refusal::InvalidateNotAllowed => (Nak(NakCode::InvalidRequest), None),
            // 9.7.5.1.7: the responder failed to place the data: remote operational
            // error; the receive WQE completes with a local protection error.
            Refusal::ReceiveBufferUnwritable => (
                Nak(NakCode::RemoteOperationalError),
                Some(WcStatus::LocProtErr),
            ),
            Refusal::AtomicFailed => (Nak(NakCode::InvalidRequest), None),
        };
        RefusalVerdict {
            answer,
            recv_status,
        }
    }
}

impl Responder {
    /// Check 2, opcode sequence (IBA 9.7.5.1.2): a message's packets arrive First,
    /// Middle..., Last; nothing else may interleave.
    #[inline]
    pub(super) fn check_opcode_sequence(&self, kind: OpKind, pos: Position) -> Result<(), Refusal> {
        let continues = matches!(pos, Position::Middle | Position::Last);
        match (self.msg, continues) {
            (Some(InMessage::Send { .. }), true) if kind == OpKind::Send => Ok(()),
            (Some(InMessage::Write { .. }), true) if kind == OpKind::RdmaWrite => Ok(()),
            (None, false) => Ok(()),
            _ => Err(Refusal::OpcodeOutOfSequence),
        }
    }
}

/// Check 3, the QP allows the operation (IBA 10.2.4.2, qp_access_flags).
#[inline]
pub(super) fn check_operation_enabled(ctx: &RecvCtx<'_>, kind: OpKind) -> Result<(), Refusal> {
    let needed = match kind {
        OpKind::RdmaWrite => AccessFlags::REMOTE_WRITE,
        OpKind::RdmaReadRequest => AccessFlags::REMOTE_READ,
        OpKind::CompareSwap | OpKind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        _ => AccessFlags::EMPTY,
    };
    if ctx.attr.qp_access_flags.contains(needed) {
        Ok(())
    } else {
        Err(Refusal::OperationNotEnabled)
    }
}

/// Check 4, resources (IBA 9.7.5.1.4): a receive WQE for a message that consumes
/// one, claimed now (a SEND's first packet, an RDMA WRITE with immediate's last);
/// responder resources for READs and atomics.
#[inline]
pub(super) fn check_resources(ctx: &mut RecvCtx<'_>, info: &OpcodeInfo) -> Result<(), Refusal> {
    let consumes_wqe_now = info.needs_recv_wqe
        && match info.kind {
            OpKind::Send => info.position.starts_message(),
            _ => info.position.ends_message(),
        };
    if consumes_wqe_now && !ctx.recv_claim() {
        return Err(Refusal::NoReceiveWqe);
    }
    let read_or_atomic = matches!(
        info.kind,
        OpKind::RdmaReadRequest | OpKind::CompareSwap | OpKind::FetchAdd
    );
    if read_or_atomic && ctx.attr.max_dest_rd_atomic == 0 {
        return Err(Refusal::NoReadAtomicResources);
    }
    Ok(())
}

impl Responder {
    /// Check 5, length (IBA 9.7.5.1.5): First and Middle packets carry exactly one
    /// MTU, Last 1..=MTU, Only 0..=MTU; a message fits its target.
    #[inline]
    pub(super) fn check_length(&self, ctx: &RecvCtx<'_>, req: &Request<'_>) -> Result<(), Refusal> {
        let (pkt, info) = (req.pkt, req.info);
        let (kind, pos) = (info.kind, info.position);
        let mtu = ctx.mtu;
        let len = req.payload.len() as u32;
        let len_ok = match pos {
            Position::First | Position::Middle => len == mtu,
            Position::Last => (1..=mtu).contains(&len),
            Position::Only => len <= mtu,
        };
        if info.has_payload && !len_ok {
            return Err(if kind == OpKind::Send {
                Refusal::SendPacketLength
            } else {
                Refusal::PacketLength
            });
        }
        match kind {
            OpKind::Send => {
                let received = match self.msg {
                    Some(InMessage::Send { received }) => received,
                    _ => 0,
                };
                let capacity = ctx.recv_head().map_or(0, |(w, _)| w.length);
                if received.saturating_add(len) > capacity {
                    return Err(Refusal::SendLongerThanReceive);
                }
            }
            OpKind::RdmaWrite => {
                let (dma_len, received) = match (self.msg, pkt.reth()) {
                    (
                        Some(InMessage::Write {
                            dma_len, received, ..
                        }),
                        _,
                    ) => (dma_len, received),
                    (None, Some(reth)) => (reth.dma_len(), 0),
                    _ => return Err(Refusal::MissingHeader),
                };
                let total = received.saturating_add(len);
                // Same-host path: a header-only WRITE Only whose bytes the requester
                // placed (`engine/placed.rs`); its RETH range is still checked whole.
                if self.accept_placed && pos == Position::Only && len == 0 {
                    return Ok(());
                }
                let fits = if pos.ends_message() {
                    total == dma_len
                } else {
                    total < dma_len
                };
                if !fits {
                    return Err(Refusal::WriteLengthMismatch);
                }
            }
            OpKind::RdmaReadRequest => {
                let dma_len = pkt.reth().map_or(0, |r| r.dma_len());
                // Its responses must also take less than half the PSN space, or its
                // own PSN would stop looking like a duplicate (IBA 9.7.1).
                let npsn = crate::qp::requester::packets_for(dma_len, mtu);
                if dma_len > ctx.shared.config.max_msg_size || npsn >= Psn::HALF_SPACE {
                    return Err(Refusal::ReadTooLong);
                }
            }
            // Atomics need an 8-byte aligned address (IBA 9.4.5).
            OpKind::CompareSwap | OpKind::FetchAdd
                if pkt.atomic_eth().is_some_and(|a| a.va() % 8 != 0) =>
            {
                return Err(Refusal::MisalignedAtomic);
            }
            _ => {}
        }
        Ok(())
    }
}
