//! The rsockets stream protocol of rdma-core 44 (`librdmacm/rsocket.c`), sans-IO.
//!
//! An rsocket stream is an RC connection made with rdma_cm whose data and control travel as
//! RDMA WRITE WITH IMMEDIATE messages into ring buffers the peer registered and advertised.
//! This crate holds the rules and does no I/O: what the 40-byte connection private data says
//! ([`ConnData`]), what an immediate value means ([`Msg`]), how the in-band SGEs look
//! ([`RsSge`], [`IomapEntry`]), and the per-connection accounting ([`StreamCore`]): which
//! remote region the next data write goes to, send credits, the send ring, the receive ring,
//! when to grant the peer more room, shutdown and disconnect. A driver owns the QP and the
//! registered buffers, carries out the work requests the core describes and reports their
//! completions back.
//!
//! Datagram rsockets (SOCK_DGRAM: UD QPs, with a UDP socket to find peers) are in
//! [`dgram`].
//!
//! Facts follow the project's CM reference §5 (rsockets protocol) and rdma-core 44's
//! rsocket.c; behaviour is read there, the code here is our own.
#![warn(missing_docs)]

mod conn_data;
pub mod dgram;
mod msg;
mod sge;
mod stream;

pub use conn_data::{
    iomap_size_from_scale, iomap_size_to_scale, ConnData, ConnDataError, PlacedWordAd,
    CONN_DATA_LEN, CONN_FLAG_IOMAP, CONN_FLAG_NET, PLACED_WORD_AD_LEN, RS_VERSION,
};
pub use msg::{Ctrl, Msg, MAX_DATA_LEN};
pub use sge::{IomapEntry, RsSge, SgeOrder, IOMAP_ENTRY_LEN, RS_SGE_LEN};
pub use stream::{placed_word_check, placed_word_count};
pub use stream::{
    AheadStats, Announcement, Config, ConfigError, CtrlWrite, DataWrite, LocalRegions,
    ProtocolError, RecvChunk, SendChunks, SendStage, Shutdown, StreamCore, WrKind, CTRL_SLOTS,
    DEFAULT_RING, MAX_TRANSFER, PLACED_WORD_LEN, SGL_SLOTS, SNDLOWAT, TARGET_AREA_HEAD,
};
