//! Stream rsockets for softverbs' `librdmacm.so.1`: the [`StreamOps`] table of the private
//! interface (`CmOps::stream`), on `softverbs::sock`'s [`RdmaListener`] and [`RdmaStream`].
//!
//! librdmacm keeps what is C-facing (descriptors, options, `errno`, `rpoll`); the
//! connections themselves live here, on the device every context of this library shares,
//! driven by the same tested stream code as the Rust API. Errors become negative errno
//! values here, as rsocket.c reports them.

use core::ffi::c_int;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softverbs::sock::{
    BindOptions, RdmaListener, RdmaSocket, RdmaStream, StreamConfig, StreamOptions,
};
use softverbs_private_abi::{
    SockHandle, StreamOps, StreamSettings, IO_BLOCK, IO_PEEK, READY_ERR, READY_HUP, READY_IN,
    READY_OUT,
};

use crate::private_cm::{manager, socket_addr, storage};

enum Sock {
    /// Bound by `rbind`, until it listens or connects (`None` once taken).
    Bound(Mutex<Option<RdmaSocket>>),
    Listener(RdmaListener),
    Stream(Arc<RdmaStream>),
}

/// Live sockets by handle (handles are never reused).
static SOCKS: Mutex<BTreeMap<SockHandle, Arc<Sock>>> = Mutex::new(BTreeMap::new());
static NEXT: AtomicU64 = AtomicU64::new(1);

fn socks() -> std::sync::MutexGuard<'static, BTreeMap<SockHandle, Arc<Sock>>> {
    SOCKS.lock().unwrap_or_else(|e| e.into_inner())
}

fn insert(sock: Sock) -> SockHandle {
    let handle = NEXT.fetch_add(1, Ordering::Relaxed);
    socks().insert(handle, Arc::new(sock));
    handle
}

fn lookup(handle: SockHandle) -> Result<Arc<Sock>, c_int> {
    socks().get(&handle).cloned().ok_or(libc::EBADF)
}

fn stream(handle: SockHandle) -> Result<Arc<RdmaStream>, c_int> {
    match &*lookup(handle)? {
        Sock::Stream(st) => Ok(st.clone()),
        Sock::Listener(_) | Sock::Bound(_) => Err(libc::ENOTCONN),
    }
}

/// Takes the bound socket behind `handle` (`EINVAL` when it is not one).
fn take_bound(handle: SockHandle) -> Result<RdmaSocket, c_int> {
    match &*lookup(handle)? {
        Sock::Bound(b) => b
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(libc::EINVAL),
        _ => Err(libc::EINVAL),
    }
}

/// The errno rsocket.c reports for what a stream call failed with.
fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock => libc::EAGAIN,
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::TimedOut => libc::ETIMEDOUT,
        // rsocket.c: a write on a stream no longer writable is ECONNRESET, whatever ended it.
        K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted => libc::ECONNRESET,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput | K::InvalidData => libc::EINVAL,
        K::OutOfMemory => libc::ENOMEM,
        K::Unsupported => libc::ENOTSUP,
        K::NotConnected => libc::ENOTCONN,
        _ => libc::EIO,
    }
}

fn status(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => -e,
    }
}

fn count(r: Result<usize, c_int>) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => -(e as isize),
    }
}

/// rsocket.c's defaults with what `settings` changes.
///
/// # Safety
/// `settings` is NULL or readable.
unsafe fn options(settings: *const StreamSettings) -> StreamOptions {
    let mut opts = StreamOptions::default();
    // SAFETY: NULL or readable (caller).
    let Some(s) = (unsafe { settings.as_ref() }) else {
        return opts;
    };
    let c: &mut StreamConfig = &mut opts.config;
    let queue = |v: u32, d: u16| if v == 0 { d } else { v.min(0xFFFE) as u16 };
    c.sq_size = queue(s.sq_size, c.sq_size);
    c.rq_size = queue(s.rq_size, c.rq_size);
    if s.inline_size != 0 {
        c.inline_size = s.inline_size.min(0xFFFE);
    }
    c.iomap_size = s.iomap_size.min(u32::from(u16::MAX)) as u16;
    if s.sbuf_size != 0 {
        c.sbuf_size = s.sbuf_size;
    }
    if s.rbuf_size != 0 {
        // An even ring: the peer is granted half at a time.
        c.rbuf_size = s.rbuf_size.max(2) & !1;
    }
    opts
}

