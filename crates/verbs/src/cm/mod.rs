//! The connection manager: rdma_cm's model (ids, address and route resolution, listen,
//! connect, accept, reject, disconnect, UD service resolution, multicast) on the device.
//!
//! Two levels, one path:
//!
//! - [`ConnectionManager`] is the low level: operations on ids named by [`CmIdHandle`],
//!   events delivered to a sink per id ([`CmEventSink`]). This is what the drop-in
//!   `librdmacm.so.1` sits on (its ids keep a handle as a number, [`CmIdHandle::to_raw`]);
//!   the rules a sink lives by are on [`CmEventSink`].
//! - [`EventChannel`] and [`CmId`] are the Rust API, built on the low level: a channel is a
//!   sink that queues events behind a pollable fd; an id owns its handle and destroys it when
//!   dropped. [`connect_rc`] and [`RcListener`] return connected RC QPs in one call each, in
//!   the spirit of `rdma_create_ep` / `rdma_get_request`.
//!
//! ```no_run
//! use softverbs::cm::{EventChannel, CmId, PortSpace};
//! let ctx = softverbs::Device::list()?.remove(0).open()?;
//! let channel = EventChannel::new(&ctx)?;
//! let listener = CmId::new(&channel, PortSpace::Tcp)?;
//! listener.bind("127.0.0.1:7471".parse()?)?;
//! listener.listen(8)?;
//! let mut ev = channel.get_event()?;
//! let request = ev.take_request().expect("a connect request");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! How rdma_cm addresses map onto the device (IPv4 and IPv6, rendezvous sockets, what
//! crosses the wire) is in `docs/connection-manager.md`.

mod at_exit;
mod channel;
pub(crate) mod driver;
mod id;
pub(crate) mod rc;
#[cfg(feature = "tokio")]
mod stream;
pub(crate) mod sys;

pub use channel::{Event, EventChannel};
pub use id::CmId;
pub use rc::{
    accept_request, accept_request_with, connect_rc, connect_rc_with, RcConnection, RcListener,
    RcOptions,
};
pub use softverbs_cm::{
    AhAttr, CmEvent, CmEventKind, CmIdHandle, ConnEventParam, ConnParam, EventParam, EventStatus,
    IbMtu, IdOptions, IdState, PathRecord, PortSpace, QpAttrMask as CmQpAttrMask, QpAttrs,
    QpBinding, RejReason, ResolveError, SidrStatus, UdEventParam, RDMA_UDP_QKEY,
};

/// The QP states the connection manager hands out attributes for (`rdma_init_qp_attr`).
pub use softverbs_cm::QpState as CmQpState;
#[cfg(feature = "tokio")]
pub use stream::CmEventStream;

use crate::context::Context;
use crate::device::{DeviceCore, Inherited};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The QP type of an rdma_cm id (RC for the TCP port space, UD for UDP).
pub use softverbs_cm::QpType as CmQpType;

/// Where the connection manager delivers an id's events.
///
/// Rules (the drop-in librdmacm relies on each):
/// - `deliver` may run on the device's progress thread or on the thread of whatever call
///   produced the event; it must not block and must not call the [`ConnectionManager`]
///   (queue the event and return).
/// - Events of one device are delivered one at a time, in the order the connection
///   manager produced them.
/// - After [`ConnectionManager::destroy_id`] returns, `deliver` is never called for that id
///   again (a delivery under way finishes first).
/// - A [`CmEventKind::ConnectRequest`] goes to the *listener's* sink (`event.listen_id`);
///   `event.id` is the new id. The returned sink receives the new id's events from then on;
///   `None` refuses the request: the connection manager rejects it and destroys the new id.
///   For every other event the return value is ignored.
pub trait CmEventSink: Send + Sync {
    /// Takes one event (see the trait documentation).
    fn deliver(&self, event: &CmEvent) -> Option<Arc<dyn CmEventSink>>;
}

