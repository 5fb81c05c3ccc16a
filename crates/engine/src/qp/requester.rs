//! The requester: turns send WQEs into request packets (IBA 9.7.2 - 9.7.4).
//!
//! WQEs are segmented at the path MTU; each gets a PSN range when first started
//! (a READ takes one PSN per response packet it will get back). The send cursor
//! walks WQEs and packets; the completer moves it back for go-back-N
//! retransmission, and packets are rebuilt from the WQE and registered memory,
//! so nothing is kept per packet for retransmission.

use super::Qp;
use crate::mr::KeyError;
use crate::shared::Shared;
use crate::time::Instant;
use crate::timers;
use crate::types::{AccessFlags, QpState};
use crate::wc::WcStatus;
use crate::wr::{SendFlags, SendOp};
use softverbs_wire::packet::BTH_LEN;
use softverbs_wire::{
    AtomicEthRepr, BthRepr, DethRepr, HeaderSet, OpKind, Opcode, PacketRepr, Position, Psn, Qkey,
    Qpn, RethRepr, Transport,
};
use std::net::SocketAddr;

/// Requester progress of one QP.
#[derive(Debug, Clone, Default)]
pub(crate) struct Requester {
    /// PSN the next newly started WQE gets.
    pub next_psn: Psn,
    /// WQE the send cursor is on.
    pub cursor: u64,
    /// Packet index within the cursor's WQE (for a READ: the response packet the
    /// request asks to start from).
    pub cursor_pkt: u32,
    /// WQEs below this sequence number have PSNs assigned.
    pub started: u64,
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// READs and atomics started and not complete.
    pub rd_atomic_outstanding: u32,
    /// Transport retries left before RETRY_EXC_ERR (reset on progress).
    pub retry_left: u8,
    /// RNR retries left (7 = infinite).
    pub rnr_retry_left: u8,
    /// Local ACK timer.
    pub retrans_deadline: Option<Instant>,
    /// While set, the requester waits out an RNR NAK.
    pub rnr_deadline: Option<Instant>,
    /// PSN the requester last went back to (suppresses repeated go-backs for the
    /// same loss, e.g. from every READ response after a gap); cleared on progress.
    pub rewound_to: Option<Psn>,
    /// Packets sent since the last AckReq.
    pub since_ack_req: u32,
    /// Whether packets sent now are retransmissions (for counters).
    pub resending_until: Option<Psn>,
    /// SQ_DRAINED already reported for this SQD visit.
    pub sqd_notified: bool,
    /// Loss-adaptive window in PSNs (0: none, the configured window applies).
    pub cwnd: u32,
}

impl Requester {
    /// Starts over at `psn` with the WQE at `head` (RTS, RESET, ERR).
    pub fn reset(&mut self, psn: Psn, head: u64) {
        self.next_psn = psn;
        self.una = psn;
        self.cursor = head;
        self.cursor_pkt = 0;
        self.started = head;
        self.rd_atomic_outstanding = 0;
        self.retrans_deadline = None;
        self.rnr_deadline = None;
        self.rewound_to = None;
        self.since_ack_req = 0;
        self.resending_until = None;
    }
}

/// The smallest loss-adaptive window, in PSNs.
const MIN_WINDOW: u32 = 16;

/// Packets a message of `len` bytes needs at `mtu` (at least one).
pub(crate) fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

