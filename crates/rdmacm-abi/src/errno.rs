//! errno at the C ABI: functions fail with -1 (or NULL) and `errno`, as rdma-core's do.

use core::ffi::c_int;

/// An errno value (`libc::E*`), the error type of the functions behind the exports.
pub type Errno = c_int;

/// Sets this thread's `errno`.
pub fn set_errno(e: Errno) {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for writes.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
pub fn errno() -> Errno {
    // SAFETY: as in `set_errno`, valid for reads.
    unsafe { *libc::__errno_location() }
}

/// `0`, or `-1` with `errno` set: rdma-core's `ERR(e)` convention.
pub fn ret(r: Result<(), Errno>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The pointer, or NULL with `errno` set.
pub fn ret_ptr<T>(r: Result<*mut T, Errno>) -> *mut T {
    r.unwrap_or_else(|e| {
        set_errno(e);
        core::ptr::null_mut()
    })
}
