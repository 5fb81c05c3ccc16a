//! [`RdmaStream`]: one rsocket stream connection and the driver loop around its core.

use super::ring::RingMemory;
use crate::cm::rc::expect;
use crate::cm::{CmError, CmEventKind, CmId, ConnParam, EventChannel, EventStatus, PortSpace};
use crate::context::Context;
use crate::cq::{CompletionChannel, Cq};
use crate::pd::{Mr, Pd, RawMr};
use crate::qp::Qp;
use softverbs_engine::{
    AccessFlags, Payload, QpCap, Rkey, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion,
};
use softverbs_sock::{
    Config, ConnData, CtrlWrite, DataWrite, IomapEntry, LocalRegions, Msg, PlacedWordAd, RsSge,
    SendChunks, SendStage, StreamCore, PLACED_WORD_LEN, RS_SGE_LEN, TARGET_AREA_HEAD,
};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

/// See [`RdmaStream::watch_device`].
pub use crate::driver::BlockedWatch as DeviceWatch;

/// How a stream is set up.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Queue and ring sizes (rsocket.c's defaults unless changed).
    pub config: Config,
    /// How long connecting (or accepting a request) may take.
    pub connect_timeout: Duration,
    /// How long dropping a stream waits for its last sends to complete.
    pub linger: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            config: Config::default(),
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(5),
        }
    }
}

/// The inline data a control write needs (an iomap entry is 24 bytes).
const CTRL_INLINE: u32 = 64;
/// A blocked call re-checks at least this often (another thread sharing the stream may
/// have taken the completion event it waited for).
const WAIT_SLICE: Duration = Duration::from_millis(10);
/// A blocked call first spins this long before sleeping on the completion channel
/// (polling, never yielding the CPU: see `crate::cq::BlockingWait`).
const SPIN: Duration = Duration::from_micros(20);
/// A same-host writer about to hold a write back receives from its device's socket for
/// the ACK of the write in flight (so that what it holds goes announced as soon as that
/// write completed) at the first held write, then once per this many bytes held, not
/// before every held write: that look, mostly an empty `recvmmsg`, was about 1 µs of a
/// 64 KiB write's 6 (`docs/sockets.md`, sessions 9 and 13). What is held so goes
/// announced at most this many bytes later (four 64 KiB writes, ~20 µs of copying), and
/// `Driver::keep_handoff_busy` still receives whenever nobody did for `poll_handoff`.
/// Never more than [`ACK_LOOK_GRANT_SHARE`] of a grant, though.
const ACK_LOOK_BYTES: u32 = 256 << 10;
/// ... an eighth of the peer's ring (a quarter of a grant, its receive half): with few
/// writes per grant, a hold that waits for the next look delays the reader's start, and
/// with it the next grant. Session 13's gate of 256 KiB alone cost preloaded iperf3 (1 MiB
/// rings: four 128 KiB writes per 512 KiB grant) a third (`docs/sockets.md`); bounded so,
/// such a writer looks before every write, as before the gate.
const ACK_LOOK_GRANT_SHARE: u32 = 4;

/// On the same-host path a stream data write of at most this many bytes that carries its
/// announcement (an immediate), written after a read when the stream's previous data
/// write was no larger either, goes with its bytes in its packet: placing it would cost
/// a `process_vm_writev` on top of the header-only packet it sends anyway (a 64-byte
/// `rstream` ping-pong: 20-22 µs one way placed, 16-17 by packets). The rule keeps
/// the small messages of a request/response exchange, and leaves alone a bulk stream
/// (no reads between its writes) and a large write after a small one (a header and its
/// body): behind a write in its packet, later writes are not placed until its ACK
/// (`engine/placed.rs`), and a bulk stream's placed writes went 5x slower that way.
/// 4 KiB: one packet at the largest MTU (1 KiB messages: 21-26 -> 16-18 µs; 4 KiB:
/// even).
const IN_PACKET_MAX: u32 = 4096;

/// Which call waits in [`RdmaStream::wait_until_as`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// A data write: counted in `sock_writes_blocked`.
    Write,
    /// A data read: may move off its bulk writer's CPU before sleeping.
    Read,
    /// Anything else (shutdown, flush, riowrite).
    Other,
}

/// A stream socket over RDMA speaking the rsockets protocol: `std::io::Read` and
/// `Write` like a `TcpStream`, blocking by default, non-blocking on request.
///
/// Reads return what has arrived (at least one byte, 0 at end of stream); writes take
/// what fits the peer's granted buffer and the send ring at once (at least one byte when
/// blocking). Dropping the stream shuts it down (the peer reads end of stream), waits up to
/// the linger time for the last writes to complete, then disconnects.
pub struct RdmaStream {
    // Field order is drop order: the connection goes before the memory it used.
    id: CmId,
    qp: Arc<Qp>,
    cq: Cq,
    channel: CompletionChannel,
    rbuf: Mr<RingMemory>,
    target: Mr<Vec<u8>>,
    sbuf: Mr<Vec<u8>>,
    // Regions published with `iomap_raw` (riomap), before the PD they are registered in.
    iomaps: Mutex<Vec<IomapRegion>>,
    core: Arc<Mutex<StreamCore>>,
    // Announces held data for whoever drives the device (`Coalescer`).
    coalescer: Arc<Coalescer>,
    // Notification coalescing on same-host writes (`Config::sock_coalesce`).
    coalesce: bool,
    // A blocked reader moves off its bulk writer's CPU (`Config::sock_apart`).
    apart: bool,
    nonblocking: AtomicBool,
    // The held bytes (`StreamCore::held_bytes`) at the writer's last look for the ACK of
    // the write in flight (`ACK_LOOK_BYTES`); written under the core's lock.
    held_at_ack_look: AtomicU32,
    // The length of the last data write, and whether data was read since: a small
    // message of an exchange goes in its packet (`IN_PACKET_MAX`). Written under the
    // core's lock.
    last_write_len: AtomicU32,
    read_since_write: AtomicBool,
    // Completions and connection events handled so far (async waiters use it to tell
    // whether one task's progress may have readied another's operation).
    handled: AtomicU64,
    epoch: Instant,
    linger: Duration,
    _pd: Pd,
}

impl std::fmt::Debug for RdmaStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .field("qp", &self.qp.qpn())
            .finish()
    }
}

/// Maps a connection-manager failure to what a socket call reports.
pub(crate) fn cm_to_io(e: CmError) -> io::Error {
    match e {
        CmError::Io(e) => e,
        CmError::Bind { source, .. } => source,
        CmError::Cm(e) => {
            use softverbs_cm::CmError as E;
            let kind = match e {
                E::AddrInUse => io::ErrorKind::AddrInUse,
                E::NoFreePort => io::ErrorKind::AddrNotAvailable,
                E::Unsupported(_) => io::ErrorKind::Unsupported,
                _ => io::ErrorKind::InvalidInput,
            };
            io::Error::new(kind, e)
        }
        CmError::Unexpected { op, kind, status } => {
            let kind = match (kind, status) {
                (_, EventStatus::TimedOut) => io::ErrorKind::TimedOut,
                (CmEventKind::Rejected | CmEventKind::Unreachable, _) => {
                    io::ErrorKind::ConnectionRefused
                }
                (CmEventKind::AddrError | CmEventKind::RouteError, _) => {
                    io::ErrorKind::AddrNotAvailable
                }
                _ => io::ErrorKind::ConnectionAborted,
            };
            io::Error::new(kind, format!("{op}: {kind:?} {status:?}"))
        }
        other => io::Error::other(other),
    }
}

