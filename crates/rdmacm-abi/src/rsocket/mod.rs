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
//! - `dgram.rs`: `SOCK_DGRAM` rsockets (a `Socket::Dgram` variant, its arm in `rsocket` and
//!   in each `match` of `impl Socket` below, each forwarding one call to the socket type's
//!   method of the same name; `sendv` gathers a datagram rsocket's buffers into one
//!   datagram).
//!
//! An rsocket's descriptor is a real fd the library owns (so no ordinary fd can have its
//! number while the rsocket lives), closed by `rclose`.
//!
//! Functions given a descriptor that is not an rsocket fail with `EBADF`, as rdma-core's
//! do (`rclose` included, which in rdma-core returns a bare `EBADF` instead of -1; here it
//! is -1 with `errno`). Every one returns -1 (`(size_t)-1` for `riowrite`) with `errno`;
//! none aborts.

use core::ffi::{c_int, c_void};
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{fd_set, iovec, msghdr, nfds_t, off_t, pollfd, size_t, ssize_t, timeval};

use crate::abi::{sockaddr, socklen_t, AF_IB};
use crate::errno::{set_errno, Errno};

mod dgram;
mod preload;
mod stream;

/// One rsocket, by type.
#[derive(Clone)]
pub enum Socket {
    /// `SOCK_STREAM`.
    Stream(Arc<stream::StreamSocket>),
    /// `SOCK_DGRAM`.
    Dgram(Arc<dgram::DgramSocket>),
}

/// Every live rsocket, by descriptor.
pub static SOCKETS: Mutex<BTreeMap<c_int, Socket>> = Mutex::new(BTreeMap::new());

fn sockets() -> MutexGuard<'static, BTreeMap<c_int, Socket>> {
    SOCKETS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The rsocket with descriptor `fd`.
fn lookup(fd: c_int) -> Result<Socket, Errno> {
    sockets().get(&fd).cloned().ok_or(libc::EBADF)
}

fn register(socket: Socket) -> c_int {
    let fd = socket.fd();
    sockets().insert(fd, socket);
    fd
}

/// `-1` with `errno`, or the value.
fn ret_int(r: Result<c_int, Errno>) -> c_int {
    r.unwrap_or_else(|e| {
        set_errno(e);
        -1
    })
}

fn ret_unit(r: Result<(), Errno>) -> c_int {
    ret_int(r.map(|()| 0))
}

