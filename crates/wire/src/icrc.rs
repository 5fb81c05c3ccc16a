//! The RoCEv2 invariant CRC (IBA Annex A17.4.1).
//!
//! The ICRC is CRC-32 (the Ethernet polynomial, as used by zlib) over:
//! 8 bytes of 0xFF standing for the masked LRH; the IP header with its variant
//! fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class,
//! flow label, hop limit); the UDP header with its checksum set to all ones; the BTH
//! with its reserved byte 4 (FECN, BECN, resv6) set to all ones; then the rest of the
//! packet up to, not including, the ICRC. It is carried least significant byte
//! first.
//!
//! A UDP socket shows neither the IP header nor the UDP header, so they are rebuilt
//! here from the addresses the datagram travels between. The IPv4 Identification
//! field is *not* masked: see DESIGN.md for why softverbs sends with DF set on an
//! unconnected socket (ID 0) and passes the ID in.

use crate::packet::{BTH_LEN, ICRC_LEN};
use crate::{Error, Result};
use std::net::{IpAddr, SocketAddr};

const UDP_HEADER_LEN: usize = 8;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const IPPROTO_UDP: u8 = 17;
/// IPv4 flags and fragment offset of every softverbs datagram: DF set, offset 0.
const IPV4_DONT_FRAGMENT: u16 = 0x4000;

/// The IP and UDP context the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcContext {
    /// Source address and UDP port.
    pub src: SocketAddr,
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// IPv4 Identification (0 for softverbs senders; ignored for IPv6).
    pub ipv4_id: u16,
}

impl IcrcContext {
    /// A context with IPv4 ID 0.
    pub fn new(src: SocketAddr, dst: SocketAddr) -> Self {
        IcrcContext {
            src,
            dst,
            ipv4_id: 0,
        }
    }
}

/// Both addresses as IPv4 when both are IPv4 (or IPv4-mapped IPv6), else as IPv6.
pub(crate) enum Family {
    V4([u8; 4], [u8; 4]),
    V6([u8; 16], [u8; 16]),
}

