//! Errors of the verbs API, one enum per kind of operation. Completion statuses
//! are not errors: they are data in [`crate::WorkCompletion`].

pub use crate::driver::OpenError;
pub use softverbs_engine::{ModifyQpError, PostError, ResourceError};

/// Errors of [`crate::Qp::attach_mcast`] and [`crate::Qp::detach_mcast`].
#[derive(Debug, thiserror::Error)]
pub enum McastError {
    /// The engine refused: not a UD QP, not a multicast GID, not attached.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// The device could not join the group's IP multicast address.
    #[error("cannot join multicast group {group}: {source}")]
    Join {
        /// The group's address and UDP port.
        group: std::net::SocketAddr,
        /// What the kernel said.
        source: std::io::Error,
    },
}

/// Errors of `query_*` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// softverbs devices have one port, number 1.
    #[error("no port {0} (softverbs devices have port 1)")]
    NoSuchPort(u8),
    /// The GID table has one entry, index 0.
    #[error("no GID at index {0} (the GID table has one entry)")]
    NoSuchGid(u16),
}
