//! DREQ, DisconnectRequest (IBA 12.6.10, Table 112; attribute 0x0015): one side
//! closes the connection. Offsets are within the 232-byte message.

use super::put_private_data;
use crate::field::{be24, be32, put_be24, Field};
use crate::headers::header_view;
use crate::{Error, Qpn, Result};

/// Bytes of private data a DREQ carries.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Remote QPN/EECN (24 bits), then a reserved byte.
    pub const REMOTE_QPN: Field = 8..11;
    pub const RESERVED: usize = 11;
    pub const PRIVATE_DATA: Field = 12..232;
}

header_view!(
    /// A view of a DREQ message (the 232 bytes after the MAD header).
    Dreq,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Dreq<T> {
    /// Local communication ID (the sender's).
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::LOCAL_COMM_ID])
    }
    /// Remote communication ID (the receiver's).
    pub fn remote_comm_id(&self) -> u32 {
        be32(&self.buffer.as_ref()[field::REMOTE_COMM_ID])
    }
    /// Remote QPN/EECN: the *receiver's* QPN, which it checks against its own.
    pub fn remote_qpn(&self) -> Qpn {
        Qpn::new(be24(&self.buffer.as_ref()[field::REMOTE_QPN]))
    }
    /// Private data (220 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PRIVATE_DATA]
    }
}

/// The fields of a DREQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN.
    pub remote_qpn: Qpn,
    /// Private data: up to 220 bytes; parsing always yields all 220.
    pub private_data: Vec<u8>,
}

impl DreqRepr {
    /// Reads a DREQ.
    pub fn parse<T: AsRef<[u8]>>(m: &Dreq<T>) -> DreqRepr {
        DreqRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            remote_qpn: m.remote_qpn(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the DREQ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        b[field::REMOTE_COMM_ID].copy_from_slice(&self.remote_comm_id.to_be_bytes());
        put_be24(&mut b[field::REMOTE_QPN], self.remote_qpn.value());
        b[field::RESERVED] = 0;
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
        let body = &vectors::DREQ[MAD_HEADER_LEN..];
        let repr = DreqRepr::parse(&Dreq::new_checked(body).unwrap());
        assert_eq!(
            repr,
            DreqRepr {
                local_comm_id: 0x1122_3344,
                remote_comm_id: 0x5566_7788,
                remote_qpn: Qpn::new(0x456),
                private_data: vec![0; 220],
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }
}
