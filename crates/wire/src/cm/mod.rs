//! Communication Management MADs (IBA Vol 1 chapter 12, formats in 12.6 and 12.11):
//! the messages that set up, refuse and tear down connections, and that resolve UD
//! service IDs, as they travel in a 256-byte MAD (IBA 13.4) to QP1.
//!
//! Each message has a view over its 232-byte body (`Req<T>`, `Rep<T>`, ...) whose
//! `new_checked` checks the length once, and a `...Repr` that parses and emits it.
//! [`CmMadRepr`] is a whole CM MAD: header fields plus one [`CmMessage`].
//! [`datagram`] wraps a MAD in the RoCEv2 UD packet that carries it (BTH + DETH +
//! MAD + ICRC). [`private_data`] is rdma_cm's 36-byte IP header inside REQ and
//! SIDR_REQ private data; [`service_id`] maps rdma_cm port spaces and ports to
//! service IDs.
//!
//! Field layouts follow IBA Tables 106-120 as the Linux kernel transcribes them
//! (`include/rdma/ibta_vol1_c12.h`), including the ECE vendor ID bytes Linux 5.9
//! put in reserved fields. LAP and APR (path migration) are not supported: Linux
//! ignores them on RoCE ports too.

pub mod comm_ids;
pub mod datagram;
pub mod drep;
pub mod dreq;
pub mod mad;
pub mod mra;
pub mod private_data;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod service_id;
pub mod sidr;
#[cfg(test)]
pub(crate) mod vectors;

use crate::{Error, Result};
use mad::{Mad, MadHeaderRepr, CM_MESSAGE_LEN, MAD_HEADER_LEN, MAD_LEN};

pub use drep::{Drep, DrepRepr};
pub use dreq::{Dreq, DreqRepr};
pub use mra::{Mra, MraRepr, MraTarget};
pub use private_data::{CmaHeader, CmaHeaderRepr, CMA_HEADER_LEN};
pub use rej::{Rej, RejReason, RejRepr, RejectedMessage};
pub use rep::{Rep, RepRepr};
pub use req::{PathRepr, Req, ReqRepr};
pub use rtu::{Rtu, RtuRepr};
pub use service_id::{PortSpace, ServiceId};
pub use sidr::{SidrRep, SidrRepRepr, SidrReq, SidrReqRepr, SidrStatus};

/// CM attribute IDs: the message type of a CM MAD (IBA Table 104).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttributeId {
    /// ConnectRequest.
    Req,
    /// MsgRcptAck.
    Mra,
    /// ConnectReject.
    Rej,
    /// ConnectReply.
    Rep,
    /// ReadyToUse.
    Rtu,
    /// DisconnectRequest.
    Dreq,
    /// DisconnectReply.
    Drep,
    /// ServiceIDResReq.
    SidrReq,
    /// ServiceIDResReqResp.
    SidrRep,
    /// LoadAlternatePath (not supported).
    Lap,
    /// AlternatePathResponse (not supported).
    Apr,
}

impl AttributeId {
    /// Every CM attribute, in numeric order.
    pub const ALL: [AttributeId; 11] = [
        AttributeId::Req,
        AttributeId::Mra,
        AttributeId::Rej,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
        AttributeId::SidrReq,
        AttributeId::SidrRep,
        AttributeId::Lap,
        AttributeId::Apr,
    ];

    /// The attribute's number.
    pub const fn value(self) -> u16 {
        match self {
            AttributeId::Req => 0x0010,
            AttributeId::Mra => 0x0011,
            AttributeId::Rej => 0x0012,
            AttributeId::Rep => 0x0013,
            AttributeId::Rtu => 0x0014,
            AttributeId::Dreq => 0x0015,
            AttributeId::Drep => 0x0016,
            AttributeId::SidrReq => 0x0017,
            AttributeId::SidrRep => 0x0018,
            AttributeId::Lap => 0x0019,
            AttributeId::Apr => 0x001a,
        }
    }

