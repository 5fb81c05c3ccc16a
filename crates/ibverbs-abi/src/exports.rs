//! The exported C functions, each bound to its rdma-core 44 version node.
//!
//! The functions are ordinary Rust `extern "C"` functions named like their C counterparts
//! (mangled, so not exported by rustc). `exports!` emits, for each, a one-instruction
//! trampoline in `global_asm!` that jumps to it (`sym` operand) and a
//! `.symver softverbs_v_<name>, <name>@@<NODE>` that gives the trampoline its public,
//! versioned name (`softverbs_stub_support::trampoline!`, shared with the stub libraries). See the crate documentation for why it is done this way.

use core::ffi::{c_char, c_int};
use core::ptr;

use crate::abi::ibv_device;
use crate::ah::*;
use crate::ctx::*;
use crate::ex::ibv_qp_to_qp_ex;
use crate::marshall::*;
use crate::private_cm::softverbs_private_cm;
use crate::srq::*;
use crate::stubs::{self, *};
use crate::verbs::*;
use crate::{device, strs};

/// One exported symbol: public name and version node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Export {
    /// The name C programs link against (`ibv_get_device_list`).
    pub name: &'static str,
    /// The rdma-core version node (`IBVERBS_1.1`).
    pub node: &'static str,
    /// `name@@node`, the default version; otherwise the hidden compat version `name@node`.
    pub default: bool,
}

macro_rules! exports {
    (
        $( $node:literal { $( $name:ident ),* $(,)? } )*
        $( compat $cnode:literal { $( $cname:ident ),* $(,)? } )*
    ) => {
        $($(
            softverbs_stub_support::trampoline!(
                concat!("softverbs_v_", stringify!($name)),
                concat!(stringify!($name), "@@", $node),
                $name
            );
        )*)*
        $($(
            softverbs_stub_support::trampoline!(
                concat!("softverbs_c_", stringify!($cname)),
                concat!(stringify!($cname), "@", $cnode),
                stubs::compat::$cname
            );
        )*)*
        /// Every symbol this library exports, with its version node.
        pub const EXPORTS: &[Export] = &[
            $($( Export { name: stringify!($name), node: $node, default: true }, )*)*
            $($( Export { name: stringify!($cname), node: $cnode, default: false }, )*)*
        ];
    };
}

