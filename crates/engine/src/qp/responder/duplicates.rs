//! Duplicate requests (IBA 9.7.5.1.1): a request with a PSN before the expected one
//! is answered again, never executed again. SEND and RDMA WRITE are re-ACKed; READ
//! responses are regenerated from memory, but only for what the original READ asked
//! for; atomic results are replayed from a cache of the last max_dest_rd_atomic
//! READs and atomics.

use super::answers::Outgoing;
use super::{RecvCtx, Responder};
use crate::types::AccessFlags;
use softverbs_wire::{OpKind, Psn, Rkey, RocePacket};
use std::collections::VecDeque;

/// A READ or atomic the responder executed, kept to answer duplicates.
#[derive(Debug, Clone, Copy)]
pub(super) struct Executed {
    first_psn: Psn,
    npsn: u32,
    what: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A READ's address, R_Key and length, which a duplicate must repeat.
    Read { va: u64, rkey: Rkey, dma_len: u32 },
    /// The original value an atomic returned.
    Atomic { orig: u64 },
}

impl Executed {
    pub fn read(first_psn: Psn, npsn: u32, va: u64, rkey: Rkey, dma_len: u32) -> Self {
        Executed {
            first_psn,
            npsn,
            what: Kind::Read { va, rkey, dma_len },
        }
    }

    pub fn atomic(psn: Psn, orig: u64) -> Self {
        Executed {
            first_psn: psn,
            npsn: 1,
            what: Kind::Atomic { orig },
        }
    }

    /// Whether a duplicate READ request at `psn` for `dma_len` bytes at `va` through
    /// `rkey` asks for the rest of this READ from `psn` on: the same key, the address
    /// advanced by the packets before `psn`, and the rest of the length.
    /// Whether a duplicate READ request asks for a run of whole responses of
    /// this READ from `psn` on (selective repeat asks for the missing ones
    /// only): the same key, the address advanced by the packets before `psn`, a
    /// length within the rest, in whole MTUs unless it reaches the end. Returns
    /// whether it reaches the end.
    fn covered_by(&self, psn: Psn, mtu: u32, va: u64, rkey: Rkey, dma_len: u32) -> Option<bool> {
        let Kind::Read {
            va: orig_va,
            rkey: orig_rkey,
            dma_len: orig_len,
        } = self.what
        else {
            return None;
        };
        let skipped = u64::from(self.first_psn.distance_to(psn)) * u64::from(mtu);
        let rest = u64::from(orig_len).checked_sub(skipped)?;
        let len = u64::from(dma_len);
        let ok = rkey == orig_rkey
            && va == orig_va.wrapping_add(skipped)
            && len <= rest
            && (len == rest || len > 0 && len % u64::from(mtu) == 0);
        ok.then_some(len == rest)
    }

    fn repeated_by(&self, psn: Psn, mtu: u32, va: u64, rkey: Rkey, dma_len: u32) -> bool {
        let Kind::Read {
            va: orig_va,
            rkey: orig_rkey,
            dma_len: orig_len,
        } = self.what
        else {
            return false;
        };
        let skipped = u64::from(self.first_psn.distance_to(psn)) * u64::from(mtu);
        rkey == orig_rkey
            && u64::from(dma_len) + skipped == u64::from(orig_len).max(skipped)
            && va == orig_va.wrapping_add(skipped)
    }
}

/// The last READs and atomics executed, at most max_dest_rd_atomic of them.
#[derive(Debug, Default)]
pub(super) struct ExecutedCache {
    entries: VecDeque<Executed>,
    cap: usize,
}

impl ExecutedCache {
    /// Sizes the cache once, so the data path does not allocate.
    pub fn reserve(&mut self, cap: usize) {
        self.cap = cap;
        self.entries.reserve(cap);
    }

    pub fn remember(&mut self, e: Executed) {
        // The cap may have been lowered (SQD -> SQD): trim down to it.
        while self.entries.len() >= self.cap.max(1) {
            self.entries.pop_front();
        }
        if self.cap == 0 {
            return;
        }
        self.entries.push_back(e);
    }

    /// The READ whose responses `psn` is one of.
    fn read_with(&self, psn: Psn) -> Option<Executed> {
        self.entries
            .iter()
            .find(|e| matches!(e.what, Kind::Read { .. }) && psn.in_window(e.first_psn, e.npsn))
            .copied()
    }

