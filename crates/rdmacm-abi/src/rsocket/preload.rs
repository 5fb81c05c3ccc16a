//! Making Debian's `librspreload.so` (rdma-core 44) safe to start.
//!
//! The preload keeps pointers to libc's socket functions and fills them in lazily, in
//! `init_preload`. Its `socket`, `read`, `write`, `getsockname` and most other wrappers call
//! that first, but its `recv`, `recvfrom`, `recvmsg`, `send`, `sendto` and `sendmsg` wrappers
//! do not: a program whose first wrapped call is one of those (socat 1.7.4 calls `recv` on a
//! socketpair at start-up) jumps to a NULL pointer. That happens with rdma-core's own
//! librdmacm too.
//!
//! librspreload depends on this library, so this library's constructor runs before the
//! program's first call. When the preload is in `LD_PRELOAD`, the constructor makes one call
//! the preload wraps *with* initialisation (`getsockname` on descriptor 0, whose result is
//! ignored: with no rsocket at 0 it is libc's own answer), so the pointers are set before the
//! program can reach the other wrappers.

use core::ffi::c_int;

/// Runs [`initialise_rspreload`] when the dynamic loader initialises this library.
#[used]
#[link_section = ".init_array"]
static INITIALISE_RSPRELOAD: extern "C" fn() = initialise_rspreload;

extern "C" fn initialise_rspreload() {
    let preloaded =
        std::env::var_os("LD_PRELOAD").is_some_and(|v| v.to_string_lossy().contains("rspreload"));
    if !preloaded {
        return;
    }
    let errno = crate::errno::errno();
    // SAFETY: `addr` and `len` are live locals of the sizes passed; `getsockname` writes at
    // most `len` bytes into `addr`. Descriptor 0 is only asked its name, never changed.
    unsafe {
        let mut addr: libc::sockaddr_storage = core::mem::zeroed();
        let mut len = core::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let _: c_int = libc::getsockname(
            0,
            (&mut addr as *mut libc::sockaddr_storage).cast(),
            &mut len,
        );
    }
    crate::errno::set_errno(errno);
}
