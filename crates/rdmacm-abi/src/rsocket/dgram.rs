//! `SOCK_DGRAM` rsockets, on the wire as rdma-core 44's (`librdmacm/rsocket.c`, `ds_*`):
//! the descriptor is a UDP socket, which also carries a datagram to a peer whose UD QP is
//! not known yet; datagrams to known peers go as UD SENDs from one UD QP per rsocket. The
//! rules are `softverbs_sock::dgram::DgramCore`'s; this file does the I/O (the UDP socket,
//! the QP in `verbs.rs`), the blocking and the C calling conventions.
//!
//! Where rdma-core has no service thread here: the UDP socket is read whenever the
//! rsocket is used (a send, a receive, `rpoll`), and blocking waits watch it beside the
//! CQ's completion channel.
//!
//! Errno as rsocket.c's: `rrecv*` before the socket was bound, connected or sent from:
//! `EINVAL`; nothing to read or no free send slot when non-blocking: `EWOULDBLOCK`;
//! `SOL_RDMA` options once in use: `EINVAL`. Where rsocket.c would crash or overrun (a
//! datagram over 2048 bytes with its header, `rsend` on an unconnected socket, no address)
//! these fail with `EMSGSIZE` and `EDESTADDRREQ`, as a UDP socket does.

mod verbs;

use core::ffi::{c_int, c_void};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};

use libc::{pollfd, sockaddr_in, sockaddr_in6, socklen_t, POLLIN, POLLOUT};
use softverbs_sock::dgram::{
    DgramConfig, DgramCore, LocalQp, Payload, SendError, SendPlan, UdVerdict,
};

use self::verbs::{Completion, UdQp, GRH_LEN};
use crate::abi::{sockaddr, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_RQSIZE, RDMA_SQSIZE, SOL_RDMA};
use crate::errno::{errno, Errno};

/// `RS_QP_MAX_SIZE`
const RS_QP_MAX_SIZE: u32 = 0xFFFE;
/// The largest queue softverbs' device takes (its `max_qp_wr`).
const DEVICE_MAX_QP_WR: u32 = 16384;
/// The longest a blocking call sleeps before it looks again (see `wait`).
const WAIT_SLICE_MS: c_int = 100;
/// UDP datagrams read per pass, so a flood cannot hold a caller forever.
const UDP_BATCH: usize = 64;

/// A datagram rsocket.
pub struct DgramSocket {
    /// The UDP socket: the rsocket's descriptor.
    fd: c_int,
    inner: Mutex<Inner>,
}

/// The UD side, made on first use (rsocket.c makes its QP with the first destination).
struct Endpoint {
    qp: UdQp,
    core: DgramCore,
    completions: Vec<Completion>,
}

struct Inner {
    config: DgramConfig,
    /// `rfcntl` flags (`O_NONBLOCK` counts).
    fd_flags: c_int,
    /// rsocket.c's `ds_init_ep` happened (bind, connect or a send): readable and writable.
    in_use: bool,
    ep: Option<Endpoint>,
    /// The peer `rconnect` named.
    conn: Option<SocketAddr>,
    /// The on/off options rsocket.c records (`SO_REUSEADDR`, `SO_KEEPALIVE`,
    /// `SO_OOBINLINE`, `IPV6_V6ONLY`), as `(level, name)`.
    flags_on: Vec<(c_int, c_int)>,
}

