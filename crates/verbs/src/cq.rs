//! Completion queues and completion channels.

use crate::context::{Context, ContextInner};
use crate::driver::{ChannelShared, PollWith};
use crate::error::ResourceError;
use crate::events::Source;
use softverbs_engine::{CqHandle, WorkCompletion};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// An empty poll yields the CPU once per this many empty polls in a row by one thread
/// (see [`Cq::poll`]); under a bandwidth window, where `Config::poll_yield_under_window`
/// asks it to, at every one.
pub(crate) const YIELD_EVERY: u32 = 4;

thread_local! {
    /// The calling thread's empty polls since its last poll that found completions.
    static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Whether the calling thread polls inside a blocking wait ([`BlockingWait`]).
    static IN_BLOCKING_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive, the calling thread's empty polls never yield the CPU: it is in a
/// blocking call that sleeps on a descriptor when its polls find nothing (a blocked
/// `rrecv`/`rsend`). There a `sched_yield` only delays it: on a host with more runnable
/// tasks than cores (two busy loops beside Debian's `rstream -T b` on 2 cores) each
/// yield let other tasks run out their slices while the message it waited for had
/// arrived, 0.4-1.6 ms per one-way transfer (docs/sockets.md, "Blocking calls on a
/// loaded host"); a task that sleeps instead is woken and run at once.
pub(crate) struct BlockingWait {
    was: bool,
}

impl BlockingWait {
    pub(crate) fn begin() -> BlockingWait {
        BlockingWait {
            was: IN_BLOCKING_WAIT.with(|w| w.replace(true)),
        }
    }
}

impl Drop for BlockingWait {
    fn drop(&mut self) {
        IN_BLOCKING_WAIT.with(|w| w.set(self.was));
    }
}

/// Notes an empty poll by the calling thread; returns whether it should yield the CPU:
/// at every [`YIELD_EVERY`]-th empty poll in a row, or at every one when `under_window`
/// says so (`Driver::yields_under_window`); never in a [`BlockingWait`], where
/// `under_window` is not asked.
fn empty_poll_yields(under_window: impl FnOnce() -> bool) -> bool {
    if IN_BLOCKING_WAIT.with(|w| w.get()) {
        return false;
    }
    EMPTY_POLLS.with(|e| {
        let n = e.get().wrapping_add(1);
        e.set(n);
        under_window() || n % YIELD_EVERY == 0
    })
}

/// Why a spinning poller on a busy CPU waits instead of yielding for a while.
///
/// Under EEVDF since Linux 6.17 (`yield_task_fair`, 79104becf42b; this host runs 6.18)
/// `sched_yield` by an eligible task forfeits the rest of its slice: its virtual runtime
/// jumps to its virtual deadline (6.6-6.16 pushed only the deadline a slice ahead). So a
/// spinner that runs a few microseconds between yields is charged a whole slice (the
/// base slice, of the order of a millisecond) for each, and is picked again only once
/// the other runnable tasks on its CPU have caught up. Beside two busy loops on its CPU an empty-poll loop
/// (a `recv` on an empty socket, a yield at every 4th) got 0.25 % of the CPU, 0.2 %
/// yielding at every one, against 19-21 % spinning without yields and 22 % sleeping
/// 20 µs on the socket instead of each yield (docs/udp-latency.md, session 16). A sleep
/// once in a while between yields does not help (0.25-0.27 % with one per 100 or 1000
/// polls): the charge is made at the yield, and a sleep keeps the task's lag.
///
/// Where `Config::poll_long_yield` asks for it (opt-in, 1 ms), a yield that gave the CPU
/// away that long found such tasks on its CPU; for a while ([`FIRST_HOLD`], doubled while
/// long yields come soon after each hold, up to [`MAX_HOLD`]) its thread then never
/// yields: it spins while its socket is busy ([`SPIN_QUIET`]) and, once quiet, makes each
/// would-be yield a short wait on the socket (`Driver::wait_for_datagram`: a datagram
/// ends one at once). A wait costs no slice, and lets the peer or the progress thread
/// run as the yield did. A yield that comes back quickly (nobody else runnable, or a peer
/// poller that takes its turn of a few microseconds: the two ends of a ping-pong on one
/// CPU) changes nothing, so a host with idle CPUs keeps the yield's latency. Opt-in:
/// beside two busy loops it took `perf send --lat` pinned apart from 1.4 ms one way
/// (median) to 5.9 µs, mean 1190 -> 33 µs; at load 5-6 from other work no change beyond
/// the spread (docs/udp-latency.md, session 16); the idle host was not measured.
mod long_yield {
    use std::time::{Duration, Instant};

    /// A yield this long gave the CPU to tasks that ran out their slices (the opt-in
    /// value of `Config::poll_long_yield`; in the tests here).
    #[cfg(test)]
    pub(super) const LONG_YIELD: Duration = Duration::from_millis(1);
    /// How long a thread waits instead of yielding after a long yield; doubled while
    /// the yield that ends the hold is long again.
    pub(super) const FIRST_HOLD: Duration = Duration::from_millis(10);
    pub(super) const MAX_HOLD: Duration = Duration::from_millis(160);
    /// Within a hold a poll loop sleeps only once its socket has been quiet this long
    /// (no datagram, no completion; see `quiet_for`): a little over a ping-pong's round
    /// trip pinned apart here (about 12 µs); before that it spins, without yielding.
    pub(super) const SPIN_QUIET: Duration = Duration::from_micros(15);

    /// A long yield this long after the last hold ended starts the holds over from
    /// [`FIRST_HOLD`].
    pub(super) const HOLDS_FORGOTTEN: Duration = Duration::from_millis(100);

    /// One thread's record of its yields.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Yields {
        /// Its yields are waits until then.
        wait_until: Option<Instant>,
        /// When the last hold ended (or ends).
        last_hold_end: Option<Instant>,
        /// The last hold.
        hold: Duration,
    }

    impl Yields {
        pub(super) const NEW: Yields = Yields {
            wait_until: None,
            last_hold_end: None,
            hold: FIRST_HOLD,
        };

        /// Whether a yield at `now` should be a wait instead.
        pub(super) fn waits_instead(&self, now: Instant) -> bool {
            self.wait_until.is_some_and(|until| now < until)
        }

        /// A yield ran from `start` to `end`; `long` is a long one's least length. A short one ends a hold but does not start
        /// the next hold over: the first yield after a hold is often short even on a busy
        /// CPU (the thread, having slept, is owed CPU time, and the kernel picks it
        /// again at once), the next one long.
        pub(super) fn yielded(&mut self, start: Instant, end: Instant, long: Duration) {
            if end.saturating_duration_since(start) < long {
                self.wait_until = None;
                return;
            }
            self.hold = match self.last_hold_end {
                Some(ended) if end.saturating_duration_since(ended) < HOLDS_FORGOTTEN => {
                    (self.hold * 2).min(MAX_HOLD)
                }
                _ => FIRST_HOLD,
            };
            self.wait_until = Some(end + self.hold);
            self.last_hold_end = self.wait_until;
        }
    }

    thread_local! {
        static YIELDS: std::cell::Cell<Yields> = const { std::cell::Cell::new(Yields::NEW) };
    }

    /// Whether the calling thread's next yield should be a wait on the socket instead.
    /// (The clock is read only within a hold: an idle host's yields pay nothing for it.)
    pub(super) fn waits_instead() -> bool {
        let yields = YIELDS.with(|y| y.get());
        yields.wait_until.is_some() && yields.waits_instead(Instant::now())
    }

    /// `sched_yield`, timed where `long` is not zero: one that lasts `long` or more makes
    /// the thread's next yields waits.
    pub(super) fn yield_now(long: Duration) {
        if long.is_zero() {
            std::thread::yield_now();
            return;
        }
        let start = Instant::now();
        std::thread::yield_now();
        let end = Instant::now();
        YIELDS.with(|y| {
            let mut yields = y.get();
            yields.yielded(start, end, long);
            y.set(yields);
        });
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn us(n: u64) -> Duration {
            Duration::from_micros(n)
        }

        #[test]
        fn a_long_yield_makes_the_next_yields_waits_for_a_hold() {
            let t0 = Instant::now();
            let mut y = Yields::NEW;
            y.yielded(t0, t0 + us(30), LONG_YIELD);
            assert!(
                !y.waits_instead(t0 + us(31)),
                "a short yield changes nothing"
            );
            y.yielded(t0, t0 + LONG_YIELD, LONG_YIELD);
            let end = t0 + LONG_YIELD;
            assert!(y.waits_instead(end));
            assert!(y.waits_instead(end + FIRST_HOLD - us(1)));
            assert!(
                !y.waits_instead(end + FIRST_HOLD),
                "the hold is over: yield again"
            );
        }

        #[test]
        fn holds_grow_while_yields_stay_long_and_start_over_once_forgotten() {
            let mut now = Instant::now();
            let mut y = Yields::NEW;
            let mut holds = Vec::new();
            for i in 0..7 {
                if i % 2 == 1 {
                    // The first yield after a hold may be short: the holds go on growing.
                    y.yielded(now, now + us(20), LONG_YIELD);
                    assert!(!y.waits_instead(now + us(20)));
                    now += us(20);
                }
                y.yielded(now, now + us(3000), LONG_YIELD);
                now += us(3000);
                let until = y.wait_until.unwrap();
                holds.push(until.duration_since(now).as_millis());
                now = until;
            }
            assert_eq!(holds, [10, 20, 40, 80, 160, 160, 160]);
            // Short yields for longer than HOLDS_FORGOTTEN: the next hold is the first.
            y.yielded(now, now + us(5), LONG_YIELD);
            now += HOLDS_FORGOTTEN;
            y.yielded(now, now + us(2000), LONG_YIELD);
            assert_eq!(y.wait_until, Some(now + us(2000) + FIRST_HOLD));
        }
    }
}

