//! The UDP driver: runs one engine over one socket.
//!
//! A progress thread receives datagrams, feeds them to the engine, fires its
//! timers and sends what it produces, so one-sided operations complete while the
//! target application does nothing. Threads that post work transmit what the
//! post produced themselves (doorbell style) and only wake the progress thread
//! when they armed a timer earlier than the one it sleeps for.
//!
//! Threads that poll an empty CQ also receive (see [`Driver::try_progress`]): an
//! application spinning on its CQ then handles its own datagrams at once instead
//! of waiting for the progress thread to be scheduled, which on a busy machine
//! (every core taken by spinning pollers) costs a scheduler tick. One receive
//! buffer, behind its own lock, serves both, so datagrams are handed to the
//! engine in the order the socket gave them.

use crate::config::Config;
use crate::faults::{Fate, FaultInjector};
use crate::sys::{self, EventFd, RecvBatch, SendBatch};
use softverbs_engine::{
    AsyncEvent, CqHandle, Engine, EngineConfig, Instant, Mtu, Transmit, MAX_DATAGRAM,
};
use softverbs_wire::pcap::PcapWriter;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::io::BufWriter;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Datagrams the kernel refused to send (e.g. unreachable destination).
    pub tx_errors: AtomicU64,
    /// Datagrams dropped by fault injection.
    pub injected_drops: AtomicU64,
    /// Datagrams too large for a receive buffer.
    pub rx_truncated: AtomicU64,
}

/// A completion channel's shared part: CQs whose notification fired, and the fd
/// that counts them.
pub(crate) struct ChannelShared {
    pub fd: EventFd,
    pub fired: Mutex<VecDeque<CqHandle>>,
}

/// Everything behind the engine lock.
pub(crate) struct State {
    pub engine: Engine,
    tx: SendBatch,
    faults: Option<FaultInjector>,
    held: Option<(Transmit, Vec<u8>)>,
    pub channels: HashMap<CqHandle, Arc<ChannelShared>>,
    pub async_events: VecDeque<AsyncEvent>,
    pcap: Option<PcapWriter<BufWriter<File>>>,
    /// One socket per multicast group a QP of this device is attached to; see
    /// [`Driver::sync_groups`].
    groups: Vec<(SocketAddr, Arc<UdpSocket>)>,
    /// When the last datagram reached the engine (see [`Driver::linger`]).
    last_rx: Instant,
}

impl State {
    /// Records one datagram in the capture file, if capturing.
    fn capture(&mut self, src: SocketAddr, dst: SocketAddr, ipv4_id: u16, data: &[u8]) {
        if let Some(w) = self.pcap.as_mut() {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            if let Err(e) = w.write_udp(ts, src, dst, ipv4_id, data) {
                tracing::warn!(error = %e, "packet capture failed; capture stops");
                self.pcap = None;
            }
        }
    }

    /// Flushes the capture file.
    pub fn flush_capture(&mut self) {
        if let Some(w) = self.pcap.as_mut() {
            let _ = w.flush();
        }
    }
}

pub(crate) struct Driver {
    state: Mutex<State>,
    socket: UdpSocket,
    /// The receive buffers; whoever holds them receives. Taken before `state`.
    rx: Mutex<RecvBatch>,
    pub local: SocketAddr,
    epoch: std::time::Instant,
    wake: EventFd,
    /// Nanoseconds since `epoch` until which the progress thread sleeps.
    sleeping_until: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub counters: DriverCounters,
    pub async_fd: EventFd,
    busy_poll: Duration,
    /// The port's active MTU: the configured one, capped to fit the link.
    pub active_mtu: Mtu,
    warned_tx_error: AtomicBool,
    /// When the counters were last published, and what they were.
    published_at: AtomicU64,
    published: Mutex<Option<softverbs_engine::Counters>>,
    /// Bumped whenever the set of multicast group sockets changes.
    groups_gen: AtomicU64,
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The configured address and port could not be bound (in use, not local...).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// No free port was found in the softverbs range.
    #[error("no free UDP port in 20000-49151 on {0}")]
    NoFreePort(std::net::IpAddr),
    /// Another system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn bind(config: &Config) -> Result<UdpSocket, OpenError> {
    if let Some(port) = config.port {
        let addr = SocketAddr::new(config.addr, port);
        return UdpSocket::bind(addr).map_err(|source| OpenError::Bind { addr, source });
    }
    // Ports 20000-49151 so that the port can double as a LID (unicast LIDs end at
    // 0xBFFF). Start at a pseudo-random place to spread processes.
    let start = (std::process::id() as u64).wrapping_mul(2_654_435_761) ^ now_nanos_seed();
    let span = 49151 - 20000 + 1;
    for i in 0..256u64 {
        let port = 20000 + ((start.wrapping_add(i.wrapping_mul(7919))) % span) as u16;
        if let Ok(s) = UdpSocket::bind(SocketAddr::new(config.addr, port)) {
            return Ok(s);
        }
    }
    Err(OpenError::NoFreePort(config.addr))
}