fn ret_len(r: Result<usize, Errno>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The socket calls, forwarded by type.
impl Socket {
    fn fd(&self) -> c_int {
        match self {
            Socket::Stream(s) => s.fd(),
            Socket::Dgram(d) => d.fd(),
        }
    }

    unsafe fn bind(&self, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.bind(addr, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.bind(addr, len) },
        }
    }

    fn listen(&self, backlog: c_int) -> Result<(), Errno> {
        match self {
            Socket::Stream(s) => s.listen(backlog),
            // As listen(2) on a UDP socket.
            Socket::Dgram(_) => Err(libc::EOPNOTSUPP),
        }
    }

    unsafe fn accept(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Result<Socket, Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.accept(addr, len) }.map(Socket::Stream),
            Socket::Dgram(_) => Err(libc::EOPNOTSUPP),
        }
    }

    unsafe fn connect(&self, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.connect(addr, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.connect(addr, len) },
        }
    }

    fn shutdown(&self, how: c_int) -> Result<(), Errno> {
        match self {
            Socket::Stream(s) => s.shutdown(how),
            // A datagram rsocket has no connection to shut down; nothing changes.
            Socket::Dgram(_) => Ok(()),
        }
    }

    fn close(&self) -> Result<(), Errno> {
        match self {
            Socket::Stream(s) => s.close(),
            Socket::Dgram(d) => d.close(),
        }
    }

    /// `src` receives the peer's address when not NULL.
    unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        flags: c_int,
        src: *mut sockaddr,
        src_len: *mut socklen_t,
    ) -> Result<usize, Errno> {
        match self {
            Socket::Stream(s) => {
                // SAFETY: the caller's guarantee.
                let n = unsafe { s.recv(buf, len, flags) }?;
                if n > 0 && !src.is_null() {
                    // SAFETY: the caller's guarantee.
                    unsafe { s.peer_name(src, src_len) }?;
                }
                Ok(n)
            }
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.recv(buf, len, flags, src, src_len) },
        }
    }

    /// `dst` is where to send (NULL: the connected peer).
    unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        flags: c_int,
        dst: *const sockaddr,
        dst_len: socklen_t,
    ) -> Result<usize, Errno> {
        match self {
            Socket::Stream(s) => {
                if !dst.is_null() || dst_len != 0 {
                    return Err(libc::EISCONN);
                }
                // SAFETY: the caller's guarantee.
                unsafe { s.send(buf, len, flags) }
            }
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.send(buf, len, flags, dst, dst_len) },
        }
    }

    /// Sends the buffers in order (blocking: all of them; non-blocking: up to the first
    /// that did not go whole).
    unsafe fn sendv(&self, iov: *const iovec, iovcnt: c_int, flags: c_int) -> Result<usize, Errno> {
        let iovs = iovecs(iov, iovcnt)?;
        if let Socket::Dgram(d) = self {
            // One datagram of all the buffers, to the connected peer.
            let mut data = Vec::new();
            for v in iovs {
                if !v.iov_base.is_null() && v.iov_len > 0 {
                    // SAFETY: each iovec is readable (caller).
                    data.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
                    });
                }
            }
            return d.send_to(&data, flags, None);
        }
        let mut sent = 0;
        for v in iovs {
            // SAFETY: each iovec is readable (caller).
            let r = unsafe { self.send(v.iov_base.cast(), v.iov_len, flags, core::ptr::null(), 0) };
            match r {
                Ok(n) => {
                    sent += n;
                    if n < v.iov_len {
                        break;
                    }
                }
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    }

    unsafe fn peer_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.peer_name(addr, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.peer_name(addr, len) },
        }
    }

    unsafe fn sock_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.sock_name(addr, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.sock_name(addr, len) },
        }
    }

    unsafe fn set_option(
        &self,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.set_option(level, name, val, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.set_option(level, name, val, len) },
        }
    }

    unsafe fn get_option(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> Result<(), Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.get_option(level, name, val, len) },
            // SAFETY: the caller's guarantee.
            Socket::Dgram(d) => unsafe { d.get_option(level, name, val, len) },
        }
    }

    fn fcntl(&self, cmd: c_int, arg: c_int) -> Result<c_int, Errno> {
        match self {
            Socket::Stream(s) => s.fcntl(cmd, arg),
            Socket::Dgram(d) => d.fcntl(cmd, arg),
        }
    }

    unsafe fn iomap(
        &self,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        offset: off_t,
    ) -> Result<off_t, Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.iomap(buf, len, prot, offset) },
            // Remote I/O maps belong to connections.
            Socket::Dgram(_) => Err(libc::ENOTSUP),
        }
    }

    fn iounmap(&self, buf: *mut c_void, len: usize) -> Result<(), Errno> {
        match self {
            Socket::Stream(s) => s.iounmap(buf, len),
            Socket::Dgram(_) => Err(libc::ENOTSUP),
        }
    }

    unsafe fn iowrite(
        &self,
        buf: *const c_void,
        len: usize,
        offset: off_t,
        flags: c_int,
    ) -> Result<usize, Errno> {
        match self {
            // SAFETY: the caller's guarantee.
            Socket::Stream(s) => unsafe { s.iowrite(buf, len, offset, flags) },
            Socket::Dgram(_) => Err(libc::ENOTSUP),
        }
    }

    /// `rpoll`'s look: the `poll` bits ready among `events` (and POLLHUP/POLLERR); with
    /// `arm`, when none is, the fds to sleep on go to `wait`.
    fn poll(&self, events: i16, arm: bool, wait: &mut Vec<RawFd>) -> Result<i16, Errno> {
        match self {
            Socket::Stream(s) => s.poll(events, arm, wait),
            Socket::Dgram(d) => d.poll(events, arm, wait),
        }
    }
}

/// The caller's iovec array (`EINVAL` for a negative count or NULL array with entries).
fn iovecs<'a>(iov: *const iovec, iovcnt: c_int) -> Result<&'a [iovec], Errno> {
    if iovcnt < 0 || (iov.is_null() && iovcnt > 0) {
        return Err(libc::EINVAL);
    }
    if iovcnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller passes `iovcnt` readable iovecs (checked non-NULL).
    Ok(unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) })
}

/// `rsocket`: `ENOTSUP` for a domain, type or protocol rsockets never support (rdma-core's
/// checks); `ENOSYS` when softverbs' libibverbs.so.1 is not loaded.
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
    let socket = match kind {
        libc::SOCK_STREAM => stream::StreamSocket::new(domain).map(Socket::Stream),
        _ => dgram::DgramSocket::create(domain).map(|d| Socket::Dgram(Arc::new(d))),
    };
    ret_int(socket.map(register))
}

