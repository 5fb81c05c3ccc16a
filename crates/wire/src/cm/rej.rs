//! REJ, ConnectReject (IBA 12.6.7, Table 108; attribute 0x0012): a REQ or REP is
//! refused, with a reason (Table 109) and optional additional reject information.
//! Offsets are within the 232-byte message.

use super::put_private_data;
use crate::field::{be16, be32, Field};
use crate::headers::header_view;
use crate::{Error, Result};
use core::fmt;

/// Bytes of private data a REJ carries.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// The most bytes of additional reject information (ARI).
pub const REJ_ARI_LEN: usize = 72;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message REJected (7..6), reserved (5..0).
    pub const MESSAGE_REJECTED: usize = 8;
    /// Reject info length (7..1), reserved (0).
    pub const ARI_LENGTH: usize = 9;
    pub const REASON: Field = 10..12;
    pub const ARI: Field = 12..84;
    pub const PRIVATE_DATA: Field = 84..232;
}

/// The message a REJ refuses (2-bit field; 3 is reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectedMessage {
    /// A REQ.
    Req,
    /// A REP.
    Rep,
    /// No message in particular (e.g. a stale connection found some other way).
    Other,
}

impl RejectedMessage {
    /// The field's value.
    pub const fn value(self) -> u8 {
        match self {
            RejectedMessage::Req => 0,
            RejectedMessage::Rep => 1,
            RejectedMessage::Other => 2,
        }
    }

    /// The message a field value names, if not reserved.
    pub const fn from_value(v: u8) -> Option<Self> {
        match v {
            0 => Some(RejectedMessage::Req),
            1 => Some(RejectedMessage::Rep),
            2 => Some(RejectedMessage::Other),
            _ => None,
        }
    }
}

/// A REJ reason code (IBA Table 109). Unknown codes are kept as they are.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejReason(pub u16);

impl RejReason {
    /// 1: no QP available.
    pub const NO_QP: RejReason = RejReason(1);
    /// 2: no EEC available.
    pub const NO_EEC: RejReason = RejReason(2);
    /// 3: no resources available.
    pub const NO_RESOURCES: RejReason = RejReason(3);
    /// 4: timeout; the ARI holds the sender's CA GUID.
    pub const TIMEOUT: RejReason = RejReason(4);
    /// 5: unsupported request.
    pub const UNSUPPORTED_REQUEST: RejReason = RejReason(5);
    /// 6: invalid communication ID.
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    /// 7: invalid communication instance.
    pub const INVALID_COMM_INSTANCE: RejReason = RejReason(7);
    /// 8: invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    /// 9: invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    /// 10: stale connection.
    pub const STALE_CONNECTION: RejReason = RejReason(10);
    /// 11: RDC does not exist.
    pub const RDC_NOT_EXIST: RejReason = RejReason(11);
    /// 12: invalid GID; the ARI holds a GID.
    pub const INVALID_GID: RejReason = RejReason(12);
    /// 26: invalid MTU.
    pub const INVALID_MTU: RejReason = RejReason(26);
    /// 27: insufficient responder resources.
    pub const INSUFFICIENT_RESPONDER_RESOURCES: RejReason = RejReason(27);
    /// 28: consumer defined (rdma_reject, and rdma_cm's own refusals).
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    /// 29: invalid RNR retry count.
    pub const INVALID_RNR_RETRY: RejReason = RejReason(29);
    /// 30: duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: RejReason = RejReason(30);
    /// 31: invalid class version.
    pub const INVALID_CLASS_VERSION: RejReason = RejReason(31);
    /// 32: invalid flow label.
    pub const INVALID_FLOW_LABEL: RejReason = RejReason(32);
    /// 35: vendor option not supported (ECE).
    pub const VENDOR_OPTION_NOT_SUPPORTED: RejReason = RejReason(35);
}

impl fmt::Debug for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RejReason({})", self.0)
    }
}

impl fmt::Display for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid communication ID",
            7 => "invalid communication instance",
            8 => "invalid service ID",
            9 => "invalid transport type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "invalid GID",
            26 => "invalid MTU",
            27 => "insufficient responder resources",
            28 => "consumer defined",
            29 => "invalid RNR retry count",
            30 => "duplicate local communication ID",
            31 => "invalid class version",
            32 => "invalid flow label",
            35 => "vendor option not supported",
            _ => "other",
        };
        write!(f, "{} ({name})", self.0)
    }
}