/// The calling thread's poll found completions: its run of empty polls starts over.
fn found_completions() {
    crate::trace::stamp(crate::trace::Step::Polled);
    EMPTY_POLLS.with(|e| e.set(0));
    QUIET_SINCE.with(|q| q.set(None));
}

/// The longest sleep of an empty poll whose socket has been quiet for long
/// (`Config::poll_wait_after`): a datagram ends it at once; the hand-off and the engine's
/// next timer bound it too.
pub(crate) const WAIT_MAX: Duration = Duration::from_micros(40);

/// Where a thread's quiet stretch on one device stands.
#[derive(Clone, Copy)]
struct Quiet {
    /// The device (`Driver::identity`).
    device: usize,
    /// Since when (the driver's clock, ns).
    since: u64,
    /// The device's count of datagrams received then.
    rx_datagrams: u64,
}

thread_local! {
    /// Since when the calling thread's polls of one device have found no completion
    /// while the device received no datagram (by any thread).
    static QUIET_SINCE: std::cell::Cell<Option<Quiet>> = const { std::cell::Cell::new(None) };
}

/// Notes an empty poll of `driver` at `now` that received nothing; returns how long
/// (ns) the calling thread's polls of it have been quiet. Datagrams the progress thread
/// received count: a 64 KiB READ's requester, whose responses the progress thread mostly
/// receives, finds a completion only every 64 messages (perftest's moderation) and fell
/// from 1.50 to 0.80 GB/s when its poller slept between them.
fn quiet_for(driver: &crate::driver::Driver, now: u64) -> u64 {
    let device = driver.identity();
    let rx_datagrams = driver.counters.rx_datagrams.load(Ordering::Relaxed);
    QUIET_SINCE.with(|q| match q.get() {
        Some(quiet) if quiet.device == device && quiet.rx_datagrams == rx_datagrams => {
            now.saturating_sub(quiet.since)
        }
        _ => {
            q.set(Some(Quiet {
                device,
                since: now,
                rx_datagrams,
            }));
            0
        }
    })
}

