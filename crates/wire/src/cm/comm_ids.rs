//! The body RTU (IBA 12.6.9, Table 111) and DREP (IBA 12.6.11, Table 113) share:
//! the two communication IDs, then 224 bytes of private data, nothing else. Each
//! message module names this layout under its own name ([`super::Rtu`],
//! [`super::Drep`]); the attribute ID in the MAD header tells them apart. Offsets
//! are within the 232-byte message.

use super::put_private_data;
use crate::field::{be32, Field};
use crate::headers::header_view;
use crate::{Error, Result};

/// Bytes of private data an RTU or a DREP carries.
pub const COMM_IDS_PRIVATE_DATA_LEN: usize = 224;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

header_view!(
    /// A view of a message that carries only the two communication IDs and
    /// private data (the 232 bytes after the MAD header).
    CommIds,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> CommIds<T> {
    /// Local communication ID (the sender's).
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote communication ID (the receiver's).
    pub fn remote_comm_id(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Private data (224 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

/// The fields of an RTU or a DREP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommIdsRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data: up to 224 bytes; parsing always yields all 224.
    pub private_data: Vec<u8>,
}

impl CommIdsRepr {
    /// Reads the message.
    pub fn parse<T: AsRef<[u8]>>(m: &CommIds<T>) -> CommIdsRepr {
        CommIdsRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the message into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        b[field::REMOTE_COMM_ID].copy_from_slice(&self.remote_comm_id.to_be_bytes());
        Ok(())
    }
}

/// Checks a sample vector's body against the IDs it carries, then that it emits
/// back to the same bytes and that 225 bytes of private data are refused.
#[cfg(test)]
pub(crate) fn check_vector(body: &[u8], local_comm_id: u32, remote_comm_id: u32) {
    let repr = CommIdsRepr::parse(&CommIds::new_checked(body).unwrap());
    assert_eq!(
        repr,
        CommIdsRepr {
            local_comm_id,
            remote_comm_id,
            private_data: vec![0; COMM_IDS_PRIVATE_DATA_LEN],
        }
    );
    let mut out = [0xa5u8; 232];
    repr.emit(&mut out).unwrap();
    assert_eq!(out[..], body[..]);
    let long = CommIdsRepr {
        private_data: vec![0; COMM_IDS_PRIVATE_DATA_LEN + 1],
        ..repr
    };
    assert_eq!(
        long.emit(&mut out),
        Err(Error::PrivateDataTooLong { max: 224, len: 225 })
    );
}
