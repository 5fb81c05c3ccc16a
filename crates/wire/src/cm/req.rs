//! REQ, ConnectRequest (IBA 12.6.5, Table 106; attribute 0x0010): the active side
//! asks for a connection. Offsets below are within the 232-byte message.
//!
//! The primary and alternate paths share one 44-byte layout ([`PathRepr`]); RoCE has
//! no alternate path, so softverbs sends it all zero (Linux treats the alternate path
//! as present iff its local LID is nonzero).

use super::put_private_data;
use crate::field::{be16, be24, be32, be64, put_be24, Field};
use crate::headers::header_view;
use crate::{Error, Gid, Psn, Qpn, Result};

/// Bytes of private data a REQ carries.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;

mod field {
    use super::Field;
    pub const LOCAL_COMM_ID: Field = 0..4;
    pub const VENDOR_ID: Field = 5..8;
    pub const SERVICE_ID: Field = 8..16;
    pub const LOCAL_CA_GUID: Field = 16..24;
    pub const LOCAL_QKEY: Field = 28..32;
    pub const LOCAL_QPN: Field = 32..35;
    pub const RESPONDER_RESOURCES: usize = 35;
    pub const LOCAL_EECN: Field = 36..39;
    pub const INITIATOR_DEPTH: usize = 39;
    pub const REMOTE_EECN: Field = 40..43;
    /// Remote CM response timeout (7..3), transport service type (2..1), end-to-end
    /// flow control (0).
    pub const TIMEOUT_TRANSPORT_FLOW: usize = 43;
    pub const STARTING_PSN: Field = 44..47;
    /// Local CM response timeout (7..3), retry count (2..0).
    pub const TIMEOUT_RETRY: usize = 47;
    pub const PKEY: Field = 48..50;
    /// Path MTU (7..4), RDC exists (3), RNR retry count (2..0).
    pub const MTU_RDC_RNR: usize = 50;
    /// Max CM retries (7..4), SRQ (3), extended transport type (2..0).
    pub const RETRIES_SRQ_EXT: usize = 51;
    pub const PRIMARY_PATH: Field = 52..96;
    pub const ALTERNATE_PATH: Field = 96..140;
    /// SAP supported: bit 2 of the alternate path's last byte.
    pub const SAP: usize = 139;
    pub const PRIVATE_DATA: Field = 140..232;
}

/// Offsets within a 44-byte path description.
mod path {
    use super::Field;
    pub const LEN: usize = 44;
    pub const LOCAL_LID: Field = 0..2;
    pub const REMOTE_LID: Field = 2..4;
    pub const LOCAL_GID: Field = 4..20;
    pub const REMOTE_GID: Field = 20..36;
    /// Flow label (31..12), reserved (11..6), packet rate (5..0).
    pub const FLOW_RATE: Field = 36..40;
    pub const TRAFFIC_CLASS: usize = 40;
    pub const HOP_LIMIT: usize = 41;
    /// SL (7..4), subnet local (3), reserved (2..0).
    pub const SL_SUBNET_LOCAL: usize = 42;
    /// Local ACK timeout (7..3), reserved (2..0; SAP in the alternate path).
    pub const ACK_TIMEOUT: usize = 43;
}

header_view!(
    /// A view of a REQ message (the 232 bytes after the MAD header).
    Req,
    super::CM_MESSAGE_LEN
);

/// One path of a REQ (primary or alternate), IBA Table 106.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathRepr {
    /// Local port LID (0xFFFF on RoCEv2 when the hop limit exceeds 1).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6-bit IB rate code; 0 = port current rate).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local: no GRH needed (IB only; 0 on RoCEv2).
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits; 4.096 us * 2^n).
    pub local_ack_timeout: u8,
}

impl PathRepr {
    fn parse(b: &[u8]) -> PathRepr {
        let gid = |f: Field| {
            let mut g = [0u8; 16];
            g.copy_from_slice(&b[f]);
            Gid(g)
        };
        let flow_rate = be32(&b[path::FLOW_RATE]);
        PathRepr {
            local_lid: be16(&b[path::LOCAL_LID]),
            remote_lid: be16(&b[path::REMOTE_LID]),
            local_gid: gid(path::LOCAL_GID),
            remote_gid: gid(path::REMOTE_GID),
            flow_label: flow_rate >> 12,
            packet_rate: (flow_rate & 0x3f) as u8,
            traffic_class: b[path::TRAFFIC_CLASS],
            hop_limit: b[path::HOP_LIMIT],
            sl: b[path::SL_SUBNET_LOCAL] >> 4,
            subnet_local: b[path::SL_SUBNET_LOCAL] & 0x08 != 0,
            local_ack_timeout: b[path::ACK_TIMEOUT] >> 3,
        }
    }