/// Locks, even after a panic elsewhere.
fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DgramSocket {
    /// `rsocket(domain, SOCK_DGRAM, 0)`: a UDP socket of that family.
    pub fn create(domain: c_int) -> Result<DgramSocket, Errno> {
        let fd = raw_socket(domain, libc::SOCK_DGRAM);
        if fd < 0 {
            return Err(errno());
        }
        Ok(DgramSocket {
            fd,
            inner: Mutex::new(Inner {
                config: DgramConfig::default(),
                fd_flags: 0,
                in_use: false,
                ep: None,
                conn: None,
                flags_on: Vec::new(),
            }),
        })
    }

    /// The descriptor.
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// `rbind`
    ///
    /// # Safety
    /// `addr` points to `len` readable bytes.
    pub unsafe fn bind(&self, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
        lock(&self.inner).in_use = true;
        // SAFETY: the caller's guarantee is bind's.
        if unsafe { libc::bind(self.fd, addr.cast(), len) } != 0 {
            return Err(errno());
        }
        Ok(())
    }

    /// `rconnect`: connects the UDP socket and makes the peer the destination of `rsend`.
    ///
    /// # Safety
    /// `addr` points to `len` readable bytes.
    pub unsafe fn connect(&self, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
        // SAFETY: the caller's guarantee.
        let peer = unsafe { read_addr(addr, len) }.ok_or(libc::EINVAL)?;
        let mut g = lock(&self.inner);
        g.in_use = true;
        // SAFETY: the caller's guarantee is connect's.
        if unsafe { libc::connect(self.fd, addr.cast(), len) } != 0 {
            return Err(errno());
        }
        self.dest(&mut g, peer)?;
        g.conn = Some(peer);
        Ok(())
    }

    /// Makes the UD side if it is not there yet.
    fn endpoint<'a>(&self, g: &'a mut Inner) -> Result<&'a mut Endpoint, Errno> {
        if g.ep.is_none() {
            let sizes = g.config.sizes(DEVICE_MAX_QP_WR);
            let qp = UdQp::create(sizes)?;
            let core = DgramCore::new(
                LocalQp {
                    qpn: qp.qpn(),
                    gid: qp.gid(),
                },
                sizes,
            );
            g.ep = Some(Endpoint {
                qp,
                core,
                completions: Vec::new(),
            });
        }
        Ok(g.ep.as_mut().expect("made above"))
    }

    /// Records `peer` as a destination (rsocket.c's `ds_get_dest`).
    fn dest(&self, g: &mut Inner, peer: SocketAddr) -> Result<(), Errno> {
        let ep = self.endpoint(g)?;
        if ep.core.knows(peer) {
            return Ok(());
        }
        let src = source_towards(self.fd, peer)?;
        if !ep.core.add_dest(peer, src) {
            return Err(libc::ENOMEM);
        }
        Ok(())
    }

    /// Reads what waits on the UDP socket and the CQ, without blocking.
    fn progress(&self, g: &mut Inner) {
        self.progress_udp(g);
        self.progress_cq(g);
    }

    /// Handles what waits on the UDP socket (datagrams from peers not yet reached over UD,
    /// their CTRL answers).
    fn progress_udp(&self, g: &mut Inner) {
        if !g.in_use {
            return;
        }
        let mut buf = [0u8; 4096];
        for _ in 0..UDP_BATCH {
            let mut from = SockAddrBuf::new();
            // SAFETY: a buffer and an address buffer of the lengths given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    from.as_mut_ptr(),
                    &mut from.len,
                )
            };
            if n < 0 {
                break;
            }
            let (n, Some(from)) = (n as usize, from.get()) else {
                continue;
            };
            if n > buf.len() {
                continue; // Larger than any rsocket datagram: not one.
            }
            let Ok(ep) = self.endpoint(g) else { break };
            let fd = self.fd;
            let Ok(outcome) = ep.core.handle_udp(from, &buf[..n], |peer| {
                source_towards(fd, peer).unwrap_or(peer)
            }) else {
                continue;
            };
            if let Some(reply) = outcome.reply {
                let _ = send_udp(self.fd, &[&reply[..]], from, libc::MSG_DONTWAIT);
            }
        }
    }

    /// Reaps completions: send slots come back, received datagrams join the queue.
    fn progress_cq(&self, g: &mut Inner) {
        let Some(ep) = g.ep.as_mut() else { return };
        // As rsocket.c: poll only while the queue has room or a send slot is wanted, so
        // receives wait in the CQ rather than being dropped.
        while ep.core.has_room() || !ep.core.can_send() {
            let mut wcs = [verbs::Wc::default(); 16];
            let mut done = std::mem::take(&mut ep.completions);
            done.clear();
            let n = ep.qp.poll(&mut wcs, &mut done);
            for c in done.drain(..) {
                match c {
                    Completion::Send { slot } => ep.core.send_done(slot),
                    Completion::Recv {
                        slot,
                        byte_len: Some(len),
                    } if len as usize >= GRH_LEN => {
                        let payload = ep.qp.recv_payload(slot, len);
                        if ep.core.handle_ud(slot, payload) == UdVerdict::Repost {
                            let _ = ep.qp.post_recv(slot);
                        }
                    }
                    Completion::Recv { slot, .. } => {
                        let _ = ep.qp.post_recv(slot);
                    }
                }
            }
            ep.completions = done;
            if n < wcs.len() {
                break;
            }
        }
    }

    /// Makes progress until `test` holds; blocking unless `nonblock` (then EWOULDBLOCK).
    fn wait<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        nonblock: bool,
        test: fn(&Inner) -> bool,
    ) -> Result<MutexGuard<'a, Inner>, Errno> {
        loop {
            // What is already there needs no system call (rsocket.c polls its CQs only
            // when the test fails, too).
            if test(&g) {
                return Ok(g);
            }
            self.progress(&mut g);
            if test(&g) {
                return Ok(g);
            }
            if nonblock {
                return Err(libc::EWOULDBLOCK);
            }
            // Arm, then look again: a completion between the last poll and the arm raises
            // no event.
            if let Some(ep) = g.ep.as_mut() {
                ep.qp.arm();
            }
            self.progress(&mut g);
            if test(&g) {
                return Ok(g);
            }
            let mut fds = self.wait_fds_locked(&g);
            drop(g);
            // Bounded: another thread (an `rpoll` on the same rsocket) may take the channel
            // event this one sleeps for; looking again every so often loses nothing then.
            // SAFETY: `fds` holds `fds.len()` entries.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, WAIT_SLICE_MS) };
            if r < 0 && errno() == libc::EINTR {
                return Err(libc::EINTR);
            }
            g = lock(&self.inner);
            if let Some(ep) = g.ep.as_mut() {
                ep.qp.drain_events();
            }
        }
    }

    fn wait_fds_locked(&self, g: &Inner) -> Vec<pollfd> {
        let mut fds = vec![pollfd {
            fd: self.fd,
            events: POLLIN,
            revents: 0,
        }];
        if let Some(ep) = &g.ep {
            fds.push(pollfd {
                fd: ep.qp.channel_fd(),
                events: POLLIN,
                revents: 0,
            });
        }
        fds
    }

    fn nonblocking(g: &Inner, flags: c_int) -> bool {
        g.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    /// `rsendto` / `rsend` (`dst` None: the connected peer).
    pub fn send_to(
        &self,
        data: &[u8],
        flags: c_int,
        dst: Option<SocketAddr>,
    ) -> Result<usize, Errno> {
        let mut g = lock(&self.inner);
        g.in_use = true;
        let dst = dst.or(g.conn).ok_or(libc::EDESTADDRREQ)?;
        self.dest(&mut g, dst)?;
        if g.ep.as_ref().is_some_and(|ep| ep.core.route(dst).is_none()) {
            // Perhaps the peer's CTRL has come: then this datagram can go over UD.
            self.progress_udp(&mut g);
        }
        let nonblock = Self::nonblocking(&g, flags);
        loop {
            let ep = g.ep.as_mut().expect("made by dest");
            match ep.core.plan_send(dst, data.len()) {
                Ok(SendPlan::Ud {
                    slot,
                    header,
                    route,
                }) => {
                    let total = header.len() + data.len();
                    let buf = ep.qp.send_slot(slot);
                    buf[..header.len()].copy_from_slice(&header);
                    buf[header.len()..total].copy_from_slice(data);
                    if let Err(e) = ep.qp.post_send(slot, total, route.gid, route.qpn) {
                        ep.core.send_done(slot);
                        return Err(e);
                    }
                    return Ok(data.len());
                }
                Ok(SendPlan::Udp { header }) => {
                    let sent =
                        send_udp(self.fd, &[&header, data], dst, flags & libc::MSG_DONTWAIT)?;
                    return Ok(sent.saturating_sub(header.len()));
                }
                Err(SendError::WouldBlock) => {
                    g = self.wait(g, nonblock, |g| {
                        g.ep.as_ref().is_some_and(|ep| ep.core.can_send())
                    })?;
                }
                Err(SendError::TooLong { .. }) => return Err(libc::EMSGSIZE),
                Err(SendError::UnknownDest) => return Err(libc::EDESTADDRREQ),
            }
        }
    }

    /// `rrecvfrom` / `rrecv`: copies the next datagram (cut to `buf`), returns its length
    /// as copied and its source.
    pub fn recv_from(&self, buf: &mut [u8], flags: c_int) -> Result<(usize, SocketAddr), Errno> {
        let g = lock(&self.inner);
        if !g.in_use {
            return Err(libc::EINVAL);
        }
        let nonblock = Self::nonblocking(&g, flags);
        let mut g = self.wait(g, nonblock, |g| {
            g.ep.as_ref().is_some_and(|ep| ep.core.readable())
        })?;
        let ep = g.ep.as_mut().expect("readable");
        let d = ep.core.peek().expect("readable");
        let src = d.src;
        let n = d.payload.len().min(buf.len());
        match &d.payload {
            Payload::Bytes(b) => buf[..n].copy_from_slice(&b[..n]),
            Payload::Slot { slot, offset, len } => {
                let bytes = ep.qp.recv_payload(*slot, (GRH_LEN + offset + len) as u32);
                buf[..n].copy_from_slice(&bytes[*offset..*offset + n]);
            }
        }
        if flags & libc::MSG_PEEK == 0 {
            if let Some(Payload::Slot { slot, .. }) = ep.core.pop().map(|d| d.payload) {
                let _ = ep.qp.post_recv(slot);
            }
        }
        Ok((n, src))
    }

    /// `rpoll`'s look: what of `events` is ready now (after reading what waits); with
    /// `arm`, when nothing is, the CQ is armed and the descriptors to sleep on (the UDP
    /// socket, the completion channel) go to `wait`.
    pub fn poll(&self, events: i16, arm: bool, wait: &mut Vec<RawFd>) -> Result<i16, Errno> {
        let mut g = lock(&self.inner);
        if let Some(ep) = g.ep.as_mut() {
            ep.qp.drain_events();
        }
        self.progress(&mut g);
        let ready = |g: &Inner| {
            let (readable, writable) = match &g.ep {
                Some(ep) => (ep.core.readable(), ep.core.can_send()),
                None => (false, g.in_use),
            };
            let mut revents = 0;
            if events & POLLIN != 0 && readable {
                revents |= POLLIN;
            }
            if events & POLLOUT != 0 && writable {
                revents |= POLLOUT;
            }
            revents
        };
        let revents = ready(&g);
        if revents != 0 || !arm {
            return Ok(revents);
        }
        if let Some(ep) = g.ep.as_mut() {
            ep.qp.arm();
        }
        // Armed: look once more, as what completed before the arm raises no event.
        self.progress(&mut g);
        let revents = ready(&g);
        if revents == 0 {
            wait.extend(self.wait_fds_locked(&g).iter().map(|p| p.fd));
        }
        Ok(revents)
    }

    /// `rrecv*`: the datagram into `buf` (cut to `len`), its source to `src` when not NULL.
    ///
    /// # Safety
    /// `buf` is writable for `len` bytes; `src`/`src_len` NULL or as for `recvfrom(2)`.
    pub unsafe fn recv(
        &self,
        buf: *mut u8,
        len: usize,
        flags: c_int,
        src: *mut sockaddr,
        src_len: *mut socklen_t,
    ) -> Result<usize, Errno> {
        let out: &mut [u8] = if buf.is_null() || len == 0 {
            &mut []
        } else {
            // SAFETY: the caller's guarantee.
            unsafe { core::slice::from_raw_parts_mut(buf, len) }
        };
        let (n, from) = self.recv_from(out, flags)?;
        if !src.is_null() {
            // SAFETY: the caller's guarantee.
            unsafe { SockAddrBuf::from(from).write_to(src, src_len) };
        }
        Ok(n)
    }

    /// `rsend*`: one datagram to `dst` (NULL: the connected peer).
    ///
    /// # Safety
    /// `buf` is readable for `len` bytes; `dst` NULL or readable for `dst_len` bytes.
    pub unsafe fn send(
        &self,
        buf: *const u8,
        len: usize,
        flags: c_int,
        dst: *const sockaddr,
        dst_len: socklen_t,
    ) -> Result<usize, Errno> {
        let to = if dst.is_null() {
            None
        } else {
            // SAFETY: the caller's guarantee.
            Some(unsafe { read_addr(dst, dst_len) }.ok_or(libc::EINVAL)?)
        };
        let data: &[u8] = if buf.is_null() || len == 0 {
            &[]
        } else {
            // SAFETY: the caller's guarantee.
            unsafe { core::slice::from_raw_parts(buf, len) }
        };
        self.send_to(data, flags, to)
    }

    /// `rgetsockname`: the UDP socket's.
    ///
    /// # Safety
    /// As `getsockname(2)`.
    pub unsafe fn sock_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
        // SAFETY: the caller's guarantee is getsockname's.
        match unsafe { libc::getsockname(self.fd, addr.cast(), len) } {
            0 => Ok(()),
            _ => Err(errno()),
        }
    }

    /// `rgetpeername`: the UDP socket's (`ENOTCONN` unless connected).
    ///
    /// # Safety
    /// As `getpeername(2)`.
    pub unsafe fn peer_name(&self, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
        // SAFETY: the caller's guarantee is getpeername's.
        match unsafe { libc::getpeername(self.fd, addr.cast(), len) } {
            0 => Ok(()),
            _ => Err(errno()),
        }
    }

    /// `rfcntl`: `F_GETFL`, `F_SETFL`; others `ENOTSUP`.
    pub fn fcntl(&self, cmd: c_int, arg: c_int) -> Result<c_int, Errno> {
        match cmd {
            libc::F_GETFL => Ok(lock(&self.inner).fd_flags),
            libc::F_SETFL => {
                lock(&self.inner).fd_flags = arg;
                Ok(0)
            }
            _ => Err(libc::ENOTSUP),
        }
    }

    /// `rsetsockopt`: options of other levels go to the UDP socket first (as rsocket.c,
    /// whose error wins); then what rsocket.c knows: `SO_RCVBUF`/`SO_SNDBUF` size the
    /// rsocket's buffers (twice the value) until its QP exists, `SO_REUSEADDR`,
    /// `SO_KEEPALIVE`, `SO_OOBINLINE`, `IPV6_V6ONLY` are recorded, `SO_LINGER` accepted,
    /// `SOL_RDMA` sizes taken before first use; anything else `ENOTSUP` (the UDP socket
    /// has it set all the same, as with rsocket.c).
    ///
    /// # Safety
    /// `val` points to `len` readable bytes.
    pub unsafe fn set_option(
        &self,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> Result<(), Errno> {
        let mut g = lock(&self.inner);
        if level != SOL_RDMA {
            // SAFETY: the caller's guarantee is setsockopt's.
            if unsafe { libc::setsockopt(self.fd, level, name, val, len) } != 0 {
                return Err(errno());
            }
        }
        let value = || -> Result<u32, Errno> {
            if val.is_null() || (len as usize) < 4 {
                return Err(libc::EINVAL);
            }
            // SAFETY: non-NULL with at least 4 readable bytes (the caller's guarantee).
            Ok(unsafe { val.cast::<u32>().read_unaligned() })
        };
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                let v = value()?;
                if g.ep.is_none() {
                    g.config.rbuf_size = v.saturating_mul(2);
                }
                Ok(())
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                let v = value()?;
                if g.ep.is_none() {
                    g.config.sbuf_size = v.saturating_mul(2).max(2 * 2048);
                }
                Ok(())
            }
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE)
            | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                let on = value()? != 0;
                g.flags_on.retain(|&f| f != (level, name));
                if on {
                    g.flags_on.push((level, name));
                }
                Ok(())
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => Ok(()),
            (SOL_RDMA, _) if g.in_use => Err(libc::EINVAL),
            (SOL_RDMA, RDMA_SQSIZE) => {
                g.config.sq_size = value()?.min(RS_QP_MAX_SIZE);
                Ok(())
            }
            (SOL_RDMA, RDMA_RQSIZE) => {
                g.config.rq_size = value()?.min(RS_QP_MAX_SIZE);
                Ok(())
            }
            (SOL_RDMA, RDMA_INLINE) => value().map(|_| ()),
            _ => Err(libc::ENOTSUP),
        }
    }

    /// `rgetsockopt` of what a datagram rsocket has, as an `int`: buffer and queue sizes,
    /// `SO_ERROR` (always 0: nothing fails asynchronously); others `ENOTSUP`.
    ///
    /// # Safety
    /// `val` is writable for `*len` bytes; `len` readable and writable.
    pub unsafe fn get_option(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> Result<(), Errno> {
        let v = self.int_option(level, name)?;
        // SAFETY: NULL or readable (caller).
        if val.is_null() || len.is_null() || (unsafe { *len } as usize) < size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: room for an int (checked).
        unsafe {
            val.cast::<c_int>().write_unaligned(v);
            *len = size_of::<c_int>() as socklen_t;
        }
        Ok(())
    }

    fn int_option(&self, level: c_int, name: c_int) -> Result<c_int, Errno> {
        let g = lock(&self.inner);
        let sizes = g.ep.as_ref().map(|ep| ep.core.sizes());
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.config.rbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.config.sbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_ERROR) => 0,
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE)
            | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                c_int::from(g.flags_on.contains(&(level, name)))
            }
            (SOL_RDMA, RDMA_SQSIZE) => sizes.map_or(g.config.sq_size, |s| s.sq_size) as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => sizes.map_or(g.config.rq_size, |s| s.rq_size) as c_int,
            (SOL_RDMA, RDMA_INLINE) => 0,
            (SOL_RDMA, RDMA_IOMAPSIZE) => 0,
            _ => return Err(libc::ENOTSUP),
        })
    }

    /// `rclose`: waits for the sends in flight (rsocket.c's `ds_shutdown`), then frees the
    /// QP and closes the UDP socket.
    pub fn close(&self) -> Result<(), Errno> {
        let g = lock(&self.inner);
        let mut g = self
            .wait(g, false, |g| {
                g.ep.as_ref().is_none_or(|ep| ep.core.all_sends_done())
            })
            .unwrap_or_else(|_| lock(&self.inner));
        g.ep = None;
        // SAFETY: the descriptor this socket owns, closed once (the socket is out of the
        // registry and this is its last use).
        unsafe { libc::close(self.fd) };
        Ok(())
    }
}

