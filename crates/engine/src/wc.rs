//! Work completions: what the engine reports on completion queues.

use softverbs_wire::{Qpn, Rkey};

/// Completion status (values as `enum ibv_wc_status`). Statuses are data: an error
/// completion is a normal result of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// The work request completed.
    #[default]
    Success = 0,
    /// Local length error: a message did not fit, or an SGE list was malformed.
    LocLenErr = 1,
    /// Local QP operation error: the request is not valid for the QP.
    LocQpOpErr = 2,
    /// Local EE context operation error (RD; never produced).
    LocEecOpErr = 3,
    /// Local protection error: an lkey, bound or access right check failed.
    LocProtErr = 4,
    /// Flushed: the QP went to the error state before the request was done.
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response: an unexpected transport opcode came back.
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// The responder NAKed the request as invalid.
    RemInvReqErr = 9,
    /// The responder NAKed an R_Key, access or bounds violation.
    RemAccessErr = 10,
    /// The responder could not complete the operation.
    RemOpErr = 11,
    /// The transport retry counter was exhausted (no ACK in time).
    RetryExcErr = 12,
    /// The RNR retry counter was exhausted.
    RnrRetryExcErr = 13,
    /// Local RDD violation (RD; never produced).
    LocRddViolErr = 14,
    /// Remote invalid RD request.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number (RD; never produced).
    InvEecnErr = 17,
    /// Invalid EE context state (RD; never produced).
    InvEecStateErr = 18,
    /// Fatal error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// General error.
    GeneralErr = 21,
}

/// What a completion is for (values as `enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcOpcode {
    /// SEND (any flavour).
    #[default]
    Send = 0,
    /// RDMA WRITE (any flavour).
    RdmaWrite = 1,
    /// RDMA READ.
    RdmaRead = 2,
    /// Atomic compare and swap.
    CompSwap = 3,
    /// Atomic fetch and add.
    FetchAdd = 4,
    /// Memory window bind.
    BindMw = 5,
    /// Local invalidate.
    LocalInv = 6,
    /// A receive consumed by a SEND.
    Recv = 128,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WorkCompletion {
    /// The source LID of a UD receive: the sender device's UDP port, which names
    /// it on the same host (0 when unknown or not a valid unicast LID).
    pub fn slid(&self) -> u16 {
        match self.src_addr.map(|a| a.port()) {
            Some(port) if port < 0xc000 => port,
            _ => 0,
        }
    }

    /// The service level: softverbs has one (0).
    pub fn sl(&self) -> u8 {
        0
    }
}

/// One completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation (meaningful for successful completions only, as in verbs).
    pub opcode: WcOpcode,
    /// Bytes received (receives) or read (RDMA READ, atomics: 8).
    pub byte_len: u32,
    /// Immediate data, in network byte order as carried.
    pub imm_data: Option<u32>,
    /// The R_Key a SEND with invalidate invalidated.
    pub invalidated_rkey: Option<Rkey>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The remote QP (receives).
    pub src_qp: Qpn,
    /// The solicited event bit of the message (receives).
    pub solicited: bool,
    /// Where a UD message came from (its device's UDP endpoint), for replies
    /// (`ah_from_wc`).
    pub src_addr: Option<std::net::SocketAddr>,
    /// The first 40 bytes of the receive buffer hold a GRH (UD receives).
    pub grh: bool,
}
