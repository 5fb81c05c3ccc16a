//! `CmId`: an rdma_cm id that reports to an [`EventChannel`] and is destroyed when dropped.

use super::{
    CmError, CmIdHandle, CmQpType, ConnParam, EventChannel, IdOptions, IdState, PathRecord,
    PortSpace, QpAttrs, QpBinding,
};
use crate::cq::Cq;
use crate::pd::Pd;
use crate::qp::{Qp, QpBuilder};
use softverbs_engine::{QpCap, QpType};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An rdma_cm id (`struct rdma_cm_id`): one endpoint of a connection, a listener, or a UD
/// endpoint. Its events arrive on its [`EventChannel`]. Dropping it destroys it
/// (`rdma_destroy_id`): a live connection is disconnected, a listener's port released, and
/// its QP (from [`CmId::create_qp`]) destroyed after that.
pub struct CmId {
    channel: EventChannel,
    handle: CmIdHandle,
    qp: Mutex<Option<Arc<Qp>>>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("handle", &self.handle)
            .finish()
    }
}

impl CmId {
    /// Creates an id on `channel` in port space `ps` (`rdma_create_id`): TCP ids are RC, UDP
    /// ids UD.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId, CmError> {
        let qp_type = match ps {
            PortSpace::Udp => CmQpType::Ud,
            _ => CmQpType::Rc,
        };
        Self::with_qp_type(channel, ps, qp_type)
    }

    /// Creates an id with an explicit QP type (for the IB port space, which takes either).
    pub fn with_qp_type(
        channel: &EventChannel,
        ps: PortSpace,
        qp_type: CmQpType,
    ) -> Result<CmId, CmError> {
        let handle = channel.cm().create_id(ps, qp_type, channel.sink())?;
        Ok(CmId::adopt(channel, handle))
    }

    /// Wraps an id that reports to `channel` already.
    pub(super) fn adopt(channel: &EventChannel, handle: CmIdHandle) -> CmId {
        CmId {
            channel: channel.clone(),
            handle,
            qp: Mutex::new(None),
        }
    }

    fn cm(&self) -> &super::ConnectionManager {
        self.channel.cm()
    }

    /// Its handle in the connection manager.
    pub fn handle(&self) -> CmIdHandle {
        self.handle
    }

    /// The channel its events arrive on.
    pub fn channel(&self) -> &EventChannel {
        &self.channel
    }

    /// Moves the id to another channel (`rdma_migrate_id`): later events arrive there.
    pub fn migrate(&mut self, to: &EventChannel) -> Result<(), CmError> {
        self.cm().set_sink(self.handle, to.sink())?;
        self.channel = to.clone();
        Ok(())
    }

    /// Binds to an address (`rdma_bind_addr`); port 0 picks one. `AddrInUse` when another
    /// id, in this process or another, holds it.
    pub fn bind(&self, addr: SocketAddr) -> Result<(), CmError> {
        self.cm().bind_addr(self.handle, addr)
    }

    /// Resolves the destination (`rdma_resolve_addr`): ADDR_RESOLVED or ADDR_ERROR follows.
    pub fn resolve_addr(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        self.cm().resolve_addr(self.handle, src, dst, timeout)
    }

    /// Resolves the route (`rdma_resolve_route`): ROUTE_RESOLVED follows.
    pub fn resolve_route(&self) -> Result<(), CmError> {
        self.cm().resolve_route(self.handle)
    }

    /// Listens for connection requests (`rdma_listen`); `backlog` ≤ 0: the default.
    pub fn listen(&self, backlog: i32) -> Result<(), CmError> {
        self.cm().listen(self.handle, backlog)
    }

    /// Creates the id's QP on `pd` with `cq` for both queues (`rdma_create_qp`): RC or UD
    /// as the id's port space says. The connection manager moves it through INIT, RTR, RTS
    /// (and ERR on disconnect) as librdmacm does.
    pub fn create_qp(&self, pd: &Pd, cq: &Cq, cap: QpCap) -> Result<Arc<Qp>, CmError> {
        let ps = self.cm().port_space(self.handle)?;
        let qp_type = match ps {
            PortSpace::Udp => QpType::Ud,
            _ => QpType::Rc,
        };
        self.create_qp_with(QpBuilder::new(pd, cq).qp_type(qp_type).cap(cap))
    }

    /// Creates the id's QP from a builder (separate CQs, an SRQ, ...). The QP must be on the
    /// id's device.
    pub fn create_qp_with(&self, builder: QpBuilder) -> Result<Arc<Qp>, CmError> {
        let srq = builder.has_srq();
        let qp = Arc::new(builder.build()?);
        self.cm().set_qp(
            self.handle,
            QpBinding {
                qpn: qp.qpn(),
                srq,
                managed: true,
            },
        )?;
        *self.qp.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&qp));
        Ok(qp)
    }

    /// The QP made with [`CmId::create_qp`].
    pub fn qp(&self) -> Option<Arc<Qp>> {
        self.qp.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Unties and drops the id's QP (`rdma_destroy_qp`).
    pub fn destroy_qp(&self) -> Result<(), CmError> {
        self.cm().clear_qp(self.handle)?;
        self.qp.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }

    /// Connects (`rdma_connect`): RC ids send a REQ (ESTABLISHED, REJECTED or UNREACHABLE
    /// follows), UD ids a SIDR_REQ (ESTABLISHED with the peer's QPN and Q_Key, or
    /// UNREACHABLE). `None`: librdmacm's defaults.
    pub fn connect(&self, param: Option<ConnParam>) -> Result<(), CmError> {
        self.cm().connect(self.handle, param)
    }

    /// Accepts the connection request this id was made for (`rdma_accept`).
    pub fn accept(&self, param: Option<ConnParam>) -> Result<(), CmError> {
        self.cm().accept(self.handle, param)
    }

    /// Rejects it (`rdma_reject`) with private data.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        self.cm().reject(self.handle, private_data)
    }

    /// Sends the RTU after CONNECT_RESPONSE, for ids with an application-managed QP
    /// (`rdma_establish`).
    pub fn establish(&self) -> Result<(), CmError> {
        self.cm().establish(self.handle)
    }

    /// Disconnects (`rdma_disconnect`): DISCONNECTED follows on both sides.
    pub fn disconnect(&self) -> Result<(), CmError> {
        self.cm().disconnect(self.handle)
    }

    /// Joins an IPv4 multicast group (`rdma_join_multicast`); MULTICAST_JOIN follows with
    /// the group's address vector, QPN 0xFFFFFF and the Q_Key. A send-only join neither
    /// makes the host a member nor attaches the QP.
    pub fn join_multicast(&self, group: IpAddr, send_only: bool) -> Result<(), CmError> {
        self.cm()
            .join_multicast(self.handle, group, send_only, self.handle.to_raw())
    }

    /// Leaves a group (`rdma_leave_multicast`).
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), CmError> {
        self.cm().leave_multicast(self.handle, group)
    }

    /// The attributes that move an application's own QP to `state` (`rdma_init_qp_attr`).
    pub fn init_qp_attr(&self, state: softverbs_cm::QpState) -> Result<QpAttrs, CmError> {
        self.cm().init_qp_attr(self.handle, state)
    }

    /// Sets options (`rdma_set_option`: TOS, ACK timeout, reuse-address, AF-only).
    pub fn set_options(&self, options: IdOptions) -> Result<(), CmError> {
        self.cm().set_options(self.handle, options)
    }

    /// The state.
    pub fn state(&self) -> Result<IdState, CmError> {
        self.cm().state(self.handle)
    }

    /// The local address (`rdma_get_local_addr`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.cm().local_addr(self.handle).ok().flatten()
    }

    /// The peer (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.cm().peer_addr(self.handle).ok().flatten()
    }

    /// The resolved path.
    pub fn route(&self) -> Option<PathRecord> {
        self.cm().route(self.handle).ok().flatten()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        let _ = self.cm().destroy_id(self.handle);
        // The QP (if any) drops after the id, once the connection manager let go of it.
    }
}