header_view!(
    /// A view of a REJ message (the 232 bytes after the MAD header).
    Rej,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Rej<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Local communication ID (the rejecter's; 0 if it has none yet).
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.b()[field::LOCAL_COMM_ID])
    }
    /// Remote communication ID (the local ID of the message being rejected).
    pub fn remote_comm_id(&self) -> u32 {
        be32(&self.b()[field::REMOTE_COMM_ID])
    }
    /// Message REJected, as the raw 2-bit value.
    pub fn message_rejected(&self) -> u8 {
        self.b()[field::MESSAGE_REJECTED] >> 6
    }
    /// Reject info length (7 bits): how many ARI bytes are meaningful.
    pub fn ari_length(&self) -> u8 {
        self.b()[field::ARI_LENGTH] >> 1
    }
    /// Reason.
    pub fn reason(&self) -> RejReason {
        RejReason(be16(&self.b()[field::REASON]))
    }
    /// The whole 72-byte ARI field.
    pub fn ari_field(&self) -> &[u8] {
        &self.b()[field::ARI]
    }
    /// Private data (148 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[field::PRIVATE_DATA]
    }
}

/// The fields of a REJ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message refused.
    pub message_rejected: RejectedMessage,
    /// Reason.
    pub reason: RejReason,
    /// Additional reject information (at most 72 bytes); its length is the reject
    /// info length.
    pub ari: Vec<u8>,
    /// Private data: up to 148 bytes; parsing always yields all 148.
    pub private_data: Vec<u8>,
}

impl RejRepr {
    /// Reads a REJ; a reserved "message REJected" value or a reject info length
    /// beyond 72 is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &Rej<T>) -> Result<RejRepr> {
        let ari_len = usize::from(m.ari_length());
        if ari_len > REJ_ARI_LEN {
            return Err(Error::InvalidField("REJ reject info length"));
        }
        Ok(RejRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            message_rejected: RejectedMessage::from_value(m.message_rejected())
                .ok_or(Error::InvalidField("REJ message REJected"))?,
            reason: m.reason(),
            ari: m.ari_field()[..ari_len].to_vec(),
            private_data: m.private_data().to_vec(),
        })
    }

    /// Writes the REJ into the first 232 bytes of `buf` (ARI and private data
    /// zero-padded).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.ari.len() > REJ_ARI_LEN {
            return Err(Error::InvalidField("REJ reject info length"));
        }
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        b[field::REMOTE_COMM_ID].copy_from_slice(&self.remote_comm_id.to_be_bytes());
        b[field::MESSAGE_REJECTED] = self.message_rejected.value() << 6;
        b[field::ARI_LENGTH] = (self.ari.len() as u8) << 1;
        b[field::REASON].copy_from_slice(&self.reason.0.to_be_bytes());
        let ari = &mut b[field::ARI];
        ari.fill(0);
        ari[..self.ari.len()].copy_from_slice(&self.ari);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    #[test]
    fn sample_vector() {
        let body = &vectors::REJ[MAD_HEADER_LEN..];
        let repr = RejRepr::parse(&Rej::new_checked(body).unwrap()).unwrap();
        let mut private_data = vec![0u8; 148];
        private_data[..11].copy_from_slice(b"rej-private");
        assert_eq!(
            repr,
            RejRepr {
                local_comm_id: 0,
                remote_comm_id: 0x1122_3344,
                message_rejected: RejectedMessage::Req,
                reason: RejReason::CONSUMER_DEFINED,
                ari: Vec::new(),
                private_data,
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn ari_carries_its_length() {
        let r = RejRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: RejectedMessage::Rep,
            reason: RejReason::TIMEOUT,
            ari: 0x0200_c0ff_fe00_0201u64.to_be_bytes().to_vec(),
            private_data: vec![0; 148],
        };
        let mut out = [0u8; 232];
        r.emit(&mut out).unwrap();
        assert_eq!(out[8], 0x40);
        assert_eq!(out[9], 16);
        assert_eq!(&out[10..12], &[0, 4]);
        assert_eq!(RejRepr::parse(&Rej::new_checked(&out[..]).unwrap()), Ok(r));
        out[9] = 73 << 1;
        assert_eq!(
            RejRepr::parse(&Rej::new_checked(&out[..]).unwrap()),
            Err(Error::InvalidField("REJ reject info length"))
        );
        out[9] = 0;
        out[8] = 0xc0;
        assert!(RejRepr::parse(&Rej::new_checked(&out[..]).unwrap()).is_err());
        assert_eq!(
            RejReason::STALE_CONNECTION.to_string(),
            "10 (stale connection)"
        );
    }
}
