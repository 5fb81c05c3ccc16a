//! Exports softverbs does not implement (yet). Each fails the way rdma-core reports errors for
//! that function: pointer results are NULL with errno `EOPNOTSUPP`, `int` results are the errno
//! value itself (`EOPNOTSUPP`) or -1 with errno for the functions whose convention is errno,
//! `void` functions do nothing.
//!
//! The stubs take no parameters: on x86_64 and aarch64 the caller owns its argument registers
//! and stack, so a C call with any arguments into a parameterless function is harmless.
//!
//! [`compat`] holds the hidden `name@IBVERBS_1.0` versions (rdma-core's 1.0 ABI with the old
//! struct layouts), which softverbs never supports.

use core::ffi::{c_int, c_void};
use core::ptr;

/// Sets this thread's errno.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = e };
}

/// NULL with errno `e`: how the object-creating verbs fail.
pub(crate) fn ret_null<T>(e: c_int) -> *mut T {
    set_errno(e);
    ptr::null_mut()
}

macro_rules! stubs {
    (ptr: $($name:ident),* $(,)?) => { $(
        #[doc = concat!("`", stringify!($name), "`: unsupported, NULL with errno EOPNOTSUPP.")]
        pub extern "C" fn $name() -> *mut c_void {
            $crate::stubs::set_errno(libc::EOPNOTSUPP);
            core::ptr::null_mut()
        }
    )* };
    (int: $($name:ident),* $(,)?) => { $(
        #[doc = concat!("`", stringify!($name), "`: unsupported, returns EOPNOTSUPP.")]
        pub extern "C" fn $name() -> core::ffi::c_int {
            libc::EOPNOTSUPP
        }
    )* };
    (errno: $($name:ident),* $(,)?) => { $(
        #[doc = concat!("`", stringify!($name), "`: unsupported, -1 with errno EOPNOTSUPP.")]
        pub extern "C" fn $name() -> core::ffi::c_int {
            $crate::stubs::set_errno(libc::EOPNOTSUPP);
            -1
        }
    )* };
    (void: $($name:ident),* $(,)?) => { $(
        #[doc = concat!("`", stringify!($name), "`: unsupported, does nothing.")]
        pub extern "C" fn $name() {}
    )* };
}

stubs!(ptr:
    ibv_get_sysfs_path,
    ibv_import_device, ibv_import_mr,
    ibv_import_pd, ibv_reg_dmabuf_mr, ibv_import_dm, verbs_open_device,
    _verbs_init_and_alloc_context,
);
stubs!(int:
    ibv_rereg_mr, ibv_resize_cq,
    ibv_resolve_eth_l2_from_gid, ibv_query_ece, ibv_set_ece, execute_ioctl,
    ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
    ibv_cmd_create_cq, ibv_cmd_create_cq_ex, ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp, ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table, ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd, ibv_cmd_poll_cq,
    ibv_cmd_post_recv, ibv_cmd_post_send, ibv_cmd_post_srq_recv, ibv_cmd_query_context,
    ibv_cmd_query_device_any, ibv_cmd_query_mr, ibv_cmd_query_port, ibv_cmd_query_qp,
    ibv_cmd_query_srq, ibv_cmd_read_counters, ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_mr, ibv_cmd_req_notify_cq, ibv_cmd_rereg_mr, ibv_cmd_resize_cq,
);
stubs!(errno: ibv_read_sysfs_file, ibv_read_ibdev_sysfs_file);
stubs!(void:
    ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern,
    ibv_copy_ah_attr_from_kern, ibv_unimport_mr, ibv_unimport_pd,
    ibv_unimport_dm, verbs_init_cq, verbs_register_driver_34, verbs_set_ops,
    verbs_uninit_context, __verbs_log,
);

/// `int ibv_fork_init(void)`: nothing to prepare, softverbs memory stays valid across fork.
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `int ibv_dontfork_range(void *base, size_t size)`: nothing to do (see `ibv_fork_init`).
pub extern "C" fn ibv_dontfork_range() -> c_int {
    0
}

/// `int ibv_dofork_range(void *base, size_t size)`: nothing to do (see `ibv_fork_init`).
pub extern "C" fn ibv_dofork_range() -> c_int {
    0
}

/// `enum ibv_fork_status ibv_is_fork_initialized(void)`: `IBV_FORK_UNNEEDED` (2).
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `int ibv_query_qp_data_in_order(...)`: 0, no in-order guarantee is reported.
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

/// `bool verbs_allow_disassociate_destroy(int ret)`: false.
pub extern "C" fn verbs_allow_disassociate_destroy() -> bool {
    false
}

/// `unsigned int __ioctl_final_num_attrs(...)`: 0 (there is no kernel ioctl interface).
pub extern "C" fn __ioctl_final_num_attrs() -> c_int {
    0
}

/// Hidden `name@IBVERBS_1.0` compat versions (rdma-core 1.0's struct layouts): unsupported.
pub mod compat {
    use core::ffi::c_void;

    stubs!(ptr:
        ibv_alloc_pd, ibv_create_ah, ibv_create_cq, ibv_create_qp, ibv_create_srq,
        ibv_get_device_list, ibv_open_device, ibv_reg_mr,
    );
    stubs!(int:
        ibv_attach_mcast, ibv_close_device, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_ah,
        ibv_destroy_cq, ibv_destroy_qp, ibv_destroy_srq, ibv_detach_mcast, ibv_modify_qp,
        ibv_modify_srq, ibv_query_device, ibv_query_gid, ibv_query_pkey, ibv_query_port,
        ibv_query_qp, ibv_query_srq, ibv_resize_cq,
    );
    stubs!(errno: ibv_get_async_event, ibv_get_cq_event);
    stubs!(void: ibv_ack_async_event, ibv_ack_cq_events, ibv_free_device_list, ibv_register_driver);

    /// `ibv_get_device_name@IBVERBS_1.0`: unsupported, NULL with errno EOPNOTSUPP.
    pub extern "C" fn ibv_get_device_name() -> *const c_void {
        super::set_errno(libc::EOPNOTSUPP);
        super::ptr::null()
    }

    /// `ibv_get_device_guid@IBVERBS_1.0`: unsupported, 0.
    pub extern "C" fn ibv_get_device_guid() -> u64 {
        0
    }
}
