//! Checks every mirrored struct in `softverbs_rdmacm::abi` against the installed rdma-core
//! headers (`<rdma/rdma_cma.h>`, `<rdma/rsocket.h>`, `<rdma/rdma_verbs.h>`,
//! `<infiniband/ib.h>`): size, alignment, offset and size of every field, and the value of
//! every constant. The machinery is `softverbs_stub_support::testing::layout`.
//!
//! Needs `cc` and librdmacm-dev; skips loudly without them, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

use std::mem::{offset_of, size_of};
use std::path::Path;

use softverbs_rdmacm::abi::*;
use softverbs_stub_support::testing::layout::{check_against_headers, check_tiling, Type};
use softverbs_stub_support::{layout_constants, layout_table};

fn table() -> Vec<Type> {
    layout_table! {
        struct sockaddr { sa_family, sa_data }
        struct sockaddr_in { sin_family, sin_port, sin_addr, sin_zero }
        struct sockaddr_in6 { sin6_family, sin6_port, sin6_flowinfo, sin6_addr, sin6_scope_id }
        struct sockaddr_storage (partial) { ss_family }
        union ibv_gid { raw, global, global.subnet_prefix, global.interface_id }
        struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        struct ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        struct ibv_ece { vendor_id, options, comp_mask }
        struct ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference,
        }
        struct ibv_path_record {
            service_id, dgid, sgid, dlid, slid, flowlabel_hoplimit, tclass, reversible_numpath,
            pkey, qosclass_sl, mtu, rate, packetlifetime, preference, reserved,
        }
        struct ibv_path_data { flags, reserved, path }
        struct ib_addr {
            ib_u, ib_u.uib_addr8, ib_u.uib_addr16, ib_u.uib_addr32, ib_u.uib_addr64,
        }
        struct sockaddr_ib {
            sib_family, sib_pkey, sib_flowinfo, sib_addr, sib_sid, sib_sid_mask, sib_scope_id,
        }
        struct rdma_ib_addr { sgid, dgid, pkey }
        struct rdma_addr {
            src.addr => "src_addr",
            src.sin => "src_sin",
            src.sin6 => "src_sin6",
            src.storage => "src_storage",
            dst.addr => "dst_addr",
            dst.sin => "dst_sin",
            dst.sin6 => "dst_sin6",
            dst.storage => "dst_storage",
            addr, addr.ibaddr, addr.ibaddr.sgid, addr.ibaddr.dgid, addr.ibaddr.pkey,
        }
        struct rdma_route { addr, path_rec, num_paths }
        struct rdma_event_channel { fd }
        struct rdma_cm_id {
            verbs, channel, context, qp, route,
            route.addr.src.addr => "route.addr.src_addr",
            route.addr.dst.addr => "route.addr.dst_addr",
            route.addr.addr.ibaddr => "route.addr.addr.ibaddr",
            route.path_rec, route.num_paths,
            ps, port_num, event, send_cq_channel, send_cq, recv_cq_channel, recv_cq, srq, pd,
            qp_type,
        }
        struct rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num,
        }
        struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        struct rdma_cm_event {
            id, listen_id, event, status, param, param.conn, param.ud,
            param.conn.private_data, param.conn.qp_num, param.ud.ah_attr, param.ud.qkey,
        }
        struct rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len,
            ai_route, ai_connect_len, ai_connect, ai_next,
        }
        struct rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
        struct ibv_pd { context, handle }
        struct ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed,
        }
        struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        struct ibv_rx_hash_conf {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask,
        }
        struct ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags,
        }
        struct ibv_srq_attr { max_wr, max_sge, srq_limit }
        struct ibv_srq_init_attr { srq_context, attr }
        struct ibv_tm_cap { max_num_tags, max_ops }
        struct ibv_srq_init_attr_ex {
            srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap,
        }
        struct ibv_qp_attr (partial) { qp_state }
    }
}

