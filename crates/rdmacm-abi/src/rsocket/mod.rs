//! The rsocket functions (`<rdma/rsocket.h>`): sockets over RDMA connections.
//!
//! # Layout, and how a socket type plugs in
//!
//! - this file: the exported `r*` functions. Each looks its descriptor up in the one
//!   registry ([`SOCKETS`]: descriptor → [`Socket`]) and dispatches on the socket's type;
//!   `rsocket` dispatches on the `type` argument; `rpoll`/`rselect` ask every rsocket among
//!   the descriptors through [`Socket`]'s readiness methods and wait on ordinary fds and the
//!   rsockets' wait fds together.
//! - `stream.rs`: `SOCK_STREAM` rsockets.
//! - a datagram rsocket (`SOCK_DGRAM`) plugs in as `dgram.rs`: a `Socket::Dgram` variant, its
//!   arm in `rsocket` and in each `match` below, nothing else in this file.
//!
//! An rsocket's descriptor is a real fd the library owns (so no ordinary fd can have its
//! number while the rsocket lives), closed by `rclose`.
//!
//! Functions given a descriptor that is not an rsocket fail with `EBADF`, as rdma-core's
//! do (`rclose` included, which in rdma-core returns a bare `EBADF` instead of -1; here it
//! is -1 with `errno`). Every one returns -1 (`(size_t)-1` for `riowrite`) with `errno`;
//! none aborts.

use core::ffi::{c_int, c_void};

use libc::{fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, ssize_t, timeval};

use crate::abi::{sockaddr, socklen_t, AF_IB};
use crate::errno::set_errno;

mod stream;

/// One rsocket, by type.
#[derive(Clone)]
pub enum Socket {
    /// `SOCK_STREAM`.
    Stream(std::sync::Arc<stream::StreamSocket>),
}

/// Every live rsocket, by descriptor.
pub static SOCKETS: std::sync::Mutex<std::collections::BTreeMap<c_int, Socket>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// -1 with `errno = EBADF`: the descriptor is not an rsocket.
fn not_an_rsocket() -> c_int {
    set_errno(libc::EBADF);
    -1
}

/// `rsocket`
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    let supported = matches!(domain, libc::AF_INET | libc::AF_INET6 | AF_IB)
        && match kind {
            libc::SOCK_STREAM => protocol == 0 || protocol == libc::IPPROTO_TCP,
            libc::SOCK_DGRAM => protocol == 0 || protocol == libc::IPPROTO_UDP,
            _ => false,
        };
    set_errno(if supported {
        libc::ENOSYS
    } else {
        libc::ENOTSUP
    });
    -1
}

/// Declares rsocket functions that take a descriptor: each fails as [`not_an_rsocket`].
macro_rules! no_rsocket {
    ($( fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty; )*) => {$(
        #[doc = concat!("`", stringify!($name), "`: -1, `errno = EBADF` (no rsocket exists).")]
        ///
        /// # Safety
        /// None: nothing is read through the pointers.
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $( let _ = $arg; )*
            not_an_rsocket() as $ret
        }
    )*};
}

no_rsocket! {
    fn rbind(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    fn raccept(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn rconnect(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn rshutdown(socket: c_int, how: c_int) -> c_int;
    fn rclose(socket: c_int) -> c_int;
    fn rrecv(socket: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    fn rrecvfrom(
        socket: c_int, buf: *mut c_void, len: size_t, flags: c_int,
        src: *mut sockaddr, addrlen: *mut socklen_t
    ) -> ssize_t;
    fn rsend(socket: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    fn rsendto(
        socket: c_int, buf: *const c_void, len: size_t, flags: c_int,
        dst: *const sockaddr, addrlen: socklen_t
    ) -> ssize_t;
    fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t;
    fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t;
    fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn rgetpeername(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn rgetsockname(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn rsetsockopt(
        socket: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t
    ) -> c_int;
    fn rgetsockopt(
        socket: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t
    ) -> c_int;
    fn riomap(
        socket: c_int, buf: *mut c_void, len: size_t, prot: c_int, flags: c_int, offset: off_t
    ) -> off_t;
    fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int;
    fn riowrite(
        socket: c_int, buf: *const c_void, count: size_t, offset: off_t, flags: c_int
    ) -> size_t;
}

/// `rfcntl(socket, cmd, ...)`: -1, `errno = EBADF` (no rsocket exists). Declared without the
/// variadic argument, which it never reads: in the C calling conventions of x86_64 and
/// aarch64 a variadic call to a function that reads only its fixed arguments is sound.
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int) -> c_int {
    let _ = (socket, cmd);
    not_an_rsocket()
}

/// rdma-core refuses ancillary data in `rsendmsg`/`rrecvmsg` (`ENOTSUP`) before it looks the
/// descriptor up; otherwise, as for the others, `EBADF`.
///
/// # Safety
/// `msg` is NULL or readable.
unsafe fn msg_call(msg: *const msghdr) -> ssize_t {
    // SAFETY: NULL or readable (caller).
    let control =
        unsafe { msg.as_ref() }.is_some_and(|m| !m.msg_control.is_null() && m.msg_controllen != 0);
    if control {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    not_an_rsocket() as ssize_t
}

/// `rrecvmsg`
///
/// # Safety
/// `msg` is NULL or a readable `struct msghdr`.
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let _ = (socket, flags);
    // SAFETY: the caller's guarantee.
    unsafe { msg_call(msg) }
}

/// `rsendmsg`
///
/// # Safety
/// `msg` is NULL or a readable `struct msghdr`.
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let _ = (socket, flags);
    // SAFETY: the caller's guarantee.
    unsafe { msg_call(msg) }
}

/// `rpoll`: `poll` (no descriptor can be an rsocket).
///
/// # Safety
/// As `poll(2)`: `fds` points to `nfds` entries.
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's guarantee is poll's precondition.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// `rselect`: `select` (no descriptor can be an rsocket).
///
/// # Safety
/// As `select(2)`.
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut fd_set,
    writefds: *mut fd_set,
    exceptfds: *mut fd_set,
    timeout: *mut timeval,
) -> c_int {
    // SAFETY: the caller's guarantee is select's precondition.
    unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) }
}
