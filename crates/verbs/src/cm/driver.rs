//! The connection manager on the device: the driver's side of `softverbs-cm`.
//!
//! The device hosts one [`Cm`] beside the engine, behind the same device lock (a QP move the
//! cm asks for is an engine call). As for the engine, no system call is made under the lock:
//! [`Driver::cm_pump`] (part of every pump) applies the cm's QP transitions to the engine at
//! once and collects everything else — datagrams to send, address resolutions, group joins,
//! released ports — into the [`Deferred`] work that [`Driver::cm_finish`] carries out after
//! the lock is released; answers go back under the lock again. Events go into one ordered
//! queue and are delivered to their ids' sinks (see [`crate::cm::CmEventSink`]) by whichever
//! thread finishes a pump, under the sink table's lock, never under the device lock.
//!
//! Sockets besides the device's own (see `docs/connection-manager.md`):
//! - one *rendezvous* socket per rdma_cm address this process listens on (or bound to), read
//!   by the progress thread; what arrives goes to [`Cm::handle_datagram`] with the local
//!   address IP_PKTINFO names;
//! - one *companion* socket per address family other than the device's, to send requests to
//!   a rendezvous address of that family (an IPv6 rdma_cm address while the device is IPv4).
//!   Such a datagram carries a trailer naming the sending device ([`RELAY_TRAILER_LEN`]),
//!   since its IP source cannot.
//!
//! ICMP "port unreachable" for a request comes back through the error queue (IP_RECVERR) of
//! the socket that sent it and becomes [`Cm::handle_unreachable`].

use super::sys as cmsys;
use crate::driver::{Deferred, Driver, State};
use softverbs_cm::{
    Cm, CmConfig, CmEvent, CmEventKind, CmIdHandle, DriverRequest, IbMtu, QpAttrs, QpState,
    ResolveError, ResolvedAddr,
};
use softverbs_engine::{AccessFlags, Engine, Instant, Mtu, QpAttr, QpAttrMask};
use softverbs_wire::cm::{datagram::CmDatagram, AttributeId};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where an id's events go (see [`crate::cm::CmEventSink`]).
pub(crate) type Sink = Arc<dyn crate::cm::CmEventSink>;

/// What the cm's driver keeps outside the device lock.
pub(crate) struct CmIo {
    /// Rendezvous sockets by the address they are bound at.
    pub sockets: Mutex<Vec<(SocketAddr, Arc<UdpSocket>)>>,
    /// Bumped whenever `sockets` changes.
    pub sockets_gen: AtomicU64,
    /// The companion socket for the family the device is not (see the module docs).
    pub companion: Mutex<Option<Arc<UdpSocket>>>,
    /// Events, in the order the cm produced them, waiting for delivery.
    events: Mutex<VecDeque<CmEvent>>,
    /// Each id's sink. Held while delivering: removing a sink waits for a delivery under way.
    sinks: Mutex<HashMap<CmIdHandle, Sink>>,
    /// `Config::cm_drop`: per message type, how many more of it to drop.
    drops_left: Vec<(u16, AtomicU32)>,
}

impl CmIo {
    pub fn new(cm_drop: &[(AttributeId, u32)]) -> CmIo {
        CmIo {
            sockets: Mutex::new(Vec::new()),
            sockets_gen: AtomicU64::new(0),
            companion: Mutex::new(None),
            events: Mutex::new(VecDeque::new()),
            sinks: Mutex::new(HashMap::new()),
            drops_left: cm_drop
                .iter()
                .map(|&(kind, n)| (kind.value(), AtomicU32::new(n)))
                .collect(),
        }
    }

    /// Whether `Config::cm_drop` takes this datagram (a whole CM datagram, as the cm
    /// emits it: BTH, DETH, MAD).
    fn drop_by_type(&self, datagram: &[u8]) -> bool {
        if self.drops_left.is_empty() {
            return false;
        }
        let Ok(d) = CmDatagram::new_checked(datagram) else {
            return false;
        };
        let kind = d.mad().attribute_id();
        self.drops_left.iter().any(|(k, left)| {
            *k == kind
                && left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
        })
    }
}