/// The calling thread's poll received something: its quiet stretch starts over.
fn not_quiet() {
    QUIET_SINCE.with(|q| q.set(None));
}

pub(crate) struct CqInner {
    pub ctx: Arc<ContextInner>,
    pub cq: CqHandle,
    channel: Option<Arc<ChannelShared>>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        let src = Source::Cq(self.cq);
        let ctx = &self.ctx;
        let _ = ctx.with(|st| {
            st.channels.remove(&self.cq);
            ctx.disown(st, src);
            let _ = st.engine.destroy_cq(self.cq);
        });
        ctx.forget(src);
        if let Some(ch) = &self.channel {
            ch.unregister(src);
        }
    }
}

/// A completion queue. QPs using it keep it alive.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cq").field(&self.inner.cq).finish()
    }
}

impl Cq {
    pub(crate) fn new(
        ctx: &Context,
        cqe: u32,
        channel: Option<&CompletionChannel>,
    ) -> Result<Cq, ResourceError> {
        let c = &ctx.inner;
        let cq = c.with(|st| -> Result<CqHandle, ResourceError> {
            let cq = st.engine.create_cq(cqe)?;
            c.adopt(st, Source::Cq(cq));
            if let Some(ch) = channel {
                ch.shared.register(Source::Cq(cq));
                st.channels.insert(cq, Arc::clone(&ch.shared));
            }
            Ok(cq)
        })??;
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: Arc::clone(c),
                cq,
                channel: channel.map(|c| Arc::clone(&c.shared)),
            }),
        })
    }

    /// Takes up to `out.len()` completions; returns how many. When the CQ is empty
    /// the calling thread receives what waits on the device's socket and looks
    /// again, so a thread spinning on its CQ needs no other thread to run; when
    /// nothing arrived it yields the CPU (`sched_yield`) before returning 0, at every
    /// fourth such poll in a row.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.poll_receiving(out, true, true)
    }

    /// [`Cq::poll`]; with `spinning` false the caller is not a thread that keeps polling
    /// (it arms the CQ when this finds nothing), so the progress thread keeps watching
    /// the socket (see `Driver::poller_handoff`). With `ends_handoff` false a poll that
    /// finds completions never ends the hand-off (`Driver::note_found`).
    pub(crate) fn poll_receiving(
        &self,
        out: &mut [WorkCompletion],
        spinning: bool,
        ends_handoff: bool,
    ) -> usize {
        let driver = self.inner.ctx.device.driver();
        match self.poll_ready(out) {
            0 => match driver.map(|d| {
                // The completion a receive makes is taken under the receive's lock.
                let poll = PollWith {
                    cq: self.inner.cq,
                    out: &mut *out,
                };
                (d, d.progress_for_poll(spinning, Some(poll)))
            }) {
                Ok((d, progressed)) if progressed.got => {
                    not_quiet();
                    // What the receive's finish made (same-host WRs it placed) is looked
                    // for only when the receive took nothing.
                    let n = match progressed.polled {
                        0 => self.poll_ready(out),
                        n => n,
                    };
                    if n > 0 {
                        found_completions();
                        d.note_found_at(ends_handoff, progressed.received_at);
                    } else {
                        // An empty poll all the same, which ends now: receiving a backlog
                        // (what waited in the socket while the thread was away) may take
                        // longer than a loop's gap, and counted from its start the next
                        // poll looked like no loop.
                        d.note_poll_ended();
                    }
                    n
                }
                progressed => {
                    // Nothing arrived: give the CPU to whoever is runnable. A thread
                    // spinning on an idle CQ (perftest -R's server waits for its control
                    // message this way for a whole bandwidth test) otherwise takes a core
                    // the peer it waits for, or our own progress thread, needs: unlike a
                    // hardware RNIC, our data path runs on the same CPUs as the pollers.
                    // (Spinning 50 µs before yielding made `perf send --lat` 1.5-4x
                    // slower on a loaded 2-core host: the peer waited for a CPU.)
                    // But only at every YIELD_EVERY-th empty poll in a row: a yield is a
                    // system call of about a microsecond even when nobody else runs, and a
                    // datagram that arrives during it waits for it, on a ping-pong's path
                    // at every message (sockperf's busy poll never yields). A few empty
                    // polls between yields keep the CPU a few microseconds longer.
                    // Opt-in (`Config::poll_yield_under_window`), a loop whose device has
                    // a bandwidth window in flight yields at every empty poll: the
                    // progress threads of both ends move the stream, and
                    // on a host with fewer cores than busy threads an empty poll without a
                    // yield keeps one of them off a CPU. perftest's bandwidth clients call
                    // `ibv_poll_cq` back to back: ib_read_bw made 4 empty polls per yield
                    // where `softverbs perf`, ahead of it on an idle host (0.82x), yields
                    // at each of its own empty rounds (docs/udp-bandwidth.md, session 12).
                    //
                    // A thread whose socket has been quiet for long (a bandwidth sender
                    // whose window is out, waiting for the next ACK) sleeps instead, where
                    // `Config::poll_wait_after` asks it to: a spin there cost a `recvmmsg`
                    // or a yield every microsecond or two, some 9 per 64 KiB message.
                    if let Ok((d, progressed)) = &progressed {
                        if spinning
                            && d.poll_wait_after(progressed.now).is_some_and(|after| {
                                quiet_for(d, progressed.now) >= after.as_nanos() as u64
                            })
                        {
                            if d.wait_for_datagram(WAIT_MAX, progressed.now) {
                                d.counters.poll_waits.fetch_add(1, Ordering::Relaxed);
                            }
                            d.note_poll_ended();
                            return 0;
                        }
                    }
                    let yields = empty_poll_yields(|| {
                        progressed
                            .as_ref()
                            .is_ok_and(|(d, _)| d.yields_under_window())
                    });
                    if yields {
                        let long = progressed
                            .as_ref()
                            .map_or(Duration::ZERO, |(d, _)| d.poll_long_yield());
                        if let Ok((d, progressed)) = &progressed {
                            if spinning && !long.is_zero() && long_yield::waits_instead() {
                                // Within a round trip of the last datagram or completion
                                // it spins on, without the yield: a sleep there made every
                                // message of a ping-pong a wake-up.
                                if quiet_for(d, progressed.now)
                                    < long_yield::SPIN_QUIET.as_nanos() as u64
                                {
                                    d.note_poll_ended_at(progressed.now);
                                    return 0;
                                }
                                if d.wait_for_datagram(WAIT_MAX, progressed.now) {
                                    d.counters.poll_yield_waits.fetch_add(1, Ordering::Relaxed);
                                }
                                d.note_poll_ended();
                                return 0;
                            }
                        }
                        long_yield::yield_now(long);
                    }
                    if let Ok((d, progressed)) = progressed {
                        if yields {
                            d.counters.poll_yields.fetch_add(1, Ordering::Relaxed);
                            if spinning && crate::spread::after_yield(d.poll_spread()) {
                                d.counters.poll_cpu_moves.fetch_add(1, Ordering::Relaxed);
                            }
                            // The yield may have lasted long: the gap counts from its end.
                            d.note_poll_ended();
                        } else {
                            // Only a `recvmmsg` that found nothing since the poll's
                            // clock read.
                            d.note_poll_ended_at(progressed.now);
                        }
                    }
                    0
                }
            },
            n => {
                found_completions();
                if let Ok(d) = driver {
                    d.note_found(ends_handoff);
                }
                n
            }
        }
    }

    /// [`Cq::poll_receiving`] that receives what waits on the device's socket first, even
    /// when the CQ holds completions already, while the socket is handed over to
    /// application threads (`Driver::socket_handed_over`): datagrams then wait there rather
    /// than in the CQ, and a caller that must see everything that arrived (a stream's
    /// poll: `MSG_PEEK` shows every message that arrived) receives them itself.
    pub(crate) fn poll_received(
        &self,
        out: &mut [WorkCompletion],
        spinning: bool,
        ends_handoff: bool,
    ) -> usize {
        match self.inner.ctx.device.driver() {
            Ok(d) if d.socket_handed_over() => {
                d.try_progress(spinning);
                self.poll_receiving(out, spinning, ends_handoff)
            }
            _ => self.poll_receiving(out, spinning, ends_handoff),
        }
    }

    /// The driver of the CQ's device (`None` in a child that inherited it by fork).
    pub(crate) fn driver(&self) -> Option<&Arc<crate::driver::Driver>> {
        self.inner.ctx.device.driver().ok()
    }

    /// Takes up to `out.len()` completions already in the CQ, without receiving what
    /// waits on the socket (`ibv_next_poll`): a completion that arrives later raises its
    /// armed event instead of being consumed here while the event still fires.
    pub fn poll_ready(&self, out: &mut [WorkCompletion]) -> usize {
        self.inner
            .ctx
            .read(|st| st.engine.poll_cq(self.inner.cq, out).unwrap_or(0))
            .unwrap_or(0)
    }

    /// Arms the CQ: the next completion (only solicited or error ones when
    /// `solicited_only`) raises an event on its completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), ResourceError> {
        self.arm(solicited_only, true)
    }

    /// [`Cq::req_notify`] for a thread that holds a watch on the device's socket
    /// (`Driver::watch_blocked`) and is about to sleep on it: the socket is handed over to
    /// it, so the poller hand-off need not end. Ending it woke the progress thread (an
    /// eventfd write and a context switch) only for it to find the socket taken by the
    /// watcher and sleep again: once per blocking stream read that slept.
    pub(crate) fn req_notify_watched(&self, solicited_only: bool) -> Result<(), ResourceError> {
        self.arm(solicited_only, false)
    }

    /// Arms the CQ for its channel's hook (`EventQueue::set_hook`) by a thread that goes
    /// on working: nothing else changes (no hand-off ends, no held ACK leaves).
    pub(crate) fn req_notify_for_hook(&self) -> Result<(), ResourceError> {
        self.inner
            .ctx
            .with(|st| st.engine.req_notify_cq(self.inner.cq, false))?
    }

    /// Sets the hook of the CQ's completion channel (none: nothing to set).
    pub(crate) fn set_channel_hook(&self, hook: Option<crate::events::EventHook>) {
        if let Some(ch) = &self.inner.channel {
            ch.set_hook(hook);
        }
    }

    fn arm(&self, solicited_only: bool, end_handoff: bool) -> Result<(), ResourceError> {
        if self.inner.channel.is_none() {
            return Err(ResourceError::InvalidArgument(
                "CQ has no completion channel",
            ));
        }
        // The caller will wait on the channel rather than poll: the progress thread
        // receives again from now on, and what the thread held back leaves now.
        crate::ack_hold::release_thread_held();
        if let (true, Ok(d)) = (end_handoff, self.inner.ctx.device.driver()) {
            d.end_poller_handoff();
        }
        self.inner
            .ctx
            .with(|st| st.engine.req_notify_cq(self.inner.cq, solicited_only))?
    }

    /// Polls until `n` completions arrived or `timeout` passed (spinning a while,
    /// then polling with short sleeps); returns them.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::with_capacity(n);
        let mut batch = [WorkCompletion::default(); 16];
        let mut spins = 0u32;
        while got.len() < n && std::time::Instant::now() < deadline {
            let k = self.poll(&mut batch[..(n - got.len()).min(16)]);
            got.extend_from_slice(&batch[..k]);
            if k == 0 {
                spins += 1;
                if spins < 2000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        got
    }

    /// Whether QPs still use this CQ.
    pub fn in_use(&self) -> bool {
        let inner = &self.inner;
        inner
            .ctx
            .read(|st| st.engine.cq_in_use(inner.cq))
            .unwrap_or(false)
    }

    /// The engine handle.
    pub fn handle(&self) -> CqHandle {
        self.inner.cq
    }

    /// Acknowledges `n` completion events of this CQ (`ibv_ack_cq_events`).
    pub fn ack_events(&self, n: u32) {
        if let Some(ch) = &self.inner.channel {
            ch.ack(Source::Cq(self.inner.cq), u64::from(n));
        }
    }

    /// Stops this CQ's completion and asynchronous events: pending ones are dropped and no
    /// new one is delivered (the first step of destroying it).
    pub fn close_events(&self) {
        let src = Source::Cq(self.inner.cq);
        if let Some(ch) = &self.inner.channel {
            ch.close(src);
        }
        self.inner.ctx.events.close(src);
    }

    /// Waits until every completion and asynchronous event of this CQ handed out was
    /// acknowledged (as `ibv_destroy_cq` does).
    pub fn wait_events_acked(&self) {
        let src = Source::Cq(self.inner.cq);
        if let Some(ch) = &self.inner.channel {
            ch.wait_acked(src);
        }
        self.inner.ctx.events.wait_acked(src);
    }
}

