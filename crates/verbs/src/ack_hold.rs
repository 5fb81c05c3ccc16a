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
//! requester's probe of a lone packet waits 2 SRTT + the hold + its 50 µs floor for it
//! (RFC 8985 7.2; `EngineConfig::peer_ack_hold`, which the driver sets from this
//! `Config`), so it resends no WRITE the hold answers in time (before, the probe came at
//! 50 µs and its duplicate sent the held ACK at once). In a stream the next WRITE ends a
//! hold (one at a time).

use crate::driver::Driver;
use crate::sys::TimerFd;
use softverbs_wire::{AethSyndrome, Opcode, RocePacket};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

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

/// The progress thread's hold of a lone WRITE's ACK (`Config::ack_hold`) and the timer
/// that wakes it when the hold ends. Three threads meet here: the progress thread starts
/// a hold (under the device lock) and arms the timer before it sleeps; whoever sends the
/// held ACKs (the answer's poster, or the progress thread when the hold is over) ends the
/// hold (under the device lock) and disarms the timer after the send, off the ACKs' path.
/// The timer's lock is held over every arm and disarm, and a disarm happens only while no
/// hold is under way: the sender of hold 1's ACKs may disarm after the progress thread
/// started hold 2 and found the timer still armed (for hold 1), and hold 2's ACK would
/// then wait for the next datagram (the requester's tail-loss probe) instead of its time.
pub(crate) struct ProgressHold {
    /// When the hold ends (the driver's clock, ns; 0: no hold). Written under the device
    /// lock.
    until: AtomicU64,
    /// A hold ended: its timer is disarmed after the send.
    released: AtomicBool,
    /// Whether `timer` is armed; held over its arming and disarming.
    armed: Mutex<bool>,
    timer: TimerFd,
}

impl ProgressHold {
    pub(crate) fn new() -> io::Result<ProgressHold> {
        Ok(ProgressHold {
            until: AtomicU64::new(0),
            released: AtomicBool::new(false),
            armed: Mutex::new(false),
            timer: TimerFd::new()?,
        })
    }

    /// When the hold under way ends (the driver's clock, ns); 0: none.
    pub(crate) fn until(&self) -> u64 {
        self.until.load(Ordering::Acquire)
    }

    /// Starts a hold that ends at `until` (the driver's clock, ns). Under the device lock.
    pub(crate) fn start(&self, until: u64) {
        self.until.store(until.max(1), Ordering::Release);
    }

    /// The held ACKs went into a batch to send: the hold, if any, is over. Under the
    /// device lock.
    pub(crate) fn end(&self) {
        if self.until.swap(0, Ordering::AcqRel) != 0 {
            self.released.store(true, Ordering::Release);
        }
    }

    /// Arms the timer for the hold under way, unless it is armed already (it then expires
    /// no later than this hold ends: holds start one at a time, each later). The progress
    /// thread calls it before it sleeps; `now` reads the driver's clock (ns).
    pub(crate) fn arm(&self, now: impl FnOnce() -> u64) {
        let mut armed = lock(&self.armed);
        let until = self.until();
        if until != 0 && !*armed {
            *armed = true;
            let left = until.saturating_sub(now());
            self.timer.set(Some(std::time::Duration::from_nanos(left)));
        }
    }

    /// Disarms the timer once the ACKs of an ended hold were sent (after the send: the
    /// system call is not on their path), unless another hold started since: the timer,
    /// still armed for the ended one, is then that hold's (it expires early and the
    /// progress thread arms it again). Call without the device lock.
    pub(crate) fn disarm_after_send(&self) {
        // Read first: a swap is a locked write on every finish, almost always of false.
        if !self.released.load(Ordering::Acquire) || !self.released.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut armed = lock(&self.armed);
        // Under the lock: a hold that starts after this check is armed by the progress
        // thread once this disarm is done.
        if self.until() == 0 && std::mem::take(&mut *armed) {
            self.timer.set(None);
        }
    }

    /// The timer expired (the progress thread saw it readable): it is disarmed, and the
    /// thread's next pump sends what it held.
    pub(crate) fn expired(&self) {
        let mut armed = lock(&self.armed);
        if std::mem::take(&mut *armed) {
            self.timer.set(None);
        }
    }

    /// The timer's descriptor, readable when it expired.
    pub(crate) fn timer_fd(&self) -> RawFd {
        self.timer.raw()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    /// The driver's clock stand-in: nanoseconds since the first call.
    fn now() -> u64 {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }

    /// Whether the hold timer expires within `limit`: a bound far above the holds' ends,
    /// so a loaded host cannot decide; a timer left disarmed never does.
    fn expires_within(hold: &ProgressHold, limit: std::time::Duration) -> bool {
        let mut fds = [libc::pollfd {
            fd: hold.timer_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        crate::sys::poll(&mut fds, Some(limit)).unwrap();
        fds[0].revents & libc::POLLIN != 0
    }

    const LIMIT: std::time::Duration = std::time::Duration::from_secs(3);
    const MS: u64 = 1_000_000;

    #[test]
    fn a_hold_that_starts_before_the_last_ones_timer_is_disarmed_keeps_a_timer() {
        // Session 12's race, each thread's step in the order that lost the timer.
        let hold = ProgressHold::new().unwrap();
        // The progress thread holds a WRITE's ACK and arms the timer before it sleeps.
        hold.start(now() + 20 * MS);
        hold.arm(now);
        // The answer's poster sends the held ACK (its pump ends the hold) and is
        // preempted before it disarms; meanwhile the progress thread takes the next
        // lone WRITE in, holds its ACK, and finds the timer armed.
        hold.end();
        hold.start(now() + 40 * MS);
        hold.arm(now);
        // The poster runs again: the timer must stay, for the second hold.
        hold.disarm_after_send();
        assert!(
            expires_within(&hold, LIMIT),
            "the second hold was left without a timer"
        );
        // The progress thread wakes (early, at the first hold's end) and arms the timer
        // again for the second hold, whose end has not come: it expires then.
        hold.expired();
        assert!(!expires_within(&hold, std::time::Duration::ZERO));
        hold.arm(now);
        assert!(expires_within(&hold, LIMIT), "no timer for the second hold");
    }

    #[test]
    fn the_sender_of_an_ended_holds_acks_disarms_its_timer() {
        let hold = ProgressHold::new().unwrap();
        hold.start(now() + 10 * MS);
        hold.arm(now);
        hold.end();
        hold.disarm_after_send();
        // Disarming also clears an expiry nobody read (if this thread was preempted past
        // the hold's end): the timer never wakes the progress thread for it.
        assert!(!expires_within(&hold, std::time::Duration::from_millis(50)));
        assert!(!*lock(&hold.armed));
        // A second disarm (no hold ended since) does nothing; a new hold arms it again.
        hold.disarm_after_send();
        hold.start(now() + 10 * MS);
        hold.arm(now);
        assert!(expires_within(&hold, LIMIT));
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
