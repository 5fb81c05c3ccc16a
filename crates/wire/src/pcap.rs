//! Classic pcap capture files of RoCEv2 traffic, readable by Wireshark and tshark.
//!
//! A UDP socket shows neither the Ethernet, IP nor UDP header of what it sends and
//! receives, so [`PcapWriter`] rebuilds them around each RoCEv2 packet: an Ethernet II
//! frame with made-up, locally administered MAC addresses derived from the IP
//! addresses, an IPv4 header (DF set, TTL 64, the given Identification, a correct
//! header checksum) or an IPv6 header (hop limit 64), and a UDP header with the right
//! length and checksum. Wireshark decodes datagrams to UDP port 4791 as RoCEv2
//! ("RRoCE", protocol `infiniband`).
//!
//! The file format is the classic libpcap one (not pcapng): a 24-byte global header
//! with microsecond timestamps and link type Ethernet, then one 16-byte record header
//! per frame. Everything is written little-endian, whatever the host.
//!
//! Addresses follow the ICRC's rule ([`crate::icrc`]): when both ends are IPv4 or
//! IPv4-mapped IPv6 the frame is IPv4, otherwise IPv6 (IPv4 addresses then mapped).
//!
//! ```
//! use softverbs_wire::pcap::PcapWriter;
//! use std::time::Duration;
//!
//! let mut w = PcapWriter::new(Vec::new()).unwrap();
//! let src = "192.0.2.1:49152".parse().unwrap();
//! let dst = "192.0.2.2:4791".parse().unwrap();
//! w.write_udp(Duration::from_secs(1), src, dst, 0, &[0u8; 20]).unwrap();
//! let file = w.into_inner();
//! // Global header, record header, Ethernet 14 + IPv4 20 + UDP 8 + 20 bytes.
//! assert_eq!(file.len(), 24 + 16 + 14 + 20 + 8 + 20);
//! ```

use crate::icrc::IcrcContext;
use crate::ip::{self, IpHeader, IPV4_HEADER_LEN, UDP_HEADER_LEN};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// pcap link type of Ethernet II frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// The magic number of a microsecond-resolution classic pcap file.
pub const PCAP_MAGIC: u32 = 0xa1b2_c3d4;
/// The largest frame a record holds in full; longer frames are truncated.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERNET_HEADER_LEN: usize = 14;

