//! Errors of the cm's calls. (Statuses peers cause — rejects, timeouts — arrive as
//! events, not errors.)

use crate::types::IdState;

/// Why a call was refused. Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// The handle names no live id (ENOENT / EINVAL).
    #[error("no such rdma_cm id")]
    UnknownId,
    /// The call is not allowed in the id's state (EINVAL).
    #[error("{op} is not allowed in state {state:?}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// The id's state.
        state: IdState,
    },
    /// Another id holds the address and port (EADDRINUSE).
    #[error("address and port in use")]
    AddrInUse,
    /// An argument is wrong; the text says which (EINVAL).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// More private data than the message carries (EINVAL).
    #[error("{len} bytes of private data, at most {max} allowed")]
    PrivateDataTooLong {
        /// The limit.
        max: usize,
        /// The bytes given.
        len: usize,
    },
    /// Not supported by softverbs; the text says what (EOPNOTSUPP).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// No ephemeral port is free (EADDRNOTAVAIL).
    #[error("no free port")]
    NoFreePort,
}
