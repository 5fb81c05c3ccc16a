//! What the cm asks of the layer above, and what it sends.

use crate::handle::CmIdHandle;
use crate::types::QpAttrs;
use softverbs_wire::Qpn;
use std::net::{IpAddr, SocketAddr};

/// Ties a driver's answer to the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestToken(pub(crate) u64);

/// Work only the layer above can do: the cm decides, the driver acts and (where the
/// request has a token) answers through the matching `handle_*` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverRequest {
    /// Find the local address (and interface MTU, hop limit) the kernel would use to
    /// reach `dst`; answer with [`Cm::handle_addr_resolved`](crate::Cm::handle_addr_resolved).
    /// No answer before the timeout given to `resolve_addr` is an ADDR_ERROR.
    ResolveAddr {
        /// For the answer.
        token: RequestToken,
        /// The id resolving.
        id: CmIdHandle,
        /// The source address the id is bound to, if any.
        src: Option<IpAddr>,
        /// The destination.
        dst: IpAddr,
    },
    /// Move QP `qpn` through `steps` in order (each one `ibv_modify_qp`), stopping at
    /// the first failure; answer with [`Cm::handle_qp_modified`](crate::Cm::handle_qp_modified).
    /// The cm waits for the answer before it sends what depends on it (the REP after
    /// RTR/RTS, the RTU after RTR/RTS).
    ModifyQp {
        /// For the answer.
        token: RequestToken,
        /// The id whose QP it is.
        id: CmIdHandle,
        /// The QP.
        qpn: Qpn,
        /// The transitions.
        steps: Vec<QpAttrs>,
    },
    /// Join IP multicast group `group` on the interface of `local_ip` (so the host
    /// sends an IGMP report), unless `send_only`; attach QP `attach` to it if given.
    /// Answer with [`Cm::handle_group_joined`](crate::Cm::handle_group_joined).
    JoinGroup {
        /// For the answer.
        token: RequestToken,
        /// The id joining.
        id: CmIdHandle,
        /// The group.
        group: IpAddr,
        /// The local address of the id.
        local_ip: IpAddr,
        /// Send-only join: no membership, no attach.
        send_only: bool,
        /// The QP to attach, for an id whose QP the cm drives.
        attach: Option<Qpn>,
    },
    /// Leave a group joined earlier (detach `detach` if given). No answer.
    LeaveGroup {
        /// The id leaving.
        id: CmIdHandle,
        /// The group's endpoint, as the join answer gave it.
        group: SocketAddr,
        /// Whether the join was send-only.
        send_only: bool,
        /// The QP to detach.
        detach: Option<Qpn>,
    },
    /// Close the rendezvous socket at `addr`: no id holds its port any more.
    ReleasePort {
        /// The socket's address.
        addr: SocketAddr,
    },
}

/// A datagram to send: its bytes (a whole RoCEv2 packet, ICRC included) are in the
/// buffer given to [`Cm::poll_transmit`](crate::Cm::poll_transmit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmTransmit {
    /// The address to send from: always the device's endpoint (the ICRC covers it).
    pub src: SocketAddr,
    /// Where it goes: a peer's device, or the rendezvous socket of a listener.
    pub dst: SocketAddr,
    /// Bytes of the buffer that hold the datagram.
    pub len: usize,
}

/// What a bind or listen needs from the driver before it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Reservation {
    /// Nothing: the port is the process's already, or the id needs no socket.
    NotNeeded,
    /// Bind a UDP socket (the id's rendezvous socket) at this address, feed what it
    /// receives to [`Cm::handle_datagram`](crate::Cm::handle_datagram), then call
    /// [`Cm::complete_reservation`](crate::Cm::complete_reservation) with whether the
    /// bind worked. Another process holding the port is how two listeners on one
    /// address and port get EADDRINUSE.
    Needed(SocketAddr),
}