fn constants() -> Vec<(&'static str, i64)> {
    layout_constants![
        RDMA_CM_EVENT_ADDR_RESOLVED,
        RDMA_CM_EVENT_ADDR_ERROR,
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        RDMA_CM_EVENT_ROUTE_ERROR,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        RDMA_CM_EVENT_CONNECT_RESPONSE,
        RDMA_CM_EVENT_CONNECT_ERROR,
        RDMA_CM_EVENT_UNREACHABLE,
        RDMA_CM_EVENT_REJECTED,
        RDMA_CM_EVENT_ESTABLISHED,
        RDMA_CM_EVENT_DISCONNECTED,
        RDMA_CM_EVENT_DEVICE_REMOVAL,
        RDMA_CM_EVENT_MULTICAST_JOIN,
        RDMA_CM_EVENT_MULTICAST_ERROR,
        RDMA_CM_EVENT_ADDR_CHANGE,
        RDMA_CM_EVENT_TIMEWAIT_EXIT,
        RDMA_PS_IPOIB,
        RDMA_PS_TCP,
        RDMA_PS_UDP,
        RDMA_PS_IB,
        RDMA_IB_IP_PS_MASK,
        RDMA_IB_IP_PORT_MASK,
        RDMA_IB_IP_PS_TCP,
        RDMA_IB_IP_PS_UDP,
        RDMA_IB_PS_IB,
        RDMA_UDP_QKEY,
        RDMA_MAX_RESP_RES,
        RDMA_MAX_INIT_DEPTH,
        RAI_PASSIVE,
        RAI_NUMERICHOST,
        RAI_NOROUTE,
        RAI_FAMILY,
        RDMA_CM_JOIN_MC_ATTR_ADDRESS,
        RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        RDMA_CM_JOIN_MC_ATTR_RESERVED,
        RDMA_MC_JOIN_FLAG_FULLMEMBER,
        RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
        RDMA_MC_JOIN_FLAG_RESERVED,
        RDMA_OPTION_ID,
        RDMA_OPTION_IB,
        RDMA_OPTION_ID_TOS,
        RDMA_OPTION_ID_REUSEADDR,
        RDMA_OPTION_ID_AFONLY,
        RDMA_OPTION_ID_ACK_TIMEOUT,
        RDMA_OPTION_IB_PATH,
        SOL_RDMA,
        RDMA_SQSIZE,
        RDMA_RQSIZE,
        RDMA_INLINE,
        RDMA_IOMAPSIZE,
        RDMA_ROUTE,
        AF_IB,
        IBV_PATH_FLAG_GMP,
        IBV_PATH_FLAG_PRIMARY,
        IBV_PATH_FLAG_ALTERNATE,
        IBV_PATH_FLAG_OUTBOUND,
        IBV_PATH_FLAG_INBOUND,
        IBV_PATH_FLAG_INBOUND_REVERSE,
        IBV_PATH_FLAG_BIDIRECTIONAL,
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV,
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_XRCD,
        IBV_SRQ_INIT_ATTR_TYPE,
        IBV_SRQ_INIT_ATTR_PD,
        IBV_SRQ_INIT_ATTR_XRCD,
        IBV_SRQ_INIT_ATTR_CQ,
        IBV_SRQT_BASIC,
        IBV_SRQT_XRC,
        IBV_QP_STATE,
        IBV_EVENT_COMM_EST,
        IBV_TRANSPORT_IB,
        IBV_CONTEXT_ABI_COMPAT_OFFSET,
        VERBS_CONTEXT_CONTEXT_OFFSET,
        VERBS_CONTEXT_CREATE_QP_EX_OFFSET,
        VERBS_CONTEXT_SZ_OFFSET,
        VERBS_CONTEXT_SIZE,
        VERBS_ABI_IS_EXTENDED,
    ]
}

/// C definitions of the offsets librdmacm uses to reach a context's `create_qp_ex` op (the
/// header inline `ibv_create_qp_ex` does the same), named like the Rust constants.
const OFFSETS_H: &str = "\
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#define IBV_CONTEXT_ABI_COMPAT_OFFSET offsetof(struct ibv_context, abi_compat)
#define VERBS_CONTEXT_CONTEXT_OFFSET offsetof(struct verbs_context, context)
#define VERBS_CONTEXT_CREATE_QP_EX_OFFSET offsetof(struct verbs_context, create_qp_ex)
#define VERBS_CONTEXT_SZ_OFFSET offsetof(struct verbs_context, sz)
#define VERBS_CONTEXT_SIZE sizeof(struct verbs_context)
#define VERBS_ABI_IS_EXTENDED ((uintptr_t)__VERBS_ABI_IS_EXTENDED)
";

#[test]
fn rust_tables_list_every_field() {
    check_tiling(&table());
}

#[test]
fn layouts_and_constants_match_installed_headers() {
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdmacm-layout");
    std::fs::create_dir_all(&scratch).expect("create scratch dir");
    let offsets = scratch.join("offsets.h");
    std::fs::write(&offsets, OFFSETS_H).expect("write offsets.h");
    check_against_headers(
        &[
            "rdma/rdma_cma.h",
            "rdma/rdma_verbs.h",
            "rdma/rsocket.h",
            "infiniband/ib.h",
            "infiniband/sa.h",
            offsets.to_str().expect("UTF-8 path"),
        ],
        "librdmacm-dev",
        &table(),
        &constants(),
        &scratch,
    );
}

#[test]
fn key_sizes_from_the_reference_measurements() {
    // Numbers from struct-layout-rdma-core-44.txt.
    assert_eq!(size_of::<rdma_event_channel>(), 4);
    assert_eq!(size_of::<rdma_addr>(), 296);
    assert_eq!(size_of::<rdma_route>(), 312);
    assert_eq!(size_of::<rdma_cm_id>(), 416);
    assert_eq!(offset_of!(rdma_cm_id, route), 32);
    assert_eq!(offset_of!(rdma_cm_id, ps), 344);
    assert_eq!(offset_of!(rdma_cm_id, pd), 400);
    assert_eq!(size_of::<rdma_conn_param>(), 24);
    assert_eq!(size_of::<rdma_ud_param>(), 56);
    assert_eq!(offset_of!(rdma_ud_param, ah_attr), 16);
    assert_eq!(size_of::<rdma_cm_event>(), 80);
    assert_eq!(offset_of!(rdma_cm_event, param), 24);
    assert_eq!(size_of::<rdma_addrinfo>(), 96);
    assert_eq!(offset_of!(rdma_addrinfo, ai_next), 88);
}
