//! Checks every mirrored struct in `softverbs_ibverbs::abi` against the installed rdma-core
//! headers: size, alignment, and offset and size of every field.
//!
//! One table (`TABLE` below, built by the `layout!` macro) drives both sides: it generates the
//! C program that prints `offsetof`/`sizeof` from `<infiniband/verbs.h>`, and it computes the
//! same numbers on the Rust side with `offset_of!`/`size_of`. The test also checks that each
//! Rust struct's listed top-level fields tile it with nothing but alignment padding, so a field
//! missing from the table is noticed.
//!
//! Needs `cc` and the `libibverbs-dev` headers; without them it skips loudly, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of, MaybeUninit};
use std::process::Command;

use softverbs_ibverbs::abi::*;

/// One field as Rust sees it.
struct Field {
    /// The C member designator (`wr.rdma.rkey`, `imm_data`).
    c_path: &'static str,
    offset: usize,
    size: usize,
    /// The top-level Rust field this entry lies in, for the tiling check.
    top: &'static str,
    top_offset: usize,
    top_size: usize,
    top_align: usize,
}

/// One mirrored type.
struct Type {
    /// `struct ibv_qp` / `union ibv_gid`.
    c_name: &'static str,
    is_union: bool,
    size: usize,
    align: usize,
    fields: Vec<Field>,
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

fn align_of_pointee<T>(_: *const T) -> usize {
    align_of::<T>()
}

macro_rules! layout {
    ($( $kind:ident $ty:ident {
        $( $first:ident $(. $rest:ident)* $(=> $c:literal)? ),* $(,)?
    } )*) => {
        vec![$(
            Type {
                c_name: concat!(stringify!($kind), " ", stringify!($ty)),
                is_union: stringify!($kind) == "union",
                size: size_of::<$ty>(),
                align: align_of::<$ty>(),
                fields: vec![$({
                    let uninit = MaybeUninit::<$ty>::uninit();
                    let base = uninit.as_ptr();
                    // SAFETY: `addr_of!` only computes the address of a field inside `uninit`;
                    // nothing is read, so the uninitialised contents do not matter.
                    let (leaf, top) = unsafe {
                        (
                            std::ptr::addr_of!((*base).$first $(.$rest)*),
                            std::ptr::addr_of!((*base).$first),
                        )
                    };
                    Field {
                        c_path: layout!(@c $first $(.$rest)* $(=> $c)?),
                        offset: offset_of!($ty, $first $(.$rest)*),
                        size: size_of_pointee(leaf),
                        top: stringify!($first),
                        top_offset: offset_of!($ty, $first),
                        top_size: size_of_pointee(top),
                        top_align: align_of_pointee(top),
                    }
                }),*],
            }
        ),*]
    };
    (@c $first:ident $(. $rest:ident)* => $c:literal) => { $c };
    (@c $first:ident $(. $rest:ident)*) => { concat!(stringify!($first) $(, ".", stringify!($rest))*) };
}

fn table() -> Vec<Type> {
    layout! {
        struct _ibv_device_ops { _dummy1, _dummy2 }
        struct ibv_device {
            _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path,
        }
        struct ibv_context_ops {
            _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
            _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
            _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
            _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
            _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
            _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
            _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
        }
        struct ibv_context {
            device, ops, ops.poll_cq, ops.post_send, ops.post_recv, ops.req_notify_cq,
            ops.post_srq_recv, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
        }
        struct verbs_context {
            query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
            create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
            modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
            modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
            post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
            create_wq, query_rt_values, create_cq_ex, priv_ => "priv", query_device_ex,
            ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
            create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3,
            sz, context, context.ops.post_send, context.abi_compat,
        }
        struct ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt,
        }
        struct ibv_odp_caps {
            general_caps, per_transport_caps, per_transport_caps.rc_odp_caps,
            per_transport_caps.uc_odp_caps, per_transport_caps.ud_odp_caps,
        }
        struct ibv_tso_caps { max_tso, supported_qpts }
        struct ibv_rss_caps {
            supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size,
            rx_hash_fields_mask, rx_hash_function,
        }
        struct ibv_packet_pacing_caps { qp_rate_limit_min, qp_rate_limit_max, supported_qpts }
        struct ibv_tm_caps { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
        struct ibv_cq_moderation_caps { max_cq_count, max_cq_period }
        struct ibv_pci_atomic_caps { fetch_add, swap, compare_swap }
        struct ibv_device_attr_ex {
            orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
            raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
            phys_port_cnt_ex,
        }
        struct ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2,
        }
        union ibv_gid { raw, global, global.subnet_prefix, global.interface_id }
        struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        struct ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
        struct ibv_ah_attr {
            grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
        }
        struct ibv_pd { context, handle }
        struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        struct ibv_mw { context, pd, rkey, handle, type_ => "type" }
        struct ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        struct ibv_mw_bind { wr_id, send_flags, bind_info }
        struct ibv_comp_channel { context, fd, refcnt }
        struct ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed,
        }
        struct ibv_poll_cq_attr { comp_mask }
        struct ibv_cq_ex {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
            read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num,
            read_src_qp, read_wc_flags, read_slid, read_sl, read_dlid_path_bits,
            read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns,
        }
        struct ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
        }
        struct ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
        struct ibv_srq_init_attr { srq_context, attr }
        struct ibv_wq {
            context, wq_context, pd, cq, wq_num, handle, state, wq_type, post_recv, mutex, cond,
            events_completed, comp_mask,
        }
        struct ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        }
        struct ibv_data_buf { addr, length }
        struct ibv_qp_ex {
            qp_base, qp_base.qp_num, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp,
            wr_atomic_fetch_add, wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write,
            wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr,
            wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write,
        }
        struct ibv_qp_cap {
            max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
        }
        struct ibv_qp_init_attr {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
        }
        struct ibv_rx_hash_conf {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask,
        }
        struct ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags,
        }
        struct ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit,
        }
        struct ibv_ah { context, pd, handle }
        struct ibv_sge { addr, length, lkey }
        struct ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags,
            imm.imm_data => "imm_data",
            imm.invalidate_rkey => "invalidate_rkey",
            wr, wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic.remote_addr, wr.atomic.compare_add,
            wr.atomic.swap, wr.atomic.rkey, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
            qp_type, qp_type.xrc.remote_srqn,
            bind_mw_tso.bind_mw => "bind_mw",
            bind_mw_tso.bind_mw.mw => "bind_mw.mw",
            bind_mw_tso.bind_mw.rkey => "bind_mw.rkey",
            bind_mw_tso.bind_mw.bind_info => "bind_mw.bind_info",
            bind_mw_tso.tso => "tso",
            bind_mw_tso.tso.hdr => "tso.hdr",
            bind_mw_tso.tso.hdr_sz => "tso.hdr_sz",
            bind_mw_tso.tso.mss => "tso.mss",
        }
        struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
        struct ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len,
            imm.imm_data => "imm_data",
            imm.invalidated_rkey => "invalidated_rkey",
            qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits,
        }
        struct ibv_async_event {
            element, element.cq, element.qp, element.srq, element.wq, element.port_num,
            event_type,
        }
    }
}

