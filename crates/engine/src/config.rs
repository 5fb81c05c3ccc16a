//! Engine configuration and device limits.

use core::time::Duration;
use std::net::SocketAddr;

/// What the receiver does with a packet whose ICRC does not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcPolicy {
    /// Compute on send; verify on receive and drop mismatches (the default).
    Enforce,
    /// Compute on send; verify on receive, count mismatches, accept the packet
    /// (for peers that send with an IPv4 ID the receiver cannot know).
    CountOnly,
    /// Compute on send; do not verify (the UDP checksum already covers the path).
    Skip,
}

/// Configuration of one engine, i.e. one softverbs device.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The device's IP address and UDP port: the source of every packet it sends.
    pub local_addr: SocketAddr,
    /// ICRC handling on receive.
    pub icrc: IcrcPolicy,
    /// Most QPs (QPNs 2 to 16383).
    pub max_qp: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Deepest CQ.
    pub max_cqe: u32,
    /// Deepest send or receive queue.
    pub max_qp_wr: u32,
    /// Most SGEs per work request.
    pub max_sge: u32,
    /// Most inline bytes per send work request.
    pub max_inline_data: u32,
    /// Most READs/atomics outstanding per QP, as requester and as responder.
    pub max_qp_rd_atom: u8,
    /// Largest message in bytes (IBA: 2^31).
    pub max_msg_size: u32,
    /// Most unacknowledged PSNs a requester keeps in flight.
    pub send_window: u32,
    /// The requester asks for an ACK at least every this many packets.
    pub ack_req_interval: u32,
    /// The port's active MTU: what UD QPs use (they have no path MTU attribute).
    pub port_mtu: crate::types::Mtu,
    /// The shortest early retransmission timeout (the RTT-derived timer that
    /// resends ahead of the IBTA local ACK timeout; see `qp/recovery.rs`).
    pub min_rto: Duration,
    /// The longest a peer holds an ACK back for its answer (a softverbs peer's
    /// `Config::ack_hold`, 50 µs by default): the tail-loss probe of a lone packet
    /// waits that much longer (RFC 8985 7.2's worst-case delayed ACK; see
    /// `qp/recovery.rs`). Zero: peers answer at once.
    pub peer_ack_hold: Duration,
    /// Most packets in flight across all the device's QPs: what the receiving
    /// socket buffer holds. Each QP is capped besides by twice the
    /// bandwidth-delay product it measures.
    pub device_window: u32,
    /// Bytes of READ responses a requester may have asked for beyond its in-flight
    /// cap: what its own receive buffer holds (the driver says; 0, the default: READ
    /// requests stay under the cap like every other request). See
    /// `Completer::window`.
    pub read_budget: u32,
    /// Selective repeat with softverbs peers that offer it too (the responder keeps
    /// out-of-order packets it can place and says so; the requester resends only
    /// what is missing). With any other peer, or when off, RC is plain IBTA
    /// go-back-N.
    pub selective_repeat: bool,
}

impl EngineConfig {
    /// Defaults for a device at `local_addr`.
    pub fn new(local_addr: SocketAddr) -> Self {
        EngineConfig {
            local_addr,
            icrc: IcrcPolicy::Enforce,
            max_qp: 16_382,
            max_mr: 1 << 20,
            max_cq: 1 << 16,
            max_pd: 1 << 16,
            max_cqe: 1 << 20,
            max_qp_wr: 1 << 15,
            max_sge: 32,
            max_inline_data: 512,
            // rxe offers 128, mlx5 16. 64 one-packet READs keep a 4 KiB READ stream's
            // pipe full (perftest takes this as its outstanding count); 64 KiB READs are
            // held by the 256-PSN window at 16 anyway (docs/udp-bandwidth.md, session 16).
            max_qp_rd_atom: 64,
            max_msg_size: 1 << 31,
            send_window: 1024,
            ack_req_interval: 64,
            port_mtu: crate::types::Mtu::Mtu4096,
            min_rto: Duration::from_micros(200),
            peer_ack_hold: Duration::from_micros(50),
            device_window: 1024,
            read_budget: 0,
            selective_repeat: true,
        }
    }
}
