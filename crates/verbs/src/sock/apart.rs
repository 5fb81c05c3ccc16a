//! A bulk stream's blocked reader that finds itself on its writer's CPU moves off it.
//!
//! Two processes of a same-host stream on a host with an idle CPU often run on one CPU:
//! the writer's announcement wakes the blocked reader with a sync wake-up (a socket's),
//! which puts the reader on the writer's CPU when the writer runs alone there, and once
//! both were last on that CPU the kernel looks for an idle one only while the CPUs'
//! recent use leaves it a scan budget (`select_idle_cpu`'s `SIS_UTIL`; on two CPUs, none
//! above ~60 % of both). On one CPU the writer's copy into the reader's ring and the
//! reader's copy out of it no longer overlap (`docs/sockets.md`, sessions 13-16).
//!
//! So a same-host writer that writes in bulk (a call that moved at least [`BULK_WRITE`]
//! bytes) publishes the CPU it runs on and the time in its device's table
//! (`samehost::table`'s bulk-writer word, which its peers map), and a reader about to
//! sleep for data compares it with its own CPU. Found on its writer's CPU, it looks in
//! `/proc/stat` for another CPU it may use that idled at least half of the time since its
//! last look ([`IDLE_WINDOW`] or more ago), narrows its affinity to that CPU and gives the
//! old set back at once (`sys::move_to_cpu`): the kernel migrates it, and later wake-ups
//! find its previous CPU idle and leave it there (`select_idle_sibling` takes an idle
//! previous CPU before the waker's). With no idle CPU it stays (moved beside other work
//! it ran slower than beside its writer: session 16's first version, which moved to any
//! other CPU, lost 6 of 6 sampled runs at load 6-8). Moves after which it was back on its
//! writer's CPU within [`HELPED_AFTER`] come further and further apart ([`Backoff`]).
//!
//! A ping-pong of small messages never publishes, and a word older than [`FRESH_MS`]
//! says nothing, so only a stream that flows moves its reader.

use crate::move_backoff::MoveBackoff;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// A write call that moved at least this many bytes publishes its CPU.
pub(crate) const BULK_WRITE: usize = 16 << 10;
/// A published place older than this (ms) is stale: the writer stopped writing in bulk.
const FRESH_MS: u64 = 5;
/// The shortest time over which a CPU's idle share is judged (`/proc/stat` counts in
/// 10 ms ticks).
const IDLE_WINDOW: Duration = Duration::from_millis(50);
/// ... and the longest: an older look only starts a new window.
const IDLE_WINDOW_MAX: Duration = Duration::from_secs(2);
/// A move after which the reader was found on its writer's CPU again within this long
/// did not help (no idle CPU to stay on).
const HELPED_AFTER: Duration = Duration::from_millis(100);

/// The bulk-writer word for a writer on `cpu` at `now_ms`: the time above 16 bits, the
/// CPU plus one below (zero: nothing published).
pub(crate) fn word(cpu: u32, now_ms: u64) -> u64 {
    (now_ms << 16) | u64::from(cpu.min(0xfffe) + 1)
}

/// The CPU a bulk-writer word names, if it was published within [`FRESH_MS`] of `now_ms`.
pub(crate) fn fresh_cpu(word: u64, now_ms: u64) -> Option<u32> {
    let cpu = (word & 0xffff) as u32;
    let at = word >> 16;
    (cpu != 0 && now_ms.saturating_sub(at) <= FRESH_MS && at <= now_ms + 1).then(|| cpu - 1)
}

/// When a reader found on its writer's CPU may move: the spacing of moves is
/// [`MoveBackoff`]'s, shared with `crate::spread`; what counts as a move that did not
/// help is this reader's own. `spread`'s poller checks its CPU every millisecond and
/// starts over as soon as it is alone; this reader sees its CPU only when it is about to
/// sleep on its writer's, never where it went, so a move failed if it is found back within
/// [`HELPED_AFTER`], and one that helped is only known at the next move (a wait already
/// set stands).
#[derive(Clone, Copy, Debug)]
struct Backoff {
    /// When the next move may come.
    spacing: MoveBackoff,
    /// The last move.
    moved_at: Option<Instant>,
    /// The reader was found on its writer's CPU within [`HELPED_AFTER`] of the last move.
    failed: bool,
}

impl Backoff {
    const NEW: Backoff = Backoff {
        spacing: MoveBackoff::NEW,
        moved_at: None,
        failed: false,
    };

