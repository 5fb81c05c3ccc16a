//! Errors of the verbs API, one enum per kind of operation. Completion statuses
//! are not errors: they are data in [`crate::WorkCompletion`].

pub use crate::addressing::BindError;
pub use crate::device::Inherited;
pub use crate::driver::OpenError;
pub use softverbs_engine::{BindMwError, ModifyQpError, PostError, QpState, ResourceError};

/// Errors of [`crate::Qp::attach_mcast`] and [`crate::Qp::detach_mcast`].
#[derive(Debug, thiserror::Error)]
pub enum McastError {
    /// The engine refused: not a UD QP, not a multicast GID, not attached, or the
    /// device's multicast limits are reached (`LimitReached`).
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
    /// The device was inherited across `fork()`.
    #[error(transparent)]
    Inherited(#[from] Inherited),
}

/// Errors of memory registration.
#[derive(Debug, thiserror::Error)]
pub enum RegMrError {
    /// The engine refused (bad access flags, no such PD, too many regions, empty).
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// Part of the range is not mapped, or is read-only while the access flags let the
    /// region be written (as the kernel's pinning refuses it: EFAULT).
    #[error("cannot register {len} bytes at {addr:#x}: {why}")]
    Fault {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The registration would pass the device's cap on registered bytes
    /// (`SOFTVERBS_MAX_MR_BYTES`; ENOMEM as the kernel's locked-memory limit).
    #[error("registering {len} more bytes passes the device's cap of {cap} registered bytes")]
    TooMuch {
        /// The region's length.
        len: usize,
        /// The cap.
        cap: u64,
    },
    /// The device was inherited across `fork()`.
    #[error(transparent)]
    Inherited(#[from] Inherited),
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

// The engine's error enums have no variant for a device that belongs to another process;
// these are the closest, so that `?` works in the Rust API. The C ABI checks for an
// inherited device first and answers EIO.
impl From<Inherited> for ResourceError {
    fn from(_: Inherited) -> Self {
        ResourceError::Unsupported("the device was inherited across fork()")
    }
}

impl From<Inherited> for PostError {
    fn from(_: Inherited) -> Self {
        PostError::InvalidState(QpState::Err)
    }
}

impl From<Inherited> for ModifyQpError {
    fn from(_: Inherited) -> Self {
        ModifyQpError::InvalidValue("the device was inherited across fork()")
    }
}

impl From<Inherited> for BindMwError {
    fn from(i: Inherited) -> Self {
        BindMwError::Post(i.into())
    }
}
