//! UD queue pairs (IBA 9.8.4): datagrams to any QP named by address and QPN,
//! Q_Key checked, a 40-byte GRH area at the start of every receive buffer, and
//! loss is silent.

use softverbs_engine::*;
use softverbs_sim::{Faults, Limits, NodeId, Sim};
use softverbs_wire::Qkey;
use std::net::SocketAddr;
use std::time::Duration;

const QKEY: u32 = 0x1111_1111;

struct Node {
    id: NodeId,
    addr: SocketAddr,
    qp: QpHandle,
    qpn: Qpn,
    scq: CqHandle,
    rcq: CqHandle,
    mr: MrInfo,
    _buf: Box<[u8]>,
}

fn node(sim: &mut Sim<Engine>, addr: &str, qkey: u32) -> Node {
    let addr: SocketAddr = addr.parse().unwrap();
    let id = sim.add_node(Engine::new(EngineConfig::new(addr)));
    let e = sim.node_mut(id);
    let pd = e.alloc_pd().unwrap();
    let (scq, rcq) = (e.create_cq(256).unwrap(), e.create_cq(256).unwrap());
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let (qp, qpn) = e
        .create_qp(QpInitAttr {
            pd,
            send_cq: scq,
            recv_cq: rcq,
            qp_type: QpType::Ud,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let now = Instant::ZERO;
    let init = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..QpAttr::default()
    };
    e.modify_qp(
        qp,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        now,
    )
    .unwrap();
    e.modify_qp(
        qp,
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
        now,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 5,
        ..QpAttr::default()
    };
    e.modify_qp(qp, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN, now)
        .unwrap();
    let mut buf = vec![0u8; 1 << 18].into_boxed_slice();
    let access = AccessFlags::LOCAL_WRITE;
    // SAFETY: the boxed buffer never moves and lives in the returned Node, which
    // the test keeps as long as the simulator that owns the engine.
    let mr = unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access) }.unwrap();
    Node {
        id,
        addr,
        qp,
        qpn,
        scq,
        rcq,
        mr,
        _buf: buf,
    }
}

fn sge(n: &Node, offset: usize, len: u32) -> Sge {
    Sge {
        addr: n.mr.addr + offset as u64,
        length: len,
        lkey: n.mr.lkey,
    }
}

fn bytes(n: &Node, offset: usize, len: usize) -> Vec<u8> {
    n._buf[offset..offset + len].to_vec()
}

fn poll(sim: &mut Sim<Engine>, id: NodeId, cq: CqHandle) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 128];
    let n = sim.node_mut(id).poll_cq(cq, &mut out).unwrap();
    out[..n].to_vec()
}

fn ud(dest: &Node, qkey: u32, imm: Option<u32>) -> SendOp {
    SendOp::UdSend {
        dest: dest.addr,
        remote_qpn: dest.qpn,
        remote_qkey: Qkey(qkey),
        imm,
    }
}

fn limits() -> Limits {
    Limits {
        max_steps: 1_000_000,
        max_time: Duration::from_secs(60),
    }
}

#[test]
fn datagrams_with_grh_source_and_immediate() {
    let mut sim = Sim::new(1, Faults::none());
    let a = node(&mut sim, "10.0.0.1:4791", QKEY);
    let b = node(&mut sim, "10.0.0.2:4791", QKEY);
    for i in 0..2 {
        let s = sge(&b, i * 8192, 8192);
        sim.node_mut(b.id)
            .post_recv(
                b.qp,
                &RecvWr {
                    wr_id: i as u64,
                    sges: &[s],
                },
            )
            .unwrap();
    }
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    sim.node_mut(a.id);
    let a_buf = a.mr.addr as *mut u8;
    // SAFETY: writes inside A's registered buffer, which the test owns.
    unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), a_buf, msg.len()) };
    let s = sge(&a, 0, 3000);
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(1, ud(&b, QKEY, None), &[s]))
        .unwrap();
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(2, ud(&b, QKEY, Some(0x77)), &[s]))
        .unwrap();
    sim.run_until_idle(limits()).unwrap();
    let sent = poll(&mut sim, a.id, a.scq);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let got = poll(&mut sim, b.id, b.rcq);
    assert_eq!(got.len(), 2);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(wc.byte_len, 40 + 3000, "GRH area counts in byte_len");
        assert!(wc.grh);
        assert_eq!(wc.src_qp, a.qpn);
        assert_eq!(wc.src_addr, Some(a.addr));
        assert_eq!(&bytes(&b, i * 8192 + 40, 3000), &msg);
        // The GRH area holds the IPv4 header: version/IHL, UDP, source, destination.
        let grh = bytes(&b, i * 8192, 40);
        assert_eq!(&grh[..20], &[0u8; 20]);
        assert_eq!(grh[20], 0x45);
        assert_eq!(grh[29], 17);
        assert_eq!(&grh[32..36], &[10, 0, 0, 1]);
        assert_eq!(&grh[36..40], &[10, 0, 0, 2]);
    }
    assert_eq!(got[0].imm_data, None);
    assert_eq!(got[1].imm_data, Some(0x77));
    // No acknowledgements on UD.
    assert_eq!(sim.node(b.id).counters().tx_packets, 0);
}