/// The local address this socket sends to `peer` from (rsocket.c's `ds_get_src_addr`):
/// its bound address, or for a wildcard or loopback one the address the kernel's route to
/// `peer` picks, with the socket's port. An unbound socket is bound to an ephemeral port
/// first, so the port peers see in UD headers is the one their UDP replies reach.
fn source_towards(fd: c_int, peer: SocketAddr) -> Result<SocketAddr, Errno> {
    let mut local = local_addr(fd)?;
    if local.port() == 0 {
        let any = match local {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let a = SockAddrBuf::from(any);
        // SAFETY: an address buffer of its length.
        if unsafe { libc::bind(fd, a.as_ptr(), a.len) } != 0 {
            return Err(errno());
        }
        local = local_addr(fd)?;
    }
    if !(local.ip().is_unspecified() || local.ip().is_loopback()) {
        return Ok(local);
    }
    let family = if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let probe = raw_socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC);
    if probe < 0 {
        return Err(errno());
    }
    let p = SockAddrBuf::from(peer);
    // SAFETY: an address buffer of its length.
    let r = if unsafe { libc::connect(probe, p.as_ptr(), p.len) } == 0 {
        local_addr(probe)
    } else {
        Err(errno())
    };
    // SAFETY: the probe socket made above, closed once.
    unsafe { libc::close(probe) };
    let mut src = r?;
    src.set_port(local.port());
    Ok(src)
}