macro_rules! constants {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), i64::try_from($name).expect("fits i64"))),*]
    };
}

/// Every constant in `abi` (except the sysfs sizes), checked by value against the headers.
fn constants() -> Vec<(&'static str, i64)> {
    constants![
        IBV_NODE_UNKNOWN,
        IBV_NODE_CA,
        IBV_NODE_SWITCH,
        IBV_NODE_ROUTER,
        IBV_NODE_RNIC,
        IBV_NODE_USNIC,
        IBV_NODE_USNIC_UDP,
        IBV_NODE_UNSPECIFIED,
        IBV_TRANSPORT_UNKNOWN,
        IBV_TRANSPORT_IB,
        IBV_TRANSPORT_IWARP,
        IBV_TRANSPORT_USNIC,
        IBV_TRANSPORT_USNIC_UDP,
        IBV_TRANSPORT_UNSPECIFIED,
        IBV_ATOMIC_NONE,
        IBV_ATOMIC_HCA,
        IBV_ATOMIC_GLOB,
        IBV_MTU_256,
        IBV_MTU_512,
        IBV_MTU_1024,
        IBV_MTU_2048,
        IBV_MTU_4096,
        IBV_PORT_NOP,
        IBV_PORT_DOWN,
        IBV_PORT_INIT,
        IBV_PORT_ARMED,
        IBV_PORT_ACTIVE,
        IBV_PORT_ACTIVE_DEFER,
        IBV_LINK_LAYER_UNSPECIFIED,
        IBV_LINK_LAYER_INFINIBAND,
        IBV_LINK_LAYER_ETHERNET,
        IBV_GID_TYPE_IB,
        IBV_GID_TYPE_ROCE_V1,
        IBV_GID_TYPE_ROCE_V2,
        IBV_EVENT_CQ_ERR,
        IBV_EVENT_QP_FATAL,
        IBV_EVENT_QP_REQ_ERR,
        IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST,
        IBV_EVENT_SQ_DRAINED,
        IBV_EVENT_PATH_MIG,
        IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL,
        IBV_EVENT_PORT_ACTIVE,
        IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE,
        IBV_EVENT_PKEY_CHANGE,
        IBV_EVENT_SM_CHANGE,
        IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED,
        IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER,
        IBV_EVENT_GID_CHANGE,
        IBV_EVENT_WQ_FATAL,
        IBV_WC_SUCCESS,
        IBV_WC_LOC_LEN_ERR,
        IBV_WC_LOC_QP_OP_ERR,
        IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR,
        IBV_WC_WR_FLUSH_ERR,
        IBV_WC_MW_BIND_ERR,
        IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR,
        IBV_WC_REM_INV_REQ_ERR,
        IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR,
        IBV_WC_RETRY_EXC_ERR,
        IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_LOC_RDD_VIOL_ERR,
        IBV_WC_REM_INV_RD_REQ_ERR,
        IBV_WC_REM_ABORT_ERR,
        IBV_WC_INV_EECN_ERR,
        IBV_WC_INV_EEC_STATE_ERR,
        IBV_WC_FATAL_ERR,
        IBV_WC_RESP_TIMEOUT_ERR,
        IBV_WC_GENERAL_ERR,
        IBV_WC_TM_ERR,
        IBV_WC_TM_RNDV_INCOMPLETE,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_COMP_SWAP,
        IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_WC_TSO,
        IBV_WC_ATOMIC_WRITE,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
        IBV_WC_GRH,
        IBV_WC_WITH_IMM,
        IBV_WC_IP_CSUM_OK,
        IBV_WC_WITH_INV,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WR_SEND_WITH_INV,
        IBV_WR_TSO,
        IBV_WR_DRIVER1,
        IBV_WR_ATOMIC_WRITE,
        IBV_SEND_FENCE,
        IBV_SEND_SIGNALED,
        IBV_SEND_SOLICITED,
        IBV_SEND_INLINE,
        IBV_SEND_IP_CSUM,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
        IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND,
        IBV_ACCESS_HUGETLB,
        IBV_ACCESS_OPTIONAL_FIRST,
        IBV_ACCESS_RELAXED_ORDERING,
        IBV_ACCESS_OPTIONAL_RANGE,
        IBV_MW_TYPE_1,
        IBV_MW_TYPE_2,
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_QPT_RAW_PACKET,
        IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV,
        IBV_QPT_DRIVER,
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QPS_UNKNOWN,
        IBV_MIG_MIGRATED,
        IBV_MIG_REARM,
        IBV_MIG_ARMED,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_EN_SQD_ASYNC_NOTIFY,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_QKEY,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_QP_RATE_LIMIT,
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_XRCD,
        IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
        IBV_QP_INIT_ATTR_IND_TABLE,
        IBV_QP_INIT_ATTR_RX_HASH,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_EX_WITH_RDMA_WRITE,
        IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        IBV_QP_EX_WITH_SEND,
        IBV_QP_EX_WITH_SEND_WITH_IMM,
        IBV_QP_EX_WITH_RDMA_READ,
        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
        IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        IBV_QP_EX_WITH_LOCAL_INV,
        IBV_QP_EX_WITH_BIND_MW,
        IBV_QP_EX_WITH_SEND_WITH_INV,
        IBV_QP_EX_WITH_TSO,
        IBV_QP_EX_WITH_ATOMIC_WRITE,
        IBV_WQT_RQ,
        IBV_WQS_RESET,
        IBV_WQS_RDY,
        IBV_WQS_ERR,
        IBV_WQS_UNKNOWN,
        IBV_RATE_MAX,
        IBV_RATE_2_5_GBPS,
        IBV_RATE_5_GBPS,
        IBV_RATE_10_GBPS,
        IBV_RATE_20_GBPS,
        IBV_RATE_30_GBPS,
        IBV_RATE_40_GBPS,
        IBV_RATE_60_GBPS,
        IBV_RATE_80_GBPS,
        IBV_RATE_120_GBPS,
    ]
}

