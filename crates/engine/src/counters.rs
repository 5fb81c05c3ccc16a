//! Per-engine counters.

/// Packet and error counters of one engine (one device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent (UDP payload).
    pub tx_bytes: u64,
    /// Packets received and accepted for processing.
    pub rx_packets: u64,
    /// Bytes received (UDP payload).
    pub rx_bytes: u64,
    /// Request packets sent again after a timeout, NAK or RNR wait.
    pub retransmitted_packets: u64,
    /// Local ACK timeouts that fired.
    pub ack_timeouts: u64,
    /// PSN sequence error NAKs sent.
    pub nak_seq_sent: u64,
    /// PSN sequence error NAKs received.
    pub nak_seq_received: u64,
    /// Error NAKs (invalid request, remote access, remote operational) sent.
    pub nak_error_sent: u64,
    /// Error NAKs received.
    pub nak_error_received: u64,
    /// RNR NAKs sent.
    pub rnr_nak_sent: u64,
    /// RNR NAKs received.
    pub rnr_nak_received: u64,
    /// Duplicate requests answered.
    pub duplicate_requests: u64,
    /// Dropped: not a well-formed RoCEv2 packet.
    pub drop_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub drop_icrc: u64,
    /// ICRC mismatches accepted under [`crate::IcrcPolicy::CountOnly`].
    pub icrc_mismatch_accepted: u64,
    /// Dropped: no QP with the destination QPN.
    pub drop_unknown_qp: u64,
    /// Dropped: the QP is not in a state that accepts it, or the opcode does not
    /// fit the QP's transport.
    pub drop_bad_state: u64,
    /// Dropped: the source address is not the QP's peer.
    pub drop_wrong_source: u64,
    /// Dropped: P_Key mismatch.
    pub drop_bad_pkey: u64,
    /// Dropped: out-of-sequence packets after a NAK was already sent, or stale
    /// responses.
    pub drop_out_of_sequence: u64,
    /// Congestion notification packets received (ignored).
    pub cnp_received: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
}
