//! Resending a same-host offer that got no answer (sans-IO: time is passed in).
//!
//! The handshake travels as plain UDP datagrams: an offer or its answer may be lost,
//! and the QP would then stay on the UDP path for good. So an offer that was sent
//! arms a timer; until an `Accept` or a `Decline` for the QP settles it, the offer is
//! sent again when the timer fires, the wait doubling each time, at most
//! [`MAX_OFFERS`] offers per QP in its whole life (a peer that never answers costs
//! a handful of small datagrams, then nothing).

use softverbs_engine::Instant;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// Offers sent for one QP, at most: the first and its resends, and those sent again
/// when the peer's own offer comes.
pub const MAX_OFFERS: u8 = 6;
/// The wait before the first resend; each later one waits twice as long (20, 40, 80,
/// 160, 320 ms: a peer that is slow to connect, on a busy machine, still gets one).
pub const FIRST_RESEND: Duration = Duration::from_millis(20);

/// What is known of one QP's offers.
#[derive(Debug, Clone, Copy)]
struct Offers {
    /// Offers made so far.
    made: u8,
    /// When to offer again, if unanswered.
    resend_at: Option<Instant>,
}

/// The offers of every QP (named by `Q`: the driver's QP handle) that made one.
#[derive(Debug)]
pub struct OfferTimers<Q> {
    qps: HashMap<Q, Offers>,
    /// The QPs whose timer is armed (few: only until answered or given up).
    armed: Vec<Q>,
}

impl<Q> Default for OfferTimers<Q> {
    fn default() -> Self {
        OfferTimers {
            qps: HashMap::new(),
            armed: Vec::new(),
        }
    }
}

impl<Q: Copy + Eq + Hash> OfferTimers<Q> {
    /// Whether `qp` may make one more offer; if so, it counts.
    pub fn may_offer(&mut self, qp: Q) -> bool {
        let o = self.qps.entry(qp).or_insert(Offers {
            made: 0,
            resend_at: None,
        });
        if o.made >= MAX_OFFERS {
            return false;
        }
        o.made += 1;
        true
    }

    /// An offer of `qp` left at `now`: arms its timer (the wait grows with the offers
    /// made), unless it may not make another.
    pub fn sent(&mut self, qp: Q, now: Instant) {
        let Some(o) = self.qps.get_mut(&qp) else {
            return;
        };
        if o.made >= MAX_OFFERS {
            self.disarm(qp);
            return;
        }
        let wait = FIRST_RESEND * (1u32 << (o.made.max(1) - 1));
        o.resend_at = Some(now + wait);
        if !self.armed.contains(&qp) {
            self.armed.push(qp);
        }
    }

    /// The peer answered `qp`'s offer (accepted or declined): no resend.
    pub fn settle(&mut self, qp: Q) {
        self.disarm(qp);
    }

    /// `qp` is destroyed.
    pub fn forget(&mut self, qp: Q) {
        self.disarm(qp);
        self.qps.remove(&qp);
    }

    fn disarm(&mut self, qp: Q) {
        if let Some(o) = self.qps.get_mut(&qp) {
            o.resend_at = None;
        }
        self.armed.retain(|&q| q != qp);
    }

    /// The earliest armed timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.armed
            .iter()
            .filter_map(|qp| self.qps.get(qp)?.resend_at)
            .min()
    }

    /// The next QP whose offer is due at `now`, its timer disarmed (sending the offer
    /// again arms it: [`OfferTimers::sent`]).
    pub fn poll_due(&mut self, now: Instant) -> Option<Q> {
        let qp = *self.armed.iter().find(|qp| {
            self.qps
                .get(qp)
                .and_then(|o| o.resend_at)
                .is_some_and(|t| t <= now)
        })?;
        self.disarm(qp);
        Some(qp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(n: u32) -> u32 {
        n
    }

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    /// An unanswered offer is resent at 20, 40, 80... ms, at most MAX_OFFERS in all.
    #[test]
    fn unanswered_offers_are_resent_with_growing_waits_then_given_up() {
        let mut t = OfferTimers::default();
        assert_eq!(t.poll_timeout(), None);
        let mut now = ms(1000);
        let mut sent_at = Vec::new();
        assert!(t.may_offer(qp(1)));
        t.sent(qp(1), now);
        sent_at.push(now);
        while let Some(due) = t.poll_timeout() {
            // Nothing is due before its time.
            assert_eq!(t.poll_due(Instant::from_nanos(due.as_nanos() - 1)), None);
            now = due;
            assert_eq!(t.poll_due(now), Some(qp(1)));
            assert_eq!(t.poll_due(now), None, "disarmed until sent again");
            if t.may_offer(qp(1)) {
                t.sent(qp(1), now);
                sent_at.push(now);
            }
        }
        let waits: Vec<u64> = sent_at
            .windows(2)
            .map(|w| (w[1].as_nanos() - w[0].as_nanos()) / 1_000_000)
            .collect();
        assert_eq!(waits, vec![20, 40, 80, 160, 320]);
        assert_eq!(sent_at.len(), usize::from(MAX_OFFERS));
        assert!(!t.may_offer(qp(1)));
    }

    #[test]
    fn an_answer_stops_the_resends_and_qps_are_independent() {
        let mut t = OfferTimers::default();
        for n in [1, 2] {
            assert!(t.may_offer(qp(n)));
            t.sent(qp(n), ms(n.into()));
        }
        t.settle(qp(1));
        assert_eq!(t.poll_timeout(), Some(ms(2 + 20)));
        assert_eq!(t.poll_due(ms(100)), Some(qp(2)));
        assert_eq!(t.poll_due(ms(100)), None);
        // A destroyed QP's handle reused later starts afresh.
        for _ in 1..MAX_OFFERS {
            assert!(t.may_offer(qp(2)));
        }
        assert!(!t.may_offer(qp(2)));
        t.forget(qp(2));
        assert!(t.may_offer(qp(2)));
    }
}
