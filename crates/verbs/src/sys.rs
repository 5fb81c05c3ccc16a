//! Thin wrappers over the Linux socket calls std does not offer: batched
//! send/receive (sendmmsg/recvmmsg), DF on unconnected sends, eventfd and poll.

use softverbs_engine::Transmit;
use std::io;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// How many datagrams one sendmmsg/recvmmsg call moves at most.
pub const BATCH: usize = 32;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Sets DF (path MTU discovery "do") so Linux sends IPv4 datagrams of an
/// unconnected socket with IP ID 0, which the ICRC covers (see DESIGN.md).
pub fn set_dont_fragment(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    let val: libc::c_int = libc::IP_PMTUDISC_DO;
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER)
    };
    // SAFETY: `val` is a live c_int and its size is passed; the fd is open.
    cvt(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Sets SO_RCVBUF/SO_SNDBUF (best effort: the kernel caps them).
pub fn set_buffers(sock: &UdpSocket, bytes: usize) {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for name in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: as above; failure is ignored on purpose (a smaller buffer works).
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// The receive buffer the kernel granted (SO_RCVBUF: twice the bytes of data it
/// holds, the rest being its bookkeeping); 0 if it cannot be read.
pub fn receive_buffer(sock: &UdpSocket) -> usize {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `val` and `len` are live and sized for the option.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 {
        usize::try_from(val).unwrap_or(0)
    } else {
        0
    }
}

pub(crate) fn to_storage(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

pub(crate) fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `SOL_UDP` socket option: segment size for UDP GSO on send.
const UDP_SEGMENT: libc::c_int = 103;
/// `SOL_UDP` socket option: receive coalesced datagrams (UDP GRO).
const UDP_GRO: libc::c_int = 104;
/// Most segments in one GSO send: Linux's UDP_MAX_SEGMENTS, which receivers also
/// bound the IPv4 IDs they solve for by.
pub use softverbs_wire::icrc::GSO_MAX_SEGMENTS;
/// Most bytes in one GSO send (a UDP datagram's limit, less headers).
const GSO_MAX_BYTES: usize = 65_000;
/// Receive buffer size: a whole coalesced GRO read.
pub const GRO_BUF: usize = 65_536;

/// Asks the kernel to coalesce received datagrams (UDP GRO); `false` if it
/// cannot.
pub fn enable_gro(sock: &UdpSocket) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: `one` is a live c_int; its size is passed.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Where in a page every read of a [`RecvBatch`] starts: the middle. The payload a
/// datagram's receiver copies into a memory region (a WRITE's at the target, a READ
/// response's at the requester) then starts at byte 2060 of a page (after the 12-byte BTH;
/// 2076 after a RETH), and the next datagrams of a GRO read 16 bytes further each (a
/// 4096-byte payload plus BTH and ICRC is 4112 bytes): some 1800 bytes or more away, modulo
/// 4096, from a destination at the start of a page (perftest's, `softverbs perf`'s, any MR
/// at a multiple of the MTU) or a little after it (a large `malloc`'s 16 bytes).
///
/// Why it matters: a copy whose destination is a few bytes *ahead* of its source modulo
/// 4096 runs at 40 % of the speed (4K aliasing: each load waits on the pending store with
/// the same low 12 address bits; a 64 KiB copy in 4096-byte pieces from a page-aligned
/// source on this host: 14.0-14.5 GB/s with the destination 12-28 bytes into a page, 26.8
/// at 60, 33.9-35.7 from 140 on), and where the heap happened to put the buffers decided
/// it. In Debian's ib_write_bw over the drop-in the target's copies of 20000 64 KiB WRITEs
/// into its page-aligned buffer took 384-495 profile samples at 4 kHz, some of its payloads
/// at 4076-4092 in a page, against 150-166 in `softverbs perf`'s server, where they were at
/// 3148-3228; the same 320 000 copies of 4096 bytes. Placed here: 114-164 in both. (The
/// copy into the region now steps around that distance itself, wherever the region is:
/// `softverbs_engine::copy`; this placement keeps the common payloads on the platform's
/// copy.) The kernel's copy into the buffer has a bad place of its own: a GRO read into a
/// buffer 16 bytes into a page copied at 1.7 GB/s against 11-12.7 at 0-4080 otherwise
/// (loopback, 15 x 4112-byte segments; docs/udp-bandwidth.md, session 18).
const RX_READ_START_IN_PAGE: usize = 2048;

/// Bytes a receive buffer has beyond its reads' room, so that its reads can start at
/// [`RX_READ_START_IN_PAGE`] wherever the allocator put it.
const RX_PLACEMENT_ROOM: usize = 4096;

/// The offset in a buffer at `base` at which its reads start ([`RX_READ_START_IN_PAGE`]).
fn rx_buffer_start(base: *const u8) -> usize {
    softverbs_engine::copy::bytes_to_page_offset(base as usize, RX_READ_START_IN_PAGE)
}

/// Room for one cmsg carrying an int.
const CMSG_SPACE_INT: usize = 32;

/// Fixed buffers for one batched receive. With GRO, one read may hold several
/// datagrams of `segment` bytes each (the last may be shorter).
///
/// The `recvmmsg` headers are built once, pointing at the buffers, addresses and
/// control space (all on the heap, never resized, so they do not move with the batch);
/// a receive resets only the entries the previous one used. Building all of them
/// for every call (zeroing some 2.5 KiB and filling 32 headers) cost every empty
/// poll of a spinning thread, and the message it finally reads.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    /// Where each read starts in its buffer (`rx_buffer_start`).
    starts: Vec<usize>,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    segs: Vec<usize>,
    /// Control space and iovecs the headers point at (only the kernel reads or
    /// writes them, through `msgs`).
    _ctrl: Vec<[u64; CMSG_SPACE_INT / 8]>,
    _iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    count: usize,
    /// Entries of `msgs` the kernel may have changed since they were reset.
    dirty: usize,
    /// [`RecvBatch::recv_adaptive`]'s next call reads once (`recvmsg`).
    single_next: bool,
    /// The last call read once.
    last_single: bool,
}

// SAFETY: the raw pointers in `iovs` and `msgs` point only into heap memory this
// batch owns (its buffers, `addrs`, `ctrl`, `iovs`), which moves with it and is used
// only through `&mut self`.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub fn new(buf_size: usize) -> Self {
        let mut bufs: Vec<Vec<u8>> = (0..BATCH)
            .map(|_| vec![0u8; buf_size + RX_PLACEMENT_ROOM])
            .collect();
        let starts: Vec<usize> = bufs.iter().map(|b| rx_buffer_start(b.as_ptr())).collect();
        // SAFETY: plain old data, all-zero is valid.
        let mut addrs: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
        let mut ctrl = vec![[0u64; CMSG_SPACE_INT / 8]; BATCH];
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .zip(&starts)
            .map(|(b, &at)| libc::iovec {
                iov_base: b[at..].as_mut_ptr().cast(),
                iov_len: buf_size,
            })
            .collect();
        let msgs = (0..BATCH)
            .map(|i| {
                // SAFETY: mmsghdr is plain old data; all-zero is an empty header.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
                m.msg_hdr.msg_iov = &mut iovs[i];
                m.msg_hdr.msg_iovlen = 1;
                m.msg_hdr.msg_control = ctrl[i].as_mut_ptr().cast();
                m
            })
            .collect();
        let mut batch = RecvBatch {
            bufs,
            starts,
            addrs,
            lens: vec![0; BATCH],
            segs: vec![0; BATCH],
            _ctrl: ctrl,
            _iovs: iovs,
            msgs,
            count: 0,
            dirty: BATCH,
            single_next: false,
            last_single: false,
        };
        batch.reset_headers();
        batch
    }

    /// Gives the entries the kernel may have changed their full lengths again.
    fn reset_headers(&mut self) {
        for m in &mut self.msgs[..self.dirty] {
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            m.msg_hdr.msg_controllen = CMSG_SPACE_INT as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        self.dirty = 0;
    }

    /// Receives up to [`BATCH`] reads without blocking; returns how many.
    pub fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        self.recv_up_to(sock, BATCH)
    }

    /// Receives like [`RecvBatch::recv`], but with one read (`recvmsg`) where the
    /// previous call of this batch found nothing after a single read, or at most one
    /// read in a batch: a ping-pong's datagrams come one GRO read at a time (the answer
    /// and its held ACK coalesced), and `recvmmsg` tries the next entry after the first
    /// read, a second, empty receive inside the call, before it returns the one that
    /// carries the message (loopback, 60-byte reads: 1.24 µs against 0.98 µs for
    /// `recvmsg`, medians; docs/udp-latency.md, session 14). After a single read that
    /// found something the next call reads a batch again: more may wait (a backlog, a
    /// stream), and a batch that finds two or more reads keeps batching.
    pub fn recv_adaptive(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        let max = if self.single_next { 1 } else { BATCH };
        let r = self.recv_up_to(sock, max);
        self.single_next = match r {
            Ok(n) => (max == 1 && n == 0) || (max > 1 && n <= 1),
            Err(_) => false,
        };
        r
    }

    /// Whether the last receive was a single read (`recvmsg`).
    pub fn was_single_read(&self) -> bool {
        self.last_single
    }

    /// Receives up to `max` (1 to [`BATCH`]) reads without blocking: one read is a
    /// `recvmsg` into the first entry.
    fn recv_up_to(&mut self, sock: &UdpSocket, max: usize) -> io::Result<usize> {
        self.reset_headers();
        crate::driver::note_syscall();
        let max = max.clamp(1, BATCH);
        self.last_single = max == 1;
        // SAFETY: every msghdr points at live buffers of the stated lengths owned by
        // `self` (built in `new`, never moved since: heap memory that is never resized);
        // the kernel writes at most those lengths.
        let r = unsafe {
            if max == 1 {
                let m = &mut self.msgs[0];
                let n = libc::recvmsg(sock.as_raw_fd(), &mut m.msg_hdr, libc::MSG_DONTWAIT);
                if n >= 0 {
                    m.msg_len = n as libc::c_uint;
                    1
                } else {
                    -1
                }
            } else {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    self.msgs.as_mut_ptr(),
                    max as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        // The entries read, and the one that failed, if any.
        self.dirty = if r < 0 { 1 } else { (r as usize + 1).min(max) };
        if r < 0 {
            let e = io::Error::last_os_error();
            self.count = 0;
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        let n = r as usize;
        for (i, m) in self.msgs.iter().enumerate().take(n) {
            // A datagram larger than the buffer is truncated: mark it unusable.
            self.lens[i] = if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                0
            } else {
                m.msg_len as usize
            };
            self.segs[i] = gro_segment_size(&m.msg_hdr).unwrap_or(self.lens[i]);
        }
        self.count = n;
        Ok(n)
    }

    /// The datagrams of read `i`: source, and the datagrams themselves with their
    /// index in the coalesced read (the IPv4 ID a GSO sender gave them).
    pub fn datagrams(&self, i: usize) -> Option<(SocketAddr, impl Iterator<Item = (u16, &[u8])>)> {
        if i >= self.count {
            return None;
        }
        let src = from_storage(&self.addrs[i])?;
        let data = &self.bufs[i][self.starts[i]..][..self.lens[i]];
        let seg = self.segs[i].max(1);
        Some((
            src,
            data.chunks(seg).enumerate().map(|(k, d)| (k as u16, d)),
        ))
    }

    /// Whether read `i` was truncated.
    pub fn truncated(&self, i: usize) -> bool {
        i < self.count && self.lens[i] == 0
    }
}

/// The GRO segment size from a received message's control data.
fn gro_segment_size(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_* walk it within
    // those bounds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return usize::try_from(v).ok().filter(|&v| v > 0);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// Datagrams queued for one batched send, grouped for UDP GSO: consecutive
/// datagrams to one destination, all of one size but the last, go out as one
/// send whose segment k carries IPv4 ID k.
///
/// The engine emits packets unsealed; the batch seals each one once, in
/// [`SendBatch::seal`], when the groups are final: after fault injection removed
/// some ([`SendBatch::iter_mut`] with a length set to 0), just before sending.
pub struct SendBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    txs: Vec<Transmit>,
    /// Index of each datagram within its GSO group (its IPv4 ID), once sealed.
    ids: Vec<u16>,
    count: usize,
    sealed: bool,
    /// Datagrams before this one were sent (or dropped) by an earlier [`SendBatch::flush`]
    /// that the socket stopped.
    sent_upto: usize,
    /// A flush was tried (fault injection and capture are done).
    started: bool,
    gso: bool,
}

/// How a [`SendBatch::flush`] went.
#[derive(Debug)]
pub enum Flushed {
    /// Everything was handed to the kernel or refused for good.
    Done {
        /// Datagrams sent.
        sent: usize,
        /// Datagrams refused for good (and the first refusal).
        errors: usize,
        first_error: Option<io::Error>,
        /// Send calls made (`sendmmsg`, or `sendmsg` for a single message).
        calls: usize,
        /// Of those, `sendmsg` calls.
        single: usize,
    },
    /// The socket pushed back (`errno` EAGAIN or ENOBUFS): the rest stays in the batch
    /// for the next flush.
    Blocked {
        sent: usize,
        errors: usize,
        first_error: Option<io::Error>,
        calls: usize,
        single: usize,
        errno: i32,
    },
}

impl Flushed {
    /// (datagrams sent, datagrams refused, sendmmsg calls).
    pub fn counts(&self) -> (usize, usize, usize) {
        match self {
            Flushed::Done {
                sent,
                errors,
                calls,
                ..
            }
            | Flushed::Blocked {
                sent,
                errors,
                calls,
                ..
            } => (*sent, *errors, *calls),
        }
    }

    /// Of the send calls, those that sent a single message with `sendmsg`.
    pub fn single_calls(&self) -> usize {
        match self {
            Flushed::Done { single, .. } | Flushed::Blocked { single, .. } => *single,
        }
    }

    /// The first error that made the kernel refuse a datagram.
    pub fn first_error(&self) -> Option<&io::Error> {
        match self {
            Flushed::Done { first_error, .. } | Flushed::Blocked { first_error, .. } => {
                first_error.as_ref()
            }
        }
    }
}

impl SendBatch {
    pub fn new(buf_size: usize, gso: bool) -> Self {
        let nowhere = SocketAddr::from(([0, 0, 0, 0], 0));
        let none = Transmit {
            src: nowhere,
            dst: nowhere,
            len: 0,
        };
        SendBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; buf_size]).collect(),
            lens: vec![0; BATCH],
            txs: vec![none; BATCH],
            ids: vec![0; BATCH],
            count: 0,
            sealed: false,
            sent_upto: 0,
            started: false,
            gso,
        }
    }

    /// Whether datagrams go out as GSO groups.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Whether a flush was tried already (and stopped by the socket).
    pub fn started(&self) -> bool {
        self.started
    }

    pub fn is_full(&self) -> bool {
        self.count == BATCH
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many datagrams are queued.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Queued datagram `i` (unsealed until [`SendBatch::seal`]); empty past the end.
    pub fn datagram(&self, i: usize) -> &[u8] {
        if i < self.count {
            &self.bufs[i][..self.lens[i]]
        } else {
            &[]
        }
    }

    /// Moves the first `n` queued datagrams behind the others (before sealing: no
    /// flush may have started); the buffers trade places, nothing is copied.
    pub fn move_to_back(&mut self, n: usize) {
        let n = n.min(self.count);
        if n == 0 || n == self.count || self.started {
            return;
        }
        let c = self.count;
        if c == 2 {
            // A ping-pong's answer behind its one held ACK: a swap each, where the
            // generic rotations cost more than the rest of this batch's bookkeeping.
            self.bufs.swap(0, 1);
            self.lens.swap(0, 1);
            self.txs.swap(0, 1);
            self.sealed = false;
            return;
        }
        self.bufs[..c].rotate_left(n);
        self.lens[..c].rotate_left(n);
        self.txs[..c].rotate_left(n);
        self.sealed = false;
    }

    /// The buffer the next datagram is built in.
    pub fn next_buf(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// Commits the (unsealed) datagram built in [`SendBatch::next_buf`].
    pub fn commit(&mut self, t: Transmit) {
        let i = self.count;
        self.lens[i] = t.len;
        self.txs[i] = t;
        self.count += 1;
        self.sealed = false;
    }

    /// The queued datagrams: where each goes, its buffer, its length (set it to 0
    /// to leave it out) and its IPv4 ID (0 until sealed).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Transmit, &mut Vec<u8>, &mut usize, u16)> {
        let n = self.count;
        self.txs
            .iter()
            .copied()
            .zip(self.bufs.iter_mut())
            .zip(self.lens.iter_mut())
            .zip(self.ids.iter().copied())
            .take(n)
            .map(|(((t, b), l), id)| (t, b, l, id))
    }

    /// Drops the datagrams whose length was set to 0, groups the rest for GSO and
    /// seals each for the IPv4 ID it will carry: k for segment k of a group, 0 for a
    /// datagram sent alone (see DESIGN.md).
    pub fn seal(&mut self) {
        let mut kept = 0;
        for i in 0..self.count {
            if self.lens[i] == 0 {
                continue;
            }
            if kept != i {
                self.bufs.swap(kept, i);
                self.lens.swap(kept, i);
                self.txs.swap(kept, i);
            }
            kept += 1;
        }
        self.count = kept;
        for i in 0..self.count {
            let (dst, len) = (self.txs[i].dst, self.lens[i]);
            self.ids[i] = if self.gso && i > 0 && self.joins_group(i, dst, len) {
                self.ids[i - 1] + 1
            } else {
                0
            };
            self.txs[i].seal(&mut self.bufs[i], self.ids[i]);
        }
        self.sealed = true;
    }

    /// Whether datagram `i` (to `dst`, `len` bytes) can extend the group datagram
    /// `i - 1` belongs to.
    fn joins_group(&self, i: usize, dst: SocketAddr, len: usize) -> bool {
        let prev = i - 1;
        let start = prev - usize::from(self.ids[prev]);
        let seg = self.lens[start];
        let members = i - start;
        let bytes: usize = self.lens[start..i].iter().sum();
        // Not to multicast groups: their receivers read without GRO, and a
        // multicast sender's datagrams are expected with ID 0.
        dst == self.txs[prev].dst
            && !dst.ip().is_multicast()
            && self.lens[prev] == seg // the group is not closed by a short one
            && len <= seg
            && members < GSO_MAX_SEGMENTS
            && bytes + len <= GSO_MAX_BYTES
    }

    /// Sends everything queued, sealed (see [`SendBatch::seal`]), from where an earlier,
    /// blocked flush stopped. Datagrams the kernel refuses for good are counted and dropped
    /// (UDP loses datagrams anyway); when the socket pushes back (`EAGAIN`, `ENOBUFS`) the
    /// rest stays queued for the next flush.
    pub fn flush(&mut self, sock: &UdpSocket) -> Flushed {
        use std::mem::MaybeUninit;
        self.started = true;
        if !self.sealed {
            self.seal();
        }
        // Only the headers of the messages sent are written: zeroing all BATCH of
        // them (some 8 KiB) cost a memset per send, one datagram too.
        let mut storage =
            [MaybeUninit::<(libc::sockaddr_storage, libc::socklen_t)>::uninit(); BATCH];
        let mut iovs = [MaybeUninit::<libc::iovec>::uninit(); BATCH];
        let mut msgs = [MaybeUninit::<libc::mmsghdr>::uninit(); BATCH];
        let mut ctrl = [MaybeUninit::<[u64; CMSG_SPACE_INT / 8]>::uninit(); BATCH];
        // Per message: its first datagram and how many it carries.
        let mut first = [0usize; BATCH];
        let mut members = [0usize; BATCH];
        let mut m = 0;
        let mut a = self.sent_upto;
        while a < self.count {
            // The group starting at a: the datagrams after it with IDs 1, 2, ...
            let mut b = a + 1;
            while b < self.count && self.ids[b] != 0 {
                b += 1;
            }
            let name = storage[m].write(to_storage(&self.txs[a].dst));
            for ((iov, buf), len) in iovs[a..b]
                .iter_mut()
                .zip(&mut self.bufs[a..b])
                .zip(&self.lens[a..b])
            {
                iov.write(libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: *len,
                });
            }
            // SAFETY: msghdr is plain old data; all-zero is an empty header.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_name = (&mut name.0 as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = name.1;
            hdr.msg_iov = iovs[a..].as_mut_ptr().cast();
            hdr.msg_iovlen = b - a;
            if b - a > 1 {
                hdr.msg_control = ctrl[m].write([0; CMSG_SPACE_INT / 8]).as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE is a pure size computation.
                hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                // SAFETY: msg_control points at CMSG_SPACE_INT zeroed bytes,
                // enough for one cmsg with a u16 payload.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, self.lens[a] as u16);
                }
            }
            msgs[m].write(libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            });
            first[m] = a;
            members[m] = b - a;
            m += 1;
            a = b;
        }
        let (mut sent, mut errors, mut calls, mut single) = (0, 0, 0, 0);
        let mut first_error = None;
        let mut done = 0;
        let mut stale_reports = 0;
        while done < m {
            calls += 1;
            crate::driver::note_syscall();
            // SAFETY: msgs[..m] were written above; the headers point at live buffers,
            // addresses and control data in this frame and `self`, and every iovec
            // they name was written; the kernel only reads them (and msg_len).
            let r = unsafe {
                if m - done == 1 {
                    // One message (a datagram, or one GSO group): `sendmsg` is the
                    // cheaper call for it (bench-tools udp-send1).
                    single += 1;
                    let hdr = &msgs[done].assume_init_ref().msg_hdr;
                    if libc::sendmsg(sock.as_raw_fd(), hdr, 0) < 0 {
                        -1
                    } else {
                        1
                    }
                } else {
                    libc::sendmmsg(
                        sock.as_raw_fd(),
                        msgs[done..].as_mut_ptr().cast(),
                        (m - done) as libc::c_uint,
                        0,
                    )
                }
            };
            if r > 0 {
                let r = r as usize;
                sent += members[done..done + r].iter().sum::<usize>();
                done += r;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(errno @ (libc::EAGAIN | libc::ENOBUFS)) => {
                    // Backpressure: keep the rest for the next flush.
                    self.sent_upto = first[done];
                    return Flushed::Blocked {
                        sent,
                        errors,
                        first_error,
                        calls,
                        single,
                        errno,
                    };
                }
                Some(libc::EINTR) => continue,
                // A port-unreachable report of an earlier send (IP_RECVERR, read by the
                // connection manager from the error queue): nothing was sent, try again.
                Some(libc::ECONNREFUSED) if stale_reports < 4 => stale_reports += 1,
                _ => {
                    // Refused for good (unreachable, too large): drop it and go on.
                    errors += members[done];
                    first_error.get_or_insert(e);
                    done += 1;
                }
            }
        }
        self.count = 0;
        self.sent_upto = 0;
        self.started = false;
        self.sealed = false;
        Flushed::Done {
            sent,
            errors,
            first_error,
            calls,
            single,
        }
    }
}

