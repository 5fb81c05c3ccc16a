//! Datagrams in flight, ordered by arrival time, with a free list of byte
//! buffers so a long run allocates little once it reaches steady state.

use crate::NodeId;
use core::cmp::{Ordering, Reverse};
use softverbs_engine::Instant;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

/// How many spare buffers the free list keeps at most.
pub(crate) const MAX_SPARE_BUFFERS: usize = 1024;

/// One copy of a datagram travelling through the network.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// When it arrives.
    pub at: Instant,
    /// Order of enqueueing; breaks ties between copies arriving at once.
    pub seq: u64,
    pub from: NodeId,
    pub src: SocketAddr,
    pub to: NodeId,
    pub dst: SocketAddr,
    pub data: Vec<u8>,
    pub duplicate: bool,
    pub reordered: bool,
    pub corrupted: bool,
}

impl InFlight {
    fn key(&self) -> (Instant, u64) {
        (self.at, self.seq)
    }
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// The network's queue of copies in flight, earliest (then first enqueued)
/// first.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    heap: BinaryHeap<Reverse<InFlight>>,
    spare: Vec<Vec<u8>>,
    next_seq: u64,
}

impl Queue {
    /// A buffer holding a copy of `bytes`, taken from the free list if possible.
    pub fn buffer_from(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        buf
    }

    /// Returns a buffer to the free list.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < MAX_SPARE_BUFFERS {
            self.spare.push(buf);
        }
    }

    /// The next sequence number; `push` entries must carry one.
    pub fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub fn push(&mut self, item: InFlight) {
        self.heap.push(Reverse(item));
    }

    /// When the earliest copy arrives.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(item)| item.at)
    }

    /// Removes the earliest copy if it arrives at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<InFlight> {
        if self.next_arrival()? <= now {
            self.heap.pop().map(|Reverse(item)| item)
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    #[cfg(test)]
    pub fn spare_buffers(&self) -> usize {
        self.spare.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn item(q: &mut Queue, at: u64) -> InFlight {
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1));
        InFlight {
            at: Instant::from_nanos(at),
            seq: q.next_seq(),
            from: NodeId::from_index(0),
            src: addr,
            to: NodeId::from_index(0),
            dst: addr,
            data: Vec::new(),
            duplicate: false,
            reordered: false,
            corrupted: false,
        }
    }

    #[test]
    fn pops_by_time_then_sequence() {
        let mut q = Queue::default();
        let a = item(&mut q, 20);
        let b = item(&mut q, 10);
        let c = item(&mut q, 20);
        let d = item(&mut q, 10);
        for x in [a, b, c, d] {
            q.push(x);
        }
        assert_eq!(q.next_arrival(), Some(Instant::from_nanos(10)));
        assert!(q.pop_due(Instant::from_nanos(9)).is_none());
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_due(Instant::from_nanos(20)))
            .map(|x| x.seq)
            .collect();
        assert_eq!(order, [1, 3, 0, 2]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn buffers_are_reused() {
        let mut q = Queue::default();
        let buf = q.buffer_from(&[1, 2, 3]);
        let ptr = buf.as_ptr();
        q.recycle(buf);
        let again = q.buffer_from(&[9]);
        assert_eq!(again, [9]);
        assert_eq!(again.as_ptr(), ptr);
    }
}
