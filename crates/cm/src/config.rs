//! Configuration of one cm: the device it speaks for, and the protocol constants
//! rdma_cm uses on RoCE (CM.md 4.5).

use core::ops::Range;
use std::net::{IpAddr, SocketAddr};

/// What the cm does with a received datagram whose ICRC does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcCheck {
    /// Drop it (the default).
    Enforce,
    /// Count it and accept it (peers whose IPv4 ID the receiver cannot know).
    CountOnly,
    /// Do not check.
    Skip,
}

/// Configuration of a [`Cm`](crate::Cm).
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// The device's UDP endpoint: every CM datagram goes out from it, and peers send
    /// their replies and later messages to it.
    pub device: SocketAddr,
    /// The device's node GUID (the "local CA GUID" of REQ and REP). It must be
    /// unique among the CMs a peer talks to, since peers key duplicate and stale
    /// connections on it (CM.md 3.4): [`CmConfig::guid_for`] derives one from the
    /// device's address.
    pub node_guid: u64,
    /// Seed of the generator for communication IDs, PSNs and ephemeral ports (the
    /// driver takes it from the OS; tests from their seed).
    pub seed: u64,
    /// The device's ACK delay (REP "target ACK delay"; rxe says 15).
    pub ca_ack_delay: u8,
    /// Most RDMA READs/atomics a QP accepts as responder (`max_qp_rd_atom`): what 255
    /// in a connection parameter means.
    pub max_responder_resources: u8,
    /// Most RDMA READs/atomics a QP issues (`max_qp_init_rd_atom`).
    pub max_initiator_depth: u8,
    /// The backlog of a listener that asks for 0 or less (Linux ucma: 1024).
    pub default_backlog: u32,
    /// ICRC check on receive.
    pub icrc: IcrcCheck,
    /// CM response timeout (both REQ fields; 20 = 4.096 s).
    pub cm_response_timeout: u8,
    /// Max CM retries (15).
    pub max_cm_retries: u8,
    /// Packet life time of RoCE paths (18 = about 1 s).
    pub packet_life_time: u8,
    /// Service timeout of the MRAs the cm sends (24 = about 68.7 s).
    pub mra_service_timeout: u8,
    /// Ephemeral ports for ids bound without one.
    pub ephemeral_ports: Range<u16>,
}

impl CmConfig {
    /// Linux's defaults for a device at `device`.
    pub fn new(device: SocketAddr, node_guid: u64, seed: u64) -> CmConfig {
        CmConfig {
            device,
            node_guid,
            seed,
            ca_ack_delay: 15,
            max_responder_resources: 16,
            max_initiator_depth: 16,
            default_backlog: 1024,
            icrc: IcrcCheck::Enforce,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 18,
            mra_service_timeout: 24,
            ephemeral_ports: 32768..61000,
        }
    }

    /// A node GUID made from a device address, unique per address and port: IPv4
    /// `02:00:a:b:c:d:PP:PP` (a locally administered EUI-64), IPv6 a hash of address
    /// and port with the same marker.
    pub fn guid_for(device: SocketAddr) -> u64 {
        let port = u64::from(device.port());
        match device.ip() {
            IpAddr::V4(ip) => (0x0200u64 << 48) | (u64::from(u32::from(ip)) << 16) | port,
            IpAddr::V6(ip) => {
                // FNV-1a over address and port.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in ip.octets().iter().chain(device.port().to_be_bytes().iter()) {
                    h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
                }
                (h & 0x0000_ffff_ffff_ffff) | (0x0200u64 << 48)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_differ_by_address_and_port() {
        let a = CmConfig::guid_for("127.0.0.1:4791".parse().unwrap());
        assert_eq!(a, 0x0200_7f00_0001_12b7);
        let b = CmConfig::guid_for("127.0.0.1:4792".parse().unwrap());
        let c = CmConfig::guid_for("[::1]:4791".parse().unwrap());
        let d = CmConfig::guid_for("[::2]:4791".parse().unwrap());
        assert!(a != b && c != d && a != c);
    }
}