    /// The attribute a number names.
    pub fn from_value(v: u16) -> Option<AttributeId> {
        AttributeId::ALL.into_iter().find(|a| a.value() == v)
    }
}

/// Copies `data` into a private-data field, zero-filling the rest.
pub(crate) fn put_private_data(field: &mut [u8], data: &[u8]) -> Result<()> {
    if data.len() > field.len() {
        return Err(Error::PrivateDataTooLong {
            max: field.len(),
            len: data.len(),
        });
    }
    field[..data.len()].copy_from_slice(data);
    field[data.len()..].fill(0);
    Ok(())
}

/// One CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The message's attribute ID.
    pub fn attribute_id(&self) -> AttributeId {
        match self {
            CmMessage::Req(_) => AttributeId::Req,
            CmMessage::Mra(_) => AttributeId::Mra,
            CmMessage::Rej(_) => AttributeId::Rej,
            CmMessage::Rep(_) => AttributeId::Rep,
            CmMessage::Rtu(_) => AttributeId::Rtu,
            CmMessage::Dreq(_) => AttributeId::Dreq,
            CmMessage::Drep(_) => AttributeId::Drep,
            CmMessage::SidrReq(_) => AttributeId::SidrReq,
            CmMessage::SidrRep(_) => AttributeId::SidrRep,
        }
    }

    /// Parses the 232-byte body of a message of type `attribute`.
    pub fn parse(attribute: AttributeId, body: &[u8]) -> Result<CmMessage> {
        Ok(match attribute {
            AttributeId::Req => CmMessage::Req(ReqRepr::parse(&Req::new_checked(body)?)),
            AttributeId::Mra => CmMessage::Mra(MraRepr::parse(&Mra::new_checked(body)?)?),
            AttributeId::Rej => CmMessage::Rej(RejRepr::parse(&Rej::new_checked(body)?)?),
            AttributeId::Rep => CmMessage::Rep(RepRepr::parse(&Rep::new_checked(body)?)),
            AttributeId::Rtu => CmMessage::Rtu(RtuRepr::parse(&Rtu::new_checked(body)?)),
            AttributeId::Dreq => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_checked(body)?)),
            AttributeId::Drep => CmMessage::Drep(DrepRepr::parse(&Drep::new_checked(body)?)),
            AttributeId::SidrReq => {
                CmMessage::SidrReq(SidrReqRepr::parse(&SidrReq::new_checked(body)?))
            }
            AttributeId::SidrRep => {
                CmMessage::SidrRep(SidrRepRepr::parse(&SidrRep::new_checked(body)?)?)
            }
            AttributeId::Lap | AttributeId::Apr => {
                return Err(Error::UnknownAttribute(attribute.value()))
            }
        })
    }

    /// Writes the message body into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        match self {
            CmMessage::Req(m) => m.emit(buf),
            CmMessage::Mra(m) => m.emit(buf),
            CmMessage::Rej(m) => m.emit(buf),
            CmMessage::Rep(m) => m.emit(buf),
            CmMessage::Rtu(m) => m.emit(buf),
            CmMessage::Dreq(m) => m.emit(buf),
            CmMessage::Drep(m) => m.emit(buf),
            CmMessage::SidrReq(m) => m.emit(buf),
            CmMessage::SidrRep(m) => m.emit(buf),
        }
    }
}

/// A whole CM MAD: the header fields that vary, and the message.
///
/// The fixed header fields (base version 1, class CM, class version 2, method SEND,
/// status 0) are checked on parse and written on emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMadRepr {
    /// Transaction ID: a fresh one for REQ, DREQ and SIDR_REQ; replies reuse the ID
    /// of the message they answer (CM.md 1.1).
    pub transaction_id: u64,
    /// Attribute modifier (ECE options on Linux; 0 otherwise).
    pub attribute_modifier: u32,
    /// The message.
    pub message: CmMessage,
}