    /// Writes the path into `b` (44 bytes); values wider than their field are cut.
    fn emit(&self, b: &mut [u8]) {
        b[path::LOCAL_LID].copy_from_slice(&self.local_lid.to_be_bytes());
        b[path::REMOTE_LID].copy_from_slice(&self.remote_lid.to_be_bytes());
        b[path::LOCAL_GID].copy_from_slice(&self.local_gid.0);
        b[path::REMOTE_GID].copy_from_slice(&self.remote_gid.0);
        let flow_rate = ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f);
        b[path::FLOW_RATE].copy_from_slice(&flow_rate.to_be_bytes());
        b[path::TRAFFIC_CLASS] = self.traffic_class;
        b[path::HOP_LIMIT] = self.hop_limit;
        b[path::SL_SUBNET_LOCAL] = ((self.sl & 0xf) << 4) | (u8::from(self.subnet_local) << 3);
        b[path::ACK_TIMEOUT] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

impl<T: AsRef<[u8]>> Req<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Local communication ID.
    pub fn local_comm_id(&self) -> u32 {
        be32(&self.b()[field::LOCAL_COMM_ID])
    }
    /// ECE vendor ID (Linux >= 5.9; reserved in IBA 1.2).
    pub fn vendor_id(&self) -> u32 {
        be24(&self.b()[field::VENDOR_ID])
    }
    /// Service ID.
    pub fn service_id(&self) -> u64 {
        be64(&self.b()[field::SERVICE_ID])
    }
    /// Local CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        be64(&self.b()[field::LOCAL_CA_GUID])
    }
    /// Local Q_Key.
    pub fn local_qkey(&self) -> u32 {
        be32(&self.b()[field::LOCAL_QKEY])
    }
    /// Local QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(be24(&self.b()[field::LOCAL_QPN]))
    }
    /// Responder resources: RDMA READs / atomics the sender accepts as responder.
    pub fn responder_resources(&self) -> u8 {
        self.b()[field::RESPONDER_RESOURCES]
    }
    /// Local EECN.
    pub fn local_eecn(&self) -> u32 {
        be24(&self.b()[field::LOCAL_EECN])
    }
    /// Initiator depth: RDMA READs / atomics the sender issues at once.
    pub fn initiator_depth(&self) -> u8 {
        self.b()[field::INITIATOR_DEPTH]
    }
    /// Remote EECN.
    pub fn remote_eecn(&self) -> u32 {
        be24(&self.b()[field::REMOTE_EECN])
    }
    /// Remote CM response timeout (5 bits).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        self.b()[field::TIMEOUT_TRANSPORT_FLOW] >> 3
    }
    /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD, 3 XRC).
    pub fn transport_service_type(&self) -> u8 {
        (self.b()[field::TIMEOUT_TRANSPORT_FLOW] >> 1) & 0x3
    }
    /// End-to-end flow control.
    pub fn end_to_end_flow_control(&self) -> bool {
        self.b()[field::TIMEOUT_TRANSPORT_FLOW] & 0x1 != 0
    }
    /// Starting PSN.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(be24(&self.b()[field::STARTING_PSN]))
    }
    /// Local CM response timeout (5 bits).
    pub fn local_cm_response_timeout(&self) -> u8 {
        self.b()[field::TIMEOUT_RETRY] >> 3
    }
    /// Transport retry count (3 bits).
    pub fn retry_count(&self) -> u8 {
        self.b()[field::TIMEOUT_RETRY] & 0x7
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(&self.b()[field::PKEY])
    }
    /// Path MTU (4-bit IB MTU code: 1 = 256 ... 5 = 4096).
    pub fn path_mtu(&self) -> u8 {
        self.b()[field::MTU_RDC_RNR] >> 4
    }
    /// RDC exists.
    pub fn rdc_exists(&self) -> bool {
        self.b()[field::MTU_RDC_RNR] & 0x08 != 0
    }
    /// RNR retry count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        self.b()[field::MTU_RDC_RNR] & 0x7
    }
    /// Max CM retries (4 bits).
    pub fn max_cm_retries(&self) -> u8 {
        self.b()[field::RETRIES_SRQ_EXT] >> 4
    }
    /// The sender's QP uses an SRQ.
    pub fn srq(&self) -> bool {
        self.b()[field::RETRIES_SRQ_EXT] & 0x08 != 0
    }
    /// Extended transport type (3 bits; 1 = XRC).
    pub fn extended_transport_type(&self) -> u8 {
        self.b()[field::RETRIES_SRQ_EXT] & 0x7
    }
    /// The primary path.
    pub fn primary_path(&self) -> PathRepr {
        PathRepr::parse(&self.b()[field::PRIMARY_PATH])
    }
    /// The alternate path.
    pub fn alternate_path(&self) -> PathRepr {
        PathRepr::parse(&self.b()[field::ALTERNATE_PATH])
    }
    /// SAP supported.
    pub fn sap_supported(&self) -> bool {
        self.b()[field::SAP] & 0x04 != 0
    }
    /// Private data (92 bytes; rdma_cm puts its 36-byte header first).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[field::PRIVATE_DATA]
    }
}

