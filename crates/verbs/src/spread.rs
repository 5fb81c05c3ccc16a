//! A spinning poller that keeps sharing its CPU with another runnable thread steps off it.
//!
//! Two processes of a ping-pong on one host (`perf send --lat`, ib_send_lat, any pair of
//! busy pollers on loopback) both spin in `Cq::poll`, and each yields the CPU at every
//! fourth empty poll so that a peer on the same CPU can run. Linux often leaves the two
//! spinners on one CPU while the other CPU idles: each has run a few microseconds ago,
//! so the load balancer finds both cache-hot and does not move them. Measured on this
//! 2-core host (session 13, `perf send --lat --size 8`, idle): 14.6-17.4 µs one way with
//! the scheduler's placement, 6.6-8.3 µs with the two ends pinned to different CPUs,
//! 15.0-15.9 µs with both pinned to one.
//!
//! So a spinning poller watches its own involuntary context switches (`ru_nivcsw`) against
//! its CPU time: each yield that found another task runnable on its CPU counts one. A
//! poller alone on its CPU counts next to none (a progress thread's wake-up, a tick); one
//! that shares its CPU with another busy thread, a spinner or any other, counts one per
//! few microseconds it runs, since it yields every few empty polls. Then it sleeps once,
//! briefly: its wake-up goes through the kernel's wake-up placement, which picks an idle
//! CPU if there is one. Where no CPU is idle (a loaded host) it wakes where it was and
//! has lost a few tens of microseconds; it then waits longer and longer before the next
//! try, so a loaded host pays at most a sleep per second and thread
//! ([`crate::move_backoff::MAX_WAIT`]; the spacing is shared with `crate::sock::apart`).
//!
//! Off by default (`Config::poll_spread` is zero): on the idle host it made `perf send
//! --lat` slower (median 11.7 → 15.1 µs in 8 interleaved pairs), its sleeps coming at
//! nearly every chance in the transients of a run's start (docs/udp-latency.md, session 13).

use crate::move_backoff::MoveBackoff;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How often a spinning poller looks at its switch count (at a yield).
const CHECK_EVERY: Duration = Duration::from_millis(1);
/// Involuntary switches per millisecond of the poller's own CPU time that mean another
/// busy thread shares its CPU. Two pollers on one CPU taking turns at their yields switch
/// some 100 times per millisecond each runs here; a poller alone, a few.
const SHARED_SWITCHES_PER_CPU_MS: u64 = 20;
/// A check more than this after the last one judges nothing (the thread was not spinning
/// meanwhile): it only takes a new count.
const STALE: Duration = Duration::from_millis(50);

/// A thread's count: involuntary switches and CPU time (ns) so far.
#[derive(Clone, Copy, Debug)]
struct Usage {
    switches: u64,
    cpu_ns: u64,
}

/// One thread's watch over its switch count. The spacing of moves is [`MoveBackoff`]'s,
/// shared with `crate::sock::apart`; what counts as a move that did not help is this
/// poller's own. It checks its CPU every millisecond while it spins, so a move that helped
/// shows at the next check (the CPU is not shared) and starts the spacing over at once,
/// wait lifted; a move that no check found helped by the time the next is due did not.
/// `apart`'s reader sees its CPU only when about to sleep on its writer's: it judges by
/// time instead.
#[derive(Clone, Copy, Debug)]
struct Watch {
    /// When the last count was taken, and the count.
    at: Option<(Instant, Usage)>,
    /// When the next move may come.
    spacing: MoveBackoff,
    /// The last move has not yet been judged by a check.
    just_moved: bool,
}

impl Watch {
    const NEW: Watch = Watch {
        at: None,
        spacing: MoveBackoff::NEW,
        just_moved: false,
    };

    /// Whether a check is due at `now`.
    fn due(&self, now: Instant) -> bool {
        self.at
            .is_none_or(|(at, _)| now.saturating_duration_since(at) >= CHECK_EVERY)
    }

    /// A check at `now` that read `usage`, the thread allowed on `cpus()` CPUs (asked only
    /// when the CPU is shared): whether the thread should move now.
    fn check(&mut self, now: Instant, usage: Usage, cpus: impl FnOnce() -> usize) -> bool {
        let shared = match self.at {
            Some((at, before)) if now.saturating_duration_since(at) <= STALE => {
                let switches = usage.switches.saturating_sub(before.switches);
                let cpu_ms = usage.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e6;
                switches > 0 && switches as f64 >= SHARED_SWITCHES_PER_CPU_MS as f64 * cpu_ms
            }
            _ => false,
        };
        self.at = Some((now, usage));
        if !shared {
            // Alone on its CPU (again): a later move may come at once and starts from
            // the first wait.
            self.spacing.reset();
            self.just_moved = false;
            return false;
        }
        if !self.spacing.may_move(now) || cpus() < 2 {
            return false;
        }
        // A move still unjudged did not help (no idle CPU): the next waits longer.
        self.spacing.moved(now, !self.just_moved);
        self.just_moved = true;
        true
    }

