//! The completer: processes ACKs, NAKs, READ responses and atomic ACKs; runs the
//! local ACK timer and counts retries; decides which send WQEs are done
//! (IBA 9.7.5.2, 9.7.6).
//!
//! It owns the oldest unacknowledged PSN, the retry counts, the ACK timer, the
//! early recovery state (`recovery.rs`: RTT, early timer, in-flight cap) and the
//! selective-repeat scoreboard (`selective.rs`). It marks WQEs done in the send
//! queue lent to it in a [`CompleteCtx`] and places READ data (also responses ahead
//! of the one expected) and atomic results, and returns a [`Verdict`] for what the
//! requester and the QP must do: move the send cursor on or back, resend what the
//! responder lacks, probe, wait out an RNR NAK, count a READ or atomic finished,
//! or fail a WQE.

use super::attr::QpAttr;
use super::queues::SendQueue;
use super::recovery::{EarlyAction, Recovery, RecoveryTiming};
use super::selective::{self, Peer, Scoreboard};
use crate::shared::Shared;
use crate::time::Instant;
use crate::timers::{self, RNR_RETRY_INFINITE};
use crate::types::PdHandle;
use crate::wc::WcStatus;
use crate::wr::SendOp;
use softverbs_wire::{AethSyndrome, NakCode, OpKind, Psn, RocePacket};

/// Completer state of one QP.
#[derive(Debug, Clone, Default)]
pub(crate) struct Completer {
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// Transport retries left before RETRY_EXC_ERR (reset on progress).
    retry_left: u8,
    /// RNR retries left (7 = infinite).
    rnr_retry_left: u8,
    /// The local ACK timer (IBA 9.7.6.1.3).
    ack_deadline: Option<Instant>,
    /// PSN the requester was last sent back to (suppresses repeated go-backs for
    /// the same loss, e.g. from every READ response after a gap); cleared on
    /// progress past it.
    rewound_to: Option<Psn>,
    /// Something was resent and the requester's frontier at that time is not noted
    /// yet (the next acknowledgement notes it in `reads_capped_until`).
    resent: bool,
    /// Until una reaches this PSN (the frontier when something was last resent),
    /// new READ requests stay under the in-flight cap (see [`Completer::window`]).
    reads_capped_until: Option<Psn>,
    /// RTT, the early retransmission timer and the in-flight cap.
    recovery: Recovery,
    /// Selective repeat: what the peer is, and which packets it holds.
    pub sr: Scoreboard,
    /// The requester offers selective repeat (`EngineConfig::selective_repeat`).
    offers_sr: bool,
    /// When the last selective walk was asked for.
    walked_at: Option<Instant>,
    /// The requester's frontier when the last selective walk was asked for: a
    /// packet at or past it was first sent after that walk's resends.
    walk_frontier: Psn,
    /// The newest READ response PSN seen: a response missing before it was lost
    /// (the responder sends them in order), held or not.
    newest_response: Option<Psn>,
    /// Selective repeat: the PSNs `[.0, .1)` of the READ last asked again (only
    /// that READ, see [`Completer::ask_read_again`]); its responses come after
    /// those of the READs after it, which are then no evidence of a loss in it.
    read_asked: Option<(Psn, Psn)>,
    /// When that READ was asked again: its holes are all asked for (the requester
    /// asks every one in the walk), so for about a round trip each hole's repair
    /// is on its way and is not asked for again as the one before it fills.
    read_asked_at: Option<Instant>,
    /// The holes of that READ asked for are those before this PSN (the newest
    /// response held then: the responder answers in order, so only a hole with
    /// a response after it is known lost, and only those are asked for).
    read_asked_below: Psn,
    /// Selective repeat: the holes in READs after the one at una that were seen
    /// before `.0` were asked for, the last at `.1` (see
    /// [`Completer::ask_hole_in_later_read`]): responses arrive in PSN order, so
    /// holes show in that order and one frontier records them all.
    later_holes_asked: Option<(Psn, Instant)>,
    /// The early retransmission timeout resent only the oldest packet, `.0`,
    /// when everything before `.1` had been sent: what the next acknowledgement
    /// covers tells whether anything was lost (see [`Completer::on_timeout`]).
    timeout_resent: Option<(Psn, Psn)>,
}

/// What the completer works with besides its own state, lent for one call.
pub(crate) struct CompleteCtx<'a> {
    pub shared: &'a mut Shared,
    pub sq: &'a mut SendQueue,
    pub attr: &'a QpAttr,
    pub pd: PdHandle,
    pub mtu: u32,
    /// The requester's next PSN and the WQEs it started (below this sequence number).
    pub next_psn: Psn,
    /// The PSN after the newest packet sent.
    pub frontier: Psn,
    pub started: u64,
    /// Whether the requester is waiting out an RNR NAK.
    pub rnr_waiting: bool,
}

/// What the requester and the QP must do after the completer handled a response or
/// a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Verdict {
    /// `una` moved: the send cursor must not stay behind it.
    pub progress: bool,
    /// Go back to this PSN and resend from there (after `progress`).
    pub rewind: Option<Psn>,
    /// Before resending, wait until then (an RNR NAK).
    pub rnr_until: Option<Instant>,
    /// READs and atomics that finished.
    pub read_atomic_done: u32,
    /// Send the newest packet again (a tail-loss probe).
    pub probe: bool,
    /// Selective repeat: resend the packets in `[.0, .1)` the responder does not
    /// hold, then go on where sending was.
    pub selective: Option<(Psn, Psn)>,
    /// Resend the oldest unacknowledged packet, asking for an ACK, then go on
    /// where sending was (the early retransmission timeout, see
    /// [`Completer::on_timeout`]).
    pub resend_oldest: bool,
    /// WQE `.0` fails with status `.1`: the send queue fails (IBA 10.8.3.3).
    pub fail: Option<(u64, WcStatus)>,
}

impl Completer {
    /// A completer whose early timer follows `timing` (its floor, the peer's ACK
    /// hold); whose requester offers selective repeat if `selective_repeat`.
    pub fn new(timing: RecoveryTiming, selective_repeat: bool) -> Completer {
        Completer {
            recovery: Recovery::with_timing(timing),
            offers_sr: selective_repeat,
            ..Completer::default()
        }
    }

