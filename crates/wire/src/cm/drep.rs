//! DREP, DisconnectReply (IBA 12.6.11, Table 113; attribute 0x0016): answers a DREQ; both sides then wait out the timewait. Offsets are within
//! the 232-byte message.

use super::put_private_data;
use crate::field::{be32, Field};
use crate::headers::header_view;
use crate::{Error, Result};

/// Bytes of private data a DREP carries.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

header_view!(
    /// A view of a DREP message (the 232 bytes after the MAD header).
    Drep,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Drep<T> {
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

/// The fields of a DREP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data: up to 224 bytes; parsing always yields all 224.
    pub private_data: Vec<u8>,
}

impl DrepRepr {
    /// Reads a DREP.
    pub fn parse<T: AsRef<[u8]>>(m: &Drep<T>) -> DrepRepr {
        DrepRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the DREP into the first 232 bytes of `buf`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    #[test]
    fn sample_vector() {
        let body = &vectors::DREP[MAD_HEADER_LEN..];
        let repr = DrepRepr::parse(&Drep::new_checked(body).unwrap());
        assert_eq!(
            repr,
            DrepRepr {
                local_comm_id: 0x5566_7788,
                remote_comm_id: 0x1122_3344,
                private_data: vec![0; 224],
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
        let long = DrepRepr {
            private_data: vec![0; 225],
            ..repr
        };
        assert_eq!(
            long.emit(&mut out),
            Err(Error::PrivateDataTooLong { max: 224, len: 225 })
        );
    }
}