fn reset(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, what.to_string())
}

/// The registered regions of a connection about to be made.
pub(crate) struct Resources {
    pd: Pd,
    cq: Cq,
    channel: CompletionChannel,
    rbuf: Mr<RingMemory>,
    target: Mr<Vec<u8>>,
    sbuf: Mr<Vec<u8>>,
    core: StreamCore,
    // The device's `Config::sock_coalesce`.
    coalesce: bool,
    // The device's `Config::sock_early_room`.
    early_room: bool,
    // The device's `Config::sock_apart`.
    apart: bool,
    // The device's `Config::sock_placed_word`: the target area holds the word after its
    // slots, and the connection data says where.
    placed_word: bool,
}

impl Resources {
    pub(crate) fn new(ctx: &Context, cfg: Config) -> io::Result<Resources> {
        let cfg = cfg
            .normalized()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let pd = ctx.alloc_pd().map_err(io::Error::other)?;
        // Waits poll(2) the fd, then take events without blocking (async streams too).
        let channel = CompletionChannel::new_nonblocking(ctx)?;
        let cq = ctx
            .create_cq(
                u32::from(cfg.sq_size) + u32::from(cfg.rq_size),
                Some(&channel),
            )
            .map_err(io::Error::other)?;
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let reg = |len: usize, access| pd.reg_mr(vec![0u8; len], access).map_err(io::Error::other);
        let rbuf = pd
            .reg_mr(RingMemory::new(cfg.rbuf_size as usize), remote)
            .map_err(io::Error::other)?;
        let placed_word = ctx.config().sock_placed_word;
        let word_len = if placed_word { PLACED_WORD_LEN } else { 0 };
        let target = reg(cfg.target_area_len() + word_len, remote)?;
        let sbuf = reg(cfg.sbuf_size as usize, AccessFlags::LOCAL_WRITE)?;
        let core = StreamCore::new(
            cfg,
            LocalRegions {
                rbuf_addr: rbuf.addr(),
                rbuf_rkey: rbuf.rkey(),
                target_addr: target.addr(),
                target_rkey: target.rkey(),
            },
        );
        Ok(Resources {
            pd,
            cq,
            channel,
            rbuf,
            target,
            sbuf,
            core,
            coalesce: ctx.config().sock_coalesce,
            early_room: ctx.config().sock_early_room,
            apart: ctx.config().sock_apart,
            placed_word,
        })
    }

    /// rsocket's connection parameters with this side's connection data: no RDMA READ
    /// (responder resources and initiator depth 0), flow control, 7 retries and RNR
    /// retries (CM reference §5.1).
    /// With the "bytes placed" word on, the 40 bytes are followed by where the word is
    /// (`PlacedWordAd`; rdma-core reads only the 40).
    pub(crate) fn conn_param(&self) -> ConnParam {
        let mut private_data = self.core.conn_data().to_bytes().to_vec();
        if self.placed_word {
            let ad = PlacedWordAd {
                addr: self.target.addr() + self.core.config().placed_word_offset() as u64,
                key: self.target.rkey(),
            };
            private_data.extend_from_slice(&ad.to_bytes());
        }
        ConnParam {
            private_data,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: None,
        }
    }

    /// Creates the id's QP and posts every receive, before the peer can send.
    pub(crate) fn create_qp(&self, id: &CmId) -> io::Result<Arc<Qp>> {
        let cfg = self.core.config();
        let cap = QpCap {
            max_send_wr: u32::from(cfg.sq_size),
            max_recv_wr: u32::from(cfg.rq_size),
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: cfg.inline_size.max(CTRL_INLINE),
        };
        let qp = id.create_qp(&self.pd, &self.cq, cap).map_err(cm_to_io)?;
        for _ in 0..cfg.rq_size {
            qp.post_recv(self.core.recv_wr_id(), &[])
                .map_err(io::Error::other)?;
        }
        Ok(qp)
    }

    pub(crate) fn into_stream(
        mut self,
        id: CmId,
        qp: Arc<Qp>,
        peer: &ConnData,
        peer_word: Option<PlacedWordAd>,
        linger: Duration,
    ) -> RdmaStream {
        self.core.handle_connected(peer);
        self.core.set_early_grants(self.early_room);
        // The word both ways only between peers that both have it on; a writer uses the
        // peer's only on the same-host path (`post_data`).
        self.core.set_placed_word(self.placed_word);
        self.core
            .set_peer_placed_word(peer_word.filter(|_| self.placed_word));
        let core = Arc::new(Mutex::new(self.core));
        let coalescer = Arc::new(Coalescer {
            core: Arc::downgrade(&core),
            qp: Arc::downgrade(&qp),
            kicked: AtomicBool::new(false),
        });
        let hook = Arc::clone(&coalescer);
        self.cq
            .set_channel_hook(Some(Arc::new(move || hook.kick())));
        let stream = RdmaStream {
            id,
            qp,
            cq: self.cq,
            channel: self.channel,
            rbuf: self.rbuf,
            target: self.target,
            sbuf: self.sbuf,
            iomaps: Mutex::new(Vec::new()),
            core,
            coalescer,
            coalesce: self.coalesce,
            apart: self.apart,
            nonblocking: AtomicBool::new(false),
            held_at_ack_look: AtomicU32::new(0),
            last_write_len: AtomicU32::new(0),
            read_since_write: AtomicBool::new(false),
            handled: AtomicU64::new(0),
            epoch: Instant::now(),
            linger,
            _pd: self.pd,
        };
        // The first credit update (the second receive half) goes out at once.
        let mut core = stream.lock();
        let _ = stream.post_pending(&mut core);
        drop(core);
        stream
    }
}