/// `rbind`
///
/// # Safety
/// `addr` is readable for `len` bytes.
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.bind(addr, len) }))
}

/// `rlisten`
pub extern "C" fn rlisten(socket: c_int, backlog: c_int) -> c_int {
    ret_unit(lookup(socket).and_then(|s| s.listen(backlog)))
}

/// `raccept`
///
/// # Safety
/// `addr`/`len` are NULL or writable as for `accept(2)`.
pub unsafe extern "C" fn raccept(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's guarantee.
    ret_int(
        lookup(socket)
            .and_then(|s| unsafe { s.accept(addr, len) })
            .map(register),
    )
}

/// `rconnect`
///
/// # Safety
/// `addr` is readable for `len` bytes.
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.connect(addr, len) }))
}

/// `rshutdown`
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    ret_unit(lookup(socket).and_then(|s| s.shutdown(how)))
}

/// `rclose`: the descriptor goes at once; a connection shuts down and lingers for its last
/// writes first.
pub extern "C" fn rclose(socket: c_int) -> c_int {
    let removed = sockets().remove(&socket);
    ret_unit(removed.ok_or(libc::EBADF).and_then(|s| s.close()))
}

/// `rrecv`
///
/// # Safety
/// `buf` is writable for `len` bytes.
pub unsafe extern "C" fn rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    let r = lookup(socket).and_then(|s| {
        // SAFETY: the caller's guarantee.
        unsafe {
            s.recv(
                buf.cast(),
                len,
                flags,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        }
    });
    ret_len(r)
}

/// `rrecvfrom`
///
/// # Safety
/// `buf` is writable for `len` bytes; `src`/`addrlen` NULL or as for `recvfrom(2)`.
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the caller's guarantee.
    let r = lookup(socket).and_then(|s| unsafe { s.recv(buf.cast(), len, flags, src, addrlen) });
    ret_len(r)
}

/// `rrecvmsg`: ancillary data is refused (`ENOTSUP`, before the descriptor is looked at, as
/// rdma-core does); like rsocket.c only the first buffer is filled.
///
/// # Safety
/// `msg` is NULL or a readable `struct msghdr` whose buffers are writable.
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: NULL or readable (caller).
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return ret_len(Err(libc::EINVAL));
    };
    if !m.msg_control.is_null() && m.msg_controllen != 0 {
        return ret_len(Err(libc::ENOTSUP));
    }
    let r = lookup(socket).and_then(|s| {
        let iovs = iovecs(m.msg_iov, m.msg_iovlen as c_int)?;
        let Some(first) = iovs.first() else {
            return Ok(0);
        };
        // SAFETY: the caller's buffers are writable.
        unsafe {
            s.recv(
                first.iov_base.cast(),
                first.iov_len,
                flags,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        }
    });
    ret_len(r)
}

/// `rsend`
///
/// # Safety
/// `buf` is readable for `len` bytes.
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's guarantee.
    let r = lookup(socket)
        .and_then(|s| unsafe { s.send(buf.cast(), len, flags, core::ptr::null(), 0) });
    ret_len(r)
}

/// `rsendto` (`EISCONN` with an address on a stream rsocket, as rdma-core's).
///
/// # Safety
/// `buf` is readable for `len` bytes; `dst` NULL or readable for `addrlen` bytes.
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dst: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    // SAFETY: the caller's guarantee.
    let r = lookup(socket).and_then(|s| unsafe { s.send(buf.cast(), len, flags, dst, addrlen) });
    ret_len(r)
}

/// `rsendmsg`: ancillary data is refused (`ENOTSUP`, before the descriptor is looked at).
///
/// # Safety
/// `msg` is NULL or a readable `struct msghdr` with readable buffers.
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: NULL or readable (caller).
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return ret_len(Err(libc::EINVAL));
    };
    if !m.msg_control.is_null() && m.msg_controllen != 0 {
        return ret_len(Err(libc::ENOTSUP));
    }
    // SAFETY: the caller's guarantee.
    let r =
        lookup(socket).and_then(|s| unsafe { s.sendv(m.msg_iov, m.msg_iovlen as c_int, flags) });
    ret_len(r)
}