impl CmMadRepr {
    /// Parses a checked MAD: it must be a CM MAD (base version 1, class 0x07, class
    /// version 2, method SEND) of a supported attribute.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> Result<CmMadRepr> {
        if mad.base_version() != mad::BASE_VERSION {
            return Err(Error::InvalidField("MAD base version"));
        }
        if mad.mgmt_class() != mad::MGMT_CLASS_CM {
            return Err(Error::InvalidField("MAD management class"));
        }
        if mad.class_version() != mad::CM_CLASS_VERSION {
            return Err(Error::InvalidField("CM class version"));
        }
        if mad.method() != mad::METHOD_SEND {
            return Err(Error::InvalidField("CM method"));
        }
        let attribute = AttributeId::from_value(mad.attribute_id())
            .ok_or(Error::UnknownAttribute(mad.attribute_id()))?;
        Ok(CmMadRepr {
            transaction_id: mad.transaction_id(),
            attribute_modifier: mad.attribute_modifier(),
            message: CmMessage::parse(attribute, mad.message())?,
        })
    }

    /// Parses the bytes of a MAD.
    pub fn parse_bytes(bytes: &[u8]) -> Result<CmMadRepr> {
        CmMadRepr::parse(&Mad::new_checked(bytes)?)
    }

    /// Writes the 256-byte MAD into the first [`MAD_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..MAD_LEN).ok_or(Error::BufferTooSmall)?;
        MadHeaderRepr::cm(
            self.message.attribute_id().value(),
            self.transaction_id,
            self.attribute_modifier,
        )
        .emit(b)?;
        self.message.emit(&mut b[MAD_HEADER_LEN..])?;
        debug_assert_eq!(b.len() - MAD_HEADER_LEN, CM_MESSAGE_LEN);
        Ok(())
    }

    /// The MAD as a fresh 256-byte array.
    pub fn to_bytes(&self) -> Result<[u8; MAD_LEN]> {
        let mut out = [0u8; MAD_LEN];
        self.emit(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sample_parses_and_re_emits_byte_for_byte() {
        let samples: [(&[u8; 256], AttributeId); 9] = [
            (&vectors::REQ, AttributeId::Req),
            (&vectors::REP, AttributeId::Rep),
            (&vectors::RTU, AttributeId::Rtu),
            (&vectors::REJ, AttributeId::Rej),
            (&vectors::MRA, AttributeId::Mra),
            (&vectors::DREQ, AttributeId::Dreq),
            (&vectors::DREP, AttributeId::Drep),
            (&vectors::SIDR_REQ, AttributeId::SidrReq),
            (&vectors::SIDR_REP, AttributeId::SidrRep),
        ];
        for (bytes, attribute) in samples {
            let repr = CmMadRepr::parse_bytes(bytes).unwrap();
            assert_eq!(repr.message.attribute_id(), attribute);
            assert_eq!(&repr.to_bytes().unwrap(), bytes, "{attribute:?}");
        }
    }

    #[test]
    fn non_cm_mads_are_refused() {
        let mut b = vectors::RTU;
        b[1] = 0x04; // PerfMgmt
        assert_eq!(
            CmMadRepr::parse_bytes(&b),
            Err(Error::InvalidField("MAD management class"))
        );
        let mut b = vectors::RTU;
        b[2] = 1;
        assert!(CmMadRepr::parse_bytes(&b).is_err());
        let mut b = vectors::RTU;
        b[3] = 0x81; // GetResp
        assert!(CmMadRepr::parse_bytes(&b).is_err());
        let mut b = vectors::RTU;
        b[0] = 2;
        assert!(CmMadRepr::parse_bytes(&b).is_err());
        for (attr, id) in [(0x19, 0x19), (0x1a, 0x1a), (0x42, 0x42)] {
            let mut b = vectors::RTU;
            b[17] = attr;
            assert_eq!(CmMadRepr::parse_bytes(&b), Err(Error::UnknownAttribute(id)));
        }
        assert!(AttributeId::ALL
            .iter()
            .all(|a| AttributeId::from_value(a.value()) == Some(*a)));
    }
}
