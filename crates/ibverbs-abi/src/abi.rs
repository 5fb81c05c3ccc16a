//! `#[repr(C)]` mirrors of rdma-core 44's public structs (`<infiniband/verbs.h>`).
//!
//! Type and field names are the C names, so a field here and in the header are the same word
//! and the layout test (`tests/layout.rs`) can print `offsetof(struct X, f)` for each. Where C
//! has an anonymous union the Rust field needs a name; those are documented at the field, and
//! the test maps them to the C spelling of their members.
//!
//! Function pointers are `Option<unsafe extern "C" fn ..>` (NULL is `None`). Pointers to
//! structs that softverbs does not mirror are `*mut c_void`. Everything here is plain old data:
//! all-zero bytes are a valid value of every type (see [`Zeroed`]).

#![allow(non_camel_case_types, non_snake_case)]

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t};

pub use softverbs_stub_support::verbs_h::{
    ibv_ah_attr, ibv_gid, ibv_gid_global, ibv_global_route, ibv_qp_cap, ibv_rx_hash_conf,
    ibv_srq_attr, ibv_srq_init_attr,
};
softverbs_stub_support::qp_init_attr_mirrors!();

/// Types for which the all-zero bit pattern is a valid value (null pointers, `None` function
/// pointers, zero integers, glibc's `PTHREAD_{MUTEX,COND}_INITIALIZER`).
///
/// # Safety
/// Implement only for types whose every field accepts all-zero bytes.
pub unsafe trait Zeroed: Sized {
    /// A value with every byte zero.
    fn zeroed() -> Self {
        // SAFETY: the trait's contract says all-zero bytes are a valid `Self`.
        unsafe { core::mem::zeroed() }
    }
}

macro_rules! zeroed {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: `$t` holds only integers, raw pointers, `Option` of function pointers,
        // arrays and unions of those, and glibc pthread objects whose initializer is all zero.
        unsafe impl Zeroed for $t {}
    )* };
}

// ---------------------------------------------------------------------------------------------
// Constants (enums in C; `c_int`/`u32` here because C enums cross the ABI as `int`).
// ---------------------------------------------------------------------------------------------

/// `IBV_SYSFS_NAME_MAX`
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `__VERBS_ABI_IS_EXTENDED`: the value of `ibv_context.abi_compat` that tells the header
/// inlines a [`verbs_context`] sits before the [`ibv_context`].
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

// enum ibv_node_type
pub const IBV_NODE_UNKNOWN: c_int = -1;
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_NODE_SWITCH: c_int = 2;
pub const IBV_NODE_ROUTER: c_int = 3;
pub const IBV_NODE_RNIC: c_int = 4;
pub const IBV_NODE_USNIC: c_int = 5;
pub const IBV_NODE_USNIC_UDP: c_int = 6;
pub const IBV_NODE_UNSPECIFIED: c_int = 7;

// enum ibv_transport_type
pub const IBV_TRANSPORT_UNKNOWN: c_int = -1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_TRANSPORT_IWARP: c_int = 1;
pub const IBV_TRANSPORT_USNIC: c_int = 2;
pub const IBV_TRANSPORT_USNIC_UDP: c_int = 3;
pub const IBV_TRANSPORT_UNSPECIFIED: c_int = 4;

// enum ibv_atomic_cap
pub const IBV_ATOMIC_NONE: c_int = 0;
pub const IBV_ATOMIC_HCA: c_int = 1;
pub const IBV_ATOMIC_GLOB: c_int = 2;

// enum ibv_mtu
pub const IBV_MTU_256: c_int = 1;
pub const IBV_MTU_512: c_int = 2;
pub const IBV_MTU_1024: c_int = 3;
pub const IBV_MTU_2048: c_int = 4;
pub const IBV_MTU_4096: c_int = 5;

// enum ibv_port_state
pub const IBV_PORT_NOP: c_int = 0;
pub const IBV_PORT_DOWN: c_int = 1;
pub const IBV_PORT_INIT: c_int = 2;
pub const IBV_PORT_ARMED: c_int = 3;
pub const IBV_PORT_ACTIVE: c_int = 4;
pub const IBV_PORT_ACTIVE_DEFER: c_int = 5;