/// The C program: one line per type (`T|c_name||size|align`) and per field
/// (`F|c_name|path|offset|size`).
fn c_program(types: &[Type]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         #define T(t) printf(\"T|%s||%zu|%zu\\n\", #t, sizeof(t), _Alignof(t))\n\
         #define F(t, f, s) printf(\"F|%s|%s|%zu|%zu\\n\", #t, s, offsetof(t, f), sizeof(((t *)0)->f))\n\
         int main(void) {\n",
    );
    for t in types {
        writeln!(c, "  T({});", t.c_name).unwrap();
        for f in &t.fields {
            writeln!(c, "  F({}, {}, \"{}\");", t.c_name, f.c_path, f.c_path).unwrap();
        }
    }
    for (name, _) in constants() {
        writeln!(c, "  printf(\"K|{name}||%lld|0\\n\", (long long)({name}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

/// What the Rust side says, in the C program's output format.
fn rust_lines(types: &[Type]) -> BTreeMap<(String, String), (usize, usize)> {
    let mut m = BTreeMap::new();
    for t in types {
        m.insert((t.c_name.to_string(), String::new()), (t.size, t.align));
        for f in &t.fields {
            m.insert(
                (t.c_name.to_string(), f.c_path.to_string()),
                (f.offset, f.size),
            );
        }
    }
    m
}

/// The constants in the same form (values as `i64`, second number unused).
fn rust_constants() -> BTreeMap<(String, String), (i64, i64)> {
    constants()
        .into_iter()
        .map(|(name, v)| ((name.to_string(), String::new()), (v, 0)))
        .collect()
}

#[test]
fn rust_tables_list_every_field() {
    // Independent of the headers: the listed top-level fields of each Rust struct must tile
    // it with only alignment padding, so no field can be missing from the table.
    for t in table() {
        let mut tops: Vec<(usize, usize, usize, &str)> = t
            .fields
            .iter()
            .map(|f| (f.top_offset, f.top_size, f.top_align, f.top))
            .collect();
        tops.sort();
        tops.dedup();
        if t.is_union {
            assert!(tops.iter().all(|&(o, ..)| o == 0), "{}", t.c_name);
            let biggest = tops.iter().map(|&(_, s, ..)| s).max().unwrap_or(0);
            assert_eq!(t.size, biggest.next_multiple_of(t.align), "{}", t.c_name);
            continue;
        }
        let mut end: usize = 0;
        for &(offset, size, align, name) in &tops {
            assert_eq!(
                offset,
                end.next_multiple_of(align),
                "{}: field before `{name}` missing from the table",
                t.c_name
            );
            end = offset + size;
        }
        assert_eq!(
            t.size,
            end.next_multiple_of(t.align),
            "{}: trailing field missing from the table",
            t.c_name
        );
    }
}

#[test]
fn layouts_and_constants_match_installed_headers() {
    if !std::path::Path::new(common::VERBS_H).exists() {
        common::skip(&format!(
            "{} not found (apt-get install libibverbs-dev)",
            common::VERBS_H
        ));
        return;
    }
    if !common::have("cc") {
        common::skip("no C compiler `cc`");
        return;
    }
    let types = table();
    let dir = common::scratch("layout");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(&types)).unwrap();
    common::run(
        Command::new("cc")
            .arg("-std=gnu11")
            .arg("-o")
            .arg(&exe)
            .arg(&src),
    );
    let out = common::run(&mut Command::new(&exe));

    let mut rust: BTreeMap<(String, String), (i64, i64)> = rust_lines(&types)
        .into_iter()
        .map(|(k, (a, b))| (k, (a as i64, b as i64)))
        .collect();
    rust.extend(rust_constants());
    let mut c = BTreeMap::new();
    for line in out.lines() {
        let parts: Vec<&str> = line.split('|').collect();
        let [_, ty, path, a, b] = parts[..] else {
            panic!("bad line {line:?}");
        };
        c.insert(
            (ty.to_string(), path.to_string()),
            (a.parse::<i64>().unwrap(), b.parse::<i64>().unwrap()),
        );
    }
    assert_eq!(c.len(), rust.len(), "every table entry printed once");
    let mut bad = String::new();
    for (key, r) in &rust {
        let h = c.get(key).expect("printed by the C program");
        if h != r {
            let what = if key.0.starts_with("IBV_") {
                "value"
            } else if key.1.is_empty() {
                "(size, align)"
            } else {
                "(offset, size)"
            };
            writeln!(bad, "{} {}: C {what} = {h:?}, Rust = {r:?}", key.0, key.1).unwrap();
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{bad}");
    eprintln!(
        "checked {} types, {} fields and {} constants against {}",
        types.len(),
        rust.len() - types.len() - constants().len(),
        constants().len(),
        common::VERBS_H
    );
}

#[test]
fn key_sizes_from_the_reference_measurements() {
    // Numbers from struct-layout-rdma-core-44.txt, which C-ABI.md calls out.
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(
        size_of::<verbs_context>() - offset_of!(verbs_context, create_qp_ex),
        384
    );
    assert_eq!(size_of::<ibv_qp_ex>(), 352);
    assert_eq!(
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
        208
    );
    assert_eq!(offset_of!(ibv_context, abi_compat), 320);
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(offset_of!(ibv_device_attr, phys_port_cnt), 227);
    assert_eq!(IBV_ACCESS_OPTIONAL_RANGE, 0x3ff0_0000);
    assert_eq!(IBV_ACCESS_RELAXED_ORDERING, 0x10_0000);
}

/// The casts the library relies on: an `ibv_cq_ex` is used as an `ibv_cq` (the header's
/// `ibv_cq_ex_to_cq`), an `ibv_qp_ex` as an `ibv_qp`, and an `ibv_qp_init_attr_ex` as an
/// `ibv_qp_init_attr` (`create_qp_ex` shares `ibv_create_qp`'s code).
#[test]
fn extended_structs_begin_with_their_base() {
    macro_rules! same_prefix {
        ($ex:ty, $base:ty, $($f:ident),*) => {$(
            assert_eq!(
                (offset_of!($ex, $f), size_of_pointee(
                    // SAFETY: only the field's address is computed, nothing is read.
                    unsafe { std::ptr::addr_of!((*MaybeUninit::<$ex>::uninit().as_ptr()).$f) }
                )),
                (offset_of!($base, $f), size_of_pointee(
                    // SAFETY: as above.
                    unsafe { std::ptr::addr_of!((*MaybeUninit::<$base>::uninit().as_ptr()).$f) }
                )),
                concat!(stringify!($ex), ".", stringify!($f)),
            );
        )*};
    }
    same_prefix!(
        ibv_cq_ex,
        ibv_cq,
        context,
        channel,
        cq_context,
        handle,
        cqe,
        mutex,
        cond,
        comp_events_completed,
        async_events_completed
    );
    assert!(offset_of!(ibv_cq_ex, comp_mask) >= size_of::<ibv_cq>());
    assert_eq!(offset_of!(ibv_qp_ex, qp_base), 0);
    same_prefix!(
        ibv_qp_init_attr_ex,
        ibv_qp_init_attr,
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap,
        qp_type,
        sq_sig_all
    );
    // `comp_mask` lies in the tail padding of `ibv_qp_init_attr` (offset 60 of 64): code
    // handed an `ibv_qp_init_attr_ex` as an `ibv_qp_init_attr` must write fields, never the
    // whole struct.
    assert_eq!(
        offset_of!(ibv_qp_init_attr_ex, comp_mask),
        offset_of!(ibv_qp_init_attr, sq_sig_all) + size_of::<i32>()
    );
}
