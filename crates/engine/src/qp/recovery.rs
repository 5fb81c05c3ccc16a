//! Loss recovery ahead of the IBTA timer, for the completer: the round-trip time
//! measured from ACK timing, an early retransmission timer derived from it with a
//! tail-loss probe, and a cap on packets in flight tied to the measured
//! bandwidth-delay product.
//!
//! None of this changes IBTA's semantics. The local ACK timer (IBA 9.7.6.1.3) runs
//! beside the early timer, untouched by it, and only its expiries without forward
//! progress count toward retry_cnt: early retransmissions and probes are extra
//! packets, duplicates to a responder that already has them (IBA 9.7.5.1.1 answers
//! those without executing them again). So a dead peer still ends in
//! RETRY_EXC_ERR after (retry_cnt + 1) local ACK timeouts, and with no RTT sample
//! yet (a peer that never answered) the early timer is not armed at all.
//!
//! The RTT estimator follows RFC 6298 (SRTT, RTTVAR, Karn's rule: no sample from a
//! retransmitted packet); the early timer is TCP's RTO, and its first expiry sends a
//! tail-loss probe (RFC 8985 section 7): new data if the requester has a SEND or
//! WRITE packet the in-flight cap holds back (7.3), else the newest packet again;
//! its answer — an ACK, a sequence NAK or a selective acknowledgement — shows what
//! is missing.
//! The in-flight cap follows IRN (Mittal et al., SIGCOMM 2018): no more than about
//! two bandwidth-delay products unacknowledged, the bandwidth being the fastest
//! delivery rate seen over an RTT and the delay the shortest RTT seen (or half the
//! smoothed one, if longer: see `update_cap`).

use crate::time::Instant;
use core::time::Duration;
use softverbs_wire::Psn;

/// Packets a QP may have in flight before it has measured anything.
pub(crate) const INITIAL_CAP: u32 = 64;
/// The cap never goes below this many packets.
pub(crate) const MIN_CAP: u32 = 16;
/// Round trips without a quarter more delivery rate that end the start-up.
const STARTUP_STALLS: u32 = 3;

/// The RTT estimator of RFC 6298, in nanoseconds.
#[derive(Debug, Clone, Copy, Default)]
struct RttEstimator {
    srtt: u64,
    rttvar: u64,
    min_rtt: u64,
    sampled: bool,
    /// An IBTA local ACK timeout passed since the last sample: the estimate
    /// still runs the early timer, but the next sample starts it over (RFC 6298
    /// section 5's note), and an ambiguous one shorter than it replaces it.
    stale: bool,
}

impl RttEstimator {
    fn sample(&mut self, rtt: u64) {
        let rtt = rtt.max(1);
        if !self.sampled || self.stale {
            self.sampled = true;
            self.stale = false;
            self.srtt = rtt;
            self.rttvar = rtt / 2;
            self.min_rtt = rtt;
            return;
        }
        // RFC 6298 2.3: beta = 1/4, alpha = 1/8.
        let err = self.srtt.abs_diff(rtt);
        self.rttvar = (3 * self.rttvar + err) / 4;
        self.srtt = (7 * self.srtt + rtt) / 8;
        self.min_rtt = self.min_rtt.min(rtt);
    }

    /// An ambiguous sample (Karn's rule: the answer may be to a resent copy,
    /// `rtt` measured from the resend): the first estimate if there is none, and
    /// a new one if the estimate is stale and longer (the early timer let the
    /// IBTA timer expire: it was too long, and with everything resent no clean
    /// sample may come for a while). A longer one is ignored: after a stall it
    /// measures the stall, not the path (a 150 ms stall left a 12 ms estimate).
    fn ambiguous(&mut self, rtt: u64) {
        if !self.sampled || (self.stale && rtt < self.srtt) {
            self.sampled = false;
            self.sample(rtt);
        }
    }
}

/// The packet whose answer times a round trip.
#[derive(Debug, Clone, Copy)]
struct Timed {
    psn: Psn,
    sent: Instant,
    delivered: u64,
    /// When it may have been resent last: its answer is then ambiguous (Karn's
    /// rule) and is used only as a first estimate, measured from then (the early
    /// timer's floor covers an estimate too short).
    resent: Option<Instant>,
    /// Its round trip was measured already (a READ, by its first response): its
    /// acknowledgement only feeds the in-flight cap.
    measured: bool,
}

/// What the early timer does when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EarlyAction {
    /// Send the newest packet again (tail-loss probe).
    Probe,
    /// Go back to the oldest unacknowledged packet and resend (no retry counted).
    Retransmit,
}

