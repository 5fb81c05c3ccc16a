//! RC connection set-up and tear-down in the simulator: the happy path, and every
//! message lost once, lost many times, duplicated and reordered (CM.md 3.2-3.5).

mod common;

use common::*;
use softverbs_cm::*;
use softverbs_wire::cm::AttributeId;
use std::time::Duration;

const SERVER: &str = "10.0.0.2:4791";
const CLIENT: &str = "10.0.0.1:4791";
const SERVICE: &str = "10.0.0.2:7174";

/// A server that accepts every request with private data "welcome" and answers
/// every DISCONNECTED with a disconnect (as rping and ucmatose do).
fn server(net: &mut Net) -> (HostRef, CmIdHandle) {
    let s = net.host(SERVER);
    let listener = net
        .listen(&s, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7174", 0)
        .unwrap();
    let mut next_qpn = 0x200;
    s.borrow_mut().hook = Some(Box::new(move |cm, now, e| match e.kind {
        CmEventKind::ConnectRequest => {
            next_qpn += 1;
            let param = ConnParam {
                private_data: b"welcome".to_vec(),
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 7,
                qp_num: Some(Qpn::new(next_qpn)),
                ..ConnParam::default()
            };
            cm.accept(now, e.id, Some(param)).unwrap();
        }
        CmEventKind::Disconnected => cm.disconnect(now, e.id).unwrap(),
        _ => {}
    }));
    (s, listener)
}

fn client(net: &mut Net) -> HostRef {
    let c = net.host(CLIENT);
    // An application that made its own QP: it is told CONNECT_RESPONSE and
    // establishes (rping -q).
    c.borrow_mut().hook = Some(Box::new(|cm, now, e| match e.kind {
        CmEventKind::ConnectResponse => cm.establish(now, e.id).unwrap(),
        CmEventKind::Disconnected => cm.disconnect(now, e.id).unwrap(),
        _ => {}
    }));
    c
}

fn param() -> ConnParam {
    ConnParam {
        private_data: b"hello".to_vec(),
        responder_resources: 2,
        initiator_depth: 3,
        flow_control: true,
        retry_count: 5,
        rnr_retry_count: 6,
        qp_num: Some(Qpn::new(0x123)),
        ..ConnParam::default()
    }
}

fn established(h: &HostRef, n: usize) -> bool {
    h.borrow().events_of(CmEventKind::Established).len() >= n
}

/// The active side of an application-made QP sees CONNECT_RESPONSE, not ESTABLISHED.
fn responded(h: &HostRef, n: usize) -> bool {
    h.borrow().events_of(CmEventKind::ConnectResponse).len() >= n
}

#[test]
fn connect_accept_and_disconnect() {
    let mut net = Net::lossless(1);
    let (s, listener) = server(&mut net);
    let c = client(&mut net);
    let id = start_connect(&mut net, &c, SERVICE, Some(param()));
    net.run_until(|_| responded(&c, 1) && established(&s, 1))
        .unwrap();

    let s_ref = s.borrow();
    let req = s_ref.events_of(CmEventKind::ConnectRequest)[0];
    assert_eq!(req.listen_id, Some(listener));
    let EventParam::Conn(p) = &req.param else {
        panic!("conn param")
    };
    assert_eq!(p.private_data.len(), REQ_USER_DATA_LEN);
    assert_eq!(&p.private_data[..5], b"hello");
    // The request's view is swapped to the passive side's.
    assert_eq!((p.responder_resources, p.initiator_depth), (3, 2));
    assert_eq!(
        (p.retry_count, p.rnr_retry_count, p.qp_num),
        (5, 6, Qpn::new(0x123))
    );
    let child = req.id;
    assert_eq!(
        s_ref.cm.peer_addr(child).unwrap().unwrap().ip(),
        "10.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(
        s_ref.cm.local_addr(child).unwrap().unwrap(),
        SERVICE.parse().unwrap()
    );
    drop(s_ref);

    let c_ref = c.borrow();
    let est = c_ref.events_of(CmEventKind::ConnectResponse)[0];
    assert_eq!(est.id, id);
    let EventParam::Conn(p) = &est.param else {
        panic!("conn param")
    };
    assert_eq!(p.private_data.len(), REP_USER_DATA_LEN);
    assert_eq!(&p.private_data[..7], b"welcome");
    assert_eq!((p.responder_resources, p.initiator_depth), (1, 1));
    // The active side's RTR/RTS attributes point at the server's device.
    let rtr = c_ref.cm.init_qp_attr(id, QpState::Rtr).unwrap();
    assert_eq!(rtr.ah.unwrap().dest, SERVER.parse().unwrap());
    assert_eq!(rtr.max_dest_rd_atomic, 1);
    let rts = c_ref.cm.init_qp_attr(id, QpState::Rts).unwrap();
    assert_eq!((rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic), (5, 7, 1));
    assert_eq!(rts.timeout, 19);
    // Their PSNs cross: one side's sq_psn is the other's rq_psn.
    let s_rtr = s.borrow().cm.init_qp_attr(child, QpState::Rtr).unwrap();
    let s_rts = s.borrow().cm.init_qp_attr(child, QpState::Rts).unwrap();
    assert_eq!(rts.sq_psn, s_rtr.rq_psn);
    assert_eq!(s_rts.sq_psn, rtr.rq_psn);
    assert_eq!(s_rtr.dest_qpn, Qpn::new(0x123));
    assert_eq!(s_rtr.ah.unwrap().dest, CLIENT.parse().unwrap());
    drop(c_ref);

    net.call(&c, |cm, now| cm.disconnect(now, id).unwrap());
    net.run_until(|_| {
        c.borrow().count(id, CmEventKind::TimewaitExit) == 1
            && s.borrow().count(child, CmEventKind::TimewaitExit) == 1
    })
    .unwrap();
    assert_eq!(c.borrow().count(id, CmEventKind::Disconnected), 1);
    assert_eq!(s.borrow().count(child, CmEventKind::Disconnected), 1);
    assert_eq!(c.borrow().cm.connection_count(), 0);
    assert_eq!(s.borrow().cm.connection_count(), 0);
    assert_eq!(
        c.borrow().sent,
        [AttributeId::Req, AttributeId::Rtu, AttributeId::Dreq]
    );
    assert_eq!(s.borrow().sent, [AttributeId::Rep, AttributeId::Drep]);
}

/// A client and a server ready to connect; `client_filter` and `server_filter` act
/// on each side's outgoing CM messages.
struct Pair {
    net: Net,
    c: HostRef,
    s: HostRef,
}

impl Pair {
    fn new(seed: u64, client_filter: Option<Filter>, server_filter: Option<Filter>) -> Pair {
        let mut net = Net::lossless(seed);
        let (s, _) = server(&mut net);
        let c = client(&mut net);
        c.borrow_mut().filter = client_filter;
        s.borrow_mut().filter = server_filter;
        Pair { net, c, s }
    }

    fn connect(&mut self) -> CmIdHandle {
        let id = start_connect(&mut self.net, &self.c, SERVICE, Some(param()));
        let (c, s) = (self.c.clone(), self.s.clone());
        self.net
            .run_until(|_| responded(&c, 1) && established(&s, 1))
            .expect("connected");
        id
    }

    fn child(&self) -> CmIdHandle {
        last_request(&self.s)
    }

    /// Disconnects from the client and waits until both sides left timewait.
    fn disconnect(&mut self, id: CmIdHandle) {
        let child = self.child();
        self.net
            .call(&self.c, |cm, now| cm.disconnect(now, id).unwrap());
        let (c, s) = (self.c.clone(), self.s.clone());
        self.net
            .run_until(|_| {
                c.borrow().count(id, CmEventKind::TimewaitExit) == 1
                    && s.borrow().count(child, CmEventKind::TimewaitExit) == 1
            })
            .expect("disconnected");
        assert_eq!(c.borrow().count(id, CmEventKind::Disconnected), 1);
        assert_eq!(s.borrow().count(child, CmEventKind::Disconnected), 1);
        assert_eq!(c.borrow().cm.connection_count(), 0);
        assert_eq!(s.borrow().cm.connection_count(), 0);
    }

    fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.net.now().as_nanos())
    }
}

