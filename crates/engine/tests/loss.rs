//! Loss recovery ahead of the IBTA timer (issue 15), in the simulator with fixed
//! seeds: bulk SEND, RDMA WRITE and RDMA READ streams (as ib_send_bw,
//! ib_write_bw and ib_read_bw run them) over a link of finite rate with a bounded
//! queue, losing datagrams at random or in bursts; a dead peer; and what goes on
//! the wire between a peer doing selective repeat and one that does not.
//!
//! Each transfer checks every byte and every completion. Goodput is compared in
//! virtual time (a model check, not a timing test): at 5 % loss within twice the
//! lossless time. The exactly-once / in-order properties under every opcode,
//! duplication, reordering and corruption at 1, 5, 20 and 30 % and bursty loss
//! are `chaos.rs`'s `chaos_loss_levels_*` cases.

mod common;

use common::{connect, PairOpts, ADDR_A, ADDR_B};
use softverbs_engine::*;
use softverbs_sim::{Burst, Faults, Limits, NodeId, Sim};
use std::net::SocketAddr;
use std::time::Duration;

/// An engine as a simulator node that notes, per packet it sends, whether it
/// is a request and its BTH reserved bits.
struct Tap {
    e: Engine,
    /// (request?, resv7, sent after the first answer arrived?)
    sent: Vec<(bool, u8, bool)>,
    answers_seen: u64,
    /// The answers arriving with these indexes (0: the first) are dropped on
    /// arrival.
    drop_answers: Vec<u64>,
    requests_seen: u64,
    /// The request packets arriving with these indexes (0: the first) are
    /// dropped on arrival.
    drop_requests: Vec<u64>,
    /// From `.0` until `.1` the node does not run (its process is not scheduled):
    /// what arrives waits in `backlog` (its socket buffer), its timers wait.
    stall: Option<(Instant, Instant)>,
    backlog: Vec<(SocketAddr, Vec<u8>)>,
    /// At most this many datagrams wait in `backlog` (a socket receive buffer
    /// that overflows): those arriving when it is full are lost.
    backlog_cap: usize,
    /// After a stall the backlog is read this many datagrams at a time, what each
    /// batch's answers being sent before the next is read, as the driver reads its
    /// socket with `recvmmsg` (`usize::MAX`: all at once).
    catch_up_batch: usize,
    /// The node holds each plain ACK it sends this long, or until it sends a
    /// request (its answer), which goes first: as the driver holds the ACK of a
    /// lone WRITE for the answer of a thread spinning on memory
    /// (`crates/verbs/src/ack_hold.rs`).
    ack_hold: Option<Duration>,
    /// ACKs held: when each leaves at the latest, where to, the datagram.
    held_acks: Vec<(Instant, SocketAddr, Vec<u8>)>,
    /// The application wants to run then (an answer it posts late).
    wake_at: Option<Instant>,
}

impl Tap {
    fn stalled(&self, now: Instant) -> bool {
        self.stall
            .is_some_and(|(from, until)| from <= now && now < until)
    }

    /// After a stall, what arrived meanwhile is read, in order.
    fn catch_up(&mut self, now: Instant) {
        let batch = self.backlog.len().min(self.catch_up_batch);
        let read: Vec<_> = self.backlog.drain(..batch).collect();
        for (src, data) in read {
            self.receive(now, src, &data);
        }
    }
}

impl Node for Tap {
    fn local_addr(&self) -> SocketAddr {
        self.e.local_addr()
    }
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        if self.stalled(now) {
            if self.backlog.len() < self.backlog_cap {
                self.backlog.push((src, data.to_vec()));
            }
            return;
        }
        self.catch_up(now);
        if !self.backlog.is_empty() {
            // Still reading what waited: this comes after it.
            self.backlog.push((src, data.to_vec()));
            return;
        }
        self.receive(now, src, data);
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.stalled(now) {
            return;
        }
        if self.wake_at.is_some_and(|t| t <= now) {
            self.wake_at = None;
        }
        self.catch_up(now);
        if !self.backlog.is_empty() {
            // The socket is read before the timers fire (as the driver does).
            return;
        }
        self.e.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.stalled(now) {
            return None;
        }
        if self.catch_up_batch == usize::MAX {
            self.catch_up(now);
        }
        // Otherwise this batch's answers leave before the next batch is read
        // (`handle_timeout`, which `poll_timeout` calls at once).
        self.transmit(now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        let next = [self.e.poll_timeout(), self.wake_at]
            .into_iter()
            .chain(self.held_acks.iter().map(|h| Some(h.0)))
            .flatten()
            .min();
        let Some((from, until)) = self.stall else {
            return next;
        };
        // During a stall nothing runs: what falls due, or arrives, then is
        // handled when it ends.
        if !self.backlog.is_empty() {
            return Some(until);
        }
        next.map(|t| if from <= t && t < until { until } else { t })
    }
}

impl Tap {
    fn receive(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        if let Ok(p) = softverbs_wire::RocePacket::new_checked(data) {
            if !p.info().is_request {
                self.answers_seen += 1;
                if self.drop_answers.contains(&(self.answers_seen - 1)) {
                    return;
                }
            } else {
                self.requests_seen += 1;
                if self.drop_requests.contains(&(self.requests_seen - 1)) {
                    return;
                }
            }
        }
        self.e.handle_datagram(now, src, data);
    }

    fn transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.transmit_holding_acks(now, buf)?;
        let p = softverbs_wire::RocePacket::new_checked(&buf[..t.len]).expect("well formed");
        self.sent
            .push((p.info().is_request, p.bth().resv7(), self.answers_seen > 0));
        Some(t)
    }
}

impl Tap {
    /// The engine's next datagram, with plain ACKs held (see [`Tap::ack_hold`]).
    fn transmit_holding_acks(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let Some(hold) = self.ack_hold else {
            return Node::poll_transmit(&mut self.e, now, buf);
        };
        if let Some(due) = self.held_acks.iter().position(|h| h.0 <= now) {
            let (_, dst, ack) = self.held_acks.remove(due);
            buf[..ack.len()].copy_from_slice(&ack);
            return Some(Transmit {
                src: self.e.local_addr(),
                dst,
                len: ack.len(),
            });
        }
        loop {
            let t = Node::poll_transmit(&mut self.e, now, buf)?;
            let p = softverbs_wire::RocePacket::new_checked(&buf[..t.len]).expect("well formed");
            let plain_ack = p.opcode() == softverbs_wire::Opcode::RcAcknowledge
                && p.aeth()
                    .and_then(|a| softverbs_wire::AethSyndrome::from_byte(a.syndrome()).ok())
                    .is_some_and(softverbs_wire::AethSyndrome::is_ack);
            if !plain_ack {
                if p.info().is_request {
                    // The answer: the held ACKs leave right after it.
                    for h in &mut self.held_acks {
                        h.0 = now;
                    }
                }
                return Some(t);
            }
            self.held_acks
                .push((now + hold, t.dst, buf[..t.len].to_vec()));
        }
    }
}

struct End {
    node: NodeId,
    qp: QpHandle,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    mr: MrInfo,
    /// Registered memory: boxed so it never moves; dropped after the simulator.
    buf: Box<[u8]>,
}

struct Net {
    sim: Sim<Tap>,
    ends: [End; 2],
}

/// What the workload does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Send,
    Write,
    Read,
}

const SIZE: usize = 64 * 1024;

/// 10 Gb/s, 10 µs one way, a 1 MiB queue (a socket buffer's worth).
fn link(loss: f64) -> Faults {
    Faults::lossy(loss).with_rate(1_250_000_000, 1 << 20)
}

impl Net {
    fn new(seed: u64, faults: Faults, sr: [bool; 2], buf_len: usize) -> Net {
        Net::with_mtu(seed, faults, sr, buf_len, Mtu::Mtu4096)
    }

    fn with_mtu(seed: u64, faults: Faults, sr: [bool; 2], buf_len: usize, mtu: Mtu) -> Net {
        Net::build(
            seed,
            faults,
            sr,
            buf_len,
            mtu,
            PairOpts::default().max_rd_atomic,
            0,
        )
    }

    /// A pair whose QPs have `rd_atomic` READs outstanding (max_rd_atomic and
    /// max_dest_rd_atomic), with `read_budget` bytes of READ responses allowed past
    /// the in-flight cap (`EngineConfig::read_budget`).
    fn build(
        seed: u64,
        faults: Faults,
        sr: [bool; 2],
        buf_len: usize,
        mtu: Mtu,
        rd_atomic: u8,
        read_budget: u32,
    ) -> Net {
        let opts = PairOpts {
            max_rd_atomic: rd_atomic,
            max_dest_rd_atomic: rd_atomic,
            mtu,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..PairOpts::default()
        };
        let mut sim = Sim::new(seed, faults);
        let addrs: [SocketAddr; 2] = [ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap()];
        let mut ends = Vec::new();
        for i in 0..2 {
            let config = EngineConfig {
                selective_repeat: sr[i],
                read_budget,
                ..EngineConfig::new(addrs[i])
            };
            let mut e = Engine::new(config);
            let pd = e.alloc_pd().unwrap();
            let send_cq = e.create_cq(4096).unwrap();
            let recv_cq = e.create_cq(4096).unwrap();
            let (qp, _) = e
                .create_qp(QpInitAttr {
                    pd,
                    send_cq,
                    recv_cq,
                    qp_type: QpType::Rc,
                    cap: opts.cap,
                    sq_sig_all: true,
                })
                .unwrap();
            let mut buf = vec![0u8; buf_len].into_boxed_slice();
            // SAFETY: `buf` is heap memory that never moves, kept in the `End`, which
            // `Net` drops after its simulator (fields drop in declaration order).
            let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), opts.mr_access) }.unwrap();
            let node = sim.add_node(Tap {
                e,
                sent: Vec::new(),
                answers_seen: 0,
                drop_answers: Vec::new(),
                requests_seen: 0,
                drop_requests: Vec::new(),
                stall: None,
                backlog: Vec::new(),
                backlog_cap: usize::MAX,
                catch_up_batch: usize::MAX,
                ack_hold: None,
                held_acks: Vec::new(),
                wake_at: None,
            });
            ends.push(End {
                node,
                qp,
                send_cq,
                recv_cq,
                mr,
                buf,
            });
        }
        let qpns = [0, 1].map(|i| sim.node(ends[i].node).e.qp_num(ends[i].qp).unwrap());
        let psn = [opts.psn_a, opts.psn_b];
        for i in 0..2 {
            let peer = 1 - i;
            let (node, qp) = (ends[i].node, ends[i].qp);
            connect(
                &mut sim.node_mut(node).e,
                qp,
                addrs[peer],
                qpns[peer],
                psn[peer],
                psn[i],
                &opts,
            );
        }
        let mut ends = ends.into_iter();
        let ends = [ends.next().unwrap(), ends.next().unwrap()];
        Net { sim, ends }
    }

    fn engine(&mut self, i: usize) -> &mut Engine {
        &mut self.sim.node_mut(self.ends[i].node).e
    }

    /// `n` READs of `len` bytes by end 0: READ i brings end 1's bytes `[i*len, (i+1)*len)`
    /// into end 0's `[(n+i)*len, (n+i+1)*len)`. Runs until all `n` complete and returns
    /// their completions.
    fn read_back(&mut self, n: usize, len: usize) -> Vec<WorkCompletion> {
        let (a_mr, b_mr) = (self.ends[0].mr, self.ends[1].mr);
        let (qp, scq) = (self.ends[0].qp, self.ends[0].send_cq);
        for i in 0..n {
            let sge = Sge {
                addr: a_mr.addr + ((n + i) * len) as u64,
                length: len as u32,
                lkey: a_mr.lkey,
            };
            let op = SendOp::RdmaRead {
                remote_addr: b_mr.addr + (i * len) as u64,
                rkey: Rkey(b_mr.rkey),
            };
            self.engine(0)
                .post_send(qp, &SendWr::new(i as u64, op, &[sge]))
                .unwrap();
        }
        let a = self.ends[0].node;
        self.sim
            .run_until(Limits::new(5_000_000, Duration::from_secs(60)), |sim| {
                sim.node(a).e.cq_len(scq).unwrap() == n
            })
            .unwrap();
        let mut wcs = vec![WorkCompletion::default(); n];
        let got = self.engine(0).poll_cq(scq, &mut wcs).unwrap();
        wcs.truncate(got);
        wcs
    }
}

