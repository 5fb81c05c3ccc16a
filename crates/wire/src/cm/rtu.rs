//! RTU, ReadyToUse (IBA 12.6.9, Table 111; attribute 0x0014): the active side confirms the REP; the connection is established. Offsets are within
//! the 232-byte message.

use super::put_private_data;
use crate::field::{be32, Field};
use crate::headers::header_view;
use crate::{Error, Result};

/// Bytes of private data an RTU carries.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const PRIVATE_DATA: Field = 8..232;
}

header_view!(
    /// A view of an RTU message (the 232 bytes after the MAD header).
    Rtu,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Rtu<T> {
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

/// The fields of an RTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data: up to 224 bytes; parsing always yields all 224.
    pub private_data: Vec<u8>,
}

impl RtuRepr {
    /// Reads an RTU.
    pub fn parse<T: AsRef<[u8]>>(m: &Rtu<T>) -> RtuRepr {
        RtuRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the RTU into the first 232 bytes of `buf`.
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
        let body = &vectors::RTU[MAD_HEADER_LEN..];
        let repr = RtuRepr::parse(&Rtu::new_checked(body).unwrap());
        assert_eq!(
            repr,
            RtuRepr {
                local_comm_id: 0x1122_3344,
                remote_comm_id: 0x5566_7788,
                private_data: vec![0; 224],
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
        let long = RtuRepr {
            private_data: vec![0; 225],
            ..repr
        };
        assert_eq!(
            long.emit(&mut out),
            Err(Error::PrivateDataTooLong { max: 224, len: 225 })
        );
    }
}