/// `socket(2)` by system call, not through the C library's `socket`: under rdma-core's
/// librspreload, `socket` is the preload's and would make the socket an rsocket (which is
/// what called us). The preload's other functions pass descriptors it did not hand out to
/// the C library, so they need no such care.
fn raw_socket(domain: c_int, kind: c_int) -> c_int {
    // SAFETY: socket(2) takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_socket, domain, kind, 0) };
    if fd < 0 {
        -1
    } else {
        fd as c_int
    }
}

/// `getsockname`
fn local_addr(fd: c_int) -> Result<SocketAddr, Errno> {
    let mut a = SockAddrBuf::new();
    // SAFETY: an address buffer of its length.
    if unsafe { libc::getsockname(fd, a.as_mut_ptr(), &mut a.len) } != 0 {
        return Err(errno());
    }
    a.get().ok_or(libc::EAFNOSUPPORT)
}

/// Sends the concatenation of `parts` to `dst` on the UDP socket; returns bytes sent.
fn send_udp(fd: c_int, parts: &[&[u8]], dst: SocketAddr, flags: c_int) -> Result<usize, Errno> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        })
        .collect();
    let mut name = SockAddrBuf::from(dst);
    // SAFETY: an all-zero msghdr is valid; the fields set point to live locals.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_name = name.as_mut_ptr().cast();
    msg.msg_namelen = name.len;
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    // SAFETY: as above.
    let n = unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// A `sockaddr_storage` and its length.
