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

use crate::ip::{self, Family, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use crate::packet::{BTH_LEN, ICRC_LEN};
use crate::{Error, Result};
use std::net::SocketAddr;

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

/// Computes the ICRC of `packet` (a whole RoCEv2 packet, ICRC slot included).
pub fn compute(ctx: &IcrcContext, packet: &[u8]) -> Result<u32> {
    if packet.len() < BTH_LEN + ICRC_LEN {
        return Err(Error::Truncated);
    }
    let mut pseudo = [0u8; 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN];
    pseudo[..8].fill(0xff); // masked LRH
    let mut at = 8;
    let udp_len = UDP_HEADER_LEN + packet.len();
    let ip_len = ip::write_ip_header_unchecked(
        ctx.src.ip(),
        ctx.dst.ip(),
        udp_len,
        ctx.ipv4_id,
        &mut pseudo[at..],
    )?;
    let ip = &mut pseudo[at..at + ip_len];
    if ip_len == IPV4_HEADER_LEN {
        ip[1] = 0xff; // TOS (DSCP, ECN): variant
        ip[8] = 0xff; // TTL: variant
        ip[10..12].fill(0xff); // header checksum: variant
    } else {
        // Version 6; traffic class and flow label: variant.
        ip[0..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
        ip[7] = 0xff; // hop limit: variant
    }
    at += ip_len;
    let udp_len = u16::try_from(udp_len).map_err(|_| Error::BufferTooSmall)?;
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
        Ok(crc) => crc == carried(packet),
        Err(_) => false,
    }
}

/// The ICRC a packet carries (callers have checked it is long enough).
fn carried(packet: &[u8]) -> u32 {
    let t = &packet[packet.len() - ICRC_LEN..];
    u32::from_le_bytes([t[0], t[1], t[2], t[3]])
}

/// The most segments a softverbs sender puts in one UDP GSO send: Linux's
/// `UDP_MAX_SEGMENTS` on the kernels softverbs supports. Segment k carries IPv4
/// Identification k (see DESIGN.md), so a softverbs peer's IDs are below this.
pub const GSO_MAX_SEGMENTS: usize = 64;

/// The IPv4 Identification `packet`'s ICRC was computed with, if any makes it match
/// between `ctx`'s addresses: `ctx.ipv4_id` when it does (the guess, checked first),
/// else the one ID that does, or `None` (the packet is corrupt, or was not sealed for
/// these addresses). For IPv6, where no ID is covered, `ctx.ipv4_id` or `None`.
///
/// One CRC pass. CRC-32 is linear over GF(2): for two equal-length inputs,
/// `crc(a) ^ crc(b)` is the CRC (initial value and final XOR 0) of `a ^ b`. Inputs
/// that differ only in the two ID bytes give `S^(8n+16)(v)`, where `v` holds the XOR
/// of the IDs (first byte in the low bits), `n` is the number of bytes after the ID,
/// and `S` is one step of the bit-reflected CRC register, which is multiplication by
/// x modulo the CRC polynomial. So multiplying the difference by `x^-(8n+16)` gives
/// `v` back; it names an ID exactly when it fits in 16 bits (a random corruption does
/// with probability 2^-16; callers bound the IDs they believe further).
pub fn sealed_ipv4_id(ctx: &IcrcContext, packet: &[u8]) -> Option<u16> {
    let crc = compute(ctx, packet).ok()?;
    let diff = crc ^ carried(packet);
    if diff == 0 {
        return Some(ctx.ipv4_id);
    }
    if !matches!(ip::family(ctx.src.ip(), ctx.dst.ip()), Family::V4(..)) {
        return None;
    }
    // The CRC covers the masked LRH (8), the IPv4 header up to and including the
    // ID (6), then the rest of it (14), UDP (8) and the packet but its ICRC: the
    // ID's two bytes and the `n` after them, `8n + 16` register steps in all.
    let steps_bytes = 2 + (IPV4_HEADER_LEN - 6) + UDP_HEADER_LEN + packet.len() - ICRC_LEN;
    let v = times_x_to_minus_8(diff, steps_bytes);
    if v > 0xffff {
        return None;
    }
    // The ID is big-endian: its first (high) byte went into the register's low bits.
    let delta = ((v & 0xff) << 8) as u16 | (v >> 8) as u16;
    Some(ctx.ipv4_id ^ delta)
}

/// The CRC-32 polynomial, bit-reflected (as crc32fast and zlib use it).
const POLY: u32 = 0xedb8_8320;

/// `a * b` modulo the CRC polynomial, both in the bit-reflected representation
/// (bit 31 is the coefficient of x^0).
const fn mul_mod_poly(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// x^-(8 * 2^k) modulo the CRC polynomial, for k = 0..32.
const X_TO_MINUS_8_POW2: [u32; 32] = {
    // x^-1: the register value one step of S maps to x^0 (only bit 31 set). S
    // shifts right and, when bit 0 fell out, adds POLY, whose bit 31 is set; so
    // undoing it from a value with bit 31 set means bit 0 was set.
    let x_inv = ((0x8000_0000u32 ^ POLY) << 1) | 1;
    let mut table = [0u32; 32];
    let mut p = x_inv;
    let mut i = 0;
    while i < 3 {
        p = mul_mod_poly(p, p); // x^-2, x^-4, x^-8
        i += 1;
    }
    let mut k = 0;
    while k < 32 {
        table[k] = p;
        p = mul_mod_poly(p, p);
        k += 1;
    }
    table
};

/// `value * x^-(8 * bytes)` modulo the CRC polynomial: undoes `bytes` bytes of CRC
/// register steps.
fn times_x_to_minus_8(mut value: u32, bytes: usize) -> u32 {
    let mut k = 0;
    let mut rest = bytes;
    while rest != 0 {
        if rest & 1 != 0 {
            value = mul_mod_poly(X_TO_MINUS_8_POW2[k], value);
        }
        rest >>= 1;
        k += 1;
    }
    value
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
    fn the_sealed_ipv4_id_is_found_from_any_guess() {
        let mut p = [0u8; 1060];
        for (i, b) in p.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        p[..16].copy_from_slice(&ack()[..16]);
        for id in [0u16, 1, 2, 63, 64, 0x1234, 0xffff] {
            let sealed = IcrcContext {
                ipv4_id: id,
                ..v4()
            };
            fill(&sealed, &mut p).unwrap();
            for guess in [0u16, id, 5, 0x8000] {
                let ctx = IcrcContext {
                    ipv4_id: guess,
                    ..v4()
                };
                assert_eq!(sealed_ipv4_id(&ctx, &p), Some(id), "id {id} guess {guess}");
            }
            assert_eq!(sealed_ipv4_id(&sealed, &ack()[..]), None);
        }
        // Other addresses: no ID makes it match.
        let swapped = IcrcContext::new(v4().dst, v4().src);
        assert_eq!(sealed_ipv4_id(&swapped, &p), None);
    }

    #[test]
    fn undoing_register_steps() {
        // x^-8 times x^8 is 1 (x^0: bit 31).
        let x8 = {
            let mut w = 0x8000_0000u32;
            for _ in 0..8 {
                w = if w & 1 != 0 { (w >> 1) ^ POLY } else { w >> 1 };
            }
            w
        };
        assert_eq!(mul_mod_poly(X_TO_MINUS_8_POW2[0], x8), 0x8000_0000);
        assert_eq!(times_x_to_minus_8(x8, 1), 0x8000_0000);
        assert_eq!(times_x_to_minus_8(0x1234_5678, 0), 0x1234_5678);
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