exports! {
    "IBVERBS_1.0" {
        ibv_copy_path_rec_from_kern,
        ibv_copy_path_rec_to_kern,
        ibv_copy_qp_attr_from_kern,
        ibv_create_comp_channel,
        ibv_destroy_comp_channel,
        ibv_get_sysfs_path,
        ibv_rate_to_mult,
        ibv_read_sysfs_file,
        mult_to_ibv_rate,
    }
    "IBVERBS_1.1" {
        ibv_ack_async_event,
        ibv_ack_cq_events,
        ibv_alloc_pd,
        ibv_attach_mcast,
        ibv_close_device,
        ibv_copy_ah_attr_from_kern,
        ibv_create_ah,
        ibv_create_ah_from_wc,
        ibv_create_cq,
        ibv_create_qp,
        ibv_create_srq,
        ibv_dealloc_pd,
        ibv_dereg_mr,
        ibv_destroy_ah,
        ibv_destroy_cq,
        ibv_destroy_qp,
        ibv_destroy_srq,
        ibv_detach_mcast,
        ibv_dofork_range,
        ibv_dontfork_range,
        ibv_event_type_str,
        ibv_fork_init,
        ibv_free_device_list,
        ibv_get_async_event,
        ibv_get_cq_event,
        ibv_get_device_guid,
        ibv_get_device_list,
        ibv_get_device_name,
        ibv_init_ah_from_wc,
        ibv_modify_qp,
        ibv_modify_srq,
        ibv_node_type_str,
        ibv_open_device,
        ibv_port_state_str,
        ibv_query_device,
        ibv_query_gid,
        ibv_query_pkey,
        ibv_query_port,
        ibv_query_qp,
        ibv_query_srq,
        ibv_rate_to_mbps,
        ibv_reg_mr,
        ibv_rereg_mr,
        ibv_resize_cq,
        ibv_resolve_eth_l2_from_gid,
        ibv_wc_status_str,
        mbps_to_ibv_rate,
    }
    "IBVERBS_1.5" {
        ibv_get_pkey_index,
    }
    "IBVERBS_1.6" {
        ibv_qp_to_qp_ex,
    }
    "IBVERBS_1.7" {
        ibv_reg_mr_iova,
    }
    "IBVERBS_1.8" {
        ibv_reg_mr_iova2,
    }
    "IBVERBS_1.9" {
        ibv_get_device_index,
    }
    "IBVERBS_1.10" {
        ibv_import_device,
        ibv_import_mr,
        ibv_import_pd,
        ibv_query_ece,
        ibv_set_ece,
        ibv_unimport_mr,
        ibv_unimport_pd,
    }
    "IBVERBS_1.11" {
        _ibv_query_gid_ex,
        _ibv_query_gid_table,
    }
    "IBVERBS_1.12" {
        ibv_reg_dmabuf_mr,
    }
    "IBVERBS_1.13" {
        ibv_import_dm,
        ibv_is_fork_initialized,
        ibv_unimport_dm,
    }
    "IBVERBS_1.14" {
        ibv_query_qp_data_in_order,
    }
    "IBVERBS_PRIVATE_34" {
        execute_ioctl,
        ibv_cmd_advise_mr,
        ibv_cmd_alloc_dm,
        ibv_cmd_alloc_mw,
        ibv_cmd_alloc_pd,
        ibv_cmd_attach_mcast,
        ibv_cmd_close_xrcd,
        ibv_cmd_create_ah,
        ibv_cmd_create_counters,
        ibv_cmd_create_cq,
        ibv_cmd_create_cq_ex,
        ibv_cmd_create_flow,
        ibv_cmd_create_flow_action_esp,
        ibv_cmd_create_qp,
        ibv_cmd_create_qp_ex,
        ibv_cmd_create_qp_ex2,
        ibv_cmd_create_rwq_ind_table,
        ibv_cmd_create_srq,
        ibv_cmd_create_srq_ex,
        ibv_cmd_create_wq,
        ibv_cmd_dealloc_mw,
        ibv_cmd_dealloc_pd,
        ibv_cmd_dereg_mr,
        ibv_cmd_destroy_ah,
        ibv_cmd_destroy_counters,
        ibv_cmd_destroy_cq,
        ibv_cmd_destroy_flow,
        ibv_cmd_destroy_flow_action,
        ibv_cmd_destroy_qp,
        ibv_cmd_destroy_rwq_ind_table,
        ibv_cmd_destroy_srq,
        ibv_cmd_destroy_wq,
        ibv_cmd_detach_mcast,
        ibv_cmd_free_dm,
        ibv_cmd_get_context,
        ibv_cmd_modify_cq,
        ibv_cmd_modify_flow_action_esp,
        ibv_cmd_modify_qp,
        ibv_cmd_modify_qp_ex,
        ibv_cmd_modify_srq,
        ibv_cmd_modify_wq,
        ibv_cmd_open_qp,
        ibv_cmd_open_xrcd,
        ibv_cmd_poll_cq,
        ibv_cmd_post_recv,
        ibv_cmd_post_send,
        ibv_cmd_post_srq_recv,
        ibv_cmd_query_context,
        ibv_cmd_query_device_any,
        ibv_cmd_query_mr,
        ibv_cmd_query_port,
        ibv_cmd_query_qp,
        ibv_cmd_query_srq,
        ibv_cmd_read_counters,
        ibv_cmd_reg_dmabuf_mr,
        ibv_cmd_reg_dm_mr,
        ibv_cmd_reg_mr,
        ibv_cmd_req_notify_cq,
        ibv_cmd_rereg_mr,
        ibv_cmd_resize_cq,
        ibv_query_gid_type,
        ibv_read_ibdev_sysfs_file,
        verbs_allow_disassociate_destroy,
        verbs_init_cq,
        verbs_open_device,
        verbs_register_driver_34,
        verbs_set_ops,
        verbs_uninit_context,
        _verbs_init_and_alloc_context,
        __ioctl_final_num_attrs,
        __verbs_log,
    }
    "SOFTVERBS_PRIVATE_1" {
        softverbs_private_cm,
    }
    compat "IBVERBS_1.0" {
        ibv_ack_async_event,
        ibv_ack_cq_events,
        ibv_alloc_pd,
        ibv_attach_mcast,
        ibv_close_device,
        ibv_create_ah,
        ibv_create_cq,
        ibv_create_qp,
        ibv_create_srq,
        ibv_dealloc_pd,
        ibv_dereg_mr,
        ibv_destroy_ah,
        ibv_destroy_cq,
        ibv_destroy_qp,
        ibv_destroy_srq,
        ibv_detach_mcast,
        ibv_free_device_list,
        ibv_get_async_event,
        ibv_get_cq_event,
        ibv_get_device_guid,
        ibv_get_device_list,
        ibv_get_device_name,
        ibv_modify_qp,
        ibv_modify_srq,
        ibv_open_device,
        ibv_query_device,
        ibv_query_gid,
        ibv_query_pkey,
        ibv_query_port,
        ibv_query_qp,
        ibv_query_srq,
        ibv_reg_mr,
        ibv_resize_cq,
    }
    compat "IBVERBS_1.1" {
        ibv_register_driver,
    }
}

