//! A whole RoCEv2 packet as carried in a UDP datagram: BTH, extension headers,
//! payload, pad, ICRC (Annex A17.4).

use crate::headers::aeth::{Aeth, AethRepr};
use crate::headers::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use crate::headers::atomic_eth::{AtomicEth, AtomicEthRepr};
use crate::headers::bth::{Bth, BthRepr};
use crate::headers::deth::{Deth, DethRepr};
use crate::headers::immdt::{Ieth, ImmDt};
use crate::headers::reth::{Reth, RethRepr};
use crate::opcode::{HeaderSet, Opcode, OpcodeInfo};
use crate::{Error, Result, Rkey};

/// Length of the BTH.
pub const BTH_LEN: usize = 12;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;
/// The most header bytes any packet carries before its payload (BTH + RETH + ImmDt
/// would be 32; BTH + AtomicETH is 40).
pub const MAX_HEADER_LEN: usize = BTH_LEN + 28 + 8;

/// How many pad bytes follow a payload of `len` bytes (IBA 9.2.1: to a multiple of 4).
pub const fn pad_for(len: usize) -> usize {
    (4 - (len % 4)) % 4
}

/// A checked view of a RoCEv2 packet (the UDP payload).
///
/// [`RocePacket::new_checked`] validates the opcode, the transport version, the
/// length of every header the opcode calls for, the pad count (payload and pad must
/// fill whole 4-byte words) and the presence of a payload; afterwards no accessor
/// panics.
#[derive(Debug, Clone, Copy)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Checks `buffer` and wraps it.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < BTH_LEN + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let bth = Bth::new_unchecked(b);
        let opcode = Opcode::from_u8(bth.opcode()).ok_or(Error::UnknownOpcode(bth.opcode()))?;
        if bth.tver() != 0 {
            return Err(Error::BadVersion(bth.tver()));
        }
        let info = opcode.info();
        let fixed = BTH_LEN + info.headers.len() + ICRC_LEN;
        if b.len() < fixed {
            return Err(Error::Truncated);
        }
        let padded = b.len() - fixed;
        if !info.has_payload && padded != 0 {
            return Err(Error::UnexpectedPayload(padded));
        }
        // Payload and pad fill whole 4-byte words (IBA 9.2.1: the pad count aligns
        // the payload to a 4-byte boundary), so the pad count is the only one that
        // does and parsing then re-emitting gives the same bytes.
        if usize::from(bth.pad_count()) > padded || padded % 4 != 0 {
            return Err(Error::BadPadding);
        }
        Ok(RocePacket { buffer, info })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode's table row.
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.info.opcode
    }

    /// The BTH.
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.bytes()[..BTH_LEN])
    }

    fn header(&self, which: HeaderSet, len: usize) -> Option<&[u8]> {
        let offset = BTH_LEN + self.info.headers.offset_of(which)?;
        Some(&self.bytes()[offset..offset + len])
    }

    /// The RETH, if the opcode has one.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.header(HeaderSet::RETH, Reth::<&[u8]>::LEN)
            .map(Reth::new_unchecked)
    }

    /// The AETH, if the opcode has one.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.header(HeaderSet::AETH, Aeth::<&[u8]>::LEN)
            .map(Aeth::new_unchecked)
    }

    /// The AtomicETH, if the opcode has one.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.header(HeaderSet::ATOMIC_ETH, AtomicEth::<&[u8]>::LEN)
            .map(AtomicEth::new_unchecked)
    }

    /// The AtomicAckETH, if the opcode has one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.header(HeaderSet::ATOMIC_ACK_ETH, AtomicAckEth::<&[u8]>::LEN)
            .map(AtomicAckEth::new_unchecked)
    }

    /// The DETH, if the opcode has one.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.header(HeaderSet::DETH, Deth::<&[u8]>::LEN)
            .map(Deth::new_unchecked)
    }

    /// The immediate data header, if the opcode has one.
    pub fn immdt(&self) -> Option<ImmDt<&[u8]>> {
        self.header(HeaderSet::IMMDT, ImmDt::<&[u8]>::LEN)
            .map(ImmDt::new_unchecked)
    }

    /// The IETH, if the opcode has one.
    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.header(HeaderSet::IETH, Ieth::<&[u8]>::LEN)
            .map(Ieth::new_unchecked)
    }

    /// Length of the BTH and extension headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.info.headers.len()
    }

    /// The payload, without its pad bytes.
    pub fn payload(&self) -> &[u8] {
        let b = self.bytes();
        let end = b.len() - ICRC_LEN - usize::from(self.bth().pad_count());
        &b[self.header_len()..end]
    }

    /// The ICRC as carried (little-endian on the wire, like the Ethernet FCS).
    pub fn icrc(&self) -> u32 {
        let b = self.bytes();
        let t = &b[b.len() - ICRC_LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }

    /// The whole packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

/// A RoCEv2 packet's fields: everything but the ICRC, which [`crate::icrc`] adds
/// because it depends on the IP and UDP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// Base transport header. Its `pad_count` is computed on emit.
    pub bth: BthRepr,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// RETH (RDMA WRITE first/only, READ request).
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (responses).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data, as the big-endian word on the wire.
    pub immdt: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<Rkey>,
    /// Payload (without pad).
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// A packet with only a BTH and the given payload; add extension headers by
    /// setting the fields.
    pub fn new(bth: BthRepr, payload: &'a [u8]) -> Self {
        PacketRepr {
            bth,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload,
        }
    }

    /// Parses a checked packet.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &'a RocePacket<&'a T>) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse(&packet.bth())?;
        let aeth = match packet.aeth() {
            Some(h) => Some(AethRepr::parse(&h)?),
            None => None,
        };
        Ok(PacketRepr {
            bth,
            deth: packet.deth().map(|h| DethRepr::parse(&h)),
            reth: packet.reth().map(|h| RethRepr::parse(&h)),
            atomic_eth: packet.atomic_eth().map(|h| AtomicEthRepr::parse(&h)),
            aeth,
            atomic_ack_eth: packet.atomic_ack_eth().map(|h| AtomicAckEthRepr::parse(&h)),
            immdt: packet.immdt().map(|h| h.imm()),
            ieth: packet.ieth().map(|h| h.rkey()),
            payload: packet.payload(),
        })
    }

    /// The set of extension headers present.
    pub fn header_set(&self) -> HeaderSet {
        let mut set = HeaderSet::NONE;
        let present = [
            (self.deth.is_some(), HeaderSet::DETH),
            (self.reth.is_some(), HeaderSet::RETH),
            (self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH),
            (self.aeth.is_some(), HeaderSet::AETH),
            (self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH),
            (self.immdt.is_some(), HeaderSet::IMMDT),
            (self.ieth.is_some(), HeaderSet::IETH),
        ];
        for (is_present, h) in present {
            if is_present {
                set = set.with(h);
            }
        }
        set
    }

    /// Length of BTH and extension headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.header_set().len()
    }

    /// Length of the whole packet including pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        let n = self.payload.len();
        self.header_len() + n + pad_for(n) + ICRC_LEN
    }

    /// Writes BTH and extension headers for a payload of `payload_len` bytes; the
    /// caller then writes the payload at the returned offset and calls [`finish`].
    /// `self.payload` is ignored.
    pub fn emit_headers(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        let info = self.bth.opcode.info();
        if self.header_set() != info.headers {
            return Err(Error::HeaderMismatch);
        }
        if !info.has_payload && payload_len != 0 {
            return Err(Error::UnexpectedPayload(payload_len));
        }
        let header_len = self.header_len();
        if buf.len() < header_len + payload_len + pad_for(payload_len) + ICRC_LEN {
            return Err(Error::BufferTooSmall);
        }
        let bth = BthRepr {
            pad_count: pad_for(payload_len) as u8,
            ..self.bth
        };
        bth.emit(buf)?;
        let mut at = BTH_LEN;
        // Wire order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
        if let Some(h) = &self.deth {
            h.emit(&mut buf[at..])?;
            at += 8;
        }
        if let Some(h) = &self.reth {
            h.emit(&mut buf[at..])?;
            at += 16;
        }
        if let Some(h) = &self.atomic_eth {
            h.emit(&mut buf[at..])?;
            at += 28;
        }
        if let Some(h) = &self.aeth {
            h.emit(&mut buf[at..])?;
            at += 4;
        }
        if let Some(h) = &self.atomic_ack_eth {
            h.emit(&mut buf[at..])?;
            at += 8;
        }
        if let Some(imm) = self.immdt {
            buf[at..at + 4].copy_from_slice(&imm.to_be_bytes());
            at += 4;
        }
        if let Some(rkey) = self.ieth {
            buf[at..at + 4].copy_from_slice(&rkey.0.to_be_bytes());
            at += 4;
        }
        debug_assert_eq!(at, header_len);
        Ok(header_len)
    }

    /// Writes the whole packet, with a zero ICRC placeholder; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let at = self.emit_headers(self.payload.len(), buf)?;
        buf[at..at + self.payload.len()].copy_from_slice(self.payload);
        finish(buf, at, self.payload.len())
    }
}

