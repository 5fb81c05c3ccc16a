//! The system calls the connection manager's driver makes: rendezvous sockets (bound at an
//! rdma_cm address, with IP_PKTINFO so a wildcard socket learns the address a request was
//! sent to), ICMP errors from the error queue (IP_RECVERR), and the kernel's route choice for
//! address resolution (a connected UDP socket's source address, path MTU and hop limit).
//!
//! None of these run under the device lock (see `crate::driver`).

use crate::sys::{from_storage, to_storage};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn set_int(
    sock: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    crate::driver::note_syscall();
    // SAFETY: `v` is a live c_int and its size is passed; the fd is open.
    cvt(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn get_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    crate::driver::note_syscall();
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live locals of the sizes the kernel writes.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// Asks for ICMP errors of the socket's sends in its error queue (IP_RECVERR /
/// IPV6_RECVERR; see [`drain_errors`]).
pub fn set_recverr(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    if v6 {
        set_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1)?;
    }
    // An IPv6 socket also sends to IPv4-mapped peers: ask for both.
    match set_int(sock, libc::IPPROTO_IP, libc::IP_RECVERR, 1) {
        Err(e) if !v6 => Err(e),
        _ => Ok(()),
    }
}

/// A UDP socket of `family_of`'s family bound at `addr` (an rdma_cm address: a listener's
/// rendezvous socket, or a companion socket at port 0). Non-blocking, close-on-exec, with
/// IP_PKTINFO (so a wildcard socket learns where each datagram was sent) and IP_RECVERR.
/// Fails with `EADDRINUSE` when another socket holds the address and port.
pub fn cm_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    cm_socket_with(addr, false)
}

/// [`cm_socket`]; with `v6only` an IPv6 socket takes IPv6 only (`IPV6_V6ONLY`, set before
/// the bind), so it leaves the IPv4 address of its port to another socket: the rendezvous
/// of an id with the AF-only option (`RDMA_OPTION_ID_AFONLY`).
pub fn cm_socket_with(addr: SocketAddr, v6only: bool) -> io::Result<UdpSocket> {
    let sock = if v6only && addr.is_ipv6() {
        bind_v6only(addr)?
    } else {
        UdpSocket::bind(addr)?
    };
    sock.set_nonblocking(true)?;
    let v6 = addr.is_ipv6();
    if v6 {
        set_int(&sock, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
    }
    match set_int(&sock, libc::IPPROTO_IP, libc::IP_PKTINFO, 1) {
        Err(e) if !v6 => return Err(e),
        _ => {}
    }
    set_recverr(&sock, v6)?;
    crate::sys::set_dont_fragment(&sock, v6)?;
    Ok(sock)
}

/// A UDP socket with `IPV6_V6ONLY` bound at the IPv6 `addr`.
fn bind_v6only(addr: SocketAddr) -> io::Result<UdpSocket> {
    use std::os::fd::FromRawFd;
    crate::driver::note_syscall();
    // SAFETY: plain syscall; the result is checked.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    set_int(&sock, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    let (ss, len) = to_storage(&addr);
    // SAFETY: `ss` is a live socket address of `len` bytes; the fd is open.
    cvt(unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    })?;
    Ok(sock)
}

/// Room for the control messages [`recv_from_to`] asks for.
const CTRL_LEN: usize = 128;

