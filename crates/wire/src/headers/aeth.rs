//! ACK Extended Transport Header (IBA 9.3.5, 4 bytes): syndrome and MSN.
//!
//! The syndrome's bits 6-5 select ACK (00), RNR NAK (01) or NAK (11); 10 is
//! reserved, as is bit 7 (IBA 9.7.5.2.1, table 44).

use super::header_view;
use crate::field::{be24, put_be24};
use crate::{Error, Result};

header_view!(
    /// A view of an AETH.
    Aeth,
    4
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Message sequence number.
    pub fn msn(&self) -> u32 {
        be24(&self.buffer.as_ref()[1..4])
    }
}

/// NAK codes (IBA 9.7.5.2.1, table 45).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// A packet arrived out of sequence; the NAK's PSN is the one expected.
    PsnSequenceError,
    /// The request is not valid (bad opcode sequence, length, unsupported operation...).
    InvalidRequest,
    /// R_Key, access rights or bounds check failed.
    RemoteAccessError,
    /// The responder could not complete the request for a local reason.
    RemoteOperationalError,
    /// Invalid RD request (reliable datagram; never sent by softverbs).
    InvalidRdRequest,
}

impl NakCode {
    const fn value(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }

    const fn from_value(v: u8) -> Option<NakCode> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

/// What an AETH says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with an end-to-end credit count code (0-30, or 31 =
    /// credits not provided; IBA 9.7.7.2.5).
    Ack {
        /// Credit count code.
        credits: u8,
    },
    /// Receiver not ready: retry after the time named by the 5-bit timer code
    /// (IBA 9.7.5.2.8, table 46).
    RnrNak {
        /// RNR timer code.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl AethSyndrome {
    /// An ACK that gives no credit information (credit code 31, as used when the
    /// responder does not do end-to-end flow control).
    pub const ACK_UNLIMITED: AethSyndrome = AethSyndrome::Ack { credits: 31 };

    /// Decodes a syndrome byte.
    pub fn from_byte(b: u8) -> Result<AethSyndrome> {
        let value = b & 0x1f;
        match b >> 5 {
            0b000 => Ok(AethSyndrome::Ack { credits: value }),
            0b001 => Ok(AethSyndrome::RnrNak { timer: value }),
            0b011 => NakCode::from_value(value)
                .map(AethSyndrome::Nak)
                .ok_or(Error::BadSyndrome(b)),
            _ => Err(Error::BadSyndrome(b)),
        }
    }

    /// Encodes the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code.value(),
        }
    }

    /// Whether this is a positive ACK.
    pub fn is_ack(self) -> bool {
        matches!(self, AethSyndrome::Ack { .. })
    }
}

/// The AETH's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses an AETH, rejecting reserved syndromes.
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<AethRepr> {
        Ok(AethRepr {
            syndrome: AethSyndrome::from_byte(h.syndrome())?,
            msn: h.msn(),
        })
    }

    /// Writes the AETH into the first 4 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..4).ok_or(Error::BufferTooSmall)?;
        b[0] = self.syndrome.to_byte();
        put_be24(&mut b[1..4], self.msn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors() {
        let cases: [([u8; 4], AethRepr); 5] = [
            (
                [0x1f, 0x00, 0x00, 0x07],
                AethRepr {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn: 7,
                },
            ),
            (
                [0x05, 0x12, 0x34, 0x56],
                AethRepr {
                    syndrome: AethSyndrome::Ack { credits: 5 },
                    msn: 0x123456,
                },
            ),
            (
                [0x2e, 0x00, 0x00, 0x01],
                AethRepr {
                    syndrome: AethSyndrome::RnrNak { timer: 14 },
                    msn: 1,
                },
            ),
            (
                [0x60, 0x00, 0x01, 0x00],
                AethRepr {
                    syndrome: AethSyndrome::Nak(NakCode::PsnSequenceError),
                    msn: 256,
                },
            ),
            (
                [0x62, 0xff, 0xff, 0xff],
                AethRepr {
                    syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                    msn: 0xff_ffff,
                },
            ),
        ];
        for (bytes, repr) in cases {
            assert_eq!(
                AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()),
                Ok(repr)
            );
            let mut out = [0u8; 4];
            repr.emit(&mut out).unwrap();
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn every_nak_code_round_trips() {
        for code in [
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ] {
            let s = AethSyndrome::Nak(code);
            assert_eq!(AethSyndrome::from_byte(s.to_byte()), Ok(s));
        }
    }

    #[test]
    fn reserved_syndromes_rejected() {
        for b in [0x40u8, 0x5f, 0x65, 0x7f, 0x80, 0xff] {
            assert_eq!(
                AethSyndrome::from_byte(b),
                Err(Error::BadSyndrome(b)),
                "{b:#x}"
            );
        }
    }
}
