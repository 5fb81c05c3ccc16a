//! REP, ConnectReply (IBA 12.6.8, Table 110; attribute 0x0013): the passive side
//! accepts a REQ. Offsets are within the 232-byte message.

use super::put_private_data;
use crate::field::{be24, be32, be64, put_be24, Field};
use crate::headers::header_view;
use crate::{Error, Psn, Qpn, Result};

/// Bytes of private data a REP carries.
pub const REP_PRIVATE_DATA_LEN: usize = 196;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const REMOTE_COMM_ID: Field = 4..8;
    pub const LOCAL_QKEY: Field = 8..12;
    pub const LOCAL_QPN: Field = 12..15;
    /// ECE vendor ID bits 23..16 (Linux >= 5.9; reserved in IBA 1.2).
    pub const VENDOR_ID_H: usize = 15;
    pub const LOCAL_EECN: Field = 16..19;
    /// ECE vendor ID bits 15..8.
    pub const VENDOR_ID_M: usize = 19;
    pub const STARTING_PSN: Field = 20..23;
    /// ECE vendor ID bits 7..0.
    pub const VENDOR_ID_L: usize = 23;
    pub const RESPONDER_RESOURCES: usize = 24;
    pub const INITIATOR_DEPTH: usize = 25;
    /// Target ACK delay (7..3), failover accepted (2..1), end-to-end flow control (0).
    pub const ACK_FAILOVER_FLOW: usize = 26;
    /// RNR retry count (7..5), SRQ (4), reserved (3..0).
    pub const RNR_SRQ: usize = 27;
    pub const LOCAL_CA_GUID: Field = 28..36;
    pub const PRIVATE_DATA: Field = 36..232;
}

header_view!(
    /// A view of a REP message (the 232 bytes after the MAD header).
    Rep,
    super::CM_MESSAGE_LEN
);

impl<T: AsRef<[u8]>> Rep<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Local communication ID (the passive side's).
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.b()[field::LOCAL_COMM_ID])
    }
    /// Remote communication ID (the REQ's local communication ID).
    pub fn remote_comm_id(&self) -> u32 {
        be32(&self.b()[field::REMOTE_COMM_ID])
    }
    /// Local Q_Key.
    pub fn local_qkey(&self) -> u32 {
        be32(&self.b()[field::LOCAL_QKEY])
    }
    /// Local QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(be24(&self.b()[field::LOCAL_QPN]))
    }
    /// ECE vendor ID (24 bits, split over three reserved bytes).
    pub fn vendor_id(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([
            0,
            b[field::VENDOR_ID_H],
            b[field::VENDOR_ID_M],
            b[field::VENDOR_ID_L],
        ])
    }
    /// Local EE context number.
    pub fn local_eecn(&self) -> u32 {
        be24(&self.b()[field::LOCAL_EECN])
    }
    /// Starting PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(be24(&self.b()[field::STARTING_PSN]))
    }
    /// Responder resources.
    pub fn responder_resources(&self) -> u8 {
        self.b()[field::RESPONDER_RESOURCES]
    }
    /// Initiator depth.
    pub fn initiator_depth(&self) -> u8 {
        self.b()[field::INITIATOR_DEPTH]
    }
    /// Target ACK delay (5 bits).
    pub fn target_ack_delay(&self) -> u8 {
        self.b()[field::ACK_FAILOVER_FLOW] >> 3
    }
    /// Failover accepted (2 bits).
    pub fn failover_accepted(&self) -> u8 {
        (self.b()[field::ACK_FAILOVER_FLOW] >> 1) & 0x3
    }
    /// End-to-end flow control.
    pub fn end_to_end_flow_control(&self) -> bool {
        self.b()[field::ACK_FAILOVER_FLOW] & 0x1 != 0
    }
    /// RNR retry count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        self.b()[field::RNR_SRQ] >> 5
    }
    /// The sender's QP uses an SRQ.
    pub fn srq(&self) -> bool {
        self.b()[field::RNR_SRQ] & 0x10 != 0
    }
    /// Local CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        be64(&self.b()[field::LOCAL_CA_GUID])
    }
    /// Private data (196 bytes, user data from offset 0).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[field::PRIVATE_DATA]
    }
}