// link layers (anonymous enum)
pub const IBV_LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// enum ibv_gid_type
pub const IBV_GID_TYPE_IB: c_int = 0;
pub const IBV_GID_TYPE_ROCE_V1: c_int = 1;
pub const IBV_GID_TYPE_ROCE_V2: c_int = 2;

// enum ibv_event_type
pub const IBV_EVENT_CQ_ERR: c_int = 0;
pub const IBV_EVENT_QP_FATAL: c_int = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_int = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
pub const IBV_EVENT_COMM_EST: c_int = 4;
pub const IBV_EVENT_SQ_DRAINED: c_int = 5;
pub const IBV_EVENT_PATH_MIG: c_int = 6;
pub const IBV_EVENT_PATH_MIG_ERR: c_int = 7;
pub const IBV_EVENT_DEVICE_FATAL: c_int = 8;
pub const IBV_EVENT_PORT_ACTIVE: c_int = 9;
pub const IBV_EVENT_PORT_ERR: c_int = 10;
pub const IBV_EVENT_LID_CHANGE: c_int = 11;
pub const IBV_EVENT_PKEY_CHANGE: c_int = 12;
pub const IBV_EVENT_SM_CHANGE: c_int = 13;
pub const IBV_EVENT_SRQ_ERR: c_int = 14;
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;
pub const IBV_EVENT_CLIENT_REREGISTER: c_int = 17;
pub const IBV_EVENT_GID_CHANGE: c_int = 18;
pub const IBV_EVENT_WQ_FATAL: c_int = 19;

// enum ibv_wc_status
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_LOC_LEN_ERR: c_int = 1;
pub const IBV_WC_LOC_QP_OP_ERR: c_int = 2;
pub const IBV_WC_LOC_EEC_OP_ERR: c_int = 3;
pub const IBV_WC_LOC_PROT_ERR: c_int = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_int = 5;
pub const IBV_WC_MW_BIND_ERR: c_int = 6;
pub const IBV_WC_BAD_RESP_ERR: c_int = 7;
pub const IBV_WC_LOC_ACCESS_ERR: c_int = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_int = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_int = 10;
pub const IBV_WC_REM_OP_ERR: c_int = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_int = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_int = 13;
pub const IBV_WC_LOC_RDD_VIOL_ERR: c_int = 14;
pub const IBV_WC_REM_INV_RD_REQ_ERR: c_int = 15;
pub const IBV_WC_REM_ABORT_ERR: c_int = 16;
pub const IBV_WC_INV_EECN_ERR: c_int = 17;
pub const IBV_WC_INV_EEC_STATE_ERR: c_int = 18;
pub const IBV_WC_FATAL_ERR: c_int = 19;
pub const IBV_WC_RESP_TIMEOUT_ERR: c_int = 20;
pub const IBV_WC_GENERAL_ERR: c_int = 21;
pub const IBV_WC_TM_ERR: c_int = 22;
pub const IBV_WC_TM_RNDV_INCOMPLETE: c_int = 23;

// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_int = 0;
pub const IBV_WC_RDMA_WRITE: c_int = 1;
pub const IBV_WC_RDMA_READ: c_int = 2;
pub const IBV_WC_COMP_SWAP: c_int = 3;
pub const IBV_WC_FETCH_ADD: c_int = 4;
pub const IBV_WC_BIND_MW: c_int = 5;
pub const IBV_WC_LOCAL_INV: c_int = 6;
pub const IBV_WC_TSO: c_int = 7;
pub const IBV_WC_ATOMIC_WRITE: c_int = 9;
pub const IBV_WC_RECV: c_int = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_int = IBV_WC_RECV + 1;

// enum ibv_wc_flags
pub const IBV_WC_GRH: c_uint = 1 << 0;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;
pub const IBV_WC_IP_CSUM_OK: c_uint = 1 << 2;
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
pub const IBV_WR_LOCAL_INV: c_int = 7;
pub const IBV_WR_BIND_MW: c_int = 8;
pub const IBV_WR_SEND_WITH_INV: c_int = 9;
pub const IBV_WR_TSO: c_int = 10;
pub const IBV_WR_DRIVER1: c_int = 11;
pub const IBV_WR_ATOMIC_WRITE: c_int = 15;

// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
pub const IBV_SEND_IP_CSUM: c_uint = 1 << 4;

// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_uint = 1 << 3;
pub const IBV_ACCESS_MW_BIND: c_uint = 1 << 4;
pub const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;
pub const IBV_ACCESS_ON_DEMAND: c_uint = 1 << 6;
pub const IBV_ACCESS_HUGETLB: c_uint = 1 << 7;
/// `IB_UVERBS_ACCESS_OPTIONAL_FIRST`
pub const IBV_ACCESS_OPTIONAL_FIRST: c_uint = 1 << 20;
pub const IBV_ACCESS_RELAXED_ORDERING: c_uint = IBV_ACCESS_OPTIONAL_FIRST;
/// Access bits a provider must ignore when it does not support them (never reject).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;

// enum ibv_mw_type
pub const IBV_MW_TYPE_1: c_int = 1;
pub const IBV_MW_TYPE_2: c_int = 2;

// enum ibv_qp_type
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_QPT_RAW_PACKET: c_int = 8;
pub const IBV_QPT_XRC_SEND: c_int = 9;
pub const IBV_QPT_XRC_RECV: c_int = 10;
pub const IBV_QPT_DRIVER: c_int = 0xff;

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_SQD: c_int = 4;
pub const IBV_QPS_SQE: c_int = 5;
pub const IBV_QPS_ERR: c_int = 6;
pub const IBV_QPS_UNKNOWN: c_int = 7;

// enum ibv_mig_state
pub const IBV_MIG_MIGRATED: c_int = 0;
pub const IBV_MIG_REARM: c_int = 1;
pub const IBV_MIG_ARMED: c_int = 2;

// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_CUR_STATE: c_int = 1 << 1;
pub const IBV_QP_EN_SQD_ASYNC_NOTIFY: c_int = 1 << 2;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_PATH_MIG_STATE: c_int = 1 << 18;
pub const IBV_QP_CAP: c_int = 1 << 19;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_QP_RATE_LIMIT: c_int = 1 << 25;

// enum ibv_qp_init_attr_mask
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
pub const IBV_QP_INIT_ATTR_MAX_TSO_HEADER: u32 = 1 << 3;
pub const IBV_QP_INIT_ATTR_IND_TABLE: u32 = 1 << 4;
pub const IBV_QP_INIT_ATTR_RX_HASH: u32 = 1 << 5;
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

// enum ibv_qp_create_send_ops_flags
pub const IBV_QP_EX_WITH_RDMA_WRITE: u64 = 1 << 0;
pub const IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
pub const IBV_QP_EX_WITH_SEND: u64 = 1 << 2;
pub const IBV_QP_EX_WITH_SEND_WITH_IMM: u64 = 1 << 3;
pub const IBV_QP_EX_WITH_RDMA_READ: u64 = 1 << 4;
pub const IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
pub const IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
pub const IBV_QP_EX_WITH_LOCAL_INV: u64 = 1 << 7;
pub const IBV_QP_EX_WITH_BIND_MW: u64 = 1 << 8;
pub const IBV_QP_EX_WITH_SEND_WITH_INV: u64 = 1 << 9;
pub const IBV_QP_EX_WITH_TSO: u64 = 1 << 10;
pub const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

// enum ibv_wq_type / ibv_wq_state
pub const IBV_WQT_RQ: c_int = 0;
pub const IBV_WQS_RESET: c_int = 0;
pub const IBV_WQS_RDY: c_int = 1;
pub const IBV_WQS_ERR: c_int = 2;
pub const IBV_WQS_UNKNOWN: c_int = 3;

// enum ibv_rate
pub const IBV_RATE_MAX: c_int = 0;
pub const IBV_RATE_2_5_GBPS: c_int = 2;
pub const IBV_RATE_5_GBPS: c_int = 5;
pub const IBV_RATE_10_GBPS: c_int = 3;
pub const IBV_RATE_20_GBPS: c_int = 6;
pub const IBV_RATE_30_GBPS: c_int = 4;
pub const IBV_RATE_40_GBPS: c_int = 7;
pub const IBV_RATE_60_GBPS: c_int = 8;
pub const IBV_RATE_80_GBPS: c_int = 9;
pub const IBV_RATE_120_GBPS: c_int = 10;

