//! Stream sockets over RDMA: [`RdmaStream`] and [`RdmaListener`], the rsockets protocol of
//! rdma-core 44 (so a peer is `rstream`, `riostream` or any rsocket program) over RC QPs
//! made with the connection manager.
//!
//! Each connection registers three regions: a receive ring the peer writes stream data
//! into with RDMA WRITE WITH IMMEDIATE, a target area where the peer writes buffer grants
//! and iomap entries, and a send ring writes are staged in (small writes go inline). The
//! protocol's accounting — credits, grants, which remote half-buffer the next write goes
//! to, shutdown — is `softverbs-sock`'s [`StreamCore`](softverbs_sock::StreamCore); this
//! module posts what it asks for and feeds it completions.
//!
//! ```no_run
//! use softverbs::sock::{RdmaListener, RdmaStream};
//! use std::io::{Read, Write};
//! let listener = RdmaListener::bind("127.0.0.1:7471".parse()?)?;
//! let mut client = RdmaStream::connect("127.0.0.1:7471".parse()?)?;
//! let (mut server, _peer) = listener.accept()?;
//! client.write_all(b"ping")?;
//! let mut buf = [0u8; 4];
//! server.read_exact(&mut buf)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod apart;
mod bound;
mod listener;
mod ring;
mod stream;
#[cfg(feature = "tokio")]
mod tokio;

#[cfg(feature = "tokio")]
pub use self::tokio::{AsyncRdmaListener, AsyncRdmaStream};
pub use bound::{BindOptions, RdmaSocket};
pub use listener::RdmaListener;
pub use softverbs_sock::Config as StreamConfig;
pub use stream::{DeviceWatch, RdmaStream, Readiness, StreamOptions};