/// The fields of a REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// ECE vendor ID (24 bits; 0 = no ECE).
    pub vendor_id: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data: up to 196 bytes; parsing always yields all 196.
    pub private_data: Vec<u8>,
}

impl RepRepr {
    /// Reads a REP.
    pub fn parse<T: AsRef<[u8]>>(m: &Rep<T>) -> RepRepr {
        RepRepr {
            local_comm_id: m.local_comm_id(),
            remote_comm_id: m.remote_comm_id(),
            local_qkey: m.local_qkey(),
            local_qpn: m.local_qpn(),
            vendor_id: m.vendor_id(),
            local_eecn: m.local_eecn(),
            starting_psn: m.starting_psn(),
            responder_resources: m.responder_resources(),
            initiator_depth: m.initiator_depth(),
            target_ack_delay: m.target_ack_delay(),
            failover_accepted: m.failover_accepted(),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            rnr_retry_count: m.rnr_retry_count(),
            srq: m.srq(),
            local_ca_guid: m.local_ca_guid(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the REP into the first 232 bytes of `buf` (reserved bits zero, private
    /// data zero-padded, values wider than their field cut).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        b[field::REMOTE_COMM_ID].copy_from_slice(&self.remote_comm_id.to_be_bytes());
        b[field::LOCAL_QKEY].copy_from_slice(&self.local_qkey.to_be_bytes());
        put_be24(&mut b[field::LOCAL_QPN], self.local_qpn.value());
        put_be24(&mut b[field::LOCAL_EECN], self.local_eecn);
        put_be24(&mut b[field::STARTING_PSN], self.starting_psn.value());
        let [_, vh, vm, vl] = self.vendor_id.to_be_bytes();
        b[field::VENDOR_ID_H] = vh;
        b[field::VENDOR_ID_M] = vm;
        b[field::VENDOR_ID_L] = vl;
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        b[field::ACK_FAILOVER_FLOW] = ((self.target_ack_delay & 0x1f) << 3)
            | ((self.failover_accepted & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        b[field::RNR_SRQ] = ((self.rnr_retry_count & 0x7) << 5) | (u8::from(self.srq) << 4);
        b[field::LOCAL_CA_GUID].copy_from_slice(&self.local_ca_guid.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    fn sample() -> RepRepr {
        let mut private_data = vec![0u8; 196];
        private_data[..11].copy_from_slice(b"rep-private");
        RepRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            local_qkey: 0,
            local_qpn: Qpn::new(0x456),
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: Psn::new(0x65_4321),
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0200_c0ff_fe00_0202,
            private_data,
        }
    }

    #[test]
    fn sample_vector() {
        let body = &vectors::REP[MAD_HEADER_LEN..];
        let repr = RepRepr::parse(&Rep::new_checked(body).unwrap());
        assert_eq!(repr, sample());
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn vendor_id_and_bit_fields() {
        let r = RepRepr {
            vendor_id: 0xab_cdef,
            failover_accepted: 3,
            srq: true,
            ..sample()
        };
        let mut out = [0u8; 232];
        r.emit(&mut out).unwrap();
        assert_eq!([out[15], out[19], out[23]], [0xab, 0xcd, 0xef]);
        assert_eq!(out[26], 0x7f);
        assert_eq!(out[27], 0xf0);
        assert_eq!(RepRepr::parse(&Rep::new_checked(&out[..]).unwrap()), r);
        let long = RepRepr {
            private_data: vec![0; 197],
            ..sample()
        };
        assert_eq!(
            long.emit(&mut out),
            Err(Error::PrivateDataTooLong { max: 196, len: 197 })
        );
    }
}
