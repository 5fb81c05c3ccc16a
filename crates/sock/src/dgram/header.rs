//! The two headers of datagram rsockets (rdma-core 44 `librdmacm/rsocket.c`, `ds_*`):
//!
//! * [`DsHeader`], in front of every datagram carried as a UD SEND: the sender's socket
//!   address, which the receiver reports as the datagram's source. 8 bytes for IPv4
//!   (`version 4, length 8, port, address`), 24 for IPv6 (`version 6, length 24, port,
//!   flow info, address`). Port, address and flow info are in network byte order (as in a
//!   `sockaddr`).
//! * [`UdpHeader`], in front of every datagram sent over the rsocket's UDP socket: tag
//!   `0x55555555`, version, operation (DATA carries a datagram, CTRL announces the sender's
//!   QPN), header length (16 for IPv4, 28 for IPv6), the sender's QPN (24 bits, big-endian
//!   32-bit field) and the sender's IP address.
//!
//! softverbs adds one thing the UDP header cannot say: which softverbs device (GID) the
//! sender's QP lives on, because on one host many processes share one IP address. It rides
//! after the header of a CTRL datagram, whose body rsocket.c ignores ([`DeviceTrailer`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use thiserror::Error;

/// `DS_IPV4_HDR_LEN`
pub const DS_IPV4_HDR_LEN: usize = 8;
/// `DS_IPV6_HDR_LEN`
pub const DS_IPV6_HDR_LEN: usize = 24;
/// `DS_UDP_TAG`
pub const DS_UDP_TAG: u32 = 0x5555_5555;
/// `DS_UDP_IPV4_HDR_LEN`
pub const DS_UDP_IPV4_HDR_LEN: usize = 16;
/// `DS_UDP_IPV6_HDR_LEN`
pub const DS_UDP_IPV6_HDR_LEN: usize = 28;
/// The magic that opens softverbs' [`DeviceTrailer`].
pub const TRAILER_MAGIC: [u8; 4] = *b"SVDG";
/// Bytes of a [`DeviceTrailer`]: magic and a 16-byte GID.
pub const TRAILER_LEN: usize = 20;

/// What is wrong with a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum HeaderError {
    /// Fewer bytes than the header needs.
    #[error("{got} bytes, the header needs {need}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        got: usize,
    },
    /// The UDP header's tag is not `0x55555555`.
    #[error("tag {0:#x} is not the datagram rsocket tag")]
    BadTag(u32),
    /// Version and length disagree, or name neither IPv4 nor IPv6.
    #[error("version {version} with length {length}")]
    BadVersion {
        /// The version byte.
        version: u8,
        /// The length byte.
        length: u8,
    },
    /// A UDP header whose version is not the family of the address it came from
    /// (rsocket.c's `udp_svc_valid_udp_hdr`).
    #[error("an IPv{version} header arrived from {from}")]
    FamilyMismatch {
        /// The header's version.
        version: u8,
        /// The datagram's source.
        from: SocketAddr,
    },
}

/// The header in front of a UD datagram: who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsHeader {
    /// The sender's socket address (IPv6: with its flow info; scope id is not carried).
    pub src: SocketAddr,
}

impl DsHeader {
    /// Bytes this header takes on the wire.
    pub fn len(&self) -> usize {
        match self.src {
            SocketAddr::V4(_) => DS_IPV4_HDR_LEN,
            SocketAddr::V6(_) => DS_IPV6_HDR_LEN,
        }
    }

    /// Always false: a header is never empty (for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Reads the header at the start of `bytes`; returns it and its length (where the
    /// datagram starts). Stricter than rsocket.c's `ds_valid_recv`, which checks only the
    /// IPv4 length against the received size: here the whole header must be there.
    pub fn parse(bytes: &[u8]) -> Result<(DsHeader, usize), HeaderError> {
        if bytes.len() < 2 {
            return Err(HeaderError::Truncated {
                need: DS_IPV4_HDR_LEN,
                got: bytes.len(),
            });
        }
        let (version, length) = (bytes[0], bytes[1]);
        let need = match (version, length as usize) {
            (4, DS_IPV4_HDR_LEN) => DS_IPV4_HDR_LEN,
            (6, DS_IPV6_HDR_LEN) => DS_IPV6_HDR_LEN,
            _ => return Err(HeaderError::BadVersion { version, length }),
        };
        if bytes.len() < need {
            return Err(HeaderError::Truncated {
                need,
                got: bytes.len(),
            });
        }
        let port = u16::from_be_bytes([bytes[2], bytes[3]]);
        let src = if version == 4 {
            let ip = Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[4..8]).expect("4 bytes"));
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        } else {
            let flow = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[8..24]).expect("16 bytes"));
            SocketAddr::V6(SocketAddrV6::new(ip, port, flow, 0))
        };
        Ok((DsHeader { src }, need))
    }

    /// Appends the header's bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        match self.src {
            SocketAddr::V4(a) => {
                out.extend_from_slice(&[4, DS_IPV4_HDR_LEN as u8]);
                out.extend_from_slice(&a.port().to_be_bytes());
                out.extend_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                out.extend_from_slice(&[6, DS_IPV6_HDR_LEN as u8]);
                out.extend_from_slice(&a.port().to_be_bytes());
                out.extend_from_slice(&a.flowinfo().to_be_bytes());
                out.extend_from_slice(&a.ip().octets());
            }
        }
    }
}

