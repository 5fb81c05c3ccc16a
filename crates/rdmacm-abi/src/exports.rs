//! Every function rdma-core 44's librdmacm exports, bound to its version node (the list is
//! `exports.txt`, checked against the built library by `tests/cdylib.rs`).
//!
//! `softverbs_stub_support::exports!` emits, per function, a `global_asm!` trampoline that
//! jumps to the Rust function and a `.symver softverbs_v_<name>, <name>@@<NODE>` giving it its
//! public, versioned name; see `softverbs-ibverbs-abi`'s crate documentation for why.

use softverbs_stub_support::exports;

use crate::api::*;
use crate::rsocket::*;

exports! {
    "RDMACM_1.0" {
        raccept, rbind, rclose, rconnect,
        rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_connect, rdma_create_ep,
        rdma_create_event_channel, rdma_create_id, rdma_create_qp, rdma_create_qp_ex,
        rdma_create_srq, rdma_create_srq_ex, rdma_destroy_ep, rdma_destroy_event_channel,
        rdma_destroy_id, rdma_destroy_qp, rdma_destroy_srq, rdma_disconnect, rdma_event_str,
        rdma_freeaddrinfo, rdma_free_devices, rdma_getaddrinfo, rdma_get_cm_event,
        rdma_get_devices, rdma_get_dst_port, rdma_get_request, rdma_get_src_port,
        rdma_join_multicast, rdma_leave_multicast, rdma_listen, rdma_migrate_id, rdma_notify,
        rdma_reject, rdma_resolve_addr, rdma_resolve_route, rdma_set_option,
        rfcntl, rgetpeername, rgetsockname, rgetsockopt, riomap, riounmap, riowrite, rlisten,
        rpoll, rread, rreadv, rrecv, rrecvfrom, rrecvmsg, rselect, rsend, rsendmsg, rsendto,
        rsetsockopt, rshutdown, rsocket, rwrite, rwritev,
    }
    "RDMACM_1.1" {
        rdma_join_multicast_ex,
    }
    "RDMACM_1.2" {
        rdma_establish, rdma_init_qp_attr,
    }
    "RDMACM_1.3" {
        rdma_get_remote_ece, rdma_reject_ece, rdma_set_local_ece,
    }
}
