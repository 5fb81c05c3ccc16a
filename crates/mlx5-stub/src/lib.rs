//! A stub `libmlx5.so.1` for softverbs: every function rdma-core 44's libmlx5 exports, at its
//! version node, failing cleanly.
//!
//! perftest links `libmlx5.so.1` (C-ABI.md) but reaches its functions only with DC or AES-XTS
//! options, which need real ConnectX hardware. With softverbs installed in place of rdma-core,
//! this library lets such tools start (`-z now` resolves every import at its node) and makes
//! those options fail with `EOPNOTSUPP` instead of crashing.
//!
//! # Return values
//!
//! The prototypes are those of Debian's `<infiniband/mlx5dv.h>` (rdma-core 44):
//!
//! - functions returning a pointer return NULL with `errno = EOPNOTSUPP`;
//! - functions returning `int` return `EOPNOTSUPP` (the mlx5dv convention: a positive errno
//!   value) and also set `errno`;
//! - `mlx5dv_is_supported` returns `false`;
//! - `mlx5dv_devx_get_event` (`ssize_t`, documented as "-1 and errno was set") and
//!   `mlx5dv_vfio_get_events_fd` (returns a file descriptor) return -1 with
//!   `errno = EOPNOTSUPP`, so callers never mistake `EOPNOTSUPP` for a byte count or an fd;
//! - functions returning `void` do nothing.
//!
//! Every function ignores its arguments, so each is declared without parameters: in the C
//! calling conventions of x86_64 and aarch64 the caller owns argument registers and stack.
//!
//! # Symbol versions
//!
//! As in `softverbs-ibverbs-abi` (see its crate documentation): each function is an ordinary,
//! mangled Rust `extern "C" fn`; `stubs!` emits a `global_asm!` trampoline that jumps to it and
//! a `.symver softverbs_v_<name>, <name>@@<NODE>` naming it at its node; `build.rs` passes a
//! version script declaring only the nodes (`libmlx5.map`) and the SONAME. `compat!` adds a
//! non-default `<name>@<NODE>` alias (libmlx5 keeps `mlx5dv_init_obj@MLX5_1.0`). The list of
//! expected symbols, `exports.txt`, is checked against the built library by `tests/cdylib.rs`.

use softverbs_stub_support::{compat, stubs};