/// Errors of connection-manager calls. Statuses a peer causes (rejects, timeouts) are not
/// errors: they arrive as events.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The connection manager refused the call (wrong state, bad argument, address in use
    /// within this process, ...).
    #[error(transparent)]
    Cm(#[from] softverbs_cm::CmError),
    /// The rendezvous socket for the address could not be bound (another process holds it:
    /// `AddrInUse`, as `rdma_bind_addr` reports EADDRINUSE).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The rdma_cm address.
        addr: SocketAddr,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The QP lives on another device than the connection manager's.
    #[error("the QP belongs to another device")]
    ForeignQp,
    /// Creating the QP failed.
    #[error(transparent)]
    Resource(#[from] crate::error::ResourceError),
    /// The QP could not be moved to the state the connection needs.
    #[error("moving the QP failed: {0}")]
    Qp(#[from] crate::error::ModifyQpError),
    /// Posting work before connecting failed (the `prepare` step of
    /// [`connect_rc_with`] / [`accept_request_with`]).
    #[error("posting to the QP failed: {0}")]
    Post(#[from] crate::error::PostError),
    /// The event channel's fd failed (`EAGAIN` on a non-blocking channel, `EINTR`).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A blocking helper got another event than the one it waits for.
    #[error("{op}: got {kind:?} (status {status:?})")]
    Unexpected {
        /// What the helper was doing.
        op: &'static str,
        /// The event that came.
        kind: CmEventKind,
        /// Its status.
        status: EventStatus,
    },
    /// The device was inherited across `fork()`.
    #[error(transparent)]
    Inherited(#[from] Inherited),
}

/// The connection manager of a device, addressed by id handles: the low-level interface
/// (see the module documentation). Cheap to clone; every clone is the same manager. Holding
/// one keeps the device up.
#[derive(Clone)]
pub struct ConnectionManager {
    ctx: Context,
}

impl std::fmt::Debug for ConnectionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionManager")
            .field("device", &self.core().info().local)
            .finish()
    }
}

impl ConnectionManager {
    /// The connection manager of `ctx`'s device.
    pub fn new(ctx: &Context) -> ConnectionManager {
        ConnectionManager { ctx: ctx.clone() }
    }

    /// The context it was made from (QPs made through [`CmId::create_qp`] live there).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn core(&self) -> &Arc<DeviceCore> {
        &self.ctx.inner.device
    }

    /// The device's UDP endpoint: where every CM message and all data go out from.
    pub fn device_addr(&self) -> SocketAddr {
        self.core().info().local
    }

    /// Runs `f` on the cm under the device lock, then carries out what it produced.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut softverbs_cm::Cm, softverbs_cm::Instant) -> Result<R, softverbs_cm::CmError>,
    ) -> Result<R, CmError> {
        // A thread that took a SEND from its CQ and now manages connections is not
        // answering it: the ACK it held for its answer (`crate::ack_hold`) leaves now.
        // perftest -R's server waits for that ACK (its handshake SEND's completion)
        // before it listens again, while its client, past the handshake, connects.
        crate::ack_hold::release_thread_held();
        let now = driver::cm_now(self.core().info().now());
        Ok(self.core().with(|st| f(&mut st.cm.cm, now))??)
    }

    /// Reads the cm under the device lock.
    fn query<R>(
        &self,
        f: impl FnOnce(&softverbs_cm::Cm) -> Result<R, softverbs_cm::CmError>,
    ) -> Result<R, CmError> {
        Ok(self.core().read(|st| f(&st.cm.cm))??)
    }

    /// Creates an id (`rdma_create_id`) in port space `ps` (TCP: RC, UDP: UD) whose events
    /// go to `sink`. Ids the process never destroys are destroyed when it exits
    /// (`at_exit`), as Linux does.
    pub fn create_id(
        &self,
        ps: PortSpace,
        qp_type: CmQpType,
        sink: Arc<dyn CmEventSink>,
    ) -> Result<CmIdHandle, CmError> {
        let id = self.call(|cm, _| cm.create_id(ps, qp_type))?;
        self.core().driver()?.cm_set_sink(id, sink);
        at_exit::watch(self.core());
        Ok(id)
    }

    /// Sends `id`'s events to `sink` from now on (`rdma_migrate_id`). Events already
    /// delivered stay where they went.
    pub fn set_sink(&self, id: CmIdHandle, sink: Arc<dyn CmEventSink>) -> Result<(), CmError> {
        self.query(|cm| cm.state(id))?;
        self.core().driver()?.cm_set_sink(id, sink);
        Ok(())
    }

    /// Destroys an id (`rdma_destroy_id`): a connection still up is disconnected, a
    /// listener's port released. When this returns, the id's sink is never called again.
    /// A DREQ still unanswered holds the caller briefly while it is sent again
    /// ([`softverbs_cm::Cm::lingering`]: until the DREP, at most 34 ms at packet life
    /// time 10 and 40 ms at the default 18), because this process's exit, which
    /// usually follows, takes the cm and its retransmissions with it.
    pub fn destroy_id(&self, id: CmIdHandle) -> Result<(), CmError> {
        let lingers = self.query(|cm| Ok(cm.destroy_lingers(id))).unwrap_or(false);
        let r = self.call(|cm, now| cm.destroy_id(now, id));
        self.core().driver()?;
        forget_destroyed_ids(self.core(), &[id]);
        if r.is_ok() && lingers {
            linger(self.core());
        }
        r
    }

    /// Carries out a reservation (a rendezvous socket) the cm asked for, and the next
    /// one it asks for when the port it chose is taken
    /// ([`softverbs_cm::Cm::reservation_taken`]).
    fn reserve(&self, id: CmIdHandle, mut r: softverbs_cm::Reservation) -> Result<(), CmError> {
        while let softverbs_cm::Reservation::Needed(addr) = r {
            let v6only = self.query(|cm| cm.options(id))?.afonly;
            let bound = self.core().driver()?.cm_bind_rendezvous(addr, v6only);
            r = match bound {
                Ok(()) => {
                    self.call(|cm, _| cm.complete_reservation(id, true))?;
                    softverbs_cm::Reservation::NotNeeded
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    self.call(|cm, _| cm.reservation_taken(id))?
                }
                Err(source) => {
                    let _ = self.call(|cm, _| cm.complete_reservation(id, false));
                    return Err(CmError::Bind { addr, source });
                }
            };
        }
        Ok(())
    }

    /// Binds the id to an address and port (`rdma_bind_addr`; port 0: an ephemeral one).
    /// `AddrInUse` when another id of this process or another process holds them.
    pub fn bind_addr(&self, id: CmIdHandle, addr: SocketAddr) -> Result<(), CmError> {
        let r = self.call(|cm, _| cm.bind_addr(id, addr))?;
        self.reserve(id, r)
    }

    /// Starts address resolution (`rdma_resolve_addr`): ADDR_RESOLVED or ADDR_ERROR follows.
    pub fn resolve_addr(
        &self,
        id: CmIdHandle,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        self.call(|cm, now| cm.resolve_addr(now, id, src, dst, timeout))
    }

    /// Resolves the route (`rdma_resolve_route`): ROUTE_RESOLVED follows.
    pub fn resolve_route(&self, id: CmIdHandle) -> Result<(), CmError> {
        self.call(|cm, _| cm.resolve_route(id))
    }

    /// Listens (`rdma_listen`); `backlog` ≤ 0 means the default (1024).
    pub fn listen(&self, id: CmIdHandle, backlog: i32) -> Result<(), CmError> {
        let r = self.call(|cm, _| cm.listen(id, backlog))?;
        self.reserve(id, r)
    }

    /// Ties a QP of this device to the id (`rdma_create_qp` when `managed`: the connection
    /// manager then moves it through INIT, RTR, RTS and ERR as librdmacm does).
    pub fn set_qp(&self, id: CmIdHandle, qp: QpBinding) -> Result<(), CmError> {
        let known = self
            .core()
            .read(|st| st.engine.qp_by_qpn(qp.qpn).is_some())?;
        if !known {
            return Err(CmError::ForeignQp);
        }
        self.call(|cm, now| cm.set_qp(now, id, qp))?;
        self.core().with(|st| {
            st.cm.qps.insert(qp.qpn, id);
        })?;
        self.check_qp(id)
    }

    /// Unties the id's QP (`rdma_destroy_qp`, before the QP is destroyed).
    pub fn clear_qp(&self, id: CmIdHandle) -> Result<(), CmError> {
        let old = self.call(|cm, _| cm.clear_qp(id))?;
        if let Some(b) = old {
            self.core().with(|st| {
                st.cm.qps.remove(&b.qpn);
            })?;
        }
        Ok(())
    }

    /// Fails with the error of a QP move the last call asked for, if one failed.
    fn check_qp(&self, id: CmIdHandle) -> Result<(), CmError> {
        match self.core().read(|st| st.cm.qp_failures.remove(&id))? {
            Some(e) => Err(CmError::Qp(e)),
            None => Ok(()),
        }
    }

    /// Connects (`rdma_connect`): REQ for RC ids, SIDR_REQ for UD ids. `None`: librdmacm's
    /// NULL parameter.
    pub fn connect(&self, id: CmIdHandle, param: Option<ConnParam>) -> Result<(), CmError> {
        self.call(|cm, now| cm.connect(now, id, param))
    }

    /// Accepts a connection request (`rdma_accept`); a managed QP is moved to RTS first
    /// (its failure is this call's error).
    pub fn accept(&self, id: CmIdHandle, param: Option<ConnParam>) -> Result<(), CmError> {
        self.call(|cm, now| cm.accept(now, id, param))?;
        self.check_qp(id)
    }

    /// Rejects a connection request (`rdma_reject`) with private data.
    pub fn reject(&self, id: CmIdHandle, private_data: &[u8]) -> Result<(), CmError> {
        self.call(|cm, now| cm.reject(now, id, private_data))
    }

    /// Rejects a connection request with an IB CM reason of the caller's choosing
    /// (`rdma_reject_ece`: 35, "vendor option not supported").
    pub fn reject_with_reason(
        &self,
        id: CmIdHandle,
        private_data: &[u8],
        reason: RejReason,
    ) -> Result<(), CmError> {
        self.call(|cm, now| cm.reject_with_reason(now, id, private_data, reason))
    }

    /// Sends the RTU after CONNECT_RESPONSE (`rdma_establish`).
    pub fn establish(&self, id: CmIdHandle) -> Result<(), CmError> {
        self.call(|cm, now| cm.establish(now, id))
    }

    /// The QP saw its first packet (`rdma_notify` with IBV_EVENT_COMM_EST). The device
    /// does this itself for QPs tied to ids; this is for applications' own QPs.
    pub fn notify_established(&self, id: CmIdHandle) -> Result<(), CmError> {
        self.call(|cm, now| cm.notify_established(now, id))
    }

    /// Disconnects (`rdma_disconnect`): DREQ, or DREP when the peer's DREQ came first.
    pub fn disconnect(&self, id: CmIdHandle) -> Result<(), CmError> {
        // ACKs a polling thread holds back for its answer (`crate::ack_hold`) leave before
        // the DREQ: a peer that reads the DREQ first moves its QP to error and flushes a
        // SEND this side already received (WR_FLUSH_ERR where the sender saw success).
        match self.core().driver() {
            Ok(d) => d.release_all_held_acks(),
            Err(_) => crate::ack_hold::release_thread_held(),
        }
        self.call(|cm, now| cm.disconnect(now, id))
    }

    /// The attributes that move the id's QP to `state` (`rdma_init_qp_attr`).
    pub fn init_qp_attr(
        &self,
        id: CmIdHandle,
        state: softverbs_cm::QpState,
    ) -> Result<QpAttrs, CmError> {
        self.query(|cm| cm.init_qp_attr(id, state))
    }

    /// Joins a multicast group (`rdma_join_multicast`): MULTICAST_JOIN or MULTICAST_ERROR
    /// follows, carrying `context`.
    pub fn join_multicast(
        &self,
        id: CmIdHandle,
        group: IpAddr,
        send_only: bool,
        context: u64,
    ) -> Result<(), CmError> {
        self.call(|cm, now| cm.join_multicast(now, id, group, send_only, context))
    }

    /// Leaves a group (`rdma_leave_multicast`).
    pub fn leave_multicast(&self, id: CmIdHandle, group: IpAddr) -> Result<(), CmError> {
        self.call(|cm, _| cm.leave_multicast(id, group))
    }

    /// Sets the id's options (`rdma_set_option`).
    pub fn set_options(&self, id: CmIdHandle, options: IdOptions) -> Result<(), CmError> {
        self.call(|cm, _| cm.set_options(id, options))
    }

    /// The id's options.
    pub fn options(&self, id: CmIdHandle) -> Result<IdOptions, CmError> {
        self.query(|cm| cm.options(id))
    }

    /// The id's state.
    pub fn state(&self, id: CmIdHandle) -> Result<IdState, CmError> {
        self.query(|cm| cm.state(id))
    }

    /// The id's local address (`rdma_get_local_addr`).
    pub fn local_addr(&self, id: CmIdHandle) -> Result<Option<SocketAddr>, CmError> {
        self.query(|cm| cm.local_addr(id))
    }

    /// The id's peer (`rdma_get_peer_addr`).
    pub fn peer_addr(&self, id: CmIdHandle) -> Result<Option<SocketAddr>, CmError> {
        self.query(|cm| cm.peer_addr(id))
    }

    /// The id's resolved path (`id->route.path_rec`).
    pub fn route(&self, id: CmIdHandle) -> Result<Option<PathRecord>, CmError> {
        self.query(|cm| cm.route(id))
    }

    /// The QP tied to the id.
    pub fn qp(&self, id: CmIdHandle) -> Result<Option<QpBinding>, CmError> {
        self.query(|cm| cm.qp(id))
    }

    /// The id's port space.
    pub fn port_space(&self, id: CmIdHandle) -> Result<PortSpace, CmError> {
        self.query(|cm| cm.port_space(id))
    }

    /// The connection manager's counters.
    pub fn counters(&self) -> Result<softverbs_cm::CmCounters, CmError> {
        Ok(self.core().read(|st| st.cm.cm.counters())?)
    }

    /// How many ids are alive on the device.
    pub fn id_count(&self) -> Result<usize, CmError> {
        Ok(self.core().read(|st| st.cm.cm.id_count())?)
    }
}

