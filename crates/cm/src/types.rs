//! Values the cm's callers hand in and take out: connection parameters, QPs, routes,
//! address vectors and the QP attributes rdma_cm hands out.

use softverbs_wire::{Gid, Psn, Qpn};
use std::net::{IpAddr, SocketAddr};

pub use softverbs_wire::cm::PortSpace;

/// The Q_Key rdma_cm gives every UD QP of the UDP and IB port spaces, and puts in
/// SIDR_REPs and multicast join events (Linux `RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The QP type of an rdma_cm id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: REQ / REP / RTU, DREQ / DREP.
    Rc,
    /// Unreliable datagram: SIDR_REQ / SIDR_REP, multicast.
    Ud,
}

/// An InfiniBand path MTU (IBA 9.6.4: the enum the CM messages and QP attributes
/// carry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IbMtu {
    /// 256 bytes (code 1).
    Mtu256,
    /// 512 bytes (code 2).
    Mtu512,
    /// 1024 bytes (code 3).
    Mtu1024,
    /// 2048 bytes (code 4).
    Mtu2048,
    /// 4096 bytes (code 5).
    Mtu4096,
}

impl IbMtu {
    const ALL: [IbMtu; 5] = [
        IbMtu::Mtu256,
        IbMtu::Mtu512,
        IbMtu::Mtu1024,
        IbMtu::Mtu2048,
        IbMtu::Mtu4096,
    ];

    /// The code on the wire and in `ibv_qp_attr.path_mtu`.
    pub const fn code(self) -> u8 {
        match self {
            IbMtu::Mtu256 => 1,
            IbMtu::Mtu512 => 2,
            IbMtu::Mtu1024 => 3,
            IbMtu::Mtu2048 => 4,
            IbMtu::Mtu4096 => 5,
        }
    }

    /// The MTU a code names.
    pub fn from_code(code: u8) -> Option<IbMtu> {
        IbMtu::ALL.into_iter().find(|m| m.code() == code)
    }

    /// Payload bytes.
    pub const fn bytes(self) -> u32 {
        128 << self.code()
    }

    /// The largest IB MTU whose packets fit a link of `link_mtu` bytes: RoCEv2 needs
    /// 96 bytes of headers around the payload (IP 40, UDP 8, BTH 12, XRC 4, AtomicETH
    /// 28, ICRC 4; Linux `iboe_get_mtu`, CM.md 2.8). `None` below 352.
    pub fn for_link(link_mtu: u32) -> Option<IbMtu> {
        let room = link_mtu.checked_sub(96)?;
        IbMtu::ALL.into_iter().rev().find(|m| m.bytes() <= room)
    }
}

/// Connection parameters of `rdma_connect` and `rdma_accept` (`struct
/// rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnParam {
    /// Private data for the peer (at most 56 bytes in a REQ, 180 in a SIDR_REQ, 196
    /// in a REP, 136 in a SIDR_REP).
    pub private_data: Vec<u8>,
    /// RDMA READs and atomics this side accepts at once as responder; 255 means the
    /// device's most (on accept: at most what the peer asked for).
    pub responder_resources: u8,
    /// RDMA READs and atomics this side issues at once; 255 as above.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (at most 7; connect only).
    pub retry_count: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (for an id whose QP the cm does not know).
    pub srq: bool,
    /// The QP to connect, for an id whose QP the application created itself
    /// (`conn_param.qp_num`); ignored when the id has a QP.
    pub qp_num: Option<Qpn>,
}

/// A QP tied to an rdma_cm id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpBinding {
    /// Its number.
    pub qpn: Qpn,
    /// Whether it takes receives from an SRQ.
    pub srq: bool,
    /// Whether the cm drives its state (a QP made with `rdma_create_qp`): the cm then
    /// asks for the transitions librdmacm performs (INIT when tied, RTR and RTS on
    /// connect and accept, ERR on disconnect and reject). An application's own QP is
    /// `false`: it moves it itself with [`Cm::init_qp_attr`](crate::Cm::init_qp_attr).
    pub managed: bool,
}

/// The driver's answer to a [`ResolveAddr`](crate::DriverRequest::ResolveAddr)
/// request: what the local routing table says about the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedAddr {
    /// The local address the kernel would send from (a connected UDP socket's local
    /// address is one honest way to learn it).
    pub src_ip: IpAddr,
    /// Path MTU: [`IbMtu::for_link`] of the outgoing interface's MTU, capped by the
    /// device's.
    pub mtu: IbMtu,
    /// Hop limit of the route (64 typical; 1 on loopback is fine too).
    pub hop_limit: u8,
}

/// Why address resolution failed, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ResolveError {
    /// No route to the host (EHOSTUNREACH).
    #[error("no route to host")]
    HostUnreachable,
    /// The network is unreachable (ENETUNREACH).
    #[error("network unreachable")]
    NetworkUnreachable,
    /// The source address is not a local address (EADDRNOTAVAIL).
    #[error("address not available")]
    AddressNotAvailable,
    /// No softverbs device serves the route (ENODEV).
    #[error("no device for this address")]
    NoDevice,
}