// ---------------------------------------------------------------------------------------------
// Opaque objects softverbs does not mirror (only ever seen behind pointers).
// ---------------------------------------------------------------------------------------------

macro_rules! opaque {
    ($($name:ident),* $(,)?) => { $(
        #[doc = concat!("Opaque `struct ", stringify!($name), "`.")]
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )* };
}
opaque!(
    ibv_xrcd,
    ibv_rwq_ind_table,
    ibv_flow,
    ibv_dm,
    ibv_td,
    ibv_counters,
    ibv_flow_action,
    ibv_wc_tm_info
);

// ---------------------------------------------------------------------------------------------
// Device and context
// ---------------------------------------------------------------------------------------------

/// `struct _ibv_device_ops`: two unused slots kept for ABI compatibility.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct _ibv_device_ops {
    pub _dummy1: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut ibv_context>,
    pub _dummy2: Option<unsafe extern "C" fn(*mut ibv_context)>,
}

/// `struct ibv_device` (664 bytes). rdma-core embeds it in its private `verbs_device`;
/// applications only see `ibv_device`, so softverbs wraps it in its own type.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

type CompatFn = Option<unsafe extern "C" fn() -> *mut c_void>;

/// `struct ibv_context_ops` (256 bytes): the table the header inlines (`ibv_post_send`,
/// `ibv_poll_cq`, ...) jump through. `_compat_*` slots are unused by rdma-core 44 callers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    pub _compat_query_device:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int>,
    pub _compat_query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void) -> c_int>,
    pub _compat_alloc_pd: CompatFn,
    pub _compat_dealloc_pd: CompatFn,
    pub _compat_reg_mr: CompatFn,
    pub _compat_rereg_mr: CompatFn,
    pub _compat_dereg_mr: CompatFn,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub _compat_create_cq: CompatFn,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat_cq_event: CompatFn,
    pub _compat_resize_cq: CompatFn,
    pub _compat_destroy_cq: CompatFn,
    pub _compat_create_srq: CompatFn,
    pub _compat_modify_srq: CompatFn,
    pub _compat_query_srq: CompatFn,
    pub _compat_destroy_srq: CompatFn,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    pub _compat_create_qp: CompatFn,
    pub _compat_query_qp: CompatFn,
    pub _compat_modify_qp: CompatFn,
    pub _compat_destroy_qp: CompatFn,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_ah: CompatFn,
    pub _compat_destroy_ah: CompatFn,
    pub _compat_attach_mcast: CompatFn,
    pub _compat_detach_mcast: CompatFn,
    pub _compat_async_event: CompatFn,
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    /// [`VERBS_ABI_IS_EXTENDED`] when a [`verbs_context`] surrounds this context.
    pub abi_compat: *mut c_void,
}

type VoidFn = Option<unsafe extern "C" fn()>;

