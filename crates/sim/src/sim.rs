//! The simulator: nodes, the network between them, and the virtual clock.

use crate::faults::{chance, flip_bits, positive_up_to, up_to, Faults};
use crate::queue::{InFlight, Queue};
use crate::run::{Limits, RunReport, SimError};
use crate::stats::Stats;
use crate::trace::{Fate, TraceEntry};
use core::fmt;
use core::time::Duration;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use softverbs_engine::{Instant, Node, MAX_DATAGRAM};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// The most datagrams taken from one node in one [`Sim::step`].
pub const MAX_TRANSMITS_PER_STEP: usize = 4096;

/// Names a node of a [`Sim`]; handed out by [`Sim::add_node`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(usize);

impl NodeId {
    /// The node's position in the order nodes were added (0 for the first).
    pub const fn index(self) -> usize {
        self.0
    }

    #[cfg(test)]
    pub(crate) const fn from_index(index: usize) -> Self {
        NodeId(index)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// A node and the address it was registered under.
#[derive(Debug)]
struct Slot<N> {
    node: N,
    addr: SocketAddr,
}

/// What one step did; `Blocked` means the next event lies beyond the limit
/// the step was given, so the clock was left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Worked,
    Idle,
    Blocked,
}

/// A deterministic simulated network of [`Node`]s with a virtual clock.
///
/// Datagrams are routed by destination address to the node whose
/// [`Node::local_addr`] matches (as it was when the node was added).
/// Everything random is drawn from one generator seeded by [`Sim::new`], and
/// every tie is broken by a fixed rule, so a run is fully reproducible from
/// its seed.
///
/// # Order of events
///
/// Each [`step`](Sim::step) first takes the datagrams every node wants to
/// send (in node order, at most [`MAX_TRANSMITS_PER_STEP`] per node) and puts
/// them on the network, then does one of:
///
/// 1. deliver the earliest datagram due now (among datagrams due at the same
///    instant, the one put on the network first);
/// 2. else call [`Node::handle_timeout`] on every node whose
///    [`Node::poll_timeout`] has passed, in node order;
/// 3. else move the clock to the next arrival or timer deadline; if no
///    datagram is due then, fire the timers due then as in 2.
///
/// So at any instant, datagrams arriving then are handed over before timers
/// due then fire.
pub struct Sim<N> {
    now: Instant,
    rng: SmallRng,
    faults: Faults,
    links: BTreeMap<(NodeId, NodeId), Faults>,
    /// Per direction of a link: when it is next free to serialise, and whether
    /// its burst-loss model is in the bad state.
    link_state: BTreeMap<(NodeId, NodeId), LinkState>,
    partitions: BTreeSet<(NodeId, NodeId)>,
    nodes: Vec<Slot<N>>,
    routes: BTreeMap<SocketAddr, NodeId>,
    queue: Queue,
    stats: Stats,
    tx_buf: Vec<u8>,
    trace: Option<Vec<TraceEntry>>,
}

impl<N: fmt::Debug> fmt::Debug for Sim<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("faults", &self.faults)
            .field("links", &self.links)
            .field("partitions", &self.partitions)
            .field("nodes", &self.nodes)
            .field("in_flight", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<N: Node> Sim<N> {
    /// An empty network whose links all apply `faults`, with the clock at
    /// [`Instant::ZERO`] and randomness seeded by `seed`.
    ///
    /// # Panics
    ///
    /// If a probability in `faults` lies outside `0..=1`.
    pub fn new(seed: u64, faults: Faults) -> Self {
        check(&faults);
        Sim {
            now: Instant::ZERO,
            rng: SmallRng::seed_from_u64(seed),
            faults,
            links: BTreeMap::new(),
            link_state: BTreeMap::new(),
            partitions: BTreeSet::new(),
            nodes: Vec::new(),
            routes: BTreeMap::new(),
            queue: Queue::default(),
            stats: Stats::default(),
            tx_buf: vec![0; MAX_DATAGRAM],
            trace: None,
        }
    }

    /// Adds `node`, reachable at its [`Node::local_addr`] (read once, now).
    ///
    /// # Panics
    ///
    /// If another node already has that address.
    pub fn add_node(&mut self, node: N) -> NodeId {
        let addr = node.local_addr();
        let id = NodeId(self.nodes.len());
        if let Some(other) = self.routes.insert(addr, id) {
            panic!("softverbs-sim: {other} already has address {addr}");
        }
        self.nodes.push(Slot { node, addr });
        id
    }

    /// The node `id`.
    ///
    /// # Panics
    ///
    /// If `id` does not belong to this simulator.
    pub fn node(&self, id: NodeId) -> &N {
        &self.slot(id).node
    }

    /// The node `id`, to call its methods (post work, inspect state) between steps.
    ///
    /// # Panics
    ///
    /// If `id` does not belong to this simulator.
    pub fn node_mut(&mut self, id: NodeId) -> &mut N {
        &mut self.slot_mut(id).node
    }

    /// The address node `id` is reachable at.
    ///
    /// # Panics
    ///
    /// If `id` does not belong to this simulator.
    pub fn addr(&self, id: NodeId) -> SocketAddr {
        self.slot(id).addr
    }

    /// The node reachable at `addr`, if any.
    pub fn node_at(&self, addr: SocketAddr) -> Option<NodeId> {
        self.routes.get(&addr).copied()
    }

    /// Every node, in the order they were added.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).map(NodeId)
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Copies of datagrams on the network, not yet delivered or dropped.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// The faults of every link that has no override.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Replaces the faults of every link that has no override.
    /// Datagrams already in flight are not affected.
    ///
    /// # Panics
    ///
    /// If a probability in `faults` lies outside `0..=1`.
    pub fn set_faults(&mut self, faults: Faults) {
        check(&faults);
        self.faults = faults;
    }

    /// The faults applied to datagrams from `from` to `to`.
    pub fn link_faults(&self, from: NodeId, to: NodeId) -> &Faults {
        self.links.get(&(from, to)).unwrap_or(&self.faults)
    }

    /// Overrides the faults of datagrams from `from` to `to` (one direction
    /// only). Datagrams already in flight are not affected.
    ///
    /// # Panics
    ///
    /// If a probability in `faults` lies outside `0..=1`.
    pub fn set_link_faults(&mut self, from: NodeId, to: NodeId, faults: Faults) {
        check(&faults);
        self.links.insert((from, to), faults);
    }

    /// Removes the override of the link from `from` to `to`, so it applies
    /// [`Sim::faults`] again.
    pub fn clear_link_faults(&mut self, from: NodeId, to: NodeId) {
        self.links.remove(&(from, to));
    }

    /// Cuts (`true`) or restores (`false`) all traffic between `a` and `b`,
    /// both ways: each sees the other fall silent. Datagrams already in
    /// flight between them are dropped when they would arrive during the cut.
    pub fn partition(&mut self, a: NodeId, b: NodeId, cut: bool) {
        let key = pair(a, b);
        if cut {
            self.partitions.insert(key);
        } else {
            self.partitions.remove(&key);
        }
    }

    /// Whether traffic between `a` and `b` is cut.
    pub fn is_partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.partitions.contains(&pair(a, b))
    }

    /// Starts (`true`) or stops and discards (`false`) recording the fate of
    /// every datagram; see [`Sim::trace`].
    pub fn set_tracing(&mut self, on: bool) {
        match (on, self.trace.is_some()) {
            (true, false) => self.trace = Some(Vec::new()),
            (false, true) => self.trace = None,
            _ => {}
        }
    }

    /// The fate of every datagram copy since tracing started, in order.
    /// Empty when tracing is off.
    pub fn trace(&self) -> &[TraceEntry] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Takes the trace recorded so far, leaving tracing on (if it was) with
    /// an empty record.
    pub fn take_trace(&mut self) -> Vec<TraceEntry> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The earliest pending event: the next arrival or the earliest timer
    /// deadline of any node. `None` if nothing is in flight and no node has
    /// a timer (datagrams nodes have yet to send are not known here).
    pub fn next_event(&self) -> Option<Instant> {
        let timers = self.nodes.iter().filter_map(|s| s.node.poll_timeout());
        timers.chain(self.queue.next_arrival()).min()
    }

    /// Does one bounded unit of work (see [Order of events](Sim#order-of-events)).
    /// Returns `false` if there was nothing to do: no node had anything to
    /// send, nothing is in flight, and no node has a timer.
    pub fn step(&mut self) -> bool {
        self.step_within(None) != Outcome::Idle
    }

    /// Steps until `done` returns `true` (checked before every step).
    ///
    /// # Errors
    ///
    /// - [`SimError::Livelock`] after `limits.max_steps` steps with `done`
    ///   still false;
    /// - [`SimError::Deadline`] if the next event lies more than
    ///   `limits.max_time` after the start (the clock is left at that limit);
    /// - [`SimError::Idle`] if nothing is left to happen but `done` is false.
    pub fn run_until(
        &mut self,
        limits: Limits,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> Result<RunReport, SimError> {
        let start = self.now;
        let deadline = start + limits.max_time;
        let mut steps = 0;
        loop {
            if done(self) {
                return Ok(RunReport {
                    steps,
                    start,
                    now: self.now,
                });
            }
            if steps >= limits.max_steps {
                return Err(SimError::Livelock {
                    steps,
                    now: self.now,
                });
            }
            match self.step_within(Some(deadline)) {
                Outcome::Worked => steps += 1,
                Outcome::Idle => return Err(SimError::Idle { now: self.now }),
                Outcome::Blocked => {
                    self.now = deadline;
                    return Err(SimError::Deadline { now: self.now });
                }
            }
        }
    }

    /// Steps until nothing is left to happen: no datagram to send or in
    /// flight, no timer.
    ///
    /// # Errors
    ///
    /// - [`SimError::Livelock`] if there is still work after
    ///   `limits.max_steps` steps;
    /// - [`SimError::Deadline`] if the next event lies more than
    ///   `limits.max_time` after the start (a node that re-arms a timer
    ///   forever never becomes idle).
    pub fn run_until_idle(&mut self, limits: Limits) -> Result<RunReport, SimError> {
        let start = self.now;
        let deadline = start + limits.max_time;
        let mut steps = 0;
        loop {
            match self.step_within(Some(deadline)) {
                Outcome::Worked => {
                    if steps >= limits.max_steps {
                        return Err(SimError::Livelock {
                            steps,
                            now: self.now,
                        });
                    }
                    steps += 1;
                }
                Outcome::Idle => {
                    return Ok(RunReport {
                        steps,
                        start,
                        now: self.now,
                    })
                }
                Outcome::Blocked => {
                    self.now = deadline;
                    return Err(SimError::Deadline { now: self.now });
                }
            }
        }
    }

    /// Advances virtual time by `duration`, processing every event due up to
    /// and including the new time; the clock ends exactly `duration` later.
    ///
    /// # Errors
    ///
    /// - [`SimError::Livelock`] if there is still work due after
    ///   `limits.max_steps` steps;
    /// - [`SimError::Deadline`] if `duration` exceeds `limits.max_time`
    ///   (time advances only by `limits.max_time`).
    pub fn run_for(&mut self, duration: Duration, limits: Limits) -> Result<RunReport, SimError> {
        let start = self.now;
        let target = start + duration;
        let deadline = start + limits.max_time;
        let bound = target.min(deadline);
        let mut steps = 0;
        while self.step_within(Some(bound)) == Outcome::Worked {
            if steps >= limits.max_steps {
                return Err(SimError::Livelock {
                    steps,
                    now: self.now,
                });
            }
            steps += 1;
        }
        self.now = self.now.max(bound);
        if target > deadline {
            return Err(SimError::Deadline { now: self.now });
        }
        Ok(RunReport {
            steps,
            start,
            now: self.now,
        })
    }

    /// One step that will not move the clock past `limit`.
    fn step_within(&mut self, limit: Option<Instant>) -> Outcome {
        let sent = self.drain_transmits();
        if let Some(item) = self.queue.pop_due(self.now) {
            self.deliver(item);
            return Outcome::Worked;
        }
        if self.fire_due_timers() || sent {
            return Outcome::Worked;
        }
        // Nothing is due now, so the next event (if any) is later.
        let Some(next) = self.next_event() else {
            return Outcome::Idle;
        };
        if limit.is_some_and(|limit| next > limit) {
            return Outcome::Blocked;
        }
        self.now = next;
        if self.queue.next_arrival() != Some(next) {
            self.fire_due_timers();
        }
        Outcome::Worked
    }

    /// Puts on the network what every node wants to send now. Returns
    /// whether any node sent anything.
    fn drain_transmits(&mut self) -> bool {
        let mut buf = std::mem::take(&mut self.tx_buf);
        let mut sent = false;
        for index in 0..self.nodes.len() {
            for _ in 0..MAX_TRANSMITS_PER_STEP {
                let Some(tx) = self.nodes[index].node.poll_transmit(self.now, &mut buf) else {
                    break;
                };
                assert!(
                    tx.len <= buf.len(),
                    "softverbs-sim: node{index} returned a {}-byte datagram from a {}-byte buffer",
                    tx.len,
                    buf.len()
                );
                sent = true;
                self.send(NodeId(index), tx.dst, &buf[..tx.len]);
            }
        }
        self.tx_buf = buf;
        sent
    }

    /// Applies the link's faults to one datagram and queues what survives.
    fn send(&mut self, from: NodeId, dst: SocketAddr, bytes: &[u8]) {
        self.stats.sent += 1;
        let Some(to) = self.node_at(dst) else {
            self.stats.undeliverable += 1;
            self.record(
                from,
                None,
                dst,
                bytes.len(),
                Fate::Undeliverable,
                [false; 3],
            );
            return;
        };
        if self.is_partitioned(from, to) {
            self.stats.partitioned += 1;
            self.record(
                from,
                Some(to),
                dst,
                bytes.len(),
                Fate::Partitioned,
                [false; 3],
            );
            return;
        }
        let faults = *self.link_faults(from, to);
        if self.lose(from, to, &faults) {
            self.stats.lost += 1;
            self.record(from, Some(to), dst, bytes.len(), Fate::Lost, [false; 3]);
            return;
        }
        let Some(departs) = self.serialise(from, to, &faults, bytes.len()) else {
            self.stats.queue_full += 1;
            self.record(
                from,
                Some(to),
                dst,
                bytes.len(),
                Fate::QueueFull,
                [false; 3],
            );
            return;
        };
        let mut at = departs + faults.delay + up_to(&mut self.rng, faults.jitter);
        let reordered = chance(&mut self.rng, faults.reorder);
        if reordered {
            self.stats.reordered += 1;
            at += positive_up_to(&mut self.rng, faults.reorder_delay);
        }
        let duplicate_at = chance(&mut self.rng, faults.duplicate)
            .then(|| at + positive_up_to(&mut self.rng, faults.duplicate_delay));
        let route = Route {
            from,
            to,
            dst,
            reordered,
            corrupt: faults.corrupt,
        };
        self.enqueue(&route, at, false, bytes);
        if let Some(at) = duplicate_at {
            self.stats.duplicated += 1;
            self.enqueue(&route, at, true, bytes);
        }
    }

    /// Whether the link loses the next datagram: by its loss probability, or by
    /// its burst model's state (moved on by chance first).
    fn lose(&mut self, from: NodeId, to: NodeId, faults: &Faults) -> bool {
        let Some(burst) = faults.burst else {
            return chance(&mut self.rng, faults.loss);
        };
        let state = self.link_state.entry((from, to)).or_default();
        let flip = if state.bad { burst.leave } else { burst.enter };
        if chance(&mut self.rng, flip) {
            state.bad = !state.bad;
        }
        let p = if state.bad { burst.loss } else { faults.loss };
        chance(&mut self.rng, p)
    }

    /// When a datagram of `len` bytes has been serialised onto a link of finite
    /// rate (now, on an infinite one); `None` if it finds the queue full.
    fn serialise(
        &mut self,
        from: NodeId,
        to: NodeId,
        faults: &Faults,
        len: usize,
    ) -> Option<Instant> {
        if faults.rate == 0 {
            return Some(self.now);
        }
        let now = self.now;
        let state = self.link_state.entry((from, to)).or_default();
        let start = state.busy_until.max(now);
        let waiting = transfer_bytes(start - now, faults.rate);
        if faults.queue_limit > 0 && waiting + len as u64 > faults.queue_limit as u64 {
            return None;
        }
        state.busy_until = start + transfer_time(len as u64, faults.rate);
        Some(state.busy_until)
    }

    /// Queues one copy of a datagram, arriving at `at`, corrupting it by chance.
    fn enqueue(&mut self, route: &Route, at: Instant, duplicate: bool, bytes: &[u8]) {
        let mut data = self.queue.buffer_from(bytes);
        let corrupted =
            chance(&mut self.rng, route.corrupt) && flip_bits(&mut self.rng, &mut data) > 0;
        if corrupted {
            self.stats.corrupted += 1;
        }
        let seq = self.queue.next_seq();
        self.queue.push(InFlight {
            at,
            seq,
            from: route.from,
            src: self.nodes[route.from.0].addr,
            to: route.to,
            dst: route.dst,
            data,
            duplicate,
            reordered: route.reordered,
            corrupted,
        });
    }

    /// Hands a copy that has arrived to its node, unless the link is cut.
    fn deliver(&mut self, item: InFlight) {
        let flags = [item.duplicate, item.reordered, item.corrupted];
        let fate = if self.is_partitioned(item.from, item.to) {
            self.stats.partitioned += 1;
            Fate::Partitioned
        } else {
            self.stats.delivered += 1;
            Fate::Delivered
        };
        self.record(
            item.from,
            Some(item.to),
            item.dst,
            item.data.len(),
            fate,
            flags,
        );
        if fate == Fate::Delivered {
            self.nodes[item.to.0]
                .node
                .handle_datagram(self.now, item.src, &item.data);
        }
        self.queue.recycle(item.data);
    }

    /// Fires the timers that are due, in node order. Returns whether any fired.
    fn fire_due_timers(&mut self) -> bool {
        let now = self.now;
        let mut fired = false;
        for slot in &mut self.nodes {
            if slot.node.poll_timeout().is_some_and(|at| at <= now) {
                slot.node.handle_timeout(now);
                self.stats.timeouts += 1;
                fired = true;
            }
        }
        fired
    }

    fn record(
        &mut self,
        from: NodeId,
        to: Option<NodeId>,
        dst: SocketAddr,
        len: usize,
        fate: Fate,
        [duplicate, reordered, corrupted]: [bool; 3],
    ) {
        if let Some(trace) = &mut self.trace {
            trace.push(TraceEntry {
                at: self.now,
                from,
                to,
                dst,
                len,
                fate,
                duplicate,
                reordered,
                corrupted,
            });
        }
    }

    fn slot(&self, id: NodeId) -> &Slot<N> {
        match self.nodes.get(id.0) {
            Some(slot) => slot,
            None => panic!("softverbs-sim: no {id} in this simulator"),
        }
    }

    fn slot_mut(&mut self, id: NodeId) -> &mut Slot<N> {
        match self.nodes.get_mut(id.0) {
            Some(slot) => slot,
            None => panic!("softverbs-sim: no {id} in this simulator"),
        }
    }

    #[cfg(test)]
    pub(crate) fn spare_buffers(&self) -> usize {
        self.queue.spare_buffers()
    }
}

/// The state of one direction of a link.
#[derive(Debug, Clone, Copy, Default)]
struct LinkState {
    /// When the link has serialised everything handed to it so far.
    busy_until: Instant,
    /// The burst-loss model is in its bad state.
    bad: bool,
}

/// How long `bytes` take at `rate` bytes per second (`rate` > 0).
fn transfer_time(bytes: u64, rate: u64) -> Duration {
    Duration::from_nanos((u128::from(bytes) * 1_000_000_000 / u128::from(rate)) as u64)
}

/// How many bytes `rate` bytes per second move in `time`.
fn transfer_bytes(time: Duration, rate: u64) -> u64 {
    (time.as_nanos() * u128::from(rate) / 1_000_000_000) as u64
}

/// What the copies of one datagram share.
struct Route {
    from: NodeId,
    to: NodeId,
    dst: SocketAddr,
    reordered: bool,
    corrupt: f64,
}

/// The unordered pair `{a, b}` as a key.
fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

fn check(faults: &Faults) {
    if let Err(err) = faults.validate() {
        panic!("softverbs-sim: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_engine::Transmit;
    use std::net::{Ipv4Addr, SocketAddrV4};

    /// Sends `left` 100-byte datagrams to `peer`, counts what arrives.
    #[derive(Debug)]
    struct Blaster {
        addr: SocketAddr,
        peer: SocketAddr,
        left: usize,
        received: usize,
    }

    impl Node for Blaster {
        fn local_addr(&self) -> SocketAddr {
            self.addr
        }
        fn handle_datagram(&mut self, _now: Instant, _src: SocketAddr, data: &[u8]) {
            assert_eq!(data.len(), 100);
            self.received += 1;
        }
        fn handle_timeout(&mut self, _now: Instant) {}
        fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
            assert!(buf.len() >= MAX_DATAGRAM);
            self.left = self.left.checked_sub(1)?;
            Some(Transmit {
                src: self.addr,
                dst: self.peer,
                len: 100,
            })
        }
        fn poll_timeout(&self) -> Option<Instant> {
            None
        }
    }

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, n), 7))
    }

    fn blaster(n: u8, peer: u8, left: usize) -> Blaster {
        Blaster {
            addr: addr(n),
            peer: addr(peer),
            left,
            received: 0,
        }
    }

    #[test]
    fn a_step_takes_a_bounded_number_of_datagrams_per_node() {
        let mut sim = Sim::new(1, Faults::none());
        sim.add_node(blaster(1, 2, 10_000));
        let b = sim.add_node(blaster(2, 1, 0));
        assert!(sim.step());
        assert_eq!(sim.in_flight(), MAX_TRANSMITS_PER_STEP);
        assert!(sim.step());
        assert_eq!(sim.in_flight(), 2 * MAX_TRANSMITS_PER_STEP);
        sim.run_until_idle(Limits::default()).unwrap();
        assert_eq!(sim.node(b).received, 10_000);
        assert!(!sim.step());
    }

    #[test]
    fn buffers_are_recycled_and_the_free_list_is_bounded() {
        let mut sim = Sim::new(2, Faults::none());
        sim.add_node(blaster(1, 2, 3000));
        sim.add_node(blaster(2, 1, 0));
        sim.run_until_idle(Limits::default()).unwrap();
        assert_eq!(sim.spare_buffers(), crate::queue::MAX_SPARE_BUFFERS);
        assert_eq!(sim.in_flight(), 0);
    }

    #[test]
    fn node_ids_and_display() {
        let mut sim = Sim::new(3, Faults::none());
        let a = sim.add_node(blaster(1, 2, 0));
        let b = sim.add_node(blaster(2, 1, 0));
        assert_eq!(sim.node_ids().collect::<Vec<_>>(), [a, b]);
        assert_eq!(b.index(), 1);
        assert_eq!(b.to_string(), "node1");
        assert_eq!(sim.next_event(), None);
        assert!(format!("{sim:?}").contains("in_flight"));
    }

    #[test]
    #[should_panic(expected = "no node5")]
    fn foreign_node_ids_panic() {
        let sim = Sim::<Blaster>::new(4, Faults::none());
        let _ = sim.node(NodeId::from_index(5));
    }
}
