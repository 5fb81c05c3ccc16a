//! QP attributes and the attribute mask of `modify_qp`.

use crate::types::{flags, AccessFlags, CqHandle, Mtu, PdHandle, QpState, QpType};
use std::net::SocketAddr;

flags!(
    /// Which attributes a `modify_qp` call sets (values as `enum ibv_qp_attr_mask`).
    QpAttrMask: u32 {
        /// qp_state.
        STATE = 1;
        /// cur_qp_state.
        CUR_STATE = 1 << 1;
        /// en_sqd_async_notify.
        EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// qp_access_flags.
        ACCESS_FLAGS = 1 << 3;
        /// pkey_index.
        PKEY_INDEX = 1 << 4;
        /// port_num.
        PORT = 1 << 5;
        /// qkey.
        QKEY = 1 << 6;
        /// ah_attr (the primary path's address vector).
        AV = 1 << 7;
        /// path_mtu.
        PATH_MTU = 1 << 8;
        /// timeout.
        TIMEOUT = 1 << 9;
        /// retry_cnt.
        RETRY_CNT = 1 << 10;
        /// rnr_retry.
        RNR_RETRY = 1 << 11;
        /// rq_psn.
        RQ_PSN = 1 << 12;
        /// max_rd_atomic.
        MAX_QP_RD_ATOMIC = 1 << 13;
        /// alt_ah_attr and friends.
        ALT_PATH = 1 << 14;
        /// min_rnr_timer.
        MIN_RNR_TIMER = 1 << 15;
        /// sq_psn.
        SQ_PSN = 1 << 16;
        /// max_dest_rd_atomic.
        MAX_DEST_RD_ATOMIC = 1 << 17;
        /// path_mig_state.
        PATH_MIG_STATE = 1 << 18;
        /// cap.
        CAP = 1 << 19;
        /// dest_qp_num.
        DEST_QPN = 1 << 20;
    }
);

/// Capacities of a QP's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// Arguments of `create_qp`.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr {
    /// Protection domain.
    pub pd: PdHandle,
    /// CQ for send completions.
    pub send_cq: CqHandle,
    /// CQ for receive completions.
    pub recv_cq: CqHandle,
    /// Transport.
    pub qp_type: QpType,
    /// Queue capacities.
    pub cap: QpCap,
    /// Generate a completion for every send WR, signaled or not.
    pub sq_sig_all: bool,
}

/// Attributes of a QP, as `modify_qp` sets them and `query_qp` returns them.
/// Only the fields named in the mask are read by `modify_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// The state the caller believes the QP is in.
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Queue key (UD).
    pub qkey: u32,
    /// First PSN the responder expects.
    pub rq_psn: u32,
    /// First PSN the requester sends.
    pub sq_psn: u32,
    /// Remote QPN (RC, UC).
    pub dest_qp_num: u32,
    /// Remote operations the responder allows (REMOTE_WRITE / READ / ATOMIC).
    pub qp_access_flags: AccessFlags,
    /// Queue capacities (query only).
    pub cap: QpCap,
    /// Where packets go: the peer's IP address and UDP port (RC, UC).
    pub av: Option<SocketAddr>,
    /// P_Key index (softverbs has one P_Key: index 0).
    pub pkey_index: u16,
    /// Ask for an SQ_DRAINED event on entering SQD.
    pub en_sqd_async_notify: bool,
    /// Whether the SQ is draining (query only).
    pub sq_draining: bool,
    /// READs and atomics this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// READs and atomics this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code the responder sends.
    pub min_rnr_timer: u8,
    /// Port (softverbs devices have port 1).
    pub port_num: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::EMPTY,
            cap: QpCap::default(),
            av: None,
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}