fn bad_conn_data(e: softverbs_sock::ConnDataError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl RdmaStream {
    /// Connects to the rsocket listener at `addr` on the process's softverbs device.
    pub fn connect(addr: SocketAddr) -> io::Result<RdmaStream> {
        let ctx = Context::open_default().map_err(io::Error::other)?;
        RdmaStream::connect_with(&ctx, addr, &StreamOptions::default())
    }

    /// Connects to `addr` from `ctx`'s device with `opts`.
    pub fn connect_with(
        ctx: &Context,
        addr: SocketAddr,
        opts: &StreamOptions,
    ) -> io::Result<RdmaStream> {
        let channel = EventChannel::new(ctx).map_err(cm_to_io)?;
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(cm_to_io)?;
        RdmaStream::connect_id(ctx, id, addr, opts)
    }

    /// Connects `id` (unbound, or bound: then its address is the stream's source, as
    /// `rdma_resolve_addr` keeps it) to `addr`.
    pub(super) fn connect_id(
        ctx: &Context,
        id: CmId,
        addr: SocketAddr,
        opts: &StreamOptions,
    ) -> io::Result<RdmaStream> {
        let res = Resources::new(ctx, opts.config)?;
        let timeout = opts.connect_timeout;
        let channel = id.channel().clone();
        let step = |r: Result<(), CmError>, kind, op| {
            r.and_then(|()| expect(&channel, kind, op, timeout).map(|_| ()))
                .map_err(cm_to_io)
        };
        step(
            id.resolve_addr(None, addr, timeout),
            CmEventKind::AddrResolved,
            "resolve_addr",
        )?;
        step(
            id.resolve_route(),
            CmEventKind::RouteResolved,
            "resolve_route",
        )?;
        let qp = res.create_qp(&id)?;
        id.connect(Some(res.conn_param())).map_err(cm_to_io)?;
        let ev =
            expect(&channel, CmEventKind::Established, "connect", timeout).map_err(cm_to_io)?;
        let peer = ConnData::parse(ev.private_data()).map_err(bad_conn_data)?;
        let peer_word = PlacedWordAd::parse(ev.private_data());
        Ok(res.into_stream(id, qp, &peer, peer_word, opts.linger))
    }

    fn lock(&self) -> CoreGuard<'_> {
        CoreGuard {
            guard: Some(self.core.lock().unwrap_or_else(|p| p.into_inner())),
            coalescer: &self.coalescer,
        }
    }

    /// The local rdma_cm address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The peer's rdma_cm address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// Whether the stream's writes take the same-host path (`crate::samehost`): the peer
    /// is a softverbs process on this host, so each write moves straight from the
    /// caller's buffer into the peer's ring. Turns true shortly after connecting.
    pub fn uses_same_host(&self) -> bool {
        self.qp.uses_same_host()
    }

    /// Bytes written and placed in the peer's ring whose announcement is still held back
    /// (notification coalescing, `StreamCore::set_coalescing`); they are announced when
    /// the write in flight completes, whichever thread drives the device. For tests: it
    /// looks without doing anything a stream call does.
    #[doc(hidden)]
    pub fn held_bytes(&self) -> usize {
        self.core
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held_bytes() as usize
    }

    /// Switches reads, writes and flushes between blocking and returning `WouldBlock`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Keep-alives every `interval` (`None`: off): a 0-length RDMA WRITE the peer never
    /// sees, so the RC transport notices a dead peer (rsockets' SO_KEEPALIVE). They go out
    /// while the stream is being used (a blocked call wakes for them).
    pub fn set_keepalive(&self, interval: Option<Duration>) {
        let now = self.epoch.elapsed();
        self.lock().set_keepalive(interval, now);
    }

    /// Bytes received and not yet read.
    pub fn available(&self) -> io::Result<usize> {
        let mut core = self.lock();
        self.progress(&mut core)?;
        Ok(core.available() as usize)
    }

    /// Ends reading, writing or both (`rshutdown`); the peer reads end of stream once it has
    /// read what was written before. Waits for the control message to be sent.
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let how = match how {
            std::net::Shutdown::Read => softverbs_sock::Shutdown::Read,
            std::net::Shutdown::Write => softverbs_sock::Shutdown::Write,
            std::net::Shutdown::Both => softverbs_sock::Shutdown::Both,
        };
        self.start_shutdown(how)?;
        self.wait(|c| c.all_sends_done(), Some(self.linger), true)
            .map(drop)
    }

    /// Queues the shutdown's control message and posts it.
    pub(crate) fn start_shutdown(&self, how: softverbs_sock::Shutdown) -> io::Result<()> {
        let mut core = self.lock();
        // What was held back goes before the end of the stream.
        self.announce_now(&mut core);
        core.shutdown(how);
        self.post_pending(&mut core)
    }

    /// Handles every completion waiting, then posts what the core wants sent, as a call
    /// that is not spinning: the progress thread keeps watching the socket
    /// (`Cq::poll_receiving`), and what this thread receives is acknowledged at once.
    fn progress(&self, core: &mut StreamCore) -> io::Result<()> {
        self.progress_as(core, false)
    }

    /// [`Self::progress`]; with `spinning`, as a thread that keeps polling until its call
    /// can go on (a blocking call's spin, the look after it woke, a non-blocking call that
    /// the program repeats on `WouldBlock`): its empty polls keep the socket handed over
    /// to it (`Driver::poller_handoff`), so the progress thread does not wake per
    /// datagram, and the ACK of a message it receives waits for the program's answer
    /// (`crate::ack_hold`): one `sendmmsg` per one-way message instead of two.
    fn progress_as(&self, core: &mut StreamCore, spinning: bool) -> io::Result<()> {
        self.poll_cq(core, spinning);
        self.drain_cm_events(core);
        self.post_pending(core)
    }

    /// Handles every completion in the CQ, then reposts the receives they used, in one
    /// post (one device lock, not one per message).
    fn poll_cq(&self, core: &mut StreamCore, spinning: bool) {
        let mut first = true;
        self.drain_cq(core, |wcs| {
            // First what waits on the socket, should it be handed over (a busy stream
            // keeps it: `Driver::keep_handoff_busy`): every message that arrived is seen.
            if std::mem::take(&mut first) {
                self.cq.poll_received(wcs, spinning, false)
            } else {
                self.cq.poll_receiving(wcs, spinning, false)
            }
        });
        self.take_grant_from_memory(core);
        self.note_placed_word(core);
    }

    /// Early grants (`StreamCore::set_early_grants`): on the same-host path, takes the
    /// buffer grant the reader's WRITE already placed in the target area, where its
    /// message's datagram is still to be received (and the writer woken for it).
    fn take_grant_from_memory(&self, core: &mut StreamCore) {
        let Some(at) = core.awaited_grant_slot() else {
            return;
        };
        if !self.qp.uses_same_host() {
            return;
        }
        let mut slot = [0u8; RS_SGE_LEN];
        self.target.read(at, &mut slot);
        // The grant is read before the ring room it gives is written to.
        std::sync::atomic::fence(Ordering::Acquire);
        if core.take_grant_from_area(&slot) {
            self.target.write(at, &[0; RS_SGE_LEN]);
            if let Some(d) = self.cq.driver() {
                d.counters
                    .sock_grants_from_memory
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The "bytes placed" word (`StreamCore::set_placed_word`): reads its check (written
    /// last) first, then its count, each followed by an Acquire fence (the ring's bytes up
    /// to the count are read after it), and tells the core the count when the check
    /// matches it (`softverbs_sock::placed_word_count`: a half being written is torn; the
    /// next look sees it whole). Then counts what the word and the messages told since
    /// the last look.
    fn note_placed_word(&self, core: &mut StreamCore) {
        if !core.placed_word_offered() {
            return;
        }
        let at = core.config().placed_word_offset();
        let (mut count, mut check) = ([0u8; 8], [0u8; 8]);
        self.target.read(at + 8, &mut check);
        std::sync::atomic::fence(Ordering::Acquire);
        self.target.read(at, &mut count);
        std::sync::atomic::fence(Ordering::Acquire);
        let found = u64::from_ne_bytes(count);
        if let Some(count) = softverbs_sock::placed_word_count(found, u64::from_ne_bytes(check)) {
            core.note_placed(count);
        }
        self.count_ahead(core);
    }

    /// Adds what the word and the messages told the core to the device's counters.
    fn count_ahead(&self, core: &mut StreamCore) {
        let stats = core.take_ahead_stats();
        if stats == softverbs_sock::AheadStats::default() {
            return;
        }
        if let Some(d) = self.cq.driver() {
            let c = &d.counters;
            c.sock_bytes_read_ahead
                .fetch_add(stats.bytes, Ordering::Relaxed);
            c.sock_messages_read_ahead
                .fetch_add(stats.whole_messages, Ordering::Relaxed);
            c.sock_messages_announced
                .fetch_add(stats.announced_messages, Ordering::Relaxed);
        }
    }

    /// Handles the completions `poll` gives, 32 at a time until it gives fewer, then
    /// reposts the receives they used.
    fn drain_cq(
        &self,
        core: &mut StreamCore,
        mut poll: impl FnMut(&mut [WorkCompletion]) -> usize,
    ) {
        let mut wcs = [WorkCompletion::default(); 32];
        let mut reposts = 0u32;
        loop {
            let n = poll(&mut wcs);
            self.handled.fetch_add(n as u64, Ordering::Relaxed);
            for wc in &wcs[..n] {
                reposts += u32::from(self.complete(core, wc));
            }
            if n < wcs.len() {
                break;
            }
        }
        self.repost(core, reposts);
    }

    /// Reposts `reposts` receives in one post (one device lock, not one per message).
    fn repost(&self, core: &StreamCore, reposts: u32) {
        if reposts > 0 && core.is_connected() {
            let id = core.recv_wr_id();
            let r: Result<(), softverbs_engine::PostError> = self
                .qp
                .post_sends(|p| (0..reposts).try_for_each(|_| p.post_recv(id, &[])))
                .unwrap_or_else(|e| Err(e.into()));
            if let Err(e) = r {
                tracing::debug!("rsocket receive repost failed: {e}");
            }
        }
    }

    /// Handles what has completed, without the wait or yield of an empty poll: with
    /// `receive`, what waits on a handed-over socket is received first (a writer about to
    /// hold its data back looks whether the write in flight completed), counted in
    /// `sock_ack_looks` when it is the `ACK_LOOK_BYTES` look (`ack_look`), not the busy
    /// hand-off's (`Driver::busy_look_due`).
    fn poll_now(&self, core: &mut StreamCore, receive: bool, ack_look: bool) {
        if let Some(d) = self.cq.driver() {
            if receive && d.socket_handed_over() {
                if ack_look {
                    d.counters.sock_ack_looks.fetch_add(1, Ordering::Relaxed);
                }
                d.try_progress(false);
            }
        }
        self.drain_cq(core, |wcs| self.cq.poll_ready(wcs));
        self.take_grant_from_memory(core);
    }

    /// Handles one completion; `true` when it used a receive to repost.
    fn complete(&self, core: &mut StreamCore, wc: &WorkCompletion) -> bool {
        if !StreamCore::is_recv_wr_id(wc.wr_id) {
            if let Err(e) = core.handle_send_completion(wc.wr_id, wc.status == WcStatus::Success) {
                tracing::debug!(qp = %self.qp.qpn(), "rsocket send failed: {e} ({:?})", wc.status);
            }
            return false;
        }
        if wc.status != WcStatus::Success {
            core.handle_recv_flush();
            return false;
        }
        // Grants and iomap entries were written into the target area: read it for them.
        let mut area = Vec::new();
        if let Some(Msg::Sgl(_) | Msg::IomapSgl(_)) = wc.imm_data.map(Msg::from_imm) {
            area.resize(core.config().target_area_len().max(TARGET_AREA_HEAD), 0);
            self.target.read(0, &mut area);
        }
        if let Err(e) = core.handle_recv(wc.imm_data, wc.byte_len, &area) {
            tracing::debug!(qp = %self.qp.qpn(), "rsocket peer broke the protocol: {e}");
            let _ = self.qp.to_error();
            return false;
        }
        if let Some(at) = core.take_slot_to_clear() {
            // (Early grants: the slot then holds only a grant not taken yet.)
            self.target.write(at, &[0; RS_SGE_LEN]);
            if let Some(d) = self.cq.driver() {
                d.counters
                    .sock_grants_from_message
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        core.is_connected()
    }

    fn drain_cm_events(&self, core: &mut StreamCore) {
        while let Some(ev) = self.id.channel().try_get_event() {
            self.handled.fetch_add(1, Ordering::Relaxed);
            if ev.kind() == CmEventKind::Disconnected {
                // The peer's last messages completed before its DREQ could arrive, but
                // perhaps after this call's first look at the CQ: take them now, or the
                // stream would end before its last bytes (seen as a short echo, ~1 run
                // in 10, in rdmacm-abi's tests/rsocket_api.rs).
                self.poll_cq(core, false);
                core.handle_disconnected();
                // Answer the peer's DREQ (nothing to do when we sent one).
                let _ = self.id.disconnect();
            }
        }
    }

    /// Posts control messages, iomap publications and keep-alives the core has ready.
    pub(crate) fn post_pending(&self, core: &mut StreamCore) -> io::Result<()> {
        announce(&self.qp, core, false);
        self.post_control(core)
    }

    /// [`Self::post_pending`] but for a due announcement of held data (a write about to
    /// start carries it: `StreamCore::start_data`).
    fn post_control(&self, core: &mut StreamCore) -> io::Result<()> {
        let now = self.epoch.elapsed();
        loop {
            let next = core
                .poll_ctrl()
                .or_else(|| core.poll_iomap())
                .or_else(|| core.poll_keepalive(now));
            let Some(c) = next else {
                return Ok(());
            };
            self.post_ctrl(core, &c)?;
        }
    }

    fn post_ctrl(&self, core: &mut StreamCore, c: &CtrlWrite) -> io::Result<()> {
        let op = match c.imm {
            Some(imm) => SendOp::RdmaWriteWithImm {
                remote_addr: c.remote_addr,
                rkey: Rkey(c.rkey),
                imm,
            },
            None => SendOp::RdmaWrite {
                remote_addr: c.remote_addr,
                rkey: Rkey(c.rkey),
            },
        };
        let wr = SendWr {
            wr_id: c.wr_id,
            op,
            payload: Payload::Inline(&c.payload),
            flags: SendFlags::SIGNALED,
        };
        self.qp.post_send(&wr).map_err(|e| {
            let _ = core.handle_send_completion(c.wr_id, false);
            reset(e)
        })
    }

    fn post_data(&self, core: &mut StreamCore, w: &DataWrite, buf: &[u8]) -> io::Result<()> {
        let op = match w.imm {
            Some(imm) => SendOp::RdmaWriteWithImm {
                remote_addr: w.remote_addr,
                rkey: Rkey(w.rkey),
                imm,
            },
            None => SendOp::RdmaWrite {
                remote_addr: w.remote_addr,
                rkey: Rkey(w.rkey),
            },
        };
        let data = &buf[..w.len as usize];
        let sges;
        let payload = match w.stage {
            SendStage::Inline => Payload::Inline(data),
            SendStage::Ring {
                offset,
                first,
                second,
            } => {
                sges = [
                    self.sbuf.sge(offset as usize, first),
                    self.sbuf.sge(0, second),
                ];
                Payload::Sges(if second > 0 { &sges[..] } else { &sges[..1] })
            }
        };
        let mut wr = SendWr {
            wr_id: w.wr_id,
            op,
            payload,
            flags: SendFlags::SIGNALED,
        };
        // A small message of an exchange goes in its packet (`IN_PACKET_MAX`): staged,
        // never placed.
        let in_packet = self.small_in_packet(w);
        if let SendStage::Ring { offset, first, .. } = w.stage {
            // The same-host path moves the bytes straight from the caller's buffer into
            // the peer's ring (one copy, as a TCP send's into the kernel); the send ring
            // is only staged when the write must go by packets.
            if !in_packet {
                if core.early_grants_on() {
                    // (`Config::sock_early_room`.)
                    wr.wr_id = core.unstage(w);
                }
                // The "bytes placed" word after the bytes, in the same copy.
                let word = core.placed_word_after(w).map(|(remote_addr, rkey, value)| {
                    crate::samehost::WordAfter {
                        remote_addr,
                        rkey,
                        value,
                        check: softverbs_sock::placed_word_check(value),
                    }
                });
                if let Some(r) = self.qp.post_write_from(&wr, &[data], word) {
                    return r.map_err(|e| {
                        let _ = core.handle_send_completion(wr.wr_id, false);
                        reset(e)
                    });
                }
                if wr.wr_id != w.wr_id {
                    core.restage(w);
                    wr.wr_id = w.wr_id;
                }
            }
            let (head, tail) = data.split_at(first as usize);
            self.sbuf.write(offset as usize, head);
            self.sbuf.write(0, tail);
        }
        let posted = if in_packet {
            if let Some(d) = self.cq.driver() {
                d.counters
                    .sock_small_in_packet
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.qp.post_send_in_packet(&wr)
        } else {
            self.qp.post_send(&wr)
        };
        posted.map_err(|e| {
            let _ = core.handle_send_completion(w.wr_id, false);
            reset(e)
        })
    }

    /// Whether the data write `w` goes in its packet on a same-host QP rather than
    /// placed (`IN_PACKET_MAX`): a small write that carries its announcement, after a
    /// read, when the stream's previous data write was small too. Notes `w` as the
    /// stream's last data write. Call under the core's lock.
    fn small_in_packet(&self, w: &DataWrite) -> bool {
        let previous = self.last_write_len.swap(w.len, Ordering::Relaxed);
        let answered = self.read_since_write.swap(false, Ordering::Relaxed);
        w.imm.is_some()
            && w.len <= IN_PACKET_MAX
            && previous <= IN_PACKET_MAX
            && answered
            && self.qp.uses_same_host()
    }

    /// One non-blocking attempt at `op`, once `ready` holds; otherwise the CQ is left armed
    /// (so the completion channel's fd turns readable when something happens) and the
    /// answer is `WouldBlock`.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn attempt<R>(
        &self,
        ready: impl Fn(&StreamCore) -> bool,
        op: impl FnOnce(&Self, &mut StreamCore) -> io::Result<R>,
    ) -> io::Result<R> {
        let mut core = self.lock();
        self.progress(&mut core)?;
        if !ready(&core) {
            // The task may sleep next: what was held back goes first.
            self.announce_now(&mut core);
            self.take_channel_events();
            self.cq.req_notify(false).map_err(io::Error::other)?;
            self.progress(&mut core)?;
            if !ready(&core) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        op(self, &mut core)
    }

    /// How many completions and connection events were handled so far.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// For a thread about to block on [`Self::wait_fds`]: it watches the device's socket
    /// too ([`DeviceWatch::fd`]) until the guard drops, and the progress thread leaves
    /// the socket to it meanwhile, so a message for this stream wakes that thread alone
    /// (it then receives it through [`Self::readiness`] or a read). `None`: the device
    /// does not hand its socket over (poll hand-off off, or inherited across `fork`).
    pub fn watch_device(&self) -> Option<DeviceWatch> {
        self.cq.driver().and_then(|d| d.watch_blocked())
    }

    /// The completion channel's fd: readable after an [`Self::attempt`] returned
    /// `WouldBlock` and something happened since.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn channel_fd(&self) -> std::os::fd::RawFd {
        self.channel.fd()
    }

    fn take_channel_events(&self) {
        let mut events = 0;
        while self.channel.try_get_event().is_some() {
            events += 1;
        }
        if events > 0 {
            self.cq.ack_events(events);
        }
    }

    /// Runs the connection until `ready` holds: spins briefly, then sleeps on the
    /// completion channel (and the id's event channel, for a disconnect). `WouldBlock` in
    /// non-blocking mode (unless `force_block`), `TimedOut` after `limit`.
    fn wait(
        &self,
        ready: impl Fn(&StreamCore) -> bool,
        limit: Option<Duration>,
        force_block: bool,
    ) -> io::Result<CoreGuard<'_>> {
        let nonblocking = self.nonblocking.load(Ordering::Relaxed) && !force_block;
        self.wait_until(ready, limit, nonblocking)
    }

    /// [`Self::wait`] with the mode given: `WouldBlock` at once when `nonblocking`.
    fn wait_until(
        &self,
        ready: impl Fn(&StreamCore) -> bool,
        limit: Option<Duration>,
        nonblocking: bool,
    ) -> io::Result<CoreGuard<'_>> {
        self.wait_until_as(ready, limit, nonblocking, Waiter::Other)
    }

    /// [`Self::wait_until`] for a data write: one that finds no room counts in the
    /// device's `sock_writes_blocked` (a writer ahead of its reader waits once per
    /// receive half it is granted).
    fn wait_to_write(&self, nonblocking: bool) -> io::Result<CoreGuard<'_>> {
        self.wait_until_as(|c| c.write_ready(), None, nonblocking, Waiter::Write)
    }

    /// [`Self::wait_until`] for data to read: a reader about to sleep may move off its
    /// bulk writer's CPU (`super::apart`).
    fn wait_to_read(&self, nonblocking: bool) -> io::Result<CoreGuard<'_>> {
        self.wait_until_as(|c| c.read_ready(), None, nonblocking, Waiter::Read)
    }

    /// [`Self::wait_until`], for the call `waiter` says.
    fn wait_until_as(
        &self,
        ready: impl Fn(&StreamCore) -> bool,
        limit: Option<Duration>,
        nonblocking: bool,
        waiter: Waiter,
    ) -> io::Result<CoreGuard<'_>> {
        // Ready already (data queued, room to send): go on without polling, as rsocket.c's
        // rsend and rrecv look at the CQ only when they cannot. A write that polled first
        // sent the ACK its thread held back for it (`crate::ack_hold`: an empty poll
        // releases it) alone, just before the write's own datagram, and paid a
        // `recvmmsg` and a `sched_yield` for nothing.
        let mut core = self.lock();
        // (A reader may find bytes placed that no message announced yet.)
        if !ready(&core) {
            self.note_placed_word(&mut core);
        }
        if ready(&core) {
            return Ok(core);
        }
        if waiter == Waiter::Write {
            if let Some(d) = self.cq.driver() {
                d.counters
                    .sock_writes_blocked
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        // A call about to wait announces what its stream held back first (as TCP pushes
        // what autocork held when the writer blocks): a writer out of room waits for the
        // reader, who can free room only by reading bytes announced to it.
        self.announce_now(&mut core);
        drop(core);
        // A blocking call's polls never yield the CPU (`crate::cq::BlockingWait`); a
        // non-blocking one's do, as the program spinning on `WouldBlock` repeats them.
        let _no_yields = (!nonblocking).then(crate::cq::BlockingWait::begin);
        let start = Instant::now();
        loop {
            let mut core = self.lock();
            // A non-blocking call is repeated by a program spinning on `WouldBlock`; a
            // blocking one spins here, or has just woken from its watch on the socket.
            self.progress_as(&mut core, true)?;
            if ready(&core) {
                return Ok(core);
            }
            if nonblocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if limit.is_some_and(|l| start.elapsed() >= l) {
                return Err(io::ErrorKind::TimedOut.into());
            }
            if start.elapsed() < SPIN {
                drop(core);
                std::hint::spin_loop();
                continue;
            }
            // The device's socket too, handed over from the progress thread while this
            // thread sleeps: the peer's message wakes this thread alone, which receives
            // it itself (the next `progress`), rather than the progress thread, which
            // would then wake this one through the completion channel. Taken before
            // arming, so arming leaves the poller hand-off alone (`req_notify_watched`).
            let watch = self.watch_device();
            // Arm, then look once more: a completion may have landed in between.
            match watch {
                Some(_) => self.cq.req_notify_watched(false),
                None => self.cq.req_notify(false),
            }
            .map_err(io::Error::other)?;
            // (A message found now has its ACK held for the answer too; if the call must
            // still sleep, what was held leaves first.)
            self.progress_as(&mut core, true)?;
            if ready(&core) {
                return Ok(core);
            }
            crate::ack_hold::release_thread_held();
            let mut sleep = WAIT_SLICE;
            if let Some(due) = core.next_keepalive() {
                sleep = sleep.min(due.saturating_sub(self.epoch.elapsed()));
            }
            drop(core);
            if waiter == Waiter::Read {
                self.step_off_writer_cpu();
            }
            let socket = watch.as_ref().map_or(-1, |w| w.fd());
            let mut fds =
                [self.channel.fd(), self.id.channel().fd(), socket].map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            let watched = if watch.is_some() { 3 } else { 2 };
            let polled = crate::sys::poll(&mut fds[..watched], Some(sleep));
            drop(watch);
            match polled {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            self.take_channel_events();
        }
    }

    pub(crate) fn read_locked(&self, core: &mut StreamCore, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            let Some(chunk) = core.recv_chunk() else {
                break;
            };
            let n = (chunk.len as usize).min(buf.len() - got);
            self.rbuf
                .read(chunk.offset as usize, &mut buf[got..got + n]);
            core.consume(n as u32);
            got += n;
            if got < buf.len() && core.recv_chunk().is_none() {
                // More may have been placed meanwhile.
                self.note_placed_word(core);
            }
        }
        self.count_ahead(core);
        if got > 0 {
            self.read_since_write.store(true, Ordering::Relaxed);
            self.keep_socket_while_busy(true);
            // Reading freed room: the peer may be waiting for a grant.
            self.post_pending(core)?;
            return Ok(got);
        }
        match core.error() {
            Some(e) if core.available() == 0 => Err(reset(e)),
            _ => Ok(0),
        }
    }

    pub(crate) fn write_locked(&self, core: &mut StreamCore, buf: &[u8]) -> io::Result<usize> {
        // Notification coalescing (`StreamCore::set_coalescing`) where a plain WRITE
        // costs no packet: same-host writes.
        core.set_coalescing(self.coalesce && self.qp.uses_same_host());
        let holding = core.would_hold();
        if holding {
            // This write would be held: unless the write in flight has completed
            // meanwhile, in which case what was held and this write go announced now. (A
            // writer that only looked when a hold began kept holding for a whole ring
            // while its reader starved: preloaded iperf3 lost a third.) The CQ is looked
            // at every time; the socket, a system call, at the first held write and once
            // per `ACK_LOOK_BYTES` held; and the busy hand-off's look, when due
            // (`Driver::busy_look_due`), is here and not at the write's end: an ACK
            // received there, after the hold, was announced by a write of its own (a
            // 1-byte `process_vm_writev` and a work request: `docs/sockets.md`, session
            // 15); received here, this write carries the announcement
            // (`StreamCore::start_data`'s merge).
            let ack_look = self.ack_look_due(core);
            self.poll_now(core, ack_look || self.busy_look_due(), ack_look);
            self.post_control(core)?;
        }
        let was_reserved = core.announcement_reserved();
        let mut last_held = None;
        let done = self.post_chunks(core, buf, |core, done, want| {
            let w = core.start_data(want)?;
            if w.imm.is_none() {
                last_held = Some(done + w.len as usize - 1);
            }
            Some(w)
        })?;
        if let Some(at) = last_held {
            core.note_held_tail_byte(buf[at]);
        }
        // (Nothing written: a due announcement must not wait for the next write.)
        if done == 0 {
            self.post_pending(core)?;
        }

        if !was_reserved && core.announcement_reserved() {
            // A hold began: the next completion, whichever thread drives the device (the
            // progress thread included), runs the channel's hook, which announces it
            // (`Coalescer::kick`) unless a call of this stream did first.
            if let Err(e) = self.cq.req_notify_for_hook() {
                tracing::debug!("rsocket: arming for the announcement failed: {e}");
                self.announce_now(core);
            }
        }
        if done > 0 {
            self.keep_socket_while_busy(!holding);
        }
        if done >= super::apart::BULK_WRITE {
            self.publish_bulk_writer();
        }
        Ok(done)
    }

    /// A same-host write in bulk tells the peer's reader where its writer runs
    /// (`super::apart`).
    fn publish_bulk_writer(&self) {
        if !self.apart || !self.qp.uses_same_host() {
            return;
        }
        if let (Some(d), Some(word)) = (self.cq.driver(), super::apart::writer_word()) {
            d.same_host.set_bulk_writer(word);
        }
    }

    /// A reader about to sleep moves off its same-host bulk writer's CPU to an idle one,
    /// if it is on the writer's (`super::apart`).
    fn step_off_writer_cpu(&self) {
        if !self.apart {
            return;
        }
        let Some(d) = self.cq.driver() else { return };
        let Some(word) = self.qp.peer_bulk_writer() else {
            return;
        };
        let counter = match super::apart::step_off_writer(word) {
            super::apart::Step::None => return,
            super::apart::Step::Looked => &d.counters.sock_cpu_looks,
            super::apart::Step::Moved => {
                d.counters.sock_cpu_looks.fetch_add(1, Ordering::Relaxed);
                &d.counters.sock_cpu_moves
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a write about to be held receives from the socket first (`ACK_LOOK_BYTES`):
    /// at the first held write (nothing held yet) and once `ACK_LOOK_BYTES`, or an eighth
    /// of the peer's ring if less, more were held since the last look. Call under the core's lock.
    fn ack_look_due(&self, core: &StreamCore) -> bool {
        let held = core.held_bytes();
        let last = self.held_at_ack_look.load(Ordering::Relaxed);
        // (Fewer held than at the last look: an announcement took them, a new hold began.)
        let every = ACK_LOOK_BYTES.min(core.peer_grant_len() / ACK_LOOK_GRANT_SHARE);
        let due = held == 0 || held < last || held - last >= every;
        if due {
            self.held_at_ack_look.store(held, Ordering::Relaxed);
        }
        due
    }

    /// Whether the device's busy hand-off would receive at the end of a write now
    /// (`Driver::busy_look_due`); same-host streams only, the ones that hold writes.
    fn busy_look_due(&self) -> bool {
        self.qp.uses_same_host() && self.cq.driver().is_some_and(|d| d.busy_look_due())
    }

    /// Posts the announcement of held data now, whatever is in flight.
    fn announce_now(&self, core: &mut StreamCore) {
        announce(&self.qp, core, true);
    }

    /// A same-host stream that moves data keeps its device's socket for its threads
    /// (`Driver::keep_handoff_busy`): in a bulk transfer the peer's messages and ACKs
    /// wait there to be received in batches, where each would wake the progress thread.
    /// `look`: it may receive, as `Driver::keep_handoff_busy` says.
    fn keep_socket_while_busy(&self, look: bool) {
        if self.qp.uses_same_host() {
            if let Some(d) = self.cq.driver() {
                d.keep_handoff_busy(look);
            }
        }
    }

    /// Posts `buf` in rsend's chunk schedule while `start(core, bytes_done, want)` grants
    /// a write (data for rsend, an iomap write for riowrite); the bytes taken. Fails at
    /// once when the stream can no longer send.
    fn post_chunks(
        &self,
        core: &mut StreamCore,
        buf: &[u8],
        mut start: impl FnMut(&mut StreamCore, usize, u32) -> Option<DataWrite>,
    ) -> io::Result<usize> {
        if !core.is_writable() {
            return Err(match core.error() {
                Some(e) => reset(e),
                None => io::Error::new(io::ErrorKind::BrokenPipe, "the stream is shut down"),
            });
        }
        let mut chunks = SendChunks::default();
        // rsend's schedule (2 KiB first, doubling) overlaps staging the send ring with the
        // transfer; the same-host path stages nothing, so one write takes all that fits.
        let whole = self.qp.uses_same_host();
        let mut done = 0;
        while done < buf.len() {
            let left = buf.len() - done;
            let want = if whole {
                u32::try_from(left).unwrap_or(u32::MAX)
            } else {
                chunks.next(left)
            };
            let Some(w) = start(core, done, want) else {
                break;
            };
            self.post_data(core, &w, &buf[done..])?;
            done += w.len as usize;
        }
        Ok(done)
    }
}

/// What a stream is ready for (`rpoll`'s view of an rsocket).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// A read would not block: data, or end of stream (`POLLIN`).
    pub readable: bool,
    /// A data write can start now (`POLLOUT`).
    pub writable: bool,
    /// The connection ended in order (`POLLHUP`).
    pub hangup: bool,
    /// The connection failed (`POLLERR`).
    pub error: bool,
}

/// A local region published to the peer for riowrite (`riomap`).
struct IomapRegion {
    mr: RawMr,
    // The peer's iomap slot it was published in (`None`: a local-only mapping).
    slot: Option<u32>,
}

/// The C rsocket calls' view of a stream: per-call blocking, peeking, readiness for
/// `rpoll`, and riomap/riowrite.
impl RdmaStream {
    /// `read` that blocks unless `nonblocking` (`MSG_DONTWAIT` or `O_NONBLOCK`); 0 at end
    /// of stream. With `peek` the bytes stay to be read again (from every message queued, as
    /// rsocket.c's `rs_peek`).
    pub fn recv_with(&self, buf: &mut [u8], nonblocking: bool, peek: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut core = self.wait_to_read(nonblocking)?;
        if !peek {
            return self.read_locked(&mut core, buf);
        }
        // A peek shows every message that arrived, so it looks at the CQ even with data
        // queued: a program that peeks until enough is there (rdmacm-abi's
        // rsocket_api.c) would otherwise never see the writes the peer held back and
        // announced later (`StreamCore::set_coalescing`).
        self.progress(&mut core)?;
        let chunks = core.peek_chunks(buf.len());
        if chunks.is_empty() {
            // Nothing queued: the end of the stream, or its failure.
            return self.read_locked(&mut core, buf);
        }
        let mut got = 0;
        for chunk in chunks {
            let n = chunk.len as usize;
            self.rbuf
                .read(chunk.offset as usize, &mut buf[got..got + n]);
            got += n;
        }
        Ok(got)
    }

    /// `write` that blocks (until at least one byte is taken) unless `nonblocking`.
    pub fn send_with(&self, buf: &[u8], nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut core = self.wait_to_write(nonblocking)?;
        self.write_locked(&mut core, buf)
    }

    /// What the stream is ready for now, after handling what arrived. With `arm`, when it
    /// is ready for nothing in `want_read`/`want_write`, the completion channel is armed
    /// first so one of [`Self::wait_fds`] turns readable when that may change.
    pub fn readiness(&self, arm: bool) -> io::Result<Readiness> {
        self.readiness_armed(arm.then_some(false))
    }

    /// [`Self::readiness`] armed, for a thread that took its watches (`watches`, from
    /// [`Self::watch_device`] of this or other streams) before arming, as `rpoll` does:
    /// when one of them is on this stream's device, arming leaves the poller hand-off
    /// alone (as a blocking read's wait does), so it does not wake the progress thread
    /// only for it to find the socket taken by the watcher and sleep again. Without such
    /// a watch, as `readiness(true)`.
    pub fn readiness_watched(&self, watches: &[DeviceWatch]) -> io::Result<Readiness> {
        let watched = self
            .cq
            .driver()
            .is_some_and(|d| watches.iter().any(|w| w.is_on(d)));
        self.readiness_armed(Some(watched))
    }

    /// `armed`: `None` not armed; `Some(watched)` armed, by a thread holding a watch on
    /// the device's socket when `watched`.
    fn readiness_armed(&self, armed: Option<bool>) -> io::Result<Readiness> {
        let mut core = self.lock();
        self.progress(&mut core)?;
        if let Some(watched) = armed {
            // The caller may sleep next (rpoll): what was held back goes first.
            self.announce_now(&mut core);
            self.take_channel_events();
            if watched {
                self.cq.req_notify_watched(false)
            } else {
                self.cq.req_notify(false)
            }
            .map_err(io::Error::other)?;
            self.progress(&mut core)?;
        }
        let ended = !core.is_connected();
        Ok(Readiness {
            readable: core.read_ready(),
            writable: core.can_send(),
            hangup: ended && core.error().is_none(),
            error: ended && core.error().is_some(),
        })
    }

    /// The fds to sleep on for a change of [`Self::readiness`] (after an armed check): the
    /// completion channel and the connection's event channel.
    pub fn wait_fds(&self) -> [std::os::fd::RawFd; 2] {
        [self.channel.fd(), self.id.channel().fd()]
    }

    /// Publishes `len` bytes at `addr` to the peer for riowrite (`riomap`) at `offset`
    /// (`None`: the address is the offset); with `writable` false the region is only
    /// registered locally. Returns the offset. `OutOfMemory` when every iomap slot the peer
    /// offers is taken.
    ///
    /// # Safety
    /// `addr..addr + len` stays valid for reads and writes until [`Self::iounmap`] or
    /// the stream's drop, and is not accessed through Rust references meanwhile (the peer
    /// writes it at any time).
    pub unsafe fn iomap_raw(
        &self,
        addr: *mut u8,
        len: usize,
        writable: bool,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        let mut access = AccessFlags::LOCAL_WRITE;
        if writable {
            access |= AccessFlags::REMOTE_WRITE;
        }
        let length = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region over 4 GiB"))?;
        let offset = offset.unwrap_or(addr as u64);
        let mut maps = self.iomaps.lock().unwrap_or_else(|p| p.into_inner());
        let mut core = self.lock();
        let slot = if writable {
            let taken: Vec<u32> = maps.iter().filter_map(|m| m.slot).collect();
            let free = (0..core.peer_iomap_slots()).find(|i| !taken.contains(i));
            Some(free.ok_or(io::ErrorKind::OutOfMemory)?)
        } else {
            None
        };
        // SAFETY: forwarded from this function's contract.
        let mr = unsafe { self._pd.reg_mr_raw(addr, len, access) }.map_err(io::Error::other)?;
        if let Some(index) = slot {
            let entry = IomapEntry {
                offset,
                sge: RsSge {
                    addr: addr as u64,
                    key: mr.rkey(),
                    length,
                },
            };
            core.queue_iomap(index, entry);
            self.post_pending(&mut core)?;
        }
        maps.push(IomapRegion { mr, slot });
        Ok(offset)
    }

    /// Unregisters the region `riomap` published at `addr` with `len` (`riounmap`; the peer
    /// is not told). `InvalidInput` when there is none.
    pub fn iounmap(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut maps = self.iomaps.lock().unwrap_or_else(|p| p.into_inner());
        let at = maps
            .iter()
            .position(|m| m.mr.addr() == addr as u64 && m.mr.len() == len)
            .ok_or(io::ErrorKind::InvalidInput)?;
        maps.remove(at);
        Ok(())
    }

    /// Writes `buf` into the peer's region mapped at `offset` (`riowrite`): a plain RDMA
    /// WRITE, no notification. Returns the bytes taken (0 when no published region covers
    /// `offset`); blocks until at least one can go unless `nonblocking`.
    pub fn iowrite_with(&self, buf: &[u8], offset: u64, nonblocking: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // The peer's iomap publications arrive as completions: look for them first (the
        // wait goes on without polling when the stream can send).
        self.progress(&mut self.lock())?;
        let mut core = self.wait_until(|c| c.write_ready(), None, nonblocking)?;
        self.post_chunks(&mut core, buf, |core, done, want| {
            core.start_riowrite(offset + done as u64, want)
        })
    }
}

impl io::Read for &RdmaStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut core = self.wait_to_read(self.nonblocking.load(Ordering::Relaxed))?;
        self.read_locked(&mut core, buf)
    }
}

impl io::Write for &RdmaStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut core = self.wait_to_write(self.nonblocking.load(Ordering::Relaxed))?;
        self.write_locked(&mut core, buf)
    }

    /// Waits until every write was delivered (completed by the peer's transport).
    fn flush(&mut self) -> io::Result<()> {
        self.announce_now(&mut self.lock());
        self.wait(|c| c.all_sends_done(), None, false).map(|_| ())
    }
}

