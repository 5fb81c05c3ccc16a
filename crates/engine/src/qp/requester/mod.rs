//! The requester: turns send WQEs into request packets (IBA 9.7.2 - 9.7.4).
//!
//! WQEs are segmented at the path MTU; each gets a PSN range when first started
//! (a READ takes one PSN per response packet it will get back). The send cursor
//! walks WQEs and packets; on the completer's verdict it moves back for go-back-N
//! retransmission, and packets are rebuilt from the WQE and registered memory, so
//! nothing is kept per packet for retransmission.
//!
//! The requester is in one of three modes: sending new packets ([`Mode::Normal`]),
//! going back over packets sent before ([`Mode::Retransmit`]), or waiting out an RNR
//! NAK before doing so ([`Mode::RnrWait`]). Going back, it steps over packets a
//! responder doing selective repeat holds, and a selective walk ends by returning to
//! where sending was (`qp/selective.rs`); a tail-loss probe sends the next new SEND or WRITE packet
//! if only the in-flight cap holds one back, else the newest packet again. It owns its cursor and PSN assignment;
//! the send queue, memory and attributes it works with are lent to each call as a
//! [`SendCtx`], and how much it may have in flight comes from the completer as a
//! [`Window`]. Building a request packet is in `build.rs`.

mod build;

use super::attr::QpAttr;
use super::queues::SendQueue;
use super::selective::{Scoreboard, WINDOW};
use crate::shared::Shared;
use crate::time::Instant;
use crate::types::{AccessFlags, PdHandle, QpHandle, QpState};
use crate::wc::WcStatus;
use crate::wr::{SendFlags, SendOp};
use softverbs_wire::{Psn, Qpn, Transport};
use std::net::SocketAddr;

/// What the requester is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// Sending packets for the first time (or nothing).
    #[default]
    Normal,
    /// Going back over packets sent before (go-back-N): those before `until` are
    /// retransmissions.
    Retransmit { until: Psn },
    /// Waiting out an RNR NAK until `deadline` (IBA 9.7.5.2.8), then retransmitting
    /// up to `until` from the refused packet.
    RnrWait { deadline: Instant, until: Psn },
}

/// Requester progress of one QP.
#[derive(Debug, Clone, Default)]
pub(crate) struct Requester {
    /// PSN the next newly started WQE gets.
    pub next_psn: Psn,
    /// WQE the send cursor is on.
    cursor: u64,
    /// Packet index within the cursor's WQE (for a READ: the response packet the
    /// request asks to start from).
    cursor_pkt: u32,
    /// WQEs below this sequence number have PSNs assigned.
    pub started: u64,
    /// The PSN after the newest packet sent (for a READ, after its responses).
    frontier: Psn,
    /// READs and atomics started and not complete.
    rd_atomic_outstanding: u32,
    /// Packets sent since the last AckReq.
    since_ack_req: u32,
    mode: Mode,
    /// SQ_DRAINED already reported for this SQD visit.
    pub sqd_notified: bool,
    /// A tail-loss probe is due: the packet at the cursor goes even if the
    /// responder holds it (its answer is what the probe is for).
    probing: bool,
}

/// How far past the oldest unacknowledged PSN the requester may send: the
/// completer's to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub una: Psn,
    pub size: u32,
    /// The size that applies to an RDMA READ request (see `Completer::window`).
    pub reads: u32,
    /// The size that applies to an RDMA READ request asked again (a walk over
    /// the responses a READ lacks; see `Completer::window`).
    pub reads_again: u32,
    /// How far past una the requester keeps READ responses that arrive ahead
    /// (selective repeat's window; unbounded otherwise, nothing is kept).
    pub hold: u32,
}