/// An eventfd: a counter the kernel can wait on.
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd; `semaphore` makes each read take one count.
    pub fn new(nonblocking: bool, semaphore: bool) -> io::Result<EventFd> {
        let mut flags = libc::EFD_CLOEXEC;
        if nonblocking {
            flags |= libc::EFD_NONBLOCK;
        }
        if semaphore {
            flags |= libc::EFD_SEMAPHORE;
        }
        // SAFETY: eventfd has no memory arguments.
        let fd = cvt(unsafe { libc::eventfd(0, flags) })?;
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        crate::driver::note_syscall();
        // SAFETY: writes 8 bytes from a live u64; a full counter (EAGAIN) is fine.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reads the counter (blocking if the fd is blocking); `None` if nothing was
    /// pending on a non-blocking fd.
    pub fn take(&self) -> Option<u64> {
        let mut v: u64 = 0;
        crate::driver::note_syscall();
        // SAFETY: reads 8 bytes into a live u64.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        (r == 8).then_some(v)
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A one-shot `CLOCK_MONOTONIC` timer as a file descriptor (`timerfd`), readable once it
/// expired. Arming it wakes nobody: a thread waiting on it in `poll` wakes at expiry.
pub struct TimerFd(OwnedFd);

impl TimerFd {
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: timerfd_create has no memory arguments.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Arms the timer to expire `after` from now (a zero `after` expires at once), or
    /// disarms it (`None`).
    pub fn set(&self, after: Option<Duration>) {
        let value = match after {
            // A zero it_value would disarm it.
            Some(d) => libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos().max(u32::from(d.as_secs() == 0)) as libc::c_long,
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        crate::driver::note_syscall();
        // SAFETY: `spec` is a live itimerspec; the old value is not asked for.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A socket that receives the datagrams sent to IPv4 multicast group `group`
/// (address and UDP port) on the interface that owns `iface` (any when
/// unspecified): bound to the group address itself, so everything read from
/// it was addressed to the group, with SO_REUSEADDR and SO_REUSEPORT so every
/// device of every process on the host can bind the same group, and joined
/// with IP_ADD_MEMBERSHIP. Closing it leaves the group. Non-blocking.
pub fn multicast_socket(group: SocketAddrV4, iface: std::net::Ipv4Addr) -> io::Result<UdpSocket> {
    crate::driver::note_syscall();
    // SAFETY: socket has no memory arguments.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor we own; the UdpSocket closes it.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    for name in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        // SAFETY: `one` is a live c_int and its size is passed; the fd is open.
        cvt(unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
    }
    let (ss, len) = to_storage(&SocketAddr::V4(group));
    // SAFETY: `ss` holds a sockaddr_in of `len` bytes.
    cvt(unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    })?;
    sock.join_multicast_v4(group.ip(), &iface)?;
    Ok(sock)
}

/// Sends the socket's IPv4 multicast datagrams out of the interface that owns
/// `ip` (IP_MULTICAST_IF), e.g. `lo` for 127.0.0.1. Looping them back to
/// local members (IP_MULTICAST_LOOP) is Linux's default.
pub fn set_multicast_if(sock: &UdpSocket, ip: std::net::Ipv4Addr) -> io::Result<()> {
    let addr = libc::in_addr {
        s_addr: u32::from_ne_bytes(ip.octets()),
    };
    // SAFETY: `addr` is a live in_addr and its size is passed; the fd is open.
    cvt(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&addr as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Waits until one of `fds` is ready as asked or `timeout` passes (`None`: forever); the
/// `revents` are filled in.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` and `ts` are live for the call; the sizes match.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// The MTU of the network interface that owns `ip`, if one does.
pub fn link_mtu(ip: std::net::IpAddr) -> Option<u32> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut name = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` walks the list getifaddrs returned, which stays valid
        // until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says its size;
            // from_storage only reads AF_INET/AF_INET6 ones, which fit.
            let addr = unsafe {
                let mut ss: libc::sockaddr_storage = std::mem::zeroed();
                let len = match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
                    libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
                    _ => 0,
                };
                std::ptr::copy_nonoverlapping(
                    ifa.ifa_addr.cast::<u8>(),
                    (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
                    len,
                );
                if len == 0 {
                    None
                } else {
                    from_storage(&ss)
                }
            };
            if addr.is_some_and(|a| a.ip() == ip) {
                // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
                name = Some(
                    unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
                        .to_string_lossy()
                        .into_owned(),
                );
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated; nothing points into it now.
    unsafe { libc::freeifaddrs(ifap) };
    let name = name?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Sets the calling thread's timer slack to `slack` (Linux rounds a sleeping thread's
/// timeouts up by its slack, 50 µs by default); best effort.
pub fn set_timer_slack(slack: Duration) {
    let ns = slack.as_nanos().clamp(1, u128::from(u32::MAX)) as libc::c_ulong;
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer argument and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
}

/// `struct sched_attr` of `sched_setattr(2)`, as far as its first version (48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// `sched_getattr(2)` of thread `tid` (0: the calling thread).
fn sched_getattr(tid: libc::pid_t) -> Option<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr writes at most `size` bytes into the live `attr`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            size,
            0,
        )
    };
    (r == 0).then_some(attr)
}

/// The scheduler slice (`sched_runtime`, the EEVDF slice of a fair task) thread `tid`
/// reports (0: the calling thread).
pub fn sched_slice(tid: libc::pid_t) -> Option<Duration> {
    sched_getattr(tid).map(|a| Duration::from_nanos(a.runtime))
}

/// Asks the scheduler for a slice of `slice` for the calling thread, if it runs under a
/// fair policy (`SCHED_OTHER`, `SCHED_BATCH`): Linux 6.12's EEVDF takes a fair task's
/// `sched_runtime` as its slice (clamped to 0.1-100 ms), which needs no privilege; older
/// kernels ignore it. The thread's policy and nice value stay as they are. Returns the
/// slice the kernel then reports (`None` where it cannot say).
pub fn set_sched_slice(slice: Duration) -> Option<Duration> {
    let mut attr = sched_getattr(0)?;
    if !(attr.policy == libc::SCHED_OTHER as u32 || attr.policy == libc::SCHED_BATCH as u32) {
        return None;
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.flags = 0;
    attr.runtime = slice.as_nanos().min(u128::from(u64::MAX)) as u64;
    // SAFETY: sched_setattr reads the live, fully initialised `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r != 0 {
        return None;
    }
    sched_slice(0)
}

/// Runs `f` with every signal blocked on the calling thread (threads it spawns inherit the
/// mask), then restores the mask.
pub fn with_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain old data; sigfillset initialises `all`; pthread_sigmask
    // reads `all` and writes the old mask into `old`, both live locals.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    let r = f();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// Checks that `len` bytes at `addr` are mapped in this process, readable, and writable
/// when `writable` (what the kernel's `ib_umem_get` demands before it pins a memory
/// region: EFAULT otherwise); `Err` says what is wrong. Reads `/proc/self/maps`.
pub fn check_mapped(addr: usize, len: usize, writable: bool) -> Result<(), &'static str> {
    let end = addr.checked_add(len).ok_or("the range wraps around")?;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|_| "cannot read /proc/self/maps to check the range")?;
    covered(&maps, addr, end, writable)
}

/// Whether the mappings listed in `maps` (the format of `/proc/<pid>/maps`, in address
/// order) cover `start..end` without a gap, readable (and writable when asked).
fn covered(maps: &str, start: usize, end: usize, writable: bool) -> Result<(), &'static str> {
    let mut cur = start;
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= cur {
            continue;
        }
        if lo > cur {
            return Err("part of the range is not mapped");
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') {
            return Err("part of the range is not readable");
        }
        if writable && p.get(1) != Some(&b'w') {
            return Err("part of the range is read-only but the access flags allow writes");
        }
        cur = hi;
        if cur >= end {
            return Ok(());
        }
    }
    Err("part of the range is not mapped")
}

/// The calling thread's involuntary context switches so far (`getrusage(RUSAGE_THREAD)`,
/// `ru_nivcsw`: times another task took its CPU while it could still run, a preemption
/// or a `sched_yield` that found another task runnable on its CPU) and the CPU time it
/// has used (user and system, ns).
pub fn thread_switches_and_cpu() -> Option<(u64, u64)> {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` into the live `usage`.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    let ns =
        |t: libc::timeval| t.tv_sec.max(0) as u64 * 1_000_000_000 + t.tv_usec.max(0) as u64 * 1000;
    (r == 0).then(|| {
        (
            usage.ru_nivcsw.max(0) as u64,
            ns(usage.ru_utime) + ns(usage.ru_stime),
        )
    })
}

/// How many CPUs the calling thread may run on (`sched_getaffinity`); 1 where it cannot
/// say.
pub fn allowed_cpus() -> usize {
    // SAFETY: an all-zero `cpu_set_t` is the empty set, a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into the
    // live `set`.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return 1;
    }
    // SAFETY: CPU_COUNT reads the set sched_getaffinity filled.
    (unsafe { libc::CPU_COUNT(&set) }).max(1) as usize
}

/// The CPU the calling thread runs on now (`sched_getcpu`: the kernel's rseq area or the
/// vDSO, no system call on this kernel), if it can say.
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`, the same for every process of the
/// host's time namespace) in milliseconds: a time other processes can compare.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one `timespec` into the live `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec.max(0) as u64 * 1000 + ts.tv_nsec.max(0) as u64 / 1_000_000
}

/// `/proc/stat`'s time unit: ticks per second (`sysconf(_SC_CLK_TCK)`, 100 where it
/// cannot say).
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Moves the calling thread to `cpu` once: narrows its affinity to that CPU (the kernel
/// migrates it at once), then gives the old set back (it stays where it went until the
/// scheduler moves it). False, and no change, when `cpu` is not one it may run on or a
/// call fails.
pub fn move_to_cpu(cpu: u32) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let cpu = cpu as usize;
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: an all-zero `cpu_set_t` is the empty set, a valid value.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size` bytes into the live `allowed`.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return false;
    }
    // SAFETY: `cpu` is inside the set (checked above); CPU_ISSET only reads it.
    if !unsafe { libc::CPU_ISSET(cpu, &allowed) } {
        return false;
    }
    // SAFETY: as above.
    let mut there: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is inside the set; CPU_SET writes only `there`.
    unsafe { libc::CPU_SET(cpu, &mut there) };
    // SAFETY: both calls read `size` bytes of live sets; they change only this thread's
    // affinity, and the second puts back exactly the set the thread had.
    unsafe {
        if libc::sched_setaffinity(0, size, &there) != 0 {
            return false;
        }
        libc::sched_setaffinity(0, size, &allowed);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/prog
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/prog
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/prog
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000003000 rw-p 00000000 00:00 0
";

    /// The read budget the driver gives the engine comes from here: the buffer a
    /// socket was granted, as set (the kernel reports twice what it holds).
    #[test]
    fn receive_buffer_reports_what_was_granted() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_buffers(&sock, 64 * 1024);
        let granted = receive_buffer(&sock);
        assert!(
            (128 * 1024..=256 * 1024).contains(&granted),
            "{granted} bytes for 64 KiB asked"
        );
    }

    /// Every read of a receive batch starts at the same place in a page, wherever the
    /// allocator put the buffers (heap offsets that differ between programs used to
    /// decide how fast the payload copies into a memory region ran: see
    /// `RX_READ_START_IN_PAGE`), and its datagrams are the bytes that were sent.
    #[test]
    fn every_read_starts_at_the_same_place_in_a_page() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        // Batches made after allocations of assorted sizes, so their buffers start at
        // assorted heap offsets.
        let mut keep = Vec::new();
        for shift in [0usize, 16, 48, 1000, 2064, 4032, 4080] {
            keep.push(vec![1u8; shift + 1]);
            let mut batch = RecvBatch::new(GRO_BUF);
            for (b, &at) in batch.bufs.iter().zip(&batch.starts) {
                assert_eq!((b.as_ptr() as usize + at) % 4096, RX_READ_START_IN_PAGE);
                assert!(
                    at + GRO_BUF <= b.len(),
                    "a read's room is inside its buffer"
                );
            }
            let sent: Vec<u8> = (0..3000).map(|i| (i * 7 + shift) as u8).collect();
            tx.send_to(&sent, to).unwrap();
            let mut got = 0;
            for _ in 0..1000 {
                got = batch.recv(&rx).unwrap();
                if got > 0 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(got, 1);
            let (_, mut data) = batch.datagrams(0).unwrap();
            let (_, d) = data.next().unwrap();
            assert_eq!((d.as_ptr() as usize) % 4096, RX_READ_START_IN_PAGE);
            assert_eq!(d, &sent[..]);
        }
    }

    /// `RecvBatch::recv_adaptive` reads once (`recvmsg`) where the previous call found
    /// at most one read, so a ping-pong's message costs no empty second receive inside
    /// `recvmmsg`; after a single read that found something it reads a batch again, so a
    /// backlog still comes in batches.
    #[test]
    fn adaptive_receive_reads_once_after_a_lone_read_and_batches_a_backlog() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let from = tx.local_addr().unwrap();
        let mut batch = RecvBatch::new(2048);
        let lens = |batch: &RecvBatch, n: usize| -> Vec<usize> {
            (0..n)
                .map(|i| {
                    let (src, data) = batch.datagrams(i).unwrap();
                    assert_eq!(src, from);
                    data.map(|(_, d)| d.len()).sum()
                })
                .collect()
        };
        // A batch that finds nothing: the next call reads once, and so does every call
        // that finds nothing after it.
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 0);
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 0);
        // Three datagrams wait: the single read takes the first only.
        for len in [10, 20, 30] {
            tx.send_to(&vec![7u8; len], to).unwrap();
        }
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 1, "a single read");
        assert_eq!(lens(&batch, 1), [10]);
        // Then a batch: the other two at once, and it keeps batching.
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 2);
        assert_eq!(lens(&batch, 2), [20, 30]);
        for len in [40, 50] {
            tx.send_to(&vec![7u8; len], to).unwrap();
        }
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 2);
        assert_eq!(lens(&batch, 2), [40, 50]);
        // A batch that found one read (the ping-pong's pattern): the next reads once.
        tx.send_to(&[7u8; 60], to).unwrap();
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 1);
        for len in [70, 80] {
            tx.send_to(&vec![7u8; len], to).unwrap();
        }
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 1, "a single read");
        assert_eq!(lens(&batch, 1), [70]);
        // A datagram larger than the buffer is marked truncated on a single read too.
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 1);
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 0);
        tx.send_to(&[7u8; 4000], to).unwrap();
        assert_eq!(batch.recv_adaptive(&rx).unwrap(), 1);
        assert!(batch.truncated(0));
    }

    #[test]
    fn ranges_are_checked_against_the_mappings() {
        assert_eq!(covered(MAPS, 0x400100, 0x400200, false), Ok(()));
        // Across two adjacent mappings, the first read-only.
        assert_eq!(covered(MAPS, 0x651800, 0x653000, false), Ok(()));
        assert!(covered(MAPS, 0x651800, 0x653000, true).is_err());
        assert_eq!(covered(MAPS, 0x652000, 0x655000, true), Ok(()));
        // Past the end of a mapping, in a gap, below everything.
        assert!(covered(MAPS, 0x654000, 0x656000, false).is_err());
        assert!(covered(MAPS, 0x500000, 0x500010, false).is_err());
        assert!(covered(MAPS, 0x1000, 0x2000, false).is_err());
        // PROT_NONE.
        assert!(covered(MAPS, 0x7f0000000800, 0x7f0000001800, false).is_err());
        assert_eq!(covered(MAPS, 0x7f0000001000, 0x7f0000003000, true), Ok(()));
    }

    #[test]
    fn moved_datagrams_trade_places_whole() {
        let dst = SocketAddr::from(([127, 0, 0, 1], 4791));
        let mut b = SendBatch::new(64, false);
        for (i, len) in [(1u8, 8), (2, 12), (3, 16)] {
            b.next_buf()[..len].fill(i);
            b.commit(Transmit { src: dst, dst, len });
        }
        b.move_to_back(2);
        assert_eq!(b.len(), 3);
        assert_eq!(b.datagram(0), &[3u8; 16]);
        assert_eq!(b.datagram(1), &[1u8; 8]);
        assert_eq!(b.datagram(2), &[2u8; 12]);
        assert!(b.datagram(3).is_empty());
        // All of them, or none: nothing moves.
        b.move_to_back(3);
        b.move_to_back(0);
        assert_eq!(b.datagram(0), &[3u8; 16]);
    }

    #[test]
    fn an_answer_moves_ahead_of_its_one_held_ack() {
        let dst = SocketAddr::from(([127, 0, 0, 1], 4791));
        let other = SocketAddr::from(([127, 0, 0, 2], 4791));
        let mut b = SendBatch::new(64, false);
        b.next_buf()[..20].fill(1);
        b.commit(Transmit {
            src: dst,
            dst,
            len: 20,
        });
        b.next_buf()[..40].fill(2);
        b.commit(Transmit {
            src: dst,
            dst: other,
            len: 40,
        });
        b.move_to_back(1);
        assert_eq!(b.datagram(0), &[2u8; 40]);
        assert_eq!(b.datagram(1), &[1u8; 20]);
        let dsts: Vec<SocketAddr> = b.iter_mut().map(|(t, ..)| t.dst).collect();
        assert_eq!(dsts, [other, dst]);
    }

    #[test]
    fn this_process() {
        let v = vec![0u8; 10_000];
        assert_eq!(check_mapped(v.as_ptr() as usize, v.len(), true), Ok(()));
        static RO: [u8; 64] = [1; 64];
        assert_eq!(check_mapped(RO.as_ptr() as usize, RO.len(), false), Ok(()));
        assert!(check_mapped(RO.as_ptr() as usize, RO.len(), true).is_err());
        assert!(check_mapped(usize::MAX - 10, 100, false).is_err());
        assert!(check_mapped(0x1000, 4096, false).is_err());
    }
}