/// Fills `buf` with a pattern from `seed` that repeats at no power-of-two period.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
    for b in buf {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
    }
}

/// The outcome of a transfer.
#[derive(Debug)]
struct Run {
    elapsed: Duration,
    a: Counters,
    b: Counters,
    sim: softverbs_sim::Stats,
    /// The most request packets A had in flight at once.
    most_in_flight: u64,
    /// The most B's responder held ahead of its expected PSN at once.
    most_held: HeldAhead,
    /// A's smoothed round-trip time at the end.
    srtt: Option<Duration>,
}

/// A moves `n` messages of [`SIZE`] bytes to B by `stream` (for READ: B's data
/// to A), at most `depth` outstanding, as perftest's bandwidth tests do; checks
/// every completion and byte; returns the virtual time it took.
fn transfer(seed: u64, faults: Faults, sr: [bool; 2], stream: Stream, n: usize) -> Run {
    transfer_deep(
        seed,
        faults,
        sr,
        stream,
        n,
        16,
        PairOpts::default().max_rd_atomic,
    )
}

/// [`transfer`] with `depth` messages outstanding (at most the send queue's 64),
/// and `rd_atomic` of them READs at once.
fn transfer_deep(
    seed: u64,
    faults: Faults,
    sr: [bool; 2],
    stream: Stream,
    n: usize,
    depth: usize,
    rd_atomic: u8,
) -> Run {
    transfer_budget(seed, faults, sr, stream, n, depth, rd_atomic, 0)
}

