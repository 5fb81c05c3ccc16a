//! Shared receive queues (IBA 10.2.9): one pool of receives for many QPs.

mod common;
use common::*;
use softverbs_engine::*;
use softverbs_sim::{Faults, NodeId, Sim};
use std::net::SocketAddr;

struct World {
    sim: Sim<Engine>,
    a: NodeId,
    b: NodeId,
    a_qps: Vec<QpHandle>,
    b_qps: Vec<QpHandle>,
    a_cq: CqHandle,
    b_cq: CqHandle,
    srq: SrqHandle,
    a_mr: MrInfo,
    b_mr: MrInfo,
    /// A's and B's registered buffers (never moved; the engines use them).
    bufs: Vec<Box<[u8]>>,
}

/// A with `n` RC QPs, each connected to its own QP on B; B's QPs share an SRQ.
fn world(n: usize, srq_wr: u32) -> World {
    let mut sim = Sim::new(1, Faults::none());
    let (addr_a, addr_b): (SocketAddr, SocketAddr) =
        (ADDR_A.parse().unwrap(), ADDR_B.parse().unwrap());
    let a = sim.add_node(Engine::new(EngineConfig::new(addr_a)));
    let b = sim.add_node(Engine::new(EngineConfig::new(addr_b)));
    let opts = PairOpts {
        rnr_retry: 7,
        ..PairOpts::default()
    };
    let mut bufs = Vec::new();
    let mut setup = |e: &mut Engine| {
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(1024).unwrap();
        let mut buf = vec![0u8; 1 << 20].into_boxed_slice();
        // SAFETY: the boxed buffer never moves and is kept in the World, which
        // outlives its use by the engine (the World drops the sim with it).
        let mr =
            unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
        bufs.push(buf);
        (pd, cq, mr)
    };
    let (a_pd, a_cq, a_mr) = setup(sim.node_mut(a));
    let (b_pd, b_cq, b_mr) = setup(sim.node_mut(b));
    let srq = sim
        .node_mut(b)
        .create_srq(
            b_pd,
            SrqInitAttr {
                max_wr: srq_wr,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let init = |pd, cq| QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Rc,
        cap: opts.cap,
        sq_sig_all: true,
    };
    let (mut a_qps, mut b_qps) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (qa, na) = sim.node_mut(a).create_qp(init(a_pd, a_cq)).unwrap();
        let (qb, nb) = sim
            .node_mut(b)
            .create_qp_with_srq(init(b_pd, b_cq), srq)
            .unwrap();
        connect(sim.node_mut(a), qa, addr_b, nb, 100, 200, &opts);
        connect(sim.node_mut(b), qb, addr_a, na, 200, 100, &opts);
        a_qps.push(qa);
        b_qps.push(qb);
    }
    World {
        sim,
        a,
        b,
        a_qps,
        b_qps,
        a_cq,
        b_cq,
        srq,
        a_mr,
        b_mr,
        bufs,
    }
}

impl World {
    fn post_srq(&mut self, wr_id: u64, offset: usize, len: u32) {
        let s = Sge {
            addr: self.b_mr.addr + offset as u64,
            length: len,
            lkey: self.b_mr.lkey,
        };
        self.sim
            .node_mut(self.b)
            .post_srq_recv(self.srq, &RecvWr { wr_id, sges: &[s] })
            .unwrap();
    }
    fn send(&mut self, qp: usize, wr_id: u64, len: u32) {
        self.send_from(qp, wr_id, 0, len);
    }
    /// A SEND of `len` bytes from `offset` of A's buffer.
    fn send_from(&mut self, qp: usize, wr_id: u64, offset: usize, len: u32) {
        let s = Sge {
            addr: self.a_mr.addr + offset as u64,
            length: len,
            lkey: self.a_mr.lkey,
        };
        let qp = self.a_qps[qp];
        self.sim
            .node_mut(self.a)
            .post_send(qp, &SendWr::new(wr_id, SendOp::Send, &[s]))
            .unwrap();
    }
    fn poll(&mut self, node: NodeId, cq: CqHandle) -> Vec<WorkCompletion> {
        let mut out = [WorkCompletion::default(); 256];
        let n = self.sim.node_mut(node).poll_cq(cq, &mut out).unwrap();
        out[..n].to_vec()
    }
    fn settle(&mut self) {
        self.sim.run_until_idle(limits()).unwrap();
    }
}