#[test]
fn qkey_rules_and_silent_drops() {
    let mut sim = Sim::new(2, Faults::none());
    let a = node(&mut sim, "10.0.0.1:4791", 0x2222);
    let b = node(&mut sim, "10.0.0.2:4791", QKEY);
    let s = sge(&a, 0, 100);
    // A wrong Q_Key: dropped at B, silently; the sender still succeeds.
    let r = sge(&b, 0, 4096);
    sim.node_mut(b.id)
        .post_recv(
            b.qp,
            &RecvWr {
                wr_id: 1,
                sges: &[r],
            },
        )
        .unwrap();
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(1, ud(&b, 0x3333, None), &[s]))
        .unwrap();
    // A controlled Q_Key in the WR means the sender's own QP Q_Key (0x2222): also wrong for B.
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(2, ud(&b, 0x8000_0000, None), &[s]))
        .unwrap();
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(poll(&mut sim, a.id, a.scq).len(), 2);
    assert!(poll(&mut sim, b.id, b.rcq).is_empty());
    assert_eq!(sim.node(b.id).counters().ud_messages_dropped, 2);
    // The right Q_Key gets through to the posted receive.
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(3, ud(&b, QKEY, None), &[s]))
        .unwrap();
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(poll(&mut sim, b.id, b.rcq).len(), 1);
    // No receive posted: dropped, no RNR.
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(4, ud(&b, QKEY, None), &[s]))
        .unwrap();
    // A message larger than the MTU is a local length error.
    let big = sge(&a, 0, 5000);
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(5, ud(&b, QKEY, None), &[big]))
        .unwrap();
    // To an address where nobody listens: lost, like any UD datagram.
    let ghost = SendOp::UdSend {
        dest: "10.0.0.9:4791".parse().unwrap(),
        remote_qpn: b.qpn,
        remote_qkey: Qkey(QKEY),
        imm: None,
    };
    sim.run_until_idle(limits()).unwrap();
    let wcs = poll(&mut sim, a.id, a.scq);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (3, WcStatus::Success),
            (4, WcStatus::Success),
            (5, WcStatus::LocLenErr)
        ]
    );
    assert_eq!(sim.node(b.id).counters().ud_messages_dropped, 3);
    // A local error moves a UD QP to SQE; SQE -> RTS recovers it.
    let qp = a.qp;
    assert_eq!(
        sim.node(a.id).query_qp(qp).unwrap().0.qp_state,
        QpState::Sqe
    );
    sim.node_mut(a.id)
        .modify_qp(
            qp,
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
            Instant::ZERO,
        )
        .unwrap();
    sim.node_mut(a.id)
        .post_send(a.qp, &SendWr::new(6, ghost, &[s]))
        .unwrap();
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(poll(&mut sim, a.id, a.scq)[0].status, WcStatus::Success);
    assert!(sim.stats().undeliverable >= 1);
    // Connected-QP operations are refused on UD.
    let rd = SendOp::RdmaRead {
        remote_addr: 0,
        rkey: Rkey(1),
    };
    assert_eq!(
        sim.node_mut(a.id)
            .post_send(a.qp, &SendWr::new(7, rd, &[s])),
        Err(PostError::InvalidOpcode)
    );
    assert_eq!(
        sim.node_mut(a.id)
            .post_send(a.qp, &SendWr::new(8, SendOp::Send, &[s])),
        Err(PostError::InvalidOpcode)
    );
}

