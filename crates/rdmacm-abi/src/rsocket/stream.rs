//! `SOCK_STREAM` rsockets: the C-facing half (descriptor, phase, options, `errno`).
//!
//! The connections themselves are `softverbs::sock` streams inside softverbs'
//! `libibverbs.so.1`, reached through the private table ([`StreamOps`], `CmOps::stream`):
//! the protocol core, its driver loop and the device all live there already, tested by
//! the Rust API's tests, and one implementation serves both. This side keeps what rsocket.c
//! keeps per descriptor (its state, `fd_flags`, socket options, `SO_ERROR`) and answers
//! with rsocket.c's errno values.
//!
//! A non-blocking `rconnect` returns `EINPROGRESS` and connects on a thread of its own; the
//! descriptor (an eventfd) turns readable when it is done, which is what `rpoll` waits on
//! meanwhile, and the result is picked up by the next call (`SO_ERROR` on failure).

use core::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use libc::{sockaddr_storage, socklen_t};
use softverbs_private_abi::{
    SockHandle, StreamOps, StreamSettings, IO_BLOCK, IO_PEEK, READY_ERR, READY_HUP, READY_IN,
    READY_OUT,
};

use crate::abi::{sockaddr, AF_IB};
use crate::errno::Errno;
use crate::ibverbs::cm_ops;

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
pub const SOL_RDMA: c_int = 0x10000;
pub const RDMA_SQSIZE: c_int = 0;
pub const RDMA_RQSIZE: c_int = 1;
pub const RDMA_INLINE: c_int = 2;
pub const RDMA_IOMAPSIZE: c_int = 3;
pub const RDMA_ROUTE: c_int = 4;

/// rsocket.c's defaults (`rs_configure` without files in /etc/rdma/rsocket), but for the
/// rings: softverbs' own 4 MiB (`softverbs_sock::DEFAULT_RING` says why a larger ring
/// pays) where rsocket.c has 128 KiB.
const DEFAULT_QUEUE: u32 = 384;
const DEFAULT_INLINE: u32 = 64;
const DEFAULT_MEM: u32 = softverbs_sock::DEFAULT_RING;
/// The send ring's low-water mark (`RS_SNDLOWAT`).
const SNDLOWAT: u32 = 2048;
/// The largest queue rsocket.c allows (`RS_QP_MAX_SIZE`).
const QP_MAX: u32 = 0xFFFE;

fn ops() -> Result<&'static StreamOps, Errno> {
    let ops = cm_ops()?.stream;
    // A table from an older build lacks the later entries (`bind` and after).
    if (ops.size as usize) < size_of::<StreamOps>() {
        return Err(libc::ENOSYS);
    }
    Ok(ops)
}

/// Ends the watches this thread began with [`StreamSocket::watch_device`].
pub fn unwatch_devices() {
    if let Ok(ops) = ops() {
        // SAFETY: a table call without arguments.
        unsafe { (ops.unwatch)() };
    }
}

/// A connect running on its own thread (non-blocking `rconnect`).
struct Pending {
    /// The outcome once known; `abandoned` once the rsocket was closed meanwhile.
    outcome: Mutex<(Option<Result<SockHandle, Errno>>, bool)>,
}

enum Phase {
    /// Created (`rs_init`) or bound (`rs_bound`: its address held from `rbind` on, as
    /// rsocket.c's `rdma_bind_addr`).
    Init,
    Bound(SockHandle),
    Listening(SockHandle),
    Connecting(Arc<Pending>),
    Connected(SockHandle),
    /// A connect failed (`rs_connect_error`).
    ConnectError,
    Closed,
}

/// Socket options as rsocket.c keeps them.
struct Options {
    settings: StreamSettings,
    fd_flags: c_int,
    reuse_addr: bool,
    keepalive: bool,
    /// `TCP_KEEPIDLE` seconds (0: not read yet).
    keepalive_time: u32,
    /// rsocket.c keeps SO_LINGER inverted: on unless turned off.
    linger_off: bool,
    oob_inline: bool,
    nodelay: bool,
    v6only: bool,
}

struct State {
    phase: Phase,
    opts: Options,
    /// `SO_ERROR`: the last connect failure, cleared when read.
    err: c_int,
}

/// One stream rsocket. Its descriptor is an eventfd it owns.
pub struct StreamSocket {
    fd: OwnedFd,
    /// Whether the descriptor was signalled and not reset since.
    signalled: Arc<AtomicBool>,
    domain: c_int,
    state: Mutex<State>,
}

/// The outcome of an operation: a value, or an errno for -1.
pub type Res<T> = Result<T, Errno>;

