//! What happens to devices across `fork()`.
//!
//! A child process inherits the parent's memory but none of its threads: a device's
//! progress thread does not run there, and a lock it held at the moment of the fork stays
//! held forever. So a device belongs to the process that opened it. An atfork handler
//! (installed when the first device opens) marks every device open at the fork as
//! *inherited* in the child:
//!
//! - every call on an inherited device fails cleanly (the C ABI: `EIO`) without touching
//!   its locks or its socket, and dropping one leaks it instead of stopping a thread that
//!   does not exist;
//! - the child lets go of the parent's UDP sockets (each descriptor is pointed at
//!   `/dev/null`), so it never reads the parent's datagrams and the parent's address is
//!   free again once the parent closes;
//! - the child can open a device of its own, with a new endpoint.
//!
//! Registered memory needs nothing: the parent's engine reads and writes the parent's
//! pages, whatever copy-on-write does to the child's (what `ibv_is_fork_initialized`
//! reports as `IBV_FORK_UNNEEDED`).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;

/// Bumped in the child at every fork: devices remember the value they were opened in.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// The current fork generation of this process.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Sockets the child must let go of (-1: free slot). A fixed table, so the child's handler
/// reads it without a lock or an allocation.
static SOCKETS: [AtomicI32; 256] = [const { AtomicI32::new(-1) }; 256];

/// Notes a device socket so that a forked child lets go of it. Best effort beyond 256
/// sockets.
pub fn register_socket(fd: i32) {
    install();
    for s in &SOCKETS {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

/// Forgets a socket noted by [`register_socket`] (before it is closed).
pub fn unregister_socket(fd: i32) {
    for s in &SOCKETS {
        if s.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
}

/// Installs the atfork handler once per process.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers handlers that only take and release the process device's slot
        // lock (see `crate::device`), touch atomics and make async-signal-safe calls.
        let r = unsafe { libc::pthread_atfork(Some(before_fork), Some(in_parent), Some(in_child)) };
        if r != 0 {
            tracing::warn!(
                errno = r,
                "pthread_atfork failed: a forked child must not use softverbs"
            );
        }
    });
}

/// Runs in the parent before `fork()`: holds the process device's slot so that no other
/// thread is half-way through opening the device when the child is made.
extern "C" fn before_fork() {
    crate::device::hold_process_slot();
}

/// Runs in the parent after `fork()`.
extern "C" fn in_parent() {
    crate::device::release_process_slot();
}

/// Runs in the child right after `fork()`, before `fork` returns there.
extern "C" fn in_child() {
    crate::device::release_process_slot();
    GENERATION.fetch_add(1, Ordering::AcqRel);
    // SAFETY: open, dup2 and close are async-signal-safe; the path is a static C string.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    for s in &SOCKETS {
        let fd = s.swap(-1, Ordering::AcqRel);
        if fd >= 0 && null >= 0 {
            // SAFETY: `fd` is a descriptor the parent's device owned; pointing it at
            // /dev/null releases the socket in this process while the number stays valid
            // for the inherited (leaked) device object that still names it.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    }
    if null >= 0 {
        // SAFETY: our own descriptor from `open` above.
        unsafe { libc::close(null) };
    }
}