/// The operation of a [`UdpHeader`] (rsocket.c's `RS_OP_*` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpOp {
    /// `RS_OP_DATA` (0): a datagram follows the header.
    Data,
    /// `RS_OP_CTRL` (7): "this is my QPN"; nothing follows (softverbs: its trailer).
    Ctrl,
    /// Any other value: rsocket.c neither answers nor forwards it, but still learns the
    /// sender's QPN from it.
    Other(u8),
}

impl UdpOp {
    fn to_byte(self) -> u8 {
        match self {
            UdpOp::Data => 0,
            UdpOp::Ctrl => 7,
            UdpOp::Other(b) => b,
        }
    }

    fn from_byte(b: u8) -> UdpOp {
        match b {
            0 => UdpOp::Data,
            7 => UdpOp::Ctrl,
            b => UdpOp::Other(b),
        }
    }
}

/// The header in front of a datagram on the rsocket's UDP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader {
    /// What the datagram is.
    pub op: UdpOp,
    /// The sender's UD QP number (24 bits).
    pub qpn: u32,
    /// The IP address of the sender's QP (its version is the header's).
    pub addr: IpAddr,
}

impl UdpHeader {
    /// Bytes this header takes on the wire.
    pub fn len(&self) -> usize {
        match self.addr {
            IpAddr::V4(_) => DS_UDP_IPV4_HDR_LEN,
            IpAddr::V6(_) => DS_UDP_IPV6_HDR_LEN,
        }
    }

    /// Always false: a header is never empty (for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Reads the header of a datagram that arrived from `from`; returns it and its length
    /// (where the body starts). Checks what rsocket.c's `udp_svc_valid_udp_hdr` checks: the
    /// tag, and a version and length that match each other and the family of `from`.
    pub fn parse(bytes: &[u8], from: SocketAddr) -> Result<(UdpHeader, usize), HeaderError> {
        if bytes.len() < DS_UDP_IPV4_HDR_LEN {
            return Err(HeaderError::Truncated {
                need: DS_UDP_IPV4_HDR_LEN,
                got: bytes.len(),
            });
        }
        let tag = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if tag != DS_UDP_TAG {
            return Err(HeaderError::BadTag(tag));
        }
        let (version, op, length) = (bytes[4], bytes[5], bytes[6]);
        let need = match (version, length as usize) {
            (4, DS_UDP_IPV4_HDR_LEN) => DS_UDP_IPV4_HDR_LEN,
            (6, DS_UDP_IPV6_HDR_LEN) => DS_UDP_IPV6_HDR_LEN,
            _ => return Err(HeaderError::BadVersion { version, length }),
        };
        if (version == 4) != from.is_ipv4() {
            return Err(HeaderError::FamilyMismatch { version, from });
        }
        if bytes.len() < need {
            return Err(HeaderError::Truncated {
                need,
                got: bytes.len(),
            });
        }
        // The field is big-endian with its top byte reserved (rsocket.c masks 24 bits).
        let qpn = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")) & 0x00FF_FFFF;
        let addr = if version == 4 {
            IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(&bytes[12..16]).expect("4 bytes"),
            ))
        } else {
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&bytes[12..28]).expect("16 bytes"),
            ))
        };
        Ok((
            UdpHeader {
                op: UdpOp::from_byte(op),
                qpn,
                addr,
            },
            need,
        ))
    }

    /// Appends the header's bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&DS_UDP_TAG.to_be_bytes());
        out.extend_from_slice(&[
            if self.addr.is_ipv4() { 4 } else { 6 },
            self.op.to_byte(),
            self.len() as u8,
            0,
        ]);
        out.extend_from_slice(&(self.qpn & 0x00FF_FFFF).to_be_bytes());
        match self.addr {
            IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
        }
    }
}

/// softverbs' addition after a CTRL datagram's header: the GID of the device the sender's
/// QP is on, so the receiver can address it (a GID encodes a softverbs device's UDP
/// endpoint). A peer that sends no trailer (rdma-core on a RoCE device) is addressed by the
/// GID of its IP address, as rdma-core's address resolution would find on RoCEv2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTrailer {
    /// The sender's device GID.
    pub gid: [u8; 16],
}

impl DeviceTrailer {
    /// Reads a trailer from a CTRL datagram's body; None when the body is not one (a peer
    /// that sends none, or anything else: rsocket.c ignores the body).
    pub fn parse(body: &[u8]) -> Option<DeviceTrailer> {
        if body.len() < TRAILER_LEN || body[..4] != TRAILER_MAGIC {
            return None;
        }
        Some(DeviceTrailer {
            gid: body[4..TRAILER_LEN].try_into().expect("16 bytes"),
        })
    }

