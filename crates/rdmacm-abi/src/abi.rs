//! `#[repr(C)]` mirrors of the public structs and constants of rdma-core 44's
//! `<rdma/rdma_cma.h>`, `<rdma/rsocket.h>`, and of what they embed from
//! `<infiniband/verbs.h>`, `<infiniband/sa.h>` and `<infiniband/ib.h>`.
//!
//! Programs read and write these structs directly (`id->verbs`, `id->qp`, `id->pd`,
//! `id->route.addr`, `event->param.conn.private_data`, the header inlines of
//! `<rdma/rdma_verbs.h>` and `rdma_get_local_addr`), so their layout is the ABI.
//! `tests/layout.rs` compiles a C program against the installed headers and checks the size
//! and alignment of every type and the offset and size of every field, and every constant's
//! value.
//!
//! The verbs objects an id points to (`ibv_context`, `ibv_qp`, `ibv_cq`, ...) belong to
//! libibverbs.so.1; here they are opaque: librdmacm only passes them to libibverbs' functions.
//! Types embedded by value (`ibv_gid`, `ibv_ah_attr`, `ibv_sa_path_rec`, ...) are mirrored.
//! The socket address types are `libc`'s (glibc's own definitions).
//!
//! C anonymous unions become named Rust unions (`rdma_addr::src`); the layout table maps
//! each to its C member names.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};

pub use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use softverbs_stub_support::zeroed;

pub use softverbs_stub_support::verbs_h::{
    ibv_ah_attr, ibv_gid, ibv_gid_global, ibv_global_route, ibv_qp_cap, ibv_rx_hash_conf,
    ibv_srq_attr, ibv_srq_init_attr,
};
softverbs_stub_support::qp_init_attr_mirrors!();

// ---------------------------------------------------------------------------------------------
// Constants (C enums cross the ABI as `int`; typed as the struct fields that hold them).
// ---------------------------------------------------------------------------------------------

/// `enum rdma_cm_event_type`
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_int = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_int = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_int = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_int = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_int = 7;
pub const RDMA_CM_EVENT_REJECTED: c_int = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_int = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_int = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_int = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_int = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_int = 15;

/// `enum rdma_port_space`
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013F;

/// Service ID masks and prefixes (`RDMA_IB_IP_*`, `RDMA_IB_PS_IB`).
pub const RDMA_IB_IP_PS_MASK: u64 = 0xFFFF_FFFF_FFFF_0000;
pub const RDMA_IB_IP_PORT_MASK: u64 = 0x0000_0000_0000_FFFF;
pub const RDMA_IB_IP_PS_TCP: u64 = 0x0000_0000_0106_0000;
pub const RDMA_IB_IP_PS_UDP: u64 = 0x0000_0000_0111_0000;
pub const RDMA_IB_PS_IB: u64 = 0x0000_0000_013F_0000;

/// The Q_Key rdma_cm gives UD QPs.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `rdma_conn_param` values meaning "the device maximum".
pub const RDMA_MAX_RESP_RES: u8 = 0xFF;
pub const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;

/// `rdma_addrinfo.ai_flags`
pub const RAI_PASSIVE: c_int = 0x1;
pub const RAI_NUMERICHOST: c_int = 0x2;
pub const RAI_NOROUTE: c_int = 0x4;
pub const RAI_FAMILY: c_int = 0x8;

/// `enum rdma_cm_join_mc_attr_mask`
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;

/// `enum rdma_cm_mc_join_flags`
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// `rdma_set_option` levels and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// `<rdma/rsocket.h>`: `SOL_RDMA` and its option names.
pub const SOL_RDMA: c_int = 0x10000;
pub const RDMA_SQSIZE: c_int = 0;
pub const RDMA_RQSIZE: c_int = 1;
pub const RDMA_INLINE: c_int = 2;
pub const RDMA_IOMAPSIZE: c_int = 3;
pub const RDMA_ROUTE: c_int = 4;

/// `<infiniband/ib.h>`: the InfiniBand address family.
pub const AF_IB: c_int = 27;

/// `<infiniband/sa.h>`: `ibv_path_data.flags`.
pub const IBV_PATH_FLAG_GMP: u32 = 1 << 0;
pub const IBV_PATH_FLAG_PRIMARY: u32 = 1 << 1;
pub const IBV_PATH_FLAG_ALTERNATE: u32 = 1 << 2;
pub const IBV_PATH_FLAG_OUTBOUND: u32 = 1 << 3;
pub const IBV_PATH_FLAG_INBOUND: u32 = 1 << 4;
pub const IBV_PATH_FLAG_INBOUND_REVERSE: u32 = 1 << 5;
pub const IBV_PATH_FLAG_BIDIRECTIONAL: u32 = IBV_PATH_FLAG_OUTBOUND | IBV_PATH_FLAG_INBOUND_REVERSE;

