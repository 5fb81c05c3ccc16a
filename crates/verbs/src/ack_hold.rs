//! ACKs a polling thread keeps back until its answer (see `Driver::hold_acks`).
//!
//! A thread spinning on its CQ receives a SEND itself; the ACK the engine produces for
//! it used to leave at once, in a `sendmmsg` made before the thread even looked at the
//! completion, so every one-way message carried one more system call on its path (on
//! loopback the sender also runs the peer's receive path). Now the ACK waits in the
//! batch being built: the thread takes its completion first, and the ACK leaves with
//! whatever the device sends next — typically the answer the application posts, in the
//! same `sendmmsg`, the answer first.
//!
//! An ACK may come late: one ACK acknowledges every request before it (IBA 9.7.5.1.6,
//! coalesced acknowledgements), and the requester's timers allow for it (its early
//! timer follows the measured round trip, which includes the hold). A hold is short
//! and bounded: held ACKs leave with the device's next datagram, at the next empty
//! poll of any of its CQs, when the holding thread polls another device or arms a CQ,
//! and at the latest when the progress thread next wakes (by the end of the hand-off
//! to pollers that made the thread receive).
//!
//! The progress thread holds one kind of ACK too, for a bounded time
//! ([`Config::ack_hold`](crate::Config), 50 µs by default, as long as the hand-off to
//! pollers): that of a lone RDMA WRITE it
//! placed into memory. A program that spins on memory for the peer's WRITE (ib_write_lat,
//! `softverbs perf write --lat`) cannot poll, so only the progress thread takes that
//! WRITE in; its ACK then leaves with the WRITE the program answers with, and the peer
//! reads both at once. Sent alone and early, the ACK let the peer's poll loop end before
//! the answer came, so the peer too spun on memory and needed its progress thread for
//! the answer: ib_write_lat's slow state, which kept itself (`docs/udp-latency.md`).
//! A target that never answers delays its requester's completion by the hold; the
//! requester's first tail-loss probe (from 50 µs) may then resend the WRITE once, whose
//! duplicate sends the held ACK at once; its measured round trip then includes the hold
//! and later probes wait longer. In a stream the next WRITE ends a hold (one at a time).

use crate::driver::Driver;
use softverbs_wire::{AethSyndrome, Opcode, RocePacket};
use std::cell::RefCell;
use std::sync::{Arc, Weak};

/// Whether `datagram` (a RoCE packet as the engine emits it, unsealed) is a positive
/// RC ACK: what may wait for the thread's answer. NAKs (sequence errors, RNR) leave at
/// once: the requester waits for them to recover.
pub(crate) fn is_plain_ack(datagram: &[u8]) -> bool {
    let Ok(pkt) = RocePacket::new_checked(datagram) else {
        return false;
    };
    pkt.opcode() == Opcode::RcAcknowledge
        && pkt
            .aeth()
            .and_then(|a| AethSyndrome::from_byte(a.syndrome()).ok())
            .is_some_and(AethSyndrome::is_ack)
}

/// Whether `datagram` is a request packet: requests and the held ACKs belong to
/// different PSN sequences (the requester's and the responder's, IBA 9.7.1), so a
/// request may leave before them.
pub(crate) fn is_request(datagram: &[u8]) -> bool {
    RocePacket::new_checked(datagram).is_ok_and(|p| p.info().is_request)
}

/// Whether `datagram` is an RDMA WRITE that ends a message without an immediate (RC
/// WRITE Only or Last): its data is in memory once the engine took it, and nothing tells
/// the target's application but the memory itself, which it may be spinning on.
pub(crate) fn is_write_into_memory(datagram: &[u8]) -> bool {
    RocePacket::new_checked(datagram)
        .is_ok_and(|p| matches!(p.opcode(), Opcode::RcWriteOnly | Opcode::RcWriteLast))
}

/// Whether `datagram` is an RC RDMA READ response (its first byte, the BTH opcode,
/// alone: the engine checks the rest): a READ requester is receiving its data, and
/// its pollers must not sleep through it (`Driver::poll_wait_after`).
pub(crate) fn is_read_response(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|&op| {
        matches!(
            Opcode::from_u8(op),
            Some(
                Opcode::RcReadResponseFirst
                    | Opcode::RcReadResponseMiddle
                    | Opcode::RcReadResponseLast
                    | Opcode::RcReadResponseOnly
            )
        )
    })
}