/// The cm's share of a pump's deferred work.
#[derive(Default)]
pub(crate) struct CmDeferred {
    /// Datagrams to send: destination and bytes.
    tx: Vec<(SocketAddr, Vec<u8>)>,
    /// Requests only the driver can carry out without the lock.
    work: Vec<DriverRequest>,
    /// Events were queued.
    events: bool,
}

/// The driver's answers to the cm's requests, applied under the lock.
enum Answer {
    Resolved(
        softverbs_cm::RequestToken,
        Result<ResolvedAddr, ResolveError>,
    ),
    Joined(softverbs_cm::RequestToken, Result<SocketAddr, ()>),
}

/// The cm's state under the device lock.
pub(crate) struct CmState {
    pub cm: Cm,
    /// The id each cm-bound QP belongs to (COMM_EST is reported by QP).
    pub qps: HashMap<softverbs_wire::Qpn, CmIdHandle>,
    /// Why the last QP move the cm asked for on an id failed (for the call that caused it).
    pub qp_failures: HashMap<CmIdHandle, softverbs_engine::ModifyQpError>,
}

impl CmState {
    /// The cm of the device at `local` (its paths' packet life time `packet_life_time`,
    /// its `max_qp_rd_atom` READs and atomics per QP), seeded from the OS.
    pub fn new(local: SocketAddr, packet_life_time: u8, max_qp_rd_atom: u8) -> CmState {
        let mut seed = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| io::Read::read_exact(&mut f, &mut seed))
            .is_err()
        {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            seed = (t ^ u64::from(std::process::id()) << 40).to_le_bytes();
        }
        let mut config = CmConfig::new(local, CmConfig::guid_for(local), u64::from_le_bytes(seed));
        config.packet_life_time = packet_life_time;
        // What rdma_connect / rdma_accept may ask for is what ibv_query_device reports:
        // perftest's `-R` passes the device's max_qp_rd_atom as both.
        config.max_responder_resources = max_qp_rd_atom;
        config.max_initiator_depth = max_qp_rd_atom;
        CmState {
            cm: Cm::new(config),
            qps: HashMap::new(),
            qp_failures: HashMap::new(),
        }
    }
}

/// The cm's clock is the engine's.
pub(crate) fn cm_now(now: Instant) -> softverbs_cm::Instant {
    softverbs_cm::Instant::from_nanos(now.as_nanos())
}

/// Bytes after a relayed CM datagram: a marker, then the sending device's address (IPv6 or
/// IPv4-mapped) and UDP port.
pub(crate) const RELAY_TRAILER_LEN: usize = 4 + 16 + 2;
const RELAY_MARKER: [u8; 4] = *b"SVCM";

fn relay_trailer(device: SocketAddr) -> [u8; RELAY_TRAILER_LEN] {
    let mut t = [0u8; RELAY_TRAILER_LEN];
    t[..4].copy_from_slice(&RELAY_MARKER);
    let ip = match device.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    t[4..20].copy_from_slice(&ip.octets());
    t[20..].copy_from_slice(&device.port().to_be_bytes());
    t
}

/// Splits a relayed datagram into the CM datagram and the device that sent it.
fn strip_relay(data: &[u8]) -> Option<(&[u8], SocketAddr)> {
    let at = data.len().checked_sub(RELAY_TRAILER_LEN)?;
    let (body, t) = data.split_at(at);
    if t[..4] != RELAY_MARKER {
        return None;
    }
    let ip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&t[4..20]).ok()?);
    let port = u16::from_be_bytes([t[20], t[21]]);
    Some((body, SocketAddr::new(ip.to_canonical(), port)))
}

