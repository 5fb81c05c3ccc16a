//! Counters of what the simulated network did.

/// What happened to the datagrams the nodes sent, counted since the
/// simulator was created.
///
/// Every sent datagram ends up in exactly one of `lost`, `queue_full`,
/// `partitioned`, `undeliverable`, or (once it has arrived) `delivered`; a duplicated
/// datagram adds one more copy, which is itself delivered or partitioned.
/// `reordered` and `corrupted` count datagrams (copies, for `corrupted`)
/// that were also delivered or are still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stats {
    /// Datagrams the nodes handed to the network.
    pub sent: u64,
    /// Copies handed to their destination node.
    pub delivered: u64,
    /// Datagrams dropped by random loss.
    pub lost: u64,
    /// Extra copies created by duplication.
    pub duplicated: u64,
    /// Datagrams held back by an extra random delay.
    pub reordered: u64,
    /// Copies that had bits flipped.
    pub corrupted: u64,
    /// Copies dropped because their two nodes were partitioned (when sent
    /// or when due to arrive).
    pub partitioned: u64,
    /// Datagrams addressed to no node of the simulation.
    pub undeliverable: u64,
    /// Datagrams dropped because the link's queue was full (see
    /// [`Faults::queue_limit`](crate::Faults::queue_limit)).
    pub queue_full: u64,
    /// Calls to [`Node::handle_timeout`](softverbs_engine::Node::handle_timeout).
    pub timeouts: u64,
}

impl Stats {
    /// Copies still travelling: everything sent or duplicated that has not
    /// yet been delivered or dropped.
    pub fn in_flight(&self) -> u64 {
        (self.sent + self.duplicated).saturating_sub(
            self.delivered + self.lost + self.queue_full + self.partitioned + self.undeliverable,
        )
    }
}