    /// Starts over at `psn`, with the retry counts of `attr`.
    pub fn reset(&mut self, psn: Psn) {
        self.una = psn;
        self.ack_deadline = None;
        self.recovery = Recovery::with_timing(self.recovery.timing());
        self.rewound_to = None;
        self.resent = false;
        self.reads_capped_until = None;
        self.newest_response = None;
        self.read_asked = None;
        self.read_asked_at = None;
        self.later_holes_asked = None;
        self.timeout_resent = None;
        self.walked_at = None;
        self.walk_frontier = psn;
        self.sr = Scoreboard::default();
        self.sr.clear(psn);
    }

    /// Whether the requester offers selective repeat.
    pub fn offers_sr(&self) -> bool {
        self.offers_sr
    }

    /// What sets the early timer besides what it measures.
    pub fn timing(&self) -> RecoveryTiming {
        self.recovery.timing()
    }

    /// The smoothed round-trip time, once measured.
    pub fn srtt(&self) -> Option<core::time::Duration> {
        self.recovery.srtt()
    }

    /// The retry counts were set (RTR to RTS, or changed in RTS).
    pub fn set_retries(&mut self, attr: &QpAttr) {
        self.retry_left = attr.retry_cnt;
        self.rnr_retry_left = attr.rnr_retry;
    }