/// `enum ibv_qp_type` values rdma_cm assigns.
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_QPT_XRC_SEND: c_int = 9;
pub const IBV_QPT_XRC_RECV: c_int = 10;

// ---------------------------------------------------------------------------------------------
// Verbs objects: opaque here.
// ---------------------------------------------------------------------------------------------

macro_rules! opaque {
    ($($name:ident),* $(,)?) => { $(
        #[doc = concat!("`struct ", stringify!($name), "` (libibverbs' object; opaque here).")]
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )* };
}

opaque!(
    ibv_device,
    ibv_context,
    ibv_cq,
    ibv_comp_channel,
    ibv_srq,
    ibv_xrcd,
    ibv_rwq_ind_table
);

/// `struct ibv_pd`: librdmacm reads `pd->context` (`rdma_create_qp` checks the PD belongs
/// to the id's device, as rdma-core does).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_qp` (160 bytes): librdmacm reads `qp_num`, `srq` and `pd`, and keeps `state`
/// current for the transitions its connection manager makes (as `ibv_modify_qp` would).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    /// `enum ibv_qp_state`
    pub state: c_int,
    /// `enum ibv_qp_type`
    pub qp_type: c_int,
    /// `pthread_mutex_t` (libibverbs' own).
    pub mutex: [u64; 5],
    /// `pthread_cond_t` (libibverbs' own).
    pub cond: [u64; 6],
    pub events_completed: u32,
}

/// `struct ibv_tm_cap`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex` (64 bytes): what `rdma_create_srq_ex` takes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    /// `IBV_SRQ_INIT_ATTR_*`
    pub comp_mask: u32,
    /// `enum ibv_srq_type`
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

/// `struct ibv_qp_attr` (144 bytes), as an opaque buffer: librdmacm fills it only through
/// its connection manager (`rdma_init_qp_attr`) and reads `qp_state` (offset 0) from
/// `ibv_query_qp`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    /// `enum ibv_qp_state`
    pub qp_state: c_int,
    pub rest: [u32; 35],
}

/// `IBV_QP_INIT_ATTR_PD` and the other `ibv_qp_init_attr_ex.comp_mask` bits.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
/// `IBV_SRQ_INIT_ATTR_*`
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
/// `enum ibv_srq_type`
pub const IBV_SRQT_BASIC: c_int = 0;
pub const IBV_SRQT_XRC: c_int = 1;
/// `IBV_QP_STATE`, the `ibv_query_qp` mask bit librdmacm asks for.
pub const IBV_QP_STATE: c_int = 1;
/// `IBV_EVENT_COMM_EST`, the one event `rdma_notify` passes on.
pub const IBV_EVENT_COMM_EST: c_int = 4;
/// `IBV_TRANSPORT_IB`
pub const IBV_TRANSPORT_IB: c_int = 0;

// Where the header inline `ibv_create_qp_ex` finds its op (`verbs_get_ctx_op`): a context
// from libibverbs is the last member of a `struct verbs_context`, whose `sz` says how much of
// it precedes the context, and whose `abi_compat` is `VERBS_ABI_IS_EXTENDED`. Offsets checked
// against `<infiniband/verbs.h>` by tests/layout.rs.

/// `offsetof(struct ibv_context, abi_compat)`
pub const IBV_CONTEXT_ABI_COMPAT_OFFSET: usize = 320;
/// `offsetof(struct verbs_context, context)`
pub const VERBS_CONTEXT_CONTEXT_OFFSET: usize = 320;
/// `offsetof(struct verbs_context, create_qp_ex)`
pub const VERBS_CONTEXT_CREATE_QP_EX_OFFSET: usize = 264;
/// `offsetof(struct verbs_context, sz)`
pub const VERBS_CONTEXT_SZ_OFFSET: usize = 312;
/// `sizeof(struct verbs_context)`
pub const VERBS_CONTEXT_SIZE: usize = 648;
/// `VERBS_ABI_IS_EXTENDED`: `abi_compat` of a context with a `verbs_context` around it.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

// ---------------------------------------------------------------------------------------------
// Embedded verbs types
// ---------------------------------------------------------------------------------------------

