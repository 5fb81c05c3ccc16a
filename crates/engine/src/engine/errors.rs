//! Errors of the engine's verbs calls (statuses the spec defines, such as work
//! completion statuses, are data, not errors).

use crate::qp::queues::PostRefused;
use crate::types::QpState;

/// Errors of object creation and destruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A handle names no live object.
    #[error("no such object")]
    UnknownObject,
    /// The device limit for this kind of object is reached.
    #[error("device limit reached")]
    LimitReached,
    /// A size or count is zero or beyond the device's limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Other objects still use this one.
    #[error("object in use")]
    Busy,
    /// softverbs does not implement this.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

/// Errors of `post_send` and `post_recv`; nothing is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The QP does not exist.
    #[error("no such QP")]
    UnknownQp,
    /// The QP's state does not accept this queue's work requests.
    #[error("QP in state {0:?} does not accept this work request")]
    InvalidState(QpState),
    /// The queue is full. A send queue slot is free again only once its WR's
    /// completion was polled (an unsignaled WR's: once a later signaled completion
    /// of the queue was), as on hardware.
    #[error("queue full")]
    QueueFull,
    /// More SGEs than the QP was created with.
    #[error("too many SGEs")]
    TooManySge,
    /// More inline data than max_inline_data.
    #[error("inline data longer than max_inline_data")]
    InlineTooLong,
    /// The QP takes its receives from an SRQ: post them there.
    #[error("the QP uses a shared receive queue; post receives to the SRQ")]
    UsesSrq,
    /// The operation does not exist for this QP type.
    #[error("operation not valid for this QP type")]
    InvalidOpcode,
}

impl From<PostRefused> for PostError {
    fn from(r: PostRefused) -> Self {
        match r {
            PostRefused::Full => PostError::QueueFull,
            PostRefused::TooManySge => PostError::TooManySge,
            PostRefused::InlineTooLong => PostError::InlineTooLong,
        }
    }
}
