//! Multicast on UD (IBA 10.5.2.3, 9.2.3): a UD SEND to QPN 0xFFFFFF at a group
//! address reaches every QP attached to that group, each consuming its own
//! receive WQE and checking its own Q_Key; detached QPs and other QP types get
//! nothing. The simulator routes by unicast address only, so these tests move
//! datagrams between engines by hand, as the driver does: what a sender
//! addresses to a group is fed to each receiving engine's
//! `handle_multicast_datagram` with that group.

use softverbs_engine::*;
use softverbs_wire::Qkey;
use std::net::SocketAddr;

const QKEY: u32 = 0x0123_4567;

struct Dev {
    e: Engine,
    pd: PdHandle,
    cq: CqHandle,
    mr: MrInfo,
    buf: Box<[u8]>,
}

fn dev(addr: &str) -> Dev {
    let mut e = Engine::new(EngineConfig::new(addr.parse().unwrap()));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(256).unwrap();
    let mut buf = vec![0u8; 1 << 16].into_boxed_slice();
    // SAFETY: the boxed buffer never moves and lives in the returned Dev, next to
    // the engine that may write it; the engine is dropped first (field order).
    let mr =
        unsafe { e.reg_mr(pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    Dev { e, pd, cq, mr, buf }
}

fn qp(d: &mut Dev, qp_type: QpType, qkey: u32) -> (QpHandle, Qpn) {
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let (qp, qpn) =
        d.e.create_qp(QpInitAttr {
            pd: d.pd,
            send_cq: d.cq,
            recv_cq: d.cq,
            qp_type,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    if qp_type == QpType::Ud {
        let now = Instant::ZERO;
        let init = QpAttr {
            qp_state: QpState::Init,
            qkey,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        d.e.modify_qp(qp, &init, mask, now).unwrap();
        for state in [QpState::Rtr, QpState::Rts] {
            let attr = QpAttr {
                qp_state: state,
                ..QpAttr::default()
            };
            let mask = match state {
                QpState::Rts => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
                _ => QpAttrMask::STATE,
            };
            d.e.modify_qp(qp, &attr, mask, now).unwrap();
        }
    }
    (qp, qpn)
}

/// Posts one receive of 1 KiB at `slot` KiB into the device buffer.
fn post_recv(d: &mut Dev, qp: QpHandle, slot: u64) {
    let sge = Sge {
        addr: d.mr.addr + slot * 1024,
        length: 1024,
        lkey: d.mr.lkey,
    };
    d.e.post_recv(
        qp,
        &RecvWr {
            wr_id: slot,
            sges: &[sge],
        },
    )
    .unwrap();
}

fn completions(d: &mut Dev) -> Vec<WorkCompletion> {
    let mut out = [WorkCompletion::default(); 32];
    let n = d.e.poll_cq(d.cq, &mut out).unwrap();
    out[..n].to_vec()
}

/// The datagrams `d` has to send, with their destinations.
fn transmit(d: &mut Dev) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut out = Vec::new();
    while let Some(t) = d.e.poll_transmit(Instant::ZERO, &mut buf) {
        t.seal(&mut buf, 0); // as a driver sending it alone would
        out.push((t.dst, buf[..t.len].to_vec()));
    }
    out
}

fn mcast_send(group: SocketAddr, qkey: u32) -> SendOp {
    SendOp::UdSend {
        dest: group,
        remote_qpn: Qpn::MULTICAST,
        remote_qkey: Qkey(qkey),
        imm: Some(0xabcd),
    }
}

#[test]
fn one_send_reaches_every_attached_qp() {
    let group: SocketAddr = "239.1.2.3:4791".parse().unwrap();
    let other: SocketAddr = "239.1.2.4:4791".parse().unwrap();
    let mut tx = dev("10.0.0.1:4791");
    let (tqp, tqpn) = qp(&mut tx, QpType::Ud, QKEY);
    let mut rx = dev("10.0.0.2:4791");
    let (a, aqpn) = qp(&mut rx, QpType::Ud, QKEY);
    let (b, bqpn) = qp(&mut rx, QpType::Ud, QKEY);
    let (detached, _) = qp(&mut rx, QpType::Ud, QKEY);
    let (wrong_qkey, _) = qp(&mut rx, QpType::Ud, 0x9999);
    let (elsewhere, _) = qp(&mut rx, QpType::Ud, QKEY);
    rx.e.attach_mcast(a, group).unwrap();
    rx.e.attach_mcast(a, group).unwrap(); // twice: still one attachment
    rx.e.attach_mcast(b, group).unwrap();
    rx.e.attach_mcast(detached, group).unwrap();
    rx.e.detach_mcast(detached, group).unwrap();
    rx.e.attach_mcast(wrong_qkey, group).unwrap();
    rx.e.attach_mcast(elsewhere, other).unwrap();
    assert_eq!(rx.e.mcast_groups(), vec![group, other]);
    for (slot, q) in [
        (0, a),
        (1, b),
        (2, detached),
        (3, wrong_qkey),
        (4, elsewhere),
    ] {
        post_recv(&mut rx, q, slot);
    }

    let msg = b"to everyone";
    let wr = SendWr {
        wr_id: 7,
        op: mcast_send(group, QKEY),
        payload: Payload::Inline(msg),
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    };
    tx.e.post_send(tqp, &wr).unwrap();
    let out = transmit(&mut tx);
    assert_eq!(out.len(), 1);
    let (dst, data) = &out[0];
    assert_eq!(*dst, group, "a multicast send goes to the group address");
    let sent = completions(&mut tx);
    assert_eq!((sent[0].wr_id, sent[0].status), (7, WcStatus::Success));

    // Delivered as if read from the group's socket: ICRC computed for the group.
    rx.e.handle_multicast_datagram(Instant::ZERO, tx.e.config().local_addr, group, data);
    let mut got = completions(&mut rx);
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    for (w, qpn) in got.iter().zip([aqpn, bqpn]) {
        assert_eq!(w.qp_num, qpn);
        assert_eq!(w.src_qp, tqpn);
        assert_eq!(w.imm_data, Some(0xabcd));
        assert_eq!(w.byte_len as usize, 40 + msg.len());
        assert_eq!(w.src_addr, Some(tx.e.config().local_addr));
        let at = w.wr_id as usize * 1024;
        assert_eq!(&rx.buf[at + 40..at + 40 + msg.len()], msg);
        // The GRH area's IPv4 destination is the group.
        assert_eq!(&rx.buf[at + 36..at + 40], &[239, 1, 2, 3]);
    }
    assert_eq!(rx.e.counters().ud_messages_dropped, 1, "the wrong Q_Key");
    // No ACKs, no replies.
    assert!(transmit(&mut rx).is_empty());

    // The same datagram arriving as unicast is dropped: its ICRC was computed
    // for the group as destination, and QPN 0xFFFFFF names no QP anyway.
    rx.e.handle_datagram(Instant::ZERO, tx.e.config().local_addr, data);
    assert_eq!(rx.e.counters().drop_icrc, 1);
    assert!(completions(&mut rx).is_empty());

    // A group with no members, or a wrong destination in the ICRC, drops it.
    rx.e.handle_multicast_datagram(
        Instant::ZERO,
        tx.e.config().local_addr,
        "239.9.9.9:4791".parse().unwrap(),
        data,
    );
    assert_eq!(rx.e.counters().drop_icrc, 2);
    assert!(completions(&mut rx).is_empty());

    // A destroyed QP leaves its groups.
    rx.e.destroy_qp(a).unwrap();
    rx.e.destroy_qp(b).unwrap();
    rx.e.destroy_qp(wrong_qkey).unwrap();
    assert_eq!(rx.e.mcast_groups(), vec![other]);
}

#[test]
fn attach_rules() {
    let group: SocketAddr = "239.1.2.3:4791".parse().unwrap();
    let mut d = dev("10.0.0.1:4791");
    let (ud, _) = qp(&mut d, QpType::Ud, QKEY);
    let (rc, _) = qp(&mut d, QpType::Rc, 0);
    assert!(matches!(
        d.e.attach_mcast(rc, group),
        Err(ResourceError::InvalidArgument(_))
    ));
    assert!(matches!(
        d.e.attach_mcast(ud, "10.0.0.9:4791".parse().unwrap()),
        Err(ResourceError::InvalidArgument(_))
    ));
    assert!(matches!(
        d.e.detach_mcast(ud, group),
        Err(ResourceError::InvalidArgument(_))
    ));
    d.e.attach_mcast(ud, group).unwrap();
    d.e.detach_mcast(ud, group).unwrap();
    assert!(d.e.mcast_groups().is_empty());
}
