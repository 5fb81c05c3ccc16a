//! ICRC and the IPv4 Identification of UDP GSO segments (see DESIGN.md): Linux gives
//! segment k of a GSO send IPv4 ID k, which the ICRC covers, so a sender seals segment
//! k for ID k. A receiver that reads the segments one by one (no UDP GRO: SOFTVERBS_GSO=0,
//! an old kernel, or GRO that split the batch differently) does not know k. It checks
//! the ID it was told first (its index in a GRO read, else 0) and otherwise solves for
//! the ID the segment was sealed with: CRC-32 is linear in its input, so one CRC pass
//! tells which ID, if any, makes the ICRC match. Before, such a receiver dropped every
//! segment but the first of each batch.

mod common;

use common::*;
use softverbs_engine::*;
use softverbs_sim::{Faults, Sim};
use std::net::SocketAddr;

/// An engine behind a UDP GSO sender and a receiver without GRO: the k-th datagram it
/// puts on the wire at one instant to one destination is sealed for IPv4 ID k (up to 64
/// segments per batch, as Linux allows); what arrives is handed over with no ID hint.
struct GsoNoGro {
    e: Engine,
    batch: Option<(Instant, SocketAddr, u16)>,
}

impl Node for GsoNoGro {
    fn local_addr(&self) -> SocketAddr {
        self.e.local_addr()
    }
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, data: &[u8]) {
        self.e.handle_datagram(now, src, data);
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.e.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.e.poll_transmit(now, buf)?;
        // Segment k of the batch open at this instant to this destination.
        let id = match self.batch {
            Some((at, dst, id)) if at == now && dst == t.dst && usize::from(id) + 1 < 64 => id + 1,
            _ => 0,
        };
        t.seal(buf, id);
        self.batch = Some((now, t.dst, id));
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.e.poll_timeout()
    }
}

/// Eight 512 KiB WRITEs (1024 packets at MTU 4096) from a GSO sender to a receiver
/// without GRO: every segment is accepted, nothing is retransmitted. (Before: most
/// segments were dropped as ICRC mismatches and the WRITEs crawled through
/// retransmissions.)
#[test]
fn gso_segments_are_accepted_by_a_receiver_without_gro() {
    const MSG: usize = 512 * 1024;
    const N: usize = 8;
    let opts = PairOpts {
        mtu: Mtu::Mtu4096,
        ..PairOpts::default()
    };
    let mut sim = Sim::new(7, Faults::none());
    let (addr_a, addr_b): (SocketAddr, SocketAddr) =
        (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
    let mut bufs = Vec::new();
    let mut ends = Vec::new();
    for (addr, len) in [(addr_a, MSG), (addr_b, N * MSG)] {
        let mut e = Engine::new(EngineConfig::new(addr));
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(64).unwrap();
        let (qp, qpn) = e
            .create_qp(QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                qp_type: QpType::Rc,
                cap: opts.cap,
                sq_sig_all: true,
            })
            .unwrap();
        let mut buf = vec![0u8; len].into_boxed_slice();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u32).wrapping_mul(0x9e37_79b1).rotate_right(13) as u8;
        }
        // SAFETY: the boxed buffer never moves and outlives the simulator (dropped
        // first, below).
        let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), opts.mr_access) }.unwrap();
        bufs.push(buf);
        let node = sim.add_node(GsoNoGro { e, batch: None });
        ends.push((node, qp, qpn, cq, mr));
    }
    let (na, qa, qpn_a, cq_a, mr_a) = ends[0];
    let (nb, qb, qpn_b, _, mr_b) = ends[1];
    connect(
        &mut sim.node_mut(na).e,
        qa,
        addr_b,
        qpn_b,
        opts.psn_b,
        opts.psn_a,
        &opts,
    );
    connect(
        &mut sim.node_mut(nb).e,
        qb,
        addr_a,
        qpn_a,
        opts.psn_a,
        opts.psn_b,
        &opts,
    );
    for i in 0..N {
        let sge = Sge {
            addr: mr_a.addr,
            length: MSG as u32,
            lkey: mr_a.lkey,
        };
        let op = SendOp::RdmaWrite {
            remote_addr: mr_b.addr + (i * MSG) as u64,
            rkey: Rkey(mr_b.rkey),
        };
        sim.node_mut(na)
            .e
            .post_send(qa, &SendWr::new(i as u64, op, &[sge]))
            .unwrap();
    }
    sim.run_until(limits(), |sim| sim.node(na).e.cq_len(cq_a).unwrap() == N)
        .expect("the WRITEs complete");
    let mut wcs = [WorkCompletion::default(); N];
    assert_eq!(sim.node_mut(na).e.poll_cq(cq_a, &mut wcs), Ok(N));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let (ca, cb) = (sim.node(na).e.counters(), sim.node(nb).e.counters());
    assert_eq!(
        (cb.drop_icrc, ca.retransmitted_packets, ca.ack_timeouts),
        (0, 0, 0),
        "ICRC drops at the receiver, retransmissions and timeouts at the sender \
         (virtual time taken: {:?})",
        sim.now()
    );
    drop(sim);
    for i in 0..N {
        assert!(bufs[1][i * MSG..(i + 1) * MSG] == bufs[0][..], "WRITE {i}");
    }
}
