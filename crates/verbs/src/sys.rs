//! Thin wrappers over the Linux socket calls std does not offer: batched
//! send/receive (sendmmsg/recvmmsg), DF on unconnected sends, eventfd and poll.

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
pub fn set_buffers(sock: &UdpSocket, bytes: libc::c_int) {
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

fn to_storage(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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

fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
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

/// Fixed buffers for one batched receive.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    count: usize,
}

impl RecvBatch {
    pub fn new(buf_size: usize) -> Self {
        RecvBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; buf_size]).collect(),
            // SAFETY: plain old data, all-zero is valid.
            addrs: vec![unsafe { std::mem::zeroed() }; BATCH],
            lens: vec![0; BATCH],
            count: 0,
        }
    }

    /// Receives up to [`BATCH`] datagrams without blocking; returns how many.
    pub fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        let mut iovs: [libc::iovec; BATCH] =
            // SAFETY: iovec is plain old data.
            unsafe { std::mem::zeroed() };
        // SAFETY: mmsghdr is plain old data.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..BATCH {
            iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            msgs[i].msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: every msghdr points at live buffers of the stated lengths owned by
        // `self` or this frame; the kernel writes at most those lengths.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
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
        for (i, m) in msgs.iter().enumerate().take(n) {
            // A datagram larger than the buffer is truncated: mark it unusable.
            self.lens[i] = if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                0
            } else {
                m.msg_len as usize
            };
        }
        self.count = n;
        Ok(n)
    }

    /// The `i`-th datagram received and its source.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        if i >= self.count {
            return None;
        }
        Some((from_storage(&self.addrs[i])?, &self.bufs[i][..self.lens[i]]))
    }
}

/// Datagrams queued for one batched send.
pub struct SendBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    dsts: Vec<SocketAddr>,
    count: usize,
}

impl SendBatch {
    pub fn new(buf_size: usize) -> Self {
        SendBatch {
            bufs: (0..BATCH).map(|_| vec![0u8; buf_size]).collect(),
            lens: vec![0; BATCH],
            dsts: vec![SocketAddr::from(([0, 0, 0, 0], 0)); BATCH],
            count: 0,
        }
    }

    pub fn is_full(&self) -> bool {
        self.count == BATCH
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The buffer the next datagram is built in.
    pub fn next_buf(&mut self) -> &mut [u8] {
        &mut self.bufs[self.count]
    }

    /// Commits the datagram built in [`SendBatch::next_buf`].
    pub fn commit(&mut self, dst: SocketAddr, len: usize) {
        self.lens[self.count] = len;
        self.dsts[self.count] = dst;
        self.count += 1;
    }

    /// The queued datagrams.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (SocketAddr, &mut Vec<u8>, &mut usize)> {
        let n = self.count;
        self.dsts
            .iter()
            .copied()
            .zip(self.bufs.iter_mut())
            .zip(self.lens.iter_mut())
            .take(n)
            .map(|((d, b), l)| (d, b, l))
    }

    /// Sends everything queued (datagrams whose length was set to 0 are skipped);
    /// returns errors counted, not raised: UDP loses datagrams anyway.
    pub fn flush(&mut self, sock: &UdpSocket) -> usize {
        let mut errors = 0;
        let mut start = 0;
        while start < self.count {
            let mut storage = [(unsafe_zero_storage(), 0 as libc::socklen_t); BATCH];
            // SAFETY: iovec and mmsghdr are plain old data.
            let mut iovs: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
            let mut n = 0;
            for i in start..self.count {
                if self.lens[i] == 0 {
                    continue;
                }
                storage[n] = to_storage(&self.dsts[i]);
                iovs[n] = libc::iovec {
                    iov_base: self.bufs[i].as_mut_ptr().cast(),
                    iov_len: self.lens[i],
                };
                n += 1;
            }
            for i in 0..n {
                msgs[i].msg_hdr.msg_name =
                    (&mut storage[i].0 as *mut libc::sockaddr_storage).cast();
                msgs[i].msg_hdr.msg_namelen = storage[i].1;
                msgs[i].msg_hdr.msg_iov = &mut iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            if n == 0 {
                break;
            }
            let mut sent = 0;
            while sent < n {
                // SAFETY: the headers point at live buffers and addresses in this
                // frame and `self`; the kernel only reads them.
                let r = unsafe {
                    libc::sendmmsg(
                        sock.as_raw_fd(),
                        msgs[sent..].as_mut_ptr(),
                        (n - sent) as libc::c_uint,
                        0,
                    )
                };
                if r <= 0 {
                    // Drop the one that failed (e.g. unreachable) and go on.
                    errors += 1;
                    sent += 1;
                } else {
                    sent += r as usize;
                }
            }
            start = self.count;
        }
        self.count = 0;
        errors
    }
}

fn unsafe_zero_storage() -> libc::sockaddr_storage {
    // SAFETY: plain old data, all-zero is valid.
    unsafe { std::mem::zeroed() }
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
        // SAFETY: writes 8 bytes from a live u64; a full counter (EAGAIN) is fine.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reads the counter (blocking if the fd is blocking); `None` if nothing was
    /// pending on a non-blocking fd.
    pub fn take(&self) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        (r == 8).then_some(v)
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`: forever).
pub fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<()> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` and `ts` are live for the call; the sizes match.
    let r = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
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