/// One connection's whole life with `lost` copies of `kind` dropped by their
/// sender; returns how many copies of `kind` the sender tried.
fn survive_loss(kind: AttributeId, lost: usize) -> usize {
    let server_sends = matches!(kind, AttributeId::Rep | AttributeId::Drep);
    let (cf, sf) = if server_sends {
        (None, Some(drop_first(kind, lost)))
    } else {
        (Some(drop_first(kind, lost)), None)
    };
    let mut p = Pair::new(7, cf, sf);
    let id = p.connect();
    p.disconnect(id);
    let sender = if server_sends { &p.s } else { &p.c };
    let tries = sender.borrow().sent_count(kind) + lost;
    assert!(tries > lost, "{kind:?}: something got through");
    assert_eq!(p.s.borrow().count(p.child(), CmEventKind::Established), 1);
    tries
}

#[test]
fn every_message_lost_once() {
    // REQ, REP and DREQ are retransmitted by their timers; a lost RTU is recovered
    // by the REP's retransmission (answered with the RTU again), a lost DREP by the
    // DREQ's (answered again from timewait or as an unknown connection).
    for kind in [
        AttributeId::Req,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
    ] {
        let tries = survive_loss(kind, 1);
        assert_eq!(tries, 2, "{kind:?}");
    }
}

