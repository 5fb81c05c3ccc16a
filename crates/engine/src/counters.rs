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
    /// Early retransmission timeouts (from the measured RTT) that sent the
    /// requester back: they count no transport retry.
    pub early_retransmits: u64,
    /// Tail-loss probes sent (the newest packet again, on the early timer).
    pub tail_loss_probes: u64,
    /// Retransmission timeouts found spurious: after the oldest packet was resent
    /// alone, everything sent before the timeout was acknowledged, packets never
    /// resent among it, so nothing was lost (a peer or path that stalled);
    /// nothing more was resent.
    pub spurious_timeouts: u64,
    /// Request packets a responder kept ahead of the expected PSN (selective
    /// repeat).
    pub sr_held_ahead: u64,
    /// READ responses placed ahead of the one expected (selective repeat).
    pub read_responses_ahead: u64,
    /// Selective ACKs sent.
    pub sack_sent: u64,
    /// Selective ACKs received.
    pub sack_received: u64,
    /// Request packets the requester did not resend because the responder holds
    /// them.
    pub sr_skipped: u64,
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
    /// Duplicate requests to a destroyed RC QP re-acknowledged (see `closed.rs`).
    pub closed_qp_acks: u64,
    /// Dropped: not a well-formed RoCEv2 packet.
    pub drop_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub drop_icrc: u64,
    /// ICRCs that matched only with another IPv4 ID than the one expected, solved
    /// for (a UDP GSO segment read without GRO), and accepted.
    pub icrc_ipv4_id_solved: u64,
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
    /// Dropped: a duplicate READ request that does not repeat the original (R_Key,
    /// address and length from its PSN on).
    pub drop_duplicate_mismatch: u64,
    /// Dropped as if lost: a duplicate request (or a selective ACK) the
    /// responder had no room to answer, its answer queue full of answers that
    /// could not leave yet; or a new request from a requester past its
    /// READ/atomic limit, in the same state (not executed). The requester asks
    /// again.
    pub drop_answer_queue_full: u64,
    /// UC messages dropped by the responder (a check failed or no receive WQE).
    pub uc_messages_dropped: u64,
    /// UD messages dropped: wrong Q_Key, no receive WQE, or too long.
    pub ud_messages_dropped: u64,
    /// Congestion notification packets received (ignored).
    pub cnp_received: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
}

impl Counters {
    /// Every counter with its name, in declaration order.
    pub fn named(&self) -> [(&'static str, u64); 37] {
        [
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("retransmitted_packets", self.retransmitted_packets),
            ("ack_timeouts", self.ack_timeouts),
            ("early_retransmits", self.early_retransmits),
            ("tail_loss_probes", self.tail_loss_probes),
            ("spurious_timeouts", self.spurious_timeouts),
            ("sr_held_ahead", self.sr_held_ahead),
            ("read_responses_ahead", self.read_responses_ahead),
            ("sack_sent", self.sack_sent),
            ("sack_received", self.sack_received),
            ("sr_skipped", self.sr_skipped),
            ("nak_seq_sent", self.nak_seq_sent),
            ("nak_seq_received", self.nak_seq_received),
            ("nak_error_sent", self.nak_error_sent),
            ("nak_error_received", self.nak_error_received),
            ("rnr_nak_sent", self.rnr_nak_sent),
            ("rnr_nak_received", self.rnr_nak_received),
            ("duplicate_requests", self.duplicate_requests),
            ("closed_qp_acks", self.closed_qp_acks),
            ("drop_malformed", self.drop_malformed),
            ("drop_icrc", self.drop_icrc),
            ("icrc_ipv4_id_solved", self.icrc_ipv4_id_solved),
            ("icrc_mismatch_accepted", self.icrc_mismatch_accepted),
            ("drop_unknown_qp", self.drop_unknown_qp),
            ("drop_bad_state", self.drop_bad_state),
            ("drop_wrong_source", self.drop_wrong_source),
            ("drop_bad_pkey", self.drop_bad_pkey),
            ("drop_out_of_sequence", self.drop_out_of_sequence),
            ("drop_duplicate_mismatch", self.drop_duplicate_mismatch),
            ("drop_answer_queue_full", self.drop_answer_queue_full),
            ("uc_messages_dropped", self.uc_messages_dropped),
            ("ud_messages_dropped", self.ud_messages_dropped),
            ("cnp_received", self.cnp_received),
            ("cq_overruns", self.cq_overruns),
        ]
    }
}