impl io::Read for RdmaStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl io::Write for RdmaStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

impl Drop for RdmaStream {
    fn drop(&mut self) {
        let mut core = self.lock();
        let _ = self.progress(&mut core);
        if core.is_connected() {
            self.announce_now(&mut core);
            core.shutdown(softverbs_sock::Shutdown::Both);
            let _ = self.post_pending(&mut core);
        }
        drop(core);
        let _ = self
            .wait(|c| c.all_sends_done(), Some(self.linger), true)
            .map(drop);
        // The DREQ; the id's destruction (a field) finishes the disconnect.
        let _ = self.id.disconnect();
        self.cq.set_channel_hook(None);
    }
}

/// The core, locked. Unlocking it runs an announcement that a completion's hook found
/// the lock taken for ([`Coalescer::kick`]).
pub(crate) struct CoreGuard<'a> {
    guard: Option<MutexGuard<'a, StreamCore>>,
    coalescer: &'a Coalescer,
}

impl std::ops::Deref for CoreGuard<'_> {
    type Target = StreamCore;
    fn deref(&self) -> &StreamCore {
        self.guard.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut StreamCore {
        self.guard.as_mut().expect("held until drop")
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        if self.coalescer.kicked.load(Ordering::SeqCst) {
            self.coalescer.kick();
        }
    }
}

