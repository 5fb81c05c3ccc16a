//! Send and receive queues: fixed rings allocated once at QP creation, so posting
//! and completing work never allocates.

use crate::types::QpState;
use crate::wc::WcStatus;
use crate::wr::{Payload, SendFlags, SendOp, Sge};
use softverbs_wire::Psn;

/// A send WQE and its transport progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    /// SGEs in use (payload from the SGE pool) or inline bytes (from the inline pool).
    pub num_sge: u16,
    pub inline_len: u32,
    /// Total message length in bytes.
    pub length: u32,
    /// PSNs assigned once the requester starts the WQE.
    pub first_psn: Psn,
    pub npsn: u32,
    /// RDMA READ: response packets placed so far.
    pub read_pkts_done: u32,
    /// Set when the transport is done with the WQE; it retires in order.
    pub done: Option<WcStatus>,
    /// Same-host path: the bytes of this RDMA WRITE or READ were moved before it was
    /// posted; its one packet carries the request's headers only (see
    /// `engine/placed.rs`).
    pub placed: bool,
    /// Same-host path: this RDMA WRITE or READ waits in the queue until the requests
    /// ahead of it that went by UDP have completed; then the driver places it or
    /// lets it go by UDP (`engine/placed.rs`). The requester starts no WQE while it
    /// is on one held.
    pub held: bool,
}

impl SendWqe {
    const EMPTY: SendWqe = SendWqe {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags::EMPTY,
        num_sge: 0,
        inline_len: 0,
        length: 0,
        first_psn: Psn::new(0),
        npsn: 0,
        read_pkts_done: 0,
        done: None,
        placed: false,
        held: false,
    };

    /// Whether the requester carries it out itself, with no packet: a local
    /// operation (memory window bind, local invalidate) or a placed READ or WRITE
    /// (without immediate), whose bytes are in place already (`engine/placed.rs`).
    pub fn runs_locally(&self) -> bool {
        self.op.is_local()
            || (self.placed
                && matches!(self.op, SendOp::RdmaRead { .. } | SendOp::RdmaWrite { .. }))
    }

    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npsn.saturating_sub(1))
    }

    pub fn contains_psn(&self, psn: Psn) -> bool {
        psn.in_window(self.first_psn, self.npsn)
    }
}

/// The send queue ring. WQEs are named by a sequence number that only grows; the
/// slot is `seq % capacity`.
pub(crate) struct SendQueue {
    slots: Vec<SendWqe>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    pub max_sge: usize,
    pub max_inline: usize,
    /// Oldest WQE not yet retired (completed by the transport).
    pub head: u64,
    /// Slots below this sequence number are free: their completions were polled
    /// (IBA 10.8.3.1: a WQE occupies the queue until its completion is retrieved).
    pub reclaimed: u64,
    /// Next sequence number to post.
    pub tail: u64,
    /// WQEs held for placement (`SendWqe::held`) not yet retired.
    pub held: u32,
}

/// Why a WR cannot be posted (the verbs call fails; nothing is queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostRefused {
    Full,
    TooManySge,
    InlineTooLong,
}

impl SendQueue {
    pub fn new(depth: usize, max_sge: usize, max_inline: usize) -> Self {
        SendQueue {
            slots: vec![SendWqe::EMPTY; depth],
            sges: vec![Sge::default(); depth * max_sge],
            inline: vec![0; depth * max_inline],
            max_sge,
            max_inline,
            head: 0,
            reclaimed: 0,
            tail: 0,
            held: 0,
        }
    }

    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// Slots taken: WQEs posted whose completion has not been polled.
    pub fn len(&self) -> u64 {
        self.tail - self.reclaimed
    }

    /// Free slots.
    pub fn free(&self) -> u64 {
        (self.slots.len() as u64).saturating_sub(self.len())
    }

    /// A completion was polled: the slots below `upto` are free again.
    pub fn reclaim(&mut self, upto: u64) {
        // Never beyond what the transport retired (a stale completion of a QP
        // reset since cannot free slots of WQEs posted after the reset).
        self.reclaimed = self.reclaimed.max(upto.min(self.head));
    }

    pub fn post(
        &mut self,
        wr_id: u64,
        op: SendOp,
        flags: SendFlags,
        payload: Payload<'_>,
    ) -> Result<u64, PostRefused> {
        if self.len() >= self.slots.len() as u64 {
            return Err(PostRefused::Full);
        }
        let seq = self.tail;
        let slot = self.slot(seq);
        let mut wqe = SendWqe {
            wr_id,
            op,
            flags,
            ..SendWqe::EMPTY
        };
        match payload {
            Payload::Sges(list) => {
                if list.len() > self.max_sge {
                    return Err(PostRefused::TooManySge);
                }
                self.sges[slot * self.max_sge..][..list.len()].copy_from_slice(list);
                wqe.num_sge = list.len() as u16;
                wqe.length = list
                    .iter()
                    .fold(0u32, |acc, s| acc.saturating_add(s.length));
            }
            Payload::Inline(data) => self.post_inline(slot, &mut wqe, &[data])?,
            Payload::InlineParts(parts) => self.post_inline(slot, &mut wqe, parts)?,
        }
        self.slots[slot] = wqe;
        self.tail += 1;
        Ok(seq)
    }