thread_local! {
    /// The device on which this thread holds ACKs back, if any, and the fork generation
    /// it was noted in (`crate::fork`).
    static HELD_HERE: RefCell<Option<(u64, Weak<Driver>)>> = const { RefCell::new(None) };
}

/// Notes that the calling thread holds ACKs back on `driver`.
pub(crate) fn note_held(driver: &Arc<Driver>) {
    let generation = crate::fork::generation();
    HELD_HERE.with(|h| *h.borrow_mut() = Some((generation, Arc::downgrade(driver))));
}

/// Sends the ACKs the calling thread held back, on whatever device (it is about to poll
/// or wait on another, or to block). Call without a device lock. In a child forked since
/// they were held the device is the parent's: its locks and socket are not touched.
pub(crate) fn release_thread_held() {
    let held = HELD_HERE.with(|h| h.borrow_mut().take());
    let Some((generation, driver)) = held else {
        return;
    };
    if generation != crate::fork::generation() {
        return;
    }
    if let Some(driver) = driver.upgrade() {
        driver.release_held_acks();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_wire::{AethRepr, BthRepr, NakCode, PacketRepr, Psn, Qpn, RethRepr, Rkey};

    fn emit(opcode: Opcode, aeth: Option<AethSyndrome>) -> Vec<u8> {
        let mut repr = PacketRepr::new(BthRepr::new(opcode, Qpn::new(0x11), Psn::new(5)), &[]);
        repr.aeth = aeth.map(|syndrome| AethRepr { syndrome, msn: 3 });
        let mut buf = vec![0u8; repr.buffer_len()];
        let len = repr.emit(&mut buf).unwrap();
        buf.truncate(len);
        buf
    }

    #[test]
    fn only_positive_acks_are_held() {
        let ack = emit(Opcode::RcAcknowledge, Some(AethSyndrome::ACK_UNLIMITED));
        assert!(is_plain_ack(&ack));
        assert!(!is_request(&ack));
        for syndrome in [
            AethSyndrome::RnrNak { timer: 4 },
            AethSyndrome::Nak(NakCode::PsnSequenceError),
        ] {
            assert!(!is_plain_ack(&emit(Opcode::RcAcknowledge, Some(syndrome))));
        }
        let send = emit(Opcode::RcSendOnly, None);
        assert!(!is_plain_ack(&send));
        assert!(is_request(&send));
        assert!(!is_plain_ack(&ack[..5]), "a short buffer is no ACK");
        assert!(!is_request(&[]));
    }

    /// A request packet of `opcode` with the extension headers it calls for.
    fn request(opcode: Opcode) -> Vec<u8> {
        let payload = [7u8; 8];
        let mut repr = PacketRepr::new(BthRepr::new(opcode, Qpn::new(0x11), Psn::new(5)), &payload);
        if matches!(
            opcode,
            Opcode::RcWriteFirst
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
                | Opcode::UcWriteFirst
        ) {
            repr.reth = Some(RethRepr {
                va: 0x1000,
                rkey: Rkey(9),
                dma_len: 8,
            });
        }
        if matches!(opcode, Opcode::RcWriteOnlyImm | Opcode::RcWriteLastImm) {
            repr.immdt = Some(1);
        }
        let mut buf = vec![0u8; repr.buffer_len()];
        let len = repr.emit(&mut buf).unwrap();
        buf.truncate(len);
        buf
    }

    #[test]
    fn only_writes_that_end_without_immediate_go_into_memory_alone() {
        for op in [Opcode::RcWriteOnly, Opcode::RcWriteLast] {
            assert!(is_write_into_memory(&request(op)), "{op:?}");
        }
        for op in [
            Opcode::RcWriteFirst,
            Opcode::RcWriteMiddle,
            Opcode::RcWriteOnlyImm,
            Opcode::RcWriteLastImm,
            Opcode::RcSendOnly,
            Opcode::UcWriteLast,
        ] {
            assert!(!is_write_into_memory(&request(op)), "{op:?}");
        }
        let ack = emit(Opcode::RcAcknowledge, Some(AethSyndrome::ACK_UNLIMITED));
        assert!(!is_write_into_memory(&ack));
        assert!(!is_write_into_memory(&[0x0a]));
    }
}