#[test]
fn one_sender_many_receivers_under_loss() {
    let mut sim = Sim::new(3, Faults::lossy(0.2));
    let a = node(&mut sim, "10.0.0.1:4791", QKEY);
    let peers: Vec<Node> = (2..5)
        .map(|i| node(&mut sim, &format!("10.0.0.{i}:4791"), QKEY))
        .collect();
    for p in &peers {
        for i in 0..40u64 {
            let r = sge(p, i as usize * 1024, 1024);
            sim.node_mut(p.id)
                .post_recv(
                    p.qp,
                    &RecvWr {
                        wr_id: i,
                        sges: &[r],
                    },
                )
                .unwrap();
        }
    }
    let s = sge(&a, 0, 500);
    for i in 0..40u64 {
        for p in &peers {
            sim.node_mut(a.id)
                .post_send(a.qp, &SendWr::new(i, ud(p, QKEY, Some(i as u32)), &[s]))
                .unwrap();
        }
    }
    sim.run_until_idle(limits()).unwrap();
    assert_eq!(
        poll(&mut sim, a.id, a.scq).len(),
        120,
        "every send completes"
    );
    let mut total = 0;
    for p in &peers {
        let got = poll(&mut sim, p.id, p.rcq);
        // Some were lost, the rest arrived whole and in order.
        assert!(got.len() < 40 && !got.is_empty());
        let imms: Vec<u32> = got.iter().map(|w| w.imm_data.unwrap()).collect();
        assert!(imms.windows(2).all(|w| w[0] < w[1]), "{imms:?}");
        assert!(got.iter().all(|w| w.byte_len == 540 && w.src_qp == a.qpn));
        total += got.len();
    }
    assert!(total > 60, "about 80 % of 120 arrive: {total}");
}

#[test]
fn ud_qps_share_a_receive_queue() {
    let mut sim = Sim::new(4, Faults::none());
    let a = node(&mut sim, "10.0.0.1:4791", QKEY);
    // B: two UD QPs taking receives from one SRQ.
    let addr_b: SocketAddr = "10.0.0.2:4791".parse().unwrap();
    let b = sim.add_node(Engine::new(EngineConfig::new(addr_b)));
    let e = sim.node_mut(b);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(64).unwrap();
    let srq = e
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: QpType::Ud,
        cap,
        sq_sig_all: true,
    };
    let mut qpns = Vec::new();
    for _ in 0..2 {
        let (qp, qpn) = e.create_qp_with_srq(init, srq).unwrap();
        let now = Instant::ZERO;
        let attr = QpAttr {
            qp_state: QpState::Init,
            qkey: QKEY,
            ..QpAttr::default()
        };
        e.modify_qp(
            qp,
            &attr,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            now,
        )
        .unwrap();
        e.modify_qp(
            qp,
            &QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
            now,
        )
        .unwrap();
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        e.modify_qp(qp, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN, now)
            .unwrap();
        qpns.push(qpn);
    }
    let mut buf = vec![0u8; 8 * 1024].into_boxed_slice();
    // SAFETY: the boxed buffer never moves and outlives the simulator's use of it
    // (both are dropped at the end of this test, the engine first).
    let mr =
        unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    for i in 0..4u64 {
        let s = Sge {
            addr: mr.addr + i * 1024,
            length: 1024,
            lkey: mr.lkey,
        };
        e.post_srq_recv(
            srq,
            &RecvWr {
                wr_id: i,
                sges: &[s],
            },
        )
        .unwrap();
    }
    let s = sge(&a, 0, 100);
    for (i, qpn) in qpns.iter().enumerate() {
        let op = SendOp::UdSend {
            dest: addr_b,
            remote_qpn: *qpn,
            remote_qkey: Qkey(QKEY),
            imm: Some(i as u32),
        };
        sim.node_mut(a.id)
            .post_send(a.qp, &SendWr::new(i as u64, op, &[s]))
            .unwrap();
    }
    sim.run_until_idle(limits()).unwrap();
    let got = poll(&mut sim, b, cq);
    assert_eq!(got.len(), 2);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.qp_num)).collect::<Vec<_>>(),
        vec![(0, qpns[0]), (1, qpns[1])]
    );
    assert!(got.iter().all(|w| w.byte_len == 140 && w.grh));
    drop(sim);
    drop(buf);
}