/// `struct ibv_device **ibv_get_device_list(int *num_devices)`: a NULL-terminated array
/// to be released with `ibv_free_device_list`; NULL with errno set on failure.
///
/// # Safety
/// `num_devices` is NULL or valid for writing an `int`.
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    let devs = device::list();
    // SAFETY: calloc with a non-zero count; the result is checked for NULL below.
    let array = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ibv_device>()) }
        .cast::<*mut ibv_device>();
    if array.is_null() {
        return ret_null(libc::ENOMEM);
    }
    for (i, &d) in devs.iter().enumerate() {
        // SAFETY: `array` has room for `devs.len() + 1` pointers and `i < devs.len()`.
        unsafe { array.add(i).write(d.cast()) };
    }
    if !num_devices.is_null() {
        // SAFETY: the caller passes NULL or a writable int.
        unsafe { num_devices.write(c_int::try_from(devs.len()).unwrap_or(c_int::MAX)) };
    }
    array
}

/// `void ibv_free_device_list(struct ibv_device **list)`.
///
/// # Safety
/// `list` is NULL or came from `ibv_get_device_list` and was not freed yet.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` was allocated by calloc in `ibv_get_device_list` (or is NULL).
    unsafe { libc::free(list.cast()) };
}

/// `const char *ibv_get_device_name(struct ibv_device *device)`.
///
/// # Safety
/// `device` is NULL or a device from `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match device::lookup(device) {
        Some(d) => d.ibv.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            ptr::null()
        }
    }
}

/// `__be64 ibv_get_device_guid(struct ibv_device *device)`: 0 for an unknown device.
///
/// # Safety
/// `device` is NULL or a device from `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    device::lookup(device).map_or(0, |d| d.guid.to_be())
}

/// `int ibv_get_device_index(struct ibv_device *device)`: -1 for an unknown device.
///
/// # Safety
/// `device` is NULL or a device from `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    device::lookup(device).map_or(-1, |d| d.index)
}

/// `const char *ibv_wc_status_str(enum ibv_wc_status status)`.
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    strs::wc_status_str(status).as_ptr()
}

/// `const char *ibv_node_type_str(enum ibv_node_type node_type)`.
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    strs::node_type_str(node_type).as_ptr()
}

/// `const char *ibv_port_state_str(enum ibv_port_state port_state)`.
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    strs::port_state_str(state).as_ptr()
}

/// `const char *ibv_event_type_str(enum ibv_event_type event)`.
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    strs::event_type_str(event).as_ptr()
}

