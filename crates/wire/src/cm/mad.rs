//! The MAD common header (IBA 13.4.3, 24 bytes) and the 256-byte MAD that carries a
//! CM message (IBA 16.7.1 "CMFormat": the header, then 232 bytes of message).
//!
//! ```text
//!  0               1               2               3
//! | BaseVersion   | MgmtClass     | ClassVersion  |R| Method      |
//! | Status                        | ClassSpecific                 |
//! | TransactionID (64 bits)                                       |
//! |                                                               |
//! | AttributeID                   | Reserved                      |
//! | AttributeModifier                                             |
//! ```

use crate::field::{be16, be32, be64};
use crate::{Error, Result};

/// Length of a MAD: every CM MAD is exactly this long (IBA 13.4.1).
pub const MAD_LEN: usize = 256;
/// Length of the MAD common header.
pub const MAD_HEADER_LEN: usize = 24;
/// Length of the CM message that follows the header.
pub const CM_MESSAGE_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// BaseVersion of every MAD (IBA 13.4.3).
pub const BASE_VERSION: u8 = 1;
/// MgmtClass of Communication Management (IBA 13.4.4).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of the CM class that Linux (`IB_CM_CLASS_VERSION`) and softverbs speak.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method SEND: every CM message uses it (IBA 12.6, Table 104), so the MAD layer does
/// no request/response matching.
pub const METHOD_SEND: u8 = 0x03;

mod field {
    use crate::field::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TRANSACTION_ID: Field = 8..16;
    pub const ATTRIBUTE_ID: Field = 16..18;
    pub const RESERVED: Field = 18..20;
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
}

/// A checked view of a whole 256-byte MAD.
///
/// [`Mad::new_checked`] requires exactly [`MAD_LEN`] bytes; afterwards no accessor
/// panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wraps `buffer` after checking it is exactly one MAD long.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let got = buffer.as_ref().len();
        if got != MAD_LEN {
            return Err(Error::BadLength {
                expected: MAD_LEN,
                got,
            });
        }
        Ok(Mad { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// BaseVersion.
    pub fn base_version(&self) -> u8 {
        self.b()[field::BASE_VERSION]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.b()[field::MGMT_CLASS]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.b()[field::CLASS_VERSION]
    }
    /// The method byte, response bit (bit 7) included.
    pub fn method(&self) -> u8 {
        self.b()[field::METHOD]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        be16(&self.b()[field::STATUS])
    }
    /// Class-specific field.
    pub fn class_specific(&self) -> u16 {
        be16(&self.b()[field::CLASS_SPECIFIC])
    }
    /// Transaction ID.
    pub fn transaction_id(&self) -> u64 {
        be64(&self.b()[field::TRANSACTION_ID])
    }
    /// Attribute ID: for the CM class, the message type.
    pub fn attribute_id(&self) -> u16 {
        be16(&self.b()[field::ATTRIBUTE_ID])
    }
    /// The reserved 16 bits after the attribute ID.
    pub fn reserved(&self) -> u16 {
        be16(&self.b()[field::RESERVED])
    }
    /// Attribute modifier (Linux >= 5.9 puts ECE options here in REQ, REP and
    /// SIDR_REP; zero otherwise).
    pub fn attribute_modifier(&self) -> u32 {
        be32(&self.b()[field::ATTRIBUTE_MODIFIER])
    }
    /// The 232 bytes after the header: the CM message.
    pub fn message(&self) -> &[u8] {
        &self.b()[MAD_HEADER_LEN..]
    }
    /// The whole MAD.
    pub fn as_bytes(&self) -> &[u8] {
        self.b()
    }
}

/// The fields of a MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method, response bit included.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// The header of a CM message of type `attribute_id`: base version 1, class CM,
    /// class version 2, method SEND, status 0.
    pub fn cm(attribute_id: u16, transaction_id: u64, attribute_modifier: u32) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier,
        }
    }

    /// Reads the header of a MAD.
    pub fn parse<T: AsRef<[u8]>>(mad: &Mad<T>) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            transaction_id: mad.transaction_id(),
            attribute_id: mad.attribute_id(),
            attribute_modifier: mad.attribute_modifier(),
        }
    }

    /// Writes the header into the first 24 bytes of `buf` (reserved bits zero).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf.get_mut(..MAD_HEADER_LEN).ok_or(Error::BufferTooSmall)?;
        b[field::BASE_VERSION] = self.base_version;
        b[field::MGMT_CLASS] = self.mgmt_class;
        b[field::CLASS_VERSION] = self.class_version;
        b[field::METHOD] = self.method;
        b[field::STATUS].copy_from_slice(&self.status.to_be_bytes());
        b[field::CLASS_SPECIFIC].copy_from_slice(&self.class_specific.to_be_bytes());
        b[field::TRANSACTION_ID].copy_from_slice(&self.transaction_id.to_be_bytes());
        b[field::ATTRIBUTE_ID].copy_from_slice(&self.attribute_id.to_be_bytes());
        b[field::RESERVED].fill(0);
        b[field::ATTRIBUTE_MODIFIER].copy_from_slice(&self.attribute_modifier.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::vectors;

    #[test]
    fn header_of_the_sample_req() {
        let mad = Mad::new_checked(&vectors::REQ[..]).unwrap();
        let h = MadHeaderRepr::parse(&mad);
        assert_eq!(h, MadHeaderRepr::cm(0x0010, 0x0000_1234_1122_3344, 0));
        let mut out = [0xaau8; MAD_HEADER_LEN];
        h.emit(&mut out).unwrap();
        assert_eq!(out[..], vectors::REQ[..MAD_HEADER_LEN]);
        assert_eq!(mad.message().len(), CM_MESSAGE_LEN);
    }

    #[test]
    fn only_whole_mads_are_accepted() {
        assert_eq!(
            Mad::new_checked(&[0u8; 255][..]),
            Err(Error::BadLength {
                expected: 256,
                got: 255
            })
        );
        assert!(Mad::new_checked(&[0u8; 257][..]).is_err());
        assert_eq!(
            MadHeaderRepr::cm(0x10, 0, 0).emit(&mut [0u8; 23]),
            Err(Error::BufferTooSmall)
        );
    }
}