#[test]
fn two_rc_qps_share_one_srq() {
    let mut w = world(2, 32);
    for i in 0..10 {
        w.post_srq(i, i as usize * 4096, 4096);
    }
    for i in 0..5 {
        w.send(0, i, 1000 + i as u32);
        w.send(1, 10 + i, 2000 + i as u32);
    }
    w.settle();
    let (a, b, a_cq, b_cq) = (w.a, w.b, w.a_cq, w.b_cq);
    assert_eq!(
        w.poll(a, a_cq)
            .iter()
            .filter(|c| c.status == WcStatus::Success)
            .count(),
        10
    );
    let recvs = w.poll(b, b_cq);
    assert_eq!(recvs.len(), 10);
    // Every SRQ WQE used once; each QP's messages in order on its own QP number.
    let mut ids: Vec<u64> = recvs.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
    for (k, qp) in w.b_qps.clone().iter().enumerate() {
        let qpn = w.sim.node(b).qp_num(*qp).unwrap();
        let lens: Vec<u32> = recvs
            .iter()
            .filter(|c| c.qp_num == qpn)
            .map(|c| c.byte_len)
            .collect();
        let base = 1000 * (k as u32 + 1);
        assert_eq!(lens, (0..5).map(|i| base + i).collect::<Vec<_>>());
    }
}

/// Two RC QPs receive multi-packet SENDs through one SRQ at the same time, their
/// packets interleaved on the wire: each message must land in the one receive WQE
/// it took, byte for byte. (The responder used to write a SEND's first packets into
/// the SRQ's head WQE without taking it, so the other QP's message wrote into the
/// same buffer: 952 foreign bytes in one 3000-byte message.) IBA 10.2.9.5: a QP
/// takes the SRQ WQE when a message starts.
#[test]
fn multi_packet_sends_on_one_srq_keep_their_own_buffers() {
    const LEN: u32 = 3000; // three packets at MTU 1024
    const SRC: [usize; 2] = [0, 64 * 1024];
    let mut w = world(2, 32);
    // Distinct, aperiodic source data per QP.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in w.bufs[0].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    for i in 0..4 {
        w.post_srq(i, i as usize * 4096, 4096);
    }
    for round in 0..2 {
        w.send_from(0, round, SRC[0], LEN);
        w.send_from(1, 10 + round, SRC[1], LEN);
    }
    w.settle();
    let (a, b, a_cq, b_cq) = (w.a, w.b, w.a_cq, w.b_cq);
    let sent = w.poll(a, a_cq);
    assert_eq!(sent.len(), 4);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "{sent:?}"
    );
    let recvs = w.poll(b, b_cq);
    assert_eq!(recvs.len(), 4, "{recvs:?}");
    let qpns: Vec<Qpn> = w
        .b_qps
        .iter()
        .map(|&q| w.sim.node(b).qp_num(q).unwrap())
        .collect();
    let mut foreign = 0;
    for c in &recvs {
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, LEN), "{c:?}");
        let k = qpns
            .iter()
            .position(|&q| q == c.qp_num)
            .expect("one of B's QPs");
        let at = c.wr_id as usize * 4096;
        let got = &w.bufs[1][at..at + LEN as usize];
        let want = &w.bufs[0][SRC[k]..SRC[k] + LEN as usize];
        foreign += got.iter().zip(want).filter(|(g, w)| g != w).count();
    }
    assert_eq!(foreign, 0, "bytes of another message in a receive buffer");
}

#[test]
fn an_empty_srq_means_rnr_until_a_receive_is_posted() {
    let mut w = world(1, 8);
    w.send(0, 1, 100);
    w.sim
        .run_for(std::time::Duration::from_millis(50), limits())
        .unwrap();
    let (a, b, a_cq, b_cq) = (w.a, w.b, w.a_cq, w.b_cq);
    assert!(w.poll(a, a_cq).is_empty());
    assert!(w.sim.node(b).counters().rnr_nak_sent > 1);
    w.post_srq(7, 0, 4096);
    w.settle();
    assert_eq!(w.poll(a, a_cq)[0].status, WcStatus::Success);
    assert_eq!(w.poll(b, b_cq)[0].wr_id, 7);
}