#[test]
fn every_message_lost_many_times() {
    for kind in [
        AttributeId::Req,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Dreq,
        AttributeId::Drep,
    ] {
        let tries = survive_loss(kind, 6);
        assert_eq!(tries, 7, "{kind:?}");
    }
}

#[test]
fn a_lost_req_costs_one_req_timeout() {
    let mut p = Pair::new(3, Some(drop_first(AttributeId::Req, 1)), None);
    p.connect();
    // 2 x 2^(18-8) + 2^(20-8) ms (CM.md 3.2.1), plus a few link delays.
    let t = p.elapsed();
    assert!(
        t >= Duration::from_millis(6144) && t < Duration::from_millis(6200),
        "{t:?}"
    );
    assert_eq!(p.c.borrow().cm.counters().retransmits, 1);
}

#[test]
fn a_req_lost_every_time_ends_unreachable() {
    let mut p = Pair::new(4, Some(drop_first(AttributeId::Req, 1000)), None);
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let c = p.c.clone();
    p.net
        .run_until(|_| c.borrow().count(id, CmEventKind::Unreachable) == 1)
        .unwrap();
    let e = c.borrow().events_of(CmEventKind::Unreachable)[0].clone();
    assert_eq!(e.status, EventStatus::TimedOut);
    // 1 + Max CM Retries (15) tries, 6144 ms apart.
    assert_eq!(p.c.borrow().cm.counters().retransmits, 15);
    assert_eq!(p.elapsed(), Duration::from_millis(16 * 6144));
    assert_eq!(c.borrow().cm.connection_count(), 0);
    assert!(p.s.borrow().events.is_empty());
}

#[test]
fn a_dreq_lost_every_time_still_disconnects_with_a_timeout() {
    let mut p = Pair::new(5, Some(drop_first(AttributeId::Dreq, 1000)), None);
    let id = p.connect();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    let c = p.c.clone();
    p.net
        .run_until(|_| c.borrow().count(id, CmEventKind::TimewaitExit) == 1)
        .unwrap();
    let d = c.borrow().events_of(CmEventKind::Disconnected)[0].clone();
    assert_eq!(d.status, EventStatus::TimedOut);
    assert_eq!(p.c.borrow().cm.counters().retransmits, 15);
    // The server never heard: its side is still up.
    assert_eq!(p.s.borrow().count(p.child(), CmEventKind::Disconnected), 0);
}

