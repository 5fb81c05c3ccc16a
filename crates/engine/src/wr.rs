//! Work requests: what applications post to send and receive queues.

use crate::types::flags;
use core::fmt;
use softverbs_wire::Rkey;

/// A scatter/gather element: `length` bytes at `addr` inside the memory region
/// whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region holding the range.
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with 32 bits of immediate data (kept in network byte order).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND that invalidates `rkey` at the responder.
    SendWithInv {
        /// Key to invalidate.
        rkey: Rkey,
    },
    /// RDMA WRITE.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// RDMA WRITE with immediate data, which consumes a receive WQE at the peer.
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// 64-bit compare and swap on an 8-byte aligned remote word; the old value lands
    /// in the single 8-byte local SGE.
    AtomicCmpSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value compared with the remote word.
        compare: u64,
        /// Value stored when they are equal.
        swap: u64,
    },
    /// 64-bit fetch and add.
    AtomicFetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Addend.
        add: u64,
    },
    /// UD SEND (with immediate data when `imm` is set) of at most one path MTU to
    /// `remote_qpn` at `dest` (IBA 9.8.4). A `remote_qkey` with its top bit set
    /// means "use this QP's own Q_Key" (IBA 10.2.4).
    UdSend {
        /// The destination device's UDP endpoint (from an address handle).
        dest: std::net::SocketAddr,
        /// The destination QP.
        remote_qpn: softverbs_wire::Qpn,
        /// The Q_Key the destination QP expects.
        remote_qkey: softverbs_wire::Qkey,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Binds a memory window to part of a memory region (IBA 10.6.7.2,
    /// IBV_WR_BIND_MW). Type 2 windows are bound this way; type 1 windows only
    /// through [`crate::Engine::bind_mw`]. Executes locally, in order with the
    /// other work requests; completes with `WcOpcode::BindMw` or `MwBindErr`.
    BindMw {
        /// The window.
        mw: crate::types::MwHandle,
        /// The window's rkey after the bind: its current key with the low byte
        /// the caller chose (as `ibv_inc_rkey`).
        rkey: Rkey,
        /// What to bind it to.
        info: crate::mw::MwBindInfo,
    },
    /// Invalidates a type 2 memory window, or a region registered for remote
    /// invalidation, by its rkey (IBA 10.6.7.2.4, IBV_WR_LOCAL_INV). Executes
    /// locally; completes with `WcOpcode::LocalInv`.
    LocalInv {
        /// Key to invalidate.
        rkey: Rkey,
    },
}

impl SendOp {
    /// Whether the operation is an RDMA READ or an atomic (limited by max_rd_atomic).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// Whether the operation is carried out locally, sending nothing (memory
    /// window bind, local invalidate).
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// Whether the operation is an atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
}

flags!(
    /// Send work request flags (values as `enum ibv_send_flags`).
    SendFlags: u32 {
        /// Wait for earlier READs and atomics to complete before starting.
        FENCE = 1;
        /// Generate a completion even if the QP does not signal all WRs.
        SIGNALED = 1 << 1;
        /// Set the solicited event bit.
        SOLICITED = 1 << 2;
        /// The data was given inline (set by the engine for [`Payload::Inline`]).
        INLINE = 1 << 3;
    }
);

/// Where a send takes its data from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gathered from registered memory at transmit time.
    Sges(&'a [Sge]),
    /// Copied into the send queue at post time (at most `max_inline_data` bytes).
    Inline(&'a [u8]),
    /// Like [`Payload::Inline`], gathered from several pieces (at most `max_inline_data`
    /// bytes in all), each copied once, straight into the send queue.
    InlineParts(&'a [&'a [u8]]),
}

impl Payload<'_> {
    /// The bytes it names in all (for READ: where the data read lands).
    pub fn len(&self) -> usize {
        match self {
            Payload::Sges(sges) => sges.iter().map(|s| s.length as usize).sum(),
            Payload::Inline(bytes) => bytes.len(),
            Payload::InlineParts(parts) => parts.iter().map(|p| p.len()).sum(),
        }
    }

    /// Whether it names no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payload::Sges(s) => f.debug_tuple("Sges").field(s).finish(),
            Payload::Inline(d) => write!(f, "Inline({} bytes)", d.len()),
            Payload::InlineParts(p) => write!(
                f,
                "InlineParts({} bytes in {} parts)",
                p.iter().map(|d| d.len()).sum::<usize>(),
                p.len()
            ),
        }
    }
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Data to send (for READ and atomics: where results land; must be SGEs).
    pub payload: Payload<'a>,
    /// Flags.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A signaled work request gathering from `sges`.
    pub fn new(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            op,
            payload: Payload::Sges(sges),
            flags: SendFlags::SIGNALED,
        }
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers incoming data is scattered into.
    pub sges: &'a [Sge],
}
