//! The connection manager: rdma_cm ids, their IB CM connections, and the queues the
//! driver drains. The protocol work lives in the sibling modules (`active`,
//! `passive`, `disconnect`, `sidr`, `recv`, `qp`, `mcast`), each an `impl Cm` block.

use crate::bind::{clash, normalize};
use crate::config::CmConfig;
use crate::conn::IbConn;
use crate::error::CmError;
use crate::event::{CmEvent, CmEventKind, EventParam, EventStatus};
use crate::handle::{CmIdHandle, Slab};
use crate::id::{IdRecord, PendingReservation};
use crate::request::{CmTransmit, DriverRequest, RequestToken, Reservation};
use crate::rng::Rng;
use crate::time::Instant;
use crate::timers::Timers;
use crate::types::{IdOptions, IdState, PortSpace, QpBinding, QpType};
use softverbs_wire::cm::datagram::{self, CM_DATAGRAM_LEN};
use softverbs_wire::cm::CmMadRepr;
use softverbs_wire::icrc::IcrcContext;
use softverbs_wire::{Psn, Qpn};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum TimerKey {
    /// A connection's retransmission or timewait.
    Conn(u32),
    /// An outstanding SIDR_REQ.
    SidrOut(u32),
    /// How long a SIDR request is remembered, to answer duplicates.
    SidrIn(SocketAddr, u32),
    /// Address resolution giving up.
    Resolve(RequestToken),
}

/// What an answer from the driver is awaited for.
#[derive(Debug, Clone)]
pub(crate) enum Pending {
    Resolve(CmIdHandle),
    Qp(crate::qp::Continuation),
    Join(CmIdHandle),
}

/// Counts of what the cm did and refused; for tests, `softverbs stat` and debugging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounters {
    /// Datagrams handed to [`Cm::handle_datagram`].
    pub rx_datagrams: u64,
    /// Datagrams queued for sending.
    pub tx_datagrams: u64,
    /// Of those, retransmissions (REQ, REP, DREQ, SIDR_REQ after a timeout).
    pub retransmits: u64,
    /// Dropped: not a well-formed QP1 datagram.
    pub drop_malformed: u64,
    /// Dropped: bad ICRC.
    pub drop_icrc: u64,
    /// Accepted although the ICRC did not match (policy `CountOnly`).
    pub icrc_mismatch_accepted: u64,
    /// Dropped: a MAD that is not a supported CM message (other classes, LAP, ...).
    pub drop_not_cm: u64,
    /// Dropped: a message for no connection, or one its state does not take.
    pub drop_unmatched: u64,
    /// Dropped: a message for a connection, from an address that is not its peer.
    pub drop_wrong_source: u64,
    /// Duplicates recognised (and answered or dropped as CM.md 3.4 says).
    pub duplicates: u64,
    /// Stale connections detected (REJ 10 sent).
    pub stale: u64,
    /// Requests dropped because the listener's backlog was full.
    pub backlog_drops: u64,
}

/// One IB connection as [`Cm::connections`] shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Its IB CM state.
    pub state: crate::conn::IbState,
    /// The id it belongs to, if that id is alive.
    pub id: Option<CmIdHandle>,
    /// Whether this side sent the REQ.
    pub active: bool,
}

/// The connection manager of one softverbs device: IB CM state machines for both
/// sides, rdma_cm over IP on top, no I/O (see the crate documentation for how a
/// driver runs it).
pub struct Cm {
    pub(crate) config: CmConfig,
    pub(crate) rng: Rng,
    pub(crate) ids: Slab<IdRecord>,
    pub(crate) conns: HashMap<u32, IbConn>,
    /// Passive connections by (remote comm ID, remote CA GUID): duplicate REQs.
    pub(crate) by_remote: HashMap<(u32, u64), u32>,
    /// Live connections by (remote QPN, remote CA GUID): stale REQs and REPs.
    pub(crate) by_remote_qp: HashMap<(Qpn, u64), u32>,
    pub(crate) sidr_out: HashMap<u32, crate::sidr::SidrOut>,
    pub(crate) sidr_in: HashMap<(SocketAddr, u32), crate::sidr::SidrIn>,
    /// Rendezvous ports held, with how many ids hold each.
    pub(crate) reservations: HashMap<SocketAddr, u32>,
    pub(crate) timers: Timers<TimerKey>,
    pub(crate) pending: HashMap<RequestToken, Pending>,
    next_token: u64,
    tid_counter: u32,
    tx_psn: u32,
    transmits: VecDeque<(SocketAddr, Vec<u8>)>,
    events: VecDeque<CmEvent>,
    requests: VecDeque<DriverRequest>,
    pub(crate) counters: CmCounters,
}

