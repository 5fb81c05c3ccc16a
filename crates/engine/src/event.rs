//! Asynchronous events (IBA 11.6.3, values named as `enum ibv_event_type`).

use crate::types::{CqHandle, QpHandle};

/// An asynchronous event: something happened that no work request reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A CQ overran: a completion was lost (IBV_EVENT_CQ_ERR).
    CqError(CqHandle),
    /// The responder hit an error that is not the requester's fault
    /// (IBV_EVENT_QP_FATAL).
    QpFatal(QpHandle),
    /// The responder received an invalid request (IBV_EVENT_QP_REQ_ERR).
    QpRequestError(QpHandle),
    /// The responder received a request that violated access rights
    /// (IBV_EVENT_QP_ACCESS_ERR).
    QpAccessError(QpHandle),
    /// The send queue drained after a move to SQD (IBV_EVENT_SQ_DRAINED).
    SqDrained(QpHandle),
    /// A QP attached to an SRQ reached the error state: it takes no more
    /// receive WQEs from the SRQ (IBV_EVENT_QP_LAST_WQE_REACHED).
    LastWqeReached(QpHandle),
    /// The port became active (IBV_EVENT_PORT_ACTIVE): raised by the driver once
    /// the device's socket is bound and its progress thread runs.
    PortActive,
    /// A connected QP in RTR received its first packet (IBV_EVENT_COMM_EST, IBA
    /// 11.6.3): the connection manager takes it in place of a lost RTU.
    CommEstablished(QpHandle),
    /// An armed SRQ fell below its limit (IBV_EVENT_SRQ_LIMIT_REACHED).
    SrqLimitReached(crate::types::SrqHandle),
}
