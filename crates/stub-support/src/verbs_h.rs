//! `#[repr(C)]` mirrors of the `<infiniband/verbs.h>` types that both drop-in libraries embed by
//! value: `libibverbs.so.1` (crate `softverbs-ibverbs-abi`) and `librdmacm.so.1` (crate
//! `softverbs-rdmacm-abi`, whose `rdma_cm_id` and `rdma_create_qp` carry them). Each library
//! re-exports them from its own `abi` module, and each library's `tests/layout.rs` checks them
//! against the installed header.
//!
//! The structs that point to verbs objects (`ibv_qp_init_attr`, `ibv_qp_init_attr_ex`) cannot
//! live here: `libibverbs.so.1` mirrors those objects field by field while `librdmacm.so.1`
//! keeps them opaque. [`qp_init_attr_mirrors!`](crate::qp_init_attr_mirrors) writes them into
//! the calling module, where the object names resolve to that library's own types.

#![allow(non_camel_case_types)]

use core::ffi::c_void;

/// The `global` view of [`ibv_gid`] (both fields big-endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_gid_global {
    pub subnet_prefix: u64,
    pub interface_id: u64,
}

/// `union ibv_gid` (16 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_srq_attr` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr` (24 bytes): what `ibv_create_srq` and `rdma_create_srq` take.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_rx_hash_conf` (24 bytes), inside `ibv_qp_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

crate::zeroed!(
    ibv_gid_global,
    ibv_gid,
    ibv_global_route,
    ibv_ah_attr,
    ibv_qp_cap,
    ibv_srq_attr,
    ibv_srq_init_attr,
    ibv_rx_hash_conf,
);

/// Defines `ibv_qp_init_attr` (64 bytes, what `ibv_create_qp` and `rdma_create_qp` take) and
/// `ibv_qp_init_attr_ex` (136 bytes: the same fields, then extensions selected by `comp_mask`,
/// which lies in `ibv_qp_init_attr`'s tail padding) in the calling module. That module must
/// name the objects they point to: `ibv_cq`, `ibv_srq`, `ibv_pd`, `ibv_xrcd` and
/// `ibv_rwq_ind_table`.
#[macro_export]
macro_rules! qp_init_attr_mirrors {
    () => {
        /// `struct ibv_qp_init_attr` (64 bytes).
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct ibv_qp_init_attr {
            pub qp_context: *mut ::core::ffi::c_void,
            pub send_cq: *mut ibv_cq,
            pub recv_cq: *mut ibv_cq,
            pub srq: *mut ibv_srq,
            pub cap: $crate::verbs_h::ibv_qp_cap,
            /// `enum ibv_qp_type`
            pub qp_type: ::core::ffi::c_int,
            pub sq_sig_all: ::core::ffi::c_int,
        }

        /// `struct ibv_qp_init_attr_ex` (136 bytes): `ibv_qp_init_attr`'s fields, then
        /// extensions selected by `comp_mask` (`IBV_QP_INIT_ATTR_*`).
        #[repr(C)]
        #[derive(Clone, Copy)]
        pub struct ibv_qp_init_attr_ex {
            pub qp_context: *mut ::core::ffi::c_void,
            pub send_cq: *mut ibv_cq,
            pub recv_cq: *mut ibv_cq,
            pub srq: *mut ibv_srq,
            pub cap: $crate::verbs_h::ibv_qp_cap,
            pub qp_type: ::core::ffi::c_int,
            pub sq_sig_all: ::core::ffi::c_int,
            pub comp_mask: u32,
            pub pd: *mut ibv_pd,
            pub xrcd: *mut ibv_xrcd,
            pub create_flags: u32,
            pub max_tso_header: u16,
            pub rwq_ind_tbl: *mut ibv_rwq_ind_table,
            pub rx_hash_conf: $crate::verbs_h::ibv_rx_hash_conf,
            pub source_qpn: u32,
            pub send_ops_flags: u64,
        }
    };
}
