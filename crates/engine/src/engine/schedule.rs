//! Scheduling: the timer heap, the queue of QPs with something to send, and what
//! runs after anything touched a QP.

use super::Engine;
use crate::closed::FarewellAck;
use crate::node::{Transmit, MAX_DATAGRAM};
use crate::qp::Qp;
use crate::time::Instant;
use crate::types::QpHandle;
use softverbs_wire::{packet, AethRepr, AethSyndrome, BthRepr, Opcode, PacketRepr};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

impl Engine {
    /// Timers due at `now` fire.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((deadline, qp))) = self.timers.peek() {
            if deadline > now {
                break;
            }
            self.timers.pop();
            let Some(q) = self.qps.get_mut(qp.0) else {
                continue;
            };
            if q.timer_entry != Some(deadline) {
                continue; // superseded
            }
            q.timer_entry = None;
            q.handle_timeout(&mut self.shared, now);
            self.after_activity(qp);
        }
    }

    /// When [`Engine::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Writes the next datagram into `buf` (at least [`MAX_DATAGRAM`] bytes),
    /// unsealed: the caller seals it with [`Transmit::seal`] for the IPv4
    /// Identification it goes out with.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if buf.len() < MAX_DATAGRAM {
            return None;
        }
        let src = self.shared.config.local_addr;
        if let Some(ack) = self.closed.poll_ack() {
            if let Some(len) = emit_farewell_ack(ack, buf) {
                self.shared.counters.tx_packets += 1;
                self.shared.counters.tx_bytes += len as u64;
                let dst = ack.dst;
                return Some(Transmit { src, dst, len });
            }
        }
        let mut budget = self.ready.len();
        while budget > 0 {
            budget -= 1;
            let qp = self.ready.pop_front()?;
            let Some(q) = self.qps.get_mut(qp.0) else {
                continue;
            };
            // Answers go to the QP's peer; requests say where they go (UD).
            let produced = if q.resp.has_output(q.state()) {
                q.poll_response(&mut self.shared, buf).zip(q.peer())
            } else {
                None
            };
            let window = self.shared.config.device_window;
            let room = q.device_room(self.inflight, window);
            let produced = produced.or_else(|| {
                room.then(|| q.poll_request(&mut self.shared, now, buf))
                    .flatten()
            });
            q.stop_if_completion_lost(&mut self.shared);
            // With the one borrow of the QP (this runs once per packet sent).
            account_qp(&mut self.inflight, q);
            let answers = q.resp.has_output(q.state());
            let requests = !answers && q.requester_ready();
            if answers || requests && q.device_room(self.inflight, window) {
                self.ready.push_back(qp);
            } else {
                q.scheduled = false;
                if requests && !q.device_blocked {
                    q.device_blocked = true;
                    self.blocked.push_back(qp);
                }
            }
            rearm_qp(&mut self.timers, qp, q);
            if let Some((len, dst)) = produced {
                self.shared.counters.tx_packets += 1;
                self.shared.counters.tx_bytes += len as u64;
                return Some(Transmit { src, dst, len });
            }
        }
        None
    }

    /// Whether destroyed RC QPs may still owe an ACK, and if so the largest local ACK
    /// timeout exponent among them: a driver closing the device may stay up about two
    /// such timeouts after its last datagram arrived so a peer's retransmission finds an
    /// answer (see `closed.rs`).
    pub fn closed_qp_timeout(&self) -> Option<u8> {
        self.closed.max_timeout()
    }

    /// After anything touched a QP: schedule it for transmission and re-arm its
    /// timer.
    pub(super) fn after_activity(&mut self, qp: QpHandle) {
        if let Some(q) = self.qps.get_mut(qp.0) {
            q.stop_if_completion_lost(&mut self.shared);
            // Memory window binds and local invalidates take effect as soon as
            // the send queue reaches them, not at the next poll_transmit.
            q.run_local_ops_now(&mut self.shared);
            account_qp(&mut self.inflight, q);
            if !q.scheduled {
                let answers = q.resp.has_output(q.state());
                let requests = !answers && q.requester_ready();
                let room = q.device_room(self.inflight, self.shared.config.device_window);
                if answers || requests && room {
                    q.scheduled = true;
                    self.ready.push_back(qp);
                } else if requests && !q.device_blocked {
                    q.device_blocked = true;
                    self.blocked.push_back(qp);
                }
            }
            rearm_qp(&mut self.timers, qp, q);
            if q.sq.held > 0 && !q.held_queued && q.first_held_ready().is_some() {
                q.held_queued = true;
                self.held_ready.push_back(qp);
            }
        }
        self.wake_blocked();
    }

    /// Room opened under the device window: QPs waiting for it go back to the
    /// transmit queue, oldest first, while it lasts.
    fn wake_blocked(&mut self) {
        if self.blocked.is_empty() {
            return;
        }
        let window = u64::from(self.shared.config.device_window);
        while self.inflight < window {
            let Some(qp) = self.blocked.pop_front() else {
                return;
            };
            let Some(q) = self.qps.get_mut(qp.0) else {
                continue;
            };
            q.device_blocked = false;
            if !q.scheduled && q.requester_ready() {
                q.scheduled = true;
                self.ready.push_back(qp);
            }
        }
    }
}

/// Counts `q`'s packets in flight into the device's total `inflight` anew.
#[inline]
fn account_qp(inflight: &mut u64, q: &mut Qp) {
    let now = q.outstanding();
    *inflight = *inflight - u64::from(q.inflight) + u64::from(now);
    q.inflight = now;
}

/// Puts QP `qp`'s earliest deadline in the timer heap: one entry per QP at its
/// earliest deadline; later moves are lazy.
#[inline]
fn rearm_qp(timers: &mut BinaryHeap<Reverse<(Instant, QpHandle)>>, qp: QpHandle, q: &mut Qp) {
    let Some(deadline) = q.next_deadline() else {
        return;
    };
    if q.timer_entry.is_none_or(|t| deadline < t) {
        q.timer_entry = Some(deadline);
        timers.push(Reverse((deadline, qp)));
    }
}

/// Builds the ACK a closed QP owes into `buf` (unsealed); returns its length.
fn emit_farewell_ack(ack: FarewellAck, buf: &mut [u8]) -> Option<usize> {
    let bth = BthRepr::new(Opcode::RcAcknowledge, ack.dest_qp, ack.psn);
    let mut repr = PacketRepr::new(bth, &[]);
    repr.aeth = Some(AethRepr {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: ack.msn,
    });
    let header_len = repr.emit_headers(0, buf).ok()?;
    packet::finish(buf, header_len, 0).ok()
}
