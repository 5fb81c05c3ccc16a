//! The UDP driver: runs one engine over one socket.
//!
//! A progress thread receives datagrams, feeds them to the engine, fires its timers and
//! sends what it produces, so one-sided operations complete while the target application
//! does nothing. Threads that post work transmit what the post produced themselves
//! (doorbell style); when they armed a timer earlier than the one the progress thread
//! sleeps for, they arm its timerfd, which wakes it only if the timer comes due (see
//! [`Driver::arm_timer`]).
//!
//! # Locks and system calls
//!
//! The device lock (`state`, the engine) is held only for engine work: no system call is
//! made under it. A verbs call locks it once, lets the engine work, and *pumps*: the
//! datagrams the engine emits are built into [`SendBatch`]es, completion notifications and
//! asynchronous events are collected ([`Deferred`]). After the lock is released the batches
//! are sent (`sendmmsg`, one call per batch of up to [`sys::BATCH`] datagrams) and the events
//! delivered. Batches wait in the *outbox* in the order they were built; whichever thread
//! holds the sender role sends them, so datagrams leave in the engine's order without any
//! thread waiting for another's system call.
//!
//! A full socket buffer is backpressure, not loss: when `sendmmsg` says `EAGAIN` the rest of
//! the batch stays at the head of the outbox and the progress thread waits for `POLLOUT`
//! (`ENOBUFS`: it retries after a millisecond). Only datagrams the kernel refuses for good
//! (unreachable, too large) are dropped and counted.
//!
//! Threads that poll an empty CQ also receive (see [`Driver::try_progress`]): an application
//! spinning on its CQ then handles its own datagrams at once instead of waiting for the
//! progress thread to be scheduled. One receive buffer, behind its own lock, serves both,
//! so datagrams are handed to the engine in the order the socket gave them.
//! While such a poller is active the progress thread does not wait on the socket at all
//! (see [`Driver::poller_handoff`]): no thread is woken per datagram. Only a poll loop
//! starts that hand-off ([`PollStreak`]), and the pollers fire due timers meanwhile.

use crate::config::Config;
use crate::events::{EventQueue, Source};
use crate::faults::{Fate, FaultInjector};
use crate::sys::{self, EventFd, Flushed, RecvBatch, SendBatch};
use softverbs_engine::{
    AsyncEvent, CqHandle, Engine, EngineConfig, Instant, Mtu, Transmit, WorkCompletion,
    MAX_DATAGRAM,
};
use softverbs_wire::pcap::PcapWriter;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Counters the driver keeps beside the engine's.
#[derive(Debug, Default)]
pub struct DriverCounters {
    /// Datagrams handed to the kernel.
    pub tx_datagrams: AtomicU64,
    /// Datagrams read from the kernel.
    pub rx_datagrams: AtomicU64,
    /// Of those, datagrams the progress thread read (the others: threads polling a CQ).
    pub rx_by_progress: AtomicU64,
    /// Reads that took datagrams with a single `recvmsg`, not a batch (a ping-pong's
    /// spinning poller: `RecvBatch::recv_adaptive`).
    pub rx_single_reads: AtomicU64,
    /// Datagrams the kernel refused to send for good (unreachable, too large).
    pub tx_errors: AtomicU64,
    /// Datagrams dropped by fault injection.
    pub injected_drops: AtomicU64,
    /// Datagrams too large for a receive buffer.
    pub rx_truncated: AtomicU64,
    /// Send calls (`sendmmsg`, or `sendmsg` for a single message).
    pub tx_syscalls: AtomicU64,
    /// Of those, `sendmsg` calls that sent a single message (a datagram, or one GSO
    /// group): cheaper than a `sendmmsg` of one.
    pub tx_single_sends: AtomicU64,
    /// Times the socket's send buffer was full (`EAGAIN`/`ENOBUFS`) and sending waited.
    pub tx_backpressure: AtomicU64,
    /// Send WRs posted without a send call of their own: their QP had many packets
    /// unacknowledged, so they left with the next batch (`Poster::post_send`).
    pub posts_joined_batch: AtomicU64,
    /// Times a thread moved the progress thread's wake-up earlier for a timer (it arms
    /// the progress thread's timerfd: no wake-up now, one when the timer is due).
    pub timer_wakeups: AtomicU64,
    /// Times the progress thread woke because another thread signalled it.
    pub progress_wakes: AtomicU64,
    /// Times the progress thread went to sleep (each ends in a wake-up).
    pub progress_sleeps: AtomicU64,
    /// Times an empty CQ poll yielded the CPU (`sched_yield`; see `Cq::poll`).
    pub poll_yields: AtomicU64,
    /// Times a spinning poller that shared its CPU with another busy thread slept briefly to
    /// move to an idle CPU (see `crate::spread`).
    pub poll_cpu_moves: AtomicU64,
    /// Times an empty CQ poll, quiet for long, slept on the socket instead of spinning
    /// (see `Cq::poll` and [`Driver::wait_for_datagram`]).
    pub poll_waits: AtomicU64,
    /// Times an empty CQ poll slept on the socket instead of yielding, its thread's last
    /// yield having given the CPU away for a slice or longer (see `Cq::poll`).
    pub poll_yield_waits: AtomicU64,
    /// Times a spinning poller moved the progress thread's hand-off timer later (see
    /// [`Driver::push_handoff_timer`]).
    pub handoff_pushes: AtomicU64,
    /// Times a poll loop woke the progress thread asleep on the socket to leave it to
    /// the loop (see [`Driver::take_socket_from_progress`]).
    pub socket_taken_from_progress: AtomicU64,
    /// Times a polling thread kept the ACKs of what it received back until its answer
    /// (see `crate::ack_hold`).
    pub acks_held: AtomicU64,
    /// Times held ACKs left behind the requests of the next batch (the answer first).
    pub acks_after_requests: AtomicU64,
    /// Times the progress thread kept the ACK of a lone RDMA WRITE it placed into memory
    /// back for the target's answer (see `crate::ack_hold`).
    pub acks_held_for_memory: AtomicU64,
    /// Times such a hold ended by its time limit, without an answer.
    pub ack_holds_expired: AtomicU64,
    /// Stream socket data writes that found no room (grant, credit, send ring or queue
    /// entry) and waited, or returned `WouldBlock` (`RdmaStream::send_with`, its
    /// `io::Write`; not the tokio stream's).
    pub sock_writes_blocked: AtomicU64,
    /// Receives from the socket by a same-host stream writer about to hold a write back,
    /// looking for the ACK of the write in flight (`sock::stream`'s `ACK_LOOK_BYTES`).
    pub sock_ack_looks: AtomicU64,
    /// Times a blocked stream reader found itself on its same-host bulk writer's CPU and
    /// moved to an idle one (`sock::apart`).
    pub sock_cpu_moves: AtomicU64,
    /// Small same-host stream messages of an exchange sent with their bytes in their
    /// packet rather than placed (`sock::stream`'s `IN_PACKET_MAX`).
    pub sock_small_in_packet: AtomicU64,
    /// Times such a reader looked for an idle CPU to move to (`sock::apart`).
    pub sock_cpu_looks: AtomicU64,
    /// Stream socket buffer grants taken from the target area before their message
    /// arrived (`StreamCore::set_early_grants`).
    pub sock_grants_from_memory: AtomicU64,
    /// Stream socket buffer grants taken when their message arrived (early grants on).
    pub sock_grants_from_message: AtomicU64,
    /// Stream bytes read before their DATA message arrived, learned from the "bytes
    /// placed" word (`StreamCore::set_placed_word`).
    pub sock_bytes_read_ahead: AtomicU64,
    /// Stream DATA messages every byte of which was read before they arrived.
    pub sock_messages_read_ahead: AtomicU64,
    /// Stream DATA messages that arrived with bytes to read (word offered).
    pub sock_messages_announced: AtomicU64,
}

/// A completion channel's queue of CQ events.
pub(crate) type ChannelShared = EventQueue<CqHandle>;

/// A context's queue of asynchronous events.
pub(crate) type AsyncQueue = EventQueue<AsyncEvent>;

/// Everything behind the device lock.
pub(crate) struct State {
    pub engine: Engine,
    /// The batch being built.
    tx: SendBatch,
    /// The first `held` datagrams of `tx` are ACKs a polling thread keeps back (see
    /// `crate::ack_hold`); 0: none, and `tx` is empty between pumps.
    held: usize,
    /// The completion channel of each CQ that has one.
    pub channels: HashMap<CqHandle, Arc<ChannelShared>>,
    /// The context (its event queue) each CQ, QP and SRQ belongs to.
    pub owners: HashMap<Source, Arc<AsyncQueue>>,
    /// When the last datagram reached the engine (see [`Driver::linger`]).
    last_rx: Instant,
    /// Batches moved to the outbox so far (wrapping): a pump that moved none leaves its
    /// finish nothing to send.
    batches_queued: u64,
    /// The connection manager beside the engine (`crate::cm::driver`).
    pub cm: crate::cm::driver::CmState,
}

/// What a pump leaves to do once the device lock is released.
#[derive(Default)]
#[must_use = "pass it to Driver::finish after releasing the lock"]
pub(crate) struct Deferred {
    notifications: Vec<(Arc<ChannelShared>, CqHandle)>,
    events: Vec<(Arc<AsyncQueue>, AsyncEvent)>,
    /// A timer (the driver's clock, ns) earlier than the progress thread's wake-up.
    timer_at: Option<u64>,
    /// The connection manager's share.
    pub(crate) cm: crate::cm::driver::CmDeferred,
    /// Same-host handshakes to send (`crate::samehost`).
    hellos: Vec<crate::samehost::Outgoing>,
    /// QPs whose held WRs may be placed now (`crate::samehost`).
    held_ready: Vec<softverbs_engine::QpHandle>,
    /// The pump moved a batch to the outbox: its finish sends the outbox.
    queued: bool,
}

/// Whether the ACKs the engine produces may stay in the batch being built (see
/// `crate::ack_hold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// They leave with this pump.
    No,
    /// A thread spinning on its CQ received: they wait for its answer.
    UntilAnswer,
    /// The progress thread placed a lone RDMA WRITE into memory: they wait for the
    /// answer of whoever spins on it, until then at the latest.
    Bounded(Instant),
}

/// Why sending stopped with datagrams left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocked {
    /// `EAGAIN`: the socket's send buffer is full; wait for `POLLOUT`.
    Full,
    /// `ENOBUFS`: a queue below the socket is full; retry shortly.
    NoBuffers,
}

/// Batches waiting to be sent, in order, and spare ones.
struct Outbox {
    queue: VecDeque<SendBatch>,
    pool: Vec<SendBatch>,
    blocked: Option<Blocked>,
}

/// What the thread holding the sender role uses.
struct Sender {
    faults: Option<FaultInjector>,
    /// A datagram held back by fault injection (reordering).
    held: Option<(Transmit, Vec<u8>)>,
}