/// [`transfer_deep`] with `read_budget` bytes of READ responses allowed past the
/// in-flight cap (`EngineConfig::read_budget`).
#[allow(clippy::too_many_arguments)]
fn transfer_budget(
    seed: u64,
    faults: Faults,
    sr: [bool; 2],
    stream: Stream,
    n: usize,
    depth: usize,
    rd_atomic: u8,
    read_budget: u32,
) -> Run {
    transfer_mtu(
        seed,
        faults,
        sr,
        stream,
        n,
        depth,
        rd_atomic,
        read_budget,
        Mtu::Mtu4096,
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn transfer_mtu(
    seed: u64,
    faults: Faults,
    sr: [bool; 2],
    stream: Stream,
    n: usize,
    depth: usize,
    rd_atomic: u8,
    read_budget: u32,
    mtu: Mtu,
    stall_b: Option<(Duration, Duration)>,
) -> Run {
    transfer_caught_up_in(
        seed,
        faults,
        sr,
        stream,
        n,
        depth,
        rd_atomic,
        read_budget,
        mtu,
        stall_b,
        (usize::MAX, usize::MAX),
    )
}

/// [`transfer_mtu`], B reading what waited during its stall `catch_up_batch`
/// datagrams at a time (see [`Tap::catch_up_batch`]), and holding at most
/// `backlog_cap` of them (its socket buffer; see [`Tap::backlog_cap`]).
#[allow(clippy::too_many_arguments)]
fn transfer_caught_up_in(
    seed: u64,
    faults: Faults,
    sr: [bool; 2],
    stream: Stream,
    n: usize,
    depth: usize,
    rd_atomic: u8,
    read_budget: u32,
    mtu: Mtu,
    stall_b: Option<(Duration, Duration)>,
    (catch_up_batch, backlog_cap): (usize, usize),
) -> Run {
    let buf_len = 2 * n * SIZE;
    let mut net = Net::build(seed, faults, sr, buf_len, mtu, rd_atomic, read_budget);
    let b = net.sim.node_mut(net.ends[1].node);
    b.catch_up_batch = catch_up_batch;
    b.backlog_cap = backlog_cap;
    // The source half of the side the data comes from.
    let src = if stream == Stream::Read { 1 } else { 0 };
    fill(&mut net.ends[src].buf[..n * SIZE], seed);
    let (a_mr, b_mr) = (net.ends[0].mr, net.ends[1].mr);
    let start = net.sim.now();
    if let Some((from, len)) = stall_b {
        let b = net.ends[1].node;
        net.sim.node_mut(b).stall = Some((start + from, start + from + len));
    }
    let mut posted = 0usize;
    let mut done = 0usize;
    let mut received = 0usize;
    let mut wcs = [WorkCompletion::default(); 64];
    if stream == Stream::Send {
        for i in 0..n {
            let sge = Sge {
                addr: b_mr.addr + ((n + i) * SIZE) as u64,
                length: SIZE as u32,
                lkey: b_mr.lkey,
            };
            let qp = net.ends[1].qp;
            // B's receive queue holds 64: post as they are consumed, below.
            if i < 64 {
                net.engine(1)
                    .post_recv(
                        qp,
                        &RecvWr {
                            wr_id: i as u64,
                            sges: &[sge],
                        },
                    )
                    .unwrap();
            }
        }
    }
    let limits = Limits::new(20_000_000, Duration::from_secs(60));
    let mut recv_posted = n.min(64);
    let (node_a, node_b) = (net.ends[0].node, net.ends[1].node);
    let (qp_a, qp_b) = (net.ends[0].qp, net.ends[1].qp);
    let (scq_a, rcq_b) = (net.ends[0].send_cq, net.ends[1].recv_cq);
    let rkey = Rkey(b_mr.rkey);
    let mut most_in_flight = 0;
    let mut most_held = HeldAhead::default();
    let answer_room = net.sim.node(node_b).e.qp_answer_queue(qp_b).unwrap();
    let outcome = net.sim.run_until(limits, |sim| {
        most_in_flight = most_in_flight.max(sim.node(node_a).e.packets_in_flight());
        let held = sim.node(node_b).e.qp_held_ahead(qp_b).unwrap();
        most_held.packets = most_held.packets.max(held.packets);
        most_held.writes = most_held.writes.max(held.writes);
        most_held.messages = most_held.messages.max(held.messages);
        most_held.bytes = most_held.bytes.max(held.bytes);
        // Completions at A: in order, each once, successful.
        loop {
            let got = sim.node_mut(node_a).e.poll_cq(scq_a, &mut wcs).unwrap();
            for wc in &wcs[..got] {
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (done as u64, WcStatus::Success),
                    "{stream:?}"
                );
                done += 1;
            }
            if got < wcs.len() {
                break;
            }
        }
        if stream == Stream::Send {
            loop {
                let got = sim.node_mut(node_b).e.poll_cq(rcq_b, &mut wcs).unwrap();
                for wc in &wcs[..got] {
                    assert_eq!(
                        (wc.wr_id, wc.status, wc.byte_len),
                        (received as u64, WcStatus::Success, SIZE as u32)
                    );
                    received += 1;
                }
                if got < wcs.len() {
                    break;
                }
            }
            while recv_posted < n && recv_posted < received + 64 {
                let sge = Sge {
                    addr: b_mr.addr + ((n + recv_posted) * SIZE) as u64,
                    length: SIZE as u32,
                    lkey: b_mr.lkey,
                };
                sim.node_mut(node_b)
                    .e
                    .post_recv(
                        qp_b,
                        &RecvWr {
                            wr_id: recv_posted as u64,
                            sges: &[sge],
                        },
                    )
                    .unwrap();
                recv_posted += 1;
            }
        }
        while posted < n && posted < done + depth {
            let i = posted;
            let (local, remote) = match stream {
                // A's message i goes to B's second half.
                Stream::Send | Stream::Write => (
                    a_mr.addr + (i * SIZE) as u64,
                    b_mr.addr + ((n + i) * SIZE) as u64,
                ),
                // B's message i comes to A's second half.
                Stream::Read => (
                    a_mr.addr + ((n + i) * SIZE) as u64,
                    b_mr.addr + (i * SIZE) as u64,
                ),
            };
            let op = match stream {
                Stream::Send => SendOp::Send,
                Stream::Write => SendOp::RdmaWrite {
                    remote_addr: remote,
                    rkey,
                },
                Stream::Read => SendOp::RdmaRead {
                    remote_addr: remote,
                    rkey,
                },
            };
            let sge = Sge {
                addr: local,
                length: SIZE as u32,
                lkey: a_mr.lkey,
            };
            sim.node_mut(node_a)
                .e
                .post_send(qp_a, &SendWr::new(i as u64, op, &[sge]))
                .unwrap();
            posted += 1;
        }
        done == n && (stream != Stream::Send || received == n)
    });
    outcome.unwrap_or_else(|e| {
        panic!(
            "{stream:?} with {faults:?}, selective repeat {sr:?}: {e}\nA {:?}\nB {:?}\n{:?}",
            net.sim.node(node_a).e.counters(),
            net.sim.node(node_b).e.counters(),
            net.sim.stats()
        )
    });
    let elapsed = net.sim.now() - start;
    // Every byte arrived where it should.
    let (from, to) = if stream == Stream::Read {
        (1, 0)
    } else {
        (0, 1)
    };
    let sent = net.ends[from].buf[..n * SIZE].to_vec();
    assert!(
        net.ends[to].buf[n * SIZE..] == sent[..],
        "{stream:?}: data differs"
    );
    // B's answers, READ runs asked again among them, stayed within what its
    // answer queue reserved (no allocation on the data path).
    let answers = net.sim.node(node_b).e.qp_answer_queue(qp_b).unwrap();
    assert_eq!(
        answers.capacity, answer_room.capacity,
        "{stream:?} {faults:?}"
    );
    Run {
        elapsed,
        a: net.sim.node(node_a).e.counters(),
        b: net.sim.node(node_b).e.counters(),
        sim: net.sim.stats(),
        most_in_flight,
        most_held,
        srtt: net.sim.node(node_a).e.qp_srtt(qp_a),
    }
}

const BOTH: [bool; 2] = [true, true];
const NEITHER: [bool; 2] = [false, false];

/// At 5 % loss each way, every stream finishes within twice its lossless time
/// with selective repeat; at 20 % it still finishes (no RETRY_EXC_ERR).
#[test]
fn goodput_at_5_percent_loss_within_twice_lossless() {
    for stream in [Stream::Write, Stream::Send, Stream::Read] {
        let n = 64;
        let lossless = transfer(1, link(0.0), BOTH, stream, n);
        let lossy = transfer(2, link(0.05), BOTH, stream, n);
        let heavy = transfer(3, link(0.2), BOTH, stream, n);
        let plain = transfer(2, link(0.05), NEITHER, stream, n);
        eprintln!(
            "{stream:?}: lossless {:?}, 5 % {:?} (go-back-N {:?}), 20 % {:?}",
            lossless.elapsed, lossy.elapsed, plain.elapsed, heavy.elapsed
        );
        assert!(lossy.sim.lost > 0 && heavy.sim.lost > 0);
        assert!(
            lossy.elapsed <= 2 * lossless.elapsed,
            "{stream:?} at 5 %: {:?} vs lossless {:?}\n{lossy:?}",
            lossy.elapsed,
            lossless.elapsed
        );
        // No local ACK timeout was needed at 5 %: the early timer and the
        // selective ACKs did it.
        assert_eq!(lossy.a.ack_timeouts, 0, "{stream:?}: {:?}", lossy.a);
    }
}

/// Selective repeat resends less than go-back-N for the same losses, and keeps
/// packets ahead at the responder; go-back-N keeps none.
#[test]
fn selective_repeat_resends_only_what_is_missing() {
    let sr = transfer(4, link(0.05), BOTH, Stream::Write, 64);
    let gbn = transfer(4, link(0.05), NEITHER, Stream::Write, 64);
    assert!(
        sr.b.sr_held_ahead > 0 && sr.a.sack_received > 0,
        "{:?}",
        sr.b
    );
    assert!(sr.a.sr_skipped > 0, "{:?}", sr.a);
    assert_eq!((gbn.b.sr_held_ahead, gbn.b.sack_sent), (0, 0));
    assert!(gbn.b.nak_seq_sent > 0);
    assert!(
        sr.a.retransmitted_packets * 2 < gbn.a.retransmitted_packets,
        "selective {} vs go-back-N {}",
        sr.a.retransmitted_packets,
        gbn.a.retransmitted_packets
    );
}

/// Losses in bursts (mean burst 4 datagrams, about 5 % lost overall) and 30 %
/// random loss: every stream completes, data intact.
#[test]
fn bursty_and_thirty_percent_loss_complete() {
    let burst = Burst {
        enter: 0.0125,
        leave: 0.25,
        loss: 0.8,
    };
    for (i, stream) in [Stream::Write, Stream::Send, Stream::Read]
        .into_iter()
        .enumerate()
    {
        let seed = 10 + i as u64;
        let bursty = transfer(seed, link(0.0).with_burst(burst), BOTH, stream, 32);
        assert!(bursty.sim.lost > 0);
        let r = transfer(seed, link(0.3), BOTH, stream, 16);
        assert!(r.sim.lost > 0);
        // The responder's hold-ahead bookkeeping stays within its bound (see
        // hostile.rs for a peer that tries to exceed it).
        for held in [bursty.most_held, r.most_held] {
            assert!(
                held.packets <= HeldAhead::MAX_PACKETS && held.bytes <= HeldAhead::MAX_BYTES,
                "{stream:?}: {held:?}"
            );
        }
        if stream != Stream::Read {
            assert!(r.most_held.packets > 0, "{stream:?}: {:?}", r.most_held);
        }
        let r = transfer(seed, link(0.3), NEITHER, stream, 8);
        assert!(r.sim.lost > 0);
    }
}

/// The cap on packets in flight keeps a burst from overrunning a small queue
/// (a receiver's socket buffer): the configured window (1024 packets, 4 MiB)
/// would overrun a 128 KiB queue on every round trip; the cap, measured from the
/// path, keeps what is dropped for want of room under a tenth (the start-up
/// probing for the rate: 77 of 1140 packets here, against 2111 of 3163 with the
/// cap held at the window), and the transfer runs near the link's rate.
#[test]
fn in_flight_cap_keeps_the_queue_from_overflowing() {
    // 10 Gb/s with a 128 KiB queue: 32 full packets.
    let faults = Faults::none().with_rate(1_250_000_000, 128 << 10);
    let r = transfer(5, faults, BOTH, Stream::Write, 64);
    let packets = (64 * SIZE / 4096) as u64;
    assert!(
        r.sim.queue_full * 10 <= r.a.tx_packets,
        "{} of {} dropped at the queue",
        r.sim.queue_full,
        r.a.tx_packets
    );
    // At 10 Gb/s the data alone takes 64 x 64 KiB / 1.25 GB/s = 3.36 ms.
    let wire = Duration::from_nanos(packets * 4096 * 1_000_000_000 / 1_250_000_000);
    assert!(r.elapsed < wire * 2, "{:?} for {wire:?} of data", r.elapsed);
}

/// On a long fat path (10 Gb/s, 1 ms each way: a pipe of about 600 packets of
/// 4 KiB) the in-flight cap grows past 256 packets with go-back-N, but a QP whose
/// peer does selective repeat never has more in flight than the 256 PSNs that
/// peer's responder keeps ahead (more would be dropped there after a loss and
/// sent again).
#[test]
fn selective_repeat_keeps_in_flight_within_what_the_peer_holds_ahead() {
    let faults = Faults {
        delay: Duration::from_millis(1),
        ..Faults::none().with_rate(1_250_000_000, 16 << 20)
    };
    let rd_atomic = PairOpts::default().max_rd_atomic;
    let gbn = transfer_deep(12, faults, NEITHER, Stream::Write, 96, 64, rd_atomic);
    let sr = transfer_deep(12, faults, BOTH, Stream::Write, 96, 64, rd_atomic);
    assert!(
        gbn.most_in_flight > 256,
        "go-back-N: {}",
        gbn.most_in_flight
    );
    assert!(
        (200..=256).contains(&sr.most_in_flight),
        "selective repeat: {}",
        sr.most_in_flight
    );
    assert_eq!(sr.a.ack_timeouts, 0, "{:?}", sr.a);
}

/// With a read budget (the requester's receive buffer, `EngineConfig::read_budget`;
/// 16 MiB here, the link's queue) a READ stream keeps every READ max_rd_atomic
/// allows outstanding: new READ requests may pass the in-flight cap, which learns
/// its rate from acknowledged PSNs and for READs sees each one's responses only as
/// a burst at its end, so its samples never showed more than the cap let through
/// and it stayed at its floor (on loopback: one or two 64 KiB READs outstanding of
/// the 16 allowed; ib_read_bw at a third of ib_write_bw). On a path of 1 ms each
/// way, 64 READs of 64 KiB, 16 at a time, take about four round trips plus the wire
/// time (virtual time: 9.0 ms against a model of 11.4; 21.0 ms without the budget),
/// and no more than those 16 READs' responses are ever in flight.
#[test]
fn reads_keep_max_rd_atomic_outstanding() {
    let faults = Faults {
        delay: Duration::from_millis(1),
        ..Faults::none().with_rate(1_250_000_000, 16 << 20)
    };
    const RD_ATOMIC: u8 = 16;
    let n = 64;
    let r = transfer_budget(16, faults, BOTH, Stream::Read, n, 64, RD_ATOMIC, 16 << 20);
    let per_read = (SIZE / 4096) as u64;
    assert_eq!(
        r.most_in_flight,
        u64::from(RD_ATOMIC) * per_read,
        "PSNs in flight"
    );
    let round_trips = n as u32 / u32::from(RD_ATOMIC);
    let wire = Duration::from_nanos((n * SIZE) as u64 * 1_000_000_000 / 1_250_000_000);
    let model = Duration::from_millis(2) * round_trips + wire;
    assert!(
        r.elapsed < model * 5 / 4,
        "{:?} against {model:?}",
        r.elapsed
    );
    // Nothing resent but the one tail-loss probe that goes before any round trip
    // is measured, 1 ms after the first READ: needless on this 2 ms path.
    assert_eq!(r.a.retransmitted_packets, r.a.tail_loss_probes, "{:?}", r.a);
    assert!(r.a.tail_loss_probes <= 1, "{:?}", r.a);
}

/// READs longer than the selective-repeat window (2 MiB: 512 responses of 4 KiB,
/// against 256 PSNs the requester can hold ahead), at 5 % loss: after a loss the
/// READ is asked again for the run missing up to the next response held, or for
/// all the rest when none is held within the window, and a gap before a response
/// seen but not held (past the window) is found at once too. (Before, the
/// requester asked for the 257 responses after the loss only and found the gaps
/// of the rest by timer: `ib_read_bw -a` on the drop-in stalled at 8 MiB.)
#[test]
fn reads_longer_than_the_window_recover_without_timers() {
    const READ: usize = 2 << 20;
    const N: usize = 4;
    let mut net = Net::new(14, link(0.05), BOTH, 2 * N * READ);
    fill(&mut net.ends[1].buf[..N * READ], 14);
    let wcs = net.read_back(N, READ);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(net.sim.stats().lost > 0);
    let c = net.engine(0).counters();
    assert_eq!(c.ack_timeouts, 0, "{c:?}");
    // Timers remain for tails lost again (26 expiries here, against 149 when the
    // requester asked for 257 responses after a loss and found later gaps by timer).
    assert!(c.tail_loss_probes + c.early_retransmits <= 40, "{c:?}");
    assert!(net.ends[0].buf[N * READ..] == net.ends[1].buf[..N * READ]);
}

/// 8 MiB READs (2048 responses of 4 KiB, as `ib_read_bw -a` ends with) over a
/// loss-free link whose 1 MiB queue (a receiver's socket buffer) cannot hold a
/// whole response burst: the tail of each burst is lost to the queue. The READ is
/// asked again once per loss found, never once per response that arrives after
/// it: a gap seen before a re-request is no evidence against the responses the
/// re-request brings. (Before, every response of the re-requested run found the
/// old gap again and asked for the READ once more, each time restarting the
/// responder's burst: thousands of re-requests, RETRY_EXC_ERR on the drop-in,
/// with and without selective repeat.)
#[test]
fn long_reads_overflowing_the_queue_ask_again_once_per_loss() {
    const READ: usize = 8 << 20;
    const N: usize = 2;
    for sr in [BOTH, NEITHER] {
        let mut net = Net::new(15, link(0.0), sr, 2 * N * READ);
        fill(&mut net.ends[1].buf[..N * READ], 15);
        let wcs = net.read_back(N, READ);
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{sr:?}: {wcs:?}"
        );
        let overflowed = net.sim.stats().queue_full;
        assert!(overflowed > 0, "{sr:?}: the queue overflowed");
        let c = net.engine(0).counters();
        assert_eq!(c.ack_timeouts, 0, "{sr:?}: {c:?}");
        // Each burst loses its tail to the queue: a handful of re-requests per READ
        // (a few hundred before).
        assert!(c.retransmitted_packets <= 64, "{sr:?}: {c:?}");
        assert!(net.ends[0].buf[N * READ..] == net.ends[1].buf[..N * READ]);
    }
}