/// `int ibv_rate_to_mult(enum ibv_rate rate)`.
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    strs::rate_to_mult(rate)
}

/// `int ibv_rate_to_mbps(enum ibv_rate rate)`: 0 for unknown rates.
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    strs::rate_to_mult(rate).max(0) * 2500
}

/// `enum ibv_rate mbps_to_ibv_rate(int mbps)`: `IBV_RATE_MAX` (0) for unknown rates.
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    if mbps > 0 && mbps % 2500 == 0 {
        strs::mult_to_rate(mbps / 2500)
    } else {
        crate::abi::IBV_RATE_MAX
    }
}

/// `enum ibv_rate mult_to_ibv_rate(int mult)`.
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    strs::mult_to_rate(mult)
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::CStr;

    #[test]
    fn device_list_round_trip() {
        let mut n = -1;
        // SAFETY: `n` is a writable int.
        let list = unsafe { ibv_get_device_list(&mut n) };
        assert!(!list.is_null());
        assert_eq!(n, 1);
        // SAFETY: the list holds `n` devices and a NULL terminator.
        let (dev, end) = unsafe { (*list, *list.add(1)) };
        assert!(end.is_null());
        // SAFETY: `dev` came from the list; the name is a NUL-terminated static string.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        assert_eq!(name, c"softverbs0");
        // SAFETY: `dev` came from the list.
        unsafe {
            assert_eq!(ibv_get_device_index(dev), 0);
            assert_eq!(
                u64::from_be(ibv_get_device_guid(dev)),
                0x0200_00ff_fe00_0000
            );
            assert_eq!((*dev).transport_type, crate::abi::IBV_TRANSPORT_IB);
            ibv_free_device_list(list);
        }
        // SAFETY: NULL is accepted everywhere.
        unsafe {
            assert!(ibv_get_device_name(ptr::null_mut()).is_null());
            assert_eq!(ibv_get_device_index(ptr::null_mut()), -1);
            ibv_free_device_list(ptr::null_mut());
            let list = ibv_get_device_list(ptr::null_mut());
            assert!(!list.is_null());
            ibv_free_device_list(list);
        }
    }

    /// softverbs' own version node (`softverbs_private_abi::VERSION_NODE`).
    const PRIVATE_NODE: &str = "SOFTVERBS_PRIVATE_1";

    #[test]
    fn private_node_is_the_one_librdmacm_looks_up() {
        assert_eq!(
            softverbs_private_abi::VERSION_NODE.to_str().unwrap(),
            PRIVATE_NODE
        );
        assert_eq!(
            softverbs_private_abi::ENTRY_SYMBOL.to_str().unwrap(),
            "softverbs_private_cm"
        );
    }

    #[test]
    fn export_table_is_consistent() {
        let mut names: Vec<_> = EXPORTS
            .iter()
            .filter(|e| e.default)
            .map(|e| e.name)
            .collect();
        names.sort_unstable();
        names.dedup();
        let defaults = EXPORTS.iter().filter(|e| e.default).count();
        assert_eq!(names.len(), defaults, "no name exported twice as default");
        // The table matches rdma-core 44's export list (exports.txt), node for node.
        let listed: Vec<String> = include_str!("../exports.txt")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        let mut ours: Vec<String> = EXPORTS
            .iter()
            .filter(|e| e.node != PRIVATE_NODE)
            .map(|e| match e.default {
                true => format!("{} {}", e.node, e.name),
                false => format!("({}) {}", e.node, e.name),
            })
            .collect();
        let mut listed = listed;
        listed.sort();
        ours.sort();
        assert_eq!(ours, listed);
        // Beyond rdma-core's: the private entry point, and nothing else.
        let ours: Vec<_> = EXPORTS
            .iter()
            .filter(|e| !e.node.starts_with("IBVERBS_"))
            .map(|e| (e.name, e.node, e.default))
            .collect();
        assert_eq!(
            ours,
            [("softverbs_private_cm", PRIVATE_NODE, true)],
            "exports beyond rdma-core's"
        );
    }
}