fn now_nanos_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

impl Driver {
    pub fn open(config: Config) -> Result<Arc<Driver>, OpenError> {
        let socket = bind(&config)?;
        let io_err = |what| move |source| OpenError::Io { what, source };
        let local = socket.local_addr().map_err(io_err("local_addr"))?;
        sys::set_dont_fragment(&socket, local.is_ipv6()).map_err(io_err("IP_MTU_DISCOVER"))?;
        sys::set_buffers(&socket, 8 << 20);
        if let std::net::IpAddr::V4(ip) = local.ip() {
            // Multicast sends leave through this device's interface (`lo` for
            // 127.0.0.1), so they reach the group's members on this host.
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
        let mut ecfg = EngineConfig::new(local);
        ecfg.icrc = config.icrc;
        ecfg.port_mtu = active_mtu;
        let state = State {
            engine: Engine::new(ecfg),
            // Fault injection acts on the datagrams of a batch before it is grouped
            // for GSO, so GSO stays on with faults (the default path is the one tested).
            tx: SendBatch::new(MAX_DATAGRAM, config.gso),
            faults: config.faults.map(FaultInjector::new),
            held: None,
            channels: HashMap::new(),
            async_events: VecDeque::new(),
            pcap,
            groups: Vec::new(),
            last_rx: Instant::from_nanos(0),
        };
        let rx = RecvBatch::new(if gro { sys::GRO_BUF } else { MAX_DATAGRAM + 64 });
        let driver = Arc::new(Driver {
            state: Mutex::new(state),
            socket,
            rx: Mutex::new(rx),
            local,
            epoch: std::time::Instant::now(),
            wake: EventFd::new(true, false).map_err(io_err("eventfd"))?,
            sleeping_until: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            counters: DriverCounters::default(),
            async_fd: EventFd::new(false, true).map_err(io_err("eventfd"))?,
            busy_poll: config.busy_poll,
            active_mtu,
            warned_tx_error: AtomicBool::new(false),
            published_at: AtomicU64::new(0),
            published: Mutex::new(None),
            groups_gen: AtomicU64::new(0),
        });
        let for_thread = Arc::clone(&driver);
        let handle = std::thread::Builder::new()
            .name(format!("softverbs-{}", local.port()))
            .spawn(move || progress_thread(for_thread))
            .map_err(io_err("spawn progress thread"))?;
        *driver.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        // The port is up from here on (IBA 14.2.5.2: a port that reaches Active
        // reports it as an asynchronous event).
        driver.lock().async_events.push_back(AsyncEvent::PortActive);
        driver.async_fd.signal();
        tracing::debug!(%local, "softverbs device open");
        Ok(driver)
    }

    /// The engine's current time.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Locks the engine.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends everything the engine has to send, then makes sure the progress
    /// thread will wake for the engine's next deadline. Call with the lock held,
    /// after any verbs call that may have produced work.
    pub fn pump(&self, st: &mut State) {
        let now = self.now();
        self.transmit(st, now);
        self.dispatch(st);
        if let Some(deadline) = st.engine.poll_timeout() {
            if deadline.as_nanos() < self.sleeping_until.load(Ordering::Acquire) {
                self.wake.signal();
            }
        }
    }

    fn transmit(&self, st: &mut State, now: Instant) {
        while let Some(t) = st.engine.poll_transmit(now, st.tx.next_buf()) {
            st.tx.commit(t);
            if st.tx.is_full() {
                self.flush(st);
            }
        }
        self.flush(st);
    }

    /// Sends the batch: fault injection decides each datagram's fate first (so
    /// faults act on the GSO segments the batch then forms), the batch seals each
    /// datagram for its place (see [`SendBatch::seal`]), corruption flips a bit of a
    /// sealed one, and what fault injection duplicated or held back goes out after
    /// the batch, alone (IPv4 ID 0).
    fn flush(&self, st: &mut State) {
        if st.tx.is_empty() {
            return;
        }
        let mut extra: Vec<(Transmit, Vec<u8>)> = Vec::new();
        let mut corrupt: Vec<(usize, usize, u8)> = Vec::new();
        if let Some(faults) = st.faults.as_mut() {
            // Index each kept datagram will have once the dropped ones are gone.
            let mut kept = 0;
            for (t, buf, len, _) in st.tx.iter_mut() {
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
                        if let Some(prev) = st.held.replace((t, buf[..*len].to_vec())) {
                            extra.push(prev);
                        }
                        *len = 0;
                    }
                }
            }
            // Held datagrams go out after this batch.
            if let Some(h) = st.held.take() {
                extra.push(h);
            }
        }
        st.tx.seal();
        if !corrupt.is_empty() {
            let mut datagrams: Vec<(&mut Vec<u8>, usize)> = st
                .tx
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
        if st.pcap.is_some() {
            let mut frames: Vec<(Transmit, Vec<u8>, u16)> = Vec::new();
            for (t, buf, len, id) in st.tx.iter_mut() {
                frames.push((t, buf[..*len].to_vec(), id));
            }
            frames.extend(extra.iter().map(|(t, data)| (*t, data.clone(), 0)));
            for (t, data, id) in frames {
                st.capture(t.src, t.dst, id, &data);
            }
        }
        let n = st.tx.iter_mut().count() as u64;
        let errors = st.tx.flush(&self.socket) as u64;
        for (t, data) in extra {
            let _ = self.socket.send_to(&data, t.dst);
        }
        self.counters
            .tx_datagrams
            .fetch_add(n - errors.min(n), Ordering::Relaxed);
        self.counters.tx_errors.fetch_add(errors, Ordering::Relaxed);
        if errors > 0 && !self.warned_tx_error.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                local = %self.local,
                error = %io::Error::last_os_error(),
                "the kernel refused to send {errors} datagram(s); is the path MTU larger than the link's?"
            );
        }
    }

    /// Hands CQ notifications to completion channels and async events to the
    /// async queue.
    fn dispatch(&self, st: &mut State) {
        while let Some(cq) = st.engine.poll_cq_notification() {
            if let Some(ch) = st.channels.get(&cq) {
                ch.fired
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_back(cq);
                ch.fd.signal();
            }
        }
        while let Some(ev) = st.engine.poll_event() {
            st.async_events.push_back(ev);
            self.async_fd.signal();
        }
    }

    /// Makes the device's multicast sockets match the groups the engine's QPs
    /// are attached to: joins new groups (one socket per group, see
    /// [`sys::multicast_socket`]; the progress thread reads them and hands what
    /// arrives to [`Engine::handle_multicast_datagram`]) and leaves groups no
    /// QP is attached to any more. Only IPv4 groups can be joined.
    pub fn sync_groups(&self, st: &mut State) -> io::Result<()> {
        let wanted = st.engine.mcast_groups();
        let before = st.groups.len();
        st.groups.retain(|(g, _)| wanted.contains(g));
        let mut changed = st.groups.len() != before;
        let mut result = Ok(());
        for group in wanted {
            if st.groups.iter().any(|(g, _)| *g == group) {
                continue;
            }
            let iface = match self.local.ip() {
                std::net::IpAddr::V4(ip) => ip,
                std::net::IpAddr::V6(_) => std::net::Ipv4Addr::UNSPECIFIED,
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
                    st.groups.push((group, Arc::new(sock)));
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

    /// Receives what waits on the socket (one batch) and hands it to the engine;
    /// returns how many reads there were.
    fn receive(&self, rx: &mut RecvBatch) -> usize {
        let got = match rx.recv(&self.socket) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "recvmmsg failed");
                0
            }
        };
        if got == 0 {
            return 0;
        }
        self.counters
            .rx_datagrams
            .fetch_add(got as u64, Ordering::Relaxed);
        let mut st = self.lock();
        let now = self.now();
        st.last_rx = now;
        self.for_each_datagram(rx, got, |src, k, data| {
            st.capture(src, self.local, k, data);
            st.engine.handle_datagram_with_ipv4_id(now, src, data, k);
        });
        st.engine.handle_timeout(now);
        self.pump(&mut st);
        let _ = self.publish_counters(&st);
        got
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
    pub fn try_progress(&self) -> bool {
        match self.rx.try_lock() {
            Ok(mut rx) => self.receive(&mut rx) > 0,
            Err(_) => false,
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
            let mut st = self.lock();
            let now = self.now();
            self.for_each_datagram(rx, got, |src, _, data| {
                st.capture(src, *group, 0, data);
                st.engine.handle_multicast_datagram(now, src, *group, data);
            });
            st.engine.handle_timeout(now);
            self.pump(&mut st);
        }
        total
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
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

    /// The longest a closing device stays up for a peer's retransmissions.
    const MAX_LINGER: Duration = Duration::from_secs(1);
}

/// Stops the progress thread when the last user handle goes away.
pub(crate) struct DriverHandle(pub Arc<Driver>);

impl Drop for DriverHandle {
    fn drop(&mut self) {
        let on_progress_thread = self
            .0
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|h| h.thread().id() == std::thread::current().id());
        // The progress thread answers during the linger: it cannot be the one waiting.
        if !on_progress_thread {
            self.0.linger();
        }
        self.0.stop();
        let handle = self
            .0
            .thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        self.0.lock().flush_capture();
        crate::published::unpublish(self.0.local);
    }
}