    /// The result of the atomic with PSN `psn`.
    fn atomic_result(&self, psn: Psn) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.first_psn == psn)
            .and_then(|e| match e.what {
                Kind::Atomic { orig } => Some(orig),
                Kind::Read { .. } => None,
            })
    }
}

impl Responder {
    /// A request with a PSN before the expected one (IBA 9.7.5.1.1).
    pub(super) fn handle_duplicate(&mut self, ctx: &mut RecvCtx<'_>, pkt: &RocePacket<&[u8]>) {
        ctx.shared.counters.duplicate_requests += 1;
        let psn = pkt.bth().psn();
        match pkt.info().kind {
            OpKind::RdmaReadRequest => self.repeat_read(ctx, pkt),
            OpKind::CompareSwap | OpKind::FetchAdd => {
                // Replay, never execute again (IBA 9.7.5.1.1).
                if let Some(orig) = self.executed.atomic_result(psn) {
                    if !self.answers.has_room_for_duplicate() {
                        ctx.shared.counters.drop_answer_queue_full += 1;
                        return;
                    }
                    let msn = self.msn;
                    self.answers.push(Outgoing::Atomic { psn, orig, msn });
                }
            }
            _ => {
                // An ACK queued last is replaced, taking no room.
                if !self.answers.ends_with_ack() && !self.answers.has_room_for_duplicate() {
                    ctx.shared.counters.drop_answer_queue_full += 1;
                    return;
                }
                let last = self.epsn.sub(1);
                self.answers.push_ack(last, self.msn);
            }
        }
    }

    /// A duplicate READ request: the original's responses from its PSN on are sent
    /// again, read from memory now, if it asks for exactly those; anything else is
    /// dropped and counted (it would answer past the original's PSN span).
    fn repeat_read(&mut self, ctx: &mut RecvCtx<'_>, pkt: &RocePacket<&[u8]>) {
        let Some(reth) = pkt.reth() else { return };
        let psn = pkt.bth().psn();
        let Some(original) = self.executed.read_with(psn) else {
            return; // too old to answer: the requester will time out
        };
        let (va, rkey, dma_len) = (reth.va(), reth.rkey(), reth.dma_len());
        // Selective repeat: a run of the READ's responses asked again.
        let tail = if self.sr.active {
            original.covered_by(psn, ctx.mtu, va, rkey, dma_len)
        } else {
            original
                .repeated_by(psn, ctx.mtu, va, rkey, dma_len)
                .then_some(true)
        };
        let Some(tail) = tail else {
            ctx.shared.counters.drop_duplicate_mismatch += 1;
            return;
        };
        if dma_len > 0
            && ctx
                .shared
                .mrs
                .resolve_remote(
                    rkey.0,
                    ctx.pd,
                    ctx.handle,
                    va,
                    dma_len as usize,
                    AccessFlags::REMOTE_READ,
                )
                .is_err()
        {
            return;
        }
        if self.sr.active {
            // Selective repeat: answers queued for later requests stay (the
            // requester keeps what arrives ahead, and asks again only the READ
            // it lacks: its early timer asks the READ at una alone, see
            // `Completer::on_timeout`); this READ's missing responses go first,
            // unless they are still queued anyway. Dropping the later answers
            // here, as for a go-back-N requester, left the READs after it without
            // responses when a READ was asked again while its responder had not
            // run yet (its duplicate read in the same batch as the requests
            // after it), each then asked again in turn.
            let packets = crate::qp::requester::packets_for(dma_len, ctx.mtu);
            if self.answers.has_read_covering(psn, packets, ctx.mtu) {
                return;
            }
            if !self.answers.has_room_for_duplicate() {
                ctx.shared.counters.drop_answer_queue_full += 1;
                return;
            }
            // What is left of this READ's run queued (some of it sent) goes in
            // the run asked for, once.
            self.answers.drop_read_runs_in(psn, packets);
            self.answers
                .queue_read_first(psn, va, rkey, dma_len, tail, self.msn);
            return;
        }
        // Answers from `psn` on are about to be regenerated: drop queued ones.
        self.answers.drop_from(psn);
        if !self.answers.has_room_for_duplicate() {
            ctx.shared.counters.drop_answer_queue_full += 1;
            return;
        }
        self.answers.queue_read(psn, va, rkey, dma_len, self.msn);
    }
}