pub(crate) struct Driver {
    state: Mutex<State>,
    pub(crate) socket: UdpSocket,
    /// The connection manager's sockets, event queue and sinks.
    pub(crate) cm_io: crate::cm::driver::CmIo,
    /// The receive buffers; whoever holds them receives. Taken before `state`.
    rx: Mutex<RecvBatch>,
    outbox: Mutex<Outbox>,
    /// The sender role: its holder sends the outbox. Taken with `try_lock` only.
    sender: Mutex<Sender>,
    pcap: Mutex<Option<PcapWriter<BufWriter<File>>>>,
    /// A capture file was asked for (`pcap` started as `Some`): without one, receiving
    /// and sending skip the capture lock (two uncontended locks per message otherwise).
    capturing: bool,
    /// One socket per multicast group a QP of this device is attached to; see
    /// [`Driver::sync_groups`].
    groups: Mutex<Vec<(SocketAddr, Arc<UdpSocket>)>>,
    /// Bumped whenever the set of multicast group sockets changes.
    groups_gen: AtomicU64,
    pub local: SocketAddr,
    /// The address LIDs of the port range resolve against (`crate::addressing`).
    pub base_ip: IpAddr,
    epoch: std::time::Instant,
    wake: EventFd,
    /// Nanoseconds since `epoch` until which the progress thread sleeps.
    sleeping_until: AtomicU64,
    /// Wakes the progress thread for a timer armed after it went to sleep (see
    /// [`Driver::arm_timer`]).
    timer: sys::TimerFd,
    /// When `timer` expires (the driver's clock, ns; `u64::MAX`: disarmed). Its lock is
    /// held over the `timerfd_settime` so that arms leave in order.
    timer_armed: Mutex<u64>,
    /// The engine's and the cm's next timer (nanoseconds since `epoch`; `u64::MAX`: none),
    /// as the last pump left it: pollers fire due timers themselves (see
    /// [`Driver::try_progress`]).
    next_timer: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub counters: DriverCounters,
    busy_poll: Duration,
    /// See [`Driver::poller_handoff`].
    poll_handoff: Duration,
    /// `Config::sock_busy_handoff`: see [`Driver::keep_handoff_busy`].
    busy_handoff: bool,
    /// `Config::poll_wait_after`.
    poll_wait_after: Duration,
    /// `Config::poll_wait_under_window`.
    poll_wait_under_window: Duration,
    /// When (the driver's clock, ns, plus one; 0: never) a receive last brought an RDMA
    /// READ response (see [`Driver::poll_wait_after`]).
    read_response_at: AtomicU64,
    /// `Config::poll_yield_under_window`.
    poll_yield_under_window: bool,
    /// `Config::poll_spread`.
    poll_spread: Duration,
    /// `Config::post_join_above` (see `Poster::post_send`).
    pub(crate) post_join_above: u32,
    /// `Config::poll_long_yield`.
    poll_long_yield: Duration,
    /// How long the progress thread holds the ACK of a lone WRITE into memory (see
    /// `crate::ack_hold`); zero: not at all.
    ack_hold: Duration,
    /// When (nanoseconds since `epoch`, plus one; 0: never) an application thread last
    /// received on the socket from an empty CQ poll ([`Driver::try_progress`]), or later:
    /// a busy stream dates it ahead ([`Driver::keep_handoff_busy`]).
    app_polled_at: AtomicU64,
    /// When (as `app_polled_at`) an application thread last looked at the socket
    /// ([`Driver::try_progress`]); see [`Driver::keep_handoff_busy`].
    app_looked_at: AtomicU64,
    /// When (as `app_polled_at`) a thread in a poll loop ([`PollStreak`]) last polled
    /// empty, and when such a loop last found its completion: while the first is later,
    /// a loop is under way and the hand-off lasts longer ([`Driver::poller_handoff_at`]).
    loop_polled_at: AtomicU64,
    loop_found_at: AtomicU64,
    /// The engine's request packets in flight as the last pump left them
    /// (`Engine::packets_in_flight`), readable without the lock.
    packets_in_flight: AtomicU64,
    /// The progress thread sleeps without watching the socket (a hand-off to pollers).
    socket_unwatched: AtomicBool,
    /// Whether `State::held` is not 0 (read without the lock).
    acks_held: AtomicBool,
    /// The progress thread's hold of the held ACKs and the timer that ends it.
    progress_hold: crate::ack_hold::ProgressHold,
    /// Application threads blocked in `poll` on the socket themselves
    /// ([`Driver::watch_blocked`]): while there are any, the progress thread leaves the
    /// socket to them.
    blocked_watchers: AtomicU32,
    /// Wakes the progress thread when the socket was left unwatched by blocked threads
    /// for `poll_handoff` ([`Driver::blocked_watch_ended`]); whether it is armed.
    handoff_timer: sys::TimerFd,
    handoff_timer_armed: Mutex<bool>,
    /// Wakes the progress thread when a sustained hand-off to spinning pollers ends
    /// ([`Driver::push_handoff_timer`]). Its lock holds when it expires (the driver's
    /// clock, ns; `u64::MAX`: disarmed) and is held over the `timerfd_settime`.
    poller_timer: sys::TimerFd,
    poller_timer_at: Mutex<u64>,
    /// `poller_timer_at`, readable without the lock by every empty poll.
    poller_timer_due: AtomicU64,
    /// A poll loop woke the progress thread to leave it the socket
    /// ([`Driver::take_socket_from_progress`]); cleared when it wakes.
    progress_told: AtomicBool,
    /// The port's active MTU: the configured one, capped to fit the link.
    pub active_mtu: Mtu,
    warned_tx_error: AtomicBool,
    /// When the counters were last published, and what they were.
    published_at: AtomicU64,
    published: Mutex<Option<softverbs_engine::Counters>>,
    /// Writes them to the counter file, off the progress thread (`crate::publisher`).
    publisher: crate::publisher::Publisher,
    /// Bytes registered in memory regions, and the most allowed.
    pub mr_bytes: AtomicU64,
    pub max_mr_bytes: u64,
    /// The engine's configuration (its limits), readable without the lock.
    engine_config: EngineConfig,
    /// The same-host path (`crate::samehost`).
    pub(crate) same_host: crate::samehost::SameHost,
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No UDP endpoint could be bound.
    #[error(transparent)]
    Bind(#[from] crate::addressing::BindError),
    /// Another system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// How many device locks this thread holds (see [`note_syscall`]).
    static HOLDING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// The calling thread's current run of empty CQ polls (see [`PollStreak`]).
    static STREAK: std::cell::Cell<PollStreak> = const {
        std::cell::Cell::new(PollStreak {
            device: 0,
            last_empty: 0,
            looping: false,
            loop_ended: 0,
            back_at: 0,
            leaves: false,
        })
    };
}

/// One thread's run of empty polls of one device's CQs, which tells a thread that spins
/// on its CQ from one that polls once and then does something else.
///
/// Only a poll *loop* (an empty poll soon after the same thread's previous one) hands the
/// socket over to the thread ([`Driver::poller_handoff`]; later empty polls prolong it):
/// a program that polls its CQ
/// once for moderated send completions and then spins on memory for the peer's RDMA
/// WRITE (`softverbs perf write --lat`) cannot receive that WRITE itself, and the
/// progress thread must keep watching the socket for it.
///
/// A thread that *left* for long after its previous loop found its completion (ib_write_lat
/// polls in a loop for its WRITE's completion, then spins on memory for the peer's) ends
/// the hand-off when its next loop finds its completion: it will leave again, and the
/// peer's WRITE would wait for the hand-off to lapse. A ping-pong on the CQ comes back
/// within the loop gap and keeps it. Coming back is the thread's first post on the
/// device after the loop, or else its next empty poll: a ping-pong's poster preempted in
/// its `sendmmsg` (the datagram wakes a thread on the same core) is no thread that
/// leaves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PollStreak {
    /// The device polled ([`Driver::identity`]); 0: none yet.
    device: usize,
    /// When the latest empty poll was (the device's clock, ns); 0: none since the last
    /// completion.
    last_empty: u64,
    /// The current run of empty polls is a loop: two of them came close together since
    /// the last completion. It stays one until that run's completion, whatever the later
    /// gaps: one preemption between its last two polls (on a loaded host) made a whole
    /// loop look like none, and a thread that leaves then never ended the hand-off.
    looping: bool,
    /// When a loop last ended with a completion; 0: not since the last empty poll.
    loop_ended: u64,
    /// When the thread first posted on the device after that (0: not yet).
    back_at: u64,
    /// The thread came back later than the loop gap after its last loop ended.
    leaves: bool,
}

/// What [`Driver::progress_for_poll`] did: whether anything arrived, when it started
/// and when what arrived reached the engine (the driver's clock, ns).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progressed {
    pub got: bool,
    pub now: u64,
    /// The time the receive read after its `recvmmsg`, under the device lock (`None`:
    /// nothing reached the engine); [`Driver::note_found_at`] takes it.
    pub received_at: Option<u64>,
    /// Completions the receive took from the caller's CQ under its own device lock
    /// ([`PollWith`]).
    pub polled: usize,
}

/// A CQ that a poller's receive polls under the lock it hands the datagrams to the engine
/// with, and where the completions go: the completion a receive makes is taken with one
/// device lock instead of two (the receive's, then the poll's).
pub(crate) struct PollWith<'a> {
    pub cq: CqHandle,
    pub out: &'a mut [WorkCompletion],
}

impl PollStreak {
    /// Two empty polls at most this far apart are one loop.
    pub const LOOP_GAP: u64 = 20_000;

    /// The thread's empty poll of `device` ends at `now` (after its `sched_yield`, which
    /// on a loaded host may last longer than [`PollStreak::LOOP_GAP`]): the gap to its
    /// next poll counts from here.
    pub fn poll_ended(&mut self, device: usize, now: u64) {
        if self.device == device {
            self.last_empty = now;
        }
    }

    /// Whether [`PollStreak::found`] on `device` uses its time: only where it ends a loop.
    pub fn found_needs_time(&self, device: usize) -> bool {
        self.device == device && self.looping
    }

    /// Whether [`PollStreak::posted`] on `device` uses its time: only at the thread's first
    /// post after a loop ended.
    pub fn posted_needs_time(&self, device: usize) -> bool {
        self.device == device && self.loop_ended != 0 && self.back_at == 0
    }

    /// Notes an empty poll of `device` at `now`; returns whether it continues a loop (came
    /// within the loop gap of the previous one).
    pub fn empty_poll(&mut self, device: usize, now: u64) -> bool {
        if self.device != device {
            *self = PollStreak {
                device,
                last_empty: now,
                ..PollStreak::default()
            };
            return false;
        }
        if self.loop_ended != 0 {
            let back = if self.back_at != 0 { self.back_at } else { now };
            self.leaves = back.saturating_sub(self.loop_ended) > Self::LOOP_GAP;
            self.loop_ended = 0;
            self.back_at = 0;
        }
        let continues = self.last_empty != 0
            && now >= self.last_empty
            && now - self.last_empty <= Self::LOOP_GAP;
        self.last_empty = now;
        self.looping |= continues;
        continues
    }

    /// The thread posts on `device` at `now`: after a loop that ended, it is back.
    pub fn posted(&mut self, device: usize, now: u64) {
        if self.posted_needs_time(device) {
            self.back_at = now.max(1);
        }
    }

    /// A poll of `device` at `now` found completions; returns whether the thread ended a
    /// loop and is one that leaves afterwards (the hand-off should end now).
    pub fn found(&mut self, device: usize, now: u64) -> bool {
        if self.device != device {
            return false;
        }
        let ended_loop = self.looping;
        self.last_empty = 0;
        self.looping = false;
        self.back_at = 0;
        if ended_loop {
            self.loop_ended = now;
        }
        ended_loop && self.leaves
    }
}

/// System calls made while the calling thread held a device lock (see
/// [`syscalls_under_device_lock`]).
static SYSCALLS_UNDER_LOCK: AtomicU64 = AtomicU64::new(0);