pub(crate) fn family(src: IpAddr, dst: IpAddr) -> Family {
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

/// Computes the ICRC of `packet` (a whole RoCEv2 packet, ICRC slot included).
pub fn compute(ctx: &IcrcContext, packet: &[u8]) -> Result<u32> {
    if packet.len() < BTH_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    let udp_len =
        u16::try_from(UDP_HEADER_LEN + packet.len()).map_err(|_| Error::BufferTooSmall)?;
    let mut pseudo = [0u8; 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN];
    pseudo[..8].fill(0xff); // masked LRH
    let mut at = 8;
    match family(ctx.src.ip(), ctx.dst.ip()) {
        Family::V4(src, dst) => {
            let total = udp_len
                .checked_add(IPV4_HEADER_LEN as u16)
                .ok_or(Error::BufferTooSmall)?;
            let ip = &mut pseudo[at..at + IPV4_HEADER_LEN];
            ip[0] = 0x45; // version 4, IHL 5
            ip[1] = 0xff; // TOS (DSCP, ECN): variant
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[4..6].copy_from_slice(&ctx.ipv4_id.to_be_bytes());
            ip[6..8].copy_from_slice(&IPV4_DONT_FRAGMENT.to_be_bytes());
            ip[8] = 0xff; // TTL: variant
            ip[9] = IPPROTO_UDP;
            ip[10..12].fill(0xff); // header checksum: variant
            ip[12..16].copy_from_slice(&src);
            ip[16..20].copy_from_slice(&dst);
            at += IPV4_HEADER_LEN;
        }
        Family::V6(src, dst) => {
            let ip = &mut pseudo[at..at + IPV6_HEADER_LEN];
            // Version 6; traffic class and flow label: variant.
            ip[0..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = 0xff; // hop limit: variant
            ip[8..24].copy_from_slice(&src);
            ip[24..40].copy_from_slice(&dst);
            at += IPV6_HEADER_LEN;
        }
    }
    let udp = &mut pseudo[at..at + UDP_HEADER_LEN];
    udp[0..2].copy_from_slice(&ctx.src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&ctx.dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].fill(0xff); // UDP checksum: variant
    at += UDP_HEADER_LEN;
    pseudo[at..at + BTH_LEN].copy_from_slice(&packet[..BTH_LEN]);
    pseudo[at + 4] = 0xff; // BTH FECN, BECN, resv6: variant
    at += BTH_LEN;

    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&pseudo[..at]);
    hasher.update(&packet[BTH_LEN..packet.len() - ICRC_LEN]);
    Ok(hasher.finalize())
}

/// Computes the ICRC and writes it into the last four bytes of `packet`.
pub fn fill(ctx: &IcrcContext, packet: &mut [u8]) -> Result<()> {
    let crc = compute(ctx, packet)?;
    let n = packet.len();
    packet[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Whether the ICRC carried in `packet` is right for `ctx`.
pub fn verify(ctx: &IcrcContext, packet: &[u8]) -> bool {
    match compute(ctx, packet) {
        Ok(crc) => {
            let t = &packet[packet.len() - ICRC_LEN..];
            crc == u32::from_le_bytes([t[0], t[1], t[2], t[3]])
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack() -> [u8; 20] {
        [
            0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x01, 0x00, 0x1f, 0x00,
            0x00, 0x03, 0, 0, 0, 0,
        ]
    }

    fn v4() -> IcrcContext {
        IcrcContext::new(
            "192.0.2.1:49152".parse().unwrap(),
            "192.0.2.2:4791".parse().unwrap(),
        )
    }

    #[test]
    fn matches_independent_vector() {
        // Produced by scapy.contrib.roce for IP(id=0, flags=DF)/UDP/BTH/AETH with these
        // addresses; its last four bytes are the ICRC.
        let mut p = ack();
        fill(&v4(), &mut p).unwrap();
        assert_eq!(&p[16..], &[0xde, 0x1d, 0xbd, 0x85]);
    }

    #[test]
    fn fill_then_verify() {
        let mut p = ack();
        fill(&v4(), &mut p).unwrap();
        assert!(verify(&v4(), &p));
        let other = IcrcContext { ipv4_id: 1, ..v4() };
        assert!(!verify(&other, &p));
        let swapped = IcrcContext::new(v4().dst, v4().src);
        assert!(!verify(&swapped, &p));
    }

    #[test]
    fn variant_bth_byte_is_masked() {
        let mut p = ack();
        fill(&v4(), &mut p).unwrap();
        p[4] = 0xc0; // set FECN and BECN in flight
        assert!(verify(&v4(), &p));
        p[8] = 0x80; // AckReq is invariant
        assert!(!verify(&v4(), &p));
    }

    #[test]
    fn mapped_ipv6_is_ipv4() {
        let mapped = IcrcContext::new(
            "[::ffff:192.0.2.1]:49152".parse().unwrap(),
            "[::ffff:192.0.2.2]:4791".parse().unwrap(),
        );
        assert_eq!(compute(&mapped, &ack()), compute(&v4(), &ack()));
        let v6 = IcrcContext::new(
            "[2001:db8::1]:49152".parse().unwrap(),
            "[2001:db8::2]:4791".parse().unwrap(),
        );
        assert_ne!(compute(&v6, &ack()), compute(&v4(), &ack()));
    }

    #[test]
    fn every_bit_flip_is_caught() {
        let mut p = ack();
        fill(&v4(), &mut p).unwrap();
        for byte in 0..p.len() {
            if byte == 4 {
                continue; // masked
            }
            for bit in 0..8 {
                let mut q = p;
                q[byte] ^= 1 << bit;
                assert!(!verify(&v4(), &q), "flip at {byte}.{bit} undetected");
            }
        }
    }
}
