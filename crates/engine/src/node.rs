//! The sans-IO surface shared by everything that drives an engine: the UDP driver
//! and the simulator both speak to a [`Node`].

use crate::time::Instant;
use std::net::SocketAddr;

/// A datagram the node wants sent: its bytes are in the buffer passed to
/// [`Node::poll_transmit`], `len` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where the datagram goes (IP address and UDP port).
    pub dst: SocketAddr,
    /// How many bytes of the buffer hold the datagram (the UDP payload).
    pub len: usize,
}

/// Inputs and outputs of a sans-IO protocol endpoint.
pub trait Node {
    /// The address datagrams from this node carry as their source.
    fn local_addr(&self) -> SocketAddr;
    /// A datagram arrived from `src` (its UDP payload is `data`).
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]);
    /// Timers that are due at `now` fire.
    fn handle_timeout(&mut self, now: Instant);
    /// The next datagram to send, written into `buf` (at least [`MAX_DATAGRAM`] bytes).
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit>;
    /// When [`Node::handle_timeout`] should next be called, if ever.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// The largest datagram a node emits: a 4096-byte payload plus every header.
pub const MAX_DATAGRAM: usize = 4096 + 128;