/// `rread`
///
/// # Safety
/// `buf` is writable for `count` bytes.
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's guarantee.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rreadv`: like rsocket.c, fills only the first buffer.
///
/// # Safety
/// `iov` points to `iovcnt` iovecs with writable buffers.
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let r = lookup(socket).and_then(|s| {
        let Some(first) = iovecs(iov, iovcnt)?.first() else {
            return Ok(0);
        };
        // SAFETY: the caller's guarantee.
        unsafe {
            s.recv(
                first.iov_base.cast(),
                first.iov_len,
                0,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        }
    });
    ret_len(r)
}

/// `rwrite`
///
/// # Safety
/// `buf` is readable for `count` bytes.
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: the caller's guarantee.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rwritev`
///
/// # Safety
/// `iov` points to `iovcnt` iovecs with readable buffers.
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    // SAFETY: the caller's guarantee.
    ret_len(lookup(socket).and_then(|s| unsafe { s.sendv(iov, iovcnt, 0) }))
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
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.peer_name(addr, len) }))
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
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.sock_name(addr, len) }))
}

/// `rsetsockopt`
///
/// # Safety
/// `val` is readable for `len` bytes.
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.set_option(level, name, val, len) }))
}

/// `rgetsockopt`
///
/// # Safety
/// `val` is writable for `*len` bytes.
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the caller's guarantee.
    ret_unit(lookup(socket).and_then(|s| unsafe { s.get_option(level, name, val, len) }))
}

/// `rfcntl(socket, cmd, ...)`: `F_GETFL`, `F_SETFL` (its `int` argument), `ENOTSUP` for
/// others. Declared with the variadic argument as a fixed third one: in the C calling
/// conventions of x86_64 (System V) and aarch64 Linux a variadic `int` travels in the same
/// register as a third fixed argument, and it is read only for `F_SETFL`, where the caller
/// passes it.
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_int) -> c_int {
    ret_int(lookup(socket).and_then(|s| s.fcntl(cmd, if cmd == libc::F_SETFL { arg } else { 0 })))
}

/// `riomap`
///
/// # Safety
/// `buf` stays mapped for `len` bytes, left to the peer, until `riounmap` or `rclose`.
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    offset: off_t,
) -> off_t {
    let _ = flags;
    // SAFETY: the caller's guarantee.
    match lookup(socket).and_then(|s| unsafe { s.iomap(buf, len, prot, offset) }) {
        Ok(o) => o,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `riounmap`
pub extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: size_t) -> c_int {
    ret_unit(lookup(socket).and_then(|s| s.iounmap(buf, len)))
}

/// `riowrite`: `(size_t)-1` with `errno` on failure.
///
/// # Safety
/// `buf` is readable for `count` bytes.
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> size_t {
    // SAFETY: the caller's guarantee.
    ret_len(lookup(socket).and_then(|s| unsafe { s.iowrite(buf, count, offset, flags) })) as size_t
}

/// How long `rpoll` spins on the rsockets before it sleeps (rsocket.c's `polling_time`).
const POLL_SPIN: Duration = Duration::from_micros(10);
/// A sleeping `rpoll` looks again at least this often (rsocket.c's `wake_up_interval`).
const WAKE_UP_INTERVAL: Duration = Duration::from_secs(5);

/// One look at every descriptor: rsockets through their type, ordinary fds through
/// `poll` with no wait. With `arm`, `waits` gets what to sleep on (for each entry, its
/// wait fds or, for an ordinary fd, itself). Returns how many entries have revents.
fn poll_once(
    fds: &mut [pollfd],
    socks: &[Option<Socket>],
    arm: bool,
    waits: &mut Vec<pollfd>,
) -> Result<c_int, Errno> {
    let mut count = 0;
    let mut rs_waits = Vec::new();
    for (pfd, sock) in fds.iter_mut().zip(socks) {
        pfd.revents = match sock {
            Some(s) => {
                rs_waits.clear();
                let r = s.poll(pfd.events, arm, &mut rs_waits)?;
                waits.extend(rs_waits.iter().map(|&fd| pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }));
                r
            }
            None => {
                let mut one = pollfd {
                    fd: pfd.fd,
                    events: pfd.events,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; no waiting.
                if unsafe { libc::poll(&mut one, 1, 0) } < 0 {
                    return Err(crate::errno::errno());
                }
                if arm {
                    waits.push(pollfd {
                        fd: pfd.fd,
                        events: pfd.events,
                        revents: 0,
                    });
                }
                one.revents
            }
        };
        if pfd.revents != 0 {
            count += 1;
        }
    }
    Ok(count)
}

/// `rpoll`: `poll` over rsockets and ordinary descriptors together, as rdma-core's (spin
/// briefly, then arm every rsocket and sleep on their wait fds with the ordinary ones).
///
/// # Safety
/// As `poll(2)`: `fds` points to `nfds` entries.
pub unsafe extern "C" fn rpoll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() || nfds == 0 {
        // SAFETY: the caller's guarantee is poll's precondition.
        return unsafe { libc::poll(fds, nfds, timeout) };
    }
    // SAFETY: `nfds` entries (caller).
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
    let socks: Vec<Option<Socket>> = {
        let map = sockets();
        fds.iter().map(|p| map.get(&p.fd).cloned()).collect()
    };
    if socks.iter().all(Option::is_none) {
        // SAFETY: as above.
        return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
    }
    ret_int(poll_loop(fds, &socks, timeout))
}

