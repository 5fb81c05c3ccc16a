//! softverbs-engine: the RDMA transport, sans-IO.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod node;
pub mod time;

pub use node::{Node, Transmit, MAX_DATAGRAM};
pub use time::Instant;
