//! softverbs-wire: RoCEv2 packets as bytes.
//!
//! Everything here is pure: no I/O, no clock, no `unsafe`. The layout follows the
//! smoltcp `wire` habit: a packet *view* (`Bth<T: AsRef<[u8]>>`, ...) checks its
//! length once in `new_checked`, after which no accessor can panic; a `Repr`
//! struct parses from a view and emits into a buffer.
//!
//! Spec references are to the InfiniBand Architecture Specification Volume 1,
//! release 1.4 ("IBA"), chapter 9 (transport layer), chapters 12-13 (communication
//! management, MADs) and Annex A17 (RoCEv2).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod field;
pub mod gid;
pub mod headers;
pub mod icrc;
pub mod ip;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod samehost;
#[doc(hidden)]
pub mod testing;
pub mod types;

pub use gid::Gid;
pub use headers::{
    aeth::{Aeth, AethRepr, AethSyndrome, NakCode},
    atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr},
    atomic_eth::{AtomicEth, AtomicEthRepr},
    bth::{Bth, BthRepr},
    deth::{Deth, DethRepr},
    immdt::{Ieth, ImmDt},
    reth::{Reth, RethRepr},
};
pub use opcode::{HeaderSet, OpKind, Opcode, OpcodeInfo, Position, Transport};
pub use packet::{PacketRepr, RocePacket};
pub use types::{Psn, Qkey, Qpn, Rkey};

/// Why a byte string is not a well-formed RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the headers it must hold.
    #[error("packet truncated")]
    Truncated,
    /// The BTH opcode is not one softverbs implements.
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0 (IBA 9.2.1: TVer must be 0).
    #[error("unsupported transport header version {0}")]
    BadVersion(u8),
    /// The BTH pad count is larger than the payload it pads, or payload and pad do
    /// not end on a 4-byte boundary.
    #[error("pad count does not pad the payload to a 4-byte boundary")]
    BadPadding,
    /// The opcode carries no payload, yet bytes follow its headers.
    #[error("opcode carries no payload but {0} bytes follow the headers")]
    UnexpectedPayload(usize),
    /// The AETH syndrome uses a reserved encoding.
    #[error("reserved AETH syndrome {0:#04x}")]
    BadSyndrome(u8),
    /// A repr's extension headers do not match what its opcode calls for.
    #[error("extension headers do not match the opcode")]
    HeaderMismatch,
    /// The buffer given to an emitter is too small.
    #[error("buffer too small to emit the packet")]
    BufferTooSmall,
    /// A buffer that must have one exact length has another (a MAD is 256 bytes).
    #[error("expected {expected} bytes, got {got}")]
    BadLength {
        /// The length required.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A field holds a value this implementation refuses (reserved, or not one of
    /// the values it speaks); the text names the field.
    #[error("invalid {0}")]
    InvalidField(&'static str),
    /// A CM MAD of an attribute (message type) that is not supported.
    #[error("unsupported CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// More private data than the message's field holds.
    #[error("{len} bytes of private data, the field holds {max}")]
    PrivateDataTooLong {
        /// The field's size.
        max: usize,
        /// The bytes given.
        len: usize,
    },
    /// A datagram to QP1 that is not a GSI datagram; the text says why.
    #[error("not a QP1 (GSI) datagram: {0}")]
    NotGsi(&'static str),
}

/// Shorthand for results of this crate.
pub type Result<T> = core::result::Result<T, Error>;