    /// The earliest of the ACK timer and the early timer, if armed.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.ack_deadline, self.recovery.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn stop_timer(&mut self) {
        self.ack_deadline = None;
        self.recovery.stop();
    }

    /// How far past una the requester may send: `configured` PSNs, bounded by half
    /// the PSN space whatever the configuration, by how far a responder doing
    /// selective repeat keeps packets ahead, and by the in-flight cap the measured
    /// bandwidth-delay product gives — which new READ requests may pass by up to
    /// `read_psns` (the requester's receive buffer, `EngineConfig::read_budget`) on
    /// a path that lost nothing lately.
    ///
    /// Why: the cap keeps a sender from overrunning the receiver's buffer, and for a
    /// READ the receiver is the requester itself, which knows its buffer. The cap
    /// cannot measure a READ stream: a READ's responses come back as one burst the
    /// responder paces, and its rate samples end at a READ's first response, so
    /// every sample is at most what the cap let through and the cap stays at its
    /// floor (measured on loopback: 16–36 PSNs, one or two 64 KiB READs outstanding
    /// where max_rd_atomic allows 16; ib_read_bw a third of ib_write_bw). After a
    /// resend, until everything then in flight is acknowledged, the cap applies to
    /// READs too: a burst that overflowed a queue on the way is not repeated.
    #[inline]
    pub fn window(&self, configured: u32, read_psns: u32) -> super::requester::Window {
        let mut uncapped = configured.min(Psn::HALF_SPACE);
        if self.sr.peer == Peer::Selective {
            // A responder doing selective repeat keeps at most this far ahead: more
            // in flight would be dropped there after a loss and sent again.
            uncapped = uncapped.min(selective::WINDOW);
        }
        let size = self.recovery.cap().min(uncapped);
        let recovering = self.resent || self.reads_capped_until.is_some();
        let reads = if recovering {
            size
        } else {
            size.max(read_psns.min(uncapped))
        };
        // A READ asked again for responses it lacks asks for no more than was
        // asked for when it was new: with a selective-repeat peer it goes within
        // what the requester holds ahead, whatever the cap. (Under the cap, a
        // hole in a READ past the cap's reach from una waited until una came
        // near, a round trip per hole with the link idle.)
        let reads_again = if self.sr.peer == Peer::Selective {
            size.max(read_psns.min(uncapped))
        } else {
            size
        };
        super::requester::Window {
            una: self.una,
            size,
            reads,
            reads_again,
            // Before the first answer says what the peer is, a softverbs
            // responder may be answering: it drops READ requests past its
            // window after a lost one, and the requester would find each of
            // them missing only as una reaches it (the first 16 READs of
            // `ib_read_bw`, a round trip or a probe each).
            hold: if self.sr.peer == Peer::Selective
                || self.sr.peer == Peer::Unknown && self.offers_sr
            {
                selective::WINDOW
            } else {
                u32::MAX
            },
        }
    }

    /// A reliable request packet `psn` went out; `fresh` if it was never sent
    /// before and asks for an ACK (its answer times the round trip). The ACK timer
    /// runs if it did not, and so does the early timer. `in_flight`: as
    /// [`Completer::timer_in_flight`] counts it.
    #[inline]
    pub fn on_request_sent(
        &mut self,
        now: Instant,
        timeout: u8,
        psn: Psn,
        fresh: bool,
        in_flight: u32,
    ) {
        if self.ack_deadline.is_none() {
            self.ack_deadline = timers::ack_timeout(timeout).map(|d| now + d);
        }
        self.recovery
            .on_sent(now, psn, fresh, self.ack_deadline, in_flight);
    }

    /// PSNs in flight as the early timer counts them: from una to `frontier` (the
    /// PSN after the newest packet sent), but a lone PSN of a READ or atomic
    /// (its request, or its last response missing) counts as more: its answer is
    /// a response, which no peer holds back for its own answer, so its probe needs
    /// no wait for an ACK hold (`Recovery::lone_pto`). (Counted as one, the tail
    /// of every READ waited for it: a READ stream at 5 % loss went from 1.79x to
    /// 2.01x lossless at one seed.)
    pub fn timer_in_flight(&self, sq: &SendQueue, started: u64, frontier: Psn) -> u32 {
        let n = self.una.distance_to(frontier);
        if n != 1 {
            return n;
        }
        let read = started_wqe_with_psn(sq, started, self.una)
            .is_some_and(|seq| sq.get(seq).op.is_read_or_atomic());
        if read {
            2
        } else {
            1
        }
    }

    /// An unreliable (UC) request packet went out: nothing comes back, so it counts
    /// as acknowledged at once.
    pub fn on_unreliable_sent(&mut self, psn: Psn) {
        self.una = psn.next();
    }

    /// Sends the requester back to `psn` (go-back-N) at `now`.
    fn rewind(&mut self, v: &mut Verdict, now: Instant, psn: Psn) {
        self.timeout_resent = None;
        self.rewound_to = Some(psn);
        // What was seen beyond a gap before going back is no evidence against the
        // responses going back brings: only a response arriving after this one
        // can show that the run asked again lost something (else every response
        // of that run would find the old gap again and ask once more, each time
        // restarting the responder's burst).
        self.newest_response = None;
        self.recovery.on_resend(now);
        self.resent = true;
        v.rewind = Some(psn);
    }

    /// Asks READ `seq` again from its response `from` on. With a peer doing
    /// selective repeat only that READ is asked again (a walk over its PSNs, the
    /// request naming just the run still missing, IBA 9.7.5.1.3 lets a requester
    /// restart a READ mid-message): the READs after it were answered, or their
    /// responses are on their way, and a gap in one of them is asked for when una
    /// reaches it. Going back over them all, as go-back-N does, would make the
    /// responder send all their responses twice. With any other peer, go-back-N.
    fn ask_read_again(
        &mut self,
        ctx: &CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        seq: u64,
        from: Psn,
    ) {
        let w = ctx.sq.get(seq);
        if self.sr.peer != Peer::Selective || !matches!(w.op, SendOp::RdmaRead { .. }) {
            self.rewind(v, now, from);
            return;
        }
        self.rewound_to = Some(from);
        // As for a go-back: only a response after the one asked for can show
        // that what it asked for was lost again.
        self.newest_response = None;
        self.recovery.on_resend(now);
        self.resent = true;
        // Resent: the timeout's test no longer applies (see `progress`).
        self.timeout_resent = None;
        let end = w.first_psn.add(w.npsn);
        self.note_read_asked(now, from, end);
        v.selective = Some((from, end));
    }

    /// READ responses `[from, end)` (one READ's) are asked for again at `now`:
    /// its holes before the newest response held.
    fn note_read_asked(&mut self, now: Instant, from: Psn, end: Psn) {
        let span = from.distance_to(end).min(selective::WINDOW);
        let newest = (0..span).rev().find(|&k| self.sr.has(from.add(k)));
        self.read_asked = Some((from, end));
        self.read_asked_at = Some(now);
        self.read_asked_below = from.add(newest.map_or(1, |k| k + 1));
    }

    /// A response of READ `seq` at una was placed ahead at `psn` and the one
    /// before it is missing, past the holes asked for so far: a new hole, known
    /// lost (the responder answers in order). It is asked for at once, the holes
    /// before it staying asked (their repairs are on their way); before, it
    /// waited until the holes before it were filled, a round trip each, or for
    /// the early timer.
    fn ask_new_hole(
        &mut self,
        ctx: &CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        seq: u64,
        psn: Psn,
    ) {
        let w = *ctx.sq.get(seq);
        let expected = w.first_psn.add(w.read_pkts_done);
        let prev = psn.sub(1);
        if self.sr.peer != Peer::Selective
            || Self::asking_again(v)
            || self.una != expected
            || !expected.before(prev)
            || self.sr.has(prev)
            || self.hole_asked(prev, now)
        {
            return;
        }
        let from = self.hole_start(expected, prev, |_| false);
        if from == expected {
            return; // the first hole: asked for as the response after it came
        }
        let end = w.first_psn.add(w.npsn);
        let asked_from = match self.read_asked {
            Some((f, e)) if e == end && f.before(from) => f,
            _ => from,
        };
        self.recovery.on_resend_range(now, from, psn);
        self.resent = true;
        // Resent: the timeout's test no longer applies (see `progress`).
        self.timeout_resent = None;
        self.note_read_asked(now, asked_from, end);
        v.selective = Some((from, end));
    }

    /// A response of READ `seq`, a READ after the one at una, was placed ahead at
    /// `psn`, and the one before it (of the same READ) is missing: a hole known
    /// lost (the responder answers in order), asked for at once, its run alone.
    /// Before, it was asked for only when una reached its READ, a round trip
    /// each with the link idle once the READs before it were in (issue 15:
    /// `ib_read_bw` at MTU 1024, 64 responses per READ, loses about three per
    /// READ at 5 %). Each hole is asked once here: what is asked below the
    /// frontier `later_holes_asked` records; a repair lost again is asked for
    /// when una reaches its READ, as before.
    fn ask_hole_in_later_read(
        &mut self,
        ctx: &CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        seq: u64,
        psn: Psn,
    ) {
        let w = *ctx.sq.get(seq);
        let expected = w.first_psn.add(w.read_pkts_done);
        let prev = psn.sub(1);
        let asked_below = self.later_holes_asked.map(|(below, _)| below);
        let asked = |p: Psn| asked_below.is_some_and(|b| p.before(b));
        if self.sr.peer != Peer::Selective
            || Self::asking_again(v)
            || !self.una.before(w.first_psn)
            || prev.before(expected)
            || self.sr.has(prev)
            || asked(prev)
        {
            return;
        }
        let from = self.hole_start(expected, prev, asked);
        self.later_holes_asked = Some((psn, now));
        self.recovery.on_resend_range(now, from, psn);
        self.resent = true;
        // Resent: the timeout's test no longer applies (see `progress`).
        self.timeout_resent = None;
        v.selective = Some((from, psn));
    }

    /// The first PSN of the hole that ends at `last` (missing): walks back while
    /// the PSN before is missing too, neither before `expected` (the READ's next
    /// response in order) nor onto a PSN `stop` says is taken care of.
    fn hole_start(&self, expected: Psn, last: Psn, stop: impl Fn(Psn) -> bool) -> Psn {
        let mut from = last;
        while expected.before(from) && !self.sr.has(from.sub(1)) && !stop(from.sub(1)) {
            from = from.sub(1);
        }
        from
    }

    /// The early timer's probe, with a selective-repeat peer, when the READ at
    /// una still lacks responses: what it asked for again (or the responder's
    /// answer) may have been lost with nothing after it to show that, and the
    /// newest packet's answer would not show it either. The READ is asked again
    /// from its first missing response instead (one request, its answer shows
    /// the loss). Returns whether it was.
    fn probe_read_at_una(&mut self, ctx: &CompleteCtx<'_>, v: &mut Verdict, now: Instant) -> bool {
        let resent = self.resent;
        let asked = self.ask_read_at_una(ctx, v, now);
        // A probe is no evidence of loss: new READs keep their read budget (see
        // `Completer::window`; on a loaded host probes fire for late answers).
        self.resent = resent;
        asked
    }

    /// With a selective-repeat peer, when the READ at una still lacks responses:
    /// asks that READ alone again, from its first missing response (the probe,
    /// and the early retransmission timeout: see [`Completer::on_timeout`]).
    /// Returns whether it did.
    fn ask_read_at_una(&mut self, ctx: &CompleteCtx<'_>, v: &mut Verdict, now: Instant) -> bool {
        if self.sr.peer != Peer::Selective {
            return false;
        }
        let Some(seq) = wqe_with_psn(ctx, self.una) else {
            return false;
        };
        let w = ctx.sq.get(seq);
        if !matches!(w.op, SendOp::RdmaRead { .. }) || w.done.is_some() {
            return false;
        }
        let una = self.una;
        self.ask_read_again(ctx, v, now, seq, una);
        true
    }

    /// Selective repeat: whether a READ after READ `seq` got responses while
    /// `seq`'s response `next` is missing and was not asked for again since. The
    /// responder answers in order, so `next` was lost (or its request was).
    fn later_read_answered(&self, ctx: &CompleteCtx<'_>, seq: u64, next: Psn) -> bool {
        let asked = self
            .read_asked
            .is_some_and(|(from, end)| !next.before(from) && next.before(end));
        self.sr.peer == Peer::Selective
            && !asked
            && (seq + 1..ctx.started).any(|s| {
                let l = ctx.sq.get(s);
                matches!(l.op, SendOp::RdmaRead { .. })
                    && (l.done.is_some()
                        || l.read_pkts_done > 0
                        || self.sr.has_any(l.first_psn, l.npsn.min(selective::WINDOW)))
            })
    }

    /// Whether `psn`, a READ response missing, was asked for again within about a
    /// round trip (with the other holes of its READ): its repair is on its way.
    fn hole_asked(&self, psn: Psn, now: Instant) -> bool {
        let srtt = self.recovery.srtt().unwrap_or_default();
        if self
            .later_holes_asked
            .is_some_and(|(below, at)| psn.before(below) && now - at < 2 * srtt)
        {
            return true;
        }
        let Some((from, end)) = self.read_asked else {
            return false;
        };
        !psn.before(from)
            && psn.before(end)
            && psn.before(self.read_asked_below)
            && self.read_asked_at.is_some_and(|at| now - at < 2 * srtt)
    }

    /// Whether a READ was asked again less than half a round trip ago: what
    /// arrives now answers an earlier request, not that one.
    fn just_asked(&self, now: Instant) -> bool {
        let srtt = self.recovery.srtt().unwrap_or_default();
        self.read_asked_at.is_some_and(|at| now - at < srtt / 2)
    }

    /// Whether the early retransmission timeout may resend only the oldest
    /// packet: a SEND or WRITE packet, whose answer is an ACK or NAK naming it
    /// (a READ's or atomic's is its responses: those are asked again as before).
    fn oldest_resendable(&self, ctx: &CompleteCtx<'_>) -> bool {
        wqe_with_psn(ctx, self.una).is_some_and(|seq| {
            let w = ctx.sq.get(seq);
            w.done.is_none() && !w.op.is_read_or_atomic()
        })
    }

    /// Resends only the oldest unacknowledged packet and notes what had been sent
    /// then: the answer tells whether the rest was lost (see `progress`).
    fn resend_oldest(&mut self, ctx: &CompleteCtx<'_>, v: &mut Verdict, now: Instant) {
        let una = self.una;
        self.timeout_resent = Some((una, ctx.frontier));
        self.recovery.on_resend_range(now, una, una.next());
        v.resend_oldest = true;
    }

    /// Whether this verdict asks for something again already.
    fn asking_again(v: &Verdict) -> bool {
        v.rewind.is_some() || v.selective.is_some()
    }

    /// The requester moved its cursor forward to una under a progress verdict:
    /// that was no go-back to remember.
    pub fn forget_rewind(&mut self) {
        self.rewound_to = None;
    }

    /// A response packet (ACK, atomic ACK, READ response) for this QP's requester,
    /// in RTS or SQD.
    pub fn on_response(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        now: Instant,
        pkt: &RocePacket<&[u8]>,
    ) -> Verdict {
        let mut v = Verdict::default();
        let psn = pkt.bth().psn();
        // A response must name a PSN the requester has sent and not yet seen
        // acknowledged, or the last acknowledged one (a duplicate): [una - 1, next_psn).
        let base = self.una.sub(1);
        if base.distance_to(psn) >= base.distance_to(ctx.next_psn) {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return v;
        }
        self.recovery.on_answer(now, psn);
        let aeth = pkt
            .aeth()
            .and_then(|h| AethSyndrome::from_byte(h.syndrome()).ok());
        // Whether the peer does selective repeat: its answers say so in Resv7
        // (see `qp/selective.rs`); one without means plain IBA from now on.
        let resv7 = pkt.bth().resv7();
        if ctx.shared.config.selective_repeat && self.sr.peer == Peer::Unknown {
            self.sr.peer = if resv7 == 0 {
                Peer::Plain
            } else {
                Peer::Selective
            };
        }
        let sack = resv7 >= selective::SACK_SEEN
            && self.sr.peer == Peer::Selective
            && pkt.info().kind == OpKind::Acknowledge
            && matches!(aeth, Some(AethSyndrome::Ack { .. }));
        if sack {
            ctx.shared.counters.sack_received += 1;
            self.ack_through(ctx, &mut v, now, psn);
            if let Some(seen) = pkt.aeth().map(|h| Psn::new(h.msn())) {
                let held = u32::from(resv7 - selective::SACK_SEEN);
                self.on_sack(ctx, &mut v, now, seen, held);
            }
            return v;
        }
        match pkt.info().kind {
            OpKind::Acknowledge => match aeth {
                Some(AethSyndrome::Ack { .. }) => self.ack_through(ctx, &mut v, now, psn),
                Some(AethSyndrome::RnrNak { timer }) => {
                    self.on_rnr_nak(ctx, &mut v, now, psn, timer)
                }
                Some(AethSyndrome::Nak(code)) => self.on_nak(ctx, &mut v, now, psn, code),
                None => ctx.shared.counters.drop_malformed += 1,
            },
            OpKind::AtomicAcknowledge => {
                if let Some(orig) = pkt.atomic_ack_eth().map(|h| h.orig()) {
                    self.on_atomic_ack(ctx, &mut v, now, psn, orig);
                }
            }
            OpKind::RdmaReadResponse => self.on_read_response(ctx, &mut v, now, psn, pkt),
            _ => ctx.shared.counters.drop_bad_state += 1,
        }
        v
    }

    /// A selective ACK: the responder holds the `held` packets from `seen` on, or
    /// (0) saw `seen` and did not keep it. The packets before them that it does
    /// not hold are resent at once (each once per report; the early timer covers
    /// a resent one lost again).
    fn on_sack(
        &mut self,
        ctx: &CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        seen: Psn,
        held: u32,
    ) {
        let una = self.una;
        let end = seen.add(held.max(1));
        if seen.before(una) || una.distance_to(end) > selective::WINDOW || ctx.next_psn.before(end)
        {
            return;
        }
        for k in 0..held.max(1) {
            self.recovery.on_seen(now, seen.add(k));
        }
        for k in 0..held {
            self.sr.set_held(seen.add(k));
        }
        let until = if held > 0 { seen } else { seen.next() };
        // Holes resent by a walk more than a round trip ago and still missing were
        // lost again (RFC 8985's idea, per walk): this walk covers them too.
        let srtt = self.recovery.srtt().unwrap_or_default();
        let stale = self.walked_at.is_none_or(|at| now - at > srtt + srtt / 4);
        // A report of a packet first sent after the last walk went out shows the
        // holes that walk resent and the responder still lacks lost again (RFC
        // 8985's rule, by send order: the walk's resends went before any new
        // packet): this walk covers them too, and at once. Without it a lost
        // resend of the packet at una waited for the early timer, and at 16-18 %
        // loss now and then for the IBTA timer until retries ran out (issue 15's
        // chaos cases). The walk under way is over by then (the report's packet
        // went after it), so going back to una resends only the holes, once.
        let lost_again = !seen.before(self.walk_frontier);
        let walked = self.sr.walked_to;
        let from = if !stale && !lost_again && una.before(walked) && walked.before(ctx.next_psn) {
            walked
        } else {
            una
        };
        if from.before(until) {
            self.sr.walked_to = until;
            self.walked_at = Some(now);
            self.walk_frontier = ctx.frontier;
            self.recovery.on_resend_range(now, from, until);
            self.resent = true;
            // Resent: the timeout's test no longer applies (see `progress`).
            self.timeout_resent = None;
            v.selective = Some((from, until));
        }
    }

    /// Everything up to and including `psn` is acknowledged.
    fn ack_through(&mut self, ctx: &mut CompleteCtx<'_>, v: &mut Verdict, now: Instant, psn: Psn) {
        let next_una = psn.next();
        if !self.una.before(next_una) {
            return; // nothing new
        }
        let mut una = next_una;
        let mut seq = ctx.sq.head;
        while seq < ctx.started {
            let wqe = *ctx.sq.get(seq);
            if wqe.done.is_none() {
                if wqe.first_psn.after(psn) {
                    break;
                }
                match wqe.op {
                    SendOp::RdmaRead { .. }
                    | SendOp::AtomicCmpSwap { .. }
                    | SendOp::AtomicFetchAdd { .. } => {
                        // An ACK beyond a READ or atomic whose responses we lack
                        // means they were lost: go back for them (IBA 9.7.5.2.2,
                        // implied NAK).
                        let missing = wqe.first_psn.add(wqe.read_pkts_done);
                        una = missing;
                        if self.rewound_to != Some(missing) {
                            self.ask_read_again(ctx, v, now, seq, missing);
                        }
                        break;
                    }
                    _ => {
                        if wqe.last_psn().after(psn) {
                            break;
                        }
                        ctx.sq.get_mut(seq).done = Some(WcStatus::Success);
                    }
                }
            }
            seq += 1;
        }
        self.progress(ctx, v, now, una);
    }

    /// The oldest unacknowledged PSN moved to `una`: retries reset, the timer
    /// restarts, the window grows.
    fn progress(&mut self, ctx: &mut CompleteCtx<'_>, v: &mut Verdict, now: Instant, una: Psn) {
        if !self.una.before(una) {
            return;
        }
        let acked = self.una.distance_to(una);
        self.sr.acked(self.una, una);
        self.una = una;
        self.retry_left = ctx.attr.retry_cnt;
        if self.rnr_retry_left != RNR_RETRY_INFINITE {
            self.rnr_retry_left = ctx.attr.rnr_retry;
        }
        if self.rewound_to.is_some_and(|r| r.before(una)) {
            self.rewound_to = None;
        }
        if let Some((resent, sent)) = self.timeout_resent.take() {
            if resent.next().before(una) && !una.before(sent) {
                // Everything sent before the timeout was acknowledged, packets
                // the timeout never resent among it: they arrived, so the timeout
                // was spurious (the peer, or the path, stalled: RFC 5682's test).
                // Nothing more goes again.
                ctx.shared.counters.spurious_timeouts += 1;
            } else if una.before(sent) && self.sr.peer == Peer::Selective {
                // Only part of it was acknowledged. With a softverbs peer this
                // answer is mostly one sent before the peer read the resent
                // packet: after a stall, a peer reading a long queue answers it
                // batch by batch (its backlog of up to the device window, 4 MiB,
                // takes it milliseconds), and going back at the first such answer
                // sent again what still waited in its socket buffer: most of the
                // retransmissions of a lossless `perf write` on a loaded host,
                // 0.05-1 % of its packets (session 10). No go-back: such a peer
                // shows a loss itself (it holds a packet past a hole and reports
                // it, and the requester walks over the holes), and a lost tail
                // is found by the early timer's probe, whose packet then comes
                // past the hole. The test goes on with the next answers.
                self.timeout_resent = Some((resent, sent));
            } else if una != ctx.next_psn {
                // Only part of it was acknowledged: what follows may have been
                // lost as well (on a lossy path it mostly was). Go back for it
                // now, as the timeout did before.
                self.rewind(v, now, una);
            }
        }
        if std::mem::take(&mut self.resent) {
            self.reads_capped_until = Some(ctx.next_psn);
        }
        if self.reads_capped_until.is_some_and(|p| !una.before(p)) {
            self.reads_capped_until = None;
        }
        v.progress = true;
        let outstanding = self.una != ctx.next_psn;
        self.ack_deadline = if outstanding {
            timers::ack_timeout(ctx.attr.timeout).map(|d| now + d)
        } else {
            None
        };
        // Started WQEs whose packets the window holds back count as more than
        // a lone packet: the plain probe timeout, as before.
        let in_flight = match (
            outstanding,
            self.timer_in_flight(ctx.sq, ctx.started, ctx.frontier),
        ) {
            (false, _) => 0,
            (true, 0) => 2,
            (true, n) => n,
        };
        self.recovery
            .on_progress(now, una, acked, in_flight, self.ack_deadline);
    }

    /// Whether a NAK names a PSN acknowledged since (a delayed duplicate, or
    /// spoofed) or one no unfinished WQE owns: such a NAK is counted and ignored
    /// (IBA 9.7.5.2.5 - 9.7.5.2.8 apply a NAK to the request it names). Acting on
    /// it would move the send cursor behind una, or fail work the NAK is not about.
    fn nak_is_stale(&self, ctx: &mut CompleteCtx<'_>, psn: Psn) -> bool {
        let stale = psn.before(self.una) || wqe_with_psn(ctx, psn).is_none();
        if stale {
            ctx.shared.counters.drop_out_of_sequence += 1;
        }
        stale
    }

    fn on_rnr_nak(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        psn: Psn,
        timer: u8,
    ) {
        ctx.shared.counters.rnr_nak_received += 1;
        if self.nak_is_stale(ctx, psn) {
            return;
        }
        if ctx.rnr_waiting && self.rewound_to == Some(self.resend_from(psn)) {
            // A copy of the RNR NAK being waited out (the network duplicated it, or
            // the responder refused a duplicated request twice): one refusal.
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        self.ack_through(ctx, v, now, psn.sub(1));
        if self.rnr_retry_left == 0 {
            v.fail = wqe_with_psn(ctx, psn).map(|seq| (seq, WcStatus::RnrRetryExcErr));
            return;
        }
        if self.rnr_retry_left != RNR_RETRY_INFINITE {
            self.rnr_retry_left -= 1;
        }
        // Wait, then resend from the refused packet (IBA 9.7.5.2.8), or from an
        // earlier READ or atomic still lacking its response.
        let from = self.resend_from(psn);
        // A packet the responder kept ahead (selective repeat) and could not commit
        // for want of a receive WQE: it must come again.
        self.sr.clear_held(psn);
        self.rewind(v, now, from);
        v.rnr_until = Some(now + timers::rnr_delay(timer));
        self.ack_deadline = None;
    }

    fn on_nak(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        psn: Psn,
        code: NakCode,
    ) {
        if code == NakCode::PsnSequenceError {
            ctx.shared.counters.nak_seq_received += 1;
            if self.nak_is_stale(ctx, psn) {
                return;
            }
            // Everything before the expected PSN arrived (IBA 9.7.5.2.5): resend
            // from there at once. This costs no transport retry: retry_cnt counts
            // local ACK timeouts that pass without progress, and a responder sends
            // one sequence NAK per lost PSN and then stays quiet until it arrives,
            // so a peer cannot keep a requester resending by NAKs alone.
            self.ack_through(ctx, v, now, psn.sub(1));
            let from = self.resend_from(psn);
            if self.rewound_to == Some(from) {
                return;
            }
            self.rewind(v, now, from);
            return;
        }
        ctx.shared.counters.nak_error_received += 1;
        if self.nak_is_stale(ctx, psn) {
            return;
        }
        self.ack_through(ctx, v, now, psn.sub(1));
        // The error NAKs and the completion status each gives (IBA 9.7.5.2.4,
        // table 46; 11.6.2).
        let status = match code {
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
            NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
            NakCode::PsnSequenceError => unreachable!("handled above"),
        };
        v.fail = wqe_with_psn(ctx, psn).map(|seq| (seq, status));
    }

    fn on_atomic_ack(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        psn: Psn,
        orig: u64,
    ) {
        let Some(seq) = wqe_with_psn(ctx, psn) else {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        };
        let wqe = *ctx.sq.get(seq);
        if !wqe.op.is_atomic() || wqe.done.is_some() {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        self.ack_through(ctx, v, now, psn.sub(1));
        // Responses are taken in PSN order (IBA 9.7.5.2.2): while an earlier READ
        // or atomic lacks its response, this one is out of order. ack_through went
        // back for the earlier one; this one is replayed by the responder later.
        if self.una != psn {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        // The old value lands in the single 8-byte local buffer, in host order.
        if ctx
            .shared
            .scatter(ctx.pd, ctx.sq.sges(seq), 0, &orig.to_ne_bytes())
            .is_err()
        {
            v.fail = Some((seq, WcStatus::LocProtErr));
            return;
        }
        let done = ctx.sq.get_mut(seq);
        done.done = Some(WcStatus::Success);
        done.read_pkts_done = 1;
        v.read_atomic_done += 1;
        self.progress(ctx, v, now, psn.next());
    }

    fn on_read_response(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        psn: Psn,
        pkt: &RocePacket<&[u8]>,
    ) {
        let Some(seq) = wqe_with_psn(ctx, psn) else {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        };
        let wqe = *ctx.sq.get(seq);
        if !matches!(wqe.op, SendOp::RdmaRead { .. }) || wqe.done.is_some() {
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        if psn == wqe.first_psn {
            self.recovery.on_read_response(now, psn);
        }
        // (One left from long ago, outside what is outstanding, is replaced: PSNs
        // compare only within half their space.)
        if self
            .newest_response
            .is_none_or(|n| n.before(psn) || !outstanding(self.una, ctx.next_psn, n))
        {
            self.newest_response = Some(psn);
        }
        // A READ response acknowledges every request before the READ.
        self.ack_through(ctx, v, now, wqe.first_psn.sub(1));
        let expected = wqe.first_psn.add(wqe.read_pkts_done);
        if self.una != expected || psn != expected {
            if self.una == expected && expected.before(psn) {
                // A response was lost: ask again from the missing one, once.
                if self.rewound_to != Some(expected) {
                    self.ask_read_again(ctx, v, now, seq, expected);
                }
            }
            // With selective repeat on, a response ahead of the one expected is
            // placed now (its place in the READ's buffer follows from its PSN)
            // and counted when the ones before it arrive: the READ is asked
            // again from the first one missing, as IBA does (9.7.5.1.3), but
            // what came is not thrown away. Only this requester's memory is
            // touched, and the READ completes only once every response is in.
            let ahead = ctx.shared.config.selective_repeat
                && !psn.before(expected)
                && self.una.distance_to(psn) < selective::WINDOW;
            if ahead && self.sr.has(psn) {
                // A copy of a response held: the run asked again before it was lost
                // again (see `requester/build.rs`): ask once more.
                ctx.shared.counters.drop_out_of_sequence += 1;
                if self.una == expected && !self.just_asked(now) && !Self::asking_again(v) {
                    self.ask_read_again(ctx, v, now, seq, expected);
                }
                return;
            }
            if ahead {
                let k = wqe.first_psn.distance_to(psn);
                if let Err(status) = place_read_response(ctx, seq, k, pkt) {
                    v.fail = Some((seq, status));
                    return;
                }
                self.sr.set_held(psn);
                ctx.shared.counters.read_responses_ahead += 1;
                if self.read_asked_at == Some(now)
                    && self
                        .read_asked
                        .is_some_and(|(f, e)| f.before(psn) && psn.before(e))
                    && self.read_asked_below.before(psn.next())
                {
                    // Asked for as this response came: the holes before it are.
                    self.read_asked_below = psn.next();
                }
                self.ask_new_hole(ctx, v, now, seq, psn);
                self.ask_hole_in_later_read(ctx, v, now, seq, psn);
                return;
            }
            ctx.shared.counters.drop_out_of_sequence += 1;
            return;
        }
        let k = wqe.read_pkts_done;
        if let Err(status) = place_read_response(ctx, seq, k, pkt) {
            v.fail = Some((seq, status));
            return;
        }
        self.read_progress(ctx, v, now, seq);
    }

    /// READ `seq` got its next response: count it and those placed ahead that
    /// follow it, complete it when all are in, and go on to the next READ when
    /// its responses too were placed ahead.
    fn read_progress(
        &mut self,
        ctx: &mut CompleteCtx<'_>,
        v: &mut Verdict,
        now: Instant,
        seq: u64,
    ) {
        let mut seq = seq;
        loop {
            let w = ctx.sq.get_mut(seq);
            w.read_pkts_done += 1;
            while w.read_pkts_done < w.npsn && self.sr.has(w.first_psn.add(w.read_pkts_done)) {
                self.sr.clear_held(w.first_psn.add(w.read_pkts_done));
                w.read_pkts_done += 1;
            }
            let w = *w;
            let complete = w.read_pkts_done == w.npsn;
            if complete {
                ctx.sq.get_mut(seq).done = Some(WcStatus::Success);
                v.read_atomic_done += 1;
            }
            self.progress(ctx, v, now, w.first_psn.add(w.read_pkts_done));
            if !complete {
                // Responses ahead but the next one missing: ask again from it.
                let next = w.first_psn.add(w.read_pkts_done);
                let held_beyond = self.sr.has_any(
                    next,
                    w.npsn
                        .saturating_sub(w.read_pkts_done)
                        .min(selective::WINDOW),
                );
                // Or later responses came but were not held (past the window).
                let seen_beyond = self
                    .newest_response
                    .is_some_and(|n| next.before(n) && outstanding(self.una, ctx.next_psn, n));
                // Or, with selective repeat, a later READ's responses came: the
                // responder answers in order, so this READ's missing tail was lost
                // (unless it was asked again since, then its responses follow
                // theirs).
                let later_seen = self.later_read_answered(ctx, seq, next);
                if (held_beyond || seen_beyond || later_seen)
                    && self.rewound_to != Some(next)
                    && !self.hole_asked(next, now)
                    && !Self::asking_again(v)
                {
                    self.ask_read_again(ctx, v, now, seq, next);
                }
                return;
            }
            // The next READ, if its first response missing was placed ahead: the
            // requests before it are acknowledged by it.
            let next = (seq + 1..ctx.started).find(|&s| {
                let n = ctx.sq.get(s);
                n.done.is_none() && n.op.is_read_or_atomic()
            });
            let Some(n) = next else { return };
            let nw = *ctx.sq.get(n);
            let at = nw.first_psn.add(nw.read_pkts_done);
            if !matches!(nw.op, SendOp::RdmaRead { .. }) {
                return;
            }
            if !self.sr.has(at) {
                // Its next response is missing but later ones came: the requests
                // before it are acknowledged, and it is asked again at once.
                let held_beyond = self.sr.has_any(
                    at,
                    nw.npsn
                        .saturating_sub(nw.read_pkts_done)
                        .min(selective::WINDOW),
                );
                if held_beyond || self.later_read_answered(ctx, n, at) {
                    self.ack_through(ctx, v, now, nw.first_psn.sub(1));
                    if self.una == at && self.rewound_to != Some(at) && !Self::asking_again(v) {
                        self.ask_read_again(ctx, v, now, n, at);
                    }
                }
                return;
            }
            self.ack_through(ctx, v, now, nw.first_psn.sub(1));
            if self.una != at {
                return;
            }
            self.sr.clear_held(at);
            seq = n;
        }
    }

    /// Where to resend from after a NAK for `psn`: `psn`, unless an earlier READ
    /// or atomic still lacks its response (then una stayed on it), since the
    /// responder answers that one only when asked again.
    fn resend_from(&self, psn: Psn) -> Psn {
        if self.una.before(psn) {
            self.una
        } else {
            psn
        }
    }

    /// The ACK timer or the early timer may have expired at `now` (the QP is in
    /// RTS or SQD).
    pub fn on_timeout(&mut self, ctx: &mut CompleteCtx<'_>, now: Instant) -> Verdict {
        let mut v = Verdict::default();
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_deadline = None;
            self.recovery.on_ibta_timeout();
            if self.una == ctx.next_psn {
                return v;
            }
            // The IBTA local ACK timeout (IBA 9.7.6.1.3): only these count.
            ctx.shared.counters.ack_timeouts += 1;

            if self.retry_left == 0 {
                let seq = wqe_with_psn(ctx, self.una).unwrap_or(ctx.sq.head);
                v.fail = Some((seq, WcStatus::RetryExcErr));
                return v;
            }
            self.retry_left -= 1;
            let una = self.una;
            // Selective repeat falls back to plain go-back-N here: everything
            // unacknowledged goes again, whatever the responder said it held.
            let softverbs_peer = self.sr.peer == Peer::Selective;
            self.sr.clear(una);
            if softverbs_peer && self.oldest_resendable(ctx) {
                // With a softverbs peer the retry starts with the oldest request
                // (IBA 9.7.6.1.3) and, as for the early timeout, goes on with the
                // rest only once its answer shows them lost (see `progress`): a
                // peer not scheduled for longer than the timeout lost nothing,
                // and each timeout sent everything in flight again for nothing.
                // Retries count as before: this timeout took one, and the next
                // one without progress takes another. Any other peer gets IBA's
                // go-back-N.
                self.resend_oldest(ctx, &mut v, now);
                return v;
            }
            self.rewind(&mut v, now, una);
            self.sr.walked_to = ctx.next_psn;
            return v;
        }
        if self.una == ctx.next_psn || ctx.rnr_waiting {
            self.recovery.stop();
            return v;
        }
        // The early timer: extra packets, no retry counted.
        match self.recovery.on_timeout(now, self.ack_deadline) {
            Some(EarlyAction::Probe) => {
                ctx.shared.counters.tail_loss_probes += 1;
                if !self.probe_read_at_una(ctx, &mut v, now) {
                    v.probe = true;
                }
            }
            Some(EarlyAction::Retransmit) if self.oldest_resendable(ctx) => {
                // Only the oldest packet goes again (RFC 5682, F-RTO): when a peer
                // or the path stalled longer than the timeout (a process not
                // scheduled for milliseconds: no loss), going back over everything
                // in flight resent it all for nothing, once per backed-off expiry.
                // The answer tells: one that acknowledges everything sent before
                // the timeout, packets never resent among it, shows the timeout
                // spurious; one that acknowledges less, or a sequence NAK, sends
                // the requester back (see `progress`), an RTT later than a
                // go-back at once would have. Each later expiry without progress
                // resends it again, as TCP does; the IBTA timer still goes back
                // over everything.
                ctx.shared.counters.early_retransmits += 1;
                self.resend_oldest(ctx, &mut v, now);
            }
            Some(EarlyAction::Retransmit) => {
                ctx.shared.counters.early_retransmits += 1;
                let first = self.recovery.backoff() == 2;
                // The first one after the probe, with a softverbs peer and a
                // READ at una: only that READ is asked again, from its first
                // missing response (IBA 9.7.5.1.3 lets a READ restart
                // mid-message), as the probe asked it. The READs after it were
                // answered or their answers are on their way (on a host where
                // the peer waits for a CPU, nothing was lost), and such a peer
                // shows a lost request itself (it reports what it holds past a
                // hole, and the requester walks over the holes). Going back over
                // every READ in flight made the responder send all their
                // responses again if it had sent them: most of what a lossless
                // READ stream resent (session 13: 150-320 packets per GB). The
                // later expiries without progress go back over everything as
                // before: asked one at a time, a burst of lost requests (a
                // socket buffer overflowing) cost a doubled timeout each (47 ms
                // for 8 in `a_burst_of_128_lost_read_responses_waits_for_no_ibta_timeout`,
                // 2.4 ms going back).
                if !(first && self.ask_read_at_una(ctx, &mut v, now)) {
                    let una = self.una;
                    self.rewind(&mut v, now, una);
                    self.sr.walked_to = ctx.next_psn;
                }
            }
            None => {}
        }
        v
    }
}

/// Places response `k` of READ `seq`: it must be as long as the READ asked for
/// there, and end the message exactly at its last response.
fn place_read_response(
    ctx: &mut CompleteCtx<'_>,
    seq: u64,
    k: u32,
    pkt: &RocePacket<&[u8]>,
) -> Result<(), WcStatus> {
    let wqe = *ctx.sq.get(seq);
    let offset = k * ctx.mtu;
    let want = (wqe.length - offset.min(wqe.length)).min(ctx.mtu) as usize;
    let last = k + 1 == wqe.npsn;
    let payload = pkt.payload();
    if payload.len() != want || pkt.info().position.ends_message() != last {
        // Not what this READ asked for.
        return Err(WcStatus::BadRespErr);
    }
    ctx.shared
        .scatter(ctx.pd, ctx.sq.sges(seq), offset, payload)
        .map_err(|_| WcStatus::LocProtErr)
}

/// Whether `psn` lies in `[una, next_psn)`: sent and not yet acknowledged.
fn outstanding(una: Psn, next_psn: Psn, psn: Psn) -> bool {
    una.distance_to(psn) < una.distance_to(next_psn)
}

/// The started WQE whose PSN range holds `psn`.
fn wqe_with_psn(ctx: &CompleteCtx<'_>, psn: Psn) -> Option<u64> {
    started_wqe_with_psn(ctx.sq, ctx.started, psn)
}

/// The WQE of `sq`, among those started (before `started`), whose PSN range holds
/// `psn`.
fn started_wqe_with_psn(sq: &SendQueue, started: u64, psn: Psn) -> Option<u64> {
    (sq.head..started).find(|&seq| sq.get(seq).contains_psn(psn))
}
