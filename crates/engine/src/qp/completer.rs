//! The completer: processes ACKs, NAKs, READ responses and atomic ACKs; runs the
//! local ACK and RNR timers; retires send WQEs in order (IBA 9.7.5.2, 9.7.6).

use super::Qp;
use crate::shared::Shared;
use crate::time::Instant;
use crate::timers::{self, RNR_RETRY_INFINITE};
use crate::types::QpState;
use crate::wc::WcStatus;
use crate::wr::SendOp;
use softverbs_wire::{AethSyndrome, NakCode, OpKind, Psn, RocePacket};

impl Qp {
    /// A response packet (ACK, atomic ACK, READ response) for this QP's requester.
    pub fn handle_response(&mut self, shared: &mut Shared, now: Instant, pkt: &RocePacket<&[u8]>) {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            shared.counters.drop_bad_state += 1;
            return;
        }
        let psn = pkt.bth().psn();
        // A response must name a PSN the requester has sent and not yet seen
        // acknowledged, or the last acknowledged one (a duplicate): [una - 1, next_psn).
        let base = self.req.una.sub(1);
        if base.distance_to(psn) >= base.distance_to(self.req.next_psn) {
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        let aeth = pkt
            .aeth()
            .and_then(|h| AethSyndrome::from_byte(h.syndrome()).ok());
        match pkt.info().kind {
            OpKind::Acknowledge => match aeth {
                Some(AethSyndrome::Ack { .. }) => self.ack_through(shared, now, psn),
                Some(AethSyndrome::RnrNak { timer }) => self.on_rnr_nak(shared, now, psn, timer),
                Some(AethSyndrome::Nak(code)) => self.on_nak(shared, now, psn, code),
                None => shared.counters.drop_malformed += 1,
            },
            OpKind::AtomicAcknowledge => {
                let Some(orig) = pkt.atomic_ack_eth().map(|h| h.orig()) else {
                    return;
                };
                self.on_atomic_ack(shared, now, psn, orig);
            }
            OpKind::RdmaReadResponse => self.on_read_response(shared, now, psn, pkt),
            _ => shared.counters.drop_bad_state += 1,
        }
        self.retire(shared);
    }

    /// Everything up to and including `psn` is acknowledged.
    fn ack_through(&mut self, _shared: &mut Shared, now: Instant, psn: Psn) {
        let next_una = psn.next();
        if !self.req.una.before(next_una) {
            return; // nothing new
        }
        let mut una = next_una;
        let mut seq = self.sq.head;
        while seq < self.req.started {
            let w = *self.sq.get(seq);
            if w.done.is_none() {
                if w.first_psn.after(psn) {
                    break;
                }
                match w.op {
                    SendOp::RdmaRead { .. }
                    | SendOp::AtomicCmpSwap { .. }
                    | SendOp::AtomicFetchAdd { .. } => {
                        // An ACK beyond a READ or atomic whose responses we lack
                        // means they were lost: go back for them (IBA 9.7.5.2.2,
                        // implied NAK).
                        let missing = w.first_psn.add(w.read_pkts_done);
                        una = missing;
                        if self.req.rewound_to != Some(missing) {
                            self.on_loss(false);
                            self.rewind_to(missing);
                        }
                        break;
                    }
                    _ => {
                        if w.last_psn().after(psn) {
                            break;
                        }
                        self.sq.get_mut(seq).done = Some(WcStatus::Success);
                    }
                }
            }
            seq += 1;
        }
        self.progress(now, una);
    }

    /// The oldest unacknowledged PSN moved to `una`: retries reset, timer restarts.
    fn progress(&mut self, now: Instant, una: Psn) {
        if !self.req.una.before(una) {
            return;
        }
        let acked = self.req.una.distance_to(una);
        self.req.una = una;
        if self.req.cwnd != 0 {
            self.req.cwnd = self.req.cwnd.saturating_add(acked);
        }
        self.req.retry_left = self.attr.retry_cnt;
        if self.req.rnr_retry_left != RNR_RETRY_INFINITE {
            self.req.rnr_retry_left = self.attr.rnr_retry;
        }
        if self.req.rewound_to.is_some_and(|r| r.before(una)) {
            self.req.rewound_to = None;
        }
        // If the cursor is behind una (duplicates still queued to resend), skip ahead.
        if self.req.cursor < self.req.started {
            let w = self.sq.get(self.req.cursor);
            let cursor_psn = w.first_psn.add(self.req.cursor_pkt);
            if cursor_psn.before(una) {
                if matches!(w.op, SendOp::RdmaRead { .. }) {
                    // A READ to ask again asks only for the responses still
                    // missing; left behind una, the requester would never send.
                    self.req.cursor_pkt = self.req.cursor_pkt.max(w.read_pkts_done);
                } else {
                    self.rewind_to(una);
                    self.req.rewound_to = None;
                }
            }
        }
        self.req.retrans_deadline = if self.req.una == self.req.next_psn {
            None
        } else {
            timers::ack_timeout(self.attr.timeout).map(|d| now + d)
        };
    }

