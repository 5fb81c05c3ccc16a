//! The IP and UDP headers a RoCEv2 packet travels in (IBA Annex A17.4), rebuilt from
//! its addresses: a UDP socket shows neither, yet the ICRC covers them ([`crate::icrc`]),
//! a UD receive buffer starts with them (the GRH area, [`grh`]) and a capture shows
//! them ([`crate::pcap`]).
//!
//! Every softverbs datagram is sent the same way, so its headers follow from the
//! addresses, the UDP payload length and (IPv4) the Identification: IPv4 with DF set,
//! TTL 64, no options, a correct header checksum; IPv6 with traffic class and flow
//! label 0 and hop limit 64. When both ends are IPv4 or IPv4-mapped IPv6 the datagram
//! is IPv4, otherwise IPv6 (IPv4 addresses then mapped).

use crate::{Error, Result};
use std::net::{IpAddr, SocketAddr};

/// Bytes of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Bytes of an IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Bytes of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Bytes of the GRH area at the start of every UD receive buffer (IBA 11.4.1.1).
pub const GRH_LEN: usize = 40;
/// The IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// TTL / hop limit of every softverbs datagram.
pub const TTL: u8 = 64;
/// IPv4 flags and fragment offset of every softverbs datagram: DF set, offset 0.
pub const IPV4_DONT_FRAGMENT: u16 = 0x4000;

/// Both addresses as IPv4 when both are IPv4 (or IPv4-mapped IPv6), else as IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Source and destination IPv4 addresses.
    V4([u8; 4], [u8; 4]),
    /// Source and destination IPv6 addresses.
    V6([u8; 16], [u8; 16]),
}

/// The family a datagram between `src` and `dst` travels in, with its addresses.
pub fn family(src: IpAddr, dst: IpAddr) -> Family {
    let v4 = |ip: IpAddr| match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    };
    match (v4(src), v4(dst)) {
        (Some(s), Some(d)) => Family::V4(s.octets(), d.octets()),
        _ => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            Family::V6(v6(src), v6(dst))
        }
    }
}

/// An IP header as it goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpHeader {
    /// An IPv4 header.
    V4([u8; IPV4_HEADER_LEN]),
    /// An IPv6 header.
    V6([u8; IPV6_HEADER_LEN]),
}

impl IpHeader {
    /// The header's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            IpHeader::V4(h) => h,
            IpHeader::V6(h) => h,
        }
    }
}

/// The IP header of a softverbs datagram from `src` to `dst` carrying `udp_len` bytes
/// of UDP (header included), with IPv4 Identification `ipv4_id` (unused for IPv6).
pub fn ip_header(src: IpAddr, dst: IpAddr, udp_len: usize, ipv4_id: u16) -> Result<IpHeader> {
    let mut h = [0u8; IPV6_HEADER_LEN];
    match write_ip_header_unchecked(src, dst, udp_len, ipv4_id, &mut h)? {
        IPV4_HEADER_LEN => {
            let mut v4 = [0u8; IPV4_HEADER_LEN];
            v4.copy_from_slice(&h[..IPV4_HEADER_LEN]);
            let checksum = fold(ones_sum(0, &v4));
            v4[10..12].copy_from_slice(&checksum.to_be_bytes());
            Ok(IpHeader::V4(v4))
        }
        _ => Ok(IpHeader::V6(h)),
    }
}

/// Writes the IP header of [`ip_header`] at the start of `out` with the IPv4 header
/// checksum left 0, for the ICRC, which masks it and runs for every packet; returns
/// the header's length (20 or 40).
pub(crate) fn write_ip_header_unchecked(
    src: IpAddr,
    dst: IpAddr,
    udp_len: usize,
    ipv4_id: u16,
    out: &mut [u8],
) -> Result<usize> {
    // Plain IPv4 at both ends, the common case, needs no mapping.
    let family = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Family::V4(s.octets(), d.octets()),
        _ => family(src, dst),
    };
    match family {
        Family::V4(s, d) => {
            let total =
                u16::try_from(IPV4_HEADER_LEN + udp_len).map_err(|_| Error::BufferTooSmall)?;
            let h = out
                .get_mut(..IPV4_HEADER_LEN)
                .ok_or(Error::BufferTooSmall)?;
            h[0] = 0x45; // version 4, IHL 5
            h[1] = 0;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&ipv4_id.to_be_bytes());
            h[6..8].copy_from_slice(&IPV4_DONT_FRAGMENT.to_be_bytes());
            h[8] = TTL;
            h[9] = IPPROTO_UDP;
            h[10..12].fill(0);
            h[12..16].copy_from_slice(&s);
            h[16..20].copy_from_slice(&d);
            Ok(IPV4_HEADER_LEN)
        }
        Family::V6(s, d) => {
            let payload = u16::try_from(udp_len).map_err(|_| Error::BufferTooSmall)?;
            let h = out
                .get_mut(..IPV6_HEADER_LEN)
                .ok_or(Error::BufferTooSmall)?;
            h[0] = 0x60; // version 6, traffic class and flow label 0
            h[1..4].fill(0);
            h[4..6].copy_from_slice(&payload.to_be_bytes());
            h[6] = IPPROTO_UDP;
            h[7] = TTL;
            h[8..24].copy_from_slice(&s);
            h[24..40].copy_from_slice(&d);
            Ok(IPV6_HEADER_LEN)
        }
    }
}