/// A peer that goes silent after the RTT was measured: the early timer resends
/// (probe, then backed-off retransmissions) without spending retries, and the
/// QP still ends in RETRY_EXC_ERR after retry_cnt + 1 local ACK timeouts, within
/// timeout x (retry_cnt + 1).
#[test]
fn dead_peer_after_traffic_ends_in_retry_exceeded_within_the_ibta_bound() {
    let mut net = Net::new(6, Faults::none(), BOTH, 4 * SIZE);
    let (a, b) = (net.ends[0].node, net.ends[1].node);
    let (qp, scq) = (net.ends[0].qp, net.ends[0].send_cq);
    let (a_mr, b_mr) = (net.ends[0].mr, net.ends[1].mr);
    let write = |net: &mut Net, wr_id: u64| {
        let sge = Sge {
            addr: a_mr.addr,
            length: 4096,
            lkey: a_mr.lkey,
        };
        let op = SendOp::RdmaWrite {
            remote_addr: b_mr.addr + SIZE as u64,
            rkey: Rkey(b_mr.rkey),
        };
        net.engine(0)
            .post_send(qp, &SendWr::new(wr_id, op, &[sge]))
            .unwrap();
    };
    let limits = Limits::new(1_000_000, Duration::from_secs(60));
    write(&mut net, 1);
    net.sim
        .run_until(limits, |sim| sim.node(a).e.cq_len(scq).unwrap() == 1)
        .unwrap();
    assert!(net.engine(0).qp_srtt(qp).is_some(), "the RTT is measured");
    net.sim.partition(a, b, true);
    for wr_id in 2..5 {
        write(&mut net, wr_id);
    }
    let start = net.sim.now();
    net.sim
        .run_until(limits, |sim| sim.node(a).e.cq_len(scq).unwrap() == 4)
        .unwrap();
    let elapsed = net.sim.now() - start;
    let mut wcs = [WorkCompletion::default(); 8];
    let got = net.engine(0).poll_cq(scq, &mut wcs).unwrap();
    let st: Vec<_> = wcs[..got].iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RetryExcErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    let c = net.engine(0).counters();
    let opts = PairOpts::default();
    let attempts = u64::from(opts.retry_cnt) + 1;
    assert_eq!(c.ack_timeouts, attempts, "{c:?}");
    assert!(c.tail_loss_probes > 0 && c.early_retransmits > 0, "{c:?}");
    let t = timers::ack_timeout(opts.timeout).unwrap();
    assert!(
        elapsed <= t * attempts as u32 + Duration::from_micros(100),
        "{elapsed:?} for {attempts} x {t:?}"
    );
}

/// With a peer that does not do selective repeat (a foreign RoCEv2 device, or
/// softverbs with it off), every packet after the first answer is plain IBA: no
/// reserved bit set, and the peer never sets one. Between two softverbs peers
/// requests and answers carry them throughout.
#[test]
fn reserved_bits_only_between_softverbs_peers() {
    for (sr, label) in [([true, false], "foreign B"), ([false, true], "foreign A")] {
        let mut net = Net::new(7, link(0.05), sr, 2 * 16 * SIZE);
        drop_net_run(&mut net, 16);
        for (i, &on) in sr.iter().enumerate() {
            let tap = net.sim.node(net.ends[i].node);
            let marked: Vec<_> = tap.sent.iter().filter(|s| s.1 != 0).collect();
            if on {
                // Offers only on requests sent before any answer came back.
                assert!(
                    marked.iter().all(|&&(req, _, after)| req && !after),
                    "{label}: {marked:?}"
                );
            } else {
                assert!(marked.is_empty(), "{label}: the plain side set Resv7");
            }
        }
    }
    let mut net = Net::new(8, link(0.05), BOTH, 2 * 16 * SIZE);
    drop_net_run(&mut net, 16);
    for i in 0..2 {
        let tap = net.sim.node(net.ends[i].node);
        assert!(tap.sent.iter().all(|s| s.1 != 0), "every packet marked");
    }
    assert!(net.engine(1).counters().sr_held_ahead > 0);
}

/// Both ends WRITE 16 x 64 KiB to each other at once.
fn drop_net_run(net: &mut Net, n: usize) {
    for i in 0..2 {
        let (mr, peer) = (net.ends[i].mr, net.ends[1 - i].mr);
        let qp = net.ends[i].qp;
        for k in 0..n {
            let sge = Sge {
                addr: mr.addr + (k * SIZE) as u64,
                length: SIZE as u32,
                lkey: mr.lkey,
            };
            let op = SendOp::RdmaWrite {
                remote_addr: peer.addr + ((n + k) * SIZE) as u64,
                rkey: Rkey(peer.rkey),
            };
            net.engine(i)
                .post_send(qp, &SendWr::new(k as u64, op, &[sge]))
                .unwrap();
        }
    }
    let ends = [0, 1].map(|i| (net.ends[i].node, net.ends[i].send_cq));
    net.sim
        .run_until(Limits::new(5_000_000, Duration::from_secs(60)), |sim| {
            ends.iter()
                .all(|&(node, cq)| sim.node(node).e.cq_len(cq).unwrap() == n)
        })
        .unwrap();
}

/// Eight QPs of one device each write 1 MiB at once: the device never has more
/// than its window in flight across them (each QP may always have one packet out,
/// so it is never starved), and every WRITE completes.
#[test]
fn the_device_window_bounds_packets_in_flight_across_qps() {
    const QPS: usize = 8;
    const WINDOW: u32 = 48;
    let opts = PairOpts {
        mtu: Mtu::Mtu4096,
        ..PairOpts::default()
    };
    let addrs: [SocketAddr; 2] = [ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap()];
    // Declared before the simulator, so they are dropped after it.
    let mut bufs: Vec<Box<[u8]>> = Vec::new();
    let mut sim = Sim::new(9, link(0.01));
    let mut nodes = Vec::new();
    let mut qps = [Vec::new(), Vec::new()];
    let mut mrs = Vec::new();
    let mut cqs = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        let config = EngineConfig {
            device_window: WINDOW,
            ..EngineConfig::new(addr)
        };
        let mut e = Engine::new(config);
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(1024).unwrap();
        let mut buf = vec![0u8; 2 << 20].into_boxed_slice();
        fill(&mut buf, i as u64);
        // SAFETY: the buffer never moves and is dropped after the simulator (`bufs`
        // is declared before it).
        let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), opts.mr_access) }.unwrap();
        for _ in 0..QPS {
            let init = QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                qp_type: QpType::Rc,
                cap: opts.cap,
                sq_sig_all: true,
            };
            let (qp, qpn) = e.create_qp(init).unwrap();
            qps[i].push((qp, qpn));
        }
        bufs.push(buf);
        mrs.push(mr);
        cqs.push(cq);
        nodes.push(sim.add_node(Tap {
            e,
            sent: Vec::new(),
            answers_seen: 0,
            drop_answers: Vec::new(),
            requests_seen: 0,
            drop_requests: Vec::new(),
            stall: None,
            backlog: Vec::new(),
            backlog_cap: usize::MAX,
            catch_up_batch: usize::MAX,
            ack_hold: None,
            held_acks: Vec::new(),
            wake_at: None,
        }));
    }
    for i in 0..2 {
        for (&(qp, _), &(_, peer_qpn)) in qps[i].iter().zip(&qps[1 - i]) {
            let e = &mut sim.node_mut(nodes[i]).e;
            connect(e, qp, addrs[1 - i], peer_qpn, opts.psn_a, opts.psn_a, &opts);
        }
    }
    let chunk = (1 << 20) / QPS;
    for (k, &(qp, _)) in qps[0].iter().enumerate() {
        let sge = Sge {
            addr: mrs[0].addr + (k * chunk) as u64,
            length: chunk as u32,
            lkey: mrs[0].lkey,
        };
        let op = SendOp::RdmaWrite {
            remote_addr: mrs[1].addr + ((1 << 20) + k * chunk) as u64,
            rkey: Rkey(mrs[1].rkey),
        };
        sim.node_mut(nodes[0])
            .e
            .post_send(qp, &SendWr::new(k as u64, op, &[sge]))
            .unwrap();
    }
    let (a, cq) = (nodes[0], cqs[0]);
    let mut most = 0;
    sim.run_until(Limits::new(2_000_000, Duration::from_secs(60)), |sim| {
        let e = &sim.node(a).e;
        most = most.max(e.packets_in_flight());
        e.cq_len(cq).unwrap() == QPS
    })
    .unwrap();
    assert!(
        most <= u64::from(WINDOW) + QPS as u64,
        "{most} packets in flight for a window of {WINDOW}"
    );
    assert!(most >= u64::from(WINDOW), "the window was used: {most}");
    let mut wcs = [WorkCompletion::default(); QPS];
    let n = sim.node_mut(a).e.poll_cq(cq, &mut wcs).unwrap();
    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(sim.node(a).e.packets_in_flight(), 0);
    drop(sim);
    assert!(bufs[1][1 << 20..] == bufs[0][..1 << 20], "data differs");
}

/// One way through a host that wakes up for every packet: on a quiet machine the
/// drop-in between two network namespaces takes about 50 µs per 4 KiB ping-pong
/// exchange (`bench/loss.sh`), so about 25 µs each way.
const HOST_DELAY: Duration = Duration::from_micros(25);

/// The outcome of a ping-pong.
#[derive(Debug)]
struct PingPong {
    elapsed: Duration,
    a: Counters,
    b: Counters,
    sim: softverbs_sim::Stats,
}

/// `ibv_rc_pingpong -s SIZE -n ITERS` at MTU 1024 in the simulator: A sends, B
/// answers when its receive completes, and each side sends its next message only
/// once it has both its previous send's completion and the peer's message (as the
/// tool does). Checks every completion; returns the virtual time it took.
fn ping_pong(seed: u64, faults: Faults, iters: usize, size: u32) -> PingPong {
    ping_pong_with(seed, faults, iters, size, |_| {})
}

/// [`ping_pong`] on a net `setup` prepared (to drop chosen packets).
fn ping_pong_with(
    seed: u64,
    faults: Faults,
    iters: usize,
    size: u32,
    setup: impl FnOnce(&mut Net),
) -> PingPong {
    ping_pong_late(seed, faults, iters, size, setup, |_, _| None)
}