/// What sending needs of the QP, lent for one call.
pub(crate) struct SendCtx<'a> {
    pub shared: &'a mut Shared,
    pub sq: &'a mut SendQueue,
    pub attr: &'a QpAttr,
    pub state: QpState,
    pub transport: Transport,
    pub pd: PdHandle,
    pub handle: QpHandle,
    pub qpn: Qpn,
    pub mtu: u32,
    pub window: Window,
    /// Offer selective repeat on requests (see `qp/selective.rs`).
    pub offer_sr: bool,
    /// What the responder holds (selective repeat).
    pub board: &'a Scoreboard,
}

/// What [`Requester::poll`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// A request packet of `len` bytes (unsealed) for `dst`.
    Packet {
        len: usize,
        dst: SocketAddr,
        psn: Psn,
        /// The last packet of WQE `seq`.
        ends_wqe: Option<u64>,
        /// Sent for the first time, asking for an ACK: its answer times the
        /// round trip.
        fresh: bool,
    },
    /// Local operations were carried out (WQEs done, to retire); nothing was sent.
    LocalOpsDone,
    /// WQE `seq` cannot be executed: it completes with `status`, and the send queue
    /// fails (IBA 10.8.3.3).
    Failed { seq: u64, status: WcStatus },
    /// Nothing to send now.
    Nothing,
}

/// Packets a message of `len` bytes needs at `mtu` (at least one).
pub(crate) fn packets_for(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

/// How the requester moved its cursor when PSNs got acknowledged under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// It did not need to.
    Stayed,
    /// It was on a READ: it now asks only for responses still missing.
    ReadResumed,
    /// It went forward to the oldest unacknowledged PSN.
    MovedToUna,
}