/// The fields of a REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits; 0 = no ECE).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN.
    pub local_qpn: Qpn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU code (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: PathRepr,
    /// Alternate path (all zero when absent).
    pub alternate_path: PathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data: up to 92 bytes; parsing always yields all 92.
    pub private_data: Vec<u8>,
}

impl ReqRepr {
    /// Reads a REQ.
    pub fn parse<T: AsRef<[u8]>>(m: &Req<T>) -> ReqRepr {
        ReqRepr {
            local_comm_id: m.local_comm_id(),
            vendor_id: m.vendor_id(),
            service_id: m.service_id(),
            local_ca_guid: m.local_ca_guid(),
            local_qkey: m.local_qkey(),
            local_qpn: m.local_qpn(),
            responder_resources: m.responder_resources(),
            local_eecn: m.local_eecn(),
            initiator_depth: m.initiator_depth(),
            remote_eecn: m.remote_eecn(),
            remote_cm_response_timeout: m.remote_cm_response_timeout(),
            transport_service_type: m.transport_service_type(),
            end_to_end_flow_control: m.end_to_end_flow_control(),
            starting_psn: m.starting_psn(),
            local_cm_response_timeout: m.local_cm_response_timeout(),
            retry_count: m.retry_count(),
            pkey: m.pkey(),
            path_mtu: m.path_mtu(),
            rdc_exists: m.rdc_exists(),
            rnr_retry_count: m.rnr_retry_count(),
            max_cm_retries: m.max_cm_retries(),
            srq: m.srq(),
            extended_transport_type: m.extended_transport_type(),
            primary_path: m.primary_path(),
            alternate_path: m.alternate_path(),
            sap_supported: m.sap_supported(),
            private_data: m.private_data().to_vec(),
        }
    }

