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

mod dgram;
mod stream;

/// One rsocket, by type.
#[derive(Clone)]
pub enum Socket {
    /// `SOCK_STREAM`.
    Stream(std::sync::Arc<stream::StreamSocket>),
    /// `SOCK_DGRAM`.
    Dgram(std::sync::Arc<dgram::DgramSocket>),
}

/// The rsocket behind `fd`, if it is one.
fn lookup(fd: c_int) -> Option<Socket> {
    SOCKETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .cloned()
}

/// The datagram rsocket behind `fd`, if it is one.
fn dgram_socket(fd: c_int) -> Option<std::sync::Arc<dgram::DgramSocket>> {
    match lookup(fd) {
        Some(Socket::Dgram(d)) => Some(d),
        _ => None,
    }
}

/// A byte count, or -1 with `errno`.
fn ret_len(r: Result<usize, crate::errno::Errno>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
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
    if !supported {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    if kind == libc::SOCK_DGRAM {
        return match dgram::DgramSocket::create(domain) {
            Ok(d) => {
                let fd = d.fd();
                SOCKETS
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(fd, Socket::Dgram(std::sync::Arc::new(d)));
                fd
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        };
    }
    set_errno(libc::ENOSYS);
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
    fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    fn raccept(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn rshutdown(socket: c_int, how: c_int) -> c_int;
    fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t;
    fn riomap(
        socket: c_int, buf: *mut c_void, len: size_t, prot: c_int, flags: c_int, offset: off_t
    ) -> off_t;
    fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int;
    fn riowrite(
        socket: c_int, buf: *const c_void, count: size_t, offset: off_t, flags: c_int
    ) -> size_t;
}

/// `rbind`
///
/// # Safety
/// `addr` points to `len` readable bytes.
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match lookup(socket) {
        // SAFETY: the caller's guarantee.
        Some(Socket::Dgram(d)) => crate::errno::ret(unsafe { d.bind(addr, len) }),
        _ => not_an_rsocket(),
    }
}

/// `rconnect`
///
/// # Safety
/// `addr` points to `len` readable bytes.
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match lookup(socket) {
        // SAFETY: the caller's guarantee.
        Some(Socket::Dgram(d)) => crate::errno::ret(unsafe { d.connect(addr, len) }),
        _ => not_an_rsocket(),
    }
}

/// `rclose`
pub extern "C" fn rclose(socket: c_int) -> c_int {
    let removed = SOCKETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&socket);
    match removed {
        Some(Socket::Dgram(d)) => {
            d.close();
            0
        }
        Some(other) => {
            // Not this file's to close.
            SOCKETS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(socket, other);
            not_an_rsocket()
        }
        None => not_an_rsocket(),
    }
}

/// The caller's buffer as a slice (empty for NULL or 0).
///
/// # Safety
/// `buf` is NULL or has `len` bytes valid for writes.
unsafe fn out_buf<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
    if buf.is_null() || len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's guarantee.
    unsafe { core::slice::from_raw_parts_mut(buf.cast(), len) }
}

/// The caller's data as a slice (empty for NULL or 0).
///
/// # Safety
/// `buf` is NULL or has `len` readable bytes.
unsafe fn in_buf<'a>(buf: *const c_void, len: size_t) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's guarantee.
    unsafe { core::slice::from_raw_parts(buf.cast(), len) }
}

/// `rrecvfrom`
///
/// # Safety
/// `buf` has `len` writable bytes; `src`/`addrlen` as for `recvfrom(2)`.
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket() as ssize_t;
    };
    // SAFETY: the caller's guarantee.
    let out = unsafe { out_buf(buf, len) };
    ret_len(d.recv_from(out, flags).map(|(n, from)| {
        // SAFETY: the caller's guarantee.
        unsafe { dgram::SockAddrBuf::from(from).write_to(src, addrlen) };
        n
    }))
}

/// `rrecv`
///
/// # Safety
/// `buf` has `len` writable bytes.
pub unsafe extern "C" fn rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's guarantee; no address wanted.
    unsafe {
        rrecvfrom(
            socket,
            buf,
            len,
            flags,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    }
}

/// `rread`
///
/// # Safety
/// `buf` has `count` writable bytes.
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's guarantee.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rsendto`
///
/// # Safety
/// `buf` has `len` readable bytes; `dst` is NULL or has `addrlen` readable bytes.
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dst: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket() as ssize_t;
    };
    let to = if dst.is_null() {
        None
    } else {
        // SAFETY: the caller's guarantee.
        match unsafe { dgram::read_addr(dst, addrlen) } {
            Some(a) => Some(a),
            None => {
                set_errno(libc::EINVAL);
                return -1;
            }
        }
    };
    // SAFETY: the caller's guarantee.
    ret_len(d.send_to(unsafe { in_buf(buf, len) }, flags, to))
}

/// `rsend`
///
/// # Safety
/// `buf` has `len` readable bytes.
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's guarantee; no address.
    unsafe { rsendto(socket, buf, len, flags, core::ptr::null(), 0) }
}

