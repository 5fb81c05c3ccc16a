//! Datagram rsockets (`rsocket(AF_INET, SOCK_DGRAM, 0)`), sans-IO: the headers rdma-core 44
//! puts on the wire ([`header`]) and one rsocket's state ([`DgramCore`]). See
//! docs/sockets.md, "Datagram rsockets".

pub mod header;

mod core;
#[cfg(test)]
mod tests;

pub use self::core::{
    Datagram, DgramConfig, DgramCore, DgramSizes, DgramStats, LocalQp, Payload, Route, SendError,
    SendPlan, UdVerdict, UdpError, UdpOutcome, MAX_DESTS, SLOT_SIZE,
};
pub use header::{DeviceTrailer, DsHeader, HeaderError, UdpHeader, UdpOp};