unsafe extern "C" fn listen(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    _backlog: c_int,
    out: *mut SockHandle,
) -> c_int {
    status((|| {
        // SAFETY: readable for `len` bytes (caller).
        let addr = unsafe { socket_addr(addr, len) }?;
        let cm = manager()?;
        let listener = RdmaListener::bind_with(cm.context(), addr, StreamOptions::default())
            .map_err(|e| errno_of(&e))?;
        let handle = insert(Sock::Listener(listener));
        // SAFETY: writable (caller).
        unsafe { out.write(handle) };
        Ok(())
    })())
}

unsafe extern "C" fn accept(
    listener: SockHandle,
    settings: *const StreamSettings,
    block: u8,
    peer: *mut libc::sockaddr_storage,
    out: *mut SockHandle,
) -> c_int {
    status((|| {
        let sock = lookup(listener)?;
        let Sock::Listener(l) = &*sock else {
            return Err(libc::EINVAL);
        };
        // SAFETY: NULL or readable (caller).
        let opts = unsafe { options(settings) };
        let (stream, addr) = l.accept_mode(&opts, block == 0).map_err(|e| errno_of(&e))?;
        let handle = insert(Sock::Stream(Arc::new(stream)));
        // SAFETY: writable (caller).
        unsafe {
            peer.write(storage(Some(addr)));
            out.write(handle);
        }
        Ok(())
    })())
}

unsafe extern "C" fn connect(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    settings: *const StreamSettings,
    out: *mut SockHandle,
) -> c_int {
    status((|| {
        // SAFETY: readable for `len` bytes (caller).
        let addr = unsafe { socket_addr(addr, len) }?;
        // SAFETY: NULL or readable (caller).
        let opts = unsafe { options(settings) };
        let cm = manager()?;
        let stream =
            RdmaStream::connect_with(cm.context(), addr, &opts).map_err(|e| errno_of(&e))?;
        let handle = insert(Sock::Stream(Arc::new(stream)));
        // SAFETY: writable (caller).
        unsafe { out.write(handle) };
        Ok(())
    })())
}

unsafe extern "C" fn close(sock: SockHandle) -> c_int {
    // Dropping a stream shuts it down and lingers for its last writes (outside the lock).
    let removed = socks().remove(&sock);
    match removed {
        Some(_) => 0,
        None => -libc::EBADF,
    }
}

unsafe extern "C" fn recv(sock: SockHandle, buf: *mut u8, len: usize, flags: u32) -> isize {
    count((|| {
        let st = stream(sock)?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `buf` is writable for `len` bytes (caller, from the application's
        // rrecv), and only this call looks at it meanwhile.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        match st.recv_with(buf, flags & IO_BLOCK == 0, flags & IO_PEEK != 0) {
            Ok(n) => Ok(n),
            // rsocket.c: a stream that ended reads as end of stream once its data is read.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(0),
            Err(e) => Err(errno_of(&e)),
        }
    })())
}

unsafe extern "C" fn send(sock: SockHandle, buf: *const u8, len: usize, block: u8) -> isize {
    count((|| {
        let st = stream(sock)?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: readable for `len` bytes (caller).
        let buf = unsafe { std::slice::from_raw_parts(buf, len) };
        st.send_with(buf, block == 0).map_err(|e| errno_of(&e))
    })())
}

unsafe extern "C" fn shutdown(sock: SockHandle, how: c_int) -> c_int {
    status((|| {
        let st = stream(sock)?;
        let how = match how {
            libc::SHUT_RD => std::net::Shutdown::Read,
            libc::SHUT_WR => std::net::Shutdown::Write,
            libc::SHUT_RDWR => std::net::Shutdown::Both,
            _ => return Err(libc::EINVAL),
        };
        match st.shutdown(how) {
            Ok(()) => Ok(()),
            // Nothing left to shut down, or the last sends did not finish in the linger
            // time: rsocket.c's rshutdown reports neither.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(errno_of(&e)),
        }
    })())
}

unsafe extern "C" fn readiness(
    sock: SockHandle,
    want: u32,
    arm: u8,
    ready: *mut u32,
    wait_fds: *mut c_int,
    nfds: *mut u32,
) -> c_int {
    // SAFETY: the caller's pointers, as `readiness_of` needs them.
    unsafe {
        readiness_of(
            sock,
            want,
            (arm != 0).then_some(false),
            ready,
            wait_fds,
            nfds,
        )
    }
}