/// `rwrite`
///
/// # Safety
/// `buf` has `count` readable bytes.
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's guarantee.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rgetsockname`
///
/// # Safety
/// As `getsockname(2)`.
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    match lookup(socket) {
        // SAFETY: the caller's guarantee is getsockname's.
        Some(Socket::Dgram(d)) => unsafe { libc::getsockname(d.fd(), addr.cast(), len) },
        _ => not_an_rsocket(),
    }
}

/// `rgetpeername`
///
/// # Safety
/// As `getpeername(2)`.
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    match lookup(socket) {
        // SAFETY: the caller's guarantee is getpeername's.
        Some(Socket::Dgram(d)) => unsafe { libc::getpeername(d.fd(), addr.cast(), len) },
        _ => not_an_rsocket(),
    }
}

/// `rsetsockopt`
///
/// # Safety
/// `val` has `len` readable bytes.
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    match lookup(socket) {
        // SAFETY: the caller's guarantee.
        Some(Socket::Dgram(d)) => crate::errno::ret(unsafe { d.set_option(level, name, val, len) }),
        _ => not_an_rsocket(),
    }
}

/// `rgetsockopt`: an `int` option.
///
/// # Safety
/// `val` has `*len` writable bytes; `len` is readable and writable.
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket();
    };
    // SAFETY: NULL or readable (caller).
    if val.is_null() || len.is_null() || (unsafe { *len } as usize) < size_of::<c_int>() {
        set_errno(libc::EINVAL);
        return -1;
    }
    match d.get_option(level, name) {
        Ok(v) => {
            // SAFETY: at least an int's room (checked).
            unsafe {
                val.cast::<c_int>().write_unaligned(v);
                *len = size_of::<c_int>() as socklen_t;
            }
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `rfcntl(socket, cmd, ...)`: `F_GETFL` and `F_SETFL` (the flags, of which `O_NONBLOCK`
/// counts), as rsocket.c; other commands `ENOTSUP`. The variadic argument is declared as a
/// fixed `c_long` third argument: in the C calling conventions of x86_64 and aarch64 a
/// variadic `int` is passed where a fixed one would be, and it is read only for `F_SETFL`.
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: core::ffi::c_long) -> c_int {
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket();
    };
    match cmd {
        libc::F_GETFL => d.get_flags(),
        libc::F_SETFL => {
            d.set_flags(arg as c_int);
            0
        }
        _ => {
            set_errno(libc::ENOTSUP);
            -1
        }
    }
}

/// Whether a `msghdr` carries ancillary data, which rdma-core refuses (`ENOTSUP`) before it
/// looks the descriptor up.
///
/// # Safety
/// `msg` is NULL or readable.
unsafe fn has_control(msg: *const msghdr) -> bool {
    // SAFETY: NULL or readable (caller).
    unsafe { msg.as_ref() }.is_some_and(|m| !m.msg_control.is_null() && m.msg_controllen != 0)
}

/// The iovecs of a `msghdr`.
///
/// # Safety
/// `m.msg_iov` is NULL or has `m.msg_iovlen` readable entries.
unsafe fn iovecs(m: &msghdr) -> &[iovec] {
    if m.msg_iov.is_null() || m.msg_iovlen == 0 {
        return &[];
    }
    // SAFETY: the caller's guarantee.
    unsafe { core::slice::from_raw_parts(m.msg_iov, m.msg_iovlen) }
}

/// `rrecvmsg`: a datagram rsocket fills the first iovec (as rsocket.c) and, unlike it,
/// `msg_name`.
///
/// # Safety
/// `msg` is NULL or a readable and writable `struct msghdr` whose buffers are valid.
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's guarantee.
    if unsafe { has_control(msg) } {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket() as ssize_t;
    };
    // SAFETY: NULL or valid (caller).
    let Some(m) = (unsafe { msg.as_mut() }) else {
        set_errno(libc::EFAULT);
        return -1;
    };
    // SAFETY: the caller's guarantee.
    let first = unsafe { iovecs(m) }.first().copied();
    // SAFETY: the caller's guarantee.
    let out = first.map_or(&mut [][..], |v| unsafe { out_buf(v.iov_base, v.iov_len) });
    ret_len(d.recv_from(out, flags).map(|(n, from)| {
        if !m.msg_name.is_null() {
            // SAFETY: the caller's buffer of `msg_namelen` bytes.
            unsafe {
                dgram::SockAddrBuf::from(from).write_to(m.msg_name.cast(), &mut m.msg_namelen)
            };
        }
        m.msg_flags = 0;
        n
    }))
}

/// `rsendmsg`: a datagram rsocket sends the iovecs as one datagram to `msg_name` (or the
/// connected peer).
///
/// # Safety
/// `msg` is NULL or a readable `struct msghdr` whose buffers are valid.
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's guarantee.
    if unsafe { has_control(msg) } {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    let Some(d) = dgram_socket(socket) else {
        return not_an_rsocket() as ssize_t;
    };
    // SAFETY: NULL or valid (caller).
    let Some(m) = (unsafe { msg.as_ref() }) else {
        set_errno(libc::EFAULT);
        return -1;
    };
    let mut data = Vec::new();
    // SAFETY: the caller's guarantee.
    for v in unsafe { iovecs(m) } {
        // SAFETY: the caller's guarantee.
        data.extend_from_slice(unsafe { in_buf(v.iov_base, v.iov_len) });
    }
    let to = if m.msg_name.is_null() {
        None
    } else {
        // SAFETY: the caller's buffer of `msg_namelen` bytes.
        match unsafe { dgram::read_addr(m.msg_name.cast(), m.msg_namelen) } {
            Some(a) => Some(a),
            None => {
                set_errno(libc::EINVAL);
                return -1;
            }
        }
    };
    ret_len(d.send_to(&data, flags, to))
}

