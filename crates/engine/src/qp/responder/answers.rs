//! The responder's answers — ACKs, NAKs, READ responses, atomic ACKs — leave in PSN
//! order through one queue, so an ACK never overtakes the READ responses before it
//! (IBA 9.7.5.1.6). READ responses are read from memory as they are sent.

use super::Responder;
use crate::event::AsyncEvent;
use crate::mr::KeyError;
use crate::qp::selective;
use crate::shared::Shared;
use crate::types::{AccessFlags, PdHandle, QpHandle};
use softverbs_wire::{
    packet, AethRepr, AethSyndrome, AtomicAckEthRepr, BthRepr, HeaderSet, NakCode, OpKind, Opcode,
    PacketRepr, Position, Psn, Qpn, Rkey, Transport,
};
use std::collections::VecDeque;

/// An answer waiting to be sent, in PSN order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outgoing {
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
        /// The responses reach the READ's end (false: a run of responses from its
        /// middle asked again under selective repeat, all sent as Middle).
        tail: bool,
        msn: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    /// A selective ACK (see `qp/selective.rs`): everything through `cumulative`
    /// arrived, and so did the `held` packets from `seen` on (0: `seen` arrived
    /// but was not kept; it must be resent).
    Sack {
        cumulative: Psn,
        seen: Psn,
        held: u32,
    },
}

/// The queue of answers.
#[derive(Debug, Default)]
pub(super) struct Answers {
    out: VecDeque<Outgoing>,
    /// The entries reserved once.
    reserved: usize,
    /// How many entries answers to duplicates may fill.
    duplicate_room: usize,
}

/// How full a QP's answer queue is (for tests and diagnostics): the queue is
/// sized once, when the QP is set up, and must never grow past that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnswerQueue {
    /// Answers waiting to be sent now.
    pub queued: usize,
    /// The entries reserved when the QP was set up.
    pub reserved: usize,
    /// The entries the queue has room for without allocating.
    pub capacity: usize,
}

impl Answers {
    /// Sizes the queue once, so the data path does not allocate. Answers to new
    /// requests from a requester within its max_rd_atomic (at most
    /// max_dest_rd_atomic here) take at most 2 × max_dest_rd_atomic + 4 entries:
    /// each READ or atomic outstanding, an ACK between two of them (ACKs in a row
    /// are one), a sequence or RNR NAK and a final error NAK. Duplicates and
    /// selective ACKs get the other half, `DUPLICATE_ROOM`; what does not fit
    /// there is dropped (see `has_room_for_duplicate`), so however many
    /// duplicates arrive while answers cannot leave, the queue never grows.
    pub fn reserve(&mut self, max_dest_rd_atomic: usize) {
        self.duplicate_room = 2 * max_dest_rd_atomic + 8;
        self.reserved = self.duplicate_room + 2 * max_dest_rd_atomic + 8;
        self.out.reserve(self.reserved);
    }

    /// Whether an answer to a duplicate request (or a selective ACK) may be
    /// queued. When not, the responder drops the request as if it had been
    /// lost: a responder may always drop a packet it cannot handle (IBA
    /// 9.7.5.1.1 answers duplicates only to help the requester; a lost request
    /// or answer is recovered by its retry, IBA 9.7.6.1.3), and the requester
    /// asks again once its timer runs out. Answers to new requests are never
    /// dropped: they have their own room.
    pub fn has_room_for_duplicate(&self) -> bool {
        self.out.len() < self.duplicate_room
    }

    /// Whether answers to a new request may be queued. Only a requester with
    /// more READs and atomics outstanding than max_dest_rd_atomic (its
    /// max_rd_atomic is set to at most that, ibv_modify_qp(3)) fills the room
    /// `reserve` counts; two entries stay for the NAKs it counts. The request
    /// is then dropped unexecuted, as if lost: the requester sends it again.
    pub fn has_room_for_new(&self) -> bool {
        self.out.len() + 2 < self.reserved
    }

    pub fn usage(&self) -> AnswerQueue {
        AnswerQueue {
            queued: self.out.len(),
            reserved: self.reserved,
            capacity: self.out.capacity(),
        }
    }

    pub fn push(&mut self, o: Outgoing) {
        self.out.push_back(o);
    }

    /// Queues a NAK, unless the same NAK waits already (a requester retrying
    /// the packet an RNR NAK refused gets one answer per retry, not a queue of
    /// them while answers cannot leave).
    pub fn push_nak(&mut self, psn: Psn, syndrome: AethSyndrome, msn: u32) {
        let nak = Outgoing::Nak { psn, syndrome, msn };
        if !self.out.contains(&nak) {
            self.out.push_back(nak);
        }
    }