fn neg(r: c_int) -> Res<()> {
    if r < 0 {
        Err(-r)
    } else {
        Ok(())
    }
}

fn neg_count(r: isize) -> Res<usize> {
    if r < 0 {
        Err(-r as Errno)
    } else {
        Ok(r as usize)
    }
}

/// `rs_value_to_scale` then `rs_scale_to_value` with 8 bits: what an iomap size becomes
/// once encoded in the connection data.
fn iomap_size_scaled(v: c_int) -> u32 {
    let v = v.max(0) as u32;
    let scale = if v <= 1 << 7 {
        v as u8
    } else {
        0x80 | (v >> 8) as u8
    };
    if scale & 0x80 != 0 {
        u32::from(scale & 0x7F) << 8
    } else {
        u32::from(scale)
    }
}

/// `/proc/sys/net/ipv4/tcp_keepalive_time`, else 7200 s, as rsocket.c starts keep-alives.
fn system_keepalive_time() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(7200)
}

/// Copies `src` to the caller's address buffer as rsocket.c's `rs_copy_addr` does: at most
/// `*len` bytes; `*len` becomes the address's full size.
///
/// # Safety
/// `addr` is writable for `*len` bytes; `len` is writable.
unsafe fn copy_addr(src: &sockaddr_storage, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let size = if c_int::from(src.ss_family) == libc::AF_INET {
        size_of::<libc::sockaddr_in>()
    } else {
        size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: readable (caller).
    let room = unsafe { *len } as usize;
    // SAFETY: `addr` has room for `room` bytes (caller); `src` holds `size`.
    unsafe {
        core::ptr::copy_nonoverlapping(
            (src as *const sockaddr_storage).cast::<u8>(),
            addr.cast::<u8>(),
            room.min(size),
        );
        *len = size as socklen_t;
    }
}

/// Reads an `int` option value (`EINVAL` when it is not one).
///
/// # Safety
/// `val` is readable for `len` bytes.
unsafe fn int_val(val: *const c_void, len: socklen_t) -> Res<c_int> {
    if val.is_null() || (len as usize) < size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: readable for an int (checked length, caller).
    Ok(unsafe { core::ptr::read_unaligned(val.cast::<c_int>()) })
}

/// Connects from the bound socket `bound` (rbind's address is the source) or from none.
///
/// # Safety
/// `dst` holds a socket address of `len` bytes; `handle` is writable.
unsafe fn connect_from(
    ops: &StreamOps,
    bound: Option<SockHandle>,
    dst: &sockaddr_storage,
    len: socklen_t,
    settings: &StreamSettings,
    handle: &mut SockHandle,
) -> c_int {
    let dst = (dst as *const sockaddr_storage).cast();
    // SAFETY: table calls with valid pointers (caller).
    unsafe {
        match bound {
            Some(b) => (ops.connect_bound)(b, dst, len, settings, handle),
            None => (ops.connect)(dst, len, settings, handle),
        }
    }
}

/// Makes the eventfd `fd` readable and remembers it in `signalled`.
fn signal_fd(fd: RawFd, signalled: &AtomicBool) {
    signalled.store(true, Ordering::Release);
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an eventfd the caller keeps open.
    let _ = unsafe { libc::write(fd, (&raw const one).cast(), 8) };
}

impl StreamSocket {
    /// A new unconnected rsocket of `domain` (`rsocket`). `ENOSYS` (said once on stderr)
    /// when the loaded libibverbs.so.1 is not softverbs'.
    pub fn new(domain: c_int) -> Res<Arc<StreamSocket>> {
        ops()?;
        StreamSocket::with_phase(domain, Phase::Init)
    }

    fn with_phase(domain: c_int, phase: Phase) -> Res<Arc<StreamSocket>> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(crate::errno::errno());
        }
        Ok(Arc::new(StreamSocket {
            // SAFETY: a fresh descriptor this socket owns from now on.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            signalled: Arc::new(AtomicBool::new(false)),
            domain,
            state: Mutex::new(State {
                phase,
                opts: Options {
                    settings: StreamSettings {
                        sq_size: DEFAULT_QUEUE,
                        rq_size: DEFAULT_QUEUE,
                        inline_size: DEFAULT_INLINE,
                        iomap_size: 0,
                        sbuf_size: DEFAULT_MEM,
                        rbuf_size: DEFAULT_MEM,
                    },
                    fd_flags: libc::O_RDWR,
                    reuse_addr: false,
                    keepalive: false,
                    keepalive_time: 0,
                    linger_off: false,
                    oob_inline: false,
                    nodelay: false,
                    v6only: false,
                },
                err: 0,
            }),
        }))
    }

    /// The descriptor applications know it by.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, with a finished background connect taken in.
    fn settled(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        let Phase::Connecting(pending) = &st.phase else {
            self.drain_signal();
            return st;
        };
        let outcome = pending
            .outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .take();
        match outcome {
            None => {}
            Some(Ok(handle)) => {
                st.phase = Phase::Connected(handle);
                self.start_keepalive(&mut st);
            }
            Some(Err(e)) => {
                st.phase = Phase::ConnectError;
                st.err = e;
            }
        }
        st
    }

    /// Wakes whoever sleeps on the descriptor (`rpoll` on a connecting socket): it stays
    /// readable until the connect's outcome has been taken.
    fn signal(&self) {
        signal_fd(self.fd(), &self.signalled);
    }

    /// Resets the descriptor's wake-up once the connect is over (so a plain `poll` on the
    /// descriptor does not see it readable for ever).
    fn drain_signal(&self) {
        if self.signalled.swap(false, Ordering::AcqRel) {
            let mut count: u64 = 0;
            // SAFETY: reads 8 bytes into a local from our own non-blocking eventfd.
            let _ = unsafe { libc::read(self.fd(), (&raw mut count).cast(), 8) };
        }
    }

    fn start_keepalive(&self, st: &mut State) {
        if let (Phase::Connected(h), true) = (&st.phase, st.opts.keepalive) {
            if st.opts.keepalive_time == 0 {
                st.opts.keepalive_time = system_keepalive_time();
            }
            if let Ok(ops) = ops() {
                // SAFETY: a table call with a handle it gave out.
                let _ = unsafe { (ops.set_keepalive)(*h, st.opts.keepalive_time) };
            }
        }
    }

    /// The connection, or the errno a data call gets without one: `EAGAIN` while a
    /// non-blocking connect runs (rsocket.c turns its `EINPROGRESS` into that), `ENOTCONN`
    /// otherwise.
    fn connection(&self) -> Res<(SockHandle, bool)> {
        let st = self.settled();
        let nonblocking = st.opts.fd_flags & libc::O_NONBLOCK != 0;
        match st.phase {
            Phase::Connected(h) => Ok((h, nonblocking)),
            Phase::Connecting(_) => Err(libc::EAGAIN),
            _ => Err(libc::ENOTCONN),
        }
    }

    /// `rbind`: binds at once (rsocket.c's `rdma_bind_addr`), with `SO_REUSEADDR` and
    /// `IPV6_V6ONLY` as set so far, so a taken address fails here with `EADDRINUSE`.
    ///
    /// # Safety
    /// `addr` is readable for `len` bytes.
    pub unsafe fn bind(&self, addr: *const sockaddr, len: socklen_t) -> Res<()> {
        if addr.is_null() || (len as usize) < size_of::<libc::sa_family_t>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the family is readable (caller, checked length).
        let family = c_int::from(unsafe { (*addr).sa_family });
        let need = match family {
            libc::AF_INET => size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
            AF_IB => return Err(libc::EAFNOSUPPORT),
            _ => return Err(libc::EAFNOSUPPORT),
        };
        if (len as usize) < need {
            return Err(libc::EINVAL);
        }
        let ops = ops()?;
        let mut st = self.lock();
        if !matches!(st.phase, Phase::Init) {
            return Err(libc::EINVAL);
        }
        let mut handle = 0;
        // SAFETY: a table call; `need` bytes of `addr` are readable (checked, caller).
        neg(unsafe {
            (ops.bind)(
                addr,
                need as socklen_t,
                u8::from(st.opts.reuse_addr),
                u8::from(st.opts.v6only),
                &mut handle,
            )
        })?;
        st.phase = Phase::Bound(handle);
        Ok(())
    }

    /// `rlisten`.
    pub fn listen(&self, backlog: c_int) -> Res<()> {
        let ops = ops()?;
        let mut st = self.lock();
        let bound = match &st.phase {
            Phase::Listening(_) => return Ok(()),
            Phase::Bound(h) => *h,
            Phase::Init => {
                // Unbound: any address of the socket's family, an ephemeral port.
                // SAFETY: all-zero is a valid sockaddr_storage.
                let mut a: sockaddr_storage = unsafe { core::mem::zeroed() };
                a.ss_family = if self.domain == libc::AF_INET {
                    libc::AF_INET as libc::sa_family_t
                } else {
                    libc::AF_INET6 as libc::sa_family_t
                };
                let mut handle = 0;
                // SAFETY: a table call with a valid address and out pointer.
                neg(unsafe {
                    (ops.bind)(
                        (&raw const a).cast(),
                        size_of::<sockaddr_storage>() as socklen_t,
                        u8::from(st.opts.reuse_addr),
                        u8::from(st.opts.v6only),
                        &mut handle,
                    )
                })?;
                st.phase = Phase::Bound(handle);
                handle
            }
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: a table call with a handle it gave out.
        neg(unsafe { (ops.listen_bound)(bound, backlog) })?;
        st.phase = Phase::Listening(bound);
        Ok(())
    }

    /// `raccept`: the new connection's socket, and its peer's address in `addr`.
    ///
    /// # Safety
    /// `addr`/`len` are NULL or writable as for `accept(2)`.
    pub unsafe fn accept(
        &self,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> Res<Arc<StreamSocket>> {
        let ops = ops()?;
        let (listener, settings, block, opts) = {
            let st = self.lock();
            let Phase::Listening(h) = st.phase else {
                return Err(libc::EBADF);
            };
            let block = st.opts.fd_flags & libc::O_NONBLOCK == 0;
            (
                h,
                st.opts.settings,
                block,
                Options {
                    ..st.opts.clone_plain()
                },
            )
        };
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut peer: sockaddr_storage = unsafe { core::mem::zeroed() };
        let mut handle = 0;
        // SAFETY: a table call with valid pointers.
        neg(unsafe { (ops.accept)(listener, &settings, u8::from(block), &mut peer, &mut handle) })?;
        let sock = match StreamSocket::with_phase(self.domain, Phase::Connected(handle)) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: a table call with the handle it just gave out.
                let _ = unsafe { (ops.close)(handle) };
                return Err(e);
            }
        };
        {
            // The new socket inherits the listener's options, as rs_alloc copies them.
            let mut st = sock.lock();
            st.opts = opts;
            st.opts.fd_flags = libc::O_RDWR;
            sock.start_keepalive(&mut st);
        }
        // SAFETY: as the caller's guarantee.
        unsafe { copy_addr(&peer, addr, len) };
        Ok(sock)
    }

    /// `rconnect`: blocking, or `EINPROGRESS` with `O_NONBLOCK` (the outcome then comes
    /// through `rpoll` and `SO_ERROR`).
    ///
    /// # Safety
    /// `addr` is readable for `len` bytes.
    pub unsafe fn connect(&self, addr: *const sockaddr, len: socklen_t) -> Res<()> {
        let ops = ops()?;
        let mut st = self.settled();
        let bound = match st.phase {
            Phase::Init => None,
            Phase::Bound(h) => Some(h),
            Phase::Connected(_) => return Ok(()),
            Phase::Connecting(_) => return Err(libc::EINPROGRESS),
            Phase::ConnectError | Phase::Closed => return Err(libc::ENOTCONN),
            Phase::Listening(_) => return Err(libc::EINVAL),
        };
        if addr.is_null() || (len as usize) > size_of::<sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut dst: sockaddr_storage = unsafe { core::mem::zeroed() };
        // SAFETY: `len` bytes are readable (caller) and fit (checked).
        unsafe {
            core::ptr::copy_nonoverlapping(
                addr.cast::<u8>(),
                (&raw mut dst).cast::<u8>(),
                len as usize,
            )
        };
        let settings = st.opts.settings;
        if st.opts.fd_flags & libc::O_NONBLOCK == 0 {
            // Blocking: connect on this thread, without the state lock (rpoll and other
            // threads may look at the socket meanwhile).
            st.phase = Phase::Connecting(Arc::new(Pending {
                outcome: Mutex::new((None, false)),
            }));
            drop(st);
            let mut handle = 0;
            // SAFETY: a table call with valid pointers.
            let r = neg(unsafe { connect_from(ops, bound, &dst, len, &settings, &mut handle) });
            let mut st = self.lock();
            // Pollers of the connecting socket look again.
            self.signal();
            if matches!(st.phase, Phase::Closed) {
                if r.is_ok() {
                    // SAFETY: the handle it just gave out.
                    let _ = unsafe { (ops.close)(handle) };
                }
                return Err(libc::EBADF);
            }
            return match r {
                Ok(()) => {
                    st.phase = Phase::Connected(handle);
                    self.start_keepalive(&mut st);
                    Ok(())
                }
                Err(e) => {
                    st.phase = Phase::ConnectError;
                    st.err = e;
                    Err(e)
                }
            };
        }
        let pending = Arc::new(Pending {
            outcome: Mutex::new((None, false)),
        });
        let theirs = Arc::clone(&pending);
        let signalled = Arc::clone(&self.signalled);
        let signal = self.fd();
        // The thread signals the descriptor; it must stay open until then, so the thread
        // holds a duplicate of it.
        // SAFETY: plain syscall on our own descriptor.
        let dup = unsafe { libc::fcntl(signal, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(crate::errno::errno());
        }
        // SAFETY: a fresh descriptor the thread owns.
        let dup = unsafe { OwnedFd::from_raw_fd(dup) };
        let spawned = std::thread::Builder::new()
            .name("rsocket-connect".into())
            .spawn(move || {
                let mut handle = 0;
                // SAFETY: a table call with valid pointers (`dst` moved into the thread).
                let r = neg(unsafe { connect_from(ops, bound, &dst, len, &settings, &mut handle) });
                let mut outcome = theirs.outcome.lock().unwrap_or_else(|e| e.into_inner());
                if outcome.1 {
                    // Closed meanwhile: nobody will take the connection.
                    if r.is_ok() {
                        // SAFETY: the handle it just gave out.
                        let _ = unsafe { (ops.close)(handle) };
                    }
                    return;
                }
                outcome.0 = Some(r.map(|()| handle));
                // Signalled before the outcome can be taken (under its lock), so the reset
                // that follows the taking finds it.
                signal_fd(dup.as_raw_fd(), &signalled);
                drop(outcome);
            });
        if spawned.is_err() {
            return Err(libc::ENOMEM);
        }
        st.phase = Phase::Connecting(pending);
        Err(libc::EINPROGRESS)
    }

    /// `rshutdown`.
    pub fn shutdown(&self, how: c_int) -> Res<()> {
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(libc::EINVAL);
        }
        let Phase::Connected(h) = self.settled().phase else {
            // rsocket.c shuts down only a connected rsocket; otherwise nothing happens.
            return Ok(());
        };
        // SAFETY: a table call with a handle it gave out.
        neg(unsafe { (ops()?.shutdown)(h, how) })
    }

    /// `rclose`: the connection shuts down (its last writes linger) and goes.
    pub fn close(&self) -> Res<()> {
        let phase = std::mem::replace(&mut self.lock().phase, Phase::Closed);
        let handle = match phase {
            Phase::Bound(h) | Phase::Listening(h) | Phase::Connected(h) => h,
            Phase::Connecting(pending) => {
                let mut outcome = pending.outcome.lock().unwrap_or_else(|e| e.into_inner());
                outcome.1 = true;
                match outcome.0.take() {
                    Some(Ok(h)) => h,
                    _ => return Ok(()),
                }
            }
            _ => return Ok(()),
        };
        // SAFETY: a table call with a handle it gave out.
        neg(unsafe { (ops()?.close)(handle) })
    }

    /// `rrecv` and friends: `flags` as recv(2)'s (`MSG_DONTWAIT`, `MSG_PEEK`,
    /// `MSG_WAITALL`). 0 at end of stream.
    ///
    /// # Safety
    /// `buf` is writable for `len` bytes.
    pub unsafe fn recv(&self, buf: *mut u8, len: usize, flags: c_int) -> Res<usize> {
        let (h, nonblocking) = self.connection()?;
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        let ops = ops()?;
        let nonblocking = nonblocking || flags & libc::MSG_DONTWAIT != 0;
        let mut io = if nonblocking { 0 } else { IO_BLOCK };
        if flags & libc::MSG_PEEK != 0 {
            io |= IO_PEEK;
        }
        let mut got = 0;
        loop {
            // SAFETY: the rest of the caller's buffer.
            let r = neg_count(unsafe { (ops.recv)(h, buf.add(got), len - got, io) });
            match r {
                Ok(0) => return Ok(got),
                Ok(n) => got += n,
                Err(e) if got == 0 => return Err(e),
                Err(_) => return Ok(got),
            }
            if got == len || flags & libc::MSG_WAITALL == 0 || io & IO_PEEK != 0 {
                return Ok(got);
            }
        }
    }

    /// `rsend` and friends: everything when blocking; what fits at once (at least one
    /// byte, else `EAGAIN`) when not.
    ///
    /// # Safety
    /// `buf` is readable for `len` bytes.
    pub unsafe fn send(&self, buf: *const u8, len: usize, flags: c_int) -> Res<usize> {
        let (h, nonblocking) = self.connection()?;
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        let ops = ops()?;
        let nonblocking = nonblocking || flags & libc::MSG_DONTWAIT != 0;
        let mut sent = 0;
        while sent < len {
            // SAFETY: the rest of the caller's buffer.
            let r = neg_count(unsafe {
                (ops.send)(h, buf.add(sent), len - sent, u8::from(!nonblocking))
            });
            match r {
                Ok(n) => sent += n,
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
            if nonblocking {
                break;
            }
        }
        Ok(sent)
    }

    /// `rgetpeername` (an unconnected rsocket has a zero address, as rdma-core's).
    ///
    /// # Safety
    /// As `getpeername(2)`.
    pub unsafe fn peer_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Res<()> {
        let (_, peer) = self.addrs()?;
        // SAFETY: the caller's guarantee.
        unsafe { copy_addr(&peer, addr, len) };
        Ok(())
    }

    /// `rgetsockname`.
    ///
    /// # Safety
    /// As `getsockname(2)`.
    pub unsafe fn sock_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Res<()> {
        let (local, _) = self.addrs()?;
        // SAFETY: the caller's guarantee.
        unsafe { copy_addr(&local, addr, len) };
        Ok(())
    }

    fn addrs(&self) -> Res<(sockaddr_storage, sockaddr_storage)> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let zero: sockaddr_storage = unsafe { core::mem::zeroed() };
        let (mut local, mut peer) = (zero, zero);
        local.ss_family = self.domain as libc::sa_family_t;
        let st = self.settled();
        match &st.phase {
            Phase::Bound(h) | Phase::Listening(h) | Phase::Connected(h) => {
                let h = *h;
                drop(st);
                // SAFETY: a table call with valid out pointers.
                neg(unsafe { (ops()?.addrs)(h, &mut local, &mut peer) })?;
            }
            _ => {}
        }
        Ok((local, peer))
    }

    /// `rsetsockopt`.
    ///
    /// # Safety
    /// `val` is readable for `len` bytes.
    pub unsafe fn set_option(
        &self,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> Res<()> {
        // SAFETY: the caller's guarantee.
        let int = || unsafe { int_val(val, len) };
        let mut st = self.settled();
        let opening = matches!(
            st.phase,
            Phase::Connecting(_) | Phase::Connected(_) | Phase::ConnectError | Phase::Closed
        );
        let unconnected = matches!(
            st.phase,
            Phase::Init | Phase::Bound(..) | Phase::Listening(_)
        );
        match (level, name) {
            // rsocket.c passes it to rdma_set_option(RDMA_OPTION_ID_REUSEADDR) and ignores a
            // refusal once the id is past rs_init on an IB-transport device (RoCE is one):
            // it takes effect at rbind (or rlisten's implicit bind).
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => st.opts.reuse_addr = int()? != 0,
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                let v = int()? as u32;
                if unconnected {
                    st.opts.settings.rbuf_size = v << 1;
                }
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                let v = int()? as u32;
                if unconnected {
                    st.opts.settings.sbuf_size = v << 1;
                }
                if st.opts.settings.sbuf_size < SNDLOWAT {
                    st.opts.settings.sbuf_size = SNDLOWAT << 1;
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if val.is_null() || (len as usize) < size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: readable for a struct linger (checked, caller).
                let l = unsafe { core::ptr::read_unaligned(val.cast::<libc::linger>()) };
                st.opts.linger_off = l.l_onoff == 0;
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
                let on = int()? != 0;
                if on != st.opts.keepalive {
                    st.opts.keepalive = on;
                    if let Phase::Connected(h) = st.phase {
                        if on {
                            self.start_keepalive(&mut st);
                        } else {
                            // SAFETY: a table call with a handle it gave out.
                            neg(unsafe { (ops()?.set_keepalive)(h, 0) })?;
                        }
                    }
                }
            }
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => st.opts.oob_inline = int()? != 0,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => {}
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                let v = int()?;
                if v <= 0 {
                    return Err(libc::EINVAL);
                }
                st.opts.keepalive_time = v as u32;
                if st.opts.keepalive {
                    self.start_keepalive(&mut st);
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.opts.nodelay = int()? != 0,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {}
            // rsocket.c: rdma_set_option(RDMA_OPTION_ID_AFONLY), taking effect at the bind;
            // the kernel refuses it (EINVAL) once the id listens or connects, and this
            // connection manager already once it is bound (unless unchanged).
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                let on = int()? != 0;
                match st.phase {
                    Phase::Init => st.opts.v6only = on,
                    Phase::Bound(_) if on == st.opts.v6only => {}
                    _ => return Err(libc::EINVAL),
                }
            }
            (SOL_RDMA, _) if opening => return Err(libc::EINVAL),
            (SOL_RDMA, RDMA_SQSIZE) => st.opts.settings.sq_size = (int()? as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_RQSIZE) => st.opts.settings.rq_size = (int()? as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_INLINE) => st.opts.settings.inline_size = (int()? as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_IOMAPSIZE) => st.opts.settings.iomap_size = iomap_size_scaled(int()?),
            // A path record for the connect (from rdma_getaddrinfo's ai_route): softverbs
            // resolves RoCE routes itself and cannot take one (rdma_set_option's
            // RDMA_OPTION_IB_PATH is refused likewise).
            (SOL_RDMA, RDMA_ROUTE) => return Err(libc::ENOTSUP),
            _ => return Err(libc::ENOTSUP),
        }
        Ok(())
    }

    /// `rgetsockopt`.
    ///
    /// # Safety
    /// `val` is writable for `*len` bytes; `len` is readable and writable.
    pub unsafe fn get_option(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> Res<()> {
        if val.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: readable (caller).
        let room = unsafe { *len } as usize;
        let put_int = |v: c_int, set_len: bool| -> Res<()> {
            if room < size_of::<c_int>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: room for an int (checked, caller).
            unsafe {
                core::ptr::write_unaligned(val.cast::<c_int>(), v);
                if set_len {
                    *len = size_of::<c_int>() as socklen_t;
                }
            }
            Ok(())
        };
        let mut st = self.settled();
        let s = st.opts.settings;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
                put_int(c_int::from(st.opts.reuse_addr), true)
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => put_int(c_int::from(st.opts.keepalive), true),
            (libc::SOL_SOCKET, libc::SO_OOBINLINE) => {
                put_int(c_int::from(st.opts.oob_inline), true)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => put_int(s.rbuf_size as c_int, true),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => put_int(s.sbuf_size as c_int, true),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if room < size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                let l = libc::linger {
                    l_onoff: c_int::from(!st.opts.linger_off),
                    l_linger: 0,
                };
                // SAFETY: room for a struct linger (checked, caller).
                unsafe {
                    core::ptr::write_unaligned(val.cast::<libc::linger>(), l);
                    *len = size_of::<libc::linger>() as socklen_t;
                }
                Ok(())
            }
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                put_int(st.err, true)?;
                st.err = 0;
                Ok(())
            }
            // rsocket.c stores 1 and leaves the length alone for these two.
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => put_int(1, false),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                put_int(st.opts.keepalive_time as c_int, true)
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => put_int(c_int::from(st.opts.nodelay), true),
            // rsocket.c's answer without a path record (the path's MTU is not kept here).
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => put_int(2048, true),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => put_int(c_int::from(st.opts.v6only), true),
            (SOL_RDMA, RDMA_SQSIZE) => put_int(s.sq_size as c_int, true),
            (SOL_RDMA, RDMA_RQSIZE) => put_int(s.rq_size as c_int, true),
            (SOL_RDMA, RDMA_INLINE) => put_int(s.inline_size as c_int, true),
            (SOL_RDMA, RDMA_IOMAPSIZE) => put_int(s.iomap_size as c_int, true),
            _ => Err(libc::ENOTSUP),
        }
    }

    /// `rfcntl` (`F_GETFL`, `F_SETFL`; `ENOTSUP` for others).
    pub fn fcntl(&self, cmd: c_int, arg: c_int) -> Res<c_int> {
        let mut st = self.lock();
        match cmd {
            libc::F_GETFL => Ok(st.opts.fd_flags),
            libc::F_SETFL => {
                st.opts.fd_flags = arg;
                Ok(0)
            }
            _ => Err(libc::ENOTSUP),
        }
    }

    /// `riomap`.
    ///
    /// # Safety
    /// riomap's contract: `buf` stays mapped for `len` bytes, left to the peer, until
    /// `riounmap` or `rclose`.
    pub unsafe fn iomap(
        &self,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        offset: libc::off_t,
    ) -> Res<libc::off_t> {
        let Phase::Connected(h) = self.settled().phase else {
            // rsocket.c: no protection domain yet.
            return Err(libc::EINVAL);
        };
        if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
            return Err(libc::EINVAL);
        }
        if buf.is_null() || len == 0 {
            // ibv_reg_mr's answer for no memory.
            return Err(libc::EINVAL);
        }
        let mut out = 0i64;
        let writable = u8::from(prot & libc::PROT_WRITE != 0);
        // SAFETY: a table call; the buffer's contract is the caller's.
        neg(unsafe { (ops()?.iomap)(h, buf.cast(), len, writable, offset, &mut out) })?;
        Ok(out)
    }

    /// `riounmap`.
    pub fn iounmap(&self, buf: *mut c_void, len: usize) -> Res<()> {
        let Phase::Connected(h) = self.settled().phase else {
            return Err(libc::EINVAL);
        };
        // SAFETY: a table call; the buffer is only compared.
        neg(unsafe { (ops()?.iounmap)(h, buf.cast(), len) })
    }

    /// `riowrite`: everything (until the peer's mapping ends) when blocking; what fits at
    /// once when not.
    ///
    /// # Safety
    /// `buf` is readable for `len` bytes.
    pub unsafe fn iowrite(
        &self,
        buf: *const c_void,
        len: usize,
        offset: libc::off_t,
        flags: c_int,
    ) -> Res<usize> {
        let (h, nonblocking) = self.connection()?;
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        let ops = ops()?;
        let nonblocking = nonblocking || flags & libc::MSG_DONTWAIT != 0;
        let buf = buf.cast::<u8>();
        let mut sent = 0;
        while sent < len {
            // SAFETY: the rest of the caller's buffer.
            let r = neg_count(unsafe {
                (ops.iowrite)(
                    h,
                    buf.add(sent),
                    len - sent,
                    (offset as u64).wrapping_add(sent as u64),
                    u8::from(!nonblocking),
                )
            });
            match r {
                Ok(0) => break,
                Ok(n) => sent += n,
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
            if nonblocking {
                break;
            }
        }
        Ok(sent)
    }

    /// Before `rpoll` arms and sleeps: the connection's device socket is watched by this
    /// thread too (its fd goes to `wait` unless there already) until [`unwatch_devices`], so a
    /// message wakes this thread alone rather than the device's progress thread, which
    /// would then wake it through the completion channel.
    pub fn watch_device(&self, wait: &mut Vec<RawFd>) -> Res<()> {
        let Phase::Connected(h) = self.settled().phase else {
            return Ok(());
        };
        let ops = ops()?;
        let mut fd = -1;
        // SAFETY: a table call with a valid out pointer.
        neg(unsafe { (ops.watch)(h, &mut fd) })?;
        if fd >= 0 && !wait.contains(&fd) {
            wait.push(fd);
        }
        Ok(())
    }

    /// `rpoll`'s look at this rsocket: the `poll` bits of `events` it is ready for (plus
    /// `POLLHUP`/`POLLERR`). With `arm`, when it is ready for none, the fds that turn
    /// readable when that may change go to `wait`; an armed look comes after
    /// [`Self::watch_device`] (its arming counts on the watch, when there is one).
    pub fn poll(&self, events: i16, arm: bool, wait: &mut Vec<RawFd>) -> Res<i16> {
        let st = self.settled();
        let handle = match &st.phase {
            Phase::Connected(h) | Phase::Listening(h) => *h,
            Phase::Connecting(_) => {
                if arm {
                    wait.push(self.fd());
                }
                return Ok(0);
            }
            Phase::ConnectError => {
                return Ok((events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR);
            }
            Phase::Init | Phase::Bound(..) | Phase::Closed => return Ok(0),
        };
        drop(st);
        let ops = ops()?;
        let mut want = 0;
        if events & libc::POLLIN != 0 {
            want |= READY_IN;
        }
        if events & libc::POLLOUT != 0 {
            want |= READY_OUT;
        }
        let (mut ready, mut fds, mut nfds) = (0u32, [0 as c_int; 2], 0u32);
        // SAFETY: table calls with valid out pointers (room for 2 fds).
        neg(unsafe {
            if arm {
                // `rpoll` watched the devices first (`watch_device`): arming then leaves
                // the progress thread asleep.
                (ops.readiness_watched)(handle, want, &mut ready, fds.as_mut_ptr(), &mut nfds)
            } else {
                (ops.readiness)(handle, want, 0, &mut ready, fds.as_mut_ptr(), &mut nfds)
            }
        })?;
        wait.extend_from_slice(&fds[..(nfds as usize).min(2)]);
        let mut revents = 0;
        if ready & want & READY_IN != 0 {
            revents |= libc::POLLIN;
        }
        if ready & want & READY_OUT != 0 {
            revents |= libc::POLLOUT;
        }
        if ready & READY_HUP != 0 {
            revents |= libc::POLLHUP;
        }
        if ready & READY_ERR != 0 {
            revents |= libc::POLLERR;
        }
        Ok(revents)
    }
}

impl Options {
    /// A copy for an accepted socket.
    fn clone_plain(&self) -> Options {
        Options {
            settings: self.settings,
            fd_flags: self.fd_flags,
            reuse_addr: self.reuse_addr,
            keepalive: self.keepalive,
            keepalive_time: self.keepalive_time,
            linger_off: self.linger_off,
            oob_inline: self.oob_inline,
            nodelay: self.nodelay,
            v6only: self.v6only,
        }
    }
}