    /// Appends the trailer's bytes to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&TRAILER_MAGIC);
        out.extend_from_slice(&self.gid);
    }
}

/// The GID a RoCEv2 peer at `ip` has (IPv4-mapped for IPv4): what rdma-core's address
/// resolution finds for a peer on a RoCE device.
pub fn gid_of_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Bytes laid out by hand from rsocket.c's `struct ds_header` (version, length, __be16
    /// port, __be32 address).
    #[test]
    fn ds_header_ipv4_vector() {
        let h = DsHeader {
            src: v4("192.168.1.2:7174"),
        };
        let mut b = Vec::new();
        h.emit(&mut b);
        assert_eq!(b, [4, 8, 0x1c, 0x06, 192, 168, 1, 2]);
        b.extend_from_slice(b"payload");
        assert_eq!(DsHeader::parse(&b), Ok((h, 8)));
    }

    #[test]
    fn ds_header_ipv6_vector() {
        let src = SocketAddr::V6(SocketAddrV6::new("::1".parse().unwrap(), 80, 0x12345, 0));
        let h = DsHeader { src };
        let mut b = Vec::new();
        h.emit(&mut b);
        let mut want = vec![6, 24, 0, 80, 0, 1, 0x23, 0x45];
        want.extend_from_slice(&[0; 15]);
        want.push(1);
        assert_eq!(b, want);
        assert_eq!(DsHeader::parse(&b), Ok((h, 24)));
    }

    #[test]
    fn ds_header_refuses_what_rsocket_c_refuses_and_short_ipv6() {
        assert!(matches!(
            DsHeader::parse(&[4, 24, 0, 0, 0, 0, 0, 0]),
            Err(HeaderError::BadVersion { .. })
        ));
        assert!(matches!(
            DsHeader::parse(&[5, 8, 0, 0, 0, 0, 0, 0]),
            Err(HeaderError::BadVersion { .. })
        ));
        assert!(matches!(
            DsHeader::parse(&[4]),
            Err(HeaderError::Truncated { .. })
        ));
        // rsocket.c would accept this (it checks only 8 bytes) and read past the datagram.
        assert_eq!(
            DsHeader::parse(&[6, 24, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(HeaderError::Truncated { need: 24, got: 10 })
        );
    }

    /// `struct ds_udp_header`: __be32 tag, version, op, length, reserved, __be32 qpn,
    /// address.
    #[test]
    fn udp_header_ipv4_vector() {
        let h = UdpHeader {
            op: UdpOp::Ctrl,
            qpn: 0x12_3456,
            addr: "127.0.0.1".parse().unwrap(),
        };
        let mut b = Vec::new();
        h.emit(&mut b);
        assert_eq!(
            b,
            [0x55, 0x55, 0x55, 0x55, 4, 7, 16, 0, 0, 0x12, 0x34, 0x56, 127, 0, 0, 1]
        );
        assert_eq!(UdpHeader::parse(&b, v4("127.0.0.1:9")), Ok((h, 16)));
        // The reserved top byte of the QPN field is ignored.
        b[8] = 0xff;
        assert_eq!(
            UdpHeader::parse(&b, v4("127.0.0.1:9")).unwrap().0.qpn,
            0x12_3456
        );
    }

    #[test]
    fn udp_header_ipv6_round_trip_and_checks() {
        let h = UdpHeader {
            op: UdpOp::Data,
            qpn: 77,
            addr: "fe80::2".parse().unwrap(),
        };
        let mut b = Vec::new();
        h.emit(&mut b);
        assert_eq!(b.len(), 28);
        assert_eq!(
            UdpHeader::parse(&b, "[::1]:5".parse().unwrap()),
            Ok((h, 28))
        );
        assert!(matches!(
            UdpHeader::parse(&b, v4("127.0.0.1:5")),
            Err(HeaderError::FamilyMismatch { .. })
        ));
        assert!(matches!(
            UdpHeader::parse(&b[..20], "[::1]:5".parse().unwrap()),
            Err(HeaderError::Truncated { need: 28, got: 20 })
        ));
        let mut bad = b.clone();
        bad[0] = 0x54;
        assert!(matches!(
            UdpHeader::parse(&bad, "[::1]:5".parse().unwrap()),
            Err(HeaderError::BadTag(_))
        ));
        let mut bad = b;
        bad[6] = 16;
        assert!(matches!(
            UdpHeader::parse(&bad, "[::1]:5".parse().unwrap()),
            Err(HeaderError::BadVersion { .. })
        ));
    }

    #[test]
    fn trailer_round_trip_and_absence() {
        let t = DeviceTrailer {
            gid: gid_of_ip("127.83.1.2".parse().unwrap()),
        };
        let mut b = Vec::new();
        t.emit(&mut b);
        assert_eq!(b.len(), TRAILER_LEN);
        assert_eq!(DeviceTrailer::parse(&b), Some(t));
        assert_eq!(DeviceTrailer::parse(&b[..19]), None);
        assert_eq!(DeviceTrailer::parse(&[0; 20]), None);
        assert_eq!(
            gid_of_ip("10.0.0.1".parse().unwrap()),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
    }
}
