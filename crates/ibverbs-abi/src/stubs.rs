//! Exports softverbs does not implement, each failing exactly as rdma-core 44's libibverbs
//! does when the provider lacks the operation: `verbs.c` and `device.c` call the provider
//! through `verbs_context_ops`, which `dummy_ops.c` fills for every op the provider leaves
//! out. So pointer results are NULL with errno `EOPNOTSUPP`, most `int` results the value
//! `EOPNOTSUPP`, and the few functions with logic of their own in front of the op
//! (`ibv_rereg_mr`, `ibv_set_ece`, `ibv_import_device`) keep it. Functions that involve no
//! provider (`ibv_get_sysfs_path`, `ibv_read_sysfs_file`, the fork calls) do what rdma-core
//! does. `tests/stubs.rs` checks every one through the built library, from a table of what
//! rdma-core returns.
//!
//! The `ibv_cmd_*` and `verbs_*` exports (IBVERBS_PRIVATE_34) are what providers call to talk
//! to the kernel; softverbs has neither providers nor a kernel: they fail with `EOPNOTSUPP`
//! (or do nothing).
//!
//! The simple stubs take no parameters: on x86_64 and aarch64 the caller owns its argument
//! registers and stack, so a C call with any arguments into a parameterless function is
//! harmless.
//!
//! [`compat`] holds the hidden `name@IBVERBS_1.0` versions (rdma-core's 1.0 ABI with the old
//! struct layouts), which softverbs never supports.

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::ptr;
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

use crate::abi::{ibv_ah_attr, ibv_context, ibv_device, ibv_gid, ibv_mr, ibv_pd, ibv_qp};

/// Every default-version export that does not do a verb's work in softverbs: those failing as
/// rdma-core does without the provider op, the provider plumbing, and the calls with nothing
/// to do (fork, sysfs, ioctl helpers, `ibv_copy_*_kern`). `tests/stubs.rs` checks each
/// against what rdma-core 44 returns. (The hidden `@IBVERBS_1.0` versions are all in
/// [`compat`].)
pub const NOT_IMPLEMENTED: &[&str] = &[
    "ibv_rereg_mr",
    "ibv_resize_cq",
    "ibv_query_ece",
    "ibv_set_ece",
    "ibv_import_device",
    "ibv_import_pd",
    "ibv_import_mr",
    "ibv_import_dm",
    "ibv_unimport_pd",
    "ibv_unimport_mr",
    "ibv_unimport_dm",
    "ibv_reg_dmabuf_mr",
    "ibv_resolve_eth_l2_from_gid",
    "ibv_get_sysfs_path",
    "ibv_read_sysfs_file",
    "ibv_read_ibdev_sysfs_file",
    "ibv_fork_init",
    "ibv_is_fork_initialized",
    "ibv_dontfork_range",
    "ibv_dofork_range",
    "ibv_query_qp_data_in_order",
    "ibv_copy_ah_attr_from_kern",
    "ibv_copy_qp_attr_from_kern",
    "ibv_copy_path_rec_from_kern",
    "ibv_copy_path_rec_to_kern",
    "verbs_open_device",
    "_verbs_init_and_alloc_context",
    "verbs_init_cq",
    "verbs_register_driver_34",
    "verbs_set_ops",
    "verbs_uninit_context",
    "__verbs_log",
    "verbs_allow_disassociate_destroy",
    "__ioctl_final_num_attrs",
    "execute_ioctl",
    "ibv_cmd_advise_mr",
    "ibv_cmd_alloc_dm",
    "ibv_cmd_alloc_mw",
    "ibv_cmd_alloc_pd",
    "ibv_cmd_attach_mcast",
    "ibv_cmd_close_xrcd",
    "ibv_cmd_create_ah",
    "ibv_cmd_create_counters",
    "ibv_cmd_create_cq",
    "ibv_cmd_create_cq_ex",
    "ibv_cmd_create_flow",
    "ibv_cmd_create_flow_action_esp",
    "ibv_cmd_create_qp",
    "ibv_cmd_create_qp_ex",
    "ibv_cmd_create_qp_ex2",
    "ibv_cmd_create_rwq_ind_table",
    "ibv_cmd_create_srq",
    "ibv_cmd_create_srq_ex",
    "ibv_cmd_create_wq",
    "ibv_cmd_dealloc_mw",
    "ibv_cmd_dealloc_pd",
    "ibv_cmd_dereg_mr",
    "ibv_cmd_destroy_ah",
    "ibv_cmd_destroy_counters",
    "ibv_cmd_destroy_cq",
    "ibv_cmd_destroy_flow",
    "ibv_cmd_destroy_flow_action",
    "ibv_cmd_destroy_qp",
    "ibv_cmd_destroy_rwq_ind_table",
    "ibv_cmd_destroy_srq",
    "ibv_cmd_destroy_wq",
    "ibv_cmd_detach_mcast",
    "ibv_cmd_free_dm",
    "ibv_cmd_get_context",
    "ibv_cmd_modify_cq",
    "ibv_cmd_modify_flow_action_esp",
    "ibv_cmd_modify_qp",
    "ibv_cmd_modify_qp_ex",
    "ibv_cmd_modify_srq",
    "ibv_cmd_modify_wq",
    "ibv_cmd_open_qp",
    "ibv_cmd_open_xrcd",
    "ibv_cmd_poll_cq",
    "ibv_cmd_post_recv",
    "ibv_cmd_post_send",
    "ibv_cmd_post_srq_recv",
    "ibv_cmd_query_context",
    "ibv_cmd_query_device_any",
    "ibv_cmd_query_mr",
    "ibv_cmd_query_port",
    "ibv_cmd_query_qp",
    "ibv_cmd_query_srq",
    "ibv_cmd_read_counters",
    "ibv_cmd_reg_dmabuf_mr",
    "ibv_cmd_reg_dm_mr",
    "ibv_cmd_reg_mr",
    "ibv_cmd_req_notify_cq",
    "ibv_cmd_rereg_mr",
    "ibv_cmd_resize_cq",
];

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

