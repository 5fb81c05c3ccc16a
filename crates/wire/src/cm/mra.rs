//! MRA, MessageReceiptAcknowledgement (IBA 12.6.6, Table 107; attribute 0x0011):
//! "I got your REQ / REP / LAP, give me longer to answer". Offsets are within the
//! 232-byte message.

use super::put_private_data;
use crate::field::{be32, Field};
use crate::headers::header_view;
use crate::{Error, Result};

/// Bytes of private data an MRA carries.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message MRAed (7..6), reserved (5..0).
    pub const MESSAGE_MRAED: usize = 8;
    /// Service timeout (7..3), reserved (2..0).
    pub const SERVICE_TIMEOUT: usize = 9;
    pub const PRIVATE_DATA: Field = 10..232;
}

/// The message an MRA acknowledges (2-bit field; 3 is reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MraTarget {
    /// A REQ (the passive side needs time before it accepts).
    Req,
    /// A REP (the active side needs time before it sends the RTU).
    Rep,
    /// A LAP (path migration; not used on RoCE).
    Lap,
}

impl MraTarget {
    /// The field's value.
    pub const fn value(self) -> u8 {
        match self {
            MraTarget::Req => 0,
            MraTarget::Rep => 1,
            MraTarget::Lap => 2,
        }
    }

    /// The target a field value names, if not reserved.
    pub const fn from_value(v: u8) -> Option<Self> {
        match v {
            0 => Some(MraTarget::Req),
            1 => Some(MraTarget::Rep),
            2 => Some(MraTarget::Lap),
            _ => None,
        }
    }
}

header_view!(
    /// A view of an MRA message (the 232 bytes after the MAD header).
    Mra,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Mra<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Local communication ID (the MRA sender's).
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.b()[field::LOCAL_COMM_ID])
    }
    /// Remote communication ID (the receiver's).
    pub fn remote_comm_id(&self) -> u32 {
        be32(&self.b()[field::REMOTE_COMM_ID])
    }
    /// Message MRAed, as the raw 2-bit value.
    pub fn message_mraed(&self) -> u8 {
        self.b()[field::MESSAGE_MRAED] >> 6
    }
    /// Service timeout (5 bits; 4.096 us * 2^n).
    pub fn service_timeout(&self) -> u8 {
        self.b()[field::SERVICE_TIMEOUT] >> 3
    }
    /// Private data (222 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[field::PRIVATE_DATA]
    }
}

/// The fields of an MRA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Which message this acknowledges.
    pub message_mraed: MraTarget,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data: up to 222 bytes; parsing always yields all 222.
    pub private_data: Vec<u8>,
}

impl MraRepr {
    /// Reads an MRA; a reserved "message MRAed" value is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &Mra<T>) -> Result<MraRepr> {
        Ok(MraRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            message_mraed: MraTarget::from_value(m.message_mraed())
                .ok_or(Error::InvalidField("MRA message MRAed"))?,
            service_timeout: m.service_timeout(),
            private_data: m.private_data().to_vec(),
        })
    }

    /// Writes the MRA into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        b[field::REMOTE_COMM_ID].copy_from_slice(&self.remote_comm_id.to_be_bytes());
        b[field::MESSAGE_MRAED] = self.message_mraed.value() << 6;
        b[field::SERVICE_TIMEOUT] = (self.service_timeout & 0x1f) << 3;
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
        let body = &vectors::MRA[MAD_HEADER_LEN..];
        let repr = MraRepr::parse(&Mra::new_checked(body).unwrap()).unwrap();
        assert_eq!(
            repr,
            MraRepr {
                local_comm_id: 0x5566_7788,
                remote_comm_id: 0x1122_3344,
                message_mraed: MraTarget::Req,
                service_timeout: 24,
                private_data: vec![0; 222],
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn targets_and_the_reserved_value() {
        let mut b = [0u8; 232];
        for t in [MraTarget::Req, MraTarget::Rep, MraTarget::Lap] {
            b[8] = t.value() << 6;
            let r = MraRepr::parse(&Mra::new_checked(&b[..]).unwrap()).unwrap();
            assert_eq!(r.message_mraed, t);
        }
        b[8] = 0xc0;
        assert_eq!(
            MraRepr::parse(&Mra::new_checked(&b[..]).unwrap()),
            Err(Error::InvalidField("MRA message MRAed"))
        );
    }
}