/// A completion channel: a real, pollable, blocking file descriptor that becomes
/// readable when an armed CQ gets a completion (like `ibv_comp_channel`).
pub struct CompletionChannel {
    pub(crate) shared: Arc<ChannelShared>,
    _ctx: Arc<ContextInner>,
}

impl CompletionChannel {
    pub(crate) fn new(ctx: &Context) -> std::io::Result<CompletionChannel> {
        Ok(CompletionChannel {
            shared: Arc::new(ChannelShared::new(false)?),
            _ctx: Arc::clone(&ctx.inner),
        })
    }

    /// A channel whose fd does not block (for async readers, and for waiters that
    /// poll(2) its fd before taking events).
    pub(crate) fn new_nonblocking(ctx: &Context) -> std::io::Result<CompletionChannel> {
        Ok(CompletionChannel {
            shared: Arc::new(ChannelShared::new(true)?),
            _ctx: Arc::clone(&ctx.inner),
        })
    }

    /// Takes one pending event without blocking.
    pub fn try_get_event(&self) -> Option<CqHandle> {
        self.shared.try_get()
    }

    /// The file descriptor: readable while an event is pending.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.shared.fd()
    }

    /// Waits for a CQ of this channel to fire, as `ibv_get_cq_event` does; returns its
    /// handle, or the wait's error (`EAGAIN` when the fd was made non-blocking, `EINTR`).
    /// Acknowledge the event with [`Cq::ack_events`].
    pub fn get_event(&self) -> std::io::Result<CqHandle> {
        self.shared.get()
    }

    /// Waits up to `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Option<CqHandle> {
        self.shared.get_timeout(timeout)
    }
}