    /// The reader was found on its writer's CPU at `now`: whether it may move now.
    fn may_move(&mut self, now: Instant) -> bool {
        if self
            .moved_at
            .is_some_and(|m| now.saturating_duration_since(m) < HELPED_AFTER)
        {
            self.failed = true;
        }
        self.spacing.may_move(now)
    }

    /// It moved at `now`: the next move waits, twice as long as the last time if the
    /// last move did not help.
    fn moved(&mut self, now: Instant) {
        self.spacing.moved(now, !self.failed);
        self.failed = false;
        self.moved_at = Some(now);
    }

    /// It found no idle CPU to move to at `now`: it looks again after a window.
    fn stayed(&mut self, now: Instant) {
        self.spacing.hold_until(now + IDLE_WINDOW);
    }

    /// [`Self::may_move`], then [`Self::moved`] (the tests' whole step).
    #[cfg(test)]
    fn shared(&mut self, now: Instant) -> bool {
        let may = self.may_move(now);
        if may {
            self.moved(now);
        }
        may
    }
}

/// Idle time per CPU (`/proc/stat`'s idle and iowait, in ticks), as read at a time.
#[derive(Clone, Debug)]
struct IdleLook {
    at: Instant,
    idle: Vec<(u32, u64)>,
}

/// `/proc/stat`'s per-CPU idle ticks (idle and iowait: `proc(5)`).
fn parse_idle(stat: &str) -> Vec<(u32, u64)> {
    stat.lines()
        .filter_map(|l| {
            let mut f = l.split_ascii_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.take(5).filter_map(|x| x.parse().ok()).collect();
            (v.len() == 5).then(|| (cpu, v[3] + v[4]))
        })
        .collect()
}

/// A CPU other than `here` that idled at least half of the time between `before` and
/// `now` (`ticks_per_s`: `/proc/stat`'s unit), the idlest first; `allowed` says which
/// CPUs the thread may use.
fn idle_cpu(
    before: &IdleLook,
    now: &IdleLook,
    here: u32,
    ticks_per_s: u64,
    allowed: impl Fn(u32) -> bool,
) -> Option<u32> {
    let window = now.at.saturating_duration_since(before.at);
    if window < IDLE_WINDOW || window > IDLE_WINDOW_MAX {
        return None;
    }
    let half = window.as_secs_f64() * ticks_per_s as f64 / 2.0;
    now.idle
        .iter()
        .filter(|&&(cpu, _)| cpu != here && allowed(cpu))
        .filter_map(|&(cpu, idle)| {
            let was = before.idle.iter().find(|&&(c, _)| c == cpu)?.1;
            let idled = idle.saturating_sub(was) as f64;
            (idled >= half).then_some((cpu, idled))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(cpu, _)| cpu)
}

thread_local! {
    static BACKOFF: Cell<Backoff> = const { Cell::new(Backoff::NEW) };
    static LAST_LOOK: RefCell<Option<IdleLook>> = const { RefCell::new(None) };
}

/// What [`step_off_writer`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing: not on the writer's CPU, or the backoff says wait.
    None,
    /// Looked for an idle CPU and found none.
    Looked,
    /// Moved to an idle CPU.
    Moved,
}

/// For a reader about to sleep, whose writer published `peer_word`: moves the calling
/// thread to an idle CPU if it is on the writer's (and the backoff lets it).
pub(crate) fn step_off_writer(peer_word: u64) -> Step {
    let Some(writer_cpu) = fresh_cpu(peer_word, crate::sys::monotonic_ms()) else {
        return Step::None;
    };
    if crate::sys::current_cpu() != Some(writer_cpu) {
        return Step::None;
    }
    let now = Instant::now();
    let mut b = BACKOFF.with(Cell::get);
    let mut step = Step::None;
    if b.may_move(now) {
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
            return Step::None;
        };
        let look = IdleLook {
            at: now,
            idle: parse_idle(&stat),
        };
        let before = LAST_LOOK.with(|l| l.replace(Some(look.clone())));
        let target = before.and_then(|before| {
            idle_cpu(
                &before,
                &look,
                writer_cpu,
                crate::sys::clock_ticks_per_s(),
                |_| true,
            )
        });
        // (`move_to_cpu` refuses a CPU the thread may not use.)
        step = if target.is_some_and(crate::sys::move_to_cpu) {
            b.moved(now);
            Step::Moved
        } else {
            b.stayed(now);
            Step::Looked
        };
    }
    BACKOFF.with(|c| c.set(b));
    step
}