fn poll_loop(fds: &mut [pollfd], socks: &[Option<Socket>], timeout: c_int) -> Result<c_int, Errno> {
    let start = Instant::now();
    let limit = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    let mut waits = Vec::new();
    loop {
        let n = poll_once(fds, socks, false, &mut waits)?;
        if n > 0 || timeout == 0 {
            return Ok(n);
        }
        if start.elapsed() <= POLL_SPIN {
            std::thread::yield_now();
            continue;
        }
        // The streams' device sockets too: this thread receives what arrives for them.
        // Watched before arming, as a blocking stream read does: arming then leaves the
        // poller hand-off alone, where it used to wake the progress thread once per
        // sleep, only for it to find the socket watched and sleep again.
        let mut devices = Vec::new();
        for s in socks.iter().flatten() {
            if let Socket::Stream(s) = s {
                // Without the watch it sleeps on the completion channels alone.
                let _ = s.watch_device(&mut devices);
            }
        }
        waits.clear();
        let sleep = match poll_once(fds, socks, true, &mut waits) {
            Ok(0) => match limit {
                Some(l) => l
                    .checked_sub(start.elapsed())
                    .filter(|left| !left.is_zero())
                    .map(|left| left.min(WAKE_UP_INTERVAL)),
                None => Some(WAKE_UP_INTERVAL),
            },
            other => {
                stream::unwatch_devices();
                return other;
            }
        };
        let Some(sleep) = sleep else {
            stream::unwatch_devices();
            return Ok(0);
        };
        // Round up: a sleep of less than a millisecond must not become a busy loop.
        let ms = sleep.as_micros().div_ceil(1000) as c_int;
        waits.extend(devices.iter().map(|&fd| pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: `waits` is a valid array of its length.
        let r = unsafe { libc::poll(waits.as_mut_ptr(), waits.len() as nfds_t, ms) };
        stream::unwatch_devices();
        if r < 0 {
            return Err(crate::errno::errno());
        }
    }
}

/// `rselect`: `select` over rsockets and ordinary descriptors, through `rpoll`, as
/// rdma-core's.
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
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: each set is NULL or a valid fd_set (caller).
    let is_set = |set: *mut fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut pfds = Vec::new();
    for fd in 0..nfds {
        let mut events = 0;
        if is_set(readfds, fd) {
            events |= libc::POLLIN;
        }
        if is_set(writefds, fd) {
            events |= libc::POLLOUT;
        }
        if events != 0 || is_set(exceptfds, fd) {
            pfds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    // SAFETY: NULL or readable (caller).
    let ms = match unsafe { timeout.as_ref() } {
        None => -1,
        Some(t) => {
            (t.tv_sec.saturating_mul(1000) + t.tv_usec / 1000).clamp(0, c_int::MAX as i64) as c_int
        }
    };
    // SAFETY: a valid array of its length.
    let n = unsafe { rpoll(pfds.as_mut_ptr(), pfds.len() as nfds_t, ms) };
    if n < 0 {
        return n;
    }
    for set in [readfds, writefds, exceptfds] {
        if !set.is_null() {
            // SAFETY: a valid fd_set (caller).
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &pfds {
        if !readfds.is_null() && p.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
            // SAFETY: a valid fd_set; fd < nfds <= FD_SETSIZE.
            unsafe { libc::FD_SET(p.fd, readfds) };
            count += 1;
        }
        if !writefds.is_null() && p.revents & libc::POLLOUT != 0 {
            // SAFETY: as above.
            unsafe { libc::FD_SET(p.fd, writefds) };
            count += 1;
        }
        if !exceptfds.is_null() && p.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
            // SAFETY: as above.
            unsafe { libc::FD_SET(p.fd, exceptfds) };
            count += 1;
        }
    }
    count
}
