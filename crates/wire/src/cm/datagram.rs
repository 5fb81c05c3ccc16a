//! The RoCEv2 datagram that carries a CM MAD: a UD SEND Only to QP1 (IBA 13.5.1 and
//! Annex A17; CM.md 1.2).
//!
//! ```text
//! BTH (12): opcode 0x64, P_Key 0xFFFF, destination QP 1, PSN (ignored by UD)
//! DETH (8): Q_Key 0x80010000 (the GSI Q_Key), source QP 1
//! MAD (256)
//! ICRC (4)
//! ```
//!
//! GSI always sends from QP1 and replies always go to QP1. A receiver drops anything
//! else that names QP1: rxe rejects other P_Keys and Q_Keys on QP1 the same way.

use super::mad::{Mad, MAD_LEN};
use super::CmMadRepr;
use crate::headers::bth::{BthRepr, DEFAULT_PKEY};
use crate::headers::deth::DethRepr;
use crate::icrc::{self, IcrcContext};
use crate::packet::{PacketRepr, RocePacket, BTH_LEN, ICRC_LEN};
use crate::{Error, Opcode, Psn, Qkey, Qpn, Result};

/// The Q_Key of QP1 (IBA 10.2.4.5: the well-known GSI Q_Key).
pub const GSI_QKEY: Qkey = Qkey(0x8001_0000);
/// Length of the DETH.
const DETH_LEN: usize = 8;
/// Length of a whole CM datagram (the UDP payload): 280 bytes.
pub const CM_DATAGRAM_LEN: usize = BTH_LEN + DETH_LEN + MAD_LEN + ICRC_LEN;

/// Writes a CM datagram carrying the 256-byte `mad`, ICRC included (computed for
/// `ctx`), into `buf`; returns its length ([`CM_DATAGRAM_LEN`]).
pub fn emit_mad(mad: &[u8], psn: Psn, ctx: &IcrcContext, buf: &mut [u8]) -> Result<usize> {
    if mad.len() != MAD_LEN {
        return Err(Error::BadLength {
            expected: MAD_LEN,
            got: mad.len(),
        });
    }
    let mut repr = PacketRepr::new(BthRepr::new(Opcode::UdSendOnly, Qpn::GSI, psn), mad);
    repr.deth = Some(DethRepr {
        qkey: GSI_QKEY,
        src_qp: Qpn::GSI,
    });
    let buf = buf
        .get_mut(..CM_DATAGRAM_LEN)
        .ok_or(Error::BufferTooSmall)?;
    let n = repr.emit(buf)?;
    debug_assert_eq!(n, CM_DATAGRAM_LEN);
    icrc::fill(ctx, buf)?;
    Ok(n)
}

/// Writes a CM datagram carrying `mad` (see [`emit_mad`]).
pub fn emit(mad: &CmMadRepr, psn: Psn, ctx: &IcrcContext, buf: &mut [u8]) -> Result<usize> {
    emit_mad(&mad.to_bytes()?, psn, ctx, buf)
}

/// A checked view of a datagram to QP1.
///
/// [`CmDatagram::new_checked`] requires a well-formed RoCEv2 packet that is a UD
/// SEND Only to QP1 with P_Key 0xFFFF, the GSI Q_Key, source QP 1 and a payload of
/// exactly one MAD; afterwards no accessor panics. It does not check the ICRC (that
/// needs the addresses: see [`CmDatagram::icrc_ok`]) nor the MAD's class.
#[derive(Debug, Clone, Copy)]
pub struct CmDatagram<T: AsRef<[u8]>> {
    packet: RocePacket<T>,
}