/// The word a bulk writer on this thread publishes now (`None`: its CPU is unknown).
pub(crate) fn writer_word() -> Option<u64> {
    crate::sys::current_cpu().map(|cpu| word(cpu, crate::sys::monotonic_ms()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_word_names_its_cpu_while_fresh() {
        let w = word(3, 1_000);
        assert_eq!(fresh_cpu(w, 1_000), Some(3));
        assert_eq!(fresh_cpu(w, 1_000 + FRESH_MS), Some(3));
        assert_eq!(fresh_cpu(w, 1_001 + FRESH_MS), None, "stale");
        assert_eq!(fresh_cpu(0, 1_000), None, "nothing published");
        assert_eq!(fresh_cpu(word(0, 7), 7), Some(0), "CPU 0 is not 'nothing'");
        assert_eq!(fresh_cpu(w, 990), None, "from the future: another clock");
    }

    #[test]
    fn only_a_cpu_that_idled_half_the_window_is_a_place_to_go() {
        let stat = "cpu  10 0 10 500 0 0 0 0 0 0\n\
                    cpu0 5 0 5 100 4 0 0 0 0 0\n\
                    cpu1 5 0 5 200 6 0 0 0 0 0\n\
                    intr 1 2 3\n";
        assert_eq!(parse_idle(stat), [(0, 104), (1, 206)]);
        let t0 = Instant::now();
        let look = |after: u64, idle: [u64; 3]| IdleLook {
            at: t0 + ms(after),
            idle: vec![(0, idle[0]), (1, idle[1]), (2, idle[2])],
        };
        let before = look(0, [100, 100, 100]);
        // 100 ms at 100 ticks/s: 10 ticks; half is 5.
        let now = look(100, [110, 104, 107]);
        assert_eq!(idle_cpu(&before, &now, 0, 100, |_| true), Some(2));
        assert_eq!(idle_cpu(&before, &now, 2, 100, |_| true), Some(0));
        assert_eq!(
            idle_cpu(&before, &now, 0, 100, |c| c != 2),
            None,
            "CPU 1 was busy"
        );
        let busy = look(100, [110, 102, 103]);
        assert_eq!(idle_cpu(&before, &busy, 0, 100, |_| true), None);
        let soon = look(20, [102, 102, 102]);
        assert_eq!(
            idle_cpu(&before, &soon, 0, 100, |_| true),
            None,
            "too short to judge"
        );
        let late = look(5000, [600, 600, 600]);
        assert_eq!(
            idle_cpu(&before, &late, 0, 100, |_| true),
            None,
            "too old to judge"
        );
    }

    /// A move lands the thread on the CPU asked for and leaves it the CPUs it had.
    #[test]
    fn a_move_lands_on_its_cpu_and_keeps_the_affinity() {
        let cpus = crate::sys::allowed_cpus();
        if cpus < 2 {
            eprintln!("SKIPPED a_move_lands_on_its_cpu: one CPU only");
            return;
        }
        let status = || std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let allowed = |s: String| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|l| l.trim().to_string())
        };
        let before = allowed(status());
        let here = crate::sys::current_cpu().unwrap();
        let there = (0..1024)
            .map(|c| (here + 1 + c) % 1024)
            .find(|&c| crate::sys::move_to_cpu(c))
            .expect("no other CPU to move to");
        // (The scheduler may move it again at once on a loaded host; it rarely does.)
        let landed = crate::sys::current_cpu();
        assert_eq!(allowed(status()), before, "affinity not given back");
        assert!(
            landed == Some(there) || landed != Some(here),
            "asked for {there}, still on {here}"
        );
        assert!(!crate::sys::move_to_cpu(1 << 20), "a CPU past the set");
    }

    #[test]
    fn moves_that_do_not_help_come_ever_less_often() {
        let t0 = Instant::now();
        let mut b = Backoff::NEW;
        // A host with no idle CPU: the reader is back on its writer's CPU at every look.
        let moves: Vec<u64> = (0..3000).filter(|&i| b.shared(t0 + ms(i))).collect();
        let gaps: Vec<u64> = moves.windows(2).map(|m| m[1] - m[0]).collect();
        assert_eq!(gaps[..4], [10, 20, 40, 80], "moves at {moves:?}");
        assert!(moves.len() <= 10, "moves at {moves:?}");
        // A move that kept it apart for a while helped: the next one may come soon.
        let t1 = t0 + ms(5000);
        assert!(b.shared(t1), "the wait is over");
        let t2 = t1 + crate::move_backoff::MAX_WAIT;
        assert!(b.shared(t2), "not found on the writer's CPU since the move");
        assert_eq!(
            b.spacing.not_before(),
            Some(t2 + crate::move_backoff::FIRST_WAIT)
        );
    }
}
