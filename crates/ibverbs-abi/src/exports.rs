//! The exported C functions, each bound to its rdma-core 44 version node.
//!
//! The functions are ordinary Rust `extern "C"` functions named like their C counterparts
//! (mangled, so not exported by rustc). `exports!` emits, for each, a one-instruction
//! trampoline in `global_asm!` that jumps to it (`sym` operand) and a
//! `.symver softverbs_v_<name>, <name>@@<NODE>` that gives the trampoline its public,
//! versioned name. See the crate documentation for why it is done this way.

use core::ffi::{c_char, c_int};
use core::ptr;

use crate::abi::ibv_device;
use crate::{device, strs};

/// One exported symbol: public name and version node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Export {
    /// The name C programs link against (`ibv_get_device_list`).
    pub name: &'static str,
    /// The rdma-core version node (`IBVERBS_1.1`), the default (`@@`) version of `name`.
    pub node: &'static str,
}

/// The jump from a trampoline to its Rust function (`{f}` is the `sym` operand).
#[cfg(target_arch = "x86_64")]
macro_rules! tail_jump {
    () => {
        "jmp {f}"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! tail_jump {
    () => {
        "b {f}"
    };
}

macro_rules! exports {
    ($( $node:literal { $( $name:ident ),* $(,)? } )*) => {
        $($(
            #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
            core::arch::global_asm!(
                ".pushsection .text",
                ".p2align 4",
                concat!(".globl softverbs_v_", stringify!($name)),
                concat!(".type softverbs_v_", stringify!($name), ", STT_FUNC"),
                concat!("softverbs_v_", stringify!($name), ":"),
                tail_jump!(),
                concat!(
                    ".size softverbs_v_", stringify!($name),
                    ", . - softverbs_v_", stringify!($name)
                ),
                concat!(
                    ".symver softverbs_v_", stringify!($name), ", ",
                    stringify!($name), "@@", $node
                ),
                ".popsection",
                f = sym $name,
            );
        )*)*
        /// Every symbol this library exports, with its version node.
        pub const EXPORTS: &[Export] = &[$($(
            Export { name: stringify!($name), node: $node },
        )*)*];
    };
}

exports! {
    "IBVERBS_1.0" {
        ibv_rate_to_mult,
        mult_to_ibv_rate,
    }
    "IBVERBS_1.1" {
        ibv_get_device_list,
        ibv_free_device_list,
        ibv_get_device_name,
        ibv_get_device_guid,
        ibv_wc_status_str,
        ibv_node_type_str,
        ibv_port_state_str,
        ibv_event_type_str,
    }
    "IBVERBS_1.9" {
        ibv_get_device_index,
    }
}

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = e };
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
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
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

    #[test]
    fn export_table_is_consistent() {
        let mut names: Vec<_> = EXPORTS.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EXPORTS.len(), "no name exported twice");
        assert!(EXPORTS.iter().all(|e| e.node.starts_with("IBVERBS_")));
    }
}