impl Requester {
    /// Starts over at `psn` with the WQE at `head` (RTS, RESET, ERR).
    pub fn reset(&mut self, psn: Psn, head: u64) {
        self.next_psn = psn;
        self.frontier = psn;
        self.cursor = head;
        self.cursor_pkt = 0;
        self.started = head;
        self.rd_atomic_outstanding = 0;
        self.since_ack_req = 0;
        self.mode = Mode::Normal;
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The PSN after the newest packet sent.
    pub fn frontier(&self) -> Psn {
        self.frontier
    }

    /// Whether the packet at the cursor was sent before (the requester is going
    /// back over packets): resending adds nothing in flight.
    #[inline]
    pub fn resending(&self, sq: &SendQueue) -> bool {
        self.cursor < sq.tail && self.cursor_psn(sq).before(self.frontier)
    }

    /// When the RNR wait ends, if the requester is in one.
    pub fn deadline(&self) -> Option<Instant> {
        match self.mode {
            Mode::RnrWait { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// The RNR wait, if any, is over at `now`: resending starts. Returns whether it
    /// just ended.
    pub fn on_timer(&mut self, now: Instant) -> bool {
        match self.mode {
            Mode::RnrWait { deadline, until } if deadline <= now => {
                self.mode = Mode::Retransmit { until };
                true
            }
            _ => false,
        }
    }

    /// A READ or atomic finished.
    pub fn read_atomic_finished(&mut self) {
        self.rd_atomic_outstanding -= 1;
    }

    /// The send queue retired WQEs below `head`: the cursor is not behind it.
    pub fn retired(&mut self, head: u64) {
        if self.cursor < head {
            self.cursor = head;
            self.cursor_pkt = 0;
        }
    }

    /// Whether the requester has a packet it may send now.
    #[inline]
    pub fn ready(&self, ctx: &SendCtx<'_>) -> bool {
        self.ready_with(ctx.state, ctx.sq, ctx.attr, ctx.window)
    }

    #[inline]
    pub fn ready_with(&self, state: QpState, sq: &SendQueue, attr: &QpAttr, w: Window) -> bool {
        if !matches!(state, QpState::Rts | QpState::Sqd) {
            return false;
        }
        if matches!(self.mode, Mode::RnrWait { .. }) {
            return false;
        }
        if self.cursor >= sq.tail {
            return false;
        }
        if self.cursor == self.started {
            // A new WQE: SQD starts none (IBA 10.3.1: SQD finishes what was begun).
            if state == QpState::Sqd {
                return false;
            }
            let wqe = sq.get(self.cursor);
            // Held for placement: nothing starts until the driver settles it
            // (`engine/placed.rs`), so nothing after it is sent before it either.
            if wqe.held {
                return false;
            }
            if wqe.op.is_read_or_atomic()
                && self.rd_atomic_outstanding >= u32::from(attr.max_rd_atomic).max(1)
            {
                return false;
            }
            // Fence: wait for earlier READs and atomics (IBA 10.8.3.3).
            if wqe.flags.contains(SendFlags::FENCE) && self.rd_atomic_outstanding > 0 {
                return false;
            }
        }
        // A new READ request goes under the READ window; READs asked again after a
        // loss stay under the cap, which recovery shrank for them.
        let new_read = self.cursor == self.started
            && matches!(sq.get(self.cursor).op, SendOp::RdmaRead { .. });
        let read_again =
            self.cursor < self.started && matches!(sq.get(self.cursor).op, SendOp::RdmaRead { .. });
        let size = if new_read {
            w.reads
        } else if read_again {
            w.reads_again
        } else {
            w.size
        };
        // A probe is one packet sent before, adding nothing in flight: a cap
        // that shrank since must not hold it back (a probe held back turns the
        // next timeout's resend of the oldest packet into a go-back over
        // everything up to the probe).
        let ahead = w.una.distance_to(self.cursor_psn(sq));
        if new_read && ahead > 0 {
            // A new READ goes only if all its responses fall where they can be
            // kept ahead: a response past that, arriving while an earlier READ
            // waits for a repair, is dropped and asked for again.
            let npsn = packets_for(sq.get(self.cursor).length, attr.path_mtu.bytes());
            if ahead.saturating_add(npsn) > w.hold {
                return false;
            }
        }
        self.probing || ahead < size
    }

    /// PSN of the packet at the cursor.
    #[inline]
    fn cursor_psn(&self, sq: &SendQueue) -> Psn {
        if self.cursor < self.started {
            sq.get(self.cursor).first_psn.add(self.cursor_pkt)
        } else {
            self.next_psn
        }
    }

    /// Whether the cursor is on a local operation (the send queue holds one there).
    #[inline]
    pub fn on_local_op(&self, sq: &SendQueue) -> bool {
        self.cursor < sq.tail && sq.get(self.cursor).runs_locally()
    }

    /// Validates a WQE the first time the cursor reaches it and assigns its PSNs.
    /// Returns the error status if the WQE cannot be executed.
    fn start_wqe(&mut self, ctx: &mut SendCtx<'_>) -> Result<(), WcStatus> {
        let seq = self.cursor;
        let mtu = ctx.mtu;
        let wqe = *ctx.sq.get(seq);
        if wqe.length > ctx.shared.config.max_msg_size {
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
        if wqe.op.is_read_or_atomic() && ctx.attr.max_rd_atomic == 0 {
            return Err(WcStatus::LocQpOpErr);
        }
        let npsn = match wqe.op {
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. } => 1,
            // A placed WRITE is one header-only packet (`engine/placed.rs`).
            _ if wqe.placed => 1,
            _ => packets_for(wqe.length, mtu),
        };
        // A READ's responses are all in flight at once: they must take less than
        // half the PSN space (at MTU 256, 2 GiB would take exactly half), or PSN
        // order between its request and its last response is undefined (IBA 9.7.1).
        if matches!(wqe.op, SendOp::RdmaRead { .. }) && npsn >= Psn::HALF_SPACE {
            return Err(WcStatus::LocLenErr);
        }
        if !wqe.flags.contains(SendFlags::INLINE) {
            ctx.shared
                .check_sges(ctx.pd, ctx.sq.sges(seq), local_access)
                .map_err(|_| WcStatus::LocProtErr)?;
        }
        self.assign_psns(ctx.sq, seq, npsn);
        if wqe.op.is_read_or_atomic() {
            self.rd_atomic_outstanding += 1;
        }
        Ok(())
    }

    /// Gives WQE `seq` its `npsn` PSNs from `next_psn` on; it is started.
    fn assign_psns(&mut self, sq: &mut SendQueue, seq: u64, npsn: u32) {
        let first_psn = self.next_psn;
        let w = sq.get_mut(seq);
        w.first_psn = first_psn;
        w.npsn = npsn;
        w.read_pkts_done = 0;
        w.done = None;
        self.next_psn = first_psn.add(npsn);
        self.started = seq + 1;
    }

    /// Carries out the local operations (memory window bind, local invalidate, placed
    /// READs) at the send cursor: each takes effect when the cursor first reaches it, gets no
    /// PSN (`npsn` 0) and is done at once; it retires in order. The cursor steps over
    /// ones already done (after a go-back-N rewind).
    pub fn run_local_ops(&mut self, ctx: &mut SendCtx<'_>) -> Sent {
        let mut ran = false;
        while self.cursor < ctx.sq.tail && ctx.sq.get(self.cursor).runs_locally() {
            let seq = self.cursor;
            if seq < self.started {
                self.cursor += 1;
                self.cursor_pkt = 0;
                continue;
            }
            if !self.ready(ctx) {
                break;
            }
            let wqe = *ctx.sq.get(seq);
            let result = match wqe.op {
                SendOp::BindMw { mw, rkey, info } => {
                    ctx.shared.mrs.bind_mw(mw, rkey, &info, ctx.handle, ctx.pd)
                }
                SendOp::LocalInv { rkey } => ctx.shared.mrs.local_invalidate(rkey, ctx.pd),
                // A placed WRITE: its bytes landed when it was posted.
                SendOp::RdmaWrite { .. } => Ok(()),
                // A placed READ: its bytes landed when it was posted. Were its local
                // region deregistered since, it fails as a NIC's would (as the UDP path's check;
                // the driver's deregistration waited for the bytes: `engine/placed.rs`).
                _ => ctx
                    .shared
                    .check_sges(ctx.pd, ctx.sq.sges(seq), AccessFlags::LOCAL_WRITE)
                    .map_err(|_| WcStatus::LocProtErr),
            };
            self.assign_psns(ctx.sq, seq, 0);
            if let Err(status) = result {
                return Sent::Failed { seq, status };
            }
            ctx.sq.get_mut(seq).done = Some(WcStatus::Success);
            self.cursor = seq + 1;
            self.cursor_pkt = 0;
            ran = true;
        }
        if ran {
            Sent::LocalOpsDone
        } else {
            Sent::Nothing
        }
    }

    /// Moves the send cursor back to `psn` for go-back-N retransmission; the
    /// packets up to the newest sent are retransmissions.
    pub fn rewind(&mut self, sq: &SendQueue, psn: Psn) {
        if self.seek(sq, psn) {
            self.went_back();
        }
    }

    /// Resends the packets in `[from, until)` the responder does not hold
    /// (selective repeat), then goes on where sending was. A walk under way is
    /// extended instead.
    pub fn walk(&mut self, sq: &SendQueue, from: Psn, until: Psn) {
        match self.mode {
            Mode::RnrWait { .. } => {}
            // A go-back, walk or probe under way, with packets left to send.
            Mode::Retransmit { until: u } if self.cursor_psn(sq).before(u) => {
                let end = if u.before(until) { until } else { u };
                // A walk or go-back whose cursor is already past `from` (it may
                // have sent its last packet and still be in this mode) goes back
                // to `from`: extending it alone would never resend that packet.
                if from.before(self.cursor_psn(sq)) {
                    self.seek(sq, from);
                    self.since_ack_req = 0;
                }
                self.mode = Mode::Retransmit { until: end };
            }
            // Nothing under way, or one that sent its last packet (a probe of
            // the newest packet, with no new packet to send after it, stays in
            // its mode): a walk of its own. Extending that one would go back over
            // everything up to its end (an early timeout resending the oldest
            // packet after a probe resent every packet in flight).
            Mode::Normal | Mode::Retransmit { .. } => {
                self.seek(sq, from);
                self.since_ack_req = 0;
                self.mode = Mode::Retransmit { until };
            }
        }
    }

    /// While going back, steps the cursor over packets the responder holds, and
    /// once past the end of a selective walk, back to where sending was. Returns
    /// how many packets it stepped over.
    ///
    /// Called after every packet sent and every answer: sending new packets (no
    /// loss) it returns at once, without a call.
    #[inline]
    pub fn skip_held(&mut self, sq: &SendQueue, board: &Scoreboard, una: Psn) -> u32 {
        if !matches!(self.mode, Mode::Retransmit { .. }) {
            return 0;
        }
        self.skip_held_going_back(sq, board, una)
    }

    #[inline(never)]
    fn skip_held_going_back(&mut self, sq: &SendQueue, board: &Scoreboard, una: Psn) -> u32 {
        let mut skipped = 0;
        loop {
            let Mode::Retransmit { until } = self.mode else {
                return skipped;
            };
            if self.probing {
                return skipped;
            }
            if self.cursor >= self.started || self.cursor >= sq.tail {
                return skipped;
            }
            let psn = self.cursor_psn(sq);
            if !psn.before(until) {
                if until.before(self.frontier) {
                    let frontier = self.frontier;
                    self.seek(sq, frontier);
                }
                self.mode = Mode::Normal;
                return skipped;
            }
            let w = sq.get(self.cursor);
            // Only SEND and WRITE packets are ever held; the oldest unacknowledged
            // one always goes again (the responder holds it but could not commit
            // it, e.g. its RNR NAK was lost). A READ some of whose responses came
            // reached the responder: it is asked again for what is missing when
            // una reaches it (the completer does that), not from here — unless
            // the cursor is past its next response, on a hole a selective walk
            // asks for (`build.rs`, `Completer::ask_new_hole`).
            let is_read = matches!(w.op, SendOp::RdmaRead { .. });
            let held = psn != una
                && if is_read {
                    self.cursor_pkt <= w.read_pkts_done
                        && (w.read_pkts_done > 0
                            || (0..w.npsn.min(WINDOW)).any(|k| board.has(w.first_psn.add(k))))
                } else {
                    !w.runs_locally() && !w.op.is_atomic() && board.holds(una, psn)
                };
            if !held {
                return skipped;
            }
            skipped += 1;
            if is_read || self.cursor_pkt + 1 >= w.npsn {
                self.cursor += 1;
                self.cursor_pkt = 0;
            } else {
                self.cursor_pkt += 1;
            }
        }
    }

    /// Moves the send cursor to `psn` (mode unchanged); false if nothing is
    /// started there.
    fn seek(&mut self, sq: &SendQueue, psn: Psn) -> bool {
        let mut seq = sq.head;
        while seq < self.started {
            let w = sq.get(seq);
            if w.done.is_none() && w.contains_psn(psn) {
                break;
            }
            if w.done.is_none() && psn.before(w.first_psn) {
                // A gap (PSNs of completed WQEs): restart at this WQE.
                self.cursor = seq;
                self.cursor_pkt = 0;
                return true;
            }
            seq += 1;
        }
        self.cursor = seq;
        self.cursor_pkt = if seq < self.started {
            let w = sq.get(seq);
            let k = w.first_psn.distance_to(psn);
            if matches!(w.op, SendOp::RdmaRead { .. }) {
                k.max(w.read_pkts_done)
            } else {
                k
            }
        } else {
            0
        };
        true
    }

    fn went_back(&mut self) {
        self.since_ack_req = 0;
        let until = self.frontier;
        self.mode = match self.mode {
            // Going back during an RNR wait (a sequence NAK) does not end the wait.
            Mode::RnrWait { deadline, .. } => Mode::RnrWait { deadline, until },
            _ => Mode::Retransmit { until },
        };
    }

    /// Waits out an RNR NAK until `deadline`, then resends from `psn`.
    pub fn wait_rnr(&mut self, sq: &SendQueue, psn: Psn, deadline: Instant) {
        self.rewind(sq, psn);
        self.mode = Mode::RnrWait {
            deadline,
            until: self.frontier,
        };
    }

    /// A tail-loss probe that sends new data (RFC 8985 7.3: "if previously unsent
    /// data is available ..., transmit new data"): if the cursor is on a SEND or
    /// WRITE packet never sent, with nothing being resent, it goes as the probe,
    /// past the in-flight cap, asking for an ACK; returns whether it will (the
    /// caller checks that nothing else holds it back, else the newest packet goes
    /// again: [`Requester::probe`]). Its answer shows a lost tail as well as the
    /// newest packet's would (a softverbs peer holds it past the hole and says
    /// so; any other answers it with a sequence NAK), and where the answers were
    /// only late (a peer waiting for a CPU: most probes of a lossless stream) it
    /// resends nothing: the stream goes on by one packet.
    pub fn probe_with_new_data(&mut self, sq: &SendQueue, una: Psn) -> bool {
        let new = matches!(self.mode, Mode::Normal)
            && una.before(self.frontier)
            && self.cursor < sq.tail
            && self.cursor_psn(sq) == self.frontier
            && !sq.get(self.cursor).op.is_read_or_atomic();
        if new {
            self.probing = true;
        }
        new
    }

    /// Whether a tail-loss probe is due (its packet goes whatever the windows).
    #[inline]
    pub fn probing(&self) -> bool {
        self.probing
    }

    /// A tail-loss probe: the newest packet sent goes out again (then sending goes
    /// on where it was). Nothing happens if nothing is outstanding past `una`.
    pub fn probe(&mut self, sq: &SendQueue, una: Psn) {
        if matches!(self.mode, Mode::RnrWait { .. }) || !una.before(self.frontier) {
            return;
        }
        self.rewind(sq, self.frontier.sub(1));
        self.probing = true;
    }

    /// The early retransmission timeout: the oldest unacknowledged packet, `una`,
    /// goes again asking for an ACK, then sending goes on where it was. Nothing
    /// happens during an RNR wait.
    pub fn resend_oldest(&mut self, sq: &SendQueue, una: Psn) {
        if matches!(self.mode, Mode::RnrWait { .. }) || !una.before(self.frontier) {
            return;
        }
        self.walk(sq, una, una.next());
        self.probing = true;
    }

    /// Records that the packet at `psn` was sent and the cursor moved on: returns
    /// whether it was sent for the first time.
    #[inline]
    fn advance_frontier(&mut self, sq: &SendQueue, psn: Psn) -> bool {
        let fresh = !psn.before(self.frontier);
        let at = self.cursor_psn(sq);
        if self.frontier.before(at) {
            self.frontier = at;
        }
        fresh
    }

    /// PSNs up to `una` were acknowledged: a cursor left behind it (duplicates
    /// still queued to resend) moves on.
    pub fn skip_acknowledged(&mut self, sq: &SendQueue, una: Psn) -> Skip {
        if self.cursor >= self.started {
            return Skip::Stayed;
        }
        let w = sq.get(self.cursor);
        let cursor_psn = w.first_psn.add(self.cursor_pkt);
        if !cursor_psn.before(una) {
            return Skip::Stayed;
        }
        if matches!(w.op, SendOp::RdmaRead { .. }) {
            // A READ to ask again asks only for the responses still missing; left
            // behind una, the requester would never send.
            self.cursor_pkt = self.cursor_pkt.max(w.read_pkts_done);
            Skip::ReadResumed
        } else if matches!(self.mode, Mode::Retransmit { .. }) {
            // Going back already: on from una, to the same end.
            self.seek(sq, una);
            Skip::MovedToUna
        } else {
            self.rewind(sq, una);
            Skip::MovedToUna
        }
    }
}