/// The UDP header of a datagram from `src` to `dst` with `payload_len` bytes of
/// payload, its checksum left 0 (see [`udp_checksum`]).
pub fn udp_header(src: SocketAddr, dst: SocketAddr, payload_len: usize) -> Result<[u8; 8]> {
    let len = u16::try_from(UDP_HEADER_LEN + payload_len).map_err(|_| Error::BufferTooSmall)?;
    let mut h = [0u8; UDP_HEADER_LEN];
    h[0..2].copy_from_slice(&src.port().to_be_bytes());
    h[2..4].copy_from_slice(&dst.port().to_be_bytes());
    h[4..6].copy_from_slice(&len.to_be_bytes());
    Ok(h)
}

/// The UDP checksum of `udp` (header with checksum 0) and `payload` between `src` and
/// `dst` (RFC 768, RFC 8200 8.1: over a pseudo-header of addresses, protocol and length);
/// a computed 0 is sent as all ones.
pub fn udp_checksum(src: IpAddr, dst: IpAddr, udp: &[u8; UDP_HEADER_LEN], payload: &[u8]) -> u16 {
    let len = u16::from_be_bytes([udp[4], udp[5]]);
    let mut sum = ones_sum(ones_sum(0, udp), payload) + u32::from(IPPROTO_UDP) + u32::from(len);
    sum = match family(src, dst) {
        Family::V4(s, d) => ones_sum(ones_sum(sum, &s), &d),
        Family::V6(s, d) => ones_sum(ones_sum(sum, &s), &d),
    };
    match fold(sum) {
        0 => 0xffff,
        c => c,
    }
}

/// The GRH area of a UD message that arrived from `src` at `dst` in a UDP datagram of
/// `udp_payload` bytes, as a RoCEv2 device reports it (IBA A17.4.5.1): for IPv4 the
/// IPv4 header fills the last 20 bytes (the first 20 are zero); for IPv6 the IPv6
/// header fills all 40. A datagram too long for IP gives a zero area.
pub fn grh(src: SocketAddr, dst: SocketAddr, udp_payload: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    match ip_header(src.ip(), dst.ip(), UDP_HEADER_LEN + udp_payload, 0) {
        Ok(IpHeader::V4(h)) => g[GRH_LEN - IPV4_HEADER_LEN..].copy_from_slice(&h),
        Ok(IpHeader::V6(h)) => g.copy_from_slice(&h),
        Err(_) => {}
    }
    g
}

/// One's-complement sum of `data` as big-endian 16-bit words, added to `sum`.
pub(crate) fn ones_sum(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

/// Folds a one's-complement sum to 16 bits and complements it.
pub(crate) fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_checksum_verifies() {
        let h = ip_header(
            "192.0.2.1".parse().unwrap(),
            "192.0.2.2".parse().unwrap(),
            28,
            7,
        )
        .unwrap();
        let IpHeader::V4(b) = h else {
            panic!("IPv4 expected")
        };
        assert_eq!(fold(ones_sum(0, &b)), 0, "a correct checksum sums to 0");
        assert_eq!(&b[2..4], &48u16.to_be_bytes());
        assert_eq!(&b[4..8], &[0, 7, 0x40, 0]);
    }

    #[test]
    fn grh_of_ipv4_and_ipv6() {
        let v4 = grh(
            "[::ffff:10.0.0.1]:4791".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
            100,
        );
        assert!(v4[..20].iter().all(|&b| b == 0));
        assert_eq!(v4[20], 0x45);
        assert_eq!(&v4[22..24], &128u16.to_be_bytes());
        let v6 = grh(
            "[2001:db8::1]:4791".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
            100,
        );
        assert_eq!(v6[0], 0x60);
        assert_eq!(&v6[4..6], &108u16.to_be_bytes());
        assert_eq!(
            &v6[24..40],
            &"::ffff:10.0.0.2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
    }
}
