//! An rdma_cm id: what the application holds (`struct rdma_cm_id`).

use crate::handle::CmIdHandle;
use crate::request::RequestToken;
use crate::types::{IbMtu, IdOptions, IdState, PortSpace, QpBinding, QpType};
use std::net::{IpAddr, SocketAddr};

/// A resolved route: what address resolution said, and whether route resolution ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub mtu: IbMtu,
    pub hop_limit: u8,
    pub resolved: bool,
}

/// A reservation a bind or listen waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingReservation {
    pub addr: SocketAddr,
    /// The state to go back to if it fails.
    pub state_before: IdState,
    /// Whether the id had no address before (a failed bind unbinds it).
    pub was_unbound: bool,
    /// Ports of the cm's choosing refused so far ([`crate::Cm::reservation_taken`]).
    pub refused_ephemeral: u32,
}

impl PendingReservation {
    /// A first reservation of `addr` (no port refused yet).
    pub fn new(addr: SocketAddr, state_before: IdState, was_unbound: bool) -> Self {
        PendingReservation {
            addr,
            state_before,
            was_unbound,
            refused_ephemeral: 0,
        }
    }
}

/// A multicast group the id joined or is joining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Join {
    pub group: IpAddr,
    pub send_only: bool,
    pub context: u64,
    /// The group's endpoint once the driver joined it.
    pub joined: Option<SocketAddr>,
    pub attach: Option<softverbs_wire::Qpn>,
    pub token: RequestToken,
}

#[derive(Debug, Clone)]
pub(crate) struct IdRecord {
    pub ps: PortSpace,
    pub qp_type: QpType,
    pub state: IdState,
    /// Local address and port (the IP may be a wildcard).
    pub local: Option<SocketAddr>,
    /// The cm chose the local port (bound to port 0, or implicitly): a refused
    /// reservation of it takes another one instead of failing.
    pub ephemeral_port: bool,
    /// The rendezvous reservation this id holds (a key of the cm's reservations).
    pub reservation: Option<SocketAddr>,
    pub pending_reservation: Option<PendingReservation>,
    /// The rdma_cm peer: IP address and rdma_cm port.
    pub peer: Option<SocketAddr>,
    pub route: Option<Route>,
    pub qp: Option<QpBinding>,
    /// The IB connection (its local communication ID).
    pub conn: Option<u32>,
    /// Active UD: the outstanding SIDR request's ID.
    pub sidr_out: Option<u32>,
    /// Passive UD: the request this id answers (source, request ID).
    pub sidr_in: Option<(SocketAddr, u32)>,
    /// Listening: the backlog, and requests handed over but not yet answered.
    pub backlog: Option<(u32, u32)>,
    /// Passive: the listener it came from.
    pub parent: Option<CmIdHandle>,
    /// Passive: still counted in the parent's backlog.
    pub pending_request: bool,
    pub options: IdOptions,
    /// Address resolution in progress.
    pub addr_token: Option<RequestToken>,
    pub joins: Vec<Join>,
    /// A CONNECT_ERROR was reported: later REJECTED / DISCONNECTED are swallowed, as
    /// librdmacm does.
    pub connect_error: bool,
}

impl IdRecord {
    pub fn new(ps: PortSpace, qp_type: QpType) -> IdRecord {
        IdRecord {
            ps,
            qp_type,
            state: IdState::Idle,
            local: None,
            ephemeral_port: false,
            reservation: None,
            pending_reservation: None,
            peer: None,
            route: None,
            qp: None,
            conn: None,
            sidr_out: None,
            sidr_in: None,
            backlog: None,
            parent: None,
            pending_request: false,
            options: IdOptions::default(),
            addr_token: None,
            joins: Vec::new(),
            connect_error: false,
        }
    }
}