/// Called by every system call wrapper of the driver's data path (`crate::sys`,
/// `crate::events`): counts the call if this thread holds a device lock.
pub(crate) fn note_syscall() {
    if HOLDING.with(|h| h.get()) > 0 {
        SYSCALLS_UNDER_LOCK.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether the calling thread holds a device lock (true when it cannot tell: its
/// thread-locals are being torn down). An exit hook that would take one must not.
pub(crate) fn holds_a_device_lock() -> bool {
    HOLDING.try_with(|h| h.get() > 0).unwrap_or(true)
}

/// How many system calls this process's devices made while holding their device lock: 0
/// is the design (sends, receives and event fds are touched only after the lock is
/// released); tests check it.
pub fn syscalls_under_device_lock() -> u64 {
    SYSCALLS_UNDER_LOCK.load(Ordering::Relaxed)
}

/// The device lock held: the engine and what goes with it.
pub(crate) struct StateGuard<'a>(MutexGuard<'a, State>);

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

impl Driver {
    pub fn open(config: Config) -> Result<Arc<Driver>, OpenError> {
        let socket = crate::addressing::bind(config.addr, config.port)?;
        let io_err = |what| move |source| OpenError::Io { what, source };
        let local = socket.local_addr().map_err(io_err("local_addr"))?;
        sys::set_dont_fragment(&socket, local.is_ipv6()).map_err(io_err("IP_MTU_DISCOVER"))?;
        // ICMP reports of sends (port unreachable for a connection request) reach the cm.
        crate::cm::sys::set_recverr(&socket, local.is_ipv6()).map_err(io_err("IP_RECVERR"))?;
        sys::set_buffers(&socket, config.socket_buffer);
        if let IpAddr::V4(ip) = local.ip() {
            // Multicast sends leave through this device's interface (`lo` for loopback
            // addresses), so they reach the group's members on this host.
            if !ip.is_unspecified() {
                sys::set_multicast_if(&socket, ip).map_err(io_err("IP_MULTICAST_IF"))?;
            }
        }
        socket
            .set_nonblocking(true)
            .map_err(io_err("set_nonblocking"))?;
        let gro = config.gso && sys::enable_gro(&socket);
        // The path MTU must fit the link: RoCE headers (IP, UDP, BTH, up to 28
        // bytes of extension headers, ICRC) come on top of the payload.
        let overhead = if local.is_ipv6() { 40 } else { 20 } + 8 + 12 + 28 + 4;
        let link_mtu = sys::link_mtu(local.ip());
        let active_mtu = match link_mtu {
            Some(link) => [
                Mtu::Mtu4096,
                Mtu::Mtu2048,
                Mtu::Mtu1024,
                Mtu::Mtu512,
                Mtu::Mtu256,
            ]
            .into_iter()
            .find(|m| m.bytes() + overhead <= link)
            .unwrap_or(Mtu::Mtu256)
            .min(config.mtu),
            None => config.mtu,
        };
        let pcap = match &config.pcap {
            Some(path) => {
                let file = File::create(path).map_err(io_err("create SOFTVERBS_PCAP file"))?;
                Some(PcapWriter::new(BufWriter::new(file)).map_err(io_err("write pcap header"))?)
            }
            None => None,
        };
        // Fault injection acts on the datagrams of a batch before it is grouped for GSO,
        // so GSO stays on with faults (the default path is the one tested).
        let gso = config.gso;
        let mut ecfg = EngineConfig::new(local);
        ecfg.icrc = config.icrc;
        ecfg.port_mtu = active_mtu;
        ecfg.selective_repeat = config.selective_repeat;
        // The peer's ACK hold is taken to be ours (the same defaults, and the same
        // environment in every run of both ends here): the progress thread's hold of a
        // lone WRITE's ACK, or a polling thread's until the progress thread wakes.
        ecfg.peer_ack_hold = config.ack_hold.max(config.poll_handoff);
        // READ responses asked for past the in-flight cap must fit the receive
        // buffer: a quarter of what SO_RCVBUF reports (it reports twice the data it
        // holds), half the data, the rest left for other traffic.
        ecfg.read_budget = u32::try_from(sys::receive_buffer(&socket) / 4).unwrap_or(u32::MAX);
        let state = State {
            engine: Engine::new(ecfg.clone()),
            tx: SendBatch::new(MAX_DATAGRAM, gso),
            held: 0,
            batches_queued: 0,
            channels: HashMap::new(),
            owners: HashMap::new(),
            last_rx: Instant::from_nanos(0),
            cm: crate::cm::driver::CmState::new(
                local,
                config.cm_packet_life_time,
                ecfg.max_qp_rd_atom,
            ),
        };
        let rx = RecvBatch::new(if gro { sys::GRO_BUF } else { MAX_DATAGRAM + 64 });
        crate::fork::register_socket(socket.as_raw_fd());
        let driver = Arc::new(Driver {
            state: Mutex::new(state),
            socket,
            cm_io: crate::cm::driver::CmIo::new(&config.cm_drop),
            rx: Mutex::new(rx),
            outbox: Mutex::new(Outbox {
                queue: VecDeque::new(),
                pool: (0..2).map(|_| SendBatch::new(MAX_DATAGRAM, gso)).collect(),
                blocked: None,
            }),
            sender: Mutex::new(Sender {
                faults: config.faults.map(FaultInjector::new),
                held: None,
            }),
            capturing: pcap.is_some(),
            pcap: Mutex::new(pcap),
            groups: Mutex::new(Vec::new()),
            groups_gen: AtomicU64::new(0),
            local,
            base_ip: crate::addressing::base_addr(config.addr),
            epoch: std::time::Instant::now(),
            wake: EventFd::new(true, false).map_err(io_err("eventfd"))?,
            // Awake: it computes its first sleep itself.
            sleeping_until: AtomicU64::new(0),
            next_timer: AtomicU64::new(u64::MAX),
            timer: sys::TimerFd::new().map_err(io_err("timerfd"))?,
            timer_armed: Mutex::new(u64::MAX),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            counters: DriverCounters::default(),
            busy_poll: config.busy_poll,
            poll_handoff: config.poll_handoff,
            busy_handoff: config.sock_busy_handoff,
            poll_wait_after: config.poll_wait_after,
            poll_wait_under_window: config.poll_wait_under_window,
            read_response_at: AtomicU64::new(0),
            poll_yield_under_window: config.poll_yield_under_window,
            poll_spread: config.poll_spread,
            post_join_above: config.post_join_above,
            poll_long_yield: config.poll_long_yield,
            ack_hold: config.ack_hold,
            app_polled_at: AtomicU64::new(0),
            app_looked_at: AtomicU64::new(0),
            loop_polled_at: AtomicU64::new(0),
            loop_found_at: AtomicU64::new(0),
            packets_in_flight: AtomicU64::new(0),
            socket_unwatched: AtomicBool::new(false),
            acks_held: AtomicBool::new(false),
            progress_hold: crate::ack_hold::ProgressHold::new().map_err(io_err("timerfd"))?,
            blocked_watchers: AtomicU32::new(0),
            handoff_timer: sys::TimerFd::new().map_err(io_err("timerfd"))?,
            handoff_timer_armed: Mutex::new(false),
            poller_timer: sys::TimerFd::new().map_err(io_err("timerfd"))?,
            poller_timer_at: Mutex::new(u64::MAX),
            poller_timer_due: AtomicU64::new(u64::MAX),
            progress_told: AtomicBool::new(false),
            active_mtu,
            warned_tx_error: AtomicBool::new(false),
            published_at: AtomicU64::new(0),
            published: Mutex::new(None),
            publisher: crate::publisher::Publisher::start(local)
                .map_err(io_err("spawn counter writer"))?,
            mr_bytes: AtomicU64::new(0),
            max_mr_bytes: config.max_mr_bytes,
            engine_config: ecfg,
            same_host: crate::samehost::SameHost::new(
                config.same_host,
                &format!("{}-{}", local.ip(), local.port()),
                config.drop_first_hellos,
            ),
        });
        let for_thread = Arc::clone(&driver);
        let slice = config.progress_slice;
        // The progress thread takes no signals: a signal sent to the process (an alarm that
        // ends a program's wait) goes to a thread of the application, as it would without
        // softverbs. It inherits the mask it is spawned with.
        let spawned = sys::with_signals_blocked(|| {
            std::thread::Builder::new()
                .name(format!("softverbs-{}", local.port()))
                .spawn(move || {
                    // A shorter slice lets a woken progress thread run sooner on a busy
                    // CPU (docs/loss-recovery.md, session 7).
                    if !slice.is_zero() {
                        sys::set_sched_slice(slice);
                    }
                    progress_thread(for_thread)
                })
        });
        let handle = spawned.map_err(io_err("spawn progress thread"))?;
        *lock(&driver.thread) = Some(handle);
        tracing::debug!(%local, "softverbs device open");
        Ok(driver)
    }

    /// The engine's configuration and limits.
    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine_config
    }

    /// The engine's current time.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Locks the engine (see `DeviceCore::with`).
    pub fn lock(&self) -> StateGuard<'_> {
        let g = lock(&self.state);
        HOLDING.with(|h| h.set(h.get() + 1));
        StateGuard(g)
    }

    /// Builds what the engine has to send into batches and collects its notifications and
    /// events; call with the lock held after any engine call that may have produced work,
    /// and pass the result to [`Driver::finish`] once the lock is released.
    pub fn pump(&self, st: &mut State) -> Deferred {
        self.pump_holding(st, self.now(), Hold::No)
    }

    /// [`Driver::pump`] at `now` (the caller read the clock under the same lock); ACKs
    /// the engine produced may stay in the batch being built as `hold` says (see
    /// `crate::ack_hold`).
    fn pump_holding(&self, st: &mut State, now: Instant, hold: Hold) -> Deferred {
        let mut d = Deferred::default();
        let batches_before = st.batches_queued;
        // The cm's QP moves first (they may make the engine send), then the engine's
        // output, whose COMM_EST events feed the cm again.
        crate::trace::stamp(crate::trace::Step::PumpEntered);
        self.cm_pump(st, now, &mut d);
        self.transmit(st, now, hold);
        crate::trace::stamp(crate::trace::Step::PumpTransmitted);
        // Only engine events reach the cm between its two pumps: without one (every
        // message's pump) the second pump and transmit would find nothing.
        if self.dispatch(st, now, &mut d) {
            self.cm_pump(st, now, &mut d);
            self.transmit(st, now, hold);
        }
        while let Some(qp) = st.engine.poll_placed_change() {
            self.same_host.republish_qp(&st.engine, qp);
        }
        while let Some(qp) = st.engine.poll_entered_rtr() {
            d.hellos.extend(self.same_host.offer_for(&st.engine, qp));
        }
        while let Some(qp) = st.engine.poll_held_ready() {
            d.held_ready.push(qp);
        }
        d.hellos.extend(self.same_host.due_offers(&st.engine, now));
        let next = self.next_deadline(st).map_or(u64::MAX, |t| t.as_nanos());
        self.next_timer.store(next, Ordering::Release);
        self.packets_in_flight
            .store(st.engine.packets_in_flight(), Ordering::Relaxed);
        // A progress thread that left the socket to pollers sleeps no longer than the
        // hand-off, and the pollers fire due timers meanwhile: waking it for an earlier
        // timer would cost a context switch per posted message.
        // Threads blocked on the socket fire none: then it must wake for them.
        let earlier = next < self.sleeping_until.load(Ordering::Acquire)
            && (!self.socket_unwatched.load(Ordering::SeqCst) || self.blocked_watch_active());
        d.timer_at = earlier.then_some(next);
        d.queued = st.batches_queued != batches_before;
        crate::trace::stamp(crate::trace::Step::Pumped);
        d
    }

    /// The earliest timer of the engine, the cm and the same-host handshake.
    fn next_deadline(&self, st: &State) -> Option<Instant> {
        let cm = st
            .cm
            .cm
            .poll_timeout()
            .map(|t| Instant::from_nanos(t.as_nanos()));
        [st.engine.poll_timeout(), cm, self.same_host.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Fires the engine's and the cm's due timers.
    fn fire_timers(st: &mut State, now: Instant) {
        st.engine.handle_timeout(now);
        st.cm.cm.handle_timeout(crate::cm::driver::cm_now(now));
    }

    /// Replaces the fault injection on the datagrams this device sends (the
    /// same-host handshake excepted) from now on.
    pub(crate) fn set_faults(&self, faults: Option<crate::config::FaultConfig>) {
        self.with_sender(|sender| sender.faults = faults.map(FaultInjector::new));
    }

    /// Runs `f` on the sender under the sender role's lock for something other than
    /// sending, then sends the outbox: a thread that finished its pump meanwhile found
    /// the role taken and left its batch (only [`Driver::flush_outbox`] looks at the
    /// queue again). Call without the device lock.
    fn with_sender<R>(&self, f: impl FnOnce(&mut Sender) -> R) -> R {
        let r = f(&mut lock(&self.sender));
        self.flush_outbox(false);
        r
    }

    /// Wakes the progress thread (its socket set or timers changed).
    pub(crate) fn wake_progress(&self) {
        self.wake.signal();
    }

    /// Whether fault injection drops one CM datagram (only losses apply to the CM).
    pub(crate) fn inject_cm_loss(&self) -> bool {
        let dropped = self.with_sender(|sender| {
            sender
                .faults
                .as_mut()
                .is_some_and(|f| f.decide() == Fate::Drop)
        });
        if dropped {
            self.counters.injected_drops.fetch_add(1, Ordering::Relaxed);
        }
        dropped
    }

    /// What a pump left to do: sends the batches, delivers the events, wakes the progress
    /// thread if it must. Call without the device lock.
    ///
    /// A pump that queued no batch (a receive whose ACKs wait for the answer, a timer
    /// check that fired nothing) leaves nothing to send: any batch in the outbox is
    /// another thread's, which sends it, or the sender role's holder's, which looks at
    /// the queue before giving the role up ([`Driver::flush_outbox`]), or waits for the
    /// socket (the progress thread's).
    pub fn finish(&self, d: Deferred) {
        if d.queued {
            self.flush_outbox(false);
        }
        self.progress_hold.disarm_after_send();
        for (channel, cq) in &d.notifications {
            channel.push(*cq);
        }
        for (queue, ev) in d.events {
            queue.push(ev);
        }
        if let Some(at) = d.timer_at {
            self.arm_timer(at);
        }
        self.cm_finish(d.cm);
        if !d.hellos.is_empty() {
            self.same_host.grant_ptrace();
            self.send_hellos(d.hellos);
        }
        // Whichever thread pumped the completion that lets held WRs go places them
        // (`crate::samehost`): the progress thread, or a post or poll.
        if !d.held_ready.is_empty() {
            self.same_host.held_ready(&d.held_ready, self);
        }
        // Last, as they may post: a completion channel's hooks (`EventQueue::set_hook`),
        // after the placement lock if this thread holds it (a pump under a post).
        for hook in d.notifications.iter().filter_map(|(ch, _)| ch.hook()) {
            crate::samehost::run_hook_unless_placing(hook);
        }
    }

    /// Makes the progress thread wake at `at` (the driver's clock, ns), sooner than it
    /// planned to. Signalling its eventfd instead woke it at once, to compute a new
    /// sleep: a context switch per posted message where the target spins on memory,
    /// though the ACK that cancels the timer comes long before it is due. Call without
    /// the device lock.
    fn arm_timer(&self, at: u64) {
        let mut armed = lock(&self.timer_armed);
        if at >= *armed {
            return;
        }
        *armed = at;
        self.counters.timer_wakeups.fetch_add(1, Ordering::Relaxed);
        let now = self.now().as_nanos();
        self.timer
            .set(Some(Duration::from_nanos(at.saturating_sub(now))));
    }

    /// Sends same-host handshake datagrams (without the device lock).
    fn send_hellos(&self, hellos: Vec<crate::samehost::Outgoing>) {
        let mut armed = false;
        for h in hellos {
            if h.offer.is_some() && !crate::samehost::peer_may_be_softverbs(h.to) {
                continue;
            }
            if let Some(qp) = h.offer {
                // Resent if no answer comes (`samehost/retry.rs`).
                self.same_host.offer_sent(qp, self.now());
                armed = true;
            }
            if self.same_host.drop_injected() {
                self.counters.injected_drops.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            note_syscall();
            if let Err(e) = self.socket.send_to(&h.datagram, h.to) {
                tracing::debug!(error = %e, to = %h.to, "cannot send a same-host handshake");
            }
        }
        // The progress thread may sleep past the new timer.
        if armed {
            self.wake_progress();
        }
    }

    /// Runs `f` on the engine under the device lock, then sends what it made.
    pub(crate) fn with_engine(&self, f: &mut dyn FnMut(&mut Engine)) {
        let deferred = {
            let mut st = self.lock();
            f(&mut st.engine);
            self.pump(&mut st)
        };
        self.finish(deferred);
    }

    /// Runs `f` on the engine under the device lock, sending nothing.
    pub(crate) fn read_engine(&self, f: &mut dyn FnMut(&mut Engine)) {
        let mut st = self.lock();
        f(&mut st.engine);
    }

    /// A same-host handshake arrived (without the device lock).
    fn handle_hello(&self, src: SocketAddr, data: &[u8]) {
        let out = self
            .same_host
            .handle_hello(src, data, &|f| self.with_engine(f));
        self.send_hellos(out);
    }

    fn transmit(&self, st: &mut State, now: Instant, hold: Hold) {
        while let Some(t) = st.engine.poll_transmit(now, st.tx.next_buf()) {
            st.tx.commit(t);
            if st.tx.is_full() {
                // Held ACKs leave in the full batch.
                self.enqueue(st);
            }
        }
        if st.tx.is_empty() {
            return;
        }
        let fresh = st.held..st.tx.len();
        if fresh.is_empty() {
            if !on_progress_thread() {
                // Nothing new: the held ACKs wait for the thread's answer.
                return;
            }
            // The progress thread sends what pollers held, and what it held itself once
            // its hold is over.
            let until = self.progress_hold.until();
            if until != 0 {
                if now.as_nanos() < until {
                    return;
                }
                self.counters
                    .ack_holds_expired
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        let only_acks = !fresh.is_empty()
            && fresh
                .clone()
                .all(|i| crate::ack_hold::is_plain_ack(st.tx.datagram(i)));
        match hold {
            Hold::UntilAnswer if only_acks => {
                if st.held == 0 {
                    self.counters.acks_held.fetch_add(1, Ordering::Relaxed);
                }
                st.held = st.tx.len();
                self.acks_held.store(true, Ordering::Release);
                return;
            }
            // One hold at a time: a second WRITE before the answer (a stream, not a
            // ping-pong) sends both ACKs.
            Hold::Bounded(until) if only_acks && st.held == 0 => {
                self.counters
                    .acks_held_for_memory
                    .fetch_add(1, Ordering::Relaxed);
                st.held = st.tx.len();
                self.progress_hold.start(until.as_nanos());
                self.acks_held.store(true, Ordering::Release);
                return;
            }
            _ => {}
        }
        if st.held > 0
            && !fresh.is_empty()
            && fresh
                .clone()
                .all(|i| crate::ack_hold::is_request(st.tx.datagram(i)))
        {
            // The answer first: the peer waits for it, not for the ACKs.
            st.tx.move_to_back(st.held);
            self.counters
                .acks_after_requests
                .fetch_add(1, Ordering::Relaxed);
        }
        self.enqueue(st);
    }

    /// Sends the ACKs the calling thread held back on any device, then what any thread
    /// held on this one: before this thread polls, blocks, or disconnects.
    pub(crate) fn release_all_held_acks(&self) {
        crate::ack_hold::release_thread_held();
        self.release_held_acks();
    }

    /// Sends the ACKs a polling thread held back on this device, if any (see
    /// `crate::ack_hold`; [`Driver::transmit`] holds them). Call without the device lock.
    pub(crate) fn release_held_acks(&self) {
        if !self.acks_held.load(Ordering::Acquire) {
            return;
        }
        {
            let mut st = self.lock();
            if st.held > 0 {
                self.enqueue(&mut st);
            }
        }
        self.flush_outbox(false);
        self.progress_hold.disarm_after_send();
    }

    /// Moves the batch being built to the outbox and starts a fresh one.
    fn enqueue(&self, st: &mut State) {
        crate::trace::stamp(crate::trace::Step::Queued);
        st.held = 0;
        st.batches_queued = st.batches_queued.wrapping_add(1);
        self.acks_held.store(false, Ordering::Release);
        self.progress_hold.end();
        let mut ob = lock(&self.outbox);
        let fresh = ob
            .pool
            .pop()
            .unwrap_or_else(|| SendBatch::new(MAX_DATAGRAM, st.tx.gso()));
        let full = std::mem::replace(&mut st.tx, fresh);
        ob.queue.push_back(full);
    }

    /// Sends the outbox if no other thread is doing so. With the socket blocked, only the
    /// progress thread (`from_progress`, after `POLLOUT`) tries again.
    ///
    /// One outbox lock per batch: the lock that returns a sent batch to the pool takes
    /// the next, and the sender role is given up under the lock that found the queue
    /// empty (or blocked). A thread that queues a batch after that lock finds the role
    /// free when it tries for it (or held by a thread whose own last look comes after
    /// its batch); this thread no longer looks at the queue a third time after giving the
    /// role up (three locks per send were on every message's path).
    fn flush_outbox(&self, from_progress: bool) {
        let Ok(mut sender) = self.sender.try_lock() else {
            return;
        };
        let mut ob = lock(&self.outbox);
        loop {
            if ob.blocked.is_some() && !from_progress {
                break;
            }
            ob.blocked = None;
            let Some(mut batch) = ob.queue.pop_front() else {
                break;
            };
            crate::trace::stamp(crate::trace::Step::BatchTaken);
            drop(ob);
            let result = self.send_batch(&mut sender, &mut batch);
            ob = lock(&self.outbox);
            match result {
                Ok(()) => ob.pool.push(batch),
                Err(blocked) => {
                    ob.queue.push_front(batch);
                    ob.blocked = Some(blocked);
                    drop(sender);
                    drop(ob);
                    self.counters
                        .tx_backpressure
                        .fetch_add(1, Ordering::Relaxed);
                    self.wake.signal();
                    return;
                }
            }
        }
        // Under the outbox lock (see above).
        drop(sender);
        drop(ob);
    }

    /// Sends one batch; `Err` when the socket pushed back and datagrams are left in it.
    /// On its first attempt, fault injection decides each datagram's fate (so faults act
    /// on the GSO segments the batch then forms), the batch seals each datagram for its
    /// place (see [`SendBatch::seal`]), corruption flips a bit of a sealed one, the
    /// capture records the batch, and what fault injection duplicated or held back goes
    /// out after it, alone (IPv4 ID 0).
    fn send_batch(&self, sender: &mut Sender, batch: &mut SendBatch) -> Result<(), Blocked> {
        let mut extra = Vec::new();
        if !batch.started() {
            extra = self.inject_faults(sender, batch);
            self.capture_tx(batch, &extra);
        }
        crate::trace::stamp(crate::trace::Step::SendEntered);
        let flushed = batch.flush(&self.socket);
        crate::trace::stamp(crate::trace::Step::SendReturned);
        for (t, data) in extra {
            note_syscall();
            let _ = self.socket.send_to(&data, t.dst);
        }
        let (sent, errors, calls) = flushed.counts();
        let c = &self.counters;
        // A locked add each: only those that change (errors rarely, single sends in
        // a ping-pong, `sendmmsg` batches in a stream).
        c.tx_datagrams.fetch_add(sent as u64, Ordering::Relaxed);
        c.tx_syscalls.fetch_add(calls as u64, Ordering::Relaxed);
        for (counter, n) in [
            (&c.tx_errors, errors),
            (&c.tx_single_sends, flushed.single_calls()),
        ] {
            if n > 0 {
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        if let Some(e) = flushed.first_error() {
            if !self.warned_tx_error.swap(true, Ordering::Relaxed) {
                let hint = if e.raw_os_error() == Some(libc::EMSGSIZE) {
                    " (is the path MTU larger than the link's?)"
                } else {
                    ""
                };
                tracing::warn!(local = %self.local, error = %e,
                    "the kernel refused to send {errors} datagram(s){hint}");
            }
        }
        match flushed {
            Flushed::Done { .. } => Ok(()),
            Flushed::Blocked { errno, .. } if errno == libc::ENOBUFS => Err(Blocked::NoBuffers),
            Flushed::Blocked { .. } => Err(Blocked::Full),
        }
    }

    /// Decides the fate of each datagram of a batch not sent yet, seals the batch and
    /// corrupts what must be corrupted; returns the sealed datagrams to send after it.
    fn inject_faults(
        &self,
        sender: &mut Sender,
        batch: &mut SendBatch,
    ) -> Vec<(Transmit, Vec<u8>)> {
        let mut extra: Vec<(Transmit, Vec<u8>)> = Vec::new();
        let mut corrupt: Vec<(usize, usize, u8)> = Vec::new();
        if let Some(faults) = sender.faults.as_mut() {
            // Index each kept datagram will have once the dropped ones are gone.
            let mut kept = 0;
            for (t, buf, len, _) in batch.iter_mut() {
                match faults.decide() {
                    Fate::Send => kept += 1,
                    Fate::Drop => {
                        *len = 0;
                        self.counters.injected_drops.fetch_add(1, Ordering::Relaxed);
                    }
                    Fate::Duplicate => {
                        extra.push((t, buf[..*len].to_vec()));
                        kept += 1;
                    }
                    Fate::Corrupt { byte, bit } => {
                        corrupt.push((kept, byte, bit));
                        kept += 1;
                    }
                    Fate::Reorder => {
                        if let Some(prev) = sender.held.replace((t, buf[..*len].to_vec())) {
                            extra.push(prev);
                        }
                        *len = 0;
                    }
                }
            }
            // Held datagrams go out after this batch.
            if let Some(h) = sender.held.take() {
                extra.push(h);
            }
        }
        batch.seal();
        if !corrupt.is_empty() {
            let mut datagrams: Vec<(&mut Vec<u8>, usize)> = batch
                .iter_mut()
                .map(|(_, buf, len, _)| (buf, *len))
                .collect();
            for (i, byte, bit) in corrupt {
                if let Some((buf, len)) = datagrams.get_mut(i) {
                    buf[byte % (*len).max(1)] ^= 1 << bit;
                }
            }
        }
        for (t, data) in &mut extra {
            t.seal(data, 0);
        }
        extra
    }

    /// Records a sealed batch and the datagrams sent after it in the capture file.
    fn capture_tx(&self, batch: &mut SendBatch, extra: &[(Transmit, Vec<u8>)]) {
        if !self.capturing {
            return;
        }
        let mut pcap = lock(&self.pcap);
        if pcap.is_none() {
            return;
        }
        for (t, buf, len, id) in batch.iter_mut() {
            write_capture(&mut pcap, t.src, t.dst, id, &buf[..*len]);
        }
        for (t, data) in extra {
            write_capture(&mut pcap, t.src, t.dst, 0, data);
        }
    }

    /// Flushes the capture file.
    pub fn flush_capture(&self) {
        if let Some(w) = lock(&self.pcap).as_mut() {
            let _ = w.flush();
        }
    }

    /// Collects CQ notifications for completion channels and async events for their
    /// contexts; returns whether there was an event (the cm was told of it).
    fn dispatch(&self, st: &mut State, now: Instant, d: &mut Deferred) -> bool {
        let mut any_event = false;
        while let Some(cq) = st.engine.poll_cq_notification() {
            if let Some(ch) = st.channels.get(&cq) {
                d.notifications.push((Arc::clone(ch), cq));
            }
        }
        while let Some(ev) = st.engine.poll_event() {
            use crate::events::Sourced;
            any_event = true;
            self.cm_engine_event(st, &ev, now);
            // Events of objects no context owns any more are dropped.
            if let Some(q) = ev.source().and_then(|s| st.owners.get(&s)) {
                d.events.push((Arc::clone(q), ev));
            }
        }
        any_event
    }

    /// Makes the device's multicast sockets match `wanted`, the groups the engine's QPs are
    /// attached to: joins new groups (one socket per group, see [`sys::multicast_socket`];
    /// the progress thread reads them and hands what arrives to
    /// [`Engine::handle_multicast_datagram`]) and leaves groups no QP is attached to any more.
    /// Only IPv4 groups can be joined. Call without the device lock.
    pub fn sync_groups(&self, wanted: &[SocketAddr]) -> io::Result<()> {
        let mut groups = lock(&self.groups);
        let before = groups.len();
        groups.retain(|(g, s)| {
            let keep = wanted.contains(g);
            if !keep {
                crate::fork::unregister_socket(s.as_raw_fd());
            }
            keep
        });
        let mut changed = groups.len() != before;
        let mut result = Ok(());
        for &group in wanted {
            if groups.iter().any(|(g, _)| *g == group) {
                continue;
            }
            let iface = match self.local.ip() {
                IpAddr::V4(ip) => ip,
                IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
            };
            let joined = match group {
                SocketAddr::V4(g) => sys::multicast_socket(g, iface),
                SocketAddr::V6(_) => Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "IPv6 multicast groups are not supported",
                )),
            };
            match joined {
                Ok(sock) => {
                    crate::fork::register_socket(sock.as_raw_fd());
                    groups.push((group, Arc::new(sock)));
                    changed = true;
                }
                Err(e) => result = Err(e),
            }
        }
        if changed {
            self.groups_gen.fetch_add(1, Ordering::AcqRel);
            self.wake.signal();
        }
        result
    }

    /// Receives everything that waits on the device socket now (a few batches at most),
    /// unless another thread keeps the receive buffers for long: it reads the socket then.
    pub(crate) fn receive_pending(&self) {
        for _ in 0..64 {
            let mut rx = match self.rx.try_lock() {
                Ok(rx) => rx,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::yield_now();
                    continue;
                }
            };
            for _ in 0..8 {
                if self.receive(&mut rx, false) == 0 {
                    break;
                }
            }
            return;
        }
    }

    /// Receives what waits on the socket (one batch) and hands it to the engine;
    /// returns how many reads there were. With `hold_acks` the ACKs the engine answers
    /// with wait for the calling thread's answer; on the progress thread, the ACK of a
    /// lone RDMA WRITE waits a while for the answer of a thread spinning on the memory
    /// it wrote (see `crate::ack_hold`).
    fn receive(&self, rx: &mut RecvBatch, hold_acks: bool) -> usize {
        self.receive_timed(rx, hold_acks, None).0
    }

    /// [`Driver::receive`], also returning the time it handed what arrived to the engine
    /// (the driver's clock, ns; `None`: nothing did) and how many completions it took
    /// from `poll`'s CQ, under the same lock, once the engine had handled the datagrams.
    fn receive_timed(
        &self,
        rx: &mut RecvBatch,
        hold_acks: bool,
        poll: Option<PollWith<'_>>,
    ) -> (usize, Option<u64>, usize) {
        crate::trace::stamp(crate::trace::Step::RecvEntered);
        // A spinning poller with at most one message in flight (a ping-pong's, whose
        // ACKs it holds) reads once where its last read found at most one
        // (`RecvBatch::recv_adaptive`): the message's read then costs no empty second
        // receive inside `recvmmsg`, 0.2-0.5 µs of a one-way trip. Everyone else (the
        // progress thread, a bandwidth window's pollers) reads batches as before.
        let single_reads =
            hold_acks && self.packets_in_flight.load(Ordering::Relaxed) <= Self::LOOP_FEW_IN_FLIGHT;
        let read = if single_reads {
            rx.recv_adaptive(&self.socket)
        } else {
            rx.recv(&self.socket)
        };
        let got = match read {
            Ok(n) => {
                if n > 0 && rx.was_single_read() {
                    self.counters
                        .rx_single_reads
                        .fetch_add(1, Ordering::Relaxed);
                }
                n
            }
            // An ICMP report of a send (IP_RECVERR): the cm reads the error queue.
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                self.cm_device_errors();
                return (1, None, 0);
            }
            Err(e) => {
                tracing::warn!(error = %e, "recvmmsg failed");
                0
            }
        };
        if got == 0 {
            return (0, None, 0);
        }
        crate::trace::stamp(crate::trace::Step::Received);
        self.counters
            .rx_datagrams
            .fetch_add(got as u64, Ordering::Relaxed);
        // Counted before the engine sees them (and answers: a peer may look at once).
        if on_progress_thread() {
            self.counters
                .rx_by_progress
                .fetch_add(got as u64, Ordering::Relaxed);
        }
        if self.capturing {
            let mut pcap = lock(&self.pcap);
            if pcap.is_some() {
                self.for_each_datagram(rx, got, |src, k, data| {
                    write_capture(&mut pcap, src, self.local, k, data);
                });
            }
        }
        let mut hellos: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let progress = on_progress_thread();
        // Requests handed over, and of those RDMA WRITEs into memory (the progress
        // thread holds the ACK of a lone one; those of ACKs that came with it are none).
        let (mut requests, mut writes) = (0usize, 0usize);
        // Only where `Config::poll_wait_under_window` asks (see `Driver::poll_wait_after`).
        let watch_reads = !self.poll_wait_under_window.is_zero();
        let mut read_responses = false;
        let received_at;
        let deferred = {
            let mut st = self.lock();
            let now = self.now();
            received_at = Some(now.as_nanos());
            crate::trace::stamp(crate::trace::Step::Locked);
            st.last_rx = now;
            let state = &mut *st;
            self.for_each_datagram(rx, got, |src, k, data| {
                read_responses |= watch_reads && crate::ack_hold::is_read_response(data);
                if progress && !hold_acks && crate::ack_hold::is_request(data) {
                    requests += 1;
                    writes += usize::from(crate::ack_hold::is_write_into_memory(data));
                }
                if crate::samehost::hello::is_hello(data) {
                    hellos.push((src, data.to_vec()));
                } else if crate::cm::driver::is_qp1(data) {
                    let t = crate::cm::driver::cm_now(now);
                    state.cm.cm.handle_datagram(t, src, self.local, data);
                } else {
                    state.engine.handle_datagram_with_ipv4_id(now, src, data, k);
                    crate::trace::stamp(crate::trace::Step::DatagramHandled);
                }
            });
            if read_responses {
                self.read_response_at
                    .store(now.as_nanos() + 1, Ordering::Relaxed);
            }
            st.engine.handle_timeout(now);
            crate::trace::stamp(crate::trace::Step::Handled);
            let hold = if hold_acks {
                Hold::UntilAnswer
            } else if requests == 1 && writes == 1 && !self.ack_hold.is_zero() {
                Hold::Bounded(now + self.ack_hold)
            } else {
                Hold::No
            };
            // The time read above: handling a batch takes microseconds, and each clock
            // read on a message's path costs 25-45 ns here (docs/udp-latency.md).
            let deferred = self.pump_holding(&mut st, now, hold);
            let polled = poll.map_or(0, |p| st.engine.poll_cq(p.cq, p.out).unwrap_or(0));
            (deferred, polled)
        };
        let (deferred, polled) = deferred;
        crate::trace::stamp(crate::trace::Step::Unlocked);
        self.finish(deferred);
        crate::trace::stamp(crate::trace::Step::ReceiveDone);
        for (src, data) in hellos {
            self.handle_hello(src, &data);
        }
        (got, received_at, polled)
    }

    /// Calls `f(source, index in its GRO read, datagram)` for every datagram of the first
    /// `got` reads of `rx`, counting (and skipping) truncated reads.
    fn for_each_datagram(
        &self,
        rx: &RecvBatch,
        got: usize,
        mut f: impl FnMut(SocketAddr, u16, &[u8]),
    ) {
        for i in 0..got {
            if rx.truncated(i) {
                self.counters.rx_truncated.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some((src, datagrams)) = rx.datagrams(i) else {
                continue;
            };
            for (k, data) in datagrams {
                f(src, k, data);
            }
        }
    }

    /// Receives on the calling thread unless another thread is receiving; returns
    /// whether anything arrived. Called by pollers that found their CQ empty. Must
    /// not be called with the engine lock held.
    /// `spinning`: the caller keeps polling while it finds nothing (the progress thread
    /// may leave the socket to it, see [`PollStreak`]).
    /// Also fires the timers that are due: while the progress thread leaves the socket
    /// to pollers it does not wake for them.
    ///
    /// A spinning thread under the hand-off keeps the ACKs of what it receives back
    /// until its answer (`crate::ack_hold`); an empty poll first sends what this thread
    /// held on any device and what any thread held on this one.
    ///
    /// Returns whether anything arrived.
    pub(crate) fn try_progress(self: &Arc<Self>, spinning: bool) -> bool {
        self.progress_for_poll(spinning, None).got
    }

    /// [`Driver::try_progress`], also returning the time it read at its start (the
    /// driver's clock, ns), which a poll that found nothing passes on to
    /// [`Driver::note_poll_ended_at`]: every decision of an empty poll uses that one
    /// clock read. An empty poll read the clock five times, about 150 ns of its user time
    /// (`vdso` `clock_gettime` was a fifth of a ping-pong's user cycles); what a
    /// `recvmmsg` in between moves the time on is far below [`PollStreak::LOOP_GAP`] and
    /// the timers' granularity.
    ///
    /// With `poll`, a receive polls that CQ under its own device lock
    /// ([`Progressed::polled`]).
    pub(crate) fn progress_for_poll(
        self: &Arc<Self>,
        spinning: bool,
        poll: Option<PollWith<'_>>,
    ) -> Progressed {
        self.release_all_held_acks();
        let now = self.now().as_nanos();
        self.app_looked_at.store(now + 1, Ordering::Release);
        let (in_loop, looping, leaves) = STREAK.with(|s| {
            let mut streak = s.get();
            let v = streak.empty_poll(self.identity(), now);
            s.set(streak);
            (v, streak.looping, streak.leaves)
        });
        // A loop starts the hand-off; any empty poll of a spinning thread prolongs it.
        if spinning && (in_loop || self.poller_handoff_at(now).is_some()) {
            self.app_polled_at.fetch_max(now + 1, Ordering::SeqCst);
            if looping && self.packets_in_flight.load(Ordering::Relaxed) <= Self::LOOP_FEW_IN_FLIGHT
            {
                self.loop_polled_at.fetch_max(now + 1, Ordering::SeqCst);
            }
            self.push_handoff_timer(now);
            if in_loop && !leaves {
                self.take_socket_from_progress();
            }
        }
        // The progress thread wakes by the end of the hand-off at the latest and sends
        // what is held then: that bounds the hold.
        let hold = spinning && self.poller_handoff_at(now).is_some();
        let (got, received_at, polled) = match self.rx.try_lock() {
            Ok(mut rx) => {
                let (reads, at, polled) = self.receive_timed(&mut rx, hold, poll);
                (reads > 0, at, polled)
            }
            Err(_) => (false, None, 0),
        };
        if hold && self.acks_held.load(Ordering::Acquire) {
            crate::ack_hold::note_held(self);
        }
        // (Receiving fired them already.) A timer that fell due during the `recvmmsg`
        // fires at the next poll.
        if !got && now >= self.next_timer.load(Ordering::Acquire) {
            let deferred = {
                let mut st = self.lock();
                let now = self.now();
                Driver::fire_timers(&mut st, now);
                self.pump_holding(&mut st, now, Hold::No)
            };
            self.finish(deferred);
        }
        Progressed {
            got,
            now,
            received_at,
            polled,
        }
    }

    /// How many times `poll_handoff` a busy stream keeps the socket handed over
    /// ([`Driver::keep_handoff_busy`]), and at most how much longer than `poll_handoff`
    /// (ns): a long `poll_handoff` (tests set 100 ms) is not stretched further.
    const BUSY_HANDOFF: u64 = 10;
    const BUSY_HANDOFF_EXTRA_MAX: u64 = 450_000;

    /// A same-host stream moving data (a read that took bytes, a write that placed some:
    /// `crate::sock`) keeps the socket handed over to application threads
    /// ([`Driver::poller_handoff`]) for [`Driver::BUSY_HANDOFF`] times `poll_handoff`
    /// (500 µs by default).
    /// In a bulk transfer each side's progress thread otherwise sleeps on the socket and
    /// is woken for every datagram (the peer's header-only WRITE WITH IMM at the reader,
    /// each ACK at the writer), a context switch that on a host with few cores preempts
    /// the stream's own threads, and whose wake-up the peer's sending thread pays for in
    /// its `sendmmsg`. Under the hand-off the datagrams wait in the socket and the
    /// stream's thread receives them in batches (one ACK for each: IBA 9.7.5.1.6). It
    /// looks at the socket itself (receiving, firing due timers) whenever no application
    /// thread did for `poll_handoff`, so the peer's completions, other QPs' traffic and
    /// the timers wait no longer than that while the stream is in use; a stream that
    /// stops calling lets the hand-off lapse, then the progress thread watches again.
    /// Without `look` it only extends the hand-off: a caller that looked when it was due
    /// at its start ([`Driver::busy_look_due`]) does not look again at its end.
    pub(crate) fn keep_handoff_busy(self: &Arc<Self>, look: bool) {
        if self.poll_handoff.is_zero() || !self.busy_handoff {
            return;
        }
        let now = self.now().as_nanos();
        let handoff = self.poll_handoff.as_nanos() as u64;
        // The hand-off lasts `poll_handoff` from the date in `app_polled_at`: dated
        // ahead, it lasts longer. (Pollers and blocked watchers only ever move that date
        // later; arming a CQ still ends the hand-off at once.)
        let ahead = handoff
            .saturating_mul(Self::BUSY_HANDOFF - 1)
            .min(Self::BUSY_HANDOFF_EXTRA_MAX);
        self.app_polled_at
            .fetch_max(now.saturating_add(ahead) + 1, Ordering::SeqCst);
        if look && self.busy_look_due_at(now) {
            // Not as a spinner: what it receives is acknowledged at once (this thread's
            // answer, if any, is not coming now).
            self.try_progress(false);
        }
    }

    /// Whether [`Driver::keep_handoff_busy`] would receive now: no application thread
    /// looked at the socket for `poll_handoff`. A same-host writer about to hold a write
    /// receives at its start when it is, and not at its end (`crate::sock`): the ACK then
    /// found completes the write in flight before the hold is decided, and the write
    /// carries the announcement, where after it a separate one would follow.
    pub(crate) fn busy_look_due(&self) -> bool {
        !self.poll_handoff.is_zero()
            && self.busy_handoff
            && self.busy_look_due_at(self.now().as_nanos())
    }

    fn busy_look_due_at(&self, now: u64) -> bool {
        let looked = self.app_looked_at.load(Ordering::Acquire);
        looked == 0 || now.saturating_sub(looked - 1) >= self.poll_handoff.as_nanos() as u64
    }

    /// A poll by the calling thread found completions: its run of empty polls is over
    /// (datagrams that arrive without completing anything for it do not end the run).
    /// Ends the hand-off if the thread leaves after its loops ([`PollStreak`]) and
    /// `ends_handoff` (a verbs poller, `Cq::poll`). A stream call's poll does not
    /// (`crate::sock`): the call goes on to a blocking wait that watches the socket
    /// itself, or returns to a program that calls again at once (a ping-pong, or a spin
    /// on `WouldBlock`). Ending the hand-off there woke the progress thread once per
    /// message only for it to leave the socket again (`tests/sock.rs`,
    /// `a_blocking_ping_pong_leaves_the_progress_thread_asleep`), or, when a slow round
    /// counted as leaving, sent every ACK alone. The hand-off such a call leaves lapses on
    /// its own, `poll_handoff` after its last empty poll or blocked watch.
    pub(crate) fn note_found(&self, ends_handoff: bool) {
        self.note_found_at(ends_handoff, None);
    }

    /// [`Driver::note_found`] where the poll received what it found at `received_at`
    /// (the driver's clock, ns: [`Progressed::received_at`]), which then dates the end of
    /// the loop: that is at most the engine's handling of one batch earlier (a few µs at
    /// most against the 20 µs [`PollStreak::LOOP_GAP`] the next post is judged by), and
    /// saves a clock read on the path from a message's receive to its answer. The clock
    /// is read only where a loop ends (the only case that uses the time).
    pub(crate) fn note_found_at(&self, ends_handoff: bool, received_at: Option<u64>) {
        let leaving = STREAK.with(|s| {
            let mut streak = s.get();
            let id = self.identity();
            let now = if streak.found_needs_time(id) {
                received_at.unwrap_or_else(|| self.now().as_nanos())
            } else {
                0
            };
            if streak.found_needs_time(id) {
                // This thread's loop is over: the hand-off is no longer stretched for it.
                self.loop_found_at.fetch_max(now + 1, Ordering::SeqCst);
            }
            let leaving = streak.found(id, now);
            s.set(streak);
            leaving
        });
        if leaving && ends_handoff {
            self.end_poller_handoff();
        }
    }

    /// The calling thread posts work on this device: see [`PollStreak::posted`].
    /// Reads the clock only for the first post after a loop ended (the only one whose
    /// time the streak keeps): a ping-pong's answerer posts a receive WR and then its
    /// answer, and the second read was on the path to the answer's send.
    pub(crate) fn note_post(&self) {
        STREAK.with(|s| {
            let mut streak = s.get();
            let id = self.identity();
            if streak.posted_needs_time(id) {
                streak.posted(id, self.now().as_nanos());
                s.set(streak);
            }
        });
    }

    /// How long a polling thread's socket must have been quiet before its empty polls
    /// sleep (`Config::poll_wait_after`; where that is zero, while a WRITE or SEND window
    /// is in flight, `Config::poll_wait_under_window`; `None`: never). `now` is the
    /// driver's clock (ns).
    pub(crate) fn poll_wait_after(&self, now: u64) -> Option<Duration> {
        if !self.poll_wait_after.is_zero() {
            return Some(self.poll_wait_after);
        }
        if self.poll_wait_under_window.is_zero()
            || self.packets_in_flight.load(Ordering::Relaxed) <= Self::LOOP_FEW_IN_FLIGHT
        {
            return None;
        }
        let reading = self
            .read_response_at
            .load(Ordering::Relaxed)
            .saturating_add(Self::READ_RESPONSES_RECENT.as_nanos() as u64)
            > now;
        (!reading).then_some(self.poll_wait_under_window)
    }

    /// How long after an RDMA READ response the device counts as reading: its pollers do
    /// not sleep under a window (`Config::poll_wait_under_window`). Far above the gaps
    /// of a READ stream, even on a loaded host (2 ms was not: beside two busy loops a
    /// READ stream's loop slept in every transfer, its progress threads off the CPUs for
    /// milliseconds), still short beside a phase of an application that turns from
    /// READs to WRITEs.
    const READ_RESPONSES_RECENT: Duration = Duration::from_millis(50);

    /// Sleeps until a datagram waits on the device socket (watched only where the
    /// progress thread left it to pollers), `max` passes or the engine's next timer
    /// (which pollers fire, see [`Driver::try_progress`]) is due, whichever comes first;
    /// `now` is the driver's clock (ns). For a poller whose
    /// socket has been quiet for long: a bandwidth sender between ACKs spun through
    /// some 9 empty polls per 64 KiB message, each a `recvmmsg` or a `sched_yield`; and
    /// instead of the yield of a poller on a busy CPU. Returns whether it slept.
    pub(crate) fn wait_for_datagram(&self, max: Duration, now: u64) -> bool {
        let until_timer = self.next_timer.load(Ordering::Acquire).saturating_sub(now);
        // Within the hand-off the progress thread sleeps to (a poll loop pushes it later,
        // `Driver::push_handoff_timer`): past it the progress thread would wake and
        // watch the socket, and the loop wake it once more to leave it.
        let until_handoff_ends = self
            .poller_timer_due
            .load(Ordering::Acquire)
            .saturating_sub(now);
        let timeout = max
            .min(Duration::from_nanos(until_timer))
            .min(Duration::from_nanos(until_handoff_ends));
        if timeout.is_zero() {
            return false;
        }
        let mut pfd = [libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // Where the progress thread watches the socket, a plain sleep: on the socket both
        // woke for the next datagram and the loop woke the progress thread once more to
        // leave the socket (64 KiB READ, whose responses the progress thread mostly
        // receives: 12 times its wake-ups, 3 times the retransmissions, 0.52-0.75 GB/s
        // against 1.21-1.36).
        let on_socket = usize::from(self.socket_unwatched.load(Ordering::SeqCst));
        let _ = sys::poll(&mut pfd[..on_socket], Some(timeout));
        true
    }

    /// The calling thread's empty poll (of this device's CQs) ends: see
    /// [`PollStreak::poll_ended`].
    pub(crate) fn note_poll_ended(&self) {
        self.note_poll_ended_at(self.now().as_nanos());
    }

    /// [`Driver::note_poll_ended`] at `now` (the driver's clock, ns), read by the caller
    /// after anything that may have taken long (a `sched_yield`, a receive).
    pub(crate) fn note_poll_ended_at(&self, now: u64) {
        STREAK.with(|s| {
            let mut streak = s.get();
            streak.poll_ended(self.identity(), now);
            s.set(streak);
        });
    }

    /// Whether an empty poll yields the CPU at every one
    /// (`Config::poll_yield_under_window`, `Cq::poll`): asked for, and the device has a
    /// bandwidth window in flight, more request packets than one 64 KiB message
    /// ([`Driver::LOOP_FEW_IN_FLIGHT`]; a READ counts its response packets), which no
    /// ping-pong has.
    pub(crate) fn yields_under_window(&self) -> bool {
        self.poll_yield_under_window
            && self.packets_in_flight.load(Ordering::Relaxed) > Self::LOOP_FEW_IN_FLIGHT
    }

    /// How long a spinning poller that shares its CPU sleeps to move (`Config::poll_spread`).
    pub(crate) fn poll_spread(&self) -> Duration {
        self.poll_spread
    }

    /// How long a yield of a spinning poller's empty poll must keep it off its CPU to
    /// make its next yields sleeps (`Config::poll_long_yield`; zero: never).
    pub(crate) fn poll_long_yield(&self) -> Duration {
        self.poll_long_yield
    }

    /// Tells this device apart from others in a thread's [`PollStreak`].
    pub(crate) fn identity(&self) -> usize {
        self as *const Driver as usize
    }

    /// Ends the hand-off to pollers at once: a thread that arms a CQ is about to block on
    /// its completion channel instead of polling, so the progress thread must watch the
    /// socket again (it is woken if it sleeps without doing so). Call without the lock.
    pub fn end_poller_handoff(&self) {
        // A loop under way keeps it no longer either.
        self.loop_found_at
            .fetch_max(self.loop_polled_at.load(Ordering::SeqCst), Ordering::SeqCst);
        // SeqCst here and in the progress thread (flag up, then hand-off read): at least
        // one of the two sees the other's write.
        if self.app_polled_at.swap(0, Ordering::SeqCst) != 0
            && self.socket_unwatched.load(Ordering::SeqCst)
        {
            self.wake.signal();
        }
    }

    /// How much longer the progress thread leaves the socket to application threads, if
    /// one of them polled a CQ less than `poll_handoff` ago.
    ///
    /// A thread spinning on its CQ receives what arrives itself ([`Driver::try_progress`]).
    /// Were the progress thread to sleep on the socket too, every datagram would wake it:
    /// a context switch per message, which on a host whose cores are all taken by
    /// spinning pollers (both ends of a ping-pong on two cores) preempts a poller and
    /// costs more than the rest of the message's path. So while a poller is active the
    /// progress thread does not wait for the socket; it looks again once no poll has come
    /// for `poll_handoff`, which bounds what an application that stops polling (to spin on
    /// memory for a peer's RDMA WRITE, or to block on its completion channel) waits for
    /// the datagram that arrived meanwhile.
    fn poller_handoff(&self) -> Option<Duration> {
        if self.poll_handoff.is_zero() {
            return None;
        }
        self.poller_handoff_at(self.now().as_nanos())
    }

    /// [`Driver::poller_handoff`] at `now` (the driver's clock, ns).
    ///
    /// While a poll loop is under way (a thread whose empty polls made a loop has not
    /// found its completion yet, with few packets in flight: [`Driver::LOOP_FEW_IN_FLIGHT`])
    /// the hand-off lasts [`Driver::LOOP_HANDOFF`] times
    /// `poll_handoff` after that loop's last empty poll (500 µs by default): the loop
    /// polls again once it has a CPU. Two spinning ends of a ping-pong that share one
    /// CPU (on an idle 2-core host the scheduler left them there in some runs) take turns
    /// through their yields, each off the CPU for 40 µs on average and often longer than
    /// `poll_handoff`: the progress threads then took the socket, were woken by datagrams
    /// the loops would have taken, sent their ACKs at once, and by running on the other
    /// CPU kept the scheduler from moving a poller there. Pinned to one CPU, `perf send
    /// --lat` took 72-114 µs one way, 15-19 µs with the longer hand-off
    /// (docs/udp-latency.md, session 11). A loop that
    /// found its completion keeps the plain hand-off: that thread may leave (to spin on
    /// memory, or to block) and what arrives then waits for the progress thread.
    fn poller_handoff_at(&self, now: u64) -> Option<Duration> {
        if self.poll_handoff.is_zero() {
            return None;
        }
        let at = self.app_polled_at.load(Ordering::SeqCst);
        if at == 0 {
            return None;
        }
        let handoff = self.poll_handoff.as_nanos() as u64;
        let mut until = (at - 1).saturating_add(handoff);
        let looped = self.loop_polled_at.load(Ordering::SeqCst);
        if looped > self.loop_found_at.load(Ordering::SeqCst) {
            let longer = handoff.saturating_add(
                handoff
                    .saturating_mul(Self::LOOP_HANDOFF - 1)
                    .min(Self::LOOP_HANDOFF_EXTRA_MAX),
            );
            until = until.max((looped - 1).saturating_add(longer));
        }
        (until > now).then(|| Duration::from_nanos(until - now))
    }

    /// How many times `poll_handoff` the hand-off lasts after the last empty poll of a
    /// loop under way ([`Driver::poller_handoff_at`]), and at most how much longer than
    /// `poll_handoff` (ns): a long `poll_handoff` (tests set 100 ms) is stretched little.
    const LOOP_HANDOFF: u64 = 10;
    const LOOP_HANDOFF_EXTRA_MAX: u64 = 450_000;
    /// Only the empty polls of a loop whose device has at most this many request packets
    /// in flight (one 64 KiB message at a 4096-byte MTU) make the hand-off longer. A
    /// ping-pong has one message in flight; a bandwidth sender has a window of them, and
    /// while it is off its CPU its progress thread takes the ACKs in and sends the WRs
    /// queued behind them. With every loop's polls extending, the progress thread's share
    /// of a 64 KiB WRITE sender's datagrams fell from 0.57-0.74 to 0.02-0.23, and its
    /// bandwidth was lower in 7 of 10 interleaved pairs (`bench/bw-ab.sh`, load 5-6.7:
    /// median 1.34 → 1.17 GB/s); with this limit 1.67 → 1.54 GB/s in 6 pairs (load
    /// 5.7-6.3), within the runs' swing.
    const LOOP_FEW_IN_FLIGHT: u64 = 16;

    /// A spinning poller's empty poll at `now` prolonged the hand-off: while the progress
    /// thread sleeps on its hand-off timer ([`Driver::sleep_on_handoff_timer`]) the poller
    /// moves that timer to the new end of the hand-off once less than a quarter of the
    /// hand-off is left.
    ///
    /// Without it the progress thread woke at the end of every hand-off period only to
    /// find the pollers still polling: with both ends of a ping-pong spinning, about one
    /// wake-up per round trip, each a context switch on a core a poller needs. A
    /// `timerfd_settime` in an empty poll every three quarters of a hand-off costs less.
    /// The bound stays: when the loop stops, the timer expires at most a hand-off after
    /// its last push, so at most a hand-off after its last poll; the progress thread then
    /// sleeps out what is left of the hand-off, if anything, and takes the socket and
    /// the timers back (the loop fired the timers until it stopped).
    fn push_handoff_timer(&self, now: u64) {
        let due = self.poller_timer_due.load(Ordering::Acquire);
        let handoff = self.poll_handoff.as_nanos() as u64;
        if due == u64::MAX || due.saturating_sub(now) >= handoff / 4 {
            return;
        }
        // The progress thread (arming or disarming it) or another poller has it: they
        // leave it where it must be.
        let Ok(mut at) = self.poller_timer_at.try_lock() else {
            return;
        };
        if *at == u64::MAX || at.saturating_sub(now) >= handoff / 4 {
            return;
        }
        *at = now.saturating_add(handoff);
        self.poller_timer_due.store(*at, Ordering::Release);
        self.poller_timer.set(Some(self.poll_handoff));
        self.counters.handoff_pushes.fetch_add(1, Ordering::Relaxed);
    }

    /// A poll loop goes on while the progress thread sleeps on the socket (it chose to
    /// before the loop started the hand-off): wakes it once, so that it leaves the socket
    /// to the loop. Asleep on the socket it was woken by every datagram, though the loop
    /// takes them (a context switch each; its poll often went back to sleep without
    /// returning, so nothing ended that state), and every post armed its timerfd for the
    /// retransmission timer the loop fires anyway. Not for a thread that leaves after its
    /// loops ([`PollStreak`]): its next completion ends the hand-off again.
    fn take_socket_from_progress(&self) {
        // With hand-offs off (`poll_handoff` 0) the socket stays the progress thread's.
        if !self.poll_handoff.is_zero()
            && self.sleeping_until.load(Ordering::Acquire) != 0
            && !self.socket_unwatched.load(Ordering::SeqCst)
            && !self.progress_told.swap(true, Ordering::AcqRel)
        {
            self.counters
                .socket_taken_from_progress
                .fetch_add(1, Ordering::Relaxed);
            self.wake.signal();
        }
    }

    /// The progress thread sleeps through a hand-off to pollers that lasted a whole
    /// period already: its hand-off timer wakes it by `end` (the driver's clock, ns), and
    /// pollers push it later ([`Driver::push_handoff_timer`]). Arms it unless it is armed
    /// no later than `end` and not yet expired (a poller pushed it). Call without the
    /// device lock.
    fn sleep_on_handoff_timer(&self, end: u64) {
        let mut at = lock(&self.poller_timer_at);
        let now = self.now().as_nanos();
        if *at != u64::MAX && *at <= end && *at > now {
            return;
        }
        *at = end;
        self.poller_timer
            .set(Some(Duration::from_nanos(end.saturating_sub(now))));
        self.poller_timer_due.store(end, Ordering::Release);
    }

    /// The progress thread sleeps otherwise: the hand-off timer is disarmed (which also
    /// clears an expiry nobody read). Call without the device lock.
    fn stop_handoff_timer(&self) {
        let mut at = lock(&self.poller_timer_at);
        if *at != u64::MAX {
            *at = u64::MAX;
            self.poller_timer_due.store(u64::MAX, Ordering::Release);
            self.poller_timer.set(None);
        }
    }

    /// Whether the progress thread leaves the socket to application threads now (a hand-off
    /// to pollers or to a busy stream, [`Driver::keep_handoff_busy`]).
    pub(crate) fn socket_handed_over(&self) -> bool {
        self.poller_handoff().is_some()
    }

    /// The device's socket, for a thread that blocks watching it ([`Driver::watch_blocked`]).
    pub(crate) fn socket_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }

    /// Hands the socket to a thread about to block in `poll` on it (beside its completion
    /// channel) until the returned guard drops; `None` when hand-offs are off
    /// (`poll_handoff` 0). The thread receives what arrives itself
    /// ([`Driver::try_progress`]) and the progress thread does not wake for it: a
    /// blocked reader of a stream is woken once per message, by the datagram, instead of
    /// twice (the progress thread, then the reader through the completion channel).
    /// The progress thread still runs the timers, which blocked threads do not.
    pub(crate) fn watch_blocked(self: &Arc<Driver>) -> Option<BlockedWatch> {
        if self.poll_handoff.is_zero() {
            return None;
        }
        if self.blocked_watchers.fetch_add(1, Ordering::SeqCst) == 0 {
            // Back within the hand-off: the progress thread need not look.
            let mut armed = lock(&self.handoff_timer_armed);
            if std::mem::take(&mut *armed) {
                self.handoff_timer.set(None);
            }
            drop(armed);
            // A progress thread asleep on the socket would wake for the next datagram
            // with this thread (and may take it): it leaves the socket now instead,
            // once, not on the next message's path.
            if self.sleeping_until.load(Ordering::Acquire) != 0
                && !self.socket_unwatched.load(Ordering::SeqCst)
            {
                self.wake.signal();
            }
        }
        Some(BlockedWatch {
            driver: Arc::clone(self),
        })
    }

    /// Whether a thread blocks watching the socket ([`Driver::watch_blocked`]).
    fn blocked_watch_active(&self) -> bool {
        self.blocked_watchers.load(Ordering::SeqCst) > 0
    }

    /// The last blocked watcher left: the socket stays handed over for `poll_handoff`
    /// more, as after a spinning poller's last poll (a ping-pong's reader is back within
    /// it), then the progress thread watches it again. It may sleep without a timeout
    /// now, so a timer of its own wakes it then, unless a thread blocks on the socket
    /// again first and disarms it: two `timerfd_settime` instead of a wake-up per
    /// message.
    fn blocked_watch_ended(&self) {
        if self.blocked_watchers.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let now = self.now().as_nanos();
        self.app_polled_at.fetch_max(now + 1, Ordering::SeqCst);
        if self.socket_unwatched.load(Ordering::SeqCst) {
            let mut armed = lock(&self.handoff_timer_armed);
            *armed = true;
            self.handoff_timer.set(Some(self.poll_handoff));
        }
    }

    /// Reads what waits on the multicast group sockets and hands it to the
    /// engine; returns how many reads there were.
    fn receive_groups(&self, groups: &[(SocketAddr, Arc<UdpSocket>)], rx: &mut RecvBatch) -> usize {
        let mut total = 0;
        for (group, sock) in groups {
            let got = match rx.recv(sock) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, %group, "recvmmsg on a multicast socket failed");
                    0
                }
            };
            if got == 0 {
                continue;
            }
            total += got;
            self.counters
                .rx_datagrams
                .fetch_add(got as u64, Ordering::Relaxed);
            if self.capturing {
                let mut pcap = lock(&self.pcap);
                if pcap.is_some() {
                    self.for_each_datagram(rx, got, |src, _, data| {
                        write_capture(&mut pcap, src, *group, 0, data);
                    });
                }
            }
            let deferred = {
                let mut st = self.lock();
                let now = self.now();
                self.for_each_datagram(rx, got, |src, _, data| {
                    st.engine.handle_multicast_datagram(now, src, *group, data);
                });
                st.engine.handle_timeout(now);
                self.pump(&mut st)
            };
            self.finish(deferred);
        }
        total
    }

    /// Stops the device: lingers for ACKs a closed QP may owe (unless called on the
    /// progress thread itself), stops and joins the progress thread, flushes the capture
    /// and withdraws the published counters.
    pub fn close(&self) {
        let on_progress_thread = lock(&self.thread)
            .as_ref()
            .is_some_and(|h| h.thread().id() == std::thread::current().id());
        // The progress thread answers during the linger: it cannot be the one waiting.
        if !on_progress_thread {
            self.linger();
        }
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        self.release_held_acks();
        self.flush_outbox(true);
        self.flush_capture();
        crate::fork::unregister_socket(self.socket.as_raw_fd());
        for (_, s) in lock(&self.groups).iter() {
            crate::fork::unregister_socket(s.as_raw_fd());
        }
        self.publisher.stop();
        crate::published::unpublish(self.local);
        crate::trace::dump_to_env();
    }

    /// Before the device closes: while a destroyed RC QP may still owe its peer an ACK
    /// (the last one it sent was lost, see the engine's `closed.rs`), the progress thread
    /// keeps answering. That is until three of the peer's retransmission timeouts (assumed
    /// equal to the QP's own `timeout`) have passed since the last datagram arrived, at
    /// most [`Driver::MAX_LINGER`]. A device whose peers went quiet long ago closes at once.
    fn linger(&self) {
        let started = std::time::Instant::now();
        loop {
            let remaining = {
                let st = self.lock();
                let Some(code) = st.engine.closed_qp_timeout() else {
                    return;
                };
                let rto = softverbs_engine::timers::ack_timeout(code).unwrap_or(Self::MAX_LINGER);
                let until = st
                    .last_rx
                    .as_nanos()
                    .saturating_add(3 * rto.as_nanos() as u64);
                Duration::from_nanos(until.saturating_sub(self.now().as_nanos()))
            };
            let left = Self::MAX_LINGER.saturating_sub(started.elapsed());
            let nap = remaining.min(left);
            if nap.is_zero() {
                return;
            }
            std::thread::sleep(nap.min(Duration::from_millis(20)));
        }
    }

    /// How soon the progress thread looks again when another thread was reading the
    /// socket.
    const MIN_TICK: Duration = Duration::from_micros(20);

    /// The longest a closing device stays up for a peer's retransmissions.
    const MAX_LINGER: Duration = Duration::from_secs(1);

    /// Publishes the counters for `softverbs stat` when they changed, at most
    /// every 100 ms. Returns how soon to call again when a change
    /// is still waiting to be published. Call without the device lock.
    fn publish_counters(&self, c: softverbs_engine::Counters) -> Option<Duration> {
        const EVERY: u64 = 100_000_000;
        if Some(c) == *lock(&self.published) {
            return None;
        }
        let now = self.now().as_nanos();
        let last = self.published_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EVERY {
            return Some(Duration::from_nanos(EVERY - now.saturating_sub(last)));
        }
        self.published_at.store(now.max(1), Ordering::Relaxed);
        *lock(&self.published) = Some(c);
        let mut lines: Vec<(&str, u64)> = c.named().to_vec();
        let dc = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        lines.push(("udp_tx_datagrams", get(&dc.tx_datagrams)));
        lines.push(("udp_rx_datagrams", get(&dc.rx_datagrams)));
        lines.push(("udp_rx_by_progress_thread", get(&dc.rx_by_progress)));
        lines.push(("udp_rx_single_reads", get(&dc.rx_single_reads)));
        lines.push(("udp_tx_errors", get(&dc.tx_errors)));
        lines.push(("udp_tx_syscalls", get(&dc.tx_syscalls)));
        lines.push(("udp_tx_single_sends", get(&dc.tx_single_sends)));
        lines.push(("udp_tx_backpressure", get(&dc.tx_backpressure)));
        lines.push(("posts_joined_batch", get(&dc.posts_joined_batch)));
        lines.push(("progress_timer_wakeups", get(&dc.timer_wakeups)));
        lines.push(("progress_wakes", get(&dc.progress_wakes)));
        lines.push(("progress_sleeps", get(&dc.progress_sleeps)));
        lines.push(("poll_yields", get(&dc.poll_yields)));
        lines.push(("poll_cpu_moves", get(&dc.poll_cpu_moves)));
        lines.push(("poll_waits", get(&dc.poll_waits)));
        lines.push(("poll_yield_waits", get(&dc.poll_yield_waits)));
        lines.push(("handoff_pushes", get(&dc.handoff_pushes)));
        lines.push((
            "socket_taken_from_progress",
            get(&dc.socket_taken_from_progress),
        ));
        lines.push(("acks_held", get(&dc.acks_held)));
        lines.push(("acks_after_requests", get(&dc.acks_after_requests)));
        lines.push(("acks_held_for_memory", get(&dc.acks_held_for_memory)));
        lines.push(("ack_holds_expired", get(&dc.ack_holds_expired)));
        lines.push(("sock_writes_blocked", get(&dc.sock_writes_blocked)));
        lines.push(("sock_ack_looks", get(&dc.sock_ack_looks)));
        lines.push(("sock_cpu_moves", get(&dc.sock_cpu_moves)));
        lines.push(("sock_cpu_looks", get(&dc.sock_cpu_looks)));
        lines.push(("sock_small_in_packet", get(&dc.sock_small_in_packet)));
        lines.push(("sock_grants_from_memory", get(&dc.sock_grants_from_memory)));
        lines.push((
            "sock_grants_from_message",
            get(&dc.sock_grants_from_message),
        ));
        lines.push(("sock_bytes_read_ahead", get(&dc.sock_bytes_read_ahead)));
        lines.push((
            "sock_messages_read_ahead",
            get(&dc.sock_messages_read_ahead),
        ));
        lines.push(("sock_messages_announced", get(&dc.sock_messages_announced)));
        lines.push(("injected_drops", get(&dc.injected_drops)));
        lines.push(("rx_truncated", get(&dc.rx_truncated)));
        let same_host = self.same_host.stat_lines();
        lines.extend(same_host.iter().map(|(k, v)| (k.as_str(), *v)));
        // Written by another thread: a file-system call may block for long
        // (`crate::publisher`).
        self.publisher.offer(&lines);
        None
    }
}

impl crate::samehost::EngineAccess for Driver {
    fn with(&self, f: &mut dyn FnMut(&mut Engine)) {
        self.with_engine(f);
    }
    fn read(&self, f: &mut dyn FnMut(&mut Engine)) {
        self.read_engine(f);
    }
}

/// Records one datagram in the capture file, if capturing; a failing capture stops.
fn write_capture(
    pcap: &mut Option<PcapWriter<BufWriter<File>>>,
    src: SocketAddr,
    dst: SocketAddr,
    ipv4_id: u16,
    data: &[u8],
) {
    if let Some(w) = pcap.as_mut() {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        if let Err(e) = w.write_udp(ts, src, dst, ipv4_id, data) {
            tracing::warn!(error = %e, "packet capture failed; capture stops");
            *pcap = None;
        }
    }
}

thread_local! {
    static PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the caller is a device's progress thread (which must never wait for itself).
pub(crate) fn on_progress_thread() -> bool {
    PROGRESS_THREAD.with(|p| p.get())
}

/// A thread blocked watching the device's socket ([`Driver::watch_blocked`]), until
/// dropped.
pub struct BlockedWatch {
    driver: Arc<Driver>,
}

impl BlockedWatch {
    /// The device's socket: the thread polls it for `POLLIN` (and receives what arrives
    /// through a CQ poll or a stream call afterwards).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.driver.socket_fd()
    }

    /// Whether this is a watch on `driver`'s socket.
    pub(crate) fn is_on(&self, driver: &Arc<Driver>) -> bool {
        Arc::ptr_eq(&self.driver, driver)
    }
}

impl Drop for BlockedWatch {
    fn drop(&mut self) {
        self.driver.blocked_watch_ended();
    }
}

impl std::fmt::Debug for BlockedWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlockedWatch").field(&self.fd()).finish()
    }
}

