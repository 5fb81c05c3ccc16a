//! Service ID resolution, for UD: SIDR_REQ (IBA 12.11.1, Table 119; attribute
//! 0x0017) asks which QP and Q_Key serve a service ID, SIDR_REP (Table 120; 0x0018)
//! answers. Offsets are within the 232-byte message.

use super::put_private_data;
use crate::field::{be16, be24, be32, be64, put_be24};
use crate::headers::header_view;
use crate::{Error, Qpn, Result};
use core::fmt;

/// Bytes of private data a SIDR_REQ carries.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Bytes of private data a SIDR_REP carries.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of additional information a SIDR_REP carries.
pub const SIDR_REP_INFO_LEN: usize = 72;

mod req_field {
    use crate::field::Field;
    pub const REQUEST_ID: Field = 0..4;
    pub const PKEY: Field = 4..6;
    pub const RESERVED: Field = 6..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const PRIVATE_DATA: Field = 16..232;
}

mod rep_field {
    use crate::field::Field;
    pub const REQUEST_ID: Field = 0..4;
    pub const STATUS: usize = 4;
    pub const INFO_LENGTH: usize = 5;
    /// ECE vendor ID bits 23..8 (Linux >= 5.9; reserved in IBA 1.2).
    pub const VENDOR_ID_H: Field = 6..8;
    pub const QPN: Field = 8..11;
    /// ECE vendor ID bits 7..0.
    pub const VENDOR_ID_L: usize = 11;
    pub const SERVICE_ID: Field = 12..20;
    pub const QKEY: Field = 20..24;
    pub const INFO: Field = 24..96;
    pub const PRIVATE_DATA: Field = 96..232;
}

header_view!(
    /// A view of a SIDR_REQ message (the 232 bytes after the MAD header).
    SidrReq,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> SidrReq<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Request ID (the requester's local ID).
    pub fn request_id(&self) -> u32 {
        be32(&self.b()[req_field::REQUEST_ID])
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(&self.b()[req_field::PKEY])
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be64(&self.b()[req_field::SERVICE_ID])
    }
    /// Private data (216 bytes; rdma_cm puts its 36-byte header first).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[req_field::PRIVATE_DATA]
    }
}

/// The fields of a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data: up to 216 bytes; parsing always yields all 216.
    pub private_data: Vec<u8>,
}

impl SidrReqRepr {
    /// Reads a SIDR_REQ.
    pub fn parse<T: AsRef<[u8]>>(m: &SidrReq<T>) -> SidrReqRepr {
        SidrReqRepr {
            request_id: m.request_id(),
            pkey: m.pkey(),
            service_id: m.service_id(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the SIDR_REQ into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[req_field::PRIVATE_DATA], &self.private_data)?;
        b[req_field::REQUEST_ID].copy_from_slice(&self.request_id.to_be_bytes());
        b[req_field::PKEY].copy_from_slice(&self.pkey.to_be_bytes());
        b[req_field::RESERVED].fill(0);
        b[req_field::SERVICE_ID].copy_from_slice(&self.service_id.to_be_bytes());
        Ok(())
    }
}

/// A SIDR_REP status (IBA Table 121). Unknown values are kept as they are.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// 1: service ID not supported: nobody listens on it.
    pub const SERVICE_ID_NOT_SUPPORTED: SidrStatus = SidrStatus(1);
    /// 2: the service provider rejected the request.
    pub const REJECTED: SidrStatus = SidrStatus(2);
    /// 3: no QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// 4: redirect; the additional information holds a ClassPortInfo.
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// 5: unsupported class version.
    pub const UNSUPPORTED_CLASS_VERSION: SidrStatus = SidrStatus(5);
}

impl fmt::Debug for SidrStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SidrStatus({})", self.0)
    }
}

header_view!(
    /// A view of a SIDR_REP message (the 232 bytes after the MAD header).
    SidrRep,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> SidrRep<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Request ID (copied from the SIDR_REQ).
    pub fn request_id(&self) -> u32 {
        be32(&self.b()[rep_field::REQUEST_ID])
    }
    /// Status.
    pub fn status(&self) -> SidrStatus {
        SidrStatus(self.b()[rep_field::STATUS])
    }
    /// Additional information length.
    pub fn info_length(&self) -> u8 {
        self.b()[rep_field::INFO_LENGTH]
    }
    /// ECE vendor ID (24 bits).
    pub fn vendor_id(&self) -> u32 {
        let b = self.b();
        (u32::from(be16(&b[rep_field::VENDOR_ID_H])) << 8) | u32::from(b[rep_field::VENDOR_ID_L])
    }
    /// The QPN that serves the service ID.
    pub fn qpn(&self) -> Qpn {
        Qpn::new(be24(&self.b()[rep_field::QPN]))
    }
    /// Service ID (echo of the request's).
    pub fn service_id(&self) -> u64 {
        be64(&self.b()[rep_field::SERVICE_ID])
    }
    /// The Q_Key to send with.
    pub fn qkey(&self) -> u32 {
        be32(&self.b()[rep_field::QKEY])
    }
    /// The whole 72-byte additional information field.
    pub fn info_field(&self) -> &[u8] {
        &self.b()[rep_field::INFO]
    }
    /// Private data (136 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[rep_field::PRIVATE_DATA]
    }
}

