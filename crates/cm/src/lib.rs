//! softverbs-cm: the connection manager, sans-IO.
//!
//! A [`Cm`] is the connection manager of one softverbs device: the IB CM state
//! machines of both sides (REQ / REP / RTU with MRA, REJ, DREQ / DREP, timewait, SIDR;
//! retransmission from the REQ's timeout fields; duplicates and stale connections as
//! Linux handles them) and rdma_cm over IP on top (ids, port spaces and service IDs,
//! the private-data header, listeners with wildcard and specific addresses, backlog,
//! events with their parameters, `rdma_init_qp_attr`, the QP transitions librdmacm
//! performs, address and route resolution, multicast joins). It does no I/O and reads
//! no clock, like the engine beside it: calls and `handle_*` inputs go in, `poll_*`
//! outputs come out, time is an argument. Facts come from the project's CM reference
//! (CM.md: IBA Vol 1 chapter 12 as the Linux kernel implements it, and librdmacm 44).
//!
//! # How a driver runs it
//!
//! Addresses are explicit everywhere: the cm decides, the driver only opens sockets
//! and moves datagrams.
//!
//! * **Sockets.** The device's UDP socket ([`CmConfig::device`]): the driver hands
//!   every datagram whose BTH names QP 1 to [`Cm::handle_datagram`] (with its source
//!   and the local address it arrived at), and everything else to the engine. Plus one
//!   *rendezvous* socket per reserved rdma_cm port: a listener (or an id bound to a
//!   port) asks for one through [`Reservation::Needed`]; everything it receives goes
//!   to [`Cm::handle_datagram`] too; [`DriverRequest::ReleasePort`] closes it. Another
//!   process holding the port makes the bind fail: [`Cm::complete_reservation`]`(id,
//!   false)` turns that into EADDRINUSE.
//! * **Sending.** [`Cm::poll_transmit`] gives whole datagrams (BTH + DETH + MAD +
//!   ICRC, UD SEND Only to QP 1), each with its destination; send them from the
//!   device socket (DF set, unconnected, as for all softverbs packets: the ICRC
//!   assumes IPv4 ID 0). Requests go to the listener's rendezvous address (peer IP
//!   and rdma_cm port); replies and everything later go device to device: the REP is
//!   sent from the listener's device, and its source address names that device to
//!   the active side, which sends the RTU, DREQs and RC data there.
//! * **ICMP.** When a send to a rendezvous address draws "port unreachable"
//!   (IP_RECVERR), call [`Cm::handle_unreachable`]: a connect to a port with nothing
//!   listening then fails at once with REJECTED (status 8, "invalid service ID").
//! * **Requests.** Drain [`Cm::poll_request`] after every call into the cm: resolve
//!   addresses (answer [`Cm::handle_addr_resolved`]), move QPs (answer
//!   [`Cm::handle_qp_modified`]; the cm sends the REP or RTU only after the QP is
//!   ready, so a synchronous `rdma_accept` drains and answers before returning), join
//!   and leave groups (answer [`Cm::handle_group_joined`]), release ports.
//! * **Events and time.** Drain [`Cm::poll_event`] into the ids' event channels; call
//!   [`Cm::handle_timeout`] when [`Cm::poll_timeout`] says.
//! * **The QP.** When the engine sees a connection's first packet while the passive
//!   side still waits for the RTU (IBV_EVENT_COMM_EST), call
//!   [`Cm::notify_established`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod active;
mod bind;
mod cm;
mod config;
mod conn;
mod disconnect;
mod error;
mod event;
mod handle;
mod id;
mod mcast;
mod passive;
mod qp;
mod recv;
mod request;
mod rng;
mod sidr;
mod time;
mod timers;
mod types;

pub use active::{REJ_USER_DATA_LEN, REP_USER_DATA_LEN, REQ_USER_DATA_LEN};
pub use cm::{Cm, CmCounters, ConnectionInfo};
pub use config::{CmConfig, IcrcCheck};
pub use conn::IbState;
pub use error::CmError;
pub use event::{CmEvent, CmEventKind, ConnEventParam, EventParam, EventStatus, UdEventParam};
pub use handle::CmIdHandle;
pub use request::{CmTransmit, DriverRequest, RequestToken, Reservation};
pub use sidr::{SIDR_REP_USER_DATA_LEN, SIDR_REQ_USER_DATA_LEN};
pub use softverbs_wire::cm::{RejReason, SidrStatus};
pub use softverbs_wire::{Gid, Psn, Qpn};
pub use time::{ack_timeout, cm_timeout, Instant};
pub use types::{
    AhAttr, ConnParam, IbMtu, IdOptions, IdState, PathRecord, PortSpace, QpAttrMask, QpAttrs,
    QpBinding, QpState, QpType, ResolveError, ResolvedAddr, ACCESS_REMOTE_ATOMIC,
    ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE, RDMA_UDP_QKEY,
};
