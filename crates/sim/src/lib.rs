//! softverbs-sim: a deterministic simulated network for testing sans-IO
//! [`Node`](softverbs_engine::Node)s.
//!
//! A [`Sim`] holds nodes, routes their datagrams by destination address,
//! applies seeded [`Faults`] (loss, duplication, reordering, bit corruption,
//! delay and jitter), and drives a virtual clock: time jumps straight to the
//! next datagram arrival or timer deadline, so protocol timeouts of seconds
//! cost nothing to test. The same seed always gives the same run.
//!
//! ```
//! use softverbs_engine::{Instant, Node, Transmit};
//! use softverbs_sim::{Faults, Limits, Sim};
//! use std::net::SocketAddr;
//!
//! /// Sends one greeting to `peer` (if any) and counts what it receives.
//! struct Greeter {
//!     addr: SocketAddr,
//!     peer: Option<SocketAddr>,
//!     received: usize,
//! }
//!
//! impl Node for Greeter {
//!     fn local_addr(&self) -> SocketAddr {
//!         self.addr
//!     }
//!     fn handle_datagram(&mut self, _now: Instant, _src: SocketAddr, _data: &[u8]) {
//!         self.received += 1;
//!     }
//!     fn handle_timeout(&mut self, _now: Instant) {}
//!     fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
//!         let dst = self.peer.take()?;
//!         buf[..5].copy_from_slice(b"hello");
//!         Some(Transmit { src: self.addr, dst, len: 5 })
//!     }
//!     fn poll_timeout(&self) -> Option<Instant> {
//!         None
//!     }
//! }
//!
//! let (a, b) = ("10.0.0.1:4791".parse().unwrap(), "10.0.0.2:4791".parse().unwrap());
//! let mut sim = Sim::new(42, Faults::none());
//! sim.add_node(Greeter { addr: a, peer: Some(b), received: 0 });
//! let bob = sim.add_node(Greeter { addr: b, peer: None, received: 0 });
//! sim.run_until(Limits::default(), |sim| sim.node(bob).received == 1)?;
//! assert_eq!(sim.stats().delivered, 1);
//! # Ok::<(), softverbs_sim::SimError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod faults;
mod queue;
mod run;
mod sim;
mod stats;
mod trace;

pub use faults::{
    Burst, Faults, InvalidFaults, CHAOS_JITTER, DEFAULT_DELAY, DEFAULT_DUPLICATE_DELAY,
    DEFAULT_REORDER_DELAY,
};
pub use run::{Limits, RunReport, SimError};
pub use sim::{NodeId, Sim, MAX_TRANSMITS_PER_STEP};
pub use stats::Stats;
pub use trace::{Fate, TraceEntry};
