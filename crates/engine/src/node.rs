//! The sans-IO surface shared by everything that drives an engine: the UDP driver
//! and the simulator both speak to a [`Node`].

use crate::time::Instant;
use softverbs_wire::icrc::{self, IcrcContext};
use std::net::SocketAddr;

/// A datagram the engine wants sent: its bytes are in the buffer passed to
/// `poll_transmit`, `len` of them, between the addresses the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where the datagram comes from: the sender's IP address and UDP port.
    pub src: SocketAddr,
    /// Where the datagram goes (IP address and UDP port).
    pub dst: SocketAddr,
    /// How many bytes of the buffer hold the datagram (the UDP payload).
    pub len: usize,
}

impl Transmit {
    /// Seals the packet: computes its ICRC for the IPv4 Identification it will carry
    /// on the wire and writes it into the packet's last four bytes.
    ///
    /// [`crate::Engine::poll_transmit`] emits packets unsealed, because the ICRC
    /// covers the IPv4 ID and only whoever sends the datagram knows it: 0 for a
    /// datagram sent alone with DF on an unconnected socket, k for segment k of a
    /// UDP GSO send (see DESIGN.md). So a driver seals each packet once, when it
    /// knows the packet's place.
    pub fn seal(&self, packet: &mut [u8], ipv4_id: u16) {
        let ctx = IcrcContext {
            ipv4_id,
            ..IcrcContext::new(self.src, self.dst)
        };
        // The engine emits whole packets with room for the ICRC; a buffer that is
        // not one is left as it is (a receiver drops it).
        let len = self.len.min(packet.len());
        let _ = icrc::fill(&ctx, &mut packet[..len]);
    }
}

/// Inputs and outputs of a sans-IO protocol endpoint.
pub trait Node {
    /// The address datagrams from this node carry as their source.
    fn local_addr(&self) -> SocketAddr;
    /// A datagram arrived from `src` (its UDP payload is `data`).
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]);
    /// Timers that are due at `now` fire.
    fn handle_timeout(&mut self, now: Instant);
    /// The next datagram to send, written into `buf` (at least [`MAX_DATAGRAM`] bytes)
    /// ready for the wire.
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit>;
    /// When [`Node::handle_timeout`] should next be called, if ever.
    fn poll_timeout(&self) -> Option<Instant>;
}

/// The largest datagram a node emits: a 4096-byte payload plus every header.
pub const MAX_DATAGRAM: usize = 4096 + 128;

/// The addresses a received datagram travelled between, as the driver that read it
/// knows them: they are covered by its ICRC, and a UD receive reports them in its
/// GRH area and completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// The sender's IP address and UDP port.
    pub src: SocketAddr,
    /// The address the datagram was sent to: this device's, or a multicast group's.
    pub dst: SocketAddr,
}