// dummy_ops.c: import_mr, import_pd, reg_dmabuf_mr, import_dm set errno EOPNOTSUPP and
// return NULL; `_verbs_init_and_alloc_context` is a provider's constructor.
stubs!(ptr:
    ibv_import_mr, ibv_import_pd, ibv_reg_dmabuf_mr, ibv_import_dm,
    _verbs_init_and_alloc_context,
);
// dummy_ops.c: resize_cq and query_ece return EOPNOTSUPP; the provider-side commands have
// no kernel to go to.
stubs!(int:
    ibv_resize_cq, ibv_query_ece, execute_ioctl,
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
// dummy_ops.c: unimport_* do nothing; the rest are provider plumbing.
stubs!(void:
    ibv_unimport_mr, ibv_unimport_pd, ibv_unimport_dm, verbs_init_cq, verbs_register_driver_34,
    verbs_set_ops, verbs_uninit_context, __verbs_log,
);

/// `IBV_REREG_MR_*` flags rdma-core accepts (`IBV_REREG_MR_FLAGS_SUPPORTED`).
const REREG_FLAGS_SUPPORTED: c_int = 0b111;
const REREG_CHANGE_TRANSLATION: c_int = 1;
const REREG_CHANGE_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_ERR_INPUT`
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `int ibv_rereg_mr(mr, flags, pd, addr, length, access)`: as verbs.c, the arguments are
/// checked first (`IBV_REREG_MR_ERR_INPUT`, errno EINVAL), then the provider's op, which
/// softverbs lacks: dummy_ops.c fails it with errno EOPNOTSUPP and verbs.c reports
/// `IBV_REREG_MR_ERR_CMD`. (A NULL `mr`, which rdma-core would dereference, is bad input.)
///
/// # Safety
/// `mr` NULL or from `ibv_reg_mr`.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    _pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let bad = mr.is_null()
        || flags & !REREG_FLAGS_SUPPORTED != 0
        || flags & REREG_CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null())
        || access != 0 && flags & REREG_CHANGE_ACCESS == 0;
    if bad {
        set_errno(libc::EINVAL);
        return IBV_REREG_MR_ERR_INPUT;
    }
    set_errno(libc::EOPNOTSUPP);
    IBV_REREG_MR_ERR_CMD
}

/// `int ibv_set_ece(qp, ece)`: as verbs.c, a zero `vendor_id` sets errno EOPNOTSUPP and
/// returns it; otherwise dummy_ops.c's `set_ece` returns EOPNOTSUPP. (NULL `ece`: EINVAL.)
///
/// # Safety
/// `ece` NULL or a readable `struct ibv_ece` (its first field is `vendor_id`).
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, ece: *const u32) -> c_int {
    if ece.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: readable per the contract.
    if unsafe { ece.read() } == 0 {
        set_errno(libc::EOPNOTSUPP);
    }
    libc::EOPNOTSUPP
}

/// `struct ibv_context *ibv_import_device(int cmd_fd)`: as device.c with softverbs' device:
/// the `cmd_fd` of an open softverbs context finds the device, whose provider cannot import
/// a context (EOPNOTSUPP); an fd that is not a character device is EINVAL; any other is no
/// device's (ENODEV).
pub extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    if crate::ctx::is_cmd_fd(cmd_fd) {
        return ret_null(libc::EOPNOTSUPP);
    }
    // SAFETY: fstat into a zeroed stat buffer; the result is checked.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(cmd_fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
        return ret_null(libc::EINVAL);
    }
    ret_null(libc::ENODEV)
}

/// `struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data)`:
/// in rdma-core this is `ibv_open_device` (which calls it with NULL private data).
///
/// # Safety
/// As `ibv_open_device`.
pub unsafe extern "C" fn verbs_open_device(
    device: *mut ibv_device,
    _private_data: *mut c_void,
) -> *mut ibv_context {
    // SAFETY: forwarded contract.
    unsafe { crate::ctx::ibv_open_device(device) }
}

/// `int ibv_resolve_eth_l2_from_gid(context, attr, eth_mac, vid)`: rdma-core queries the
/// source GID (failing as `ibv_query_gid` does, -1), then resolves the destination's
/// Ethernet address through the kernel's neighbour table, failing with negative errno
/// values. A softverbs GID names a UDP endpoint, which has no Ethernet neighbour: -EINVAL,
/// what rdma-core answers when no interface takes the GID's address.
///
/// # Safety
/// `context` from `ibv_open_device`; `attr` readable.
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *const ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    if attr.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: readable per the contract.
    let a = unsafe { &*attr };
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: forwarded contract; `gid` is writable.
    let r = unsafe {
        crate::ctx::ibv_query_gid(context, a.port_num, c_int::from(a.grh.sgid_index), &mut gid)
    };
    if r != 0 {
        return r;
    }
    -libc::EINVAL
}

/// `const char *ibv_get_sysfs_path(void)`: as sysfs.c, `$SYSFS_PATH` without trailing
/// slashes (at most 256 bytes, and only when not running setuid), else `/sys`.
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid and geteuid have no preconditions.
        let trusted = unsafe { libc::getuid() == libc::geteuid() };
        let env = trusted
            .then(|| std::env::var_os("SYSFS_PATH"))
            .flatten()
            .map(|v| {
                use std::os::unix::ffi::OsStrExt;
                let mut b = v.as_bytes().to_vec();
                b.truncate(crate::abi::IBV_SYSFS_PATH_MAX);
                b.truncate(b.iter().position(|&c| c == 0).unwrap_or(b.len()));
                while b.last() == Some(&b'/') {
                    b.pop();
                }
                b
            });
        CString::new(env.unwrap_or_else(|| b"/sys".to_vec())).unwrap_or_default()
    })
    .as_ptr()
}

/// `int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)`: as
/// sysfs.c, reads `dir/file` into `buf`: the length read without a trailing newline (the
/// text NUL-terminated), or -1 when it cannot be read or would not fit with its NUL.
///
/// # Safety
/// `dir` and `file` NUL-terminated strings; `buf` writable for `size` bytes.
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() && size > 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: NUL-terminated per the contract.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let mut path = d.to_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(f.to_bytes());
    let Ok(path) = CString::new(path) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return -1;
    }
    // SAFETY: `buf` is writable for `size` bytes per the contract.
    let len = unsafe { libc::read(fd, buf.cast(), size) };
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    if len > 0 {
        let n = len as usize;
        // SAFETY: `n <= size` bytes of `buf` were just written.
        unsafe {
            if *buf.add(n - 1) == b'\n' as c_char {
                *buf.add(n - 1) = 0;
                return (n - 1) as c_int;
            } else if n < size {
                *buf.add(n) = 0;
            } else {
                return -1;
            }
        }
    }
    len as c_int
}

/// `int ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct verbs_sysfs_dev *sysfs_dev,
/// const char *fnfmt, ...)`: a softverbs device has no sysfs directory; sysfs.c answers a
/// device without one with -1 and errno EINVAL.
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::EINVAL);
    -1
}