/// `struct verbs_context` (648 bytes): the extended op table that sits directly before
/// [`ibv_context`]. Header inlines use an op only if `sz >= 648 - offsetof(op)`, so a
/// provider that fills everything sets `sz = size_of::<verbs_context>()`. Ops are listed
/// from the lowest address; new ops in rdma-core are added at the front ("grows up").
#[repr(C)]
#[derive(Clone, Copy)]
pub struct verbs_context {
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    pub advise_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, c_int, u32, *mut ibv_sge, u32) -> c_int>,
    pub alloc_null_mr: Option<unsafe extern "C" fn(*mut ibv_pd) -> *mut ibv_mr>,
    pub read_counters: Option<unsafe extern "C" fn(*mut ibv_counters, *mut u64, u32, u32) -> c_int>,
    pub attach_counters_point_flow:
        Option<unsafe extern "C" fn(*mut ibv_counters, *mut c_void, *mut ibv_flow) -> c_int>,
    pub create_counters:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_counters>,
    pub destroy_counters: Option<unsafe extern "C" fn(*mut ibv_counters) -> c_int>,
    pub reg_dm_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr>,
    pub alloc_dm: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_dm>,
    pub free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
    pub modify_flow_action_esp:
        Option<unsafe extern "C" fn(*mut ibv_flow_action, *mut c_void) -> c_int>,
    pub destroy_flow_action: Option<unsafe extern "C" fn(*mut ibv_flow_action) -> c_int>,
    pub create_flow_action_esp:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_flow_action>,
    pub modify_qp_rate_limit: Option<unsafe extern "C" fn(*mut ibv_qp, *mut c_void) -> c_int>,
    pub alloc_parent_domain:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_pd>,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    pub alloc_td: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_td>,
    pub modify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, *mut c_void) -> c_int>,
    pub post_srq_ops:
        Option<unsafe extern "C" fn(*mut ibv_srq, *mut c_void, *mut *mut c_void) -> c_int>,
    pub destroy_rwq_ind_table: Option<unsafe extern "C" fn(*mut ibv_rwq_ind_table) -> c_int>,
    pub create_rwq_ind_table:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_rwq_ind_table>,
    pub destroy_wq: Option<unsafe extern "C" fn(*mut ibv_wq) -> c_int>,
    pub modify_wq: Option<unsafe extern "C" fn(*mut ibv_wq, *mut c_void) -> c_int>,
    pub create_wq: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_wq>,
    pub query_rt_values: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> c_int>,
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    /// `priv` in C (a keyword in Rust).
    pub priv_: *mut c_void,
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const c_void,
            *mut ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    pub ibv_destroy_flow: Option<unsafe extern "C" fn(*mut ibv_flow) -> c_int>,
    pub ABI_placeholder2: VoidFn,
    pub ibv_create_flow: Option<unsafe extern "C" fn(*mut ibv_qp, *mut c_void) -> *mut ibv_flow>,
    pub ABI_placeholder1: VoidFn,
    pub open_qp: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_qp>,
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    pub create_srq_ex: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_srq>,
    pub open_xrcd: Option<unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_xrcd>,
    /// Called unchecked by the `ibv_close_xrcd` inline: must be set whenever `sz` covers it.
    pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
    pub _ABI_placeholder3: u64,
    /// Must be immediately before `context`.
    pub sz: usize,
    /// Must be the last field.
    pub context: ibv_context,
}

// ---------------------------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------------------------

/// `struct ibv_device_attr` (232 bytes). GUIDs are big-endian.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// The anonymous `per_transport_caps` struct of `ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_odp_per_transport_caps {
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_odp_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub per_transport_caps: ibv_odp_per_transport_caps,
}

/// `struct ibv_tso_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex` (400 bytes). Callers pass their own size to
/// `query_device_ex`; a provider fills at most that many bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` (52 bytes with v44 headers; the exported `ibv_query_port` gets the
/// old 48-byte layout, i.e. this struct without `flags` and `port_cap_flags2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Size of the pre-v1.? `struct ibv_port_attr` the exported `ibv_query_port` symbol fills
/// (up to and including `link_layer`, padded).
pub const COMPAT_PORT_ATTR_SIZE: usize = 48;

// ---------------------------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------------------------

/// `struct ibv_gid_entry`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_grh` (40 bytes, the wire GRH as delivered in front of UD receives).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_grh {
    pub version_tclass_flow: u32,
    pub paylen: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
}

// ---------------------------------------------------------------------------------------------
// Objects (each has its `context` at offset 0)
// ---------------------------------------------------------------------------------------------

/// `struct ibv_pd`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`
    pub type_: c_int,
}

/// `struct ibv_mw_bind_info`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_comp_channel`. `fd` must be a real, blocking, pollable descriptor.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_poll_cq_attr`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_ex` (288 bytes): an [`ibv_cq`]'s fields followed by the polling ops.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u64>,
}

/// `struct ibv_cq_init_attr_ex` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_wq`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wq {
    pub context: *mut ibv_context,
    pub wq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq,
    pub wq_num: u32,
    pub handle: u32,
    /// `enum ibv_wq_state`
    pub state: c_int,
    /// `enum ibv_wq_type`
    pub wq_type: c_int,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_wq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
    pub comp_mask: u32,
}

/// `struct ibv_qp` (160 bytes).
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
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_data_buf`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_qp_ex` (352 bytes): starts with an [`ibv_qp`]; applications write `wr_id`
/// and `wr_flags` directly and call the `wr_*` ops.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_ah`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

