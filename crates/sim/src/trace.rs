//! An optional record of every datagram's fate, for debugging and for
//! checking that runs are reproducible.

use crate::NodeId;
use softverbs_engine::Instant;
use std::net::SocketAddr;

/// What became of one copy of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fate {
    /// Handed to the destination node.
    Delivered,
    /// Dropped by random loss.
    Lost,
    /// Dropped because the link's queue was full.
    QueueFull,
    /// Dropped because the two nodes are partitioned.
    Partitioned,
    /// Addressed to no node of the simulation.
    Undeliverable,
}

/// One entry of the trace: a copy of a datagram reaching its end.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// Virtual time of the event (arrival, or sending for a drop at the sender).
    pub at: Instant,
    /// The sending node.
    pub from: NodeId,
    /// The destination node, if the address belongs to one.
    pub to: Option<NodeId>,
    /// The destination address.
    pub dst: SocketAddr,
    /// Length of the datagram in bytes.
    pub len: usize,
    /// What became of it.
    pub fate: Fate,
    /// This copy is the extra one made by duplication.
    pub duplicate: bool,
    /// This datagram was held back to reorder it.
    pub reordered: bool,
    /// This copy had bits flipped.
    pub corrupted: bool,
}