/// `rpoll`: ordinary descriptors as `poll` sees them, rsockets as their state says. Looks
/// at everything once; then, unless something is ready or `timeout` is 0, sleeps on the
/// ordinary descriptors and the rsockets' own (their UDP socket and completion channel)
/// and looks again, until something is ready or the time is up.
///
/// # Safety
/// As `poll(2)`: `fds` points to `nfds` entries.
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() || nfds == 0 {
        // SAFETY: the caller's guarantee is poll's precondition.
        return unsafe { libc::poll(fds, nfds, timeout) };
    }
    // SAFETY: the caller's guarantee.
    let fds = unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) };
    let socks: Vec<Option<Socket>> = fds.iter().map(|p| lookup(p.fd)).collect();
    if socks.iter().all(|s| !matches!(s, Some(Socket::Dgram(_)))) {
        // SAFETY: as above.
        return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    }
    let deadline = (timeout >= 0)
        .then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout as u64));
    let check = |fds: &mut [pollfd]| -> c_int {
        let mut ready = 0;
        for (p, s) in fds.iter_mut().zip(&socks) {
            p.revents = match s {
                Some(Socket::Dgram(d)) => d.ready(p.events),
                _ => {
                    let mut one = *p;
                    // SAFETY: one entry.
                    unsafe { libc::poll(&mut one, 1, 0) };
                    one.revents
                }
            };
            ready += c_int::from(p.revents != 0);
        }
        ready
    };
    loop {
        let ready = check(fds);
        if ready > 0 || timeout == 0 {
            return ready;
        }
        let mut wait = Vec::with_capacity(fds.len() + 1);
        for (p, s) in fds.iter().zip(&socks) {
            match s {
                Some(Socket::Dgram(d)) => wait.extend(d.wait_fds()),
                _ => wait.push(pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        // Armed: look once more, as what completed before the arm raises no event.
        let ready = check(fds);
        if ready > 0 {
            return ready;
        }
        let ms = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return 0;
                }
                left.as_millis().clamp(1, c_int::MAX as u128) as c_int
            }
            None => -1,
        };
        // SAFETY: `wait` holds `wait.len()` entries.
        if unsafe { libc::poll(wait.as_mut_ptr(), wait.len() as nfds_t, ms) } < 0 {
            return -1;
        }
        for s in socks.iter().flatten() {
            if let Socket::Dgram(d) = s {
                d.woken();
            }
        }
    }
}

/// `rselect`: `select` when no descriptor is an rsocket; otherwise, as rsocket.c does, the
/// sets become a `pollfd` array for [`rpoll`] and its answer becomes the sets again
/// (anything beyond readable and writable counts as an exception).
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
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    // SAFETY: each set is NULL or a valid fd_set (caller); FD_ISSET reads within it.
    let is_set = |set: *mut fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut fds: Vec<pollfd> = (0..nfds)
        .filter_map(|fd| {
            let mut events = 0;
            if is_set(readfds, fd) {
                events |= libc::POLLIN;
            }
            if is_set(writefds, fd) {
                events |= libc::POLLOUT;
            }
            (events != 0 || is_set(exceptfds, fd)).then_some(pollfd {
                fd,
                events,
                revents: 0,
            })
        })
        .collect();
    if !fds
        .iter()
        .any(|p| matches!(lookup(p.fd), Some(Socket::Dgram(_))))
    {
        // SAFETY: the caller's guarantee is select's precondition.
        return unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) };
    }
    // SAFETY: NULL or a valid timeval (caller).
    let ms = match unsafe { timeout.as_ref() } {
        None => -1,
        Some(t) => (t.tv_sec.max(0) * 1000 + t.tv_usec.max(0) / 1000)
            .min(c_int::MAX as i64) as c_int,
    };
    // SAFETY: `fds` holds `fds.len()` entries.
    let r = unsafe { rpoll(fds.as_mut_ptr(), fds.len() as nfds_t, ms) };
    if r < 0 {
        return r;
    }
    for set in [readfds, writefds, exceptfds] {
        if !set.is_null() {
            // SAFETY: a valid fd_set (caller).
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &fds {
        let mut mark = |set: *mut fd_set, on: bool| {
            if on && !set.is_null() {
                // SAFETY: a valid fd_set (caller), fd below FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        };
        mark(readfds, p.revents & libc::POLLIN != 0);
        mark(writefds, p.revents & libc::POLLOUT != 0);
        mark(exceptfds, p.revents & !(libc::POLLIN | libc::POLLOUT) != 0);
    }
    count
}