// ---------------------------------------------------------------------------------------------
// Work requests and completions
// ---------------------------------------------------------------------------------------------

/// `struct ibv_sge` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The anonymous `imm_data` / `invalidate_rkey` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_imm {
    /// Network byte order.
    pub imm_data: u32,
    pub invalidate_rkey: u32,
}

/// `wr.rdma`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `qp_type.xrc`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_xrc {
    pub remote_srqn: u32,
}

/// The `qp_type` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    pub xrc: ibv_send_wr_xrc,
}

/// `bind_mw`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `tso`
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The anonymous `bind_mw` / `tso` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_bind_mw_tso {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// Anonymous in C: `wr->imm_data` / `wr->invalidate_rkey`.
    pub imm: ibv_send_wr_imm,
    pub wr: ibv_send_wr_wr,
    pub qp_type: ibv_send_wr_qp_type,
    /// Anonymous in C: `wr->bind_mw` / `wr->tso`.
    pub bind_mw_tso: ibv_send_wr_bind_mw_tso,
}

/// `struct ibv_recv_wr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// The anonymous `imm_data` / `invalidated_rkey` union of `ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_wc_imm {
    /// Network byte order.
    pub imm_data: u32,
    pub invalidated_rkey: u32,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    pub wr_id: u64,
    /// `enum ibv_wc_status`
    pub status: c_int,
    /// `enum ibv_wc_opcode`
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Anonymous in C: `wc->imm_data` / `wc->invalidated_rkey`.
    pub imm: ibv_wc_imm,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// The `element` union of `ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut ibv_wq,
    pub port_num: c_int,
}

/// `struct ibv_async_event` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: ibv_async_event_element,
    /// `enum ibv_event_type`
    pub event_type: c_int,
}

zeroed!(
    _ibv_device_ops,
    ibv_device,
    ibv_context_ops,
    ibv_context,
    verbs_context,
    ibv_device_attr,
    ibv_odp_per_transport_caps,
    ibv_odp_caps,
    ibv_tso_caps,
    ibv_rss_caps,
    ibv_packet_pacing_caps,
    ibv_tm_caps,
    ibv_cq_moderation_caps,
    ibv_pci_atomic_caps,
    ibv_device_attr_ex,
    ibv_port_attr,
    ibv_gid_global,
    ibv_gid,
    ibv_gid_entry,
    ibv_global_route,
    ibv_grh,
    ibv_ah_attr,
    ibv_pd,
    ibv_mr,
    ibv_mw,
    ibv_mw_bind_info,
    ibv_mw_bind,
    ibv_comp_channel,
    ibv_cq,
    ibv_poll_cq_attr,
    ibv_cq_ex,
    ibv_cq_init_attr_ex,
    ibv_srq,
    ibv_srq_attr,
    ibv_srq_init_attr,
    ibv_wq,
    ibv_qp,
    ibv_data_buf,
    ibv_qp_ex,
    ibv_qp_cap,
    ibv_qp_init_attr,
    ibv_rx_hash_conf,
    ibv_qp_init_attr_ex,
    ibv_qp_attr,
    ibv_ah,
    ibv_sge,
    ibv_send_wr_imm,
    ibv_send_wr_rdma,
    ibv_send_wr_atomic,
    ibv_send_wr_ud,
    ibv_send_wr_wr,
    ibv_send_wr_xrc,
    ibv_send_wr_qp_type,
    ibv_send_wr_bind_mw,
    ibv_send_wr_tso,
    ibv_send_wr_bind_mw_tso,
    ibv_send_wr,
    ibv_recv_wr,
    ibv_wc_imm,
    ibv_wc,
    ibv_async_event_element,
    ibv_async_event,
);

// Sizes measured from the rdma-core 44 headers (struct-layout-rdma-core-44.txt); the layout
// test checks every field against the installed headers, these guard builds without them.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<ibv_device>() == 664);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(size_of::<ibv_context>() == 328);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(size_of::<ibv_device_attr_ex>() == 400);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(size_of::<ibv_mr>() == 48);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(size_of::<ibv_cq_ex>() == 288);
    assert!(size_of::<ibv_srq>() == 128);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(size_of::<ibv_qp_ex>() == 352);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
};