/// Forgets what `core` keeps beside its cm for `ids`, which the cm has destroyed: the QPs
/// tied to them and their event sinks (no event reaches a destroyed id's sink). The one
/// place for it, used by `rdma_destroy_id` ([`ConnectionManager::destroy_id`]) and by the
/// exit hook (`at_exit`), so the two cannot drift. An inherited device's cm belongs to
/// the parent: nothing to forget here.
fn forget_destroyed_ids(core: &DeviceCore, ids: &[CmIdHandle]) {
    let Ok(d) = core.driver() else {
        return;
    };
    let _ = core.with(|st| st.cm.qps.retain(|_, id| !ids.contains(id)));
    for &id in ids {
        d.cm_remove_sink(id);
    }
}

/// Waits while `core`'s cm sends a destroyed id's unanswered DREQ again (the progress
/// thread does, on the cm's timers). The cm bounds the linger; `GIVE_UP` only guards
/// against a progress thread that cannot run (a caller on it, a stopped device).
fn linger(core: &DeviceCore) {
    const GIVE_UP: std::time::Duration = std::time::Duration::from_secs(1);
    const POLL: std::time::Duration = std::time::Duration::from_millis(1);
    let give_up = std::time::Instant::now() + GIVE_UP;
    while core.read(|st| st.cm.cm.lingering()).unwrap_or(false)
        && std::time::Instant::now() < give_up
    {
        std::thread::sleep(POLL);
    }
}