/// The fields of a SIDR_REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// ECE vendor ID (24 bits; 0 = no ECE).
    pub vendor_id: u32,
    /// QPN.
    pub qpn: Qpn,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information (at most 72 bytes); its length is the additional
    /// information length.
    pub info: Vec<u8>,
    /// Private data: up to 136 bytes; parsing always yields all 136.
    pub private_data: Vec<u8>,
}

impl SidrRepRepr {
    /// Reads a SIDR_REP; an additional information length beyond 72 is an error.
    pub fn parse<T: AsRef<[u8]>>(m: &SidrRep<T>) -> Result<SidrRepRepr> {
        let info_len = usize::from(m.info_length());
        if info_len > SIDR_REP_INFO_LEN {
            return Err(Error::InvalidField(
                "SIDR_REP additional information length",
            ));
        }
        Ok(SidrRepRepr {
            request_id: m.request_id(),
            status: m.status(),
            vendor_id: m.vendor_id(),
            qpn: m.qpn(),
            service_id: m.service_id(),
            qkey: m.qkey(),
            info: m.info_field()[..info_len].to_vec(),
            private_data: m.private_data().to_vec(),
        })
    }

    /// Writes the SIDR_REP into the first 232 bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.info.len() > SIDR_REP_INFO_LEN {
            return Err(Error::InvalidField(
                "SIDR_REP additional information length",
            ));
        }
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[rep_field::PRIVATE_DATA], &self.private_data)?;
        b[rep_field::REQUEST_ID].copy_from_slice(&self.request_id.to_be_bytes());
        b[rep_field::STATUS] = self.status.0;
        b[rep_field::INFO_LENGTH] = self.info.len() as u8;
        b[rep_field::VENDOR_ID_H].copy_from_slice(&((self.vendor_id >> 8) as u16).to_be_bytes());
        put_be24(&mut b[rep_field::QPN], self.qpn.value());
        b[rep_field::VENDOR_ID_L] = self.vendor_id as u8;
        b[rep_field::SERVICE_ID].copy_from_slice(&self.service_id.to_be_bytes());
        b[rep_field::QKEY].copy_from_slice(&self.qkey.to_be_bytes());
        let info = &mut b[rep_field::INFO];
        info.fill(0);
        info[..self.info.len()].copy_from_slice(&self.info);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    #[test]
    fn sample_req_vector() {
        let body = &vectors::SIDR_REQ[MAD_HEADER_LEN..];
        let repr = SidrReqRepr::parse(&SidrReq::new_checked(body).unwrap());
        let mut private_data = vec![0u8; 216];
        private_data[1] = 0x40;
        private_data[2..4].copy_from_slice(&40001u16.to_be_bytes());
        private_data[16..20].copy_from_slice(&[192, 0, 2, 1]);
        private_data[32..36].copy_from_slice(&[192, 0, 2, 2]);
        assert_eq!(
            repr,
            SidrReqRepr {
                request_id: 0x0a0b_0c0d,
                pkey: 0xffff,
                service_id: 0x0000_0000_0111_1c06,
                private_data,
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn sample_rep_vector() {
        let body = &vectors::SIDR_REP[MAD_HEADER_LEN..];
        let repr = SidrRepRepr::parse(&SidrRep::new_checked(body).unwrap()).unwrap();
        assert_eq!(
            repr,
            SidrRepRepr {
                request_id: 0x0a0b_0c0d,
                status: SidrStatus::SUCCESS,
                vendor_id: 0,
                qpn: Qpn::new(0x789),
                service_id: 0x0000_0000_0111_1c06,
                qkey: 0x0123_4567,
                info: Vec::new(),
                private_data: vec![0; 136],
            }
        );
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn vendor_id_info_and_limits() {
        let r = SidrRepRepr {
            request_id: 7,
            status: SidrStatus::REDIRECT,
            vendor_id: 0x12_3456,
            qpn: Qpn::new(0xab_cdef),
            service_id: 1,
            qkey: 2,
            info: vec![9; 72],
            private_data: vec![3; 136],
        };
        let mut out = [0u8; 232];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[6..12], &[0x12, 0x34, 0xab, 0xcd, 0xef, 0x56]);
        assert_eq!(out[5], 72);
        assert_eq!(
            SidrRepRepr::parse(&SidrRep::new_checked(&out[..]).unwrap()),
            Ok(r.clone())
        );
        out[5] = 73;
        assert!(SidrRepRepr::parse(&SidrRep::new_checked(&out[..]).unwrap()).is_err());
        let too_long = SidrRepRepr {
            info: vec![0; 73],
            ..r
        };
        assert!(too_long.emit(&mut out).is_err());
    }
}