/// [`ping_pong_with`] whose side `i` posts its message `n` `late(i, n)` after it
/// could (an application that answers late), if that says so.
fn ping_pong_late(
    seed: u64,
    faults: Faults,
    iters: usize,
    size: u32,
    setup: impl FnOnce(&mut Net),
    late: impl Fn(usize, usize) -> Option<Duration>,
) -> PingPong {
    let size_usize = size as usize;
    let mut net = Net::with_mtu(seed, faults, BOTH, 2 * size_usize, Mtu::Mtu1024);
    setup(&mut net);
    let mut posted_recv = [0usize; 2];
    let mut sends = [0usize; 2];
    let mut sends_done = [0usize; 2];
    let mut recvs_done = [0usize; 2];
    // When side i could have sent its next message (it waits `late` from then).
    let mut ready_at: [Option<Instant>; 2] = [None; 2];
    let post_recv = |net: &mut Net, i: usize, wr_id: u64| {
        let mr = net.ends[i].mr;
        let sge = Sge {
            addr: mr.addr + u64::from(size),
            length: size,
            lkey: mr.lkey,
        };
        let qp = net.ends[i].qp;
        net.engine(i)
            .post_recv(
                qp,
                &RecvWr {
                    wr_id,
                    sges: &[sge],
                },
            )
            .unwrap();
    };
    for (i, posted) in posted_recv.iter_mut().enumerate() {
        while *posted < iters.min(32) {
            post_recv(&mut net, i, *posted as u64);
            *posted += 1;
        }
    }
    let ends = [0, 1].map(|i| {
        let e = &net.ends[i];
        (e.node, e.qp, e.send_cq, e.recv_cq, e.mr)
    });
    let start = net.sim.now();
    let mut wcs = [WorkCompletion::default(); 8];
    let limits = Limits::new(20_000_000, Duration::from_secs(60));
    let outcome = net.sim.run_until(limits, |sim| {
        let now = sim.now();
        for i in 0..2 {
            let (node, qp, scq, rcq, mr) = ends[i];
            let tap = sim.node_mut(node);
            let e = &mut tap.e;
            let got = e.poll_cq(scq, &mut wcs).unwrap();
            for wc in &wcs[..got] {
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (sends_done[i] as u64, WcStatus::Success)
                );
                sends_done[i] += 1;
            }
            let got = e.poll_cq(rcq, &mut wcs).unwrap();
            for wc in &wcs[..got] {
                assert_eq!(
                    (wc.wr_id, wc.status, wc.byte_len),
                    (recvs_done[i] as u64, WcStatus::Success, size)
                );
                recvs_done[i] += 1;
                if posted_recv[i] < iters {
                    let sge = Sge {
                        addr: mr.addr + u64::from(size),
                        length: size,
                        lkey: mr.lkey,
                    };
                    let wr_id = posted_recv[i] as u64;
                    e.post_recv(
                        qp,
                        &RecvWr {
                            wr_id,
                            sges: &[sge],
                        },
                    )
                    .unwrap();
                    posted_recv[i] += 1;
                }
            }
            // A (the client) starts; each side sends once its last send completed
            // and it has received as many messages as it sent (B: one more).
            let due = if i == 0 { sends[0] } else { sends[1] + 1 };
            if sends[i] < iters && sends_done[i] == sends[i] && recvs_done[i] >= due {
                if let Some(delay) = late(i, sends[i]) {
                    let at = *ready_at[i].get_or_insert(now) + delay;
                    if now < at {
                        tap.wake_at = Some(at);
                        continue;
                    }
                }
                ready_at[i] = None;
                let sge = Sge {
                    addr: mr.addr,
                    length: size,
                    lkey: mr.lkey,
                };
                e.post_send(qp, &SendWr::new(sends[i] as u64, SendOp::Send, &[sge]))
                    .unwrap();
                sends[i] += 1;
            }
        }
        sends_done == [iters; 2] && recvs_done == [iters; 2]
    });
    outcome.unwrap_or_else(|e| {
        panic!(
            "ping-pong with {faults:?}: {e}\nA {:?}\nB {:?}",
            net.sim.node(ends[0].0).e.counters(),
            net.sim.node(ends[1].0).e.counters()
        )
    });
    PingPong {
        elapsed: net.sim.now() - start,
        a: net.sim.node(ends[0].0).e.counters(),
        b: net.sim.node(ends[1].0).e.counters(),
        sim: net.sim.stats(),
    }
}

/// `ibv_rc_pingpong -s 4096` (four packets each way per exchange, one message in
/// flight) at 5 % loss each way, over a path whose one-way time is a host's
/// wake-up (25 µs), steady and with up to 10 µs of jitter per packet: within twice
/// the lossless time over the same path, seeds 1-6, and no IBTA local ACK
/// timeout. With one message in flight every loss is a tail loss or close to one
/// (a lost last packet or a lost ACK stalls the exchange until the tail-loss
/// probe): each must cost about a round trip, not the early timer's 200 µs floor
/// or the IBTA timeout. (With the probe held to that floor: 2.04x to 2.28x over
/// seeds 22-24; 1.71x to 1.86x with it at 2 SRTT, floored at 50 µs; over these
/// seeds 1.61x to 1.82x, and 1.45x to 1.65x with it at SRTT + max(4 RTTVAR,
/// SRTT / 4). With jitter, seed 2 lost its first exchange's last packet before
/// any round trip was measured and waited for the IBTA timer: 4.02x, before the
/// probe that runs without an estimate.)
#[test]
fn ping_pong_at_5_percent_loss_within_twice_lossless() {
    let iters = 400;
    let mut worst = 0.0f64;
    for jitter in [Duration::ZERO, Duration::from_micros(10)] {
        let path = |loss| link(loss).with_delay(HOST_DELAY).with_jitter(jitter);
        let lossless = ping_pong(21, path(0.0), iters, 4096);
        for seed in 1..=6 {
            let lossy = ping_pong(seed, path(0.05), iters, 4096);
            let ratio = lossy.elapsed.as_secs_f64() / lossless.elapsed.as_secs_f64();
            eprintln!(
                "jitter {jitter:?} seed {seed}: lossless {:?}, 5 % {:?} ({ratio:.2}x), lost {}, \
                 probes {} + {}, ACK timeouts {} + {}",
                lossless.elapsed,
                lossy.elapsed,
                lossy.sim.lost,
                lossy.a.tail_loss_probes,
                lossy.b.tail_loss_probes,
                lossy.a.ack_timeouts,
                lossy.b.ack_timeouts,
            );
            assert!(lossy.sim.lost > 0);
            assert_eq!(
                lossy.a.ack_timeouts + lossy.b.ack_timeouts,
                0,
                "jitter {jitter:?} seed {seed}"
            );
            worst = worst.max(ratio);
        }
    }
    assert!(worst <= 2.0, "ping-pong at 5 %: {worst:.2}x lossless");
}

/// Both ends of `net` hold each plain ACK up to `hold` for their answer (see
/// [`Tap::ack_hold`]).
fn holding_acks(net: &mut Net, hold: Duration) {
    for i in 0..2 {
        let id = net.ends[i].node;
        net.sim.node_mut(id).ack_hold = Some(hold);
    }
}

/// The ACK hold the engine assumes of its peer by default
/// (`EngineConfig::peer_ack_hold`, the driver's `Config::ack_hold`).
const ACK_HOLD: Duration = Duration::from_micros(50);

/// A one-way time of 10 µs: a round trip of a same-host ping-pong under load.
const LOOPBACK_DELAY: Duration = Duration::from_micros(10);

/// Up to 5 µs more per packet (a host's wake-up varies).
const LOOPBACK_JITTER: Duration = Duration::from_micros(5);

/// A lossless link with loopback's delay and jitter.
fn loopback_link() -> Faults {
    link(0.0)
        .with_delay(LOOPBACK_DELAY)
        .with_jitter(LOOPBACK_JITTER)
}

/// A ping-pong of one-packet messages (as `perf write --lat` and `ib_send_lat -s 8`
/// run it) over a 10 µs path, both ends holding each ACK up to 50 µs for their
/// answer, and B answering every tenth message 80 µs late: its ACK then leaves
/// alone when the hold ends, 70 µs after A sent, nothing lost. A's probe for that
/// lone packet waits out the peer's hold (RFC 8985 7.2: at least 2 SRTT + the
/// worst-case delayed ACK when one segment is in flight), so none goes. (Before,
/// the probe came at its 50 µs floor, about when the held ACK left: one spurious
/// probe per late answer, seeds 1-3, and a duplicate for B to answer; on real
/// sockets under load 654-1270 per 20 000 round trips, `docs/udp-latency.md`.)
#[test]
fn a_lone_packets_probe_waits_out_the_peers_ack_hold() {
    for seed in 1..=3 {
        let late = |i, n: usize| (i == 1 && n % 10 == 5).then_some(Duration::from_micros(80));
        let run = ping_pong_late(
            seed,
            loopback_link(),
            200,
            8,
            |net| holding_acks(net, ACK_HOLD),
            late,
        );
        eprintln!(
            "seed {seed}: {:?}\nA {:?}\nB {:?}",
            run.elapsed, run.a, run.b
        );
        assert_eq!(run.sim.lost, 0);
        assert_eq!(run.a.ack_timeouts + run.b.ack_timeouts, 0, "seed {seed}");
        assert_eq!(
            run.a.tail_loss_probes + run.b.tail_loss_probes,
            0,
            "seed {seed}: spurious probes"
        );
    }
}

/// The same ping-pong (no late answers) losing one lone request on its way to B:
/// A's probe still finds it, at 2 SRTT + the peer's hold + the probe's floor after
/// it was sent (about 140 µs at this path's 20 µs round trip; 50 µs, the floor,
/// before), not the RTO's or the IBTA timer; the run takes that much longer than
/// the lossless one.
#[test]
fn a_lost_lone_request_is_found_by_the_probe_after_the_peers_hold() {
    let none = |_, _| None;
    for seed in 1..=3 {
        let lossless = ping_pong_late(
            seed,
            loopback_link(),
            200,
            8,
            |net| holding_acks(net, ACK_HOLD),
            none,
        );
        let run = ping_pong_late(
            seed,
            loopback_link(),
            200,
            8,
            |net| {
                holding_acks(net, ACK_HOLD);
                let b = net.ends[1].node;
                net.sim.node_mut(b).drop_requests = vec![100];
            },
            none,
        );
        let extra = run.elapsed.saturating_sub(lossless.elapsed);
        eprintln!(
            "seed {seed}: lossless {:?}, one lost {:?} (+{extra:?})\nA {:?}",
            lossless.elapsed, run.elapsed, run.a
        );
        assert_eq!(lossless.a.tail_loss_probes + lossless.b.tail_loss_probes, 0);
        assert_eq!(run.a.ack_timeouts + run.b.ack_timeouts, 0, "seed {seed}");
        assert_eq!(run.a.tail_loss_probes, 1, "seed {seed}: {:?}", run.a);
        assert_eq!(run.a.early_retransmits, 0, "seed {seed}: {:?}", run.a);
        assert!(
            extra >= Duration::from_micros(100) && extra <= Duration::from_micros(200),
            "seed {seed}: the loss cost {extra:?}"
        );
    }
}

/// A ping-pong whose first exchange loses its tail: the last packet of A's first
/// message (dropped at B), or B's ACK of it (dropped at A), or the same for B's
/// first message. Nothing was measured yet and, but for that ACK, nothing comes
/// back to A to estimate from: a probe before any estimate finds the loss. (Before,
/// the early timer ran only once a round trip was measured, and each of these
/// waited for the IBTA local ACK timeout: 67 ms at timeout 14, more than the whole
/// lossless run of `ibv_rc_pingpong -n 2000`; about one ping-pong in five at 5 %
/// loss met one.)
#[test]
fn a_first_exchange_that_loses_its_tail_waits_for_no_ibta_timeout() {
    let path = link(0.0).with_delay(HOST_DELAY);
    // (node, drop which of its arriving requests, drop which of its answers)
    let cases: [(usize, Vec<u64>, Vec<u64>); 4] = [
        (1, vec![3], vec![]),
        (0, vec![], vec![0]),
        (0, vec![3], vec![]),
        (1, vec![], vec![0]),
    ];
    for (node, requests, answers) in cases {
        let what = format!("node {node} drops requests {requests:?}, answers {answers:?}");
        let run = ping_pong_with(1, path, 20, 4096, |net| {
            let id = net.ends[node].node;
            net.sim.node_mut(id).drop_requests = requests;
            net.sim.node_mut(id).drop_answers = answers;
        });
        eprintln!("{what}: {:?}\nA {:?}\nB {:?}", run.elapsed, run.a, run.b);
        assert_eq!(run.a.ack_timeouts + run.b.ack_timeouts, 0, "{what}");
        assert_eq!(run.a.tail_loss_probes + run.b.tail_loss_probes, 1, "{what}");
    }
}

