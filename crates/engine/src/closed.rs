//! Closed RC QPs that still answer duplicates: the transport's "last ACK" problem.
//!
//! An RC responder acknowledges a request once. If that ACK is lost and the QP is destroyed
//! right after (a program that exits as soon as its last message arrived, as
//! `ibv_rc_pingpong` does), the requester retransmits to a QP that no longer exists and
//! finally fails with a retry error although its message was delivered. Hardware has the
//! same race, but a NIC stays up after a process exits; a softverbs device is the process.
//!
//! So a destroyed RC QP leaves behind what its responder needs to re-acknowledge a
//! duplicate SEND or RDMA WRITE (IBA 9.7.5.1.1: a duplicate is acknowledged, never executed
//! again): the peer, the expected PSN and the MSN. Nothing else is answered: a new request
//! gets no reply (the QP is gone), and duplicate READs and atomics, which need memory or
//! the replay cache, are left to time out. The list holds the last [`CAPACITY`] closed QPs,
//! so it costs a bounded, small amount of memory whatever the program does; the driver
//! keeps the device up a short while after close while an answer may still be owed.

use std::collections::VecDeque;
use std::net::SocketAddr;

use softverbs_wire::{Psn, Qpn};

/// How many closed QPs are remembered.
pub const CAPACITY: usize = 64;

/// What a destroyed RC QP leaves behind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClosedQp {
    /// The destroyed QP's number.
    pub qpn: Qpn,
    /// Its peer, the only source it answered.
    pub peer: SocketAddr,
    /// The peer QP, destination of the ACKs.
    pub dest_qp: Qpn,
    /// The PSN its responder expected next.
    pub epsn: Psn,
    /// The responder's MSN.
    pub msn: u32,
    /// Its local ACK timeout exponent (`timeout` attribute): how long a peer with the same
    /// setting waits before retransmitting.
    pub timeout: u8,
}

/// An ACK owed by a closed QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FarewellAck {
    pub dst: SocketAddr,
    pub dest_qp: Qpn,
    pub psn: Psn,
    pub msn: u32,
}

/// The remembered closed QPs and the ACKs they owe.
#[derive(Debug, Default)]
pub(crate) struct ClosedQps {
    closed: VecDeque<ClosedQp>,
    owed: VecDeque<FarewellAck>,
}

impl ClosedQps {
    /// Remembers a destroyed QP, forgetting the oldest beyond [`CAPACITY`].
    pub fn remember(&mut self, qp: ClosedQp) {
        if self.closed.len() == CAPACITY {
            self.closed.pop_front();
        }
        self.closed.push_back(qp);
    }

    /// A request for `qpn` from `src` with `psn` found no live QP: if it is a duplicate of
    /// what a closed QP acknowledged, queue the ACK again (one per QP pending at a time)
    /// and return true.
    pub fn handle_request(&mut self, src: SocketAddr, qpn: Qpn, psn: Psn) -> bool {
        let Some(c) = self.closed.iter().find(|c| c.qpn == qpn && c.peer == src) else {
            return false;
        };
        // A duplicate lies in the half of the PSN space before the expected PSN (IBA
        // 9.7.5.1.1); anything else is new and stays unanswered.
        if !psn.before(c.epsn) {
            return false;
        }
        let ack = FarewellAck {
            dst: c.peer,
            dest_qp: c.dest_qp,
            psn: c.epsn.sub(1),
            msn: c.msn,
        };
        if !self.owed.contains(&ack) {
            self.owed.push_back(ack);
        }
        true
    }

    /// The next ACK to send.
    pub fn poll_ack(&mut self) -> Option<FarewellAck> {
        self.owed.pop_front()
    }

    /// Whether any closed QP is remembered; the largest `timeout` exponent among them.
    pub fn max_timeout(&self) -> Option<u8> {
        self.closed.iter().map(|c| c.timeout).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(qpn: u32, epsn: u32) -> ClosedQp {
        ClosedQp {
            qpn: Qpn::new(qpn),
            peer: "10.0.0.2:4791".parse().unwrap(),
            dest_qp: Qpn::new(0x42),
            epsn: Psn::new(epsn),
            msn: 7,
            timeout: 14,
        }
    }

    #[test]
    fn duplicates_are_acknowledged_once_each_new_requests_never() {
        let mut c = ClosedQps::default();
        c.remember(closed(5, 100));
        let peer = "10.0.0.2:4791".parse().unwrap();
        let other = "10.0.0.3:4791".parse().unwrap();
        assert!(
            !c.handle_request(peer, Qpn::new(5), Psn::new(100)),
            "new PSN"
        );
        assert!(
            !c.handle_request(peer, Qpn::new(6), Psn::new(99)),
            "other QP"
        );
        assert!(
            !c.handle_request(other, Qpn::new(5), Psn::new(99)),
            "other source"
        );
        assert!(c.handle_request(peer, Qpn::new(5), Psn::new(99)));
        assert!(c.handle_request(peer, Qpn::new(5), Psn::new(90)));
        let ack = c.poll_ack().expect("an ACK is owed");
        assert_eq!(
            (ack.psn, ack.msn, ack.dest_qp),
            (Psn::new(99), 7, Qpn::new(0x42))
        );
        assert_eq!(c.poll_ack(), None, "two duplicates, one ACK");
    }

    #[test]
    fn psn_wrap_and_capacity() {
        let mut c = ClosedQps::default();
        c.remember(closed(1, 2));
        let peer = "10.0.0.2:4791".parse().unwrap();
        assert!(c.handle_request(peer, Qpn::new(1), Psn::new(0xff_fffe)));
        assert_eq!(c.poll_ack().map(|a| a.psn), Some(Psn::new(1)));
        for q in 2..(2 + CAPACITY as u32) {
            c.remember(closed(q, 2));
        }
        assert!(
            !c.handle_request(peer, Qpn::new(1), Psn::new(1)),
            "forgotten"
        );
        assert!(c.handle_request(peer, Qpn::new(2), Psn::new(1)));
        assert_eq!(c.max_timeout(), Some(14));
        assert_eq!(ClosedQps::default().max_timeout(), None);
    }
}
