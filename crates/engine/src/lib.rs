//! softverbs-engine: the RDMA transport, sans-IO.
//!
//! An [`Engine`] is one softverbs device: protection domains, memory regions,
//! completion queues and queue pairs, and the RC transport that runs between
//! them and their peers. It does no I/O and reads no clock: the caller hands it
//! received datagrams and the current time, and takes datagrams to send (unsealed:
//! the caller seals each for the IPv4 ID it goes out with, [`Transmit::seal`]),
//! completions, async events and the next timer deadline. The UDP driver and the
//! deterministic simulator (`softverbs-sim`) both drive it that way.
//!
//! Registered memory is the application's: it is touched only in the `memory`
//! module, behind bounds checks; everything else is safe code.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod closed;
mod config;
pub mod copy;
mod counters;
mod cq;
mod engine;
mod event;
mod memory;
mod mr;
mod mw;
pub mod node;
pub mod qp;
mod shared;
mod slab;
mod srq;
pub mod time;
pub mod timers;
mod types;
mod wc;
mod wr;

pub use config::{EngineConfig, IcrcPolicy};
pub use counters::Counters;
pub use engine::{Engine, HeldWr, PlacedTarget, PostError, ResourceError};
pub use event::AsyncEvent;
pub use mw::{BindMwError, MwBindInfo, MwInfo, MwType};
pub use node::{Node, Transmit, MAX_DATAGRAM};
pub use qp::attr::{QpAttr, QpAttrMask, QpCap, QpInitAttr};
pub use qp::responder::AnswerQueue;
pub use qp::selective::HeldAhead;
pub use qp::ModifyQpError;
pub use softverbs_wire::{Psn, Qpn, Rkey};
pub use srq::{SrqAttr, SrqInitAttr};
pub use time::Instant;
pub use types::{
    AccessFlags, CqHandle, MrHandle, MrInfo, Mtu, MwHandle, PdHandle, QpHandle, QpState, QpType,
    SrqHandle,
};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, Sge};