    /// Whether an ACK is queued last (another one replaces it).
    pub fn ends_with_ack(&self) -> bool {
        matches!(self.out.back(), Some(Outgoing::Ack { .. }))
    }

    /// Queues an ACK of everything up to `psn`; one ACK covers everything before it
    /// (IBA 9.7.5.1.6), so it replaces an ACK queued last.
    pub fn push_ack(&mut self, psn: Psn, msn: u32) {
        if let Some(Outgoing::Ack { psn: p, msn: m }) = self.out.back_mut() {
            *p = psn;
            *m = msn;
            return;
        }
        self.out.push_back(Outgoing::Ack { psn, msn });
    }

    /// Queues the responses to an RDMA READ of `dma_len` bytes at `va`, from `psn` on.
    pub fn queue_read(&mut self, psn: Psn, va: u64, rkey: Rkey, dma_len: u32, msn: u32) {
        self.out.push_back(Outgoing::Read {
            psn,
            va,
            rkey,
            remaining: dma_len,
            first: true,
            tail: true,
            msn,
        });
    }

    /// Queues the responses to an RDMA READ ahead of every other answer (they
    /// answer an older request asked again), after runs asked again before it
    /// with lower PSNs (a READ asked again hole by hole gets its runs in PSN
    /// order, so the requester sees each run's last, held, response after the
    /// run: see `requester/build.rs`); `tail` if they reach its end.
    pub fn queue_read_first(
        &mut self,
        psn: Psn,
        va: u64,
        rkey: Rkey,
        dma_len: u32,
        tail: bool,
        msn: u32,
    ) {
        let at = self
            .out
            .iter()
            .take_while(|o| matches!(o, Outgoing::Read { psn: p, .. } if p.before(psn)))
            .count();
        self.out.insert(
            at,
            Outgoing::Read {
                psn,
                va,
                rkey,
                remaining: dma_len,
                first: true,
                tail,
                msn,
            },
        );
    }

    /// Whether READ responses for the `packets` PSNs from `psn` on are all still
    /// queued, in one run (responses are sent from a run's front, so a run
    /// queued from an earlier PSN covers a later one asked again).
    pub fn has_read_covering(&self, psn: Psn, packets: u32, mtu: u32) -> bool {
        self.out.iter().any(|o| match *o {
            Outgoing::Read {
                psn: p, remaining, ..
            } => {
                let queued = remaining.div_ceil(mtu.max(1)).max(1);
                psn.in_window(p, queued) && p.distance_to(psn) + packets <= queued
            }
            _ => false,
        })
    }

    /// Drops the queued READ response runs that start within the `packets` PSNs
    /// from `psn` (they are about to be queued again as one run).
    pub fn drop_read_runs_in(&mut self, psn: Psn, packets: u32) {
        self.out.retain(|o| match *o {
            Outgoing::Read { psn: p, .. } => !p.in_window(psn, packets),
            _ => true,
        });
    }

    /// Drops queued answers from `psn` on (they are about to be regenerated); NAKs
    /// stay.
    pub fn drop_from(&mut self, psn: Psn) {
        self.out.retain(|o| match *o {
            Outgoing::Read { psn: p, .. }
            | Outgoing::Atomic { psn: p, .. }
            | Outgoing::Ack { psn: p, .. } => p.before(psn),
            Outgoing::Sack { cumulative, .. } => cumulative.before(psn),
            Outgoing::Nak { .. } => true,
        });
    }

    /// Keeps only NAKs (the QP went to ERR for another reason than a refusal: the
    /// NAKs it owes still go out).
    pub fn keep_naks(&mut self) {
        self.out.retain(|o| matches!(o, Outgoing::Nak { .. }));
    }

    pub fn clear(&mut self) {
        self.out.clear();
    }

    fn has_nak(&self) -> bool {
        self.out.iter().any(|o| matches!(o, Outgoing::Nak { .. }))
    }

    /// Whether something is to be sent; in ERR only a final NAK and the answers
    /// queued ahead of it are.
    pub fn has_output(&self, in_error: bool) -> bool {
        if in_error {
            self.has_nak()
        } else {
            !self.out.is_empty()
        }
    }
}

/// What answering needs of the QP.
pub(crate) struct AnswerCtx<'a> {
    pub shared: &'a mut Shared,
    pub dest_qp: Qpn,
    pub mtu: u32,
    pub pd: PdHandle,
    pub handle: QpHandle,
    pub in_error: bool,
}