/// `struct ibv_ece`: enhanced connection establishment options.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`): `rdma_cm_id.route.path_rec` points to
/// `num_paths` of them.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    /// Big-endian.
    pub dlid: u16,
    /// Big-endian.
    pub slid: u16,
    pub raw_traffic: c_int,
    /// Big-endian.
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    /// Big-endian.
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct ibv_path_record` (`<infiniband/sa.h>`): the wire path record
/// `RDMA_OPTION_IB_PATH` takes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_path_record {
    /// Big-endian.
    pub service_id: u64,
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    /// Flow label in bits 27:8, hop limit in 7:0 (big-endian).
    pub flowlabel_hoplimit: u32,
    pub tclass: u8,
    /// Reversible in bit 7, number of paths in 6:0.
    pub reversible_numpath: u8,
    pub pkey: u16,
    /// QoS class in bits 15:4, SL in 3:0 (big-endian).
    pub qosclass_sl: u16,
    /// Selector in bits 7:6, value in 5:0 (each of the next three).
    pub mtu: u8,
    pub rate: u8,
    pub packetlifetime: u8,
    pub preference: u8,
    pub reserved: [u8; 6],
}

/// `struct ibv_path_data` (`<infiniband/sa.h>`): an element of `RDMA_OPTION_IB_PATH`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_path_data {
    /// `IBV_PATH_FLAG_*`.
    pub flags: u32,
    pub reserved: u32,
    pub path: ibv_path_record,
}

// ---------------------------------------------------------------------------------------------
// AF_IB addresses (`<infiniband/ib.h>`)
// ---------------------------------------------------------------------------------------------

/// `struct ib_addr`, member `ib_u`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ib_addr_u {
    pub uib_addr8: [u8; 16],
    pub uib_addr16: [u16; 8],
    pub uib_addr32: [u32; 4],
    pub uib_addr64: [u64; 2],
}

/// `struct ib_addr`: a GID as an address.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_addr {
    pub ib_u: ib_addr_u,
}

/// `struct sockaddr_ib`: an `AF_IB` socket address.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct sockaddr_ib {
    pub sib_family: u16,
    /// Big-endian.
    pub sib_pkey: u16,
    /// Big-endian.
    pub sib_flowinfo: u32,
    pub sib_addr: ib_addr,
    /// Service ID, big-endian.
    pub sib_sid: u64,
    /// Big-endian.
    pub sib_sid_mask: u64,
    pub sib_scope_id: u64,
}

// ---------------------------------------------------------------------------------------------
// rdma_cm
// ---------------------------------------------------------------------------------------------

/// `struct rdma_ib_addr`: the GIDs and P_Key of a route.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    /// Big-endian.
    pub pkey: u16,
}

/// The anonymous union of socket address forms in `struct rdma_addr` (the `src_*` members;
/// the `dst_*` ones are the same union).
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_sockaddr {
    pub addr: sockaddr,
    pub sin: sockaddr_in,
    pub sin6: sockaddr_in6,
    pub storage: sockaddr_storage,
}

/// `struct rdma_addr`, member `addr` (a union of one member).
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_addr_addr {
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_addr` (296 bytes): `src_addr`/`src_sin`/`src_sin6`/`src_storage` are
/// `src.addr`/... here, likewise for `dst`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: rdma_sockaddr,
    pub dst: rdma_sockaddr,
    pub addr: rdma_addr_addr,
}

/// `struct rdma_route` (312 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`: an fd programs poll and may set `O_NONBLOCK` on.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    /// `enum rdma_port_space`
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`
    pub qp_type: c_int,
}

/// `struct rdma_conn_param` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// `struct rdma_cm_event`, member `param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event` (80 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: socklen_t,
    pub ai_dst_len: socklen_t,
    pub ai_src_addr: *mut sockaddr,
    pub ai_dst_addr: *mut sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`
    pub join_flags: u32,
    pub addr: *mut sockaddr,
}

zeroed!(
    ibv_pd,
    ibv_qp,
    ibv_qp_init_attr,
    ibv_qp_init_attr_ex,
    ibv_tm_cap,
    ibv_srq_init_attr_ex,
    ibv_qp_attr,
    ibv_ece,
    ibv_sa_path_rec,
    ibv_path_record,
    ibv_path_data,
    ib_addr,
    sockaddr_ib,
    rdma_ib_addr,
    rdma_sockaddr,
    rdma_addr,
    rdma_route,
    rdma_event_channel,
    rdma_cm_id,
    rdma_conn_param,
    rdma_ud_param,
    rdma_cm_event_param,
    rdma_cm_event,
    rdma_addrinfo,
    rdma_cm_join_mc_attr_ex,
);