/// A READ stream at 20 % loss whose first READ loses responses, and then the
/// READ asked again, before any round trip was measured: the first answer gives
/// a first estimate, so the early timer covers the lost re-request. (Before, no
/// estimate came until a timed request was acknowledged, which the lost
/// re-request held up: two IBTA local ACK timeouts, 134 ms of a 150 ms run.)
#[test]
fn a_re_request_lost_before_the_first_rtt_sample_is_found_by_the_early_timer() {
    let path = |loss| link(loss).with_delay(HOST_DELAY);
    let lossless = transfer(1, path(0.0), BOTH, Stream::Read, 32);
    let r = transfer(3, path(0.2), BOTH, Stream::Read, 32);
    assert!(r.sim.lost > 0);
    assert_eq!(r.a.ack_timeouts, 0, "{:?}", r.a);
    assert!(
        r.elapsed < 20 * lossless.elapsed,
        "{:?} against {:?} lossless",
        r.elapsed,
        lossless.elapsed
    );
    // The estimate stays a round trip: 2 x 25 µs plus the first response's time
    // on the link, not the time a READ's recovery takes.
    let srtt = r.srtt.expect("measured");
    assert!(srtt < Duration::from_micros(150), "{srtt:?}");
}

/// A READ stream at 5 % loss each way, 25 µs each way (the host delay of
/// [`ping_pong`]'s runs), 16 READs outstanding: with selective repeat a READ that
/// lost responses is asked again alone, from its first missing response, so the
/// READs after it are not answered twice (before, every later outstanding READ was
/// asked again too: 1.9x to 3.3x the responses needed over these seeds, now under
/// 1.3x). It is no slower than go-back-N on the same losses. (In virtual time it
/// takes 2.0x to 2.5x the lossless time over these seeds, 2.2x to 3.2x before the
/// probe asked the READ at una again: the 2x target of issue 15 is not met at
/// this delay.)
#[test]
fn a_read_that_lost_responses_is_asked_again_alone() {
    let far = |loss: f64| Faults {
        delay: Duration::from_micros(25),
        ..link(loss)
    };
    let n = 64;
    let needed = (n * SIZE / 4096) as u64;
    for seed in 1..=6 {
        let lossless = transfer(seed, far(0.0), BOTH, Stream::Read, n);
        let lossy = transfer(seed, far(0.05), BOTH, Stream::Read, n);
        let plain = transfer(seed, far(0.05), NEITHER, Stream::Read, n);
        let ratio = lossy.elapsed.as_secs_f64() / lossless.elapsed.as_secs_f64();
        eprintln!(
            "seed {seed}: {ratio:.2}x lossless (go-back-N {:.2}x), {} responses for {needed}, \
             lost {}",
            plain.elapsed.as_secs_f64() / lossless.elapsed.as_secs_f64(),
            lossy.a.rx_packets,
            lossy.sim.lost
        );
        assert!(lossy.sim.lost > 0);
        assert!(
            lossy.a.rx_packets * 2 <= needed * 3,
            "seed {seed}: {} responses for {needed}\n{:?}",
            lossy.a.rx_packets,
            lossy.a
        );
        assert!(
            lossy.elapsed <= plain.elapsed,
            "seed {seed}: selective {:?}, go-back-N {:?}\n{:?}",
            lossy.elapsed,
            plain.elapsed,
            lossy.a
        );
        assert_eq!(lossy.a.ack_timeouts, 0, "seed {seed}: {:?}", lossy.a);
    }
}

/// With a selective-repeat peer, responses of the READs after one that lost a
/// response are kept, the first response of each too: only the lost one is asked
/// again. Before, a READ's first response arriving while una was on an earlier
/// READ was dropped (it was the one its READ expected next, not "ahead" of it),
/// so each later READ was asked again in turn when una reached it, a round trip
/// each: in a READ stream at 5 % loss the link stood idle for a round trip per
/// READ after every loss (2.0x-2.5x lossless, 1.6x-1.9x with this alone:
/// `a_read_stream_at_5_percent_loss_within_twice_lossless`).
#[test]
fn responses_of_later_reads_are_kept_while_an_earlier_read_lacks_one() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let n = 4;
    let mut net = Net::build(1, faults, BOTH, 2 * n * SIZE, Mtu::Mtu4096, 4, 0);
    fill(&mut net.ends[1].buf[..n * SIZE], 7);
    // READ 0's second response is lost (its first one, the first answer, comes).
    let a = net.ends[0].node;
    net.sim.node_mut(a).drop_answers = vec![1];
    let wcs = net.read_back(n, SIZE);
    assert_eq!(wcs.len(), n);
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
    }
    assert!(net.ends[0].buf[n * SIZE..] == net.ends[1].buf[..n * SIZE]);
    let tap = net.sim.node(a);
    let requests = tap.sent.iter().filter(|(req, _, _)| *req).count();
    let responses = (n * SIZE / 4096) as u64;
    let c = tap.e.counters();
    // The lost response alone came again. READ 0 was asked again once, and
    // perhaps probed once more: its repair queues behind the later READs'
    // responses on the link, longer than the probe's two round trips.
    assert_eq!(tap.answers_seen, responses + 1, "{c:?}");
    assert!(requests <= n + 2, "{requests} READ requests\n{c:?}");
    assert_eq!(c.drop_out_of_sequence, 0, "{c:?}");
}

/// With a selective-repeat peer, a READ that lost several responses gets them
/// all back within about one round trip: each hole is asked for as soon as the
/// response after it shows it lost, and the walk asking again asks for every
/// hole known, not the first one only. Before, each hole was asked for when the
/// one before it was filled, a round trip each (or, past the first, by the
/// early timer). At MTU 1024 a 64 KiB READ has 64 responses, about three lost at
/// 5 %: `ib_read_bw` over a 1500-byte link ran 3x-8x lossless.
#[test]
fn a_read_that_lost_several_responses_gets_them_back_in_one_round_trip() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let run = |drops: Vec<u64>| {
        let mut net = Net::build(1, faults, BOTH, 2 * SIZE, Mtu::Mtu1024, 4, 0);
        fill(&mut net.ends[1].buf[..SIZE], 3);
        let a = net.ends[0].node;
        net.sim.node_mut(a).drop_answers = drops;
        let start = net.sim.now();
        let wcs = net.read_back(1, SIZE);
        assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
        assert!(net.ends[0].buf[SIZE..] == net.ends[1].buf[..SIZE]);
        let tap = net.sim.node(a);
        (net.sim.now() - start, tap.e.counters(), tap.answers_seen)
    };
    let (lossless, _, _) = run(Vec::new());
    // Responses 5, 20, 21 and 40 of 64 are lost.
    let (lossy, c, answers) = run(vec![5, 20, 21, 40]);
    eprintln!("lossless {lossless:?}, 4 lost {lossy:?}, {answers} answers\n{c:?}");
    // The repairs come back about one round trip (50 µs) after the last hole
    // showed: well within two.
    assert!(
        lossy < lossless + Duration::from_micros(90),
        "lossless {lossless:?}, 4 lost {lossy:?}\n{c:?}"
    );
    assert_eq!(c.tail_loss_probes + c.early_retransmits, 0, "{c:?}");
    // Each lost response came once more (and each run's last held one with it).
    assert!(answers <= 64 + 4 + 3, "{answers} answers\n{c:?}");
}

/// A READ stream as `ib_read_bw` runs it (64 KiB READs, 16 outstanding:
/// perftest's `--outs` defaults to the device's `max_qp_rd_atom`, 16 here), 5 %
/// loss each way, 25 µs each way, seeds 1-6: per seed, the lossy run and its
/// time against the lossless one.
fn read_stream_at_5_percent() -> Vec<(u64, f64, Run)> {
    read_stream_at_5_percent_with(Mtu::Mtu4096, 0)
}

/// [`read_stream_at_5_percent`] at `mtu` with `read_budget` bytes of READ
/// responses allowed past the in-flight cap (`EngineConfig::read_budget`).
fn read_stream_at_5_percent_with(mtu: Mtu, read_budget: u32) -> Vec<(u64, f64, Run)> {
    let far = |loss: f64| Faults {
        delay: Duration::from_micros(25),
        ..link(loss)
    };
    let n = 64;
    let run = |seed: u64, loss: f64| {
        transfer_mtu(
            seed,
            far(loss),
            BOTH,
            Stream::Read,
            n,
            16,
            16,
            read_budget,
            mtu,
            None,
        )
    };
    (1..=6)
        .map(|seed| {
            let lossless = run(seed, 0.0);
            let lossy = run(seed, 0.05);
            let ratio = lossy.elapsed.as_secs_f64() / lossless.elapsed.as_secs_f64();
            eprintln!(
                "{mtu:?} budget {read_budget}, seed {seed}: lossless {:?}, 5 % {:?} ({ratio:.2}x), \
                 lost {}, {} responses, {} requests resent, {} early retransmissions, {} probes",
                lossless.elapsed,
                lossy.elapsed,
                lossy.sim.lost,
                lossy.a.rx_packets,
                lossy.a.retransmitted_packets,
                lossy.a.early_retransmits,
                lossy.a.tail_loss_probes
            );
            assert!(lossy.sim.lost > 0);
            assert_eq!(lossy.a.ack_timeouts, 0, "seed {seed}: {:?}", lossy.a);
            (seed, ratio, lossy)
        })
        .collect()
}

/// With a selective-repeat peer, the early timer's probe asks the READ at una
/// again from its first missing response when that READ still lacks some: a
/// re-request lost, or its answer, leaves nothing after it to show the loss, and
/// the newest packet (what the probe sent before) brings no answer that does.
/// Before, each such loss waited for the RTO (200 µs at least) and a go-back
/// over the READs after it: 27 early retransmissions over these seeds and
/// 2.11x-3.23x lossless; then 4, and 2.02x-2.52x (2 and 1.48x-1.75x since
/// session 5's READ changes).
#[test]
fn the_probe_asks_the_read_at_una_again_so_lost_re_requests_wait_for_no_rto() {
    let runs = read_stream_at_5_percent();
    let rtos: u64 = runs.iter().map(|(_, _, r)| r.a.early_retransmits).sum();
    let probes: u64 = runs.iter().map(|(_, _, r)| r.a.tail_loss_probes).sum();
    assert!(probes > 0, "the probe did the work");
    assert!(rtos <= 8, "{rtos} early retransmissions over 6 seeds");
    for (seed, ratio, _) in &runs {
        assert!(*ratio < 2.7, "seed {seed}: {ratio:.2}x lossless");
    }
}