#[test]
fn the_limit_event_fires_once_when_armed() {
    let mut w = world(1, 16);
    for i in 0..10 {
        w.post_srq(i, i as usize * 1024, 1024);
    }
    let (b, srq) = (w.b, w.srq);
    w.sim.node_mut(b).modify_srq_limit(srq, 8).unwrap();
    assert_eq!(
        w.sim.node(b).query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 16,
            max_sge: 2,
            srq_limit: 8
        }
    );
    // 10 -> 8 WQEs: not yet below the limit.
    w.send(0, 1, 10);
    w.send(0, 2, 10);
    w.settle();
    assert_eq!(w.sim.node_mut(b).poll_event(), None);
    // 8 -> 7: below it, once.
    w.send(0, 3, 10);
    w.settle();
    assert_eq!(
        w.sim.node_mut(b).poll_event(),
        Some(AsyncEvent::SrqLimitReached(srq))
    );
    w.send(0, 4, 10);
    w.settle();
    assert_eq!(
        w.sim.node_mut(b).poll_event(),
        None,
        "disarmed after firing"
    );
    assert_eq!(w.sim.node(b).query_srq(srq).unwrap().srq_limit, 0);
}

#[test]
fn srq_rules_and_errors() {
    let mut w = world(2, 4);
    let (b, srq) = (w.b, w.srq);
    // Receives go to the SRQ, not to the QP.
    let s = Sge {
        addr: w.b_mr.addr,
        length: 64,
        lkey: w.b_mr.lkey,
    };
    let qp = w.b_qps[0];
    assert_eq!(
        w.sim.node_mut(b).post_recv(
            qp,
            &RecvWr {
                wr_id: 1,
                sges: &[s]
            }
        ),
        Err(PostError::UsesSrq)
    );
    let three = [s, s, s];
    assert_eq!(
        w.sim.node_mut(b).post_srq_recv(
            srq,
            &RecvWr {
                wr_id: 9,
                sges: &three
            }
        ),
        Err(PostError::TooManySge)
    );
    // Overrun: max_wr 4.
    for i in 0..4 {
        w.post_srq(i, 0, 64);
    }
    assert_eq!(
        w.sim.node_mut(b).post_srq_recv(
            srq,
            &RecvWr {
                wr_id: 9,
                sges: &[s]
            }
        ),
        Err(PostError::QueueFull)
    );
    assert_eq!(
        w.sim.node_mut(b).modify_srq_limit(srq, 5),
        Err(ResourceError::InvalidArgument("srq_limit beyond max_wr"))
    );
    assert_eq!(w.sim.node_mut(b).destroy_srq(srq), Err(ResourceError::Busy));
    // A QP on the SRQ that goes to ERR reports its last WQE; the SRQ's receives
    // stay for the other QP.
    w.sim
        .node_mut(b)
        .modify_qp(
            qp,
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
            Instant::ZERO,
        )
        .unwrap();
    assert_eq!(
        w.sim.node_mut(b).poll_event(),
        Some(AsyncEvent::LastWqeReached(qp))
    );
    w.send(1, 1, 32);
    w.settle();
    let (b_cq, a, a_cq) = (w.b_cq, w.a, w.a_cq);
    assert!(w
        .poll(b, b_cq)
        .iter()
        .any(|c| c.wr_id == 0 && c.status == WcStatus::Success));
    assert!(w
        .poll(a, a_cq)
        .iter()
        .any(|c| c.wr_id == 1 && c.status == WcStatus::Success));
    // Once no QP uses it, it can go.
    let qps = w.b_qps.clone();
    for qp in qps {
        w.sim.node_mut(b).destroy_qp(qp).unwrap();
    }
    w.sim.node_mut(b).destroy_srq(srq).unwrap();
    // Creation checks.
    let e = w.sim.node_mut(b);
    let pd = e.alloc_pd().unwrap();
    assert!(e
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 0,
                max_sge: 1,
                srq_limit: 0
            }
        )
        .is_err());
    assert!(e
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 5
            }
        )
        .is_err());
    let srq2 = e
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let other_pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4).unwrap();
    let init = QpInitAttr {
        pd: other_pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Rc,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    assert!(matches!(
        e.create_qp_with_srq(init, srq2),
        Err(ResourceError::InvalidArgument(_))
    ));
    let uc = QpInitAttr {
        pd,
        qp_type: QpType::Uc,
        ..init
    };
    assert!(matches!(
        e.create_qp_with_srq(uc, srq2),
        Err(ResourceError::InvalidArgument(_))
    ));
}