/// Whether a datagram's BTH names QP 1 (the CM's): byte 4 is reserved, 5-7 the QPN.
pub(crate) fn is_qp1(data: &[u8]) -> bool {
    data.len() >= 12 && data[5..8] == [0, 0, 1]
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The engine's view of one cm QP transition.
fn engine_attr(a: &QpAttrs) -> (QpAttr, QpAttrMask) {
    let state = match a.state {
        QpState::Init => softverbs_engine::QpState::Init,
        QpState::Rtr => softverbs_engine::QpState::Rtr,
        QpState::Rts => softverbs_engine::QpState::Rts,
        QpState::Err => softverbs_engine::QpState::Err,
    };
    let attr = QpAttr {
        qp_state: state,
        qp_access_flags: AccessFlags(a.access_flags),
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        qkey: a.qkey,
        av: a.ah.map(|ah| ah.dest),
        path_mtu: Mtu::from_bytes(a.path_mtu.bytes()).unwrap_or(Mtu::Mtu1024),
        dest_qp_num: a.dest_qpn.value(),
        rq_psn: a.rq_psn.value(),
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        sq_psn: a.sq_psn.value(),
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        ..QpAttr::default()
    };
    (attr, QpAttrMask(a.mask.0))
}

/// Moves QP `qpn` through `steps` (the cm's ModifyQp request).
fn apply_steps(
    engine: &mut Engine,
    qpn: softverbs_wire::Qpn,
    steps: &[QpAttrs],
    now: Instant,
) -> Result<(), softverbs_engine::ModifyQpError> {
    let qp = engine
        .qp_by_qpn(qpn)
        .ok_or(softverbs_engine::ModifyQpError::UnknownQp)?;
    for step in steps {
        let (attr, mask) = engine_attr(step);
        engine.modify_qp(qp, &attr, mask, now)?;
    }
    Ok(())
}

impl Driver {
    /// Drains the cm under the device lock: applies QP moves at once, defers the rest.
    pub(crate) fn cm_pump(&self, st: &mut State, now: Instant, d: &mut Deferred) {
        let t = cm_now(now);
        let c = &mut st.cm;
        loop {
            let mut moved = false;
            while let Some(req) = c.cm.poll_request() {
                match req {
                    DriverRequest::ModifyQp {
                        token,
                        id,
                        qpn,
                        steps,
                    } => {
                        let r = apply_steps(&mut st.engine, qpn, &steps, now);
                        if let Err(e) = &r {
                            c.qp_failures.insert(id, *e);
                        }
                        c.cm.handle_qp_modified(t, token, r.map_err(|_| ()));
                        moved = true;
                    }
                    other => d.cm.work.push(other),
                }
            }
            if !moved {
                break;
            }
        }
        // Taken as the cm built them: a buffer to copy into was zeroed on every pump,
        // every message's included (docs/udp-latency.md).
        while let Some(tx) = c.cm.take_transmit() {
            d.cm.tx.push(tx);
        }
        let mut events = None;
        while let Some(ev) = c.cm.poll_event() {
            events
                .get_or_insert_with(|| lock(&self.cm_io.events))
                .push_back(ev);
            d.cm.events = true;
        }
    }

    /// Tells the cm about an engine event it cares about (COMM_EST) under the lock.
    pub(crate) fn cm_engine_event(
        &self,
        st: &mut State,
        ev: &softverbs_engine::AsyncEvent,
        now: Instant,
    ) {
        if let softverbs_engine::AsyncEvent::CommEstablished(qp) = ev {
            let id = st
                .engine
                .qp_num(*qp)
                .and_then(|qpn| st.cm.qps.get(&qpn).copied());
            if let Some(id) = id {
                // Only a passive id still waiting for its RTU takes it.
                let _ = st.cm.cm.notify_established(cm_now(now), id);
            }
        }
    }

    /// Carries out the cm's deferred work after the lock is released: sends, resolutions,
    /// joins, released ports; then delivers the queued events.
    pub(crate) fn cm_finish(&self, d: CmDeferred) {
        for (dst, bytes) in &d.tx {
            self.cm_send(*dst, bytes);
        }
        let mut answers = Vec::new();
        for req in d.work {
            self.cm_request(req, &mut answers);
        }
        if !answers.is_empty() {
            let deferred = {
                let mut st = self.lock();
                let t = cm_now(self.now());
                for a in answers {
                    match a {
                        Answer::Resolved(token, r) => st.cm.cm.handle_addr_resolved(t, token, r),
                        Answer::Joined(token, r) => st.cm.cm.handle_group_joined(t, token, r),
                    }
                }
                self.pump(&mut st)
            };
            self.finish(deferred);
        }
        if d.events {
            self.cm_deliver();
        }
    }

    /// Sends one CM datagram: from the device socket when the destination is of its
    /// family, else from the companion socket with the relay trailer.
    fn cm_send(&self, dst: SocketAddr, bytes: &[u8]) {
        if self.cm_io.drop_by_type(bytes) || self.cm_dropped() {
            tracing::debug!(%dst, "fault injection drops a CM datagram");
            return;
        }
        let dst = canonical(dst);
        if dst.is_ipv4() == self.local.is_ipv4() {
            for _ in 0..4 {
                match cmsys::send_to(&self.socket, bytes, dst) {
                    // A stale port-unreachable report (see `sys::SendBatch::flush`).
                    Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
                    Err(e) => {
                        tracing::debug!(%dst, error = %e, "cannot send a CM datagram");
                        self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {
                        self.counters.tx_datagrams.fetch_add(1, Ordering::Relaxed);
                    }
                }
                break;
            }
            return;
        }
        let Some(sock) = self.companion(dst.is_ipv6()) else {
            return;
        };
        let mut relayed = Vec::with_capacity(bytes.len() + RELAY_TRAILER_LEN);
        relayed.extend_from_slice(bytes);
        relayed.extend_from_slice(&relay_trailer(self.local));
        for _ in 0..4 {
            match cmsys::send_to(&sock, &relayed, dst) {
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
                Err(e) => tracing::debug!(%dst, error = %e, "cannot relay a CM datagram"),
                Ok(_) => {}
            }
            break;
        }
    }

    /// Whether fault injection drops this CM datagram (SOFTVERBS_FAULTS loss applies to the
    /// CM's datagrams too).
    fn cm_dropped(&self) -> bool {
        self.inject_cm_loss()
    }

    /// The companion socket for `v6` destinations, made on first use.
    fn companion(&self, v6: bool) -> Option<Arc<UdpSocket>> {
        let mut c = lock(&self.cm_io.companion);
        if let Some(s) = c.as_ref() {
            return Some(Arc::clone(s));
        }
        let any = if v6 {
            SocketAddr::from(([0u16; 8], 0))
        } else {
            SocketAddr::from(([0u8; 4], 0))
        };
        match cmsys::cm_socket(any) {
            Ok(s) => {
                let s = Arc::new(s);
                crate::fork::register_socket(std::os::fd::AsRawFd::as_raw_fd(&*s));
                *c = Some(Arc::clone(&s));
                self.cm_io.sockets_gen.fetch_add(1, Ordering::AcqRel);
                self.wake_progress();
                Some(s)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open a socket to reach the other address family");
                None
            }
        }
    }

    /// One request of the cm that needs system calls.
    fn cm_request(&self, req: DriverRequest, answers: &mut Vec<Answer>) {
        match req {
            DriverRequest::ResolveAddr {
                token, src, dst, ..
            } => {
                answers.push(Answer::Resolved(token, self.resolve(src, dst)));
            }
            DriverRequest::JoinGroup {
                token,
                group,
                send_only,
                attach,
                ..
            } => {
                let endpoint = SocketAddr::new(group, crate::gid::ROCE_PORT);
                let r = match attach.filter(|_| !send_only) {
                    Some(qpn) => self.attach_group(qpn, endpoint),
                    None => Ok(()),
                };
                answers.push(Answer::Joined(token, r.map(|()| endpoint)));
            }
            DriverRequest::LeaveGroup {
                group,
                send_only,
                detach,
                ..
            } => {
                if let Some(qpn) = detach.filter(|_| !send_only) {
                    let wanted = {
                        let mut st = self.lock();
                        if let Some(qp) = st.engine.qp_by_qpn(qpn) {
                            let _ = st.engine.detach_mcast(qp, group);
                        }
                        st.engine.mcast_groups()
                    };
                    let _ = self.sync_groups(&wanted);
                }
            }
            DriverRequest::ReleasePort { addr } => {
                let mut released = Vec::new();
                lock(&self.cm_io.sockets).retain(|(a, s)| {
                    let keep = *a != addr;
                    if !keep {
                        crate::fork::unregister_socket(std::os::fd::AsRawFd::as_raw_fd(&**s));
                        released.push(s.clone());
                    }
                    keep
                });
                self.cm_io.sockets_gen.fetch_add(1, Ordering::AcqRel);
                // rdma_destroy_id frees the port before it returns (a new bind may follow at
                // once): wait until the progress thread let go of its copy, so that the
                // socket closes here.
                if !crate::driver::on_progress_thread() {
                    for sock in released {
                        self.wait_sole_owner(sock);
                    }
                }
            }
            // Handled under the lock by `cm_pump`.
            DriverRequest::ModifyQp { .. } => {}
        }
    }

    /// Address resolution: the kernel's source address for `dst`, the path MTU (capped by
    /// the device's) and the hop limit.
    fn resolve(&self, src: Option<IpAddr>, dst: IpAddr) -> Result<ResolvedAddr, ResolveError> {
        let (src_ip, link_mtu, hop_limit) =
            cmsys::probe_route(src, dst.to_canonical()).map_err(|e| match e.raw_os_error() {
                Some(libc::ENETUNREACH) => ResolveError::NetworkUnreachable,
                Some(libc::EADDRNOTAVAIL) => ResolveError::AddressNotAvailable,
                _ => ResolveError::HostUnreachable,
            })?;
        let device = IbMtu::for_link(self.active_mtu.bytes() + 96).unwrap_or(IbMtu::Mtu256);
        let mtu = IbMtu::for_link(link_mtu)
            .unwrap_or(IbMtu::Mtu256)
            .min(device);
        Ok(ResolvedAddr {
            src_ip,
            mtu,
            hop_limit,
        })
    }

    /// Attaches QP `qpn` to the group and makes the device a member.
    fn attach_group(&self, qpn: softverbs_wire::Qpn, group: SocketAddr) -> Result<(), ()> {
        let wanted = {
            let mut st = self.lock();
            let qp = st.engine.qp_by_qpn(qpn).ok_or(())?;
            st.engine.attach_mcast(qp, group).map_err(|_| ())?;
            st.engine.mcast_groups()
        };
        if self.sync_groups(&wanted).is_err() {
            let wanted = {
                let mut st = self.lock();
                if let Some(qp) = st.engine.qp_by_qpn(qpn) {
                    let _ = st.engine.detach_mcast(qp, group);
                }
                st.engine.mcast_groups()
            };
            let _ = self.sync_groups(&wanted);
            return Err(());
        }
        Ok(())
    }

    /// Delivers the queued events to their sinks (see [`crate::cm::CmEventSink`]).
    pub(crate) fn cm_deliver(&self) {
        let mut refused = Vec::new();
        {
            let mut sinks = lock(&self.cm_io.sinks);
            loop {
                let Some(ev) = lock(&self.cm_io.events).pop_front() else {
                    break;
                };
                if ev.kind == CmEventKind::ConnectRequest {
                    let parent = ev.listen_id.and_then(|l| sinks.get(&l)).cloned();
                    match parent.and_then(|s| s.deliver(&ev)) {
                        Some(child) => {
                            sinks.insert(ev.id, child);
                        }
                        None => refused.push(ev.id),
                    }
                    continue;
                }
                if let Some(s) = sinks.get(&ev.id).cloned() {
                    let _ = s.deliver(&ev);
                }
            }
        }
        for id in refused {
            let deferred = {
                let mut st = self.lock();
                let t = cm_now(self.now());
                let _ = st.cm.cm.reject(t, id, &[]);
                let _ = st.cm.cm.destroy_id(t, id);
                self.pump(&mut st)
            };
            self.finish(deferred);
        }
    }

    /// Sets (or replaces) the sink of `id`.
    pub(crate) fn cm_set_sink(&self, id: CmIdHandle, sink: Sink) {
        lock(&self.cm_io.sinks).insert(id, sink);
    }

    /// Removes the sink of `id`; when this returns no delivery to it runs or will start.
    pub(crate) fn cm_remove_sink(&self, id: CmIdHandle) {
        lock(&self.cm_io.sinks).remove(&id);
    }

    /// Waits (bounded) until the progress thread dropped its copy of `sock`, then closes it.
    fn wait_sole_owner(&self, sock: Arc<UdpSocket>) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while Arc::strong_count(&sock) > 1 && std::time::Instant::now() < until {
            self.wake_progress();
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Binds a rendezvous socket at `addr` (the cm's [`softverbs_cm::Reservation::Needed`]);
    /// IPv6 only with `v6only` (the id's AF-only option).
    pub(crate) fn cm_bind_rendezvous(&self, addr: SocketAddr, v6only: bool) -> io::Result<()> {
        let sock = cmsys::cm_socket_with(addr, v6only)?;
        crate::fork::register_socket(std::os::fd::AsRawFd::as_raw_fd(&sock));
        lock(&self.cm_io.sockets).push((addr, Arc::new(sock)));
        self.cm_io.sockets_gen.fetch_add(1, Ordering::AcqRel);
        self.wake_progress();
        Ok(())
    }

    /// Reads what waits on the rendezvous sockets and the companion's error queue; called
    /// by the progress thread.
    pub(crate) fn cm_receive(&self, socks: &[(SocketAddr, Arc<UdpSocket>)], buf: &mut [u8]) {
        let mut got: Vec<(SocketAddr, SocketAddr, Vec<u8>)> = Vec::new();
        let mut refused: Vec<SocketAddr> = Vec::new();
        for (bound, sock) in socks {
            // Bounded per call, so one busy socket cannot starve the device's.
            for _ in 0..64 {
                match cmsys::recv_from_to(sock, buf) {
                    Ok(None) => break,
                    Ok(Some((0, _, _))) => continue,
                    Ok(Some((n, src, local))) => {
                        let data = &buf[..n];
                        let (data, src) = match strip_relay(data) {
                            Some((body, device)) => (body, device),
                            None => (data, canonical(src)),
                        };
                        let local = local.unwrap_or(bound.ip());
                        let local = SocketAddr::new(local.to_canonical(), bound.port());
                        if is_qp1(data) {
                            got.push((src, local, data.to_vec()));
                        }
                    }
                    Err(_) => {
                        refused.extend(cmsys::drain_errors(sock));
                        break;
                    }
                }
            }
        }
        if let Some(c) = lock(&self.cm_io.companion).clone() {
            refused.extend(cmsys::drain_errors(&c));
        }
        if !got.is_empty() {
            // What a peer sent to the device socket before a CM message to a rendezvous
            // socket goes first: an ACK its disconnect followed at once must not be
            // overtaken by the DREQ, which would flush a SEND the peer had received.
            self.receive_pending();
        }
        self.cm_input(got, refused);
    }

    /// The device socket reported an error: read its error queue.
    pub(crate) fn cm_device_errors(&self) {
        let refused = cmsys::drain_errors(&self.socket);
        self.cm_input(Vec::new(), refused);
    }

    fn cm_input(&self, got: Vec<(SocketAddr, SocketAddr, Vec<u8>)>, refused: Vec<SocketAddr>) {
        if got.is_empty() && refused.is_empty() {
            return;
        }
        let deferred = {
            let mut st = self.lock();
            let t = cm_now(self.now());
            for (src, local, data) in &got {
                st.cm.cm.handle_datagram(t, *src, *local, data);
            }
            for dst in refused {
                st.cm.cm.handle_unreachable(t, dst);
            }
            self.pump(&mut st)
        };
        self.finish(deferred);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_trailer_round_trips() {
        let dev: SocketAddr = "127.83.1.2:4791".parse().unwrap();
        let mut d = vec![7u8; 20];
        d.extend_from_slice(&relay_trailer(dev));
        let (body, from) = strip_relay(&d).unwrap();
        assert_eq!((body, from), (&[7u8; 20][..], dev));
        assert!(strip_relay(&[0u8; 30]).is_none());
        assert!(strip_relay(&[0u8; 3]).is_none());
        let v6: SocketAddr = "[::1]:4791".parse().unwrap();
        let mut e = vec![1u8; 4];
        e.extend_from_slice(&relay_trailer(v6));
        assert_eq!(strip_relay(&e).unwrap().1, v6);
    }

    #[test]
    fn qp1_is_recognised() {
        let mut bth = [0u8; 12];
        bth[7] = 1;
        assert!(is_qp1(&bth));
        bth[6] = 1;
        assert!(!is_qp1(&bth));
        assert!(!is_qp1(&[0, 0, 0, 0, 0, 0, 0, 1]));
    }
}
