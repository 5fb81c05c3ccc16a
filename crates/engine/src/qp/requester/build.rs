//! Building the request packet at the send cursor (IBA 9.7.2 - 9.7.4): which
//! opcode and headers this packet of its WQE carries, its payload gathered from
//! registered memory (or the inline copy), and where the cursor goes next.

use super::{Mode, Requester, SendCtx, Sent};
use crate::mr::KeyError;
use crate::qp::selective::{self, Peer};
use crate::wc::WcStatus;
use crate::wr::{SendFlags, SendOp};
use softverbs_wire::packet::{self, BTH_LEN};
use softverbs_wire::{
    AtomicEthRepr, BthRepr, DethRepr, HeaderSet, OpKind, Opcode, PacketRepr, Position, Qkey, Qpn,
    RethRepr, Transport,
};

fn position(index: u32, count: u32) -> Position {
    match (index == 0, index + 1 == count) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl Requester {
    /// Builds the next request packet into `buf` (unsealed). The caller checked
    /// that the requester may send one now ([`Requester::ready`]).
    pub fn poll_ready(&mut self, ctx: &mut SendCtx<'_>, buf: &mut [u8]) -> Sent {
        debug_assert!(self.ready(ctx));
        if self.cursor == self.started {
            if let Err(status) = self.start_wqe(ctx) {
                return Sent::Failed {
                    seq: self.cursor,
                    status,
                };
            }
        }
        let seq = self.cursor;
        let wqe = *ctx.sq.get(seq);
        let mtu = ctx.mtu;
        let k = self.cursor_pkt;
        let psn = wqe.first_psn.add(k);
        // UD names its destination in each work request; connected QPs have one
        // peer.
        let (dst, dest_qp_ud) = match wqe.op {
            SendOp::UdSend {
                dest, remote_qpn, ..
            } => (dest, Some(remote_qpn)),
            _ => match ctx.attr.av {
                Some(peer) => (peer, None),
                None => return Sent::Nothing,
            },
        };
        let dest_qp = Qpn::new(ctx.attr.dest_qp_num);

        let (kind, headers_extra) = match wqe.op {
            SendOp::Send => (OpKind::Send, HeaderSet::NONE),
            SendOp::SendWithImm { .. } => (OpKind::Send, HeaderSet::IMMDT),
            SendOp::SendWithInv { .. } => (OpKind::Send, HeaderSet::IETH),
            SendOp::RdmaWrite { .. } => (OpKind::RdmaWrite, HeaderSet::NONE),
            SendOp::RdmaWriteWithImm { .. } => (OpKind::RdmaWrite, HeaderSet::IMMDT),
            SendOp::RdmaRead { .. } => (OpKind::RdmaReadRequest, HeaderSet::NONE),
            SendOp::AtomicCmpSwap { .. } => (OpKind::CompareSwap, HeaderSet::NONE),
            SendOp::AtomicFetchAdd { .. } => (OpKind::FetchAdd, HeaderSet::NONE),
            SendOp::UdSend { imm: None, .. } => (OpKind::Send, HeaderSet::DETH),
            SendOp::UdSend { imm: Some(_), .. } => {
                (OpKind::Send, HeaderSet::DETH.with(HeaderSet::IMMDT))
            }
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => return Sent::Nothing,
        };
        let is_read = kind == OpKind::RdmaReadRequest;
        let pos = if is_read || wqe.op.is_atomic() {
            Position::Only
        } else {
            position(k, wqe.npsn)
        };
        let last_packet = is_read || wqe.op.is_atomic() || k + 1 == wqe.npsn;

        // Which optional headers this particular packet carries.
        let mut headers = HeaderSet::NONE;
        if matches!(kind, OpKind::RdmaWrite) && pos.starts_message() {
            headers = headers.with(HeaderSet::RETH);
        }
        if pos.ends_message() {
            headers = headers.with(headers_extra);
        }
        if is_read {
            headers = HeaderSet::RETH;
        }
        if wqe.op.is_atomic() {
            headers = HeaderSet::ATOMIC_ETH;
        }
        let Some(opcode) = Opcode::find(ctx.transport, kind, pos, headers) else {
            return Sent::Nothing;
        };
        let reliable = ctx.transport == Transport::Rc;
        let dest_qp = dest_qp_ud.unwrap_or(dest_qp);

        let mut bth = BthRepr::new(opcode, dest_qp, psn);
        self.since_ack_req += 1;
        // Ask for an ACK at the end of every message and every ack_req_interval
        // packets (half the window if that is less), so long messages free window
        // space as they go (IBA 9.7.6.1.1); and on the packet that fills the window,
        // or nothing would be acknowledged until a timer fired. A tail-loss probe
        // asks too. UC is never acknowledged (IBA 9.8.2).
        let window = ctx.window;
        let interval = ctx
            .shared
            .config
            .ack_req_interval
            .min((window.size / 2).max(1));
        let fills_window = window.una.distance_to(psn.next()) >= window.size;
        bth.ack_req = reliable
            && (last_packet || self.since_ack_req >= interval || fills_window || self.probing);
        if bth.ack_req {
            self.since_ack_req = 0;
        }
        bth.solicited = pos.ends_message() && wqe.flags.contains(SendFlags::SOLICITED);
        if ctx.offer_sr {
            // The packet's index in its message lets a responder doing selective
            // repeat place it ahead (see `qp/selective.rs`).
            let index = if is_read || wqe.op.is_atomic() { 0 } else { k };
            bth.resv7 = crate::qp::selective::offer(index);
        }
        let mut repr = PacketRepr::new(bth, &[]);
        let offset = k * mtu;
        let payload_len = if is_read || wqe.op.is_atomic() || wqe.placed {
            0
        } else {
            (wqe.length - offset.min(wqe.length)).min(mtu)
        };
        match wqe.op {
            SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. }
                if pos.ends_message() =>
            {
                repr.immdt = Some(imm);
            }
            SendOp::SendWithInv { rkey } if pos.ends_message() => repr.ieth = Some(rkey),
            SendOp::UdSend {
                remote_qkey, imm, ..
            } => {
                // A Q_Key with the top bit set asks for the QP's own (IBA 10.2.4).
                let qkey = if remote_qkey.is_controlled() {
                    Qkey(ctx.attr.qkey)
                } else {
                    remote_qkey
                };
                repr.deth = Some(DethRepr {
                    qkey,
                    src_qp: ctx.qpn,
                });
                repr.immdt = imm;
            }
            _ => {}
        }
        // A READ asked again under selective repeat: the next response missing
        // after the run this request asks for.
        let mut next_hole: Option<u32> = None;
        match wqe.op {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } if pos.starts_message() => {
                repr.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: wqe.length,
                });
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                // A READ resumed after a loss asks only for what is still missing
                // (IBA 9.7.5.1.3 lets the requester restart mid-message); a peer
                // doing selective repeat is asked only for the run of responses
                // missing up to the next one placed ahead (`qp/selective.rs`).
                let rest = wqe.length - offset.min(wqe.length);
                let resent = psn.before(self.frontier);
                let dma_len = if resent && ctx.board.peer == Peer::Selective {
                    // The run missing, and the response after it (held already):
                    // its copy arriving with the run still missing says the run
                    // was lost again.
                    // Only the scoreboard's window is known: with no response
                    // held within it (a READ longer than the window), all the
                    // rest is asked for, as go-back-N does.
                    let scanned = (wqe.npsn - k).min(selective::WINDOW);
                    let missing = (k..k + scanned)
                        .take_while(|&j| !ctx.board.has(wqe.first_psn.add(j)))
                        .count() as u32;
                    if missing < scanned && k + missing + 1 < wqe.npsn {
                        // The next run missing after the held one is asked for
                        // in this walk too (the next request, see below): one
                        // round trip for every hole of the READ, not one each.
                        // Only a hole with a response held after it is known
                        // lost (the responder answers in order); the rest may be
                        // on its way.
                        let has = |j: u32| ctx.board.has(wqe.first_psn.add(j));
                        next_hole = (k + missing + 1..k + scanned)
                            .find(|&j| !has(j))
                            .filter(|&j| (j + 1..k + scanned).any(has));
                        (missing + 1) * mtu
                    } else {
                        rest
                    }
                } else {
                    rest
                };
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(u64::from(offset)),
                    rkey,
                    dma_len,
                });
            }
            SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
            }
            _ => {}
        }
        let Ok(header_len) = repr.emit_headers(payload_len as usize, buf) else {
            return Sent::Nothing;
        };
        if payload_len > 0 {
            let out = &mut buf[header_len..header_len + payload_len as usize];
            let copied: Result<(), KeyError> = if wqe.flags.contains(SendFlags::INLINE) {
                out.copy_from_slice(
                    &ctx.sq.inline_data(seq)[offset as usize..][..payload_len as usize],
                );
                Ok(())
            } else {
                ctx.shared.gather(ctx.pd, ctx.sq.sges(seq), offset, out)
            };
            if copied.is_err() {
                // The memory was deregistered after the WQE started.
                return Sent::Failed {
                    seq,
                    status: WcStatus::LocProtErr,
                };
            }
        }
        let Ok(len) = packet::finish(buf, header_len, payload_len as usize) else {
            return Sent::Nothing;
        };
        debug_assert!(len >= BTH_LEN);

        // Advance the cursor: to the READ's next hole if this walk covers it.
        let next_hole = next_hole.filter(|&j| match self.mode {
            Mode::Retransmit { until } => wqe.first_psn.add(j).before(until),
            _ => false,
        });
        if let Some(j) = next_hole {
            self.cursor_pkt = j;
        } else if last_packet {
            self.cursor += 1;
            self.cursor_pkt = 0;
        } else {
            self.cursor_pkt += 1;
        }
        // Sent before: a retransmission (a go-back's, a walk's, a probe's).
        let again = psn.before(self.frontier);
        let fresh = self.advance_frontier(ctx.sq, psn) && bth.ack_req;
        self.probing = false;
        let skipped = self.skip_held(ctx.sq, ctx.board, ctx.window.una);
        ctx.shared.counters.sr_skipped += u64::from(skipped);
        if again {
            ctx.shared.counters.retransmitted_packets += 1;
        }
        if let Mode::Retransmit { until } = self.mode {
            if !psn.before(until) {
                self.mode = Mode::Normal;
            }
        }
        Sent::Packet {
            len,
            dst,
            psn,
            ends_wqe: last_packet.then_some(seq),
            fresh,
        }
    }
}
