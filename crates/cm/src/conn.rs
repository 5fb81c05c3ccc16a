//! One IB CM connection: its state (IBA 12.9, CM.md 3.1), the identities both ends
//! gave it, what the QP attributes need, and what is being retransmitted.
//!
//! A connection lives in the cm's table under its local communication ID, apart from
//! the rdma_cm id that made it: when the id is destroyed the connection can still owe
//! a DREQ retransmission or sit out its timewait.
//!
//! Transitions (`active.rs`, `passive.rs`, `disconnect.rs` carry them out):
//!
//! | state | input | action | next |
//! |---|---|---|---|
//! | (none) | connect | send REQ, timer | ReqSent |
//! | ReqSent | MRA(REQ) | longer wait | MraReqRcvd |
//! | ReqSent, MraReqRcvd | REP | QP to RTR/RTS (or CONNECT_RESPONSE) | RepRcvd |
//! | ReqSent, MraReqRcvd | REJ | REJECTED | gone (timewait if reason 10) |
//! | ReqSent, MraReqRcvd | timer, tries left / none | resend REQ / UNREACHABLE | same / gone |
//! | RepRcvd | QP ready, or establish | send RTU, ESTABLISHED | Established |
//! | RepRcvd | REP again | send MRA(REP) | MraRepSent |
//! | (none) | REQ | CONNECT_REQUEST | ReqRcvd |
//! | ReqRcvd | REQ again | send MRA(REQ) | MraReqSent |
//! | ReqRcvd, MraReqSent | accept (QP ready) | send REP, timer | RepSent |
//! | ReqRcvd, MraReqSent | reject | send REJ 28 | gone |
//! | RepSent | MRA(REP) | longer wait | MraRepRcvd |
//! | RepSent, MraRepRcvd | RTU, or COMM_EST | ESTABLISHED | Established |
//! | RepSent, MraRepRcvd | timer, tries left / none | resend REP / UNREACHABLE | same / gone |
//! | Established | REP again | send RTU again | Established |
//! | Established (or RepSent ... MraRepSent) | disconnect | send DREQ, timer | DreqSent |
//! | Established (or RepSent ... MraRepSent) | DREQ | DISCONNECTED | DreqRcvd |
//! | DreqSent | DREP | DISCONNECTED | Timewait |
//! | DreqSent | DREQ (crossing) | send DREP, DISCONNECTED | Timewait |
//! | DreqSent | timer, tries left / none | resend DREQ / DISCONNECTED (timed out) | same / Timewait |
//! | DreqRcvd | disconnect or destroy | send DREP | Timewait |
//! | Timewait | DREQ / REQ again | send DREP / REJ 10 | Timewait |
//! | Timewait | timer | TIMEWAIT_EXIT | gone |

use crate::handle::CmIdHandle;
use crate::types::IbMtu;
use core::time::Duration;
use softverbs_wire::cm::CmMadRepr;
use softverbs_wire::{Gid, Psn, Qpn};
use std::net::SocketAddr;

/// IB CM connection states (Linux names; IBA 12.9.6 figures 113-116).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IbState {
    /// Active: REQ sent, waiting for REP / REJ / MRA.
    ReqSent,
    /// Active: the peer sent MRA(REQ); waiting longer.
    MraReqRcvd,
    /// Passive: REQ handed to the consumer, nothing sent. rdma_cm's "delayed MRA":
    /// a duplicate REQ makes it send an MRA (CM.md 3.3.1).
    ReqRcvd,
    /// Passive: MRA(REQ) sent (after a duplicate REQ).
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the peer sent MRA(REP).
    MraRepRcvd,
    /// Active: REP received; the QP is being readied (or the consumer is to call
    /// establish).
    RepRcvd,
    /// Active: MRA(REP) sent (after a duplicate REP).
    MraRepSent,
    /// Both ways up.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received; the consumer is to answer (disconnect or destroy sends DREP).
    DreqRcvd,
    /// Closed; waiting for stray packets of the old connection to die.
    Timewait,
}

impl IbState {
    /// Whether the connection still stands for a QP pair (stale detection applies).
    pub fn is_live(self) -> bool {
        !matches!(self, IbState::Timewait)
    }
}

/// The path both ends agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnPath {
    pub local_gid: Gid,
    pub remote_gid: Gid,
    pub mtu: IbMtu,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub sl: u8,
}

/// A message that is retransmitted until answered.
#[derive(Debug, Clone)]
pub(crate) struct Outstanding {
    pub mad: CmMadRepr,
    /// Retransmissions left.
    pub retries_left: u8,
    /// Wait after each (re)transmission.
    pub timeout: Duration,
    /// Timer firings left in the linger of a DREQ whose id was destroyed before its
    /// DREP came (`Cm::lingering`): each but the last sends a copy, the last ends the
    /// linger. 0 when not lingering.
    pub linger_left: u8,
}

#[derive(Debug, Clone)]
pub(crate) struct IbConn {
    pub local_id: u32,
    /// The peer's communication ID (0 until the active side sees the REP).
    pub remote_id: u32,
    pub remote_guid: u64,
    /// The rdma_cm id it belongs to; `None` once that id is destroyed.
    pub owner: Option<CmIdHandle>,
    pub state: IbState,
    pub active: bool,
    /// Where CM messages for this connection go: the listener's rendezvous socket
    /// until the REP names the peer's device, then that device.
    pub peer: SocketAddr,
    /// Whether `peer` is the peer's device (not a rendezvous socket).
    pub peer_is_device: bool,
    /// Transaction ID of the REQ (REP, MRA, REJ and RTU reuse it).
    pub tid: u64,
    /// Transaction ID of the DREQ in progress (DREP reuses it).
    pub dreq_tid: u64,
    pub local_qpn: Qpn,
    pub remote_qpn: Qpn,
    /// The PSN this side's QP expects (its Starting PSN in REQ or REP).
    pub local_psn: Psn,
    /// The PSN this side's QP sends first (the peer's Starting PSN).
    pub remote_psn: Psn,
    /// READs/atomics this side's QP accepts as responder (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics this side's QP issues (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Transport retries of this side's QP.
    pub retry_count: u8,
    /// RNR retries of this side's QP.
    pub rnr_retry: u8,
    pub path: ConnPath,
    /// This side's QP local ACK timeout code; also sets the timewait.
    pub qp_timeout: u8,
    /// Response timeout for this side's REQ / REP / DREQ retransmissions.
    pub response_timeout: Duration,
    /// How many times a message is retransmitted before giving up.
    pub max_retries: u8,
    /// The message being retransmitted, if any.
    pub outstanding: Option<Outstanding>,
    /// The last reply sent that a duplicate must get again (RTU, MRA, DREP).
    pub last_reply: Option<CmMadRepr>,
    /// Active side: what the REP said, for the ESTABLISHED / CONNECT_RESPONSE event.
    pub reply_param: Option<crate::event::ConnEventParam>,
}