impl Cm {
    /// A cm for the device `config.device`.
    pub fn new(config: CmConfig) -> Cm {
        let rng = Rng::new(config.seed);
        Cm {
            config,
            rng,
            ids: Slab::new(),
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_remote_qp: HashMap::new(),
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            reservations: HashMap::new(),
            timers: Timers::new(),
            pending: HashMap::new(),
            next_token: 1,
            tid_counter: 0,
            tx_psn: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            requests: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    /// The counters so far.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// How many IB connections the cm keeps (including ones in timewait or owed a
    /// reply after their id was destroyed).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// The IB connections the cm keeps, for diagnostics: each one's state and the id
    /// it belongs to (`None` once that id was destroyed and the connection only
    /// finishes its DREQ or timewait).
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        self.conns
            .values()
            .map(|c| ConnectionInfo {
                state: c.state,
                id: c.owner,
                active: c.active,
            })
            .collect()
    }

    /// How many rdma_cm ids are alive.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    // ----- ids -----

    /// Creates an id in port space `ps` (`rdma_create_id`). TCP ids are RC and UDP
    /// ids UD; IB ids take `qp_type`; IPoIB is refused (it needs an IPoIB device).
    pub fn create_id(&mut self, ps: PortSpace, qp_type: QpType) -> Result<CmIdHandle, CmError> {
        let qp_type = match (ps, qp_type) {
            (PortSpace::Tcp, QpType::Rc) | (PortSpace::Udp, QpType::Ud) | (PortSpace::Ib, _) => {
                qp_type
            }
            (PortSpace::Ipoib, _) => {
                return Err(CmError::Unsupported("RDMA_PS_IPOIB needs an IPoIB device"))
            }
            _ => {
                return Err(CmError::InvalidArgument(
                    "QP type does not fit the port space",
                ))
            }
        };
        Ok(self.ids.insert(IdRecord::new(ps, qp_type)))
    }

    pub(crate) fn id(&self, id: CmIdHandle) -> Result<&IdRecord, CmError> {
        self.ids.get(id).ok_or(CmError::UnknownId)
    }

    pub(crate) fn id_mut(&mut self, id: CmIdHandle) -> Result<&mut IdRecord, CmError> {
        self.ids.get_mut(id).ok_or(CmError::UnknownId)
    }

    /// The id's state.
    pub fn state(&self, id: CmIdHandle) -> Result<IdState, CmError> {
        Ok(self.id(id)?.state)
    }

    /// The id's local address (`rdma_get_local_addr`); the IP is unspecified for a
    /// wildcard bind.
    pub fn local_addr(&self, id: CmIdHandle) -> Result<Option<SocketAddr>, CmError> {
        Ok(self.id(id)?.local)
    }

    /// The id's peer: IP address and rdma_cm port (`rdma_get_peer_addr`).
    pub fn peer_addr(&self, id: CmIdHandle) -> Result<Option<SocketAddr>, CmError> {
        Ok(self.id(id)?.peer)
    }

    /// The id's port space.
    pub fn port_space(&self, id: CmIdHandle) -> Result<PortSpace, CmError> {
        Ok(self.id(id)?.ps)
    }

    /// The id's QP type.
    pub fn qp_type(&self, id: CmIdHandle) -> Result<QpType, CmError> {
        Ok(self.id(id)?.qp_type)
    }

    /// The QP tied to the id.
    pub fn qp(&self, id: CmIdHandle) -> Result<Option<QpBinding>, CmError> {
        Ok(self.id(id)?.qp)
    }

    /// The id's options.
    pub fn options(&self, id: CmIdHandle) -> Result<IdOptions, CmError> {
        Ok(self.id(id)?.options)
    }

    /// Sets the id's options (`rdma_set_option`): TOS and ACK timeout take effect
    /// for routes resolved afterwards; reuse-address and AF-only only before bind.
    pub fn set_options(&mut self, id: CmIdHandle, options: IdOptions) -> Result<(), CmError> {
        let rec = self.id_mut(id)?;
        let binding_changes =
            options.reuse_addr != rec.options.reuse_addr || options.afonly != rec.options.afonly;
        if binding_changes && rec.local.is_some() {
            return Err(CmError::InvalidState {
                op: "setting reuse-address or AF-only",
                state: rec.state,
            });
        }
        rec.options = options;
        Ok(())
    }

    // ----- binding -----

    /// Binds the id to `addr` (`rdma_bind_addr`). Port 0 picks a free ephemeral port
    /// (checked within this process only; such an id needs no socket until it
    /// listens). A nonzero port must be reserved by the driver: see [`Reservation`].
    /// Clashes with this process's other ids fail with [`CmError::AddrInUse`] at once.
    pub fn bind_addr(&mut self, id: CmIdHandle, addr: SocketAddr) -> Result<Reservation, CmError> {
        let addr = normalize(addr);
        let rec = self.id(id)?;
        if rec.state != IdState::Idle || rec.local.is_some() {
            return Err(CmError::InvalidState {
                op: "bind",
                state: rec.state,
            });
        }
        if addr.ip().is_multicast() {
            return Err(CmError::InvalidArgument(
                "cannot bind to a multicast address",
            ));
        }
        let port = if addr.port() == 0 {
            self.ephemeral_port(id, addr.ip())?
        } else {
            self.check_port(id, addr.ip(), addr.port(), false)?;
            addr.port()
        };
        let local = SocketAddr::new(addr.ip(), port);
        let rec = self.id_mut(id)?;
        rec.local = Some(local);
        rec.ephemeral_port = addr.port() == 0;
        rec.state = IdState::AddrBound;
        if addr.port() == 0 {
            return Ok(Reservation::NotNeeded);
        }
        Ok(self.reserve(id, PendingReservation::new(local, IdState::Idle, true)))
    }

    /// The driver's answer to a [`Reservation::Needed`]: whether the rendezvous
    /// socket could be bound. `false` undoes the bind or listen and returns
    /// [`CmError::AddrInUse`] (see [`Self::reservation_taken`] for a port in use).
    pub fn complete_reservation(&mut self, id: CmIdHandle, granted: bool) -> Result<(), CmError> {
        let rec = self.id_mut(id)?;
        let Some(p) = rec.pending_reservation.take() else {
            return Err(CmError::InvalidArgument("no reservation is pending"));
        };
        if granted {
            rec.reservation = Some(p.addr);
            *self.reservations.entry(p.addr).or_insert(0) += 1;
            return Ok(());
        }
        rec.state = p.state_before;
        rec.backlog = None;
        if p.was_unbound {
            rec.local = None;
        }
        Err(CmError::AddrInUse)
    }

    /// The driver's answer to a [`Reservation::Needed`] whose bind failed with
    /// EADDRINUSE. For a port the cm chose (the id was bound to port 0, or implicitly)
    /// it takes another free one and asks for that: the cm's ephemeral range is the
    /// kernel's, so a socket another process (or this one) bound at port 0 may hold the
    /// port it picked, and Linux's bind at port 0 never fails for a taken port while
    /// free ones remain (ip(7), `ip_local_port_range`). After
    /// [`Self::EPHEMERAL_TRIES`] such ports, or for a port the application named, it is
    /// [`Self::complete_reservation`]`(id, false)`.
    pub fn reservation_taken(&mut self, id: CmIdHandle) -> Result<Reservation, CmError> {
        let rec = self.id_mut(id)?;
        let (ephemeral, Some(p)) = (rec.ephemeral_port, rec.pending_reservation) else {
            return Err(CmError::InvalidArgument("no reservation is pending"));
        };
        if !ephemeral || p.refused_ephemeral + 1 >= Self::EPHEMERAL_TRIES {
            return self
                .complete_reservation(id, false)
                .map(|()| Reservation::NotNeeded);
        }
        let ip = p.addr.ip();
        let port = self.ephemeral_port(id, ip)?;
        let addr = SocketAddr::new(ip, port);
        let rec = self.id_mut(id)?;
        rec.local = Some(addr);
        rec.pending_reservation = None;
        Ok(self.reserve(
            id,
            PendingReservation {
                addr,
                refused_ephemeral: p.refused_ephemeral + 1,
                ..p
            },
        ))
    }

    /// Asks for the reservation `pending` names for `id` unless this process holds
    /// its address already (then shares it).
    fn reserve(&mut self, id: CmIdHandle, pending: PendingReservation) -> Reservation {
        let addr = pending.addr;
        if let Some(count) = self.reservations.get_mut(&addr) {
            *count += 1;
            if let Some(rec) = self.ids.get_mut(id) {
                rec.reservation = Some(addr);
            }
            return Reservation::NotNeeded;
        }
        if let Some(rec) = self.ids.get_mut(id) {
            rec.pending_reservation = Some(pending);
        }
        Reservation::Needed(addr)
    }

    /// Ports of the cm's choosing a reservation tries before it fails: with a few
    /// thousand of the range's 28 232 ports taken, 16 refusals in a row are unlikely.
    pub const EPHEMERAL_TRIES: u32 = 16;

    /// Drops the id's reservation; the last holder's release asks the driver to close
    /// the socket.
    pub(crate) fn release(&mut self, addr: SocketAddr) {
        if let Some(count) = self.reservations.get_mut(&addr) {
            *count -= 1;
            if *count == 0 {
                self.reservations.remove(&addr);
                self.requests.push_back(DriverRequest::ReleasePort { addr });
            }
        }
    }

    /// Fails if another id of this process in the same port space holds a clashing
    /// address on `port`.
    pub(crate) fn check_port(
        &self,
        id: CmIdHandle,
        ip: IpAddr,
        port: u16,
        listening: bool,
    ) -> Result<(), CmError> {
        let me = self.id(id)?;
        let taken = self.ids.iter().any(|(other, rec)| {
            other != id
                && rec.ps == me.ps
                && rec.parent.is_none()
                && rec.local.is_some_and(|l| {
                    l.port() == port
                        && clash(
                            ip,
                            &me.options,
                            listening,
                            l.ip(),
                            &rec.options,
                            rec.state == IdState::Listen,
                        )
                })
        });
        if taken {
            Err(CmError::AddrInUse)
        } else {
            Ok(())
        }
    }

    /// A random free port in the ephemeral range for `id` at `ip`.
    pub(crate) fn ephemeral_port(&mut self, id: CmIdHandle, ip: IpAddr) -> Result<u16, CmError> {
        let range = self.config.ephemeral_ports.clone();
        if range.is_empty() {
            return Err(CmError::NoFreePort);
        }
        let span = u32::from(range.end - range.start);
        let start = self.rng.range(0, span);
        for i in 0..span {
            let port = range.start + ((start + i) % span) as u16;
            if self.check_port(id, ip, port, false).is_ok() {
                return Ok(port);
            }
        }
        Err(CmError::NoFreePort)
    }

    /// Binds an unbound id to the wildcard of `family_of`'s family and an ephemeral
    /// port (what connecting or listening without a bind does).
    pub(crate) fn bind_implicitly(
        &mut self,
        id: CmIdHandle,
        ip: Option<IpAddr>,
        family_of: IpAddr,
    ) -> Result<(), CmError> {
        if self.id(id)?.local.is_some() {
            return Ok(());
        }
        let ip = ip.unwrap_or(match family_of {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        });
        let port = self.ephemeral_port(id, ip)?;
        let rec = self.id_mut(id)?;
        rec.local = Some(SocketAddr::new(ip, port));
        rec.ephemeral_port = true;
        Ok(())
    }

    // ----- listening -----

    /// Listens for connection requests (`rdma_listen`). An unbound id is bound to
    /// the IPv4 wildcard and an ephemeral port first. `backlog` of 0 or less means
    /// the configured default; requests beyond it are dropped unanswered (the
    /// requester retries), as Linux does. The listener's port needs a rendezvous
    /// socket: see [`Reservation`].
    pub fn listen(&mut self, id: CmIdHandle, backlog: i32) -> Result<Reservation, CmError> {
        let rec = self.id(id)?;
        let state = rec.state;
        if !matches!(state, IdState::Idle | IdState::AddrBound) || rec.pending_reservation.is_some()
        {
            return Err(CmError::InvalidState {
                op: "listen",
                state,
            });
        }
        let was_unbound = rec.local.is_none();
        if was_unbound {
            self.bind_implicitly(id, None, IpAddr::V4(Ipv4Addr::UNSPECIFIED))?;
        }
        let local = self.id(id)?.local.ok_or(CmError::UnknownId)?;
        if let Err(e) = self.check_port(id, local.ip(), local.port(), true) {
            if was_unbound {
                self.id_mut(id)?.local = None;
            }
            return Err(e);
        }
        let backlog = u32::try_from(backlog)
            .ok()
            .filter(|b| *b > 0)
            .unwrap_or(self.config.default_backlog);
        let held = self.id(id)?.reservation.is_some();
        let rec = self.id_mut(id)?;
        rec.state = IdState::Listen;
        rec.backlog = Some((backlog, 0));
        if held {
            return Ok(Reservation::NotNeeded);
        }
        Ok(self.reserve(id, PendingReservation::new(local, state, was_unbound)))
    }

    // ----- QPs -----

    /// Ties a QP to the id (`rdma_create_qp` for a managed QP). For a managed QP the
    /// cm asks for INIT at once (and for UD: RTR and RTS, which need nothing from the
    /// peer), as librdmacm does.
    pub fn set_qp(&mut self, now: Instant, id: CmIdHandle, qp: QpBinding) -> Result<(), CmError> {
        let rec = self.id_mut(id)?;
        if rec.qp.is_some() {
            return Err(CmError::InvalidArgument("the id has a QP already"));
        }
        rec.qp = Some(qp);
        if qp.managed {
            let steps = self.create_transitions(id)?;
            self.request_qp(now, id, qp.qpn, steps, crate::qp::Continuation::None);
        }
        Ok(())
    }

    /// Unties the id's QP (`rdma_destroy_qp`).
    pub fn clear_qp(&mut self, id: CmIdHandle) -> Result<Option<QpBinding>, CmError> {
        Ok(self.id_mut(id)?.qp.take())
    }

    // ----- the driver's side -----

    /// The next datagram to send, written into `buf` (at least
    /// [`CM_DATAGRAM_LEN`] bytes; smaller buffers get nothing).
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<CmTransmit> {
        if buf.len() < CM_DATAGRAM_LEN {
            return None;
        }
        let (dst, bytes) = self.transmits.pop_front()?;
        buf[..bytes.len()].copy_from_slice(&bytes);
        Some(CmTransmit {
            src: self.config.device,
            dst,
            len: bytes.len(),
        })
    }

    /// The next datagram to send and its destination, as the cm built it: for a driver
    /// that keeps the bytes anyway (no buffer to fill, nothing copied twice).
    pub fn take_transmit(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.transmits.pop_front()
    }

    /// The next rdma_cm event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The next request for the driver.
    pub fn poll_request(&mut self) -> Option<DriverRequest> {
        self.requests.pop_front()
    }

    /// When [`Cm::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(key) = self.timers.pop_due(now) {
            match key {
                TimerKey::Conn(local_id) => self.conn_timeout(now, local_id),
                TimerKey::SidrOut(request_id) => self.sidr_timeout(now, request_id),
                TimerKey::SidrIn(src, request_id) => {
                    self.sidr_in.remove(&(src, request_id));
                }
                TimerKey::Resolve(token) => self.resolve_timeout(token),
            }
        }
    }

    // ----- helpers for the protocol modules -----

    pub(crate) fn token(&mut self) -> RequestToken {
        let t = RequestToken(self.next_token);
        self.next_token += 1;
        t
    }

    pub(crate) fn push_request(&mut self, r: DriverRequest) {
        self.requests.push_back(r);
    }

    /// A fresh transaction ID: a counter in the high half, the local ID in the low
    /// half, as Linux builds them.
    pub(crate) fn new_tid(&mut self, local_id: u32) -> u64 {
        self.tid_counter = self.tid_counter.wrapping_add(1);
        (u64::from(self.tid_counter) << 32) | u64::from(local_id)
    }

    /// A fresh, nonzero local communication ID no live connection uses.
    pub(crate) fn new_comm_id(&mut self) -> u32 {
        loop {
            let id = self.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) && !self.sidr_out.contains_key(&id) {
                return id;
            }
        }
    }

    /// A random starting PSN.
    pub(crate) fn new_psn(&mut self) -> Psn {
        Psn::new(self.rng.next_u32())
    }

    /// Queues `mad` for `dst` as a QP1 datagram from the device.
    pub(crate) fn send(&mut self, dst: SocketAddr, mad: &CmMadRepr) {
        let mut buf = vec![0u8; CM_DATAGRAM_LEN];
        let ctx = IcrcContext::new(self.config.device, dst);
        match datagram::emit(mad, Psn::new(self.tx_psn), &ctx, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                self.tx_psn = self.tx_psn.wrapping_add(1);
                self.counters.tx_datagrams += 1;
                self.transmits.push_back((dst, buf));
            }
            // Every MAD the cm builds fits; an error here is a bug in a builder.
            Err(e) => debug_assert!(false, "cm built an unsendable MAD: {e}"),
        }
    }

    pub(crate) fn event(
        &mut self,
        id: CmIdHandle,
        kind: CmEventKind,
        status: EventStatus,
        param: EventParam,
    ) {
        self.events.push_back(CmEvent {
            id,
            listen_id: None,
            kind,
            status,
            param,
        });
    }

    pub(crate) fn push_event(&mut self, e: CmEvent) {
        self.events.push_back(e);
    }

    /// Forgets queued events of a destroyed id.
    pub(crate) fn drop_events_of(&mut self, id: CmIdHandle) {
        self.events.retain(|e| e.id != id);
    }
}