/// Early loss recovery state of one QP's completer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recovery {
    rtt: RttEstimator,
    /// The packet being timed: its PSN, when it was first sent, `delivered`
    /// then, and whether it may have been resent since.
    timed: Option<Timed>,
    /// PSNs acknowledged so far.
    delivered: u64,
    /// Fastest delivery rate seen, in packets per second (scaled by 1024).
    max_rate: u64,
    /// The in-flight cap (0: not yet set, [`INITIAL_CAP`] applies).
    cap: u32,
    /// Samples in a row in which the delivery rate did not grow by a quarter:
    /// after [`STARTUP_STALLS`] the path is full and the cap stops doubling.
    stalls: u32,
    /// The early timer.
    deadline: Option<Instant>,
    /// Early expiries since the last progress (each doubles the timer).
    backoff: u32,
    /// The smallest early timeout (configuration).
    min_rto: Duration,
    /// The probe before any estimate went (it goes once per QP).
    probed_unmeasured: bool,
    /// The early timer runs for that probe: the first packet sent once there is
    /// an estimate sets it again from the estimate.
    armed_unmeasured: bool,
    /// How long the peer may hold an ACK back for its answer (configuration; see
    /// [`Recovery::lone_pto`]).
    peer_ack_hold: Duration,
    /// The early timer runs for a probe of a lone packet, lengthened for the
    /// peer's ACK hold: this is when it would fire otherwise, and it fires then
    /// once a second packet goes out.
    unlengthened: Option<Instant>,
}

/// What sets the early timer besides what it measures (configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RecoveryTiming {
    /// The early timer's floor (`EngineConfig::min_rto`).
    pub min_rto: Duration,
    /// The longest the peer holds an ACK for its answer
    /// (`EngineConfig::peer_ack_hold`).
    pub peer_ack_hold: Duration,
}

impl Recovery {
    /// Starts over (a QP reset or new PSNs), keeping nothing measured, with a
    /// peer that holds no ACK.
    #[cfg(test)]
    pub fn new(min_rto: Duration) -> Recovery {
        Recovery::with_timing(RecoveryTiming {
            min_rto,
            peer_ack_hold: Duration::ZERO,
        })
    }

    /// Starts over (a QP reset or new PSNs), keeping nothing measured.
    pub fn with_timing(timing: RecoveryTiming) -> Recovery {
        Recovery {
            min_rto: timing.min_rto,
            peer_ack_hold: timing.peer_ack_hold,
            ..Recovery::default()
        }
    }

    /// The configuration it was made with.
    pub fn timing(&self) -> RecoveryTiming {
        RecoveryTiming {
            min_rto: self.min_rto,
            peer_ack_hold: self.peer_ack_hold,
        }
    }

