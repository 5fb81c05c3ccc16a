//! The wait between a thread's own moves to another CPU, longer while moves do not help.
//!
//! Two mechanisms move a thread off a CPU it shares with its peer so that the kernel
//! places it on an idle one: a spinning poller whose yields keep switching to another
//! busy thread (`crate::spread`) and a blocked stream reader found on its same-host
//! writer's CPU (`crate::sock::apart`). Where no CPU is idle a move buys nothing and
//! costs a sleep or a migration, so both space their moves by one schedule, kept here so
//! that the two cannot drift: after a move the next waits [`FIRST_WAIT`] if the move
//! before it helped, else twice the last wait, at most [`MAX_WAIT`].
//!
//! Whether a move helped stays with each caller, since each sees a different thing: the
//! poller checks its CPU every millisecond and knows at once when it is alone again (then
//! it [`MoveBackoff::reset`]s); the reader looks only when it is about to sleep on its
//! writer's CPU, so it judges a move by how soon it is found there again.

use std::time::{Duration, Instant};

/// The wait after a move that followed a move that helped (or none).
pub(crate) const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait: a thread with nowhere to go pays at most one move per this long.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);

/// When a thread may move again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoveBackoff {
    /// No move before this.
    not_before: Option<Instant>,
    /// The wait after the last move.
    wait: Duration,
}

impl MoveBackoff {
    /// No move yet: one may come at once.
    pub(crate) const NEW: MoveBackoff = MoveBackoff {
        not_before: None,
        wait: FIRST_WAIT,
    };

    /// Whether the thread may move at `now`.
    pub(crate) fn may_move(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// The thread moves at `now`: the next move waits [`FIRST_WAIT`] if the last one
    /// helped (`last_helped`), else twice the last wait, at most [`MAX_WAIT`].
    pub(crate) fn moved(&mut self, now: Instant, last_helped: bool) {
        self.wait = if last_helped {
            FIRST_WAIT
        } else {
            (self.wait * 2).min(MAX_WAIT)
        };
        self.not_before = Some(now + self.wait);
    }

    /// No move before `until` (the thread looked and found nowhere to go); the wait after
    /// the next move is unchanged.
    pub(crate) fn hold_until(&mut self, until: Instant) {
        self.not_before = Some(until);
    }

    /// Starts over: a move may come at once, and the next waits [`FIRST_WAIT`].
    pub(crate) fn reset(&mut self) {
        *self = Self::NEW;
    }

    /// The time before which no move comes.
    #[cfg(test)]
    pub(crate) fn not_before(&self) -> Option<Instant> {
        self.not_before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn moves_that_do_not_help_wait_twice_as_long_up_to_the_cap() {
        let t0 = Instant::now();
        let mut b = MoveBackoff::NEW;
        assert!(b.may_move(t0), "the first move comes at once");
        b.moved(t0, true);
        let mut waits = vec![b.not_before().unwrap() - t0];
        let mut now = t0;
        for _ in 0..8 {
            now = b.not_before().unwrap();
            assert!(!b.may_move(now - ms(1)), "before the wait is over");
            assert!(b.may_move(now));
            let before = now;
            b.moved(now, false);
            waits.push(b.not_before().unwrap() - before);
        }
        let waits_ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(waits_ms, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        // A move that helped: the wait after the next starts over.
        b.moved(now + MAX_WAIT, true);
        assert_eq!(b.not_before(), Some(now + MAX_WAIT + FIRST_WAIT));
    }

    #[test]
    fn a_hold_delays_the_next_move_but_not_its_wait_and_a_reset_lifts_it() {
        let t0 = Instant::now();
        let mut b = MoveBackoff::NEW;
        b.moved(t0, true);
        b.moved(t0 + ms(10), false);
        b.hold_until(t0 + ms(100));
        assert!(!b.may_move(t0 + ms(99)));
        assert!(b.may_move(t0 + ms(100)));
        b.moved(t0 + ms(100), false);
        assert_eq!(
            b.not_before(),
            Some(t0 + ms(140)),
            "20 ms doubled, not reset"
        );
        b.reset();
        assert!(b.may_move(t0 + ms(101)), "a reset lifts the wait");
        assert_eq!(b, MoveBackoff::NEW);
        b.moved(t0 + ms(101), true);
        assert_eq!(b.not_before(), Some(t0 + ms(111)));
    }
}