pub struct SockAddrBuf {
    storage: libc::sockaddr_storage,
    /// Its length.
    pub len: socklen_t,
}

impl SockAddrBuf {
    fn new() -> SockAddrBuf {
        SockAddrBuf {
            // SAFETY: all-zero is a valid sockaddr_storage.
            storage: unsafe { core::mem::zeroed() },
            len: size_of::<libc::sockaddr_storage>() as socklen_t,
        }
    }

    fn as_ptr(&self) -> *const libc::sockaddr {
        (&self.storage as *const libc::sockaddr_storage).cast()
    }

    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (&mut self.storage as *mut libc::sockaddr_storage).cast()
    }

    /// The address held, if it is IPv4 or IPv6.
    fn get(&self) -> Option<SocketAddr> {
        // SAFETY: the storage is valid for its whole size.
        unsafe { read_addr(self.as_ptr().cast(), self.len) }
    }

    /// The C form of `a`.
    pub fn from(a: SocketAddr) -> SockAddrBuf {
        let mut b = SockAddrBuf::new();
        match a {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
                let sin = unsafe { &mut *b.as_mut_ptr().cast::<sockaddr_in>() };
                sin.sin_family = libc::AF_INET as _;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
                b.len = size_of::<sockaddr_in>() as socklen_t;
            }
            SocketAddr::V6(v6) => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &mut *b.as_mut_ptr().cast::<sockaddr_in6>() };
                sin6.sin6_family = libc::AF_INET6 as _;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_flowinfo = v6.flowinfo().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_scope_id = v6.scope_id();
                b.len = size_of::<sockaddr_in6>() as socklen_t;
            }
        }
        b
    }

    /// Writes the address to a caller's `(addr, *addrlen)` as `recvfrom` does: cut to the
    /// room given, `*addrlen` set to what was copied (rsocket.c's `ds_set_src`).
    ///
    /// # Safety
    /// `addrlen` is NULL or readable and writable; `addr` has `*addrlen` writable bytes.
    pub unsafe fn write_to(&self, addr: *mut sockaddr, addrlen: *mut socklen_t) {
        if addrlen.is_null() {
            return;
        }
        // SAFETY: the caller's guarantee.
        let room = unsafe { *addrlen };
        let n = room.min(self.len);
        if !addr.is_null() && n > 0 {
            // SAFETY: `n` bytes fit in both.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.as_ptr().cast::<u8>(),
                    addr.cast::<u8>(),
                    n as usize,
                )
            };
        }
        // SAFETY: the caller's guarantee.
        unsafe { *addrlen = n };
    }
}