    /// Writes the REQ into the first 232 bytes of `buf`, reserved bits zero and the
    /// private data zero-padded; values wider than their field are cut.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let b = buf
            .get_mut(..super::CM_MESSAGE_LEN)
            .ok_or(Error::BufferTooSmall)?;
        put_private_data(&mut b[field::PRIVATE_DATA], &self.private_data)?;
        b[..field::PRIVATE_DATA.start].fill(0);
        b[field::LOCAL_COMM_ID].copy_from_slice(&self.local_comm_id.to_be_bytes());
        put_be24(&mut b[field::VENDOR_ID], self.vendor_id);
        b[field::SERVICE_ID].copy_from_slice(&self.service_id.to_be_bytes());
        b[field::LOCAL_CA_GUID].copy_from_slice(&self.local_ca_guid.to_be_bytes());
        b[field::LOCAL_QKEY].copy_from_slice(&self.local_qkey.to_be_bytes());
        put_be24(&mut b[field::LOCAL_QPN], self.local_qpn.value());
        b[field::RESPONDER_RESOURCES] = self.responder_resources;
        put_be24(&mut b[field::LOCAL_EECN], self.local_eecn);
        b[field::INITIATOR_DEPTH] = self.initiator_depth;
        put_be24(&mut b[field::REMOTE_EECN], self.remote_eecn);
        b[field::TIMEOUT_TRANSPORT_FLOW] = ((self.remote_cm_response_timeout & 0x1f) << 3)
            | ((self.transport_service_type & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        put_be24(&mut b[field::STARTING_PSN], self.starting_psn.value());
        b[field::TIMEOUT_RETRY] =
            ((self.local_cm_response_timeout & 0x1f) << 3) | (self.retry_count & 0x7);
        b[field::PKEY].copy_from_slice(&self.pkey.to_be_bytes());
        b[field::MTU_RDC_RNR] = ((self.path_mtu & 0xf) << 4)
            | (u8::from(self.rdc_exists) << 3)
            | (self.rnr_retry_count & 0x7);
        b[field::RETRIES_SRQ_EXT] = ((self.max_cm_retries & 0xf) << 4)
            | (u8::from(self.srq) << 3)
            | (self.extended_transport_type & 0x7);
        self.primary_path.emit(&mut b[field::PRIMARY_PATH]);
        self.alternate_path.emit(&mut b[field::ALTERNATE_PATH]);
        b[field::SAP] |= u8::from(self.sap_supported) << 2;
        debug_assert_eq!(field::PRIMARY_PATH.len(), path::LEN);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::mad::MAD_HEADER_LEN;
    use crate::cm::vectors;

    fn sample() -> ReqRepr {
        let mut private_data = vec![0u8; 92];
        // rdma_cm header: version 0, IPv4, source port 40000, 192.0.2.1 -> 192.0.2.2.
        private_data[1] = 0x40;
        private_data[2..4].copy_from_slice(&40000u16.to_be_bytes());
        private_data[16..20].copy_from_slice(&[192, 0, 2, 1]);
        private_data[32..36].copy_from_slice(&[192, 0, 2, 2]);
        private_data[36..49].copy_from_slice(b"hello-private");
        let path = PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Gid::from_ip("192.0.2.1".parse().unwrap()),
            remote_gid: Gid::from_ip("192.0.2.2".parse().unwrap()),
            flow_label: 0x12345,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        };
        ReqRepr {
            local_comm_id: 0x1122_3344,
            vendor_id: 0,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x0200_c0ff_fe00_0201,
            local_qkey: 0,
            local_qpn: Qpn::new(0x123),
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: Psn::new(0xab_cdef),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: PathRepr::default(),
            sap_supported: false,
            private_data,
        }
    }

    #[test]
    fn sample_vector() {
        let body = &vectors::REQ[MAD_HEADER_LEN..];
        let repr = ReqRepr::parse(&Req::new_checked(body).unwrap());
        assert_eq!(repr, sample());
        let mut out = [0xa5u8; 232];
        repr.emit(&mut out).unwrap();
        assert_eq!(out[..], body[..]);
    }

    #[test]
    fn every_bit_field_lands_in_its_place() {
        let mut r = sample();
        r.transport_service_type = 3;
        r.end_to_end_flow_control = false;
        r.rdc_exists = true;
        r.srq = true;
        r.extended_transport_type = 1;
        r.sap_supported = true;
        r.alternate_path.local_ack_timeout = 31;
        r.primary_path.sl = 0xf;
        r.primary_path.subnet_local = true;
        r.primary_path.packet_rate = 0x3f;
        let mut out = [0u8; 232];
        r.emit(&mut out).unwrap();
        assert_eq!(out[43], 0xa6);
        assert_eq!(out[50], 0x3f);
        assert_eq!(out[51], 0xf9);
        assert_eq!(out[139], 0xfc);
        assert_eq!(out[94], 0xf8);
        assert_eq!(&out[88..92], &[0x12, 0x34, 0x50, 0x3f]);
        assert_eq!(ReqRepr::parse(&Req::new_checked(&out[..]).unwrap()), r);
    }

    #[test]
    fn too_much_private_data_or_too_small_a_buffer() {
        let mut r = sample();
        r.private_data = vec![1; 93];
        assert_eq!(
            r.emit(&mut [0u8; 232]),
            Err(Error::PrivateDataTooLong { max: 92, len: 93 })
        );
        assert_eq!(sample().emit(&mut [0u8; 231]), Err(Error::BufferTooSmall));
        assert_eq!(Req::new_checked(&[0u8; 231][..]), Err(Error::Truncated));
    }
}