/// Announces a stream's held data (`StreamCore::poll_announcement`) when a completion
/// arrives after the hold began, whichever thread drives the device: a writer that
/// stops writing, or blocks on something else, still has its last bytes delivered.
struct Coalescer {
    core: Weak<Mutex<StreamCore>>,
    qp: Weak<Qp>,
    // A completion asked for the announcement and found the core locked: the thread
    // holding it runs `kick` when it lets go (`CoreGuard`).
    kicked: AtomicBool,
}

impl Coalescer {
    /// The completion channel's hook. Never blocks on the core: the thread that holds
    /// it sees `kicked` once it lets go (set before trying, read after unlocking, both
    /// sequentially consistent: one of the two sees the other).
    fn kick(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        loop {
            let Some(core) = self.core.upgrade() else {
                return;
            };
            let mut core = match core.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            if !self.kicked.swap(false, Ordering::SeqCst) {
                return;
            }

            if let Some(qp) = self.qp.upgrade() {
                announce(&qp, &mut core, true);
            }
            drop(core);
            // Posting may have run this hook again (and found the core taken).
            if !self.kicked.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// Posts the announcement of held data the core has due (`StreamCore::poll_announcement`:
/// with `now`, whatever is in flight), if any: a 1-byte WRITE WITH IMM, inline.
fn announce(qp: &Qp, core: &mut StreamCore, now: bool) {
    let Some(a) = core.poll_announcement(now) else {
        return;
    };
    let byte = [a.byte];
    let wr = SendWr {
        wr_id: a.wr_id,
        op: SendOp::RdmaWriteWithImm {
            remote_addr: a.remote_addr,
            rkey: Rkey(a.rkey),
            imm: a.imm,
        },
        payload: Payload::Inline(&byte),
        flags: SendFlags::SIGNALED,
    };
    if let Err(e) = qp.post_send(&wr) {
        tracing::debug!(qp = %qp.qpn(), "rsocket announcement failed: {e}");
        let _ = core.handle_send_completion(a.wr_id, false);
    }
}