fn position(index: u32, count: u32) -> Position {
    match (index == 0, index + 1 == count) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl Qp {
    /// Whether the requester has a packet it may send now.
    pub fn requester_ready(&self) -> bool {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            return false;
        }
        if self.req.rnr_deadline.is_some() {
            return false;
        }
        if self.req.cursor >= self.sq.tail {
            return false;
        }
        if self.req.cursor == self.req.started {
            // A new WQE: SQD starts none (IBA 10.3.1: SQD finishes what was begun).
            if self.state() == QpState::Sqd {
                return false;
            }
            let wqe = self.sq.get(self.req.cursor);
            if wqe.op.is_read_or_atomic()
                && self.req.rd_atomic_outstanding >= u32::from(self.attr.max_rd_atomic).max(1)
            {
                return false;
            }
            // Fence: wait for earlier READs and atomics (IBA 10.8.3.3).
            if wqe.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
                return false;
            }
        }
        let psn = self.cursor_psn();
        self.req.una.distance_to(psn) < self.config_window()
    }

    fn config_window(&self) -> u32 {
        // The window is bounded by half the PSN space whatever the configuration,
        // and by the loss-adaptive window while one is in force.
        let configured = self.req_window.min(Psn::HALF_SPACE);
        match self.req.cwnd {
            0 => configured,
            cwnd => cwnd.min(configured),
        }
    }

    /// A packet was lost (timeout, NAK, a gap in READ responses): shrink the
    /// window so go-back-N does not resend a whole full window into the same
    /// loss again. Halve it, or drop to the floor after a timeout; it grows
    /// back by one PSN per PSN acknowledged.
    pub fn on_loss(&mut self, timeout: bool) {
        let current = self.config_window();
        self.req.cwnd = if timeout {
            MIN_WINDOW
        } else {
            (current / 2).max(MIN_WINDOW)
        };
    }

    /// PSN of the packet at the cursor.
    fn cursor_psn(&self) -> Psn {
        if self.req.cursor < self.req.started {
            self.sq
                .get(self.req.cursor)
                .first_psn
                .add(self.req.cursor_pkt)
        } else {
            self.req.next_psn
        }
    }

    /// Validates a WQE the first time the cursor reaches it and assigns its PSNs.
    /// Returns the error status if the WQE cannot be executed.
    fn start_wqe(&mut self, shared: &Shared) -> Result<(), WcStatus> {
        let seq = self.req.cursor;
        let mtu = self.mtu();
        let pd = self.init.pd;
        let wqe = *self.sq.get(seq);
        if wqe.length > shared.config.max_msg_size {
            return Err(WcStatus::LocLenErr);
        }
        // A UD message is one packet (IBA 9.8.4).
        if matches!(wqe.op, SendOp::UdSend { .. }) && wqe.length > mtu {
            return Err(WcStatus::LocLenErr);
        }
        let local_access = if wqe.op.is_read_or_atomic() {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::EMPTY
        };
        if wqe.op.is_read_or_atomic() && wqe.flags.contains(SendFlags::INLINE) {
            return Err(WcStatus::LocQpOpErr);
        }
        if wqe.op.is_atomic() && wqe.length != 8 {
            return Err(WcStatus::LocLenErr);
        }
        if wqe.op.is_read_or_atomic() && self.attr.max_rd_atomic == 0 {
            return Err(WcStatus::LocQpOpErr);
        }
        let npsn = match wqe.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 1,
            _ => packets_for(wqe.length, mtu),
        };
        // A READ's responses are all in flight at once: they must take less than
        // half the PSN space (at MTU 256, 2 GiB would take exactly half), or PSN
        // order between its request and its last response is undefined (IBA 9.7.1).
        if matches!(wqe.op, SendOp::RdmaRead { .. }) && npsn >= Psn::HALF_SPACE {
            return Err(WcStatus::LocLenErr);
        }
        if !wqe.flags.contains(SendFlags::INLINE) {
            shared
                .check_sges(pd, self.sq.sges(seq), local_access)
                .map_err(|_| WcStatus::LocProtErr)?;
        }
        let first_psn = self.req.next_psn;
        let w = self.sq.get_mut(seq);
        w.first_psn = first_psn;
        w.npsn = npsn;
        w.read_pkts_done = 0;
        w.done = None;
        self.req.next_psn = first_psn.add(npsn);
        self.req.started = seq + 1;
        if wqe.op.is_read_or_atomic() {
            self.req.rd_atomic_outstanding += 1;
        }
        Ok(())
    }

    /// Carries out the local operations at the send cursor, if the requester
    /// may start them now.
    pub fn run_local_ops_now(&mut self, shared: &mut Shared) {
        if self.requester_ready() && self.sq.get(self.req.cursor).op.is_local() {
            self.run_local_ops(shared);
        }
    }

    /// Carries out the local operations (memory window bind, local invalidate)
    /// at the send cursor: each takes effect when the cursor first reaches it,
    /// gets no PSN (`npsn` 0) and is done at once; it retires in order. The
    /// cursor steps over ones already done (after a go-back-N rewind). Returns
    /// false if one failed (the QP has left RTS).
    fn run_local_ops(&mut self, shared: &mut Shared) -> bool {
        let mut ran = false;
        while self.req.cursor < self.sq.tail && self.sq.get(self.req.cursor).op.is_local() {
            let seq = self.req.cursor;
            if seq < self.req.started {
                self.req.cursor += 1;
                self.req.cursor_pkt = 0;
                continue;
            }
            if !self.requester_ready() {
                break;
            }
            let wqe = *self.sq.get(seq);
            let pd = self.init.pd;
            let result = match wqe.op {
                SendOp::BindMw { mw, rkey, info } => {
                    shared.mrs.bind_mw(mw, rkey, &info, self.handle, pd)
                }
                SendOp::LocalInv { rkey } => shared.mrs.local_invalidate(rkey, pd),
                _ => Ok(()),
            };
            let first_psn = self.req.next_psn;
            let w = self.sq.get_mut(seq);
            w.first_psn = first_psn;
            w.npsn = 0;
            w.read_pkts_done = 0;
            w.done = None;
            self.req.started = seq + 1;
            if let Err(status) = result {
                self.fail_wqe(shared, seq, status);
                return false;
            }
            self.sq.get_mut(seq).done = Some(WcStatus::Success);
            self.req.cursor = seq + 1;
            self.req.cursor_pkt = 0;
            ran = true;
        }
        if ran {
            self.retire(shared);
        }
        true
    }

    /// Builds the next request packet into `buf`; returns its length.
    pub fn poll_request(
        &mut self,
        shared: &mut Shared,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        if !self.requester_ready() {
            return None;
        }
        if self.sq.get(self.req.cursor).op.is_local() {
            // Carry out local operations in the way, then go on to a packet.
            if !self.run_local_ops(shared) || !self.requester_ready() {
                return None;
            }
        }
        if self.req.cursor == self.req.started {
            if let Err(status) = self.start_wqe(shared) {
                self.fail_wqe(shared, self.req.cursor, status);
                return None;
            }
        }
        let seq = self.req.cursor;
        let wqe = *self.sq.get(seq);
        let mtu = self.mtu();
        let k = self.req.cursor_pkt;
        let psn = wqe.first_psn.add(k);
        // UD names its destination in each work request; connected QPs have one
        // peer.
        let (dst, dest_qp_ud) = match wqe.op {
            SendOp::UdSend {
                dest, remote_qpn, ..
            } => (dest, Some(remote_qpn)),
            _ => (self.peer()?, None),
        };
        let dest_qp = Qpn::new(self.attr.dest_qp_num);

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
            SendOp::BindMw { .. } | SendOp::LocalInv { .. } => return None,
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
        let opcode = Opcode::find(self.transport(), kind, pos, headers)?;
        let reliable = self.transport() == Transport::Rc;
        let dest_qp = dest_qp_ud.unwrap_or(dest_qp);

        let mut bth = BthRepr::new(opcode, dest_qp, psn);
        self.req.since_ack_req += 1;
        // Ask for an ACK at the end of every message and every ack_req_interval
        // packets, so long messages free window space as they go (IBA 9.7.6.1.1).
        // UC is never acknowledged (IBA 9.8.2).
        bth.ack_req =
            reliable && (last_packet || self.req.since_ack_req >= shared.config.ack_req_interval);
        if bth.ack_req {
            self.req.since_ack_req = 0;
        }
        bth.solicited = pos.ends_message() && wqe.flags.contains(SendFlags::SOLICITED);
        let mut repr = PacketRepr::new(bth, &[]);
        let offset = k * mtu;
        let payload_len = if is_read || wqe.op.is_atomic() {
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
                    Qkey(self.attr.qkey)
                } else {
                    remote_qkey
                };
                repr.deth = Some(DethRepr {
                    qkey,
                    src_qp: self.qpn,
                });
                repr.immdt = imm;
            }
            _ => {}
        }
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
                // (IBA 9.7.5.1.3 lets the requester restart mid-message).
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(u64::from(offset)),
                    rkey,
                    dma_len: wqe.length - offset.min(wqe.length),
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
        let header_len = repr.emit_headers(payload_len as usize, buf).ok()?;
        if payload_len > 0 {
            let out = &mut buf[header_len..header_len + payload_len as usize];
            let copied: Result<(), KeyError> = if wqe.flags.contains(SendFlags::INLINE) {
                out.copy_from_slice(
                    &self.sq.inline_data(seq)[offset as usize..][..payload_len as usize],
                );
                Ok(())
            } else {
                shared.gather(self.init.pd, self.sq.sges(seq), offset, out)
            };
            if copied.is_err() {
                // The memory was deregistered after the WQE started.
                self.fail_wqe(shared, seq, WcStatus::LocProtErr);
                return None;
            }
        }
        let len = Qp::finish_packet(buf, header_len, payload_len as usize)?;
        debug_assert!(len >= BTH_LEN);

        // Advance the cursor.
        if last_packet {
            self.req.cursor += 1;
            self.req.cursor_pkt = 0;
        } else {
            self.req.cursor_pkt += 1;
        }
        if let Some(until) = self.req.resending_until {
            if psn.before(until) {
                shared.counters.retransmitted_packets += 1;
            } else {
                self.req.resending_until = None;
            }
        }
        if !reliable {
            // UC: nothing comes back; the WQE is done once its last packet is sent.
            self.req.una = psn.next();
            if last_packet {
                self.sq.get_mut(seq).done = Some(WcStatus::Success);
                self.retire(shared);
            }
            return Some((len, dst));
        }
        if self.req.retrans_deadline.is_none() {
            self.req.retrans_deadline = timers::ack_timeout(self.attr.timeout).map(|d| now + d);
        }
        Some((len, dst))
    }

    /// Ends a WQE with a local error: the QP goes to ERR and the rest is flushed.
    pub fn fail_wqe(&mut self, shared: &mut Shared, seq: u64, status: WcStatus) {
        if seq < self.sq.tail {
            self.sq.get_mut(seq).done = Some(status);
        }
        // Earlier WQEs that were transport-complete keep their status; the failed
        // one reports its error; everything after is flushed. A UC QP only loses
        // its send queue (SQE); an RC QP goes to ERR.
        if self.init.qp_type != crate::types::QpType::Rc {
            self.enter_send_queue_error(shared);
        } else {
            self.enter_error(shared);
        }
    }

    /// Moves the send cursor back to `psn` for go-back-N retransmission.
    pub fn rewind_to(&mut self, psn: Psn) {
        let mut seq = self.sq.head;
        while seq < self.req.started {
            let w = self.sq.get(seq);
            if w.done.is_none() && w.contains_psn(psn) {
                break;
            }
            if w.done.is_none() && psn.before(w.first_psn) {
                // A gap (PSNs of completed WQEs): restart at this WQE.
                self.req.cursor = seq;
                self.req.cursor_pkt = 0;
                self.note_rewind(psn);
                return;
            }
            seq += 1;
        }
        self.req.cursor = seq;
        self.req.cursor_pkt = if seq < self.req.started {
            let w = self.sq.get(seq);
            let k = w.first_psn.distance_to(psn);
            if matches!(w.op, SendOp::RdmaRead { .. }) {
                k.max(w.read_pkts_done)
            } else {
                k
            }
        } else {
            0
        };
        self.note_rewind(psn);
    }

    fn note_rewind(&mut self, psn: Psn) {
        self.req.rewound_to = Some(psn);
        self.req.since_ack_req = 0;
        self.req.resending_until = Some(self.req.next_psn);
    }
}