    /// The move ended at `at`, with `usage` counted then: the next check counts from
    /// there, not across the sleep.
    fn moved(&mut self, at: Instant, usage: Option<Usage>) {
        self.at = usage.map(|u| (at, u));
    }
}

thread_local! {
    static WATCH: Cell<Watch> = const { Cell::new(Watch::NEW) };
}

/// After a yield of a spinning empty poll: looks (at most every [`CHECK_EVERY`]) whether
/// the calling thread shares its CPU with another busy thread and, if so and the thread may run
/// on another CPU, sleeps `step` so that its wake-up may land on an idle CPU. Returns
/// whether it slept.
pub(crate) fn after_yield(step: Duration) -> bool {
    if step.is_zero() {
        return false;
    }
    let now = Instant::now();
    let mut w = WATCH.with(Cell::get);
    if !w.due(now) {
        return false;
    }
    let Some(usage) = usage() else {
        return false;
    };
    let moves = w.check(now, usage, crate::sys::allowed_cpus);
    if moves {
        std::thread::sleep(step);
        w.moved(Instant::now(), self::usage());
    }
    WATCH.with(|c| c.set(w));
    moves
}

fn usage() -> Option<Usage> {
    crate::sys::thread_switches_and_cpu().map(|(switches, cpu_ns)| Usage { switches, cpu_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `switches` and `cpu_ms` of CPU time so far.
    fn u(switches: u64, cpu_ms: u64) -> Usage {
        Usage {
            switches,
            cpu_ns: cpu_ms * 1_000_000,
        }
    }

    #[test]
    fn a_spinner_that_keeps_switching_moves_and_one_alone_does_not() {
        let t0 = Instant::now();
        let mut w = Watch::NEW;
        assert!(
            !w.check(t0, u(100, 10), || 2),
            "the first count judges nothing"
        );
        assert!(
            !w.check(t0 + ms(1), u(103, 11), || 2),
            "3 switches in 1 ms of CPU: alone"
        );
        assert!(
            !w.check(t0 + ms(2), u(103, 11), || 2),
            "not run at all: nothing to judge"
        );
        // Beside a busy loop the poller runs a little between long waits: 30 switches in
        // a millisecond of its own CPU time over 10 ms.
        assert!(w.check(t0 + ms(12), u(133, 12), || 2), "shared");
        let mut one_cpu = Watch::NEW;
        one_cpu.check(t0, u(0, 0), || 1);
        assert!(!one_cpu.check(t0 + ms(1), u(150, 1), || 1), "nowhere to go");
    }

    #[test]
    fn a_count_after_a_long_pause_judges_nothing() {
        let t0 = Instant::now();
        let mut w = Watch::NEW;
        w.check(t0, u(0, 0), || 2);
        assert!(
            !w.check(t0 + ms(80), u(1000, 1), || 2),
            "the thread was not spinning meanwhile"
        );
        assert!(w.check(t0 + ms(81), u(1100, 2), || 2));
    }

    #[test]
    fn moves_that_do_not_help_come_ever_less_often() {
        let t0 = Instant::now();
        let mut w = Watch::NEW;
        let mut moves = Vec::new();
        w.check(t0, u(0, 0), || 2);
        // A host with no idle CPU: every check finds the CPU shared.
        for i in 1..=2000 {
            let now = t0 + ms(i);
            if w.check(now, u(100 * i, i / 2), || 2) {
                moves.push(i);
                w.moved(now, Some(u(100 * i, i / 2)));
            }
        }
        let gaps: Vec<u64> = moves.windows(2).map(|m| m[1] - m[0]).collect();
        assert_eq!(gaps[..4], [10, 20, 40, 80], "moves at {moves:?}");
        assert!(moves.len() <= 9, "moves at {moves:?}");
        // Alone again: the next time it shares, it moves at once.
        let t1 = t0 + ms(2001);
        assert!(!w.check(t1, u(200_001, 1001), || 2));
        assert!(w.check(t1 + ms(1), u(200_101, 1002), || 2));
        assert_eq!(
            w.spacing.not_before(),
            Some(t1 + ms(1) + crate::move_backoff::FIRST_WAIT)
        );
    }
}
