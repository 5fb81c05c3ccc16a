//! Shared receive queues (IBA 10.2.9): one pool of receive WQEs that many QPs
//! consume from.

use crate::qp::queues::RecvQueue;
use crate::types::PdHandle;

/// Arguments of `create_srq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Most receive WQEs outstanding.
    pub max_wr: u32,
    /// Most SGEs per receive WQE.
    pub max_sge: u32,
    /// Limit that arms the SRQ_LIMIT_REACHED event (0: not armed).
    pub srq_limit: u32,
}

/// What `query_srq` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Capacity.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Armed limit (0 once the event fired or when never armed).
    pub srq_limit: u32,
}

pub(crate) struct Srq {
    pub pd: PdHandle,
    pub rq: RecvQueue,
    pub max_wr: u32,
    pub max_sge: u32,
    /// When armed (non-zero), falling below this many WQEs raises
    /// SRQ_LIMIT_REACHED once and disarms (IBA 10.2.9.3).
    pub limit: u32,
    /// QPs attached.
    pub users: u32,
}

impl Srq {
    /// Whether taking a WQE just crossed the armed limit; disarms if so.
    pub fn crossed_limit(&mut self) -> bool {
        if self.limit != 0 && self.rq.len() < u64::from(self.limit) {
            self.limit = 0;
            true
        } else {
            false
        }
    }
}
