//! rdma_cm events (`struct rdma_cm_event`) and the parameters programs read from them
//! (CM.md 4.4).

use crate::handle::CmIdHandle;
use crate::types::{AhAttr, ResolveError};
use softverbs_wire::cm::{RejReason, SidrStatus};
use softverbs_wire::Qpn;
use std::net::SocketAddr;

/// Which event (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` finished.
    AddrResolved,
    /// `rdma_resolve_addr` failed.
    AddrError,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// `rdma_resolve_route` failed.
    RouteError,
    /// A peer asks to connect (on a new id; `listen_id` is the listener).
    ConnectRequest,
    /// The peer accepted, and the id has no QP the cm drives: call
    /// [`Cm::establish`](crate::Cm::establish) once the QP is ready.
    ConnectResponse,
    /// Setting up the connection failed locally (e.g. the QP would not move).
    ConnectError,
    /// The peer did not answer, or a SIDR request failed.
    Unreachable,
    /// The peer refused (status: the REJ reason).
    Rejected,
    /// The connection is up (for UD: the SIDR answer arrived).
    Established,
    /// The connection is down.
    Disconnected,
    /// The device went away (never generated: a softverbs device outlives its cm).
    DeviceRemoval,
    /// A multicast join finished.
    MulticastJoin,
    /// A multicast join failed.
    MulticastError,
    /// The local address changed (never generated).
    AddrChange,
    /// The connection's timewait is over: its QP may be reused.
    TimewaitExit,
}

/// The event's status (`event->status`): what went wrong, typed. The C ABI maps it:
/// `Ok` 0, `TimedOut` -ETIMEDOUT, `Rejected(r)` the reason number, `Sidr(s)` the
/// status number, `Resolve(e)` -EHOSTUNREACH / -ENETUNREACH / -EADDRNOTAVAIL /
/// -ENODEV, `QpTransitionFailed` -EINVAL, `JoinFailed` -EINVAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventStatus {
    /// Success.
    Ok,
    /// No answer in time.
    TimedOut,
    /// The peer's REJ reason.
    Rejected(RejReason),
    /// The SIDR_REP status of a failed UD resolution.
    Sidr(SidrStatus),
    /// Address resolution failed.
    Resolve(ResolveError),
    /// The driver could not move the QP.
    QpTransitionFailed,
    /// The driver could not join the group.
    JoinFailed,
}

/// Connection parameters of an RC event (`event->param.conn`), already in the
/// receiver's view (responder resources and initiator depth swapped).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnEventParam {
    /// The peer's private data, at the length rdma_cm always reports: 56 for a
    /// request, 196 for a reply, 148 for a reject (zero-padded).
    pub private_data: Vec<u8>,
    /// READs/atomics this side may accept at once (the peer's initiator depth).
    pub responder_resources: u8,
    /// READs/atomics this side may issue at once (the peer's responder resources).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (requests only; 0 in replies).
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The peer's QP uses an SRQ.
    pub srq: bool,
    /// The peer's QPN.
    pub qp_num: Qpn,
}

/// Parameters of a UD event (`event->param.ud`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdEventParam {
    /// The peer's private data (180 bytes for a request, 136 for a reply).
    pub private_data: Vec<u8>,
    /// How to reach the peer (none in a connect request: the passive side learns the
    /// peer from the first datagram, as udaddy does).
    pub ah: Option<AhAttr>,
    /// The peer's QPN (0xFFFFFF for a multicast group).
    pub qp_num: Qpn,
    /// The Q_Key to send with.
    pub qkey: u32,
}

/// What an event carries besides its kind and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventParam {
    /// Nothing.
    None,
    /// RC connection parameters.
    Conn(ConnEventParam),
    /// UD parameters.
    Ud(UdEventParam),
    /// A multicast join: the group, as the driver joined it, and the caller's
    /// context value (librdmacm reports it as the private data pointer).
    Multicast {
        /// The group's UDP endpoint.
        group: SocketAddr,
        /// The value given to [`Cm::join_multicast`](crate::Cm::join_multicast).
        context: u64,
        /// Address vector (dgid = the group's GID), QPN 0xFFFFFF, the UDP Q_Key.
        ud: UdEventParam,
    },
}

/// One rdma_cm event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// The id it is for (for a connect request: the new id).
    pub id: CmIdHandle,
    /// For a connect request: the listening id it arrived on.
    pub listen_id: Option<CmIdHandle>,
    /// Which event.
    pub kind: CmEventKind,
    /// Status.
    pub status: EventStatus,
    /// Parameters.
    pub param: EventParam,
}