/// Writes a classic pcap file of Ethernet frames to `W`.
///
/// Each `write_*` call writes exactly one record; wrap `W` in a
/// [`std::io::BufWriter`] when writing to a file, and call [`PcapWriter::flush`]
/// (or drop the `BufWriter`) before reading the file back.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
    frame: Vec<u8>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header (snap length [`DEFAULT_SNAPLEN`]) and returns the writer.
    pub fn new(out: W) -> io::Result<Self> {
        Self::with_snaplen(out, DEFAULT_SNAPLEN)
    }

    /// Like [`PcapWriter::new`], but records keep at most `snaplen` bytes of each frame.
    pub fn with_snaplen(mut out: W, snaplen: u32) -> io::Result<Self> {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&PCAP_MAGIC.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes()); // version 2.4
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // 8..16: time zone offset and timestamp accuracy, both 0.
        header[16..20].copy_from_slice(&snaplen.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(PcapWriter {
            out,
            snaplen,
            frame: Vec::new(),
        })
    }

    /// Writes one Ethernet frame as captured at `timestamp` (time since the Unix
    /// epoch).
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> io::Result<()> {
        write_record(&mut self.out, self.snaplen, timestamp, frame)
    }

    /// Writes a UDP datagram from `src` to `dst` carrying `payload`, wrapped in
    /// Ethernet, IP and UDP headers. `ipv4_id` is the IPv4 Identification (ignored
    /// for IPv6).
    ///
    /// Fails with [`io::ErrorKind::InvalidInput`] if the payload does not fit in one
    /// UDP datagram.
    pub fn write_udp(
        &mut self,
        timestamp: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        ipv4_id: u16,
        payload: &[u8],
    ) -> io::Result<()> {
        self.frame.clear();
        udp_frame(src, dst, ipv4_id, payload, &mut self.frame)?;
        write_record(&mut self.out, self.snaplen, timestamp, &self.frame)
    }

    /// Writes a RoCEv2 packet (BTH ... ICRC) as the UDP datagram `ctx` describes:
    /// the same addresses, ports and IPv4 Identification its ICRC was computed with.
    pub fn write_roce(
        &mut self,
        timestamp: Duration,
        ctx: &IcrcContext,
        packet: &[u8],
    ) -> io::Result<()> {
        self.write_udp(timestamp, ctx.src, ctx.dst, ctx.ipv4_id, packet)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

fn write_record<W: Write>(
    out: &mut W,
    snaplen: u32,
    timestamp: Duration,
    frame: &[u8],
) -> io::Result<()> {
    let orig_len = u32::try_from(frame.len()).map_err(|_| invalid("frame too long"))?;
    let incl_len = orig_len.min(snaplen);
    // Classic pcap holds 32-bit seconds; wrap rather than fail after 2106.
    let secs = timestamp.as_secs() as u32;
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&secs.to_le_bytes());
    header[4..8].copy_from_slice(&timestamp.subsec_micros().to_le_bytes());
    header[8..12].copy_from_slice(&incl_len.to_le_bytes());
    header[12..16].copy_from_slice(&orig_len.to_le_bytes());
    out.write_all(&header)?;
    out.write_all(&frame[..incl_len as usize])
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// A locally administered unicast MAC address made from the last four bytes of an
/// IP address, so that each endpoint shows a stable address of its own.
fn mac_for(ip_tail: &[u8]) -> [u8; 6] {
    let t = &ip_tail[ip_tail.len() - 4..];
    [0x02, 0x00, t[0], t[1], t[2], t[3]]
}

/// Appends an Ethernet/IP/UDP frame carrying `payload` to `frame`.
fn udp_frame(
    src: SocketAddr,
    dst: SocketAddr,
    ipv4_id: u16,
    payload: &[u8],
    frame: &mut Vec<u8>,
) -> io::Result<()> {
    let mut udp = ip::udp_header(src, dst, payload.len())
        .map_err(|_| invalid("payload too long for a UDP datagram"))?;
    let header = ip::ip_header(src.ip(), dst.ip(), UDP_HEADER_LEN + payload.len(), ipv4_id)
        .map_err(|_| invalid("payload too long for an IP datagram"))?;
    let (ethertype, ip_bytes) = match &header {
        IpHeader::V4(h) => (ETHERTYPE_IPV4, &h[..]),
        IpHeader::V6(h) => (ETHERTYPE_IPV6, &h[..]),
    };
    // The addresses end the header: the last 4 bytes of each (IPv4) or of the
    // mapped or native IPv6 addresses give the MACs.
    let (s, d) = match &header {
        IpHeader::V4(h) => (&h[12..16], &h[16..20]),
        IpHeader::V6(h) => (&h[8..24], &h[24..40]),
    };
    frame.extend_from_slice(&mac_for(d));
    frame.extend_from_slice(&mac_for(s));
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(ip_bytes);
    let checksum = ip::udp_checksum(src.ip(), dst.ip(), &udp, payload);
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    frame.extend_from_slice(&udp);
    frame.extend_from_slice(payload);
    debug_assert!(frame.len() >= ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::{fold, ones_sum};

    fn le32(b: &[u8]) -> u32 {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Checks a one's-complement checksum: the sum over the covered bytes,
    /// checksum included, folds to zero after complementing.
    fn checksum_ok(sum: u32) -> bool {
        fold(sum) == 0
    }

    #[test]
    fn ipv4_frame_layout_and_checksums() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let src: SocketAddr = "192.0.2.1:49152".parse().unwrap();
        let dst: SocketAddr = "192.0.2.2:4791".parse().unwrap();
        let payload = [0x11u8, 0x22, 0x33, 0x44, 0x55];
        let ts = Duration::new(1_700_000_000, 123_456_789);
        w.write_udp(ts, src, dst, 7, &payload).unwrap();
        let file = w.into_inner();

        assert_eq!(&file[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(le32(&file[16..20]), DEFAULT_SNAPLEN);
        assert_eq!(le32(&file[20..24]), LINKTYPE_ETHERNET);
        let rec = &file[24..40];
        assert_eq!(le32(&rec[0..4]), 1_700_000_000);
        assert_eq!(le32(&rec[4..8]), 123_456);
        let frame = &file[40..];
        assert_eq!(le32(&rec[8..12]) as usize, frame.len());
        assert_eq!(le32(&rec[12..16]) as usize, frame.len());
        assert_eq!(frame.len(), 14 + 20 + 8 + payload.len());

        assert_eq!(&frame[0..6], &[0x02, 0x00, 192, 0, 2, 2]);
        assert_eq!(&frame[6..12], &[0x02, 0x00, 192, 0, 2, 1]);
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        let ip = &frame[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 5);
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 7);
        assert_eq!(&ip[6..8], &[0x40, 0x00]);
        assert_eq!(ip[9], 17);
        assert!(checksum_ok(ones_sum(0, ip)), "IPv4 header checksum");
        let udp = &frame[34..];
        assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 49152);
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 4791);
        assert_eq!(u16::from_be_bytes([udp[4], udp[5]]), 8 + 5);
        assert_eq!(&udp[8..], &payload);
        let pseudo = ones_sum(ones_sum(0, &ip[12..20]), udp) + 17 + (8 + 5);
        assert!(checksum_ok(pseudo), "UDP checksum");
    }

    #[test]
    fn ipv6_frame_and_known_checksum() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let ctx = IcrcContext::new(
            "[2001:db8::1]:1024".parse().unwrap(),
            "[2001:db8::2]:4791".parse().unwrap(),
        );
        w.write_roce(Duration::ZERO, &ctx, &[0xab; 16]).unwrap();
        let file = w.into_inner();
        let frame = &file[40..];
        assert_eq!(frame.len(), 14 + 40 + 8 + 16);
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        let ip = &frame[14..54];
        assert_eq!(ip[0], 0x60);
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 24);
        assert_eq!((ip[6], ip[7]), (17, 64));
        let udp = &frame[54..];
        let pseudo = ones_sum(ones_sum(0, &ip[8..40]), udp) + 17 + 24;
        assert!(checksum_ok(pseudo), "UDP checksum");
        // Worked by hand: the 16-bit words of the pseudo-header (addresses, length,
        // protocol) and of the datagram without its checksum sum to 0x5_cfc5, which
        // folds to 0xcfca and complements to 0x3035.
        assert_eq!(&udp[6..8], &[0x30, 0x35]);
    }

    #[test]
    fn mapped_addresses_give_ipv4_and_snaplen_truncates() {
        let mut w = PcapWriter::with_snaplen(Vec::new(), 40).unwrap();
        let src = "[::ffff:10.0.0.1]:5000".parse().unwrap();
        let dst = "[::ffff:10.0.0.2]:4791".parse().unwrap();
        w.write_udp(Duration::ZERO, src, dst, 0, &[0; 64]).unwrap();
        let file = w.into_inner();
        assert_eq!(le32(&file[16..20]), 40);
        assert_eq!(le32(&file[24 + 8..]), 40);
        assert_eq!(le32(&file[24 + 12..]), 14 + 20 + 8 + 64);
        assert_eq!(file.len(), 24 + 16 + 40);
        assert_eq!(&file[40 + 12..40 + 14], &[0x08, 0x00]);
    }

    #[test]
    fn oversized_payload_is_rejected() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let src = "192.0.2.1:1".parse().unwrap();
        let dst = "192.0.2.2:2".parse().unwrap();
        let big = vec![0u8; 65_536];
        let err = w.write_udp(Duration::ZERO, src, dst, 0, &big).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        // IPv4 total length would overflow even though UDP length fits.
        let err = w
            .write_udp(Duration::ZERO, src, dst, 0, &big[..65_520])
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.into_inner().len(), 24, "nothing written on error");
    }
}
