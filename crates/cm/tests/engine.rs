//! The cm beside the engine, as the driver will host them on one device: CM MADs to
//! QP1 go to the cm, everything else to the engine, and the cm's QP transitions are
//! applied to the engine's QPs. Covers the scenarios where the QP matters: data that
//! flows while the RTU is lost, COMM_EST, and disconnect flushing the QP.

mod common;

use common::*;
use softverbs_cm::*;
use softverbs_engine as engine;
use softverbs_wire::cm::AttributeId;
use softverbs_wire::Rkey;
use std::time::Duration;

const SERVER: &str = "10.0.0.2:4791";
const CLIENT: &str = "10.0.0.1:4791";

struct Setup {
    net: Net,
    c: HostRef,
    s: HostRef,
    id: CmIdHandle,
    c_qpn: Qpn,
}

/// A client whose cm-made QP connects to a server; the server's RTU may be dropped.
fn setup(seed: u64, client_filter: Option<Filter>) -> Setup {
    let mut net = Net::lossless(seed);
    let s = net.host_with_engine(SERVER);
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7174", 0)
        .unwrap();
    let c = net.host_with_engine(CLIENT);
    c.borrow_mut().filter = client_filter;
    let id = net.call(&c, |cm, now| {
        let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
        cm.resolve_addr(
            now,
            id,
            None,
            "10.0.0.2:7174".parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        id
    });
    net.call(&c, |cm, _| cm.resolve_route(id).unwrap());
    let c_qpn = c.borrow_mut().verbs.as_mut().unwrap().create_rc_qp();
    let qp = QpBinding {
        qpn: c_qpn,
        srq: false,
        managed: true,
    };
    net.call(&c, |cm, now| cm.set_qp(now, id, qp).unwrap());
    assert_eq!(
        c.borrow().verbs.as_ref().unwrap().qp_state(c_qpn),
        engine::QpState::Init,
        "rdma_create_qp leaves the QP in INIT"
    );
    net.call(&c, |cm, now| cm.connect(now, id, None).unwrap());
    Setup {
        net,
        c,
        s,
        id,
        c_qpn,
    }
}

/// Runs until the server has the request, gives it a cm-made QP and accepts.
fn accept(st: &mut Setup) -> (CmIdHandle, Qpn) {
    let s = st.s.clone();
    st.net
        .run_until(|_| !s.borrow().events_of(CmEventKind::ConnectRequest).is_empty())
        .unwrap();
    let child = last_request(&st.s);
    let s_qpn = st.s.borrow_mut().verbs.as_mut().unwrap().create_rc_qp();
    let qp = QpBinding {
        qpn: s_qpn,
        srq: false,
        managed: true,
    };
    st.net.call(&st.s, |cm, now| {
        cm.set_qp(now, child, qp).unwrap();
        cm.accept(now, child, None).unwrap();
    });
    // The REP went only after the QP reached RTS.
    assert_eq!(
        st.s.borrow().verbs.as_ref().unwrap().qp_state(s_qpn),
        engine::QpState::Rts
    );
    (child, s_qpn)
}

#[test]
fn data_flows_while_the_rtu_is_lost_and_the_rep_retry_recovers_it() {
    let mut st = setup(1, Some(drop_first(AttributeId::Rtu, 1)));
    let (child, _) = accept(&mut st);
    let (c, s) = (st.c.clone(), st.s.clone());
    let id = st.id;
    st.net
        .run_until(|_| c.borrow().count(id, CmEventKind::Established) == 1)
        .unwrap();
    assert_eq!(
        c.borrow().verbs.as_ref().unwrap().qp_state(st.c_qpn),
        engine::QpState::Rts
    );
    // The client writes into the server's memory at once; the server's QP is RTS
    // since before the REP, so the write lands though the server still waits for the
    // RTU.
    let (s_addr, s_rkey) = {
        let v = s.borrow();
        let mr = v.verbs.as_ref().unwrap().mr;
        (mr.addr, mr.rkey)
    };
    {
        let mut h = c.borrow_mut();
        let v = h.verbs.as_mut().unwrap();
        v.buf[..16].copy_from_slice(b"sixteen bytes!!!");
        let sge = [engine::Sge {
            addr: v.mr.addr,
            length: 16,
            lkey: v.mr.lkey,
        }];
        let op = engine::SendOp::RdmaWrite {
            remote_addr: s_addr,
            rkey: Rkey(s_rkey),
        };
        let qp = v.qps[&st.c_qpn];
        v.engine
            .post_send(qp, &engine::SendWr::new(7, op, &sge))
            .unwrap();
    }
    let done = |c: &HostRef| {
        c.borrow()
            .verbs
            .as_ref()
            .unwrap()
            .engine
            .cq_len(c.borrow().verbs.as_ref().unwrap().cq)
            .unwrap()
            > 0
    };
    st.net.run_until(|_| done(&c)).unwrap();
    let wc = c.borrow_mut().verbs.as_mut().unwrap().poll();
    assert_eq!(wc[0].status, engine::WcStatus::Success);
    assert_eq!(
        &s.borrow().verbs.as_ref().unwrap().buf[..16],
        b"sixteen bytes!!!"
    );
    assert_eq!(
        s.borrow().count(child, CmEventKind::Established),
        0,
        "no RTU yet"
    );
    // The REP retry (4096 ms) draws the RTU again.
    st.net
        .run_until(|_| s.borrow().count(child, CmEventKind::Established) == 1)
        .unwrap();
    assert_eq!(s.borrow().sent_count(AttributeId::Rep), 2);
    assert_eq!(
        c.borrow().sent_count(AttributeId::Rtu),
        1,
        "one RTU got through"
    );
}

#[test]
fn the_first_packet_establishes_the_passive_side_at_once() {
    // The driver turns the QP's first receive while the RTU is missing into
    // notify_established (IBV_EVENT_COMM_EST): the server is established at once,
    // and its REP timer stops.
    let mut st = setup(2, Some(drop_first(AttributeId::Rtu, 1)));
    let (child, s_qpn) = accept(&mut st);
    {
        let mut h = st.s.borrow_mut();
        let v = h.verbs.as_mut().unwrap();
        let sge = [engine::Sge {
            addr: v.mr.addr,
            length: 64,
            lkey: v.mr.lkey,
        }];
        let qp = v.qps[&s_qpn];
        v.engine
            .post_recv(
                qp,
                &engine::RecvWr {
                    wr_id: 1,
                    sges: &sge,
                },
            )
            .unwrap();
    }
    let (c, s) = (st.c.clone(), st.s.clone());
    let id = st.id;
    st.net
        .run_until(|_| c.borrow().count(id, CmEventKind::Established) == 1)
        .unwrap();
    {
        let mut h = c.borrow_mut();
        let v = h.verbs.as_mut().unwrap();
        let qp = v.qps[&st.c_qpn];
        let wr = engine::SendWr {
            wr_id: 2,
            op: engine::SendOp::Send,
            payload: engine::Payload::Inline(b"hi"),
            flags: engine::SendFlags::SIGNALED,
        };
        v.engine.post_send(qp, &wr).unwrap();
    }
    let received = |s: &HostRef| {
        let h = s.borrow();
        let v = h.verbs.as_ref().unwrap();
        v.engine.cq_len(v.cq).unwrap() > 0
    };
    st.net.run_until(|_| received(&s)).unwrap();
    let wc = s.borrow_mut().verbs.as_mut().unwrap().poll();
    assert_eq!(wc[0].opcode, engine::WcOpcode::Recv);
    st.net
        .call(&st.s, |cm, now| cm.notify_established(now, child).unwrap());
    assert_eq!(s.borrow().count(child, CmEventKind::Established), 1);
    assert!(st.net.now().as_nanos() < 1_000_000_000);
    st.net.run_for(Duration::from_secs(10));
    assert_eq!(
        s.borrow().sent_count(AttributeId::Rep),
        1,
        "the REP timer stopped"
    );
    assert_eq!(s.borrow().count(child, CmEventKind::Established), 1);
}

#[test]
fn disconnect_moves_both_qps_to_error_and_flushes() {
    let mut st = setup(3, None);
    let (child, s_qpn) = accept(&mut st);
    st.s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::Disconnected {
            cm.disconnect(now, e.id).unwrap();
        }
    }));
    {
        let mut h = st.s.borrow_mut();
        let v = h.verbs.as_mut().unwrap();
        let sge = [engine::Sge {
            addr: v.mr.addr,
            length: 64,
            lkey: v.mr.lkey,
        }];
        let qp = v.qps[&s_qpn];
        v.engine
            .post_recv(
                qp,
                &engine::RecvWr {
                    wr_id: 9,
                    sges: &sge,
                },
            )
            .unwrap();
    }
    let (c, s) = (st.c.clone(), st.s.clone());
    let id = st.id;
    st.net
        .run_until(|_| {
            c.borrow().count(id, CmEventKind::Established) == 1
                && s.borrow().count(child, CmEventKind::Established) == 1
        })
        .unwrap();
    st.net
        .call(&st.c, |cm, now| cm.disconnect(now, id).unwrap());
    assert_eq!(
        c.borrow().verbs.as_ref().unwrap().qp_state(st.c_qpn),
        engine::QpState::Err
    );
    st.net
        .run_until(|_| s.borrow().count(child, CmEventKind::TimewaitExit) == 1)
        .unwrap();
    assert_eq!(
        s.borrow().verbs.as_ref().unwrap().qp_state(s_qpn),
        engine::QpState::Err
    );
    let wc = s.borrow_mut().verbs.as_mut().unwrap().poll();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (9, engine::WcStatus::WrFlushErr)
    );
}