/// Issue 15's target for `ib_read_bw` in virtual time: the READ stream of
/// [`read_stream_at_5_percent`] within twice the lossless time on every seed:
/// 1.48x-1.75x. It was 2.02x-2.52x while a later READ's first response arriving
/// with una on an earlier READ was dropped
/// (`responses_of_later_reads_are_kept_while_an_earlier_read_lacks_one`): each
/// READ after a loss was asked again in turn, a round trip each, the link idle
/// (1.59x-1.93x once that was fixed; the rest from asking for every hole of a
/// READ at once, `a_read_that_lost_several_responses_gets_them_back_in_one_round_trip`).
#[test]
fn a_read_stream_at_5_percent_loss_within_twice_lossless() {
    let worst = read_stream_at_5_percent()
        .iter()
        .map(|(_, ratio, _)| *ratio)
        .fold(0.0, f64::max);
    assert!(worst <= 2.0, "READ stream at 5 %: {worst:.2}x lossless");
}

/// The READ stream of [`read_stream_at_5_percent`] as the real `ib_read_bw` runs
/// between two namespaces: MTU 1024 (a 1500-byte veth: 64 responses per READ)
/// and the driver's read budget (a quarter of the socket's SO_RCVBUF, 2 MiB), so
/// new READ requests pass the in-flight cap while nothing was resent lately.
/// Within twice the lossless time on every seed: 1.58x-1.80x. Before: 2.73x-3.70x
/// (the real `ib_read_bw` 2.29x); by the traces, the link sat idle a round trip
/// per hole in a READ after the one at una (asked for only once una reached its
/// READ, and a READ asked again stayed under the in-flight cap, at its floor
/// after a loss), a READ's responses past what the requester can hold ahead
/// (256 PSNs) were dropped while an earlier READ waited for a repair, and of the
/// first 16 READs, sent before the first answer said the peer was a softverbs
/// one, those past its responder's window were dropped there and each found
/// missing only as una reached it (2.32x-2.65x, then 2.05x-2.51x, as each was
/// fixed).
#[test]
fn a_read_stream_with_the_drivers_read_budget_at_5_percent_within_twice_lossless() {
    let worst = read_stream_at_5_percent_with(Mtu::Mtu1024, 2 << 20)
        .iter()
        .map(|(_, ratio, _)| *ratio)
        .fold(0.0, f64::max);
    assert!(worst <= 2.0, "READ stream at 5 %: {worst:.2}x lossless");
}

/// A peer that stops running for 5 ms in the middle of a SEND or WRITE stream
/// (its process not scheduled: nothing is lost, what arrives waits in its socket
/// buffer) costs the tail-loss probe and one packet per backed-off early
/// timeout, not a go-back over everything in flight per timeout: 5 packets sent
/// again here, 153 before (1 probe, 4 timeouts going back over about 38 packets
/// each). When the peer runs again its answer acknowledges everything sent,
/// packets the timeouts never resent among it, so the timeout is found
/// spurious and nothing more goes again (RFC 5682's test). Both with selective repeat and go-back-N. A probe the
/// in-flight cap held back (it shrank below what was sent), or one left in
/// its retransmit mode with nothing new to send after it, made the next
/// timeout's resend of the oldest packet a go-back over everything up to the
/// probe (65 and 120 packets in the depth 1 and early cases). A stall of
/// 150 ms outlasts the IBTA timer (67 ms) twice: with a softverbs peer its
/// retries, too, send the oldest packet only, and so do the early timeouts
/// that follow each (25 packets; 11 while an IBTA timeout stopped the early
/// timer, 85 before); with any other peer they go back over everything, as IBA
/// has it. The round-trip estimate comes out of the stall as it went in.
#[test]
fn a_stalled_peer_costs_no_go_back_over_what_is_in_flight() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let short = Some((Duration::from_millis(1), Duration::from_millis(5)));
    // Early, while the in-flight cap shrinks to its first samples below what
    // was sent: the probe must not wait for it.
    let early = Some((Duration::from_micros(100), Duration::from_millis(5)));
    let long = Some((Duration::from_millis(1), Duration::from_millis(150)));
    for (stream, sr, stall, depth, ack_timeouts) in [
        (Stream::Write, BOTH, short, 16, 0),
        (Stream::Send, BOTH, short, 16, 0),
        (Stream::Write, NEITHER, short, 16, 0),
        (Stream::Write, BOTH, short, 1, 0),
        (Stream::Write, BOTH, early, 4, 0),
        (Stream::Write, NEITHER, early, 4, 0),
        (Stream::Write, BOTH, long, 16, 2),
        (Stream::Send, BOTH, long, 16, 2),
    ] {
        let run = transfer_mtu(1, faults, sr, stream, 64, depth, 4, 0, Mtu::Mtu4096, stall);
        let what = format!("{stream:?} {sr:?} {stall:?} depth {depth}");
        assert_only_the_timeouts_resent(&run, &what, ack_timeouts, 3);
        // The answer when the peer runs again times the stall, not the path
        // (Karn's rule): the estimate stays about a round trip (118-121 µs
        // here; 56.6 ms at the end of the 150 ms stall before).
        let srtt = run.srtt.expect("measured");
        assert!(srtt < Duration::from_millis(1), "{what}: SRTT {srtt:?}");
    }
}

/// 64 messages of 16 packets, 4 in flight, on a lossless 25 µs link whose
/// responder stalls (its process not scheduled) for `stall` = (from, length) in
/// µs, reading `batch` packets at a time: the runs of the probe and READ
/// recovery tests below.
fn a_stalled_stream(stream: Stream, sr: [bool; 2], stall: (u64, u64), batch: usize) -> Run {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let (from, len) = stall;
    transfer_caught_up_in(
        1,
        faults,
        sr,
        stream,
        64,
        16,
        4,
        0,
        Mtu::Mtu4096,
        Some((Duration::from_micros(from), Duration::from_micros(len))),
        (batch, usize::MAX),
    )
}

/// A SEND or WRITE stream whose responder stalls briefly (its process not
/// scheduled: nothing is lost, its ACKs are only late), long enough for the
/// early timer's probe, with more to send than the in-flight cap lets go: the
/// probe sends the next new packet (RFC 8985 7.3), not the newest one again, so
/// the only packets sent twice are the early retransmissions' (the oldest one
/// each). Before, every probe resent a packet: the spurious probes of a lossless
/// `perf write` on a 2-core host, where the target waits for a CPU (session 14:
/// 95-541 probes per 3 s run, against 14-408 early retransmissions).
#[test]
fn a_probe_with_new_data_waiting_sends_it_instead_of_a_duplicate() {
    let mut summary = Vec::new();
    for (stream, sr) in [(Stream::Write, BOTH), (Stream::Send, BOTH)] {
        for (stall_from, stall_len) in [(1_000, 400), (1_000, 600), (2_000, 1_000)] {
            for batch in [usize::MAX, 32] {
                let run = a_stalled_stream(stream, sr, (stall_from, stall_len), batch);
                let a = &run.a;
                let what = format!(
                    "{stream:?} {sr:?}, stall {stall_from}+{stall_len} µs, read {batch} at a time"
                );
                assert_eq!(run.sim.lost, 0, "{what}");
                assert_eq!(a.ack_timeouts, 0, "{what}: {a:?}");
                assert!(a.tail_loss_probes > 0, "{what}: no probe: {a:?}");
                summary.push(format!(
                    "{what}: {} probes, {} early, {} resent",
                    a.tail_loss_probes, a.early_retransmits, a.retransmitted_packets
                ));
                assert!(
                    a.retransmitted_packets <= a.early_retransmits,
                    "{what}: {} resent for {} early retransmissions and {} probes\n{a:?}",
                    a.retransmitted_packets,
                    a.early_retransmits,
                    a.tail_loss_probes
                );
            }
        }
    }
    eprintln!("{}", summary.join("\n"));
}

/// A READ stream whose responder stalls briefly (its process not scheduled:
/// nothing is lost, its answers are only late), long enough for the early
/// timer's probe and its first retransmission: each asks the READ at una alone
/// again, from its first missing response, not every READ in flight, and the
/// responder keeps the answers it queued for the READs after it. Each expiry
/// resends one request, and the responses sent beyond the stream's own (64
/// READs of 16) stay within one READ's per expiry. Before, the retransmission
/// went back over the READs in flight (4 here, 16 in `softverbs perf read`,
/// whose responses the responder sends again if it sent them already): 3
/// requests resent for 2 expiries; and the responder, asked the READ at una
/// again to its end (the probe) while its answers to the READs after it were
/// still queued, dropped those as for a go-back, and they were asked again in
/// turn: 3 requests and 15 responses resent for one probe. Longer stalls still
/// go back at the later expiries (see `Completer::on_timeout`).
#[test]
fn a_stalled_read_responder_is_asked_again_for_the_read_at_una_alone() {
    let mut summary = Vec::new();
    for batch in [usize::MAX, 32, 8] {
        for (stall_from, stall_len) in [(1_000, 400), (1_000, 500), (1_000, 600), (2_000, 600)] {
            let run = a_stalled_stream(Stream::Read, BOTH, (stall_from, stall_len), batch);
            let a = &run.a;
            let what = format!("stall {stall_from}+{stall_len} µs, read {batch} at a time");
            assert_eq!(run.sim.lost, 0, "{what}");
            assert_eq!(a.ack_timeouts, 0, "{what}: {a:?}");
            let expiries = a.tail_loss_probes + a.early_retransmits;
            assert!(
                expiries > 0,
                "{what}: the stall fired the early timer: {a:?}"
            );
            // Responses beyond the 64 x 16 the stream needs.
            let extra = run.b.tx_packets - 64 * 16;
            summary.push(format!(
                "{what}: {expiries} expiries ({} early), {} requests resent, {extra} responses resent",
                a.early_retransmits, a.retransmitted_packets
            ));
            // One request per expiry: the READ at una (or, for a probe with none
            // missing, the newest packet).
            assert!(
                a.retransmitted_packets <= expiries,
                "{what}: {} requests resent for {expiries} early expiries\n{a:?}",
                a.retransmitted_packets
            );
            assert!(
                extra <= 16 * expiries,
                "{what}: {extra} responses resent for {expiries} early expiries\n{a:?}"
            );
        }
    }
    eprintln!("{}", summary.join("\n"));
}

/// A stalled peer's run (nothing lost) cost its requester `ack_timeouts` IBTA
/// timeouts and at least `early` early ones, no packet resent beyond what the
/// probes and the timeouts themselves sent, and one timeout found spurious (the
/// F-RTO test's verdict when the peer runs again).
fn assert_only_the_timeouts_resent(run: &Run, what: &str, ack_timeouts: u64, early: u64) {
    let a = &run.a;
    assert_eq!(run.sim.lost, 0);
    assert_eq!(a.ack_timeouts, ack_timeouts, "{what}: {a:?}");
    assert!(a.early_retransmits >= early, "{what}: timeouts: {a:?}");
    let timeouts = a.tail_loss_probes + a.early_retransmits + a.ack_timeouts;
    assert!(
        a.retransmitted_packets <= timeouts,
        "{what}: {} packets resent\n{a:?}",
        a.retransmitted_packets
    );
    assert_eq!(a.spurious_timeouts, 1, "{what}: {a:?}");
}