/// What polling the answer queue produced.
pub(crate) enum Polled {
    /// A packet of this many bytes is in the buffer (unsealed).
    Packet(usize),
    /// A READ's memory went away while it was being answered: a Remote Access Error
    /// NAK now heads the queue, and the QP must go to ERR with this event.
    Fatal(AsyncEvent),
}

impl Responder {
    /// Builds the next answer packet into `buf`.
    pub fn poll_answer(&mut self, ctx: AnswerCtx<'_>, buf: &mut [u8]) -> Option<Polled> {
        let out = &mut self.answers.out;
        let item = *out.front()?;
        if ctx.in_error && !self.answers.has_nak() {
            self.answers.clear();
            return None;
        }
        let dest_qp = ctx.dest_qp;
        // Answers to a requester doing selective repeat say so (`qp/selective.rs`).
        let mark = if self.sr.active { selective::ANSWER } else { 0 };
        let out = &mut self.answers.out;
        let len = match item {
            Outgoing::Ack { psn, msn } => {
                out.pop_front();
                emit_ack(dest_qp, psn, AethSyndrome::ACK_UNLIMITED, msn, mark, buf)
            }
            Outgoing::Nak { psn, syndrome, msn } => {
                out.pop_front();
                emit_ack(dest_qp, psn, syndrome, msn, mark, buf)
            }
            Outgoing::Sack {
                cumulative,
                seen,
                held,
            } => {
                out.pop_front();
                // The MSN field carries the PSN reported on.
                let mark = if held > 0 {
                    selective::sack_run(held)
                } else {
                    selective::SACK_SEEN
                };
                let syndrome = AethSyndrome::ACK_UNLIMITED;
                emit_ack(dest_qp, cumulative, syndrome, seen.value(), mark, buf)
            }
            Outgoing::Atomic { psn, orig, msn } => {
                out.pop_front();
                let mut bth = BthRepr::new(Opcode::RcAtomicAcknowledge, dest_qp, psn);
                bth.resv7 = mark;
                let mut repr = PacketRepr::new(bth, &[]);
                repr.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn,
                });
                repr.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                let header_len = repr.emit_headers(0, buf).ok()?;
                packet::finish(buf, header_len, 0).ok()
            }
            Outgoing::Read {
                psn,
                va,
                rkey,
                remaining,
                first,
                tail,
                msn,
            } => {
                let n = remaining.min(ctx.mtu);
                let last = remaining <= ctx.mtu;
                let pos = match (first, last) {
                    _ if !tail => Position::Middle,
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
                let opcode = Opcode::find(Transport::Rc, OpKind::RdmaReadResponse, pos, headers)?;
                let mut bth = BthRepr::new(opcode, dest_qp, psn);
                bth.resv7 = mark;
                let mut repr = PacketRepr::new(bth, &[]);
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
                    ctx.shared
                        .mrs
                        .resolve_remote(
                            rkey.0,
                            ctx.pd,
                            ctx.handle,
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
                    // The region went away while the READ was being answered
                    // (IBA 9.7.5.1.3: a remote access error).
                    out.pop_front();
                    let syndrome = AethSyndrome::Nak(NakCode::RemoteAccessError);
                    out.push_front(Outgoing::Nak { psn, syndrome, msn });
                    ctx.shared.counters.nak_error_sent += 1;
                    return Some(Polled::Fatal(AsyncEvent::QpAccessError(ctx.handle)));
                }
                if last {
                    out.pop_front();
                } else if let Some(Outgoing::Read {
                    psn: p,
                    va: v,
                    remaining: r,
                    first: f,
                    ..
                }) = out.front_mut()
                {
                    *p = psn.next();
                    *v = va.wrapping_add(u64::from(n));
                    *r = remaining - n;
                    *f = false;
                }
                packet::finish(buf, header_len, n as usize).ok()
            }
        };
        len.map(Polled::Packet)
    }
}

/// An ACK or NAK (unsealed); returns its length.
fn emit_ack(
    dest_qp: Qpn,
    psn: Psn,
    syndrome: AethSyndrome,
    msn: u32,
    resv7: u8,
    buf: &mut [u8],
) -> Option<usize> {
    let mut bth = BthRepr::new(Opcode::RcAcknowledge, dest_qp, psn);
    bth.resv7 = resv7;
    let mut repr = PacketRepr::new(bth, &[]);
    repr.aeth = Some(AethRepr { syndrome, msn });
    let header_len = repr.emit_headers(0, buf).ok()?;
    packet::finish(buf, header_len, 0).ok()
}