    /// Copies inline data (in pieces) into `slot`'s part of the inline pool.
    fn post_inline(
        &mut self,
        slot: usize,
        wqe: &mut SendWqe,
        parts: &[&[u8]],
    ) -> Result<(), PostRefused> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_inline {
            return Err(PostRefused::InlineTooLong);
        }
        let mut at = slot * self.max_inline;
        for p in parts {
            self.inline[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        wqe.flags |= SendFlags::INLINE;
        wqe.inline_len = len as u32;
        wqe.length = len as u32;
        Ok(())
    }

    pub fn get(&self, seq: u64) -> &SendWqe {
        &self.slots[self.slot(seq)]
    }

    pub fn get_mut(&mut self, seq: u64) -> &mut SendWqe {
        let slot = self.slot(seq);
        &mut self.slots[slot]
    }

    pub fn sges(&self, seq: u64) -> &[Sge] {
        let slot = self.slot(seq);
        &self.sges[slot * self.max_sge..][..usize::from(self.get(seq).num_sge)]
    }

    pub fn inline_data(&self, seq: u64) -> &[u8] {
        let slot = self.slot(seq);
        &self.inline[slot * self.max_inline..][..self.get(seq).inline_len as usize]
    }

    /// Bytes of SGE and inline pools (for memory accounting).
    pub fn footprint(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<SendWqe>()
            + self.sges.capacity() * core::mem::size_of::<Sge>()
            + self.inline.capacity()
    }
}

/// A posted receive.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub num_sge: u16,
    pub length: u32,
}

/// The receive queue ring.
pub(crate) struct RecvQueue {
    slots: Vec<RecvWqe>,
    sges: Vec<Sge>,
    pub max_sge: usize,
    pub head: u64,
    pub tail: u64,
}

impl RecvQueue {
    pub fn new(depth: usize, max_sge: usize) -> Self {
        RecvQueue {
            slots: vec![RecvWqe::default(); depth],
            sges: vec![Sge::default(); depth * max_sge],
            max_sge,
            head: 0,
            tail: 0,
        }
    }

    fn slot(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    pub fn len(&self) -> u64 {
        self.tail - self.head
    }

    pub fn post(&mut self, wr_id: u64, list: &[Sge]) -> Result<(), PostRefused> {
        if self.len() >= self.slots.len() as u64 {
            return Err(PostRefused::Full);
        }
        if list.len() > self.max_sge {
            return Err(PostRefused::TooManySge);
        }
        let slot = self.slot(self.tail);
        self.sges[slot * self.max_sge..][..list.len()].copy_from_slice(list);
        let length = list
            .iter()
            .fold(0u32, |acc, s| acc.saturating_add(s.length));
        self.slots[slot] = RecvWqe {
            wr_id,
            num_sge: list.len() as u16,
            length,
        };
        self.tail += 1;
        Ok(())
    }

    pub fn front(&self) -> Option<(&RecvWqe, &[Sge])> {
        if self.head == self.tail {
            return None;
        }
        let slot = self.slot(self.head);
        let wqe = &self.slots[slot];
        Some((
            wqe,
            &self.sges[slot * self.max_sge..][..usize::from(wqe.num_sge)],
        ))
    }

    /// The `n`th WQE from the head (0: the head), with its SGEs.
    pub fn nth(&self, n: u64) -> Option<(&RecvWqe, &[Sge])> {
        if n >= self.len() {
            return None;
        }
        let slot = self.slot(self.head + n);
        let wqe = &self.slots[slot];
        Some((
            wqe,
            &self.sges[slot * self.max_sge..][..usize::from(wqe.num_sge)],
        ))
    }

    pub fn pop(&mut self) -> Option<RecvWqe> {
        if self.head == self.tail {
            return None;
        }
        let wqe = self.slots[self.slot(self.head)];
        self.head += 1;
        Some(wqe)
    }

    pub fn footprint(&self) -> usize {
        self.slots.capacity() * core::mem::size_of::<RecvWqe>()
            + self.sges.capacity() * core::mem::size_of::<Sge>()
    }
}

/// States in which the send queue accepts new work requests.
pub(crate) fn can_post_send(state: QpState) -> bool {
    matches!(
        state,
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
    )
}

/// States in which the receive queue accepts new work requests (IBA 10.8.2: not
/// in RESET).
pub(crate) fn can_post_recv(state: QpState) -> bool {
    !matches!(state, QpState::Reset)
}