    /// The smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt
            .sampled
            .then(|| Duration::from_nanos(self.rtt.srtt))
    }

    /// How many packets may be in flight.
    #[inline]
    pub fn cap(&self) -> u32 {
        if self.cap == 0 {
            INITIAL_CAP
        } else {
            self.cap
        }
    }

    /// The early retransmission timeout: SRTT + 4 RTTVAR (RFC 6298 2.3), at least
    /// twice SRTT and the configured floor, doubled per expiry since progress.
    fn rto(&self) -> Option<Duration> {
        if !self.rtt.sampled {
            return None;
        }
        let base = (self.rtt.srtt + 4 * self.rtt.rttvar).max(2 * self.rtt.srtt);
        let base = Duration::from_nanos(base).max(self.min_rto);
        Some(base.saturating_mul(1 << self.backoff.saturating_sub(1).min(20)))
    }

    /// When the early timer fires next, armed at a time `until_ibta` before the
    /// IBTA timer with `in_flight` PSNs outstanding: a tail-loss probe after
    /// [`Recovery::pto`] ([`Recovery::lone_pto`] for a lone packet; before any
    /// estimate, [`Recovery::initial_pto`]), then the RTO, doubled per expiry.
    fn timeout(&self, until_ibta: Option<Duration>, in_flight: u32) -> Option<Duration> {
        if !self.rtt.sampled {
            return until_ibta
                .filter(|_| self.backoff == 0 && !self.probed_unmeasured)
                .map(|t| self.initial_pto(t));
        }
        if self.backoff == 0 {
            return Some(if in_flight == 1 {
                self.lone_pto()
            } else {
                self.pto()
            });
        }
        self.rto()
    }

    /// The probe's timeout when one PSN is in flight (a message of one packet, a
    /// ping-pong's): at least 2 SRTT + the peer's ACK hold + the probe's floor,
    /// RFC 8985 7.2's rule for a flight of one segment (PTO at least 2 SRTT +
    /// WCDelAckT, as the receiver may delay its ACK). A softverbs responder holds
    /// the ACK of a lone WRITE (up to `Config::ack_hold`, 50 µs by default) and a
    /// polling thread's ACKs for its answer (until its next empty poll or the
    /// progress thread's wake-up, the same 50 µs hand-off at most): a lone
    /// packet's ACK may come that much after the round trip, and a probe at the
    /// plain PTO (its 50 µs floor, when SRTT is small) fired about when the held
    /// ACK would have left anyway — in a `perf write --lat` ping-pong under load
    /// 654-1270 spurious probes per 20 000 round trips, each a duplicate, its
    /// lone ACK, and a round whose completion came before the peer's data
    /// (session 14, `docs/udp-latency.md`). The floor added is the margin for
    /// the hold timer's lateness: it covers a host's wake-up jitter, as for
    /// [`Recovery::min_pto`]. With more than one PSN in flight the ACK of the
    /// others is not held for an answer (a stream's next request ends a hold),
    /// and the plain PTO applies.
    fn lone_pto(&self) -> Duration {
        let pto = self.pto();
        if self.peer_ack_hold.is_zero() {
            return pto;
        }
        let held = Duration::from_nanos(2 * self.rtt.srtt) + self.peer_ack_hold + self.min_pto();
        pto.max(held)
    }

    /// The tail-loss probe's timeout: SRTT + max(4 RTTVAR, SRTT / 4), as QUIC's
    /// PTO (RFC 9002 6.2.1; its max_ack_delay is 0 here: with more than one
    /// packet in flight the responder's ACK is not held for an answer; a lone
    /// packet's is, and [`Recovery::lone_pto`] waits for it), at most RFC 8985's
    /// 2 SRTT, at least
    /// [`Recovery::min_pto`]. On a steady path the probe comes a quarter of a
    /// round trip after the answer was due instead of a whole one: in a
    /// ping-pong, where every lost last packet or ACK waits for the probe, that
    /// is most of what a loss costs.
    fn pto(&self) -> Duration {
        let srtt = self.rtt.srtt;
        let pto = (srtt + (4 * self.rtt.rttvar).max(srtt / 4)).min(2 * srtt);
        Duration::from_nanos(pto).max(self.min_pto())
    }

    /// The probe's timeout before anything is measured, armed `until_ibta` before
    /// the IBTA timer: a sixteenth of that (4.2 ms at the tools' timeout 14,
    /// about the IBTA period itself: the application chose it for its path), at
    /// least the RTO's floor. Without it a QP's first exchange that lost its last
    /// packet or its ACK (10 % of first messages at 5 % loss: nothing else comes
    /// back to estimate from) waited for the IBTA timer, 67 ms at timeout 14, half
    /// a lossless `ibv_rc_pingpong -n 2000`. (None without an IBTA timer,
    /// timeout 0: such a QP waits for its peer for good.) Only this one probe, once per QP (not
    /// again after an IBTA timeout drops the estimate, nor while a path slower
    /// than it has given no estimate yet): the backed-off retransmissions after
    /// it need an estimate (a dead peer gets one packet
    /// more in its first IBTA period, nothing else; retries count as before). A
    /// probe too early (a round trip longer than it) costs one duplicate packet,
    /// a first estimate measured from the probe (Karn's rule: see
    /// [`Recovery::on_answer`]), short until clean samples correct it, and the
    /// in-flight cap's first sample.
    fn initial_pto(&self, until_ibta: Duration) -> Duration {
        (until_ibta / 16).max(self.min_rto)
    }

    /// The probe's floor: a quarter of the RTO's. A probe is one packet (the
    /// newest again), so one sent too early costs a duplicate and nothing else,
    /// while one sent late costs a whole exchange where one message is in flight
    /// at a time (a ping-pong: every loss there is a tail loss). RFC 8985 floors
    /// the PTO only by the timer's granularity; the floor here covers a host's
    /// wake-up jitter. The RTO keeps the full floor: it goes back over
    /// everything outstanding.
    fn min_pto(&self) -> Duration {
        self.min_rto / 4
    }

    /// The early timer was due more than an RTO (at least its floor) before `now`
    /// and has not fired: whoever runs this QP was not running then (its process not
    /// scheduled, on a loaded host, for milliseconds at a time; the driver reads
    /// what waits on the socket before it fires timers). A round trip measured
    /// now includes that delay, the requester's own, not the path's: it is no
    /// sample (as Karn's rule keeps ambiguous ones out). Before, a READ stream
    /// whose requester stalled for 140 ms kept an estimate of about 8 ms to its
    /// end (50 µs without the stall), and every loss after it waited for a probe
    /// 15 ms late (in real `ib_read_bw` runs, for the IBTA timer: a backed-off
    /// RTO from such an estimate comes after it).
    fn late(&self, now: Instant) -> bool {
        let slack = self.rto().map_or(self.min_rto, |rto| rto.max(self.min_rto));
        self.deadline
            .is_some_and(|d| now.saturating_duration_since(d) > slack)
    }

    /// Early expiries since the last progress, counting the one just handled.
    pub fn backoff(&self) -> u32 {
        self.backoff
    }

    /// The early timer's deadline, if armed.
    #[inline]
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    pub fn stop(&mut self) {
        self.deadline = None;
        self.unlengthened = None;
    }

    /// A request packet went out at `now`; `fresh` if it was never sent before and
    /// asks for an ACK (so its answer times the round trip). The early timer runs
    /// if it did not, unless it would not fire before the IBTA timer does.
    /// `in_flight` PSNs are outstanding with it (from the oldest unacknowledged
    /// one to the newest sent): once a second one goes, a timer lengthened for a
    /// lone packet (see [`Recovery::lone_pto`]) comes back to the plain PTO.
    #[inline]
    pub fn on_sent(
        &mut self,
        now: Instant,
        psn: Psn,
        fresh: bool,
        ibta: Option<Instant>,
        in_flight: u32,
    ) {
        if fresh && self.timed.is_none() {
            self.timed = Some(Timed {
                psn,
                sent: now,
                delivered: self.delivered,
                resent: None,
                measured: false,
            });
        }
        if self.deadline.is_none() || (self.armed_unmeasured && self.rtt.sampled) {
            self.arm(now, ibta, in_flight);
        } else if in_flight > 1 {
            if let Some(plain) = self.unlengthened.take() {
                self.deadline = self.deadline.map(|d| d.min(plain));
            }
        }
    }

    fn arm(&mut self, now: Instant, ibta: Option<Instant>, in_flight: u32) {
        self.armed_unmeasured = !self.rtt.sampled;
        let until_ibta = ibta.map(|ibta| ibta.saturating_duration_since(now));
        let at = |t: Duration| Some(now + t).filter(|&d| ibta.is_none_or(|ibta| d < ibta));
        self.deadline = self.timeout(until_ibta, in_flight).and_then(at);
        self.unlengthened = if self.deadline.is_some() && self.backoff == 0 && in_flight == 1 {
            self.timeout(until_ibta, 2).and_then(at)
        } else {
            None
        };
    }

    /// The oldest unacknowledged PSN moved on to `una`, `acked` PSNs: measure, and
    /// restart the early timer if anything is still outstanding (`in_flight` PSNs
    /// from `una` to the newest sent).
    pub fn on_progress(
        &mut self,
        now: Instant,
        una: Psn,
        acked: u32,
        in_flight: u32,
        ibta: Option<Instant>,
    ) {
        self.delivered += u64::from(acked);
        self.backoff = 0;
        if self.late(now) {
            // Whatever is timed was sent before the stall (see `late`); the
            // answers read after this one, which waited in the socket with it,
            // would time it too.
            self.timed = None;
        }
        if let Some(t) = self.timed {
            if t.psn.before(una) {
                self.timed = None;
                match t.resent {
                    None => {
                        let rtt = (now - t.sent).as_nanos() as u64;
                        if !t.measured {
                            self.rtt.sample(rtt);
                        }
                        self.update_cap(rtt, self.delivered - t.delivered);
                    }
                    Some(at) => self.rtt.ambiguous((now - at).as_nanos() as u64),
                }
            }
        }
        self.deadline = None;
        self.unlengthened = None;
        if in_flight > 0 {
            self.arm(now, ibta, in_flight);
        }
    }

    /// One RTT sample of `rtt` ns over which `delivered` PSNs were acknowledged:
    /// the cap becomes twice the bandwidth-delay product, the bandwidth the
    /// fastest seen (decaying by 1/8 per sample so a slower path is learnt), the
    /// delay the shortest RTT seen. While the delivery rate still grows (start-up,
    /// as BBR's), a cap the delivery kept up with doubles instead.
    fn update_cap(&mut self, rtt: u64, delivered: u64) {
        let rtt = rtt.max(1);
        let rate = (delivered.max(1) << 10).saturating_mul(1_000_000_000) / rtt;
        if rate > self.max_rate + self.max_rate / 4 {
            self.stalls = 0;
        } else {
            self.stalls = self.stalls.saturating_add(1);
        }
        self.max_rate = rate.max(self.max_rate - self.max_rate / 8);
        // The delay: the shortest RTT seen, or half the smoothed one if that is
        // longer. Where the round trip is mostly a receiver's wake-up latency
        // (a loaded host) rather than a queue, the shortest one understates the
        // pipe; where it is mostly queue, half the smoothed one keeps the cap
        // from growing with it.
        let delay = self.rtt.min_rtt.max(self.rtt.srtt / 2);
        let bdp = (u128::from(self.max_rate) * u128::from(delay) / 1_000_000_000 / 1024) as u64;
        let starting = self.stalls < STARTUP_STALLS && delivered + 1 >= u64::from(self.cap());
        let grown = if starting {
            u64::from(self.cap()) * 2
        } else {
            0
        };
        let cap = (2 * bdp).max(grown).max(u64::from(MIN_CAP));
        self.cap = cap.min(u64::from(u32::MAX / 2)) as u32;
    }

    /// An IBTA local ACK timeout sent everything back: the early timer starts its
    /// back-off over (each IBTA period gets its own early retransmissions, so a
    /// lossy path has several chances per retry counted, not one). The round-trip
    /// estimate goes stale (RFC 6298 section 5 allows clearing it after backing
    /// off): an early timer that let the IBTA timer expire may have been too
    /// long, and with every packet now resent Karn's rule would keep a bogus
    /// estimate for good; the next answer, even an ambiguous one, shorter than
    /// it replaces it, and the next clean sample starts it over.
    ///
    /// It is not dropped: the early timer keeps running from it. Dropped, with no
    /// packet being timed (all of them sent before the last one timed was
    /// acknowledged, and a full send queue starting none), nothing estimated it
    /// again, and each retry counted was one attempt: an atomic at una at 17 %
    /// loss, which needs its request and its response through, ran out of
    /// retries (issue 15's chaos cases). And after a stall longer than the IBTA
    /// timeout the first answer, from the peer waking up, estimated the stall.
    pub fn on_ibta_timeout(&mut self) {
        self.deadline = None;
        self.unlengthened = None;
        self.backoff = 1;
        self.rtt.stale = true;
    }

    /// An answer (any ACK, NAK or response) naming `psn` came while nothing was
    /// measured yet: if it is to the packet being timed or a later one, the time
    /// since that packet went out (or was last resent) is a first estimate, too
    /// long if anything, so the early timer runs from then on. (An answer to an
    /// earlier packet says nothing of it: it may come just after it was sent, and
    /// an estimate too short makes the early timer resend for nothing, and the
    /// shortest RTT seen would keep the in-flight cap small for good.) Without it a re-request
    /// lost before the first sample (a READ whose responses were lost: nothing
    /// times it until it completes) waits out the IBTA timer, 67 ms at the tools'
    /// timeout 14, and at 20 % loss often twice. With a stale estimate (an IBTA
    /// timeout since) the same measure replaces it if shorter
    /// ([`RttEstimator::ambiguous`]).
    #[inline]
    pub fn on_answer(&mut self, now: Instant, psn: Psn) {
        if self.rtt.sampled && !self.rtt.stale {
            return;
        }
        if let Some(t) = self.timed.filter(|t| !psn.before(t.psn)) {
            let from = t.resent.unwrap_or(t.sent);
            self.rtt.ambiguous((now - from).as_nanos() as u64);
        }
    }

    /// The first response to the READ request `psn` came: if that READ is being
    /// timed, this is its round trip (its acknowledgement, when every response is
    /// in, would add the time the responses take, and any recovery among them).
    pub fn on_read_response(&mut self, now: Instant, psn: Psn) {
        if self.late(now) {
            // No sample (see `late`), and the acknowledgement gives none either.
            self.timed = None;
        }
        let Some(t) = &mut self.timed else {
            return;
        };
        if t.psn != psn || t.measured {
            return;
        }
        t.measured = true;
        match t.resent {
            None => self.rtt.sample((now - t.sent).as_nanos() as u64),
            Some(at) => self.rtt.ambiguous((now - at).as_nanos() as u64),
        }
    }

    /// Everything outstanding may be resent: the packet being timed may be
    /// answered by its copy, so it gives no sample (Karn's rule).
    pub fn on_resend(&mut self, now: Instant) {
        if let Some(t) = &mut self.timed {
            t.resent = Some(now);
        }
    }

    /// The packets in `[from, until)` may be resent: as [`Recovery::on_resend`] if
    /// the packet being timed is among them.
    pub fn on_resend_range(&mut self, now: Instant, from: Psn, until: Psn) {
        if let Some(t) = &mut self.timed {
            if t.psn.in_window(from, from.distance_to(until)) {
                t.resent = Some(now);
            }
        }
    }

    /// The responder reported seeing `psn` (a selective ACK): if it is the packet
    /// being timed, that times the round trip (the cumulative ACK may wait for a
    /// hole before it).
    pub fn on_seen(&mut self, now: Instant, psn: Psn) {
        if self.late(now) {
            // No sample (see `late`).
            self.timed = None;
        }
        let Some(t) = self.timed else {
            return;
        };
        if t.psn != psn {
            return;
        }
        self.timed = None;
        match t.resent {
            None => self.rtt.sample((now - t.sent).as_nanos() as u64),
            Some(at) => self.rtt.ambiguous((now - at).as_nanos() as u64),
        }
    }

    /// The early timer expired at `now`: what to do, if anything. The timer backs
    /// off and runs again (unless the IBTA timer, at `ibta`, comes first).
    pub fn on_timeout(&mut self, now: Instant, ibta: Option<Instant>) -> Option<EarlyAction> {
        let deadline = self.deadline?;
        if deadline > now {
            return None;
        }
        self.deadline = None;
        self.on_resend(now);
        if !self.rtt.sampled {
            self.probed_unmeasured = true;
        }
        let action = if self.backoff == 0 {
            EarlyAction::Probe
        } else {
            EarlyAction::Retransmit
        };
        self.backoff += 1;
        // Backed off: the RTO, whatever is in flight.
        self.arm(now, ibta, 0);
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    #[test]
    fn rtt_estimate_and_rto_follow_rfc_6298() {
        let mut r = Recovery::new(Duration::from_micros(10));
        assert_eq!(r.rto(), None, "no sample, no early timer");
        r.on_sent(at(0), Psn::new(5), true, None, 1);
        assert_eq!(r.deadline(), None, "no IBTA timer (timeout 0), no probe");
        r.on_progress(at(100), Psn::new(6), 1, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(100)));
        // SRTT 100, RTTVAR 50: the RTO is 100 + 200; the probe comes at 2 SRTT.
        assert_eq!(r.rto(), Some(Duration::from_micros(300)));
        r.on_sent(at(200), Psn::new(6), true, None, 1);
        assert_eq!(r.deadline(), Some(at(400)));
        r.on_progress(at(220), Psn::new(7), 1, 0, None);
        // err 80: RTTVAR (150 + 80) / 4 = 57.5; SRTT (700 + 20) / 8 = 90.
        assert_eq!(r.srtt(), Some(Duration::from_micros(90)));
        assert_eq!(r.rtt.min_rtt, 20_000);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn karn_no_sample_from_a_resent_packet_but_a_first_estimate() {
        let mut r = Recovery::new(Duration::ZERO);
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_resend(at(30));
        r.on_progress(at(50), Psn::new(2), 1, 0, None);
        // No estimate yet: the ambiguous answer gives one, from the resend.
        assert_eq!(r.srtt(), Some(Duration::from_micros(20)));
        r.on_sent(at(60), Psn::new(2), true, None, 1);
        r.on_resend(at(60));
        r.on_progress(at(70), Psn::new(3), 1, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(20)), "Karn's rule");
    }

    #[test]
    fn probe_then_backed_off_retransmissions_before_the_ibta_timer() {
        let mut r = Recovery::new(Duration::from_micros(100));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(10), Psn::new(2), 1, 0, None);
        // SRTT 10 µs: the probe comes at its floor, a quarter of the RTO's 100 µs.
        let ibta = Some(at(1000));
        r.on_sent(at(20), Psn::new(2), true, ibta, 1);
        assert_eq!(r.deadline(), Some(at(45)));
        assert_eq!(r.on_timeout(at(44), ibta), None);
        assert_eq!(r.on_timeout(at(45), ibta), Some(EarlyAction::Probe));
        r.on_sent(at(45), Psn::new(2), false, ibta, 1);
        // Then the RTO (its floor, 100 µs), doubled per expiry.
        assert_eq!(r.deadline(), Some(at(145)));
        assert_eq!(r.on_timeout(at(145), ibta), Some(EarlyAction::Retransmit));
        r.on_sent(at(145), Psn::new(2), false, ibta, 1);
        assert_eq!(r.deadline(), Some(at(345)));
        assert_eq!(r.on_timeout(at(345), ibta), Some(EarlyAction::Retransmit));
        assert_eq!(r.deadline(), Some(at(745)));
        assert_eq!(r.on_timeout(at(745), ibta), Some(EarlyAction::Retransmit));
        // 745 + 800 is past the IBTA timer: that one takes over.
        r.on_sent(at(745), Psn::new(2), false, ibta, 1);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn a_read_is_timed_by_its_first_response_not_its_completion() {
        let mut r = Recovery::new(Duration::from_micros(200));
        // READ request PSN 10 (64 responses), sent at 0; its first response at 40,
        // its last (after recovering a loss among them) at 900.
        r.on_sent(at(0), Psn::new(10), true, None, 1);
        r.on_read_response(at(40), Psn::new(10));
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)));
        r.on_progress(at(900), Psn::new(74), 64, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)), "one sample");
        // A response to another PSN times nothing.
        r.on_sent(at(1000), Psn::new(74), true, None, 1);
        r.on_read_response(at(1010), Psn::new(75));
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)));
    }

    /// An answer handled while the early timer is overdue by more than an RTO
    /// (the requester itself did not run) times nothing: neither the READ's first
    /// response nor any answer read with it. The next new packet is timed again.
    #[test]
    fn a_round_trip_across_the_requesters_own_stall_is_no_sample() {
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(10), true, None, 1);
        r.on_read_response(at(40), Psn::new(10));
        r.on_progress(at(100), Psn::new(74), 64, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)));
        // READ 74 sent at 1000; the requester does not run until 141 ms, past
        // its early timer (armed at 1000 + a probe timeout).
        r.on_sent(at(1000), Psn::new(74), true, None, 1);
        assert!(r.deadline().is_some());
        r.on_read_response(at(141_000), Psn::new(74));
        r.on_progress(at(141_001), Psn::new(138), 64, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)), "no sample");
        // On time again: the next READ is timed.
        r.on_sent(at(142_000), Psn::new(138), true, None, 1);
        r.on_read_response(at(142_040), Psn::new(138));
        assert_eq!(r.srtt(), Some(Duration::from_micros(40)));
        assert_eq!(r.rtt.min_rtt, 40_000);
        // Late by less than an RTO (the driver reads the socket before it fires
        // timers): a sample.
        r.on_progress(at(142_100), Psn::new(202), 64, 0, None);
        r.on_sent(at(143_000), Psn::new(202), true, None, 1);
        let due = r.deadline().expect("armed");
        let late = due + Duration::from_micros(100);
        r.on_read_response(late, Psn::new(202));
        assert!(r.srtt() > Some(Duration::from_micros(40)), "{:?}", r.srtt());
    }

    #[test]
    fn an_ibta_timeout_makes_the_estimate_stale_and_a_shorter_answer_replaces_it() {
        let mut r = Recovery::new(Duration::from_micros(200));
        // A bogus estimate of 30 ms (a stalled host).
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(30_000), Psn::new(2), 1, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_millis(30)));
        let ibta = Some(at(30_100 + 67_000));
        r.on_sent(at(30_100), Psn::new(2), true, ibta, 1);
        // 2 SRTT = 60 ms: the probe just fits; the RTO after it does not.
        assert_eq!(r.on_timeout(at(90_100), ibta), Some(EarlyAction::Probe));
        assert_eq!(r.deadline(), None);
        // The IBTA timer goes back over everything at 97.1 ms: the estimate is
        // stale, kept; an answer 50 µs later, shorter, is the new estimate,
        // measured from the go-back.
        r.on_ibta_timeout();
        assert_eq!(r.srtt(), Some(Duration::from_millis(30)));
        r.on_resend(at(97_100));
        r.on_answer(at(97_150), Psn::new(2));
        assert_eq!(r.srtt(), Some(Duration::from_micros(50)));
        // An answer to a packet before the one timed estimates nothing.
        r.on_ibta_timeout();
        r.on_answer(at(97_200), Psn::new(1));
        assert_eq!(r.srtt(), Some(Duration::from_micros(50)));
        // A clean sample starts a stale estimate over (no smoothing with it).
        r.on_progress(at(97_300), Psn::new(3), 1, 0, None);
        r.on_sent(at(97_400), Psn::new(3), true, None, 1);
        r.on_progress(at(97_480), Psn::new(4), 1, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(80)));
        // Nothing measured, nothing estimated from an answer: it needs a packet timed.
        let mut fresh = Recovery::new(Duration::ZERO);
        fresh.on_answer(at(5), Psn::new(0));
        assert_eq!(fresh.srtt(), None);
    }

    /// Issue 15's chaos case (an atomic at una, 17 % loss): the packet timed was
    /// acknowledged with later ones outstanding, so nothing was timed; the IBTA
    /// timeout dropped the estimate, nothing estimated it again, and the early
    /// timer never ran again: one attempt per retry counted.
    #[test]
    fn after_an_ibta_timeout_the_early_timer_runs_on_with_nothing_timed() {
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_sent(at(10), Psn::new(2), true, None, 1);
        let ibta = Some(at(1050));
        r.on_progress(at(50), Psn::new(2), 1, 1, ibta);
        assert_eq!(r.srtt(), Some(Duration::from_micros(50)));
        r.on_ibta_timeout();
        r.on_resend(at(1050));
        let ibta = Some(at(2100));
        r.on_sent(at(1050), Psn::new(2), false, ibta, 1);
        // Backed off to the RTO (its 200 µs floor), then doubling.
        assert_eq!(r.deadline(), Some(at(1250)));
        assert_eq!(r.on_timeout(at(1250), ibta), Some(EarlyAction::Retransmit));
        assert_eq!(r.deadline(), Some(at(1650)));
    }

    /// A peer that stalls past the IBTA timeout answers when it runs again: that
    /// answer times the stall, not the path (Karn's rule: it may answer either
    /// copy). It left a 15.95 ms estimate here (12 ms in `loss.rs`'s 150 ms
    /// stall) until clean samples brought it down; the estimate before the stall
    /// stands.
    #[test]
    fn an_answer_after_a_stall_past_the_ibta_timeout_does_not_estimate_the_stall() {
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(50), Psn::new(2), 1, 0, None);
        r.on_sent(at(100), Psn::new(2), true, Some(at(67_100)), 1);
        r.on_resend(at(300));
        r.on_ibta_timeout();
        r.on_resend(at(67_100));
        r.on_ibta_timeout();
        r.on_resend(at(134_100));
        r.on_answer(at(150_050), Psn::new(2));
        r.on_progress(at(150_050), Psn::new(3), 1, 0, None);
        assert_eq!(r.srtt(), Some(Duration::from_micros(50)));
    }

    #[test]
    fn before_any_estimate_one_probe_then_only_the_ibta_timer() {
        let mut r = Recovery::new(Duration::from_micros(200));
        let ibta = Some(at(67_200));
        r.on_sent(at(0), Psn::new(7), true, ibta, 1);
        // A sixteenth of the IBTA period.
        assert_eq!(r.deadline(), Some(at(4200)));
        assert_eq!(r.on_timeout(at(4200), ibta), Some(EarlyAction::Probe));
        r.on_sent(at(4200), Psn::new(7), false, ibta, 1);
        assert_eq!(r.deadline(), None, "no RTO without an estimate");
        // Nothing came back: the IBTA timer goes back, and its period gets no
        // probe of its own (a dead peer: one packet more in all).
        r.on_ibta_timeout();
        r.on_resend(at(67_200));
        r.on_sent(at(67_200), Psn::new(7), false, Some(at(134_400)), 1);
        assert_eq!(r.deadline(), None);
        // An answer to the go-back gives a first estimate, from it.
        r.on_answer(at(67_250), Psn::new(7));
        assert_eq!(r.srtt(), Some(Duration::from_micros(50)));
    }

    #[test]
    fn the_probe_comes_at_twice_the_srtt_above_its_floor() {
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(40), Psn::new(2), 1, 0, None);
        // 2 SRTT = 80 µs: above the probe's 50 µs floor, below the RTO's 200.
        r.on_sent(at(100), Psn::new(2), true, None, 1);
        assert_eq!(r.deadline(), Some(at(180)));
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(10), Psn::new(2), 1, 0, None);
        r.on_sent(at(100), Psn::new(2), true, None, 1);
        assert_eq!(r.deadline(), Some(at(150)), "the floor");
    }

    #[test]
    fn on_a_steady_path_the_probe_comes_a_quarter_srtt_after_the_answer_was_due() {
        let mut r = Recovery::new(Duration::from_micros(200));
        // Every round trip 100 µs: RTTVAR decays to nothing.
        let mut t = 0;
        for psn in 0..40 {
            r.on_sent(at(t), Psn::new(psn), true, None, 1);
            t += 100;
            r.on_progress(at(t), Psn::new(psn + 1), 1, 0, None);
            t += 10;
        }
        assert_eq!(r.srtt(), Some(Duration::from_micros(100)));
        r.on_sent(at(t), Psn::new(40), true, None, 1);
        // SRTT + SRTT / 4, not 2 SRTT.
        assert_eq!(r.deadline(), Some(at(t + 125)));
        // A path whose round trips vary: 4 RTTVAR, up to 2 SRTT.
        let mut r = Recovery::new(Duration::from_micros(200));
        let mut t = 0;
        for (psn, rtt) in [100, 140, 60, 130, 70, 100].into_iter().enumerate() {
            r.on_sent(at(t), Psn::new(psn as u32), true, None, 1);
            t += rtt;
            r.on_progress(at(t), Psn::new(psn as u32 + 1), 1, 0, None);
        }
        let (srtt, rttvar) = (r.rtt.srtt, r.rtt.rttvar);
        r.on_sent(at(t), Psn::new(6), true, None, 1);
        let pto = (srtt + 4 * rttvar).min(2 * srtt);
        assert!(4 * rttvar > srtt / 4 && pto > srtt);
        assert_eq!(r.deadline(), Some(at(t) + Duration::from_nanos(pto)));
    }

    /// RFC 8985 7.2: with one packet in flight the probe waits 2 SRTT + the peer's
    /// ACK hold + the probe's floor; a second packet sent brings the timer back to
    /// the plain PTO (a stream's is unchanged), as does progress with more than
    /// one in flight.
    #[test]
    fn a_lone_packets_probe_waits_out_the_peers_ack_hold() {
        let mut r = Recovery::with_timing(RecoveryTiming {
            min_rto: Duration::from_micros(200),
            peer_ack_hold: Duration::from_micros(50),
        });
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(10), Psn::new(2), 1, 0, None);
        // SRTT 10 µs: the plain probe at its 50 µs floor; a lone packet's at
        // 2 x 10 + 50 + 50.
        r.on_sent(at(100), Psn::new(2), true, None, 1);
        assert_eq!(r.deadline(), Some(at(220)));
        // A second packet: the plain probe, from when the first went.
        r.on_sent(at(101), Psn::new(3), true, None, 2);
        assert_eq!(r.deadline(), Some(at(150)));
        // Progress with two still in flight: the plain probe; with one, the lone one.
        r.on_sent(at(102), Psn::new(4), true, None, 3);
        r.on_progress(at(111), Psn::new(3), 1, 2, None);
        assert_eq!(r.deadline(), Some(at(161)));
        r.on_progress(at(112), Psn::new(4), 1, 1, None);
        let srtt = r.rtt.srtt;
        assert_eq!(
            r.deadline(),
            Some(at(112 + 100) + Duration::from_nanos(2 * srtt))
        );
        // The backed-off RTO after the probe is the plain one (its 200 µs floor).
        let probe = r.deadline().unwrap();
        assert_eq!(r.on_timeout(probe, None), Some(EarlyAction::Probe));
        assert_eq!(r.deadline(), Some(probe + Duration::from_micros(200)));
        // No hold configured: as before.
        let mut r = Recovery::new(Duration::from_micros(200));
        r.on_sent(at(0), Psn::new(1), true, None, 1);
        r.on_progress(at(10), Psn::new(2), 1, 0, None);
        r.on_sent(at(100), Psn::new(2), true, None, 1);
        assert_eq!(r.deadline(), Some(at(150)));
    }

    #[test]
    fn the_cap_grows_while_delivery_keeps_up_and_settles_at_twice_the_bdp() {
        let mut r = Recovery::new(Duration::ZERO);
        assert_eq!(r.cap(), INITIAL_CAP);
        // Every round trip of 100 µs delivers what the cap allowed: it doubles.
        let mut t = 0;
        let mut una = 0u32;
        for _ in 0..4 {
            let cap = r.cap();
            r.on_sent(at(t), Psn::new(una), true, None, 1);
            una += cap;
            t += 100;
            r.on_progress(at(t), Psn::new(una), cap, 0, None);
            assert_eq!(r.cap(), 2 * cap);
        }
        // A path that delivers what the cap allows, but only by queueing (the round
        // trip grows with it): the rate stops growing, start-up ends.
        for _ in 0..3 {
            let cap = r.cap();
            r.on_sent(at(t), Psn::new(una), true, None, 1);
            una += cap;
            // 512 packets per 100 µs, the last rate seen.
            t += 100 * u64::from(cap) / 512;
            r.on_progress(at(t), Psn::new(una), cap, 0, None);
        }
        assert!(
            r.stalls >= STARTUP_STALLS,
            "stalls {} cap {} rate {}",
            r.stalls,
            r.cap(),
            r.max_rate
        );
        // Now the path delivers only 100 packets per 100 µs round trip: the
        // fastest rate seen decays to it, and the cap comes down to 2 x 100.
        for _ in 0..40 {
            r.on_sent(at(t), Psn::new(una), true, None, 1);
            una += 100;
            t += 100;
            r.on_progress(at(t), Psn::new(una), 100, 0, None);
        }
        assert!(r.cap() >= 200 && r.cap() < 260, "cap {}", r.cap());
    }
}