/// Receives one datagram without blocking: its length, source, and the local address it
/// was sent to (from IP_PKTINFO / IPV6_PKTINFO, when the kernel gave it). `Ok(None)`: nothing
/// waits. A pending socket error (an ICMP report, see [`drain_errors`]) is returned as `Err`.
pub fn recv_from_to(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(usize, SocketAddr, Option<IpAddr>)>> {
    // SAFETY: plain old data, all-zero is valid.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut ctrl = [0u64; CTRL_LEN / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain old data, all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr().cast();
    msg.msg_controllen = CTRL_LEN as _;
    crate::driver::note_syscall();
    // SAFETY: the header points at live buffers of the stated sizes in this frame.
    let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        // Longer than any CM datagram: not one.
        return Ok(Some((
            0,
            from_storage(&name).unwrap_or(unspecified()),
            None,
        )));
    }
    let Some(src) = from_storage(&name) else {
        return Ok(Some((0, unspecified(), None)));
    };
    let mut local = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_* walk it within those
    // bounds, and each payload read is the struct the (level, type) pair names.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let p = std::ptr::read_unaligned(data as *const libc::in_pktinfo);
                    local = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(p.ipi_addr.s_addr))));
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let p = std::ptr::read_unaligned(data as *const libc::in6_pktinfo);
                    local = Some(IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr)));
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some((r as usize, src, local)))
}

fn unspecified() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

/// Takes every ICMP report from the socket's error queue (IP_RECVERR) and returns the
/// destinations that answered "port unreachable" (ECONNREFUSED): where nothing listens.
pub fn drain_errors(sock: &UdpSocket) -> Vec<SocketAddr> {
    let mut refused = Vec::new();
    // Bounded: the queue holds at most what the receive buffer allows.
    for _ in 0..256 {
        // SAFETY: plain old data, all-zero is valid.
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut ctrl = [0u64; CTRL_LEN / 8];
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: byte.len(),
        };
        // SAFETY: plain old data, all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr().cast();
        msg.msg_controllen = CTRL_LEN as _;
        crate::driver::note_syscall();
        // SAFETY: the header points at live buffers of the stated sizes in this frame.
        let r = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            break;
        }
        // SAFETY: as in `recv_from_to`; the payload of a RECVERR message is a
        // sock_extended_err.
        let errno = unsafe {
            let mut errno = None;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let level = (*c).cmsg_level;
                let ty = (*c).cmsg_type;
                if (level == libc::IPPROTO_IP && ty == libc::IP_RECVERR)
                    || (level == libc::IPPROTO_IPV6 && ty == libc::IPV6_RECVERR)
                {
                    let e = std::ptr::read_unaligned(
                        libc::CMSG_DATA(c) as *const libc::sock_extended_err
                    );
                    errno = Some(e.ee_errno as i32);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            errno
        };
        if errno == Some(libc::ECONNREFUSED) {
            if let Some(dst) = from_storage(&name) {
                refused.push(dst);
            }
        }
    }
    refused
}

/// What the kernel's routing says about reaching `dst` (from `src`, if given): the source
/// address it picks, the path MTU and the hop limit. Learned from a UDP socket connected to
/// the destination (no datagram is sent).
pub fn probe_route(src: Option<IpAddr>, dst: IpAddr) -> io::Result<(IpAddr, u32, u8)> {
    let v6 = dst.is_ipv6();
    let bind_ip = src.unwrap_or(if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    });
    let sock = UdpSocket::bind(SocketAddr::new(bind_ip, 0))?;
    sock.connect(SocketAddr::new(dst, crate::gid::ROCE_PORT))?;
    let local = sock.local_addr()?.ip();
    let (mtu, hops) = if v6 {
        (
            get_int(&sock, libc::IPPROTO_IPV6, libc::IPV6_MTU)?,
            get_int(&sock, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS)?,
        )
    } else {
        (
            get_int(&sock, libc::IPPROTO_IP, libc::IP_MTU)?,
            get_int(&sock, libc::IPPROTO_IP, libc::IP_TTL)?,
        )
    };
    Ok((
        local,
        u32::try_from(mtu).unwrap_or(1500),
        u8::try_from(hops).unwrap_or(64),
    ))
}

/// Sends one datagram (the socket has DF set; unconnected, so IPv4 ID 0).
pub fn send_to(sock: &UdpSocket, data: &[u8], dst: SocketAddr) -> io::Result<usize> {
    crate::driver::note_syscall();
    let (ss, len) = to_storage(&dst);
    // SAFETY: `data` and `ss` are live for the call with the stated lengths.
    let r = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_DONTWAIT,
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}