impl<T: AsRef<[u8]>> CmDatagram<T> {
    /// Checks `buffer` and wraps it.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = RocePacket::new_checked(buffer)?;
        if packet.opcode() != Opcode::UdSendOnly {
            return Err(Error::NotGsi("opcode is not UD SEND Only"));
        }
        let bth = packet.bth();
        if bth.dest_qp() != Qpn::GSI {
            return Err(Error::NotGsi("destination QP is not 1"));
        }
        if bth.pkey() != DEFAULT_PKEY {
            return Err(Error::NotGsi("P_Key is not 0xFFFF"));
        }
        let deth = packet.deth().ok_or(Error::HeaderMismatch)?;
        if deth.qkey() != GSI_QKEY {
            return Err(Error::NotGsi("Q_Key is not the GSI Q_Key"));
        }
        if deth.src_qp() != Qpn::GSI {
            return Err(Error::NotGsi("source QP is not 1"));
        }
        let got = packet.payload().len();
        if got != MAD_LEN {
            return Err(Error::BadLength {
                expected: MAD_LEN,
                got,
            });
        }
        Ok(CmDatagram { packet })
    }

    /// The PSN (meaningless for UD, but carried).
    pub fn psn(&self) -> Psn {
        self.packet.bth().psn()
    }

    /// The MAD.
    pub fn mad(&self) -> Mad<&[u8]> {
        // The constructor checked the payload is exactly one MAD long.
        Mad::new_checked(self.packet.payload()).unwrap_or_else(|_| unreachable!())
    }

    /// Whether the ICRC is right for a datagram that travelled as `ctx` says.
    pub fn icrc_ok(&self, ctx: &IcrcContext) -> bool {
        icrc::verify(ctx, self.packet.as_bytes())
    }

    /// The whole datagram.
    pub fn as_bytes(&self) -> &[u8] {
        self.packet.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::vectors;

    fn ctx() -> IcrcContext {
        IcrcContext::new(
            "192.0.2.1:49152".parse().unwrap(),
            "192.0.2.2:4791".parse().unwrap(),
        )
    }

    #[test]
    fn build_then_check() {
        let mut buf = [0u8; 300];
        let n = emit_mad(&vectors::REQ, Psn::new(0), &ctx(), &mut buf).unwrap();
        assert_eq!(n, CM_DATAGRAM_LEN);
        assert_eq!(
            &buf[..20],
            &[
                0x64, 0x00, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 0, // BTH
                0x80, 0x01, 0x00, 0x00, 0, 0, 0, 1, // DETH
            ]
        );
        let d = CmDatagram::new_checked(&buf[..n]).unwrap();
        assert_eq!(d.mad().as_bytes(), &vectors::REQ[..]);
        assert!(d.icrc_ok(&ctx()));
        assert!(!d.icrc_ok(&IcrcContext::new(ctx().dst, ctx().src)));
        let repr = CmMadRepr::parse(&d.mad()).unwrap();
        let mut again = [0u8; CM_DATAGRAM_LEN];
        emit(&repr, Psn::new(0), &ctx(), &mut again).unwrap();
        assert_eq!(again[..], buf[..n]);
    }

    #[test]
    fn what_qp1_refuses() {
        let mut good = [0u8; CM_DATAGRAM_LEN];
        emit_mad(&vectors::RTU, Psn::new(3), &ctx(), &mut good).unwrap();
        let check = |patch: &dyn Fn(&mut [u8])| {
            let mut b = good;
            patch(&mut b);
            CmDatagram::new_checked(&b[..]).map(|_| ())
        };
        assert_eq!(check(&|_| {}), Ok(()));
        assert!(check(&|b| b[0] = 0x04).is_err()); // RC SEND Only
        assert_eq!(
            check(&|b| b[0] = 0x65),
            Err(Error::NotGsi("opcode is not UD SEND Only"))
        );
        assert!(check(&|b| b[7] = 2).is_err());
        assert!(check(&|b| b[2] = 0x7f).is_err());
        assert!(check(&|b| b[15] = 1).is_err());
        assert!(check(&|b| b[19] = 5).is_err());
        assert_eq!(
            CmDatagram::new_checked(&good[..CM_DATAGRAM_LEN - 4]).err(),
            Some(Error::BadLength {
                expected: 256,
                got: 252
            })
        );
        assert!(emit_mad(&[0u8; 255], Psn::new(0), &ctx(), &mut [0u8; 300]).is_err());
        assert_eq!(
            emit_mad(&vectors::RTU, Psn::new(0), &ctx(), &mut [0u8; 279]),
            Err(Error::BufferTooSmall)
        );
    }
}