/// Reads an IPv4 or IPv6 socket address.
///
/// # Safety
/// `addr` is NULL or points to `len` readable bytes.
pub unsafe fn read_addr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family is readable (checked).
    let family = unsafe { addr.cast::<libc::sa_family_t>().read_unaligned() } as c_int;
    match family {
        libc::AF_INET if len as usize >= size_of::<sockaddr_in>() => {
            // SAFETY: `len` covers a sockaddr_in.
            let sin = unsafe { addr.cast::<sockaddr_in>().read_unaligned() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<sockaddr_in6>() => {
            // SAFETY: `len` covers a sockaddr_in6.
            let sin6 = unsafe { addr.cast::<sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_and_refuse_what_they_cannot_read() {
        for a in ["10.1.2.3:7174", "[fe80::1]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            let b = SockAddrBuf::from(a);
            // SAFETY: the buffer's own storage, of its length.
            assert_eq!(unsafe { read_addr(b.as_ptr().cast(), b.len) }, Some(a));
            // Too short for its family, or NULL: nothing.
            // SAFETY: as above, a shorter length.
            assert_eq!(unsafe { read_addr(b.as_ptr().cast(), b.len - 1) }, None);
        }
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_addr(core::ptr::null(), 16) }, None);
        let unix = [1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        // SAFETY: 16 readable bytes.
        assert_eq!(unsafe { read_addr(unix.as_ptr().cast(), 16) }, None);
    }

    /// As recvfrom(2): the address is cut to the room given, and the length says what was
    /// copied (rsocket.c's `ds_set_src`).
    #[test]
    fn a_source_address_is_cut_to_the_room_given() {
        let b = SockAddrBuf::from("10.1.2.3:7174".parse().unwrap());
        let mut out = [0xeeu8; 32];
        let mut len: socklen_t = 4;
        // SAFETY: 32 writable bytes, `len` readable and writable.
        unsafe { b.write_to(out.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len, 4);
        assert_eq!(&out[..4], &[libc::AF_INET as u8, 0, 0x1c, 0x06]);
        assert_eq!(out[4], 0xee);
        let mut len: socklen_t = 32;
        // SAFETY: as above.
        unsafe { b.write_to(out.as_mut_ptr().cast(), &mut len) };
        assert_eq!(len as usize, size_of::<sockaddr_in>());
        assert_eq!(&out[4..8], &[10, 1, 2, 3]);
        // A NULL length writes nothing.
        // SAFETY: NULL is allowed.
        unsafe { b.write_to(out.as_mut_ptr().cast(), core::ptr::null_mut()) };
    }
}