#[test]
fn every_message_duplicated() {
    let dup_all = || -> Filter { Box::new(|_, _| Verdict::Duplicate) };
    let mut p = Pair::new(6, Some(dup_all()), Some(dup_all()));
    let id = p.connect();
    p.disconnect(id);
    let (c, s) = (p.c.borrow(), p.s.borrow());
    assert_eq!(c.count(id, CmEventKind::ConnectResponse), 1);
    assert_eq!(s.events_of(CmEventKind::ConnectRequest).len(), 1);
    assert_eq!(s.events_of(CmEventKind::Established).len(), 1);
    assert!(c.cm.counters().duplicates >= 2, "{:?}", c.cm.counters());
    assert!(s.cm.counters().duplicates >= 2, "{:?}", s.cm.counters());
    // A duplicate REP made the client send its RTU again; a duplicate REQ in the
    // server's REP_SENT state is dropped (the REP timer does the talking).
    assert!(c.sent_count(AttributeId::Rtu) >= 2);
    assert_eq!(s.sent_count(AttributeId::Mra), 0);
}

#[test]
fn a_dreq_that_overtakes_the_rtu_still_disconnects() {
    // The RTU is held back 1 ms; the client disconnects as soon as it is connected,
    // so the server sees the DREQ in REP_SENT (CM.md 3.3.7) and the RTU late.
    let mut p = Pair::new(
        8,
        Some(first(
            AttributeId::Rtu,
            1,
            Verdict::Delay(Duration::from_millis(1)),
        )),
        None,
    );
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let c = p.c.clone();
    p.net.run_until(|_| responded(&c, 1)).unwrap();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    let (c, s) = (p.c.clone(), p.s.clone());
    p.net
        .run_until(|_| {
            c.borrow().count(id, CmEventKind::TimewaitExit) == 1
                && s.borrow().events_of(CmEventKind::TimewaitExit).len() == 1
        })
        .unwrap();
    let child = p.child();
    assert_eq!(s.borrow().count(child, CmEventKind::Established), 0);
    assert_eq!(s.borrow().count(child, CmEventKind::Disconnected), 1);
    assert!(
        s.borrow().cm.counters().drop_unmatched >= 1,
        "the late RTU is dropped"
    );
}

#[test]
fn random_loss_duplication_and_reordering() {
    // Ten seeds of a hostile network: every connection still comes up once and goes
    // down once on both sides.
    for seed in 0..10 {
        let faults = softverbs_sim::Faults::chaos(0.2)
            .with_duplicate(0.2)
            .with_reorder(0.3)
            .with_corrupt(0.05);
        let mut net = Net::new(seed, faults);
        let (s, _) = server(&mut net);
        let c = client(&mut net);
        let id = start_connect(&mut net, &c, SERVICE, Some(param()));
        net.run_until(|_| responded(&c, 1) && established(&s, 1))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let child = last_request(&s);
        net.call(&c, |cm, now| cm.disconnect(now, id).unwrap());
        net.run_until(|_| {
            c.borrow().count(id, CmEventKind::TimewaitExit) == 1
                && s.borrow().count(child, CmEventKind::TimewaitExit) == 1
        })
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for (h, id) in [(&c, id), (&s, child)] {
            let h = h.borrow();
            assert_eq!(h.count(id, CmEventKind::Disconnected), 1, "seed {seed}");
            assert_eq!(h.cm.connection_count(), 0, "seed {seed}");
        }
        assert_eq!(
            s.borrow().events_of(CmEventKind::ConnectRequest).len(),
            1,
            "seed {seed}"
        );
    }
}