fn progress_thread(d: Arc<Driver>) {
    // The multicast group sockets, refreshed when `groups_gen` moves.
    let mut groups: Vec<(SocketAddr, Arc<UdpSocket>)> = Vec::new();
    let mut groups_seen = 0;
    let mut mc_rx: Option<RecvBatch> = None;
    while !d.stop.load(Ordering::Acquire) {
        let gen = d.groups_gen.load(Ordering::Acquire);
        if gen != groups_seen {
            groups_seen = gen;
            groups = d.lock().groups.clone();
        }
        let mc_got = if groups.is_empty() {
            0
        } else {
            let rx = mc_rx.get_or_insert_with(|| RecvBatch::new(MAX_DATAGRAM + 64));
            d.receive_groups(&groups, rx)
        };
        // Receive whatever is there (a poller may be doing the same: then the
        // lock waits for it, and the next read finds what it left).
        let got = {
            let mut rx = d.rx.lock().unwrap_or_else(|e| e.into_inner());
            let mut got = d.receive(&mut rx);
            if got == 0 && !d.busy_poll.is_zero() {
                let until = std::time::Instant::now() + d.busy_poll;
                while got == 0 && std::time::Instant::now() < until {
                    got = d.receive(&mut rx);
                    std::hint::spin_loop();
                }
            }
            got
        };
        if got > 0 {
            continue;
        }
        if mc_got > 0 {
            continue;
        }
        // Nothing to read: run timers, then sleep until the next deadline, a
        // datagram or a wake-up. The sleep deadline is published under the lock,
        // so a poster that arms an earlier timer afterwards sees it and wakes us.
        let timeout = {
            let mut st = d.lock();
            let now = d.now();
            st.engine.handle_timeout(now);
            d.transmit(&mut st, now);
            d.dispatch(&mut st);
            st.flush_capture();
            let republish = d.publish_counters(&st);
            let deadline = st.engine.poll_timeout();
            d.sleeping_until.store(
                deadline.map_or(u64::MAX, |t| t.as_nanos()),
                Ordering::Release,
            );
            let timer = deadline.map(|t| t.saturating_duration_since(now));
            match (timer, republish) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        let fds: Vec<std::os::fd::RawFd> = [d.socket_fd(), d.wake.raw()]
            .into_iter()
            .chain(groups.iter().map(|(_, s)| {
                use std::os::fd::AsRawFd;
                s.as_raw_fd()
            }))
            .collect();
        let _ = sys::poll_readable(&fds, timeout);
        d.wake.take();
        d.sleeping_until.store(0, Ordering::Release);
    }
}

impl Driver {
    /// Publishes the counters for `softverbs stat` when they changed, at most
    /// every 100 ms. Returns how soon to call again when a change
    /// is still waiting to be published.
    fn publish_counters(&self, st: &State) -> Option<Duration> {
        const EVERY: u64 = 100_000_000;
        let c = st.engine.counters();
        if Some(c) == *self.published.lock().unwrap_or_else(|e| e.into_inner()) {
            return None;
        }
        let now = self.now().as_nanos();
        let last = self.published_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EVERY {
            return Some(Duration::from_nanos(EVERY - now.saturating_sub(last)));
        }
        self.published_at.store(now.max(1), Ordering::Relaxed);
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
        let mut lines: Vec<(&str, u64)> = c.named().to_vec();
        let dc = &self.counters;
        lines.push(("udp_tx_datagrams", dc.tx_datagrams.load(Ordering::Relaxed)));
        lines.push(("udp_rx_datagrams", dc.rx_datagrams.load(Ordering::Relaxed)));
        lines.push(("udp_tx_errors", dc.tx_errors.load(Ordering::Relaxed)));
        lines.push(("injected_drops", dc.injected_drops.load(Ordering::Relaxed)));
        lines.push(("rx_truncated", dc.rx_truncated.load(Ordering::Relaxed)));
        if let Err(e) = crate::published::publish(self.local, &lines) {
            tracing::debug!(error = %e, "cannot publish counters");
        }
        None
    }

    fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }
}