/// As [`a_stalled_peer_costs_no_go_back_over_what_is_in_flight`], the peer
/// reading what waited in its socket buffer a batch at a time when it runs again
/// (the driver's `recvmmsg` reads 32 datagrams), each batch's answer leaving
/// before the next batch is read: the first answers after the timeout each
/// acknowledge part of what was sent before it. With a softverbs peer they are
/// no sign of loss (it reports holes itself, and the probe finds a lost tail):
/// the timeout's test waits for the answer that covers everything sent, and
/// nothing but the probe and the oldest packet goes again. Before session 10,
/// the first partial answer sent the requester back over everything still
/// waiting in the peer's buffer: most of what a lossless `perf write` on a
/// loaded host resent (0.05-1 % of its packets, none lost by the kernel: UDP
/// RcvbufErrors and InErrors unchanged).
#[test]
fn a_stalled_peer_reading_its_backlog_in_batches_costs_no_go_back() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let short = Some((Duration::from_millis(1), Duration::from_millis(5)));
    for (stream, batch) in [(Stream::Write, 32), (Stream::Write, 8), (Stream::Send, 32)] {
        let run = transfer_caught_up_in(
            1,
            faults,
            BOTH,
            stream,
            64,
            16,
            4,
            0,
            Mtu::Mtu4096,
            short,
            (batch, usize::MAX),
        );
        let what = format!("{stream:?} read {batch} at a time");
        assert_only_the_timeouts_resent(&run, &what, 0, 1);
    }
}

/// The loss that a partial answer after the early timeout no longer goes back
/// for (see [`a_stalled_peer_reading_its_backlog_in_batches_costs_no_go_back`]):
/// the stalled peer's socket buffer overflows, so the end of what was sent before
/// the timeout is lost, and it reads what it kept a batch at a time. The probe and
/// the peer's selective acknowledgements recover it without the IBTA timer, every
/// byte checked: with 16 datagrams kept, 4.45 ms and 28 packets resent for the
/// WRITE stream, 4.47 ms and 40 for SEND (main, going back at the partial answer:
/// 4.42 ms and 25 for both). Main passes it too: it guards the recovery, it does
/// not pin the change.
#[test]
fn a_stalled_peer_whose_buffer_overflowed_needs_no_go_back_at_a_partial_answer() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    for stream in [Stream::Write, Stream::Send] {
        for stall_ms in [1u64, 5] {
            for cap in [16usize, 64, 128] {
                let stall = Some((Duration::from_millis(1), Duration::from_millis(stall_ms)));
                let run = transfer_caught_up_in(
                    1,
                    faults,
                    BOTH,
                    stream,
                    64,
                    16,
                    4,
                    0,
                    Mtu::Mtu4096,
                    stall,
                    (32, cap),
                );
                let a = run.a;
                eprintln!(
                    "{stream:?} stall {stall_ms} ms, {cap} kept: {:?}, {} resent, {} probes, {} early",
                    run.elapsed, a.retransmitted_packets, a.tail_loss_probes, a.early_retransmits
                );
                assert_eq!(a.ack_timeouts, 0, "{stream:?} {stall_ms} ms {cap}: {a:?}");
            }
        }
    }
}

/// A long SEND stream at 5 % loss resends a small multiple of what the network
/// lost (issue 15: a responder that could not place the packets after a SEND
/// whose last packet was lost dropped them and asked with a sequence NAK, and
/// the requester went back over everything in flight each time: 5x-15x the
/// losses here, 0.9 M packets resent for 4.4 k lost in `softverbs perf send`).
/// WRITE, whose packets carry their place, is the reference.
#[test]
fn a_send_stream_at_5_percent_resends_a_small_multiple_of_what_was_lost() {
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        for seed in 1..=3 {
            let r = transfer_mtu(
                seed,
                link(0.05),
                BOTH,
                Stream::Send,
                200,
                16,
                16,
                0,
                mtu,
                None,
            );
            let (lost, resent) = (r.sim.lost, r.a.retransmitted_packets);
            eprintln!(
                "{mtu:?} seed {seed}: {lost} lost, {resent} resent, {} dropped ahead, {} sequence NAKs",
                r.b.drop_out_of_sequence, r.b.nak_seq_sent
            );
            assert!(lost > 0, "{mtu:?} seed {seed}");
            assert!(
                resent <= 4 * lost,
                "{mtu:?} seed {seed}: {resent} resent for {lost} lost\nA {:?}\nB {:?}",
                r.a,
                r.b
            );
        }
    }
}

/// Issue 15 (session 6): a lossless real `ib_read_bw` run lost 128 READ
/// responses in a row (a socket receive buffer overflowing, not the link) and
/// recovered only by the IBTA local ACK timeout (67 ms at the tools' timeout
/// 14). Here, a READ stream as the driver runs it (MTU 1024, 16 READs of 64 KiB
/// outstanding, the driver's read budget) loses a burst of 128 responses at
/// several points; the early timer, the probe and the gap detection recover
/// every one without the IBTA timer.
#[test]
fn a_burst_of_128_lost_read_responses_waits_for_no_ibta_timeout() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let n = 32;
    let mut cases = Vec::new();
    for first in [0u64, 1, 63, 64, 100, 500, 1000, 1900, 1920, 1984] {
        cases.push((first, 128u64, 0u64, 0u64));
    }
    for req in [1u64, 2, 5, 8, 15, 16, 17, 20, 30] {
        for len in [1u64, 2, 4, 8] {
            cases.push((0, 0, req + 1, len));
            cases.push((req * 64 + 10, 128, req + 1, len));
        }
    }
    let mut failed = Vec::new();
    for (first, lost, req, req_lost) in cases {
        let mut net = Net::build(1, faults, BOTH, 2 * n * SIZE, Mtu::Mtu1024, 16, 2 << 20);
        fill(&mut net.ends[1].buf[..n * SIZE], first + req);
        let a = net.ends[0].node;
        let b = net.ends[1].node;
        net.sim.node_mut(a).drop_answers = (first..first + lost).collect();
        net.sim.node_mut(b).drop_requests = (req..req + req_lost).collect();
        let first = (first, lost, req, req_lost);
        let start = net.sim.now();
        let wcs = net.read_back(n, SIZE);
        let elapsed = net.sim.now() - start;
        assert_eq!(wcs.len(), n);
        for (i, wc) in wcs.iter().enumerate() {
            assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        }
        assert!(net.ends[0].buf[n * SIZE..] == net.ends[1].buf[..n * SIZE]);
        let c = net.sim.node(a).e.counters();
        eprintln!(
            "burst {first:?}: {elapsed:?}, {} probes, {} early, {} ibta",
            c.tail_loss_probes, c.early_retransmits, c.ack_timeouts
        );
        if c.ack_timeouts > 0 {
            failed.push((first, c));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Issue 15 (session 6): a process not scheduled for a while whose socket
/// receive buffer overflows meanwhile loses everything arriving after it is
/// full, requests or responses, in a READ stream as the driver runs it. The
/// early timer and the READ gap recovery repair it without the IBTA timer.
#[test]
fn a_stalled_end_whose_socket_buffer_overflows_waits_for_no_ibta_timeout() {
    let faults = Faults {
        delay: Duration::from_micros(25),
        ..link(0.0)
    };
    let n = 32;
    let mut failed = Vec::new();
    for end in [0usize, 1] {
        for from_us in [50u64, 200, 500, 1000, 1500] {
            for stall_us in [100u64, 300, 1000, 5000] {
                for cap in [0usize, 16, 128, 256] {
                    let mut net =
                        Net::build(1, faults, BOTH, 2 * n * SIZE, Mtu::Mtu1024, 16, 2 << 20);
                    fill(&mut net.ends[1].buf[..n * SIZE], from_us);
                    let node = net.ends[end].node;
                    let start = net.sim.now();
                    let from = start + Duration::from_micros(from_us);
                    let tap = net.sim.node_mut(node);
                    tap.stall = Some((from, from + Duration::from_micros(stall_us)));
                    tap.backlog_cap = cap;
                    let wcs = net.read_back(n, SIZE);
                    let elapsed = net.sim.now() - start;
                    let case = (end, from_us, stall_us, cap);
                    let ok = wcs.len() == n
                        && wcs
                            .iter()
                            .enumerate()
                            .all(|(i, wc)| (wc.wr_id, wc.status) == (i as u64, WcStatus::Success));
                    let a = net.ends[0].node;
                    let c = net.sim.node(a).e.counters();
                    eprintln!(
                        "stall {case:?}: {elapsed:?} ok {ok}, {} probes, {} early, {} ibta",
                        c.tail_loss_probes, c.early_retransmits, c.ack_timeouts
                    );
                    if !ok || c.ack_timeouts > 0 {
                        failed.push((case, c));
                        continue;
                    }
                    assert!(net.ends[0].buf[n * SIZE..] == net.ends[1].buf[..n * SIZE]);
                }
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Issue 15 (session 6): a requester whose process is not scheduled for a
/// while (a loaded host) measured its own stall as a round trip: the first
/// response of the READ being timed, read when it ran again. The estimate then
/// stayed long for the rest of the stream (about 8 ms here after a 140 ms stall,
/// 12 ms lossless: RFC 6298 lets one sample in eight through), and with it the
/// probe and the RTO: at 5 % loss the stream after the stall took 56 ms instead
/// of 4 ms, and in real `ib_read_bw` runs backed-off RTOs from such an estimate
/// come after the IBTA timer. A round trip measured while the early timer was
/// overdue is no sample now.
#[test]
fn a_requester_stall_is_no_round_trip_sample() {
    let n = 48;
    for (seed, loss, from_us) in [(2u64, 0.05, 300u64), (1, 0.0, 1000)] {
        let run = |stall_us: u64| {
            let faults = Faults {
                delay: Duration::from_micros(25),
                ..link(loss)
            };
            let mut net = Net::build(seed, faults, BOTH, 2 * n * SIZE, Mtu::Mtu1024, 16, 2 << 20);
            fill(&mut net.ends[1].buf[..n * SIZE], seed);
            let a = net.ends[0].node;
            let start = net.sim.now();
            let from = start + Duration::from_micros(from_us);
            net.sim.node_mut(a).stall = Some((from, from + Duration::from_micros(stall_us)));
            let wcs = net.read_back(n, SIZE);
            let elapsed = net.sim.now() - start;
            assert_eq!(wcs.len(), n);
            for (i, wc) in wcs.iter().enumerate() {
                assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
            }
            assert!(net.ends[0].buf[n * SIZE..] == net.ends[1].buf[..n * SIZE]);
            let c = net.sim.node(a).e.counters();
            let srtt = net.sim.node(a).e.qp_srtt(net.ends[0].qp).expect("measured");
            (elapsed - Duration::from_micros(stall_us), srtt, c)
        };
        let (steady, steady_srtt, _) = run(0);
        let (after, srtt, c) = run(140_000);
        eprintln!(
            "seed {seed}, loss {loss}: without a stall {steady:?} (SRTT {steady_srtt:?}), \
             with one {after:?} besides it (SRTT {srtt:?})"
        );
        assert!(
            srtt < 4 * steady_srtt,
            "SRTT {srtt:?}, {steady_srtt:?} without the stall"
        );
        assert!(
            after < steady * 2,
            "{after:?} besides the stall, {steady:?} without\n{c:?}"
        );
        assert_eq!(c.ack_timeouts, 0, "{c:?}");
    }
}