/// The path rdma_cm resolved to the peer (`struct ibv_sa_path_rec` as librdmacm
/// shows it in `id->route.path_rec`; CM.md 4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRecord {
    /// Local GID: the local device's.
    pub sgid: Gid,
    /// Remote GID: the peer's IP address in RoCEv2 form (its device, once known).
    pub dgid: Gid,
    /// Partition key (0xFFFF).
    pub pkey: u16,
    /// Path MTU.
    pub mtu: IbMtu,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class (the TOS option).
    pub traffic_class: u8,
    /// Flow label: (source port * 31 + destination port) mod 2^20 for RoCEv2.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Static rate code (0: the port's rate).
    pub rate: u8,
    /// Packet life time (18 on RoCE unless the ACK-timeout option says otherwise).
    pub packet_life_time: u8,
}

/// An address vector (`struct ibv_ah_attr`), with the UDP endpoint it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID (the peer device's, in softverbs' GID form).
    pub dgid: Gid,
    /// The peer device's UDP endpoint (what `dgid` encodes, given explicitly because
    /// an IPv6 device off port 4791 cannot be written as a GID).
    pub dest: SocketAddr,
    /// Source GID index (0: softverbs devices have one GID).
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Port (1).
    pub port_num: u8,
    /// Whether a GRH is used (always on RoCE).
    pub is_global: bool,
}

/// The QP states the cm asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// INIT.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Error: flush everything.
    Err,
}

/// Which fields of [`QpAttrs`] a transition sets; bit values are those of `enum
/// ibv_qp_attr_mask`, so they pass straight through to `ibv_modify_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttrMask(pub u32);

impl QpAttrMask {
    /// qp_state.
    pub const STATE: QpAttrMask = QpAttrMask(1);
    /// qp_access_flags.
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// pkey_index.
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// port_num.
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// qkey.
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// ah_attr.
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// path_mtu.
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// timeout.
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// retry_cnt.
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// rnr_retry.
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// rq_psn.
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// max_rd_atomic.
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// min_rnr_timer.
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// sq_psn.
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// max_dest_rd_atomic.
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// dest_qp_num.
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: QpAttrMask) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, rhs: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | rhs.0)
    }
}

/// Remote write access (`IBV_ACCESS_REMOTE_WRITE`).
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// Remote read access (`IBV_ACCESS_REMOTE_READ`).
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
/// Remote atomic access (`IBV_ACCESS_REMOTE_ATOMIC`).
pub const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

/// QP attributes for one transition, as `rdma_init_qp_attr` fills `struct
/// ibv_qp_attr`: only the fields named in `mask` mean anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// The target state.
    pub state: QpState,
    /// Which fields are set.
    pub mask: QpAttrMask,
    /// Remote access flags (`ACCESS_*`).
    pub access_flags: u32,
    /// P_Key index (0: the one P_Key, 0xFFFF).
    pub pkey_index: u16,
    /// Port (1).
    pub port_num: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Address vector of the peer (RC RTR).
    pub ah: Option<AhAttr>,
    /// Path MTU.
    pub path_mtu: IbMtu,
    /// The peer's QPN.
    pub dest_qpn: Qpn,
    /// First PSN this QP expects.
    pub rq_psn: Psn,
    /// READs/atomics accepted at once as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// First PSN this QP sends.
    pub sq_psn: Psn,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// READs/atomics issued at once.
    pub max_rd_atomic: u8,
}

impl QpAttrs {
    /// Attributes that set only the state.
    pub fn state_only(state: QpState) -> QpAttrs {
        QpAttrs {
            state,
            mask: QpAttrMask::STATE,
            access_flags: 0,
            pkey_index: 0,
            port_num: 1,
            qkey: 0,
            ah: None,
            path_mtu: IbMtu::Mtu1024,
            dest_qpn: Qpn::new(0),
            rq_psn: Psn::new(0),
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            sq_psn: Psn::new(0),
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        }
    }
}

/// The state of an rdma_cm id (`enum rdma_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdState {
    /// Created, nothing else.
    Idle,
    /// Bound to a local address.
    AddrBound,
    /// Address resolution under way.
    AddrQuery,
    /// The destination and the local address to reach it are known.
    AddrResolved,
    /// Route resolution under way.
    RouteQuery,
    /// The route is known: ready to connect.
    RouteResolved,
    /// Listening for connection requests.
    Listen,
    /// Connecting, connected, or (for a passive id) handed a request.
    Connect,
    /// Disconnected (or disconnecting).
    Disconnect,
}

/// Per-id options (`rdma_set_option`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdOptions {
    /// Type of service: the traffic class of the path.
    pub tos: u8,
    /// Local ACK timeout to use instead of the computed one.
    pub ack_timeout: Option<u8>,
    /// Allow binding an address another non-listening id with this option holds.
    pub reuse_addr: bool,
    /// An IPv6 wildcard listener takes IPv6 requests only.
    pub afonly: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_and_links() {
        for m in IbMtu::ALL {
            assert_eq!(IbMtu::from_code(m.code()), Some(m));
        }
        assert_eq!(IbMtu::from_code(0), None);
        assert_eq!(IbMtu::Mtu4096.bytes(), 4096);
        assert_eq!(IbMtu::for_link(1500), Some(IbMtu::Mtu1024));
        assert_eq!(IbMtu::for_link(9000), Some(IbMtu::Mtu4096));
        assert_eq!(IbMtu::for_link(65536), Some(IbMtu::Mtu4096));
        assert_eq!(IbMtu::for_link(300), None);
    }
}
