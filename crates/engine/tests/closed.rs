//! A destroyed RC QP re-acknowledges duplicates of what it received (src/closed.rs): when
//! the ACK of the last message is lost and the responder's QP is gone, the requester's
//! retransmission still gets its ACK and the WR completes successfully; a new request to
//! the destroyed QP gets no answer and ends in a retry error.

mod common;

use common::*;
use softverbs_engine::*;
use softverbs_sim::Faults;

/// Faults that drop everything on one link.
fn black_hole() -> Faults {
    Faults {
        loss: 1.0,
        ..Faults::none()
    }
}

fn send(p: &mut Pair, wr_id: u64, offset: usize) {
    let sge = p.sge(End::A, offset, 64);
    p.post_send(End::A, &SendWr::new(wr_id, SendOp::Send, &[sge]))
        .expect("post send");
}

#[test]
fn lost_last_ack_is_answered_after_the_responder_qp_is_destroyed() {
    let opts = PairOpts {
        retry_cnt: 3,
        timeout: 12,
        ..PairOpts::default()
    };
    let mut p = Pair::new(3, Faults::none(), opts);
    let (a, b) = (p.a.node, p.b.node);
    let rsge = p.sge(End::B, 0, 64);
    p.post_recv(End::B, 1, &[rsge]).expect("post recv");
    // B's ACK never reaches A.
    p.sim.set_link_faults(b, a, black_hole());
    p.fill(End::A, 4096, 64, 9);
    send(&mut p, 7, 4096);
    let recv_cq_b = p.b.recv_cq;
    p.sim
        .run_until(limits(), |sim| {
            sim.node(b).counters().tx_packets >= 1 && sim.node(b).cq_len(recv_cq_b) == Ok(1)
        })
        .expect("B receives the SEND");
    assert!(p.poll_send(End::A).is_empty(), "A has no ACK yet");
    // B's program is done: its QP goes; the link heals.
    let qp_b = p.b.qp;
    p.engine(End::B).destroy_qp(qp_b).expect("destroy B's QP");
    p.sim.clear_link_faults(b, a);
    p.run_until_send_cqes(End::A, 1)
        .expect("A's retransmission is acknowledged");
    let wc = p.poll_send(End::A);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    assert!(p.engine(End::B).counters().closed_qp_acks >= 1);
    assert_eq!(p.engine(End::B).counters().duplicate_requests, 0);
    assert_eq!(p.qp_state(End::A), QpState::Rts);

    // A new request finds no QP: no answer, A retries and fails.
    send(&mut p, 8, 4096);
    p.run_until_send_cqes(End::A, 1)
        .expect("A gives up on the new request");
    let wc = p.poll_send(End::A);
    assert_eq!((wc[0].wr_id, wc[0].status), (8, WcStatus::RetryExcErr));
    assert!(p.engine(End::B).counters().drop_unknown_qp >= 1);
}

#[test]
fn only_the_peer_and_connected_rc_qps_are_remembered() {
    let mut p = Pair::lossless();
    // Nothing is remembered before a connected RC QP is destroyed; a QP that never left
    // RESET leaves nothing behind.
    assert_eq!(p.engine(End::B).closed_qp_timeout(), None);
    let qp_b = p.b.qp;
    p.engine(End::B).destroy_qp(qp_b).expect("destroy");
    assert_eq!(
        p.engine(End::B).closed_qp_timeout(),
        Some(PairOpts::default().timeout)
    );
    let pd = p.b.pd;
    let cq = p.b.send_cq;
    let e = p.engine(End::B);
    let (fresh, _) = e
        .create_qp(QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type: QpType::Rc,
            cap: PairOpts::default().cap,
            sq_sig_all: false,
        })
        .expect("create");
    e.destroy_qp(fresh).expect("destroy");
    assert_eq!(
        p.engine(End::B).closed_qp_timeout(),
        Some(PairOpts::default().timeout),
        "a RESET QP adds nothing"
    );
}
