//! Base Transport Header (IBA 9.2, 12 bytes).
//!
//! ```text
//!  0               1               2               3
//! | OpCode        |S|M|Pad|TVer   | P_Key                         |
//! |F|B| Resv6     | Destination QP                                |
//! |A| Resv7       | PSN                                           |
//! ```

use super::header_view;
use crate::field::{be16, be24, put_be24, Field};
use crate::{Error, Opcode, Psn, Qpn, Result};

mod field {
    use super::Field;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    pub const FECN_BECN: usize = 4;
    pub const DEST_QP: Field = 5..8;
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

header_view!(
    /// A view of a BTH.
    Bth,
    12
);

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Raw opcode byte.
    pub fn opcode(&self) -> u8 {
        self.b()[field::OPCODE]
    }
    /// Solicited event bit.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// Migration request bit.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// Pad count: bytes of padding after the payload (0-3).
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0xf
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(&self.b()[field::PKEY])
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x40 != 0
    }
    /// Destination QP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(be24(&self.b()[field::DEST_QP]))
    }
    /// Acknowledge request bit.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_REQ] & 0x80 != 0
    }
    /// The seven reserved bits after AckReq (Resv7). IBA transmits them as zero
    /// and receivers ignore them; softverbs peers use them to negotiate selective
    /// repeat with each other (see the engine's `qp/selective.rs`).
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK_REQ] & 0x7f
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(&self.b()[field::PSN]))
    }
}

/// The BTH's fields, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request (APM state; softverbs sends it set, as RoCE devices do).
    pub mig_req: bool,
    /// Pad count (0-3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The reserved bits after AckReq (7 bits; zero in plain IBA packets).
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

/// The default partition key (IBA 10.9.1.2).
pub const DEFAULT_PKEY: u16 = 0xffff;

impl BthRepr {
    /// A BTH with the given opcode, destination and PSN, the default P_Key and every
    /// flag clear.
    pub fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses a BTH, rejecting unknown opcodes and transport versions other than 0.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        let opcode = Opcode::from_u8(bth.opcode()).ok_or(Error::UnknownOpcode(bth.opcode()))?;
        if bth.tver() != 0 {
            return Err(Error::BadVersion(bth.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            resv7: bth.resv7(),
            psn: bth.psn(),
        })
    }

    /// Writes the BTH into the first 12 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..Bth::<&[u8]>::LEN)
            .ok_or(Error::BufferTooSmall)?;
        b[field::OPCODE] = self.opcode.value();
        b[field::FLAGS] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 0x3) << 4);
        b[field::PKEY].copy_from_slice(&self.pkey.to_be_bytes());
        b[field::FECN_BECN] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        put_be24(&mut b[field::DEST_QP], self.dest_qp.value());
        b[field::ACK_REQ] = (u8::from(self.ack_req) << 7) | (self.resv7 & 0x7f);
        put_be24(&mut b[field::PSN], self.psn.value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND Only, SE set, pad 2, P_Key 0xffff, dest QP 0x000011, AckReq, PSN 0x123456.
    const VECTOR: [u8; 12] = [
        0x04, 0xa0, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56,
    ];

    fn repr() -> BthRepr {
        BthRepr {
            solicited: true,
            pad_count: 2,
            ack_req: true,
            ..BthRepr::new(Opcode::RcSendOnly, Qpn::new(0x11), Psn::new(0x123456))
        }
    }

    #[test]
    fn parses_vector() {
        let bth = Bth::new_checked(&VECTOR[..]).unwrap();
        assert_eq!(bth.opcode(), 0x04);
        assert!(bth.solicited() && !bth.mig_req() && bth.ack_req());
        assert_eq!(bth.pad_count(), 2);
        assert_eq!(bth.tver(), 0);
        assert_eq!(bth.pkey(), 0xffff);
        assert_eq!(bth.dest_qp(), Qpn::new(0x11));
        assert_eq!(bth.psn(), Psn::new(0x123456));
        assert_eq!(BthRepr::parse(&bth).unwrap(), repr());
    }

    #[test]
    fn emits_vector() {
        let mut buf = [0u8; 12];
        repr().emit(&mut buf).unwrap();
        assert_eq!(buf, VECTOR);
    }

    #[test]
    fn rejects_short_unknown_and_versioned() {
        assert_eq!(Bth::new_checked(&VECTOR[..11]), Err(Error::Truncated));
        let mut v = VECTOR;
        v[0] = 0x15; // reserved RC opcode
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&v[..])),
            Err(Error::UnknownOpcode(0x15))
        );
        let mut v = VECTOR;
        v[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&v[..])),
            Err(Error::BadVersion(1))
        );
    }

    #[test]
    fn reserved_bits_after_ack_req() {
        let mut v = VECTOR;
        v[8] |= 0x25;
        let bth = Bth::new_checked(&v[..]).unwrap();
        assert!(bth.ack_req());
        assert_eq!(bth.resv7(), 0x25);
        let r = BthRepr::parse(&bth).unwrap();
        assert_eq!(r.resv7, 0x25);
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, v);
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&VECTOR[..]).unwrap())
                .unwrap()
                .resv7,
            0
        );
    }

    #[test]
    fn ecn_bits() {
        let mut v = VECTOR;
        v[4] = 0xc0;
        let bth = Bth::new_unchecked(&v[..]);
        assert!(bth.fecn() && bth.becn());
        assert_eq!(bth.dest_qp(), Qpn::new(0x11));
    }
}