    fn on_rnr_nak(&mut self, shared: &mut Shared, now: Instant, psn: Psn, timer: u8) {
        shared.counters.rnr_nak_received += 1;
        if self.nak_is_stale(shared, psn) {
            return;
        }
        if self.req.rnr_deadline.is_some() && self.req.rewound_to == Some(self.resend_from(psn)) {
            // A copy of the RNR NAK being waited out (the network duplicated it, or
            // the responder refused a duplicated request twice): one refusal.
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        self.ack_through(shared, now, psn.sub(1));
        if self.state() == QpState::Err {
            return;
        }
        if self.req.rnr_retry_left == 0 {
            if let Some(seq) = self.wqe_with_psn(psn) {
                self.fail_wqe(shared, seq, WcStatus::RnrRetryExcErr);
            }
            return;
        }
        if self.req.rnr_retry_left != RNR_RETRY_INFINITE {
            self.req.rnr_retry_left -= 1;
        }
        // Wait, then resend from the refused packet (IBA 9.7.5.2.8), or from an
        // earlier READ or atomic still lacking its response.
        self.rewind_to(self.resend_from(psn));
        self.req.rnr_deadline = Some(now + timers::rnr_delay(timer));
        self.req.retrans_deadline = None;
    }

    /// Whether a NAK names a PSN acknowledged since (a delayed duplicate, or
    /// spoofed) or one no unfinished WQE owns: such a NAK is counted and ignored
    /// (IBA 9.7.5.2.5 - 9.7.5.2.8 apply a NAK to the request it names). Acting on
    /// it would move the send cursor behind una, or fail work the NAK is not about.
    fn nak_is_stale(&self, shared: &mut Shared, psn: Psn) -> bool {
        let stale = psn.before(self.req.una) || self.wqe_with_psn(psn).is_none();
        if stale {
            shared.counters.drop_out_of_sequence += 1;
        }
        stale
    }

    fn on_nak(&mut self, shared: &mut Shared, now: Instant, psn: Psn, code: NakCode) {
        if code == NakCode::PsnSequenceError {
            shared.counters.nak_seq_received += 1;
            if self.nak_is_stale(shared, psn) {
                return;
            }
            // Everything before the expected PSN arrived (IBA 9.7.5.2.5).
            self.ack_through(shared, now, psn.sub(1));
            let from = self.resend_from(psn);
            if self.state() == QpState::Err || self.req.rewound_to == Some(from) {
                return;
            }
            if self.req.retry_left == 0 {
                let seq = self.wqe_with_psn(from).unwrap_or(self.sq.head);
                self.fail_wqe(shared, seq, WcStatus::RetryExcErr);
                return;
            }
            self.req.retry_left -= 1;
            self.on_loss(false);
            self.rewind_to(from);
            return;
        }
        shared.counters.nak_error_received += 1;
        if self.nak_is_stale(shared, psn) {
            return;
        }
        self.ack_through(shared, now, psn.sub(1));
        if self.state() == QpState::Err {
            return;
        }
        let status = match code {
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
            NakCode::PsnSequenceError => unreachable!("handled above"),
        };
        if let Some(seq) = self.wqe_with_psn(psn) {
            self.fail_wqe(shared, seq, status);
        }
    }

    fn on_atomic_ack(&mut self, shared: &mut Shared, now: Instant, psn: Psn, orig: u64) {
        let Some(seq) = self.wqe_with_psn(psn) else {
            shared.counters.drop_out_of_sequence += 1;
            return;
        };
        let w = *self.sq.get(seq);
        if !w.op.is_atomic() || w.done.is_some() {
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        self.ack_through(shared, now, psn.sub(1));
        if self.state() == QpState::Err {
            return;
        }
        // Responses are taken in PSN order (IBA 9.7.5.2.2): while an earlier READ
        // or atomic lacks its response, this one is out of order. ack_through went
        // back for the earlier one; this one is replayed by the responder later.
        if self.req.una != psn {
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        // The old value lands in the single 8-byte local buffer, in host order.
        if shared
            .scatter(self.init.pd, self.sq.sges(seq), 0, &orig.to_ne_bytes())
            .is_err()
        {
            self.fail_wqe(shared, seq, WcStatus::LocProtErr);
            return;
        }
        let wqe = self.sq.get_mut(seq);
        wqe.done = Some(WcStatus::Success);
        wqe.read_pkts_done = 1;
        self.req.rd_atomic_outstanding -= 1;
        self.progress(now, psn.next());
    }

    fn on_read_response(
        &mut self,
        shared: &mut Shared,
        now: Instant,
        psn: Psn,
        pkt: &RocePacket<&[u8]>,
    ) {
        let Some(seq) = self.wqe_with_psn(psn) else {
            shared.counters.drop_out_of_sequence += 1;
            return;
        };
        let w = *self.sq.get(seq);
        if !matches!(w.op, SendOp::RdmaRead { .. }) || w.done.is_some() {
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        // A READ response acknowledges every request before the READ.
        self.ack_through(shared, now, w.first_psn.sub(1));
        if self.state() == QpState::Err {
            return;
        }
        let expected = w.first_psn.add(w.read_pkts_done);
        if self.req.una != expected {
            // An earlier READ or atomic lacks its response: out of order, as for
            // atomic acknowledges above.
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        if psn != expected {
            if expected.before(psn) {
                // A response was lost: ask again from the missing one, once.
                if self.req.rewound_to != Some(expected) {
                    self.on_loss(false);
                    self.rewind_to(expected);
                }
            }
            shared.counters.drop_out_of_sequence += 1;
            return;
        }
        let mtu = self.mtu();
        let k = w.read_pkts_done;
        let offset = k * mtu;
        let want = (w.length - offset.min(w.length)).min(mtu) as usize;
        let last = k + 1 == w.npsn;
        let payload = pkt.payload();
        if payload.len() != want || pkt.info().position.ends_message() != last {
            // Not what this READ asked for.
            self.fail_wqe(shared, seq, WcStatus::BadRespErr);
            return;
        }
        if shared
            .scatter(self.init.pd, self.sq.sges(seq), offset, payload)
            .is_err()
        {
            self.fail_wqe(shared, seq, WcStatus::LocProtErr);
            return;
        }
        let wqe = self.sq.get_mut(seq);
        wqe.read_pkts_done += 1;
        if last {
            wqe.done = Some(WcStatus::Success);
            self.req.rd_atomic_outstanding -= 1;
        }
        self.progress(now, psn.next());
    }

    /// Where to resend from after a NAK for `psn`: `psn`, unless an earlier READ
    /// or atomic still lacks its response (then una stayed on it), since the
    /// responder answers that one only when asked again.
    fn resend_from(&self, psn: Psn) -> Psn {
        if self.req.una.before(psn) {
            self.req.una
        } else {
            psn
        }
    }

    /// The started, unfinished WQE whose PSN range holds `psn`.
    fn wqe_with_psn(&self, psn: Psn) -> Option<u64> {
        (self.sq.head..self.req.started).find(|&seq| self.sq.get(seq).contains_psn(psn))
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
        if self.req.cursor < self.sq.head {
            self.req.cursor = self.sq.head;
            self.req.cursor_pkt = 0;
        }
        self.check_drained(shared);
    }

    /// A timer of this QP may have expired.
    pub fn handle_timeout(&mut self, shared: &mut Shared, now: Instant) {
        if self.req.rnr_deadline.is_some_and(|d| d <= now) {
            // The RNR wait is over: sending resumes from the refused packet.
            self.req.rnr_deadline = None;
            self.req.retrans_deadline = None;
        }
        let Some(deadline) = self.req.retrans_deadline else {
            return;
        };
        if deadline > now {
            return;
        }
        self.req.retrans_deadline = None;
        if self.req.una == self.req.next_psn || !matches!(self.state(), QpState::Rts | QpState::Sqd)
        {
            return;
        }
        shared.counters.ack_timeouts += 1;
        if self.req.retry_left == 0 {
            let seq = self.wqe_with_psn(self.req.una).unwrap_or(self.sq.head);
            self.fail_wqe(shared, seq, WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        self.on_loss(true);
        self.rewind_to(self.req.una);
        self.req.retrans_deadline = None;
    }
}