fn progress_thread(d: Arc<Driver>) {
    PROGRESS_THREAD.with(|p| p.set(true));
    // This thread's sleeps end on the transport's timers, the shortest of which (a
    // tail-loss probe, from 50 µs) is as short as the default 50 µs slack that would
    // postpone it: a probe sent late costs a whole exchange where one message is in
    // flight (`engine/src/qp/recovery.rs`). The hand-off to pollers is as short.
    sys::set_timer_slack(Duration::from_micros(1));
    // The multicast group sockets, refreshed when `groups_gen` moves.
    let mut groups: Vec<(SocketAddr, Arc<UdpSocket>)> = Vec::new();
    let mut groups_seen = 0;
    let mut mc_rx: Option<RecvBatch> = None;
    let mut pfds: Vec<libc::pollfd> = Vec::new();
    // The connection manager's sockets (rendezvous, then the companion), refreshed when
    // `cm_io.sockets_gen` moves.
    let mut cm_socks: Vec<(SocketAddr, Arc<UdpSocket>)> = Vec::new();
    let mut cm_seen = 0;
    let mut cm_buf = vec![0u8; 2048];
    let mut rounds: u32 = 0;
    // The last sleep was a hand-off to spinning pollers (see `Driver::push_handoff_timer`).
    let mut handed_off_last = false;
    while !d.stop.load(Ordering::Acquire) {
        let gen = d.groups_gen.load(Ordering::Acquire);
        if gen != groups_seen {
            groups_seen = gen;
            groups = lock(&d.groups).clone();
        }
        let gen = d.cm_io.sockets_gen.load(Ordering::Acquire);
        if gen != cm_seen {
            cm_seen = gen;
            cm_socks = lock(&d.cm_io.sockets).clone();
        }
        // Under a steady stream of data the thread rarely sleeps in poll: look at the
        // rendezvous sockets now and then anyway.
        rounds = rounds.wrapping_add(1);
        if !cm_socks.is_empty() && rounds % 64 == 0 {
            d.cm_receive(&cm_socks, &mut cm_buf);
        }
        let mc_got = if groups.is_empty() {
            0
        } else {
            let rx = mc_rx.get_or_insert_with(|| RecvBatch::new(MAX_DATAGRAM + 64));
            d.receive_groups(&groups, rx)
        };
        // Receive whatever is there, unless application threads are polling and
        // receive themselves. Never wait for the receive buffers: a thread spinning
        // on its CQ takes them again and again, and a waiting progress thread could
        // starve there, its timers with it.
        let handoff = d.poller_handoff();
        // Another thread holds the receive buffers: it is reading the socket now.
        let mut rx_busy = false;
        let rx = match handoff {
            _ if d.blocked_watch_active() => None,
            Some(_) => None,
            None => match d.rx.try_lock() {
                Ok(rx) => Some(rx),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    rx_busy = true;
                    None
                }
            },
        };
        let got = if let Some(mut rx) = rx {
            let mut got = d.receive(&mut rx, false);
            if got == 0 && !d.busy_poll.is_zero() {
                let until = std::time::Instant::now() + d.busy_poll;
                while got == 0 && std::time::Instant::now() < until {
                    got = d.receive(&mut rx, false);
                    std::hint::spin_loop();
                }
            }
            got
        } else {
            0
        };
        if got > 0 || mc_got > 0 {
            continue;
        }
        // What a poster armed is among the engine's timers the next sleep is computed
        // from, under the lock: disarm it first (here, once the socket is drained, not
        // on waking: the datagram that woke the thread does not wait for it). An arm
        // that comes after the computation is against the sleep it publishes.
        {
            let mut armed = lock(&d.timer_armed);
            if *armed != u64::MAX {
                *armed = u64::MAX;
                // (Disarming also clears an expiry that was not read.)
                d.timer.set(None);
            }
        }
        // Nothing to read: run timers, then sleep until the next deadline, a
        // datagram or a wake-up. The sleep deadline is published under the lock,
        // so a poster that arms an earlier timer afterwards sees it and wakes us.
        let (deferred, timer, counters, handoff, watchers, handoff_end, poller_mode) = {
            let mut st = d.lock();
            let now = d.now();
            let handoff = d.poller_handoff();
            let watchers = d.blocked_watch_active();
            Driver::fire_timers(&mut st, now);
            let deferred = d.pump(&mut st);
            let deadline = d.next_deadline(&st);
            // The thread wakes by then anyway: at its next timer or when the pollers'
            // hand-off ends. A poster arming a later timer need not wake it.
            // While another thread reads the socket, what it has not read yet would
            // end a wait on POLLIN at once: look again shortly instead.
            // While pollers receive, they fire the timers too: sleep until the hand-off
            // ends (a timer comes at most that late if they stop polling at once).
            // Threads blocked on the socket fire no timers: it wakes for them (and by its
            // hand-off timer once they all left).
            // A hand-off to pollers that outlasted a whole sleep (a ping-pong with both
            // ends spinning) goes on as long as they poll: the thread sleeps on a timer
            // they push later, instead of waking at the end of every period.
            let sustained = (!watchers && handed_off_last).then_some(handoff).flatten();
            let wake_at = match handoff {
                _ if watchers => deadline,
                Some(_) if sustained.is_some() => None,
                Some(h) => Some(now + h),
                None => [deadline, rx_busy.then(|| now + Driver::MIN_TICK)]
                    .into_iter()
                    .flatten()
                    .min(),
            };
            let handoff = handoff
                .or(rx_busy.then_some(Driver::MIN_TICK))
                .or(watchers.then_some(Duration::ZERO));
            d.sleeping_until.store(
                wake_at.map_or(u64::MAX, |t| t.as_nanos()),
                Ordering::Release,
            );
            let timer = wake_at.map(|t| t.saturating_duration_since(now));
            let handoff_end = sustained.map(|h| (now + h).as_nanos());
            let poller_mode = !watchers && handoff.is_some();
            (
                deferred,
                timer,
                st.engine.counters(),
                handoff,
                watchers,
                handoff_end,
                poller_mode,
            )
        };
        match handoff_end {
            Some(end) => d.sleep_on_handoff_timer(end),
            None => d.stop_handoff_timer(),
        }
        handed_off_last = poller_mode;
        d.finish(deferred);
        d.flush_capture();
        // ACKs it holds for an answer leave when their hold ends, unless the answer
        // took them first (its sender then disarms the timer).
        d.progress_hold.arm(|| d.now().as_nanos());
        let republish = d.publish_counters(counters);
        let blocked = lock(&d.outbox).blocked;
        let retry = (blocked == Some(Blocked::NoBuffers)).then_some(Duration::from_millis(1));
        let timeout = [timer, republish, retry].into_iter().flatten().min();
        pfds.clear();
        let out = if blocked == Some(Blocked::Full) {
            libc::POLLOUT
        } else {
            0
        };
        let input = if handoff.is_some() { 0 } else { libc::POLLIN };
        d.socket_unwatched
            .store(handoff.is_some(), Ordering::SeqCst);
        // An arming thread may have ended the hand-off before the flag was up; blocked
        // threads may all have left (then they did not see the flag: this sleep may
        // have no timeout).
        let input = if handoff.is_some()
            && !rx_busy
            && !d.blocked_watch_active()
            && (watchers || d.poller_handoff().is_none())
        {
            libc::POLLIN
        } else {
            input
        };
        for (fd, events) in [
            (d.socket.as_raw_fd(), input | out),
            (d.wake.raw(), libc::POLLIN),
            (d.timer.raw(), libc::POLLIN),
            (d.handoff_timer.raw(), libc::POLLIN),
            (d.progress_hold.timer_fd(), libc::POLLIN),
            (d.poller_timer.raw(), libc::POLLIN),
        ]
        .into_iter()
        .chain(groups.iter().map(|(_, s)| (s.as_raw_fd(), libc::POLLIN)))
        .chain(cm_socks.iter().map(|(_, s)| (s.as_raw_fd(), libc::POLLIN)))
        .chain(
            lock(&d.cm_io.companion)
                .as_ref()
                .map(|s| (s.as_raw_fd(), libc::POLLIN)),
        ) {
            pfds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
        d.counters.progress_sleeps.fetch_add(1, Ordering::Relaxed);
        let _ = sys::poll(&mut pfds, timeout);
        let signalled = pfds[1].revents & libc::POLLIN != 0;
        if signalled {
            d.counters.progress_wakes.fetch_add(1, Ordering::Relaxed);
        }
        // An ICMP report on the device socket (a request to a closed port).
        if pfds[0].revents & libc::POLLERR != 0 {
            d.cm_device_errors();
        }
        if pfds[3].revents & libc::POLLIN != 0 {
            let mut armed = lock(&d.handoff_timer_armed);
            *armed = false;
            d.handoff_timer.set(None);
        }
        if pfds[4].revents & libc::POLLIN != 0 {
            d.progress_hold.expired();
        }
        // (An expired hand-off timer is re-armed or disarmed before the next sleep.)
        if pfds[6 + groups.len()..].iter().any(|p| p.revents != 0) {
            d.cm_receive(&cm_socks, &mut cm_buf);
        }
        if blocked.is_some() {
            // POLLOUT (or the ENOBUFS retry time): send what is left.
            d.flush_outbox(true);
        }
        // The wake-up counter is read only when it was signalled (it is level-triggered:
        // a signal the wait did not report ends the next wait at once).
        if signalled {
            d.wake.take();
        }
        d.socket_unwatched.store(false, Ordering::Release);
        d.sleeping_until.store(0, Ordering::Release);
        d.progress_told.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::PollStreak;

    const DEV: usize = 0x1000;

    #[test]
    fn one_empty_poll_is_no_loop() {
        let mut s = PollStreak::default();
        assert!(!s.empty_poll(DEV, 1_000_000));
        // Polled again long after: a fresh run, still no loop.
        assert!(!s.empty_poll(DEV, 1_000_000 + PollStreak::LOOP_GAP + 1));
    }

    #[test]
    fn polls_close_together_are_a_loop() {
        let mut s = PollStreak::default();
        let mut t = 5_000_000;
        assert!(!s.empty_poll(DEV, t));
        for _ in 0..100 {
            t += 1_000;
            assert!(s.empty_poll(DEV, t), "at {t}");
        }
    }

    #[test]
    fn the_gap_counts_from_the_end_of_the_previous_poll() {
        let mut s = PollStreak::default();
        assert!(!s.empty_poll(DEV, 1_000));
        // Its yield lasted a millisecond.
        s.poll_ended(DEV, 1_001_000);
        assert!(s.empty_poll(DEV, 1_002_000));
        // The end of another device's poll changes nothing.
        s.poll_ended(DEV + 8, 9_000_000);
        assert!(!s.empty_poll(DEV, 9_000_100));
    }

    #[test]
    fn another_device_or_a_completion_starts_over() {
        let mut s = PollStreak::default();
        s.empty_poll(DEV, 10);
        assert!(s.empty_poll(DEV, 20));
        // The same thread polls another device's CQ: no loop there yet.
        assert!(!s.empty_poll(DEV + 8, 30));
        assert!(!s.empty_poll(DEV, 40));
        // A completion ends the run.
        assert!(s.empty_poll(DEV, 50));
        s.found(DEV, 55);
        assert!(!s.empty_poll(DEV, 60));
    }

    /// The driver reads the clock for `found` and `posted` only where they say they use
    /// it (`Driver::note_found_at`, `Driver::note_post`): where they say not, any time
    /// leaves the same streak.
    #[test]
    fn found_and_posted_use_their_time_only_where_they_say_so() {
        let same_either_way = |s: PollStreak, step: fn(&mut PollStreak, u64) -> bool| {
            let (mut a, mut b) = (s, s);
            let (ra, rb) = (step(&mut a, 1), step(&mut b, 99_000_000));
            ra == rb && a == b
        };
        let found: fn(&mut PollStreak, u64) -> bool = |s, t| s.found(DEV, t);
        let posted: fn(&mut PollStreak, u64) -> bool = |s, t| {
            s.posted(DEV, t);
            false
        };
        let mut s = PollStreak::default();
        let mut t = 1_000;
        let mut seen = [false; 4];
        // A ping-pong, a thread that leaves, single polls, another device.
        for round in 0..40u64 {
            let polls = round % 3;
            for _ in 0..polls {
                t += 1_000;
                s.empty_poll(if round % 7 == 6 { DEV + 8 } else { DEV }, t);
            }
            let mut check = |s: PollStreak| {
                for (i, (needs, step)) in [
                    (s.found_needs_time(DEV), found),
                    (s.posted_needs_time(DEV), posted),
                ]
                .into_iter()
                .enumerate()
                {
                    seen[i * 2 + usize::from(needs)] = true;
                    if !needs {
                        assert!(same_either_way(s, step), "round {round}: {s:?}");
                    }
                }
            };
            check(s);
            t += 1_000;
            s.found(DEV, t);
            check(s);
            t += if round % 5 == 4 { 1_000_000 } else { 1_000 };
            s.posted(DEV, t);
            check(s);
            s.posted(DEV, t + 500);
        }
        assert_eq!(seen, [true; 4], "both answers of both questions came up");
        // Where they say they use it, they do.
        let mut s = PollStreak::default();
        s.empty_poll(DEV, 1_000);
        s.empty_poll(DEV, 2_000);
        assert!(s.found_needs_time(DEV) && !same_either_way(s, found));
        s.found(DEV, 3_000);
        assert!(s.posted_needs_time(DEV) && !same_either_way(s, posted));
    }

    #[test]
    fn a_thread_that_leaves_after_its_loops_ends_the_hand_off() {
        let mut s = PollStreak::default();
        // A loop that ends: no history yet.
        s.empty_poll(DEV, 1_000);
        s.empty_poll(DEV, 2_000);
        assert!(!s.found(DEV, 3_000));
        // Back a millisecond later (it spun on memory), loops, finds: it leaves.
        s.empty_poll(DEV, 1_003_000);
        s.empty_poll(DEV, 1_004_000);
        assert!(s.found(DEV, 1_005_000));
        // A completion found without a loop changes nothing.
        s.empty_poll(DEV, 2_000_000);
        assert!(!s.found(DEV, 2_000_500));
    }

    #[test]
    fn a_loop_preempted_before_its_last_poll_still_ends_the_hand_off() {
        // (tests/loopback.rs, a_thread_that_spins_on_memory_after_its_poll_loops_ends_the_
        // hand_off failed 1 run in 30 on a loaded host, in all five of its attempts.)
        let mut s = PollStreak::default();
        s.empty_poll(DEV, 1_000);
        s.empty_poll(DEV, 2_000);
        assert!(!s.found(DEV, 3_000));
        // Back late: a loop, but the thread is preempted for 100 µs before its last
        // empty poll, and the completion is there at the next one.
        s.posted(DEV, 1_003_000);
        assert!(!s.empty_poll(DEV, 1_004_000));
        assert!(s.empty_poll(DEV, 1_005_000));
        assert!(!s.empty_poll(DEV, 1_105_000));
        assert!(s.found(DEV, 1_106_000));
        // Back late again. Its first empty poll received what waited in the socket
        // meanwhile (the peer's WRITE and its retransmissions, 40 µs of work): the gap
        // to the next poll counts from the end of that one (`Cq::poll_receiving`).
        s.posted(DEV, 3_000_000);
        assert!(!s.empty_poll(DEV, 3_001_000));
        s.poll_ended(DEV, 3_041_000);
        assert!(s.empty_poll(DEV, 3_042_000));
        assert!(s.found(DEV, 3_043_000));
    }

    #[test]
    fn a_ping_pong_preempted_in_its_post_keeps_the_hand_off() {
        let mut s = PollStreak::default();
        let mut t = 1_000;
        for _ in 0..10 {
            s.empty_poll(DEV, t);
            s.empty_poll(DEV, t + 1_000);
            assert!(!s.found(DEV, t + 2_000));
            // It posts its answer at once, but the post is preempted for 200 µs.
            s.posted(DEV, t + 3_000);
            s.posted(DEV, t + 4_000);
            t += 200_000;
        }
        // Posting on another device changes nothing: it left this one.
        s.empty_poll(DEV, t);
        s.empty_poll(DEV, t + 1_000);
        assert!(!s.found(DEV, t + 2_000));
        s.posted(DEV + 8, t + 3_000);
        s.empty_poll(DEV, t + 1_000_000);
        s.empty_poll(DEV, t + 1_001_000);
        assert!(s.found(DEV, t + 1_002_000));
        // ib_write_lat posts its WRITE a millisecond after its loop found (it spun on
        // memory for the peer's WRITE in between): it leaves.
        let mut s = PollStreak::default();
        s.empty_poll(DEV, 1_000);
        s.empty_poll(DEV, 2_000);
        assert!(!s.found(DEV, 3_000));
        s.posted(DEV, 1_003_000);
        s.empty_poll(DEV, 1_004_000);
        s.empty_poll(DEV, 1_005_000);
        assert!(s.found(DEV, 1_006_000));
    }

    #[test]
    fn a_ping_pong_on_the_cq_keeps_the_hand_off() {
        let mut s = PollStreak::default();
        let mut t = 1_000;
        for _ in 0..10 {
            s.empty_poll(DEV, t);
            s.empty_poll(DEV, t + 1_000);
            assert!(!s.found(DEV, t + 2_000));
            // It posts its answer and polls again within the gap.
            t += 5_000;
        }
    }
}