/// `int ibv_fork_init(void)`: 0. Nothing needs preparing: the parent's device reads and
/// writes the parent's pages whatever copy-on-write does after a fork, and a child's
/// inherited contexts fail cleanly (`softverbs::fork`).
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `int ibv_dontfork_range(void *base, size_t size)`: 0 (see `ibv_fork_init`).
pub extern "C" fn ibv_dontfork_range() -> c_int {
    0
}

/// `int ibv_dofork_range(void *base, size_t size)`: 0 (see `ibv_fork_init`).
pub extern "C" fn ibv_dofork_range() -> c_int {
    0
}

/// `enum ibv_fork_status ibv_is_fork_initialized(void)`: `IBV_FORK_UNNEEDED` (2), what is
/// true of softverbs: registered memory stays correct across fork without `ibv_fork_init`.
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `int ibv_query_qp_data_in_order(...)`: 0, as dummy_ops.c (no in-order guarantee).
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

/// `bool verbs_allow_disassociate_destroy(int ret)`: false.
pub extern "C" fn verbs_allow_disassociate_destroy() -> bool {
    false
}

/// `unsigned int __ioctl_final_num_attrs(...)`: 0 (there is no kernel ioctl interface).
pub extern "C" fn __ioctl_final_num_attrs() -> c_uint {
    0
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_name_is_a_default_export() {
        for name in super::NOT_IMPLEMENTED {
            assert!(
                crate::EXPORTS.iter().any(|e| e.default && e.name == *name),
                "{name} is not exported"
            );
        }
    }
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