stubs! {
    "MLX5_1.0" {
        int mlx5dv_query_device;
    }
    "MLX5_1.1" {
        ptr mlx5dv_create_cq;
    }
    "MLX5_1.2" {
        int mlx5dv_init_obj;
        int mlx5dv_set_context_attr;
    }
    "MLX5_1.3" {
        ptr mlx5dv_create_qp;
        ptr mlx5dv_create_wq;
    }
    "MLX5_1.4" {
        int mlx5dv_get_clock_info;
    }
    "MLX5_1.5" {
        ptr mlx5dv_create_flow_action_esp;
    }
    "MLX5_1.6" {
        ptr mlx5dv_create_flow;
        ptr mlx5dv_create_flow_matcher;
        int mlx5dv_destroy_flow_matcher;
    }
    "MLX5_1.7" {
        ptr mlx5dv_create_flow_action_modify_header;
        ptr mlx5dv_create_flow_action_packet_reformat;
        ptr mlx5dv_devx_alloc_uar;
        void mlx5dv_devx_free_uar;
        int mlx5dv_devx_general_cmd;
        ptr mlx5dv_devx_obj_create;
        int mlx5dv_devx_obj_destroy;
        int mlx5dv_devx_obj_modify;
        int mlx5dv_devx_obj_query;
        int mlx5dv_devx_query_eqn;
        int mlx5dv_devx_umem_dereg;
        ptr mlx5dv_devx_umem_reg;
        ptr mlx5dv_open_device;
    }
    "MLX5_1.8" {
        int mlx5dv_devx_cq_modify;
        int mlx5dv_devx_cq_query;
        int mlx5dv_devx_ind_tbl_modify;
        int mlx5dv_devx_ind_tbl_query;
        int mlx5dv_devx_qp_modify;
        int mlx5dv_devx_qp_query;
        int mlx5dv_devx_srq_modify;
        int mlx5dv_devx_srq_query;
        int mlx5dv_devx_wq_modify;
        int mlx5dv_devx_wq_query;
        bool mlx5dv_is_supported;
    }
    "MLX5_1.9" {
        ptr mlx5dv_devx_create_cmd_comp;
        void mlx5dv_devx_destroy_cmd_comp;
        int mlx5dv_devx_get_async_cmd_comp;
        int mlx5dv_devx_obj_query_async;
    }
    "MLX5_1.10" {
        ptr mlx5dv_alloc_dm;
        ptr mlx5dv_create_mkey;
        int mlx5dv_destroy_mkey;
        ptr mlx5dv_dr_action_create_dest_ibv_qp;
        ptr mlx5dv_dr_action_create_dest_table;
        ptr mlx5dv_dr_action_create_dest_vport;
        ptr mlx5dv_dr_action_create_drop;
        ptr mlx5dv_dr_action_create_flow_counter;
        ptr mlx5dv_dr_action_create_modify_header;
        ptr mlx5dv_dr_action_create_packet_reformat;
        ptr mlx5dv_dr_action_create_tag;
        int mlx5dv_dr_action_destroy;
        ptr mlx5dv_dr_domain_create;
        int mlx5dv_dr_domain_destroy;
        int mlx5dv_dr_domain_sync;
        ptr mlx5dv_dr_matcher_create;
        int mlx5dv_dr_matcher_destroy;
        ptr mlx5dv_dr_rule_create;
        int mlx5dv_dr_rule_destroy;
        ptr mlx5dv_dr_table_create;
        int mlx5dv_dr_table_destroy;
        ptr mlx5dv_qp_ex_from_ibv_qp_ex;
    }
    "MLX5_1.11" {
        ptr mlx5dv_devx_create_event_channel;
        void mlx5dv_devx_destroy_event_channel;
        ssize mlx5dv_devx_get_event;
        int mlx5dv_devx_subscribe_devx_event;
        int mlx5dv_devx_subscribe_devx_event_fd;
    }
    "MLX5_1.12" {
        ptr mlx5dv_alloc_var;
        ptr mlx5dv_dr_action_create_flow_meter;
        int mlx5dv_dr_action_modify_flow_meter;
        int mlx5dv_dump_dr_domain;
        int mlx5dv_dump_dr_matcher;
        int mlx5dv_dump_dr_rule;
        int mlx5dv_dump_dr_table;
        void mlx5dv_free_var;
    }
    "MLX5_1.13" {
        ptr mlx5dv_pp_alloc;
        void mlx5dv_pp_free;
    }
    "MLX5_1.14" {
        ptr mlx5dv_dr_action_create_default_miss;
        void mlx5dv_dr_domain_set_reclaim_device_memory;
        int mlx5dv_modify_qp_lag_port;
        int mlx5dv_query_qp_lag_port;
    }
    "MLX5_1.15" {
        ptr mlx5dv_dr_action_create_dest_devx_tir;
    }
    "MLX5_1.16" {
        ptr mlx5dv_dr_action_create_dest_array;
        ptr mlx5dv_dr_action_create_flow_sampler;
    }
    "MLX5_1.17" {
        ptr mlx5dv_dr_action_create_aso;
        ptr mlx5dv_dr_action_create_pop_vlan;
        ptr mlx5dv_dr_action_create_push_vlan;
        int mlx5dv_dr_action_modify_aso;
        int mlx5dv_modify_qp_sched_elem;
        int mlx5dv_modify_qp_udp_sport;
        ptr mlx5dv_sched_leaf_create;
        int mlx5dv_sched_leaf_destroy;
        int mlx5dv_sched_leaf_modify;
        ptr mlx5dv_sched_node_create;
        int mlx5dv_sched_node_destroy;
        int mlx5dv_sched_node_modify;
    }
    "MLX5_1.18" {
        int mlx5dv_reserved_qpn_alloc;
        int mlx5dv_reserved_qpn_dealloc;
    }
    "MLX5_1.19" {
        int _mlx5dv_query_port;
        ptr mlx5dv_devx_umem_reg_ex;
        ptr mlx5dv_dm_map_op_addr;
    }
    "MLX5_1.20" {
        int _mlx5dv_mkey_check;
        void mlx5dv_dr_domain_allow_duplicate_rules;
        int mlx5dv_map_ah_to_qp;
        int mlx5dv_qp_cancel_posted_send_wrs;
    }
    "MLX5_1.21" {
        int mlx5dv_crypto_login;
        int mlx5dv_crypto_login_query_state;
        int mlx5dv_crypto_logout;
        int mlx5dv_dci_stream_id_reset;
        ptr mlx5dv_dek_create;
        int mlx5dv_dek_destroy;
        int mlx5dv_dek_query;
        ptr mlx5dv_dr_action_create_dest_ib_port;
        int mlx5dv_dr_matcher_set_layout;
        ptr mlx5dv_get_vfio_device_list;
        fd mlx5dv_vfio_get_events_fd;
        int mlx5dv_vfio_process_events;
    }
    "MLX5_1.22" {
        int mlx5dv_dr_aso_other_domain_link;
        int mlx5dv_dr_aso_other_domain_unlink;
    }
    "MLX5_1.23" {
        ptr mlx5dv_devx_alloc_msi_vector;
        ptr mlx5dv_devx_create_eq;
        int mlx5dv_devx_destroy_eq;
        int mlx5dv_devx_free_msi_vector;
    }
    "MLX5_1.24" {
        ptr mlx5dv_create_steering_anchor;
        ptr mlx5dv_crypto_login_create;
        int mlx5dv_crypto_login_destroy;
        int mlx5dv_crypto_login_query;
        int mlx5dv_destroy_steering_anchor;
        ptr mlx5dv_dr_action_create_dest_root_table;
    }
}

compat!(mlx5dv_init_obj @ "MLX5_1.0");