/// Writes the pad bytes and a zero ICRC placeholder after a payload of
/// `payload_len` bytes that starts at `header_len`; returns the packet length.
pub fn finish(buf: &mut [u8], header_len: usize, payload_len: usize) -> Result<usize> {
    let pad = pad_for(payload_len);
    let start = header_len + payload_len;
    let total = start + pad + ICRC_LEN;
    buf.get_mut(start..total)
        .ok_or(Error::BufferTooSmall)?
        .fill(0);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::aeth::AethSyndrome;
    use crate::{Psn, Qpn};

    #[test]
    fn write_only_with_immediate_round_trip() {
        let mut repr = PacketRepr::new(
            BthRepr::new(Opcode::RcWriteOnlyImm, Qpn::new(0x12), Psn::new(5)),
            b"hello",
        );
        repr.reth = Some(RethRepr {
            va: 0x1000,
            rkey: Rkey(0x99),
            dma_len: 5,
        });
        repr.immdt = Some(0xdead_beef);
        let mut buf = [0u8; 64];
        let len = repr.emit(&mut buf).unwrap();
        assert_eq!(len, 12 + 16 + 4 + 5 + 3 + 4);
        // Pad count 3 in BTH byte 1, pad bytes zero.
        assert_eq!(buf[1] & 0x30, 0x30);
        assert_eq!(&buf[32..37], b"hello");
        assert_eq!(&buf[37..44], &[0; 7]);
        let packet = RocePacket::new_checked(&buf[..len]).unwrap();
        assert_eq!(packet.payload(), b"hello");
        let parsed = PacketRepr::parse(&packet).unwrap();
        assert_eq!(parsed.bth.pad_count, 3);
        assert_eq!(
            PacketRepr {
                bth: BthRepr {
                    pad_count: 0,
                    ..parsed.bth
                },
                ..parsed
            },
            repr
        );
    }

    #[test]
    fn ack_vector() {
        // RC Acknowledge to QP 0x11, PSN 0x000100, ACK with MSN 3, ICRC placeholder.
        let bytes = [
            0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x01, 0x00, // BTH
            0x1f, 0x00, 0x00, 0x03, // AETH
            0x00, 0x00, 0x00, 0x00, // ICRC
        ];
        let packet = RocePacket::new_checked(&bytes[..]).unwrap();
        let repr = PacketRepr::parse(&packet).unwrap();
        assert_eq!(
            repr.aeth,
            Some(AethRepr {
                syndrome: AethSyndrome::ACK_UNLIMITED,
                msn: 3
            })
        );
        assert!(repr.payload.is_empty());
        let mut out = [0xaau8; 20];
        assert_eq!(repr.emit(&mut out), Ok(20));
        assert_eq!(out, bytes);
    }

    #[test]
    fn checked_constructor_rejects() {
        assert_eq!(
            RocePacket::new_checked(&[0u8; 15][..]).err(),
            Some(Error::Truncated)
        );
        // READ request missing part of its RETH.
        let mut b = [0u8; 12 + 15 + 4];
        b[0] = Opcode::RcReadRequest.value();
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::Truncated)
        );
        // ACK with trailing bytes.
        let mut b = [0u8; 12 + 4 + 4 + 4];
        b[0] = Opcode::RcAcknowledge.value();
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::UnexpectedPayload(4))
        );
        // Pad count larger than the payload.
        let mut b = [0u8; 12 + 2 + 4];
        b[0] = Opcode::RcSendOnly.value();
        b[1] = 0x30;
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::BadPadding)
        );
        // Payload plus pad not a whole number of words: 5 bytes with pad count 0,
        // 6 bytes with pad count 2 (8 would be a 6-byte payload padded by 2).
        let mut b = [0u8; 12 + 5 + 4];
        b[0] = Opcode::RcSendOnly.value();
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::BadPadding)
        );
        let mut b = [0u8; 12 + 6 + 4];
        b[0] = Opcode::RcSendOnly.value();
        b[1] = 0x20;
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::BadPadding)
        );
        let mut b = [0u8; 12 + 8 + 4];
        b[0] = Opcode::RcSendOnly.value();
        b[1] = 0x20;
        let p = RocePacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload().len(), 6);
        // Unknown opcode.
        let mut b = [0u8; 16];
        b[0] = 0x1f;
        assert_eq!(
            RocePacket::new_checked(&b[..]).err(),
            Some(Error::UnknownOpcode(0x1f))
        );
    }

    #[test]
    fn emit_rejects_mismatched_headers() {
        let repr = PacketRepr::new(
            BthRepr::new(Opcode::RcWriteOnly, Qpn::new(1), Psn::new(0)),
            b"x",
        );
        assert_eq!(repr.emit(&mut [0u8; 64]), Err(Error::HeaderMismatch));
        let mut small = [0u8; 10];
        let repr = PacketRepr::new(
            BthRepr::new(Opcode::RcSendOnly, Qpn::new(1), Psn::new(0)),
            b"x",
        );
        assert_eq!(repr.emit(&mut small), Err(Error::BufferTooSmall));
    }
}