unsafe extern "C" fn readiness_watched(
    sock: SockHandle,
    want: u32,
    ready: *mut u32,
    wait_fds: *mut c_int,
    nfds: *mut u32,
) -> c_int {
    // SAFETY: the caller's pointers, as `readiness_of` needs them.
    unsafe { readiness_of(sock, want, Some(true), ready, wait_fds, nfds) }
}

/// `readiness` (`armed`: `None`) and its armed forms (`Some(watched)`: after this
/// thread's `watch`es when `watched`).
///
/// # Safety
/// `ready` and `nfds` writable, `wait_fds` room for 2 fds.
unsafe fn readiness_of(
    sock: SockHandle,
    want: u32,
    armed: Option<bool>,
    ready: *mut u32,
    wait_fds: *mut c_int,
    nfds: *mut u32,
) -> c_int {
    let arm = u8::from(armed.is_some());
    status((|| {
        let s = lookup(sock)?;
        let (bits, fds): (u32, Vec<c_int>) = match &*s {
            // Neither listening nor connected: ready for nothing, and nothing will change.
            Sock::Bound(_) => (0, Vec::new()),
            Sock::Listener(l) => {
                // The listening id's event channel is readable exactly while an event (a
                // connection request) waits.
                let mut pfd = libc::pollfd {
                    fd: l.wait_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; no waiting.
                let n = unsafe { libc::poll(&mut pfd, 1, 0) };
                let bits = if n > 0 && pfd.revents & libc::POLLIN != 0 {
                    READY_IN
                } else {
                    0
                };
                (bits, vec![l.wait_fd()])
            }
            Sock::Stream(st) => {
                let r = match armed {
                    Some(true) => WATCHES.with(|w| st.readiness_watched(&w.borrow())),
                    Some(false) => st.readiness(true),
                    None => st.readiness(false),
                }
                .map_err(|e| errno_of(&e))?;
                let mut bits = 0;
                bits |= if r.readable { READY_IN } else { 0 };
                bits |= if r.writable { READY_OUT } else { 0 };
                bits |= if r.hangup { READY_HUP } else { 0 };
                bits |= if r.error { READY_ERR } else { 0 };
                (bits, st.wait_fds().to_vec())
            }
        };
        // SAFETY: writable (caller).
        unsafe { ready.write(bits) };
        let n = if arm != 0 && bits & (want | READY_HUP | READY_ERR) == 0 {
            for (i, fd) in fds.iter().enumerate() {
                // SAFETY: room for 2 fds (caller); there are at most 2.
                unsafe { wait_fds.add(i).write(*fd) };
            }
            fds.len() as u32
        } else {
            0
        };
        // SAFETY: writable (caller).
        unsafe { nfds.write(n) };
        Ok(())
    })())
}

unsafe extern "C" fn addrs(
    sock: SockHandle,
    local: *mut libc::sockaddr_storage,
    peer: *mut libc::sockaddr_storage,
) -> c_int {
    status((|| {
        let s = lookup(sock)?;
        let (l, p) = match &*s {
            Sock::Listener(l) => (l.local_addr(), None),
            Sock::Bound(b) => (
                b.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .and_then(RdmaSocket::local_addr),
                None,
            ),
            Sock::Stream(st) => (st.local_addr(), st.peer_addr()),
        };
        // SAFETY: writable (caller).
        unsafe {
            local.write(storage(l));
            peer.write(storage(p));
        }
        Ok(())
    })())
}

unsafe extern "C" fn set_keepalive(sock: SockHandle, seconds: u32) -> c_int {
    status((|| {
        let st = stream(sock)?;
        st.set_keepalive((seconds > 0).then(|| Duration::from_secs(u64::from(seconds))));
        Ok(())
    })())
}

unsafe extern "C" fn iomap(
    sock: SockHandle,
    buf: *mut u8,
    len: usize,
    writable: u8,
    offset: i64,
    out: *mut i64,
) -> c_int {
    status((|| {
        let st = stream(sock)?;
        let at = (offset != -1).then_some(offset as u64);
        // SAFETY: riomap's contract: the application keeps the buffer mapped and leaves
        // it to the peer until riounmap or rclose (which drops the stream and the region).
        let got = unsafe { st.iomap_raw(buf, len, writable != 0, at) }.map_err(|e| errno_of(&e))?;
        // SAFETY: writable (caller).
        unsafe { out.write(got as i64) };
        Ok(())
    })())
}

unsafe extern "C" fn iounmap(sock: SockHandle, buf: *mut u8, len: usize) -> c_int {
    status((|| {
        let st = stream(sock)?;
        st.iounmap(buf, len).map_err(|e| errno_of(&e))
    })())
}

unsafe extern "C" fn iowrite(
    sock: SockHandle,
    buf: *const u8,
    len: usize,
    offset: u64,
    block: u8,
) -> isize {
    count((|| {
        let st = stream(sock)?;
        if len == 0 {
            return Ok(0);
        }
        if buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: readable for `len` bytes (caller).
        let buf = unsafe { std::slice::from_raw_parts(buf, len) };
        st.iowrite_with(buf, offset, block == 0)
            .map_err(|e| errno_of(&e))
    })())
}

unsafe extern "C" fn bind(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    reuse_addr: u8,
    v6only: u8,
    out: *mut SockHandle,
) -> c_int {
    status((|| {
        // SAFETY: readable for `len` bytes (caller).
        let addr = unsafe { socket_addr(addr, len) }?;
        let cm = manager()?;
        let opts = BindOptions {
            reuse_addr: reuse_addr != 0,
            v6only: v6only != 0,
        };
        let sock = RdmaSocket::bind_with(cm.context(), addr, opts).map_err(|e| errno_of(&e))?;
        let handle = insert(Sock::Bound(Mutex::new(Some(sock))));
        // SAFETY: writable (caller).
        unsafe { out.write(handle) };
        Ok(())
    })())
}

unsafe extern "C" fn listen_bound(sock: SockHandle, backlog: c_int) -> c_int {
    status((|| {
        let bound = take_bound(sock)?;
        match bound.listen(backlog, StreamOptions::default()) {
            Ok(l) => {
                socks().insert(sock, Arc::new(Sock::Listener(l)));
                Ok(())
            }
            Err((e, bound)) => {
                socks().insert(sock, Arc::new(Sock::Bound(Mutex::new(Some(bound)))));
                Err(errno_of(&e))
            }
        }
    })())
}

unsafe extern "C" fn connect_bound(
    sock: SockHandle,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    settings: *const StreamSettings,
    out: *mut SockHandle,
) -> c_int {
    status((|| {
        let bound = take_bound(sock);
        socks().remove(&sock);
        let bound = bound?;
        // SAFETY: readable for `len` bytes (caller).
        let addr = unsafe { socket_addr(addr, len) }?;
        // SAFETY: NULL or readable (caller).
        let opts = unsafe { options(settings) };
        let stream = bound.connect(addr, &opts).map_err(|e| errno_of(&e))?;
        let handle = insert(Sock::Stream(Arc::new(stream)));
        // SAFETY: writable (caller).
        unsafe { out.write(handle) };
        Ok(())
    })())
}

thread_local! {
    /// The device sockets this thread watches (`watch` ... `unwatch`): held apart from
    /// the sockets, so closing one meanwhile cannot leave a watch behind.
    static WATCHES: std::cell::RefCell<Vec<softverbs::sock::DeviceWatch>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

unsafe extern "C" fn watch(sock: SockHandle, fd: *mut c_int) -> c_int {
    status((|| {
        let s = lookup(sock)?;
        let w = match &*s {
            Sock::Stream(st) => st.watch_device(),
            _ => None,
        };
        // SAFETY: writable (caller).
        unsafe { fd.write(w.as_ref().map_or(-1, |w| w.fd())) };
        if let Some(w) = w {
            WATCHES.with(|v| v.borrow_mut().push(w));
        }
        Ok(())
    })())
}

unsafe extern "C" fn unwatch() -> c_int {
    WATCHES.with(|v| v.borrow_mut().clear());
    0
}

/// The table `CmOps::stream` points to.
pub static STREAM_OPS: StreamOps = StreamOps {
    size: size_of::<StreamOps>() as u32,
    listen,
    accept,
    connect,
    close,
    recv,
    send,
    shutdown,
    readiness,
    addrs,
    set_keepalive,
    iomap,
    iounmap,
    iowrite,
    bind,
    listen_bound,
    connect_bound,
    watch,
    unwatch,
    readiness_watched,
};
