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

/// The server answered the DREQ and went away (its process exited) before its DREP
/// got out: the DREQ sent again draws ICMP port unreachable from the server's device
/// socket, and the disconnect completes then, not after every DREQ retry (16 x 6 s,
/// past rping's 20 s wait: the client's "disconnect: got Disconnected (status
/// TimedOut)" in the cli's rping_with_two_percent_loss).
#[test]
fn a_dreq_to_a_peer_that_went_away_disconnects_at_once() {
    let mut p = Pair::new(6, None, Some(drop_first(AttributeId::Drep, 1000)));
    let id = p.connect();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    let (s, child) = (p.s.clone(), p.child());
    p.net
        .run_until(|_| s.borrow().count(child, CmEventKind::Disconnected) == 1)
        .unwrap();
    let asked = p.elapsed();
    assert_eq!(p.c.borrow().count(id, CmEventKind::Disconnected), 0);
    // The server's device socket is closed now: the kernel reports it.
    let server_device: std::net::SocketAddr = SERVER.parse().unwrap();
    p.net
        .call(&p.c, |cm, now| cm.handle_unreachable(now, server_device));
    assert_eq!(p.c.borrow().count(id, CmEventKind::Disconnected), 1);
    assert_eq!(p.c.borrow().cm.counters().retransmits, 0);
    let c = p.c.clone();
    p.net
        .run_until(|_| c.borrow().count(id, CmEventKind::TimewaitExit) == 1)
        .unwrap();
    assert!(
        p.elapsed() - asked < Duration::from_secs(6),
        "{:?}",
        p.elapsed()
    );
    assert_eq!(c.borrow().cm.connection_count(), 0);
}

/// How a client ends its connection before its process exits.
#[derive(Debug, Clone, Copy)]
enum Close {
    /// `rdma_disconnect`, then `rdma_destroy_id` before the DREP came (rping -c).
    DisconnectThenDestroy,
    /// `rdma_destroy_id` of the established id (rsockets' rclose): destroy sends the DREQ.
    Destroy,
}

impl Pair {
    /// The client closes its connection as `how` says, with its first `lost` DREQs lost,
    /// and its process exits once the destroying call returns: the call waits while the
    /// cm lingers ([`Cm::lingering`], the driver's `rdma_destroy_id`), and from the exit
    /// on nothing the client sends gets out. Returns how long the destroy waited.
    fn close_and_exit(&mut self, how: Close, lost: usize) -> Duration {
        let id = self.connect();
        self.c.borrow_mut().filter = Some(drop_first(AttributeId::Dreq, lost));
        if let Close::DisconnectThenDestroy = how {
            self.net
                .call(&self.c, |cm, now| cm.disconnect(now, id).unwrap());
        }
        assert!(self.c.borrow().cm.destroy_lingers(id), "{how:?}");
        let destroyed = self.elapsed();
        self.net
            .call(&self.c, |cm, now| cm.destroy_id(now, id).unwrap());
        let c = self.c.clone();
        self.net
            .run_until(|_| !c.borrow().cm.lingering())
            .expect("the linger ends");
        let waited = self.elapsed() - destroyed;
        self.c.borrow_mut().filter = Some(Box::new(|_, _| Verdict::Drop));
        self.net.run_for(Duration::from_secs(30));
        waited
    }
}

/// The flake of rdmacm-abi's `rping_1000_verified_with_2_percent_loss` (CI, session 14):
/// the client's DREQ was lost and the client exited before its retransmission (6.1 s
/// later), taking its cm along; the server waited for DISCONNECTED until it was killed.
/// Now the destroy lingers: the DREQ goes again 10 ms later (2 packet life times, capped)
/// and the DREP ends the wait.
#[test]
fn a_lost_dreq_still_reaches_the_peer_of_a_process_that_exits() {
    for how in [Close::DisconnectThenDestroy, Close::Destroy] {
        let mut p = Pair::new(8, None, None);
        let waited = p.close_and_exit(how, 1);
        let child = p.child();
        assert_eq!(
            p.s.borrow().count(child, CmEventKind::Disconnected),
            1,
            "{how:?}: the server heard the DREQ sent again"
        );
        assert_eq!(p.c.borrow().sent_count(AttributeId::Dreq), 1, "{how:?}");
        assert!(
            waited >= Duration::from_millis(10) && waited < Duration::from_millis(15),
            "{how:?}: the copy 10 ms on, then the DREP: {waited:?}"
        );
    }
}

/// The linger is bounded: a DREQ lost every time holds the destroying caller for the
/// copies (3, 10 ms apart at the default packet life time) and one more wait, 40 ms.
/// A DREQ answered at once holds it not at all.
#[test]
fn the_linger_of_a_destroy_is_bounded_and_ends_with_the_drep() {
    for how in [Close::DisconnectThenDestroy, Close::Destroy] {
        let mut p = Pair::new(9, None, None);
        let waited = p.close_and_exit(how, 1000);
        assert_eq!(waited, Duration::from_millis(40), "{how:?}");
        assert_eq!(
            p.s.borrow().count(p.child(), CmEventKind::Disconnected),
            0,
            "{how:?}: every copy was lost"
        );
    }
    let mut p = Pair::new(10, None, None);
    let id = p.connect();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    let c = p.c.clone();
    p.net
        .run_until(|_| c.borrow().count(id, CmEventKind::Disconnected) == 1)
        .unwrap();
    assert!(!p.c.borrow().cm.destroy_lingers(id));
    p.net.call(&p.c, |cm, now| cm.destroy_id(now, id).unwrap());
    assert!(
        !p.c.borrow().cm.lingering(),
        "answered: nothing to wait for"
    );
}

/// A process that exits without destroying its ids: the driver's exit hook destroys them
/// all, as Linux does when the rdma_cm file closes. The established connection's DREQ
/// reaches the server (DISCONNECTED there), an id that never connected goes quietly, and
/// no event reaches the destroyed ids.
#[test]
fn destroying_every_id_at_exit_disconnects_the_peer() {
    let mut p = Pair::new(11, None, None);
    let connected = p.connect();
    let idle = p.net.call(&p.c, |cm, _| {
        cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap()
    });
    let events_before = p.c.borrow().events.len();
    let destroyed = p.net.call(&p.c, |cm, now| cm.destroy_all(now));
    assert_eq!(destroyed.len(), 2, "{destroyed:?}");
    assert!(destroyed.contains(&connected) && destroyed.contains(&idle));
    assert!(
        p.c.borrow().cm.lingering(),
        "the DREQ is sent again until answered"
    );
    let (c, s, child) = (p.c.clone(), p.s.clone(), p.child());
    p.net
        .run_until(|_| {
            s.borrow().count(child, CmEventKind::Disconnected) == 1 && !c.borrow().cm.lingering()
        })
        .expect("the server hears the DREQ");
    assert_eq!(p.c.borrow().sent_count(AttributeId::Dreq), 1);
    assert_eq!(
        p.c.borrow().events.len(),
        events_before,
        "nothing for the dead ids"
    );
    for id in [connected, idle] {
        assert!(p.c.borrow().cm.state(id).is_err(), "{id:?} is gone");
    }
    p.net.run_for(Duration::from_secs(30));
    assert_eq!(p.c.borrow().cm.connection_count(), 0);
    assert_eq!(p.s.borrow().cm.connection_count(), 0);
    assert!(p.net.call(&p.c, |cm, now| cm.destroy_all(now)).is_empty());
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

#[test]
fn a_slow_accept_is_covered_by_an_mra_of_the_req() {
    // The server's application takes 30 s to accept. The client's REQ retry at
    // 6.1 s reaches the server while it decides: it answers with an MRA (rdma_cm's
    // delayed MRA, service timeout 24 = 67 s), and the client waits instead of
    // retrying every 6 s (CM.md 3.2.2, 3.3.1).
    let mut p = Pair::new(10, None, None);
    p.s.borrow_mut().hook = None;
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    p.net.run_for(Duration::from_secs(30));
    assert_eq!(p.s.borrow().sent_count(AttributeId::Mra), 1);
    assert_eq!(p.c.borrow().sent_count(AttributeId::Req), 2);
    let child = p.child();
    p.net.call(&p.s, |cm, now| {
        cm.accept(
            now,
            child,
            Some(ConnParam {
                qp_num: Some(Qpn::new(9)),
                ..ConnParam::default()
            }),
        )
        .unwrap()
    });
    let (c, s) = (p.c.clone(), p.s.clone());
    p.net
        .run_until(|_| responded(&c, 1) && established(&s, 1))
        .unwrap();
    assert_eq!(p.c.borrow().sent_count(AttributeId::Req), 2);
    assert_eq!(p.s.borrow().events_of(CmEventKind::ConnectRequest).len(), 1);
    let _ = id;
}

#[test]
fn a_slow_establish_is_covered_by_an_mra_of_the_rep() {
    // The client's application takes 20 s to ready its QP after CONNECT_RESPONSE:
    // the server's REP retry at 4.1 s finds the client waiting, which answers with
    // an MRA of the REP; the server stops retrying until the RTU.
    let mut p = Pair::new(11, None, None);
    p.c.borrow_mut().hook = None;
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    p.net.run_for(Duration::from_secs(20));
    assert_eq!(p.c.borrow().count(id, CmEventKind::ConnectResponse), 1);
    assert_eq!(p.c.borrow().sent_count(AttributeId::Mra), 1);
    assert_eq!(p.s.borrow().sent_count(AttributeId::Rep), 2);
    p.net.call(&p.c, |cm, now| cm.establish(now, id).unwrap());
    let s = p.s.clone();
    p.net.run_until(|_| established(&s, 1)).unwrap();
    assert_eq!(p.s.borrow().sent_count(AttributeId::Rep), 2);
    // establish twice is refused: the RTU went.
    assert!(p.net.call(&p.c, |cm, now| cm.establish(now, id)).is_err());
}

fn rejected(h: &HostRef, id: CmIdHandle) -> Option<(EventStatus, Vec<u8>)> {
    let h = h.borrow();
    let e = h
        .events
        .iter()
        .find(|e| e.id == id && e.kind == CmEventKind::Rejected)?;
    let EventParam::Conn(p) = &e.param else {
        panic!("REJECTED carries connection parameters")
    };
    Some((e.status, p.private_data.clone()))
}

#[test]
fn reject_with_private_data_is_rejected_28() {
    let mut p = Pair::new(12, None, None);
    p.s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectRequest {
            cm.reject(now, e.id, b"go away").unwrap();
        }
    }));
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let c = p.c.clone();
    p.net.run_until(|_| rejected(&c, id).is_some()).unwrap();
    let (status, data) = rejected(&p.c, id).unwrap();
    assert_eq!(status, EventStatus::Rejected(RejReason::CONSUMER_DEFINED));
    assert_eq!(data.len(), REJ_USER_DATA_LEN);
    assert_eq!(&data[..7], b"go away");
    assert_eq!(p.c.borrow().cm.connection_count(), 0);
    assert_eq!(p.s.borrow().cm.connection_count(), 0);
    // Rejecting again, or with too much private data, is refused.
    let child = last_request(&p.s);
    assert!(p
        .net
        .call(&p.s, |cm, now| cm.reject(now, child, b"again"))
        .is_err());
}

#[test]
fn reject_with_a_reason_sends_that_reason() {
    // rdma_reject_ece: REJ reason 35, "vendor option not supported".
    let mut p = Pair::new(13, None, None);
    p.s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectRequest {
            cm.reject_with_reason(now, e.id, b"no ece", RejReason(35))
                .unwrap();
        }
    }));
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let c = p.c.clone();
    p.net.run_until(|_| rejected(&c, id).is_some()).unwrap();
    let (status, data) = rejected(&p.c, id).unwrap();
    assert_eq!(status, EventStatus::Rejected(RejReason(35)));
    assert_eq!(&data[..6], b"no ece");
    assert_eq!(p.s.borrow().cm.connection_count(), 0);
}

#[test]
fn a_request_nobody_listens_for_is_rejected_8_on_the_wire() {
    // The server listens on UDP port space 7174 (so the rendezvous socket exists);
    // a TCP-port-space request there finds no service: REJ 8 (CM.md 2.4).
    let mut net = Net::lossless(13);
    let s = net.host(SERVER);
    net.listen(&s, PortSpace::Udp, QpType::Ud, "0.0.0.0:7174", 0)
        .unwrap();
    let c = client(&mut net);
    let id = start_connect(&mut net, &c, SERVICE, Some(param()));
    net.run_until(|_| rejected(&c, id).is_some()).unwrap();
    assert_eq!(
        rejected(&c, id).unwrap().0,
        EventStatus::Rejected(RejReason::INVALID_SERVICE_ID)
    );
    assert_eq!(s.borrow().rej_reasons, [RejReason::INVALID_SERVICE_ID]);
    assert!(s.borrow().events.is_empty());
}

#[test]
fn a_request_of_the_wrong_qp_type_is_rejected_28() {
    let mut net = Net::lossless(14);
    let s = net.host(SERVER);
    net.listen(&s, PortSpace::Ib, QpType::Ud, "0.0.0.0:7000", 0)
        .unwrap();
    let c = client(&mut net);
    let peer: std::net::SocketAddr = "10.0.0.2:7000".parse().unwrap();
    let id = net.call(&c, |cm, now| {
        let id = cm.create_id(PortSpace::Ib, QpType::Rc).unwrap();
        cm.resolve_addr(now, id, None, peer, Duration::from_secs(1))
            .unwrap();
        id
    });
    net.call(&c, |cm, _| cm.resolve_route(id).unwrap());
    net.call(&c, |cm, now| cm.connect(now, id, Some(param())).unwrap());
    net.run_until(|_| rejected(&c, id).is_some()).unwrap();
    assert_eq!(
        rejected(&c, id).unwrap().0,
        EventStatus::Rejected(RejReason::CONSUMER_DEFINED)
    );
}

#[test]
fn destroying_a_connecting_id_rejects_with_timeout() {
    // The client gives up while the server decides: REJ 4 with the client's GUID in
    // the ARI, which the server matches to the request it holds (CM.md 2.4, 3.5).
    let mut p = Pair::new(15, None, None);
    p.s.borrow_mut().hook = None;
    let id = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let s = p.s.clone();
    p.net
        .run_until(|_| !s.borrow().events_of(CmEventKind::ConnectRequest).is_empty())
        .unwrap();
    p.net.call(&p.c, |cm, now| cm.destroy_id(now, id).unwrap());
    let child = p.child();
    p.net.run_until(|_| rejected(&s, child).is_some()).unwrap();
    assert_eq!(
        rejected(&p.s, child).unwrap().0,
        EventStatus::Rejected(RejReason::TIMEOUT)
    );
    assert_eq!(p.c.borrow().rej_reasons, [RejReason::TIMEOUT]);
    assert_eq!(p.c.borrow().cm.connection_count(), 0);
    assert_eq!(p.s.borrow().cm.connection_count(), 0);
    // Accepting a request whose requester gave up is refused.
    assert!(p
        .net
        .call(&p.s, |cm, now| cm.accept(now, child, None))
        .is_err());
}

#[test]
fn a_second_request_from_a_connected_qp_is_stale() {
    // The client connects again from QPN 0x123 while its first connection from
    // that QP is up: the server refuses the new one with REJ 10 and closes the old
    // one with a DREQ (CM.md 3.4 "stale REQ").
    let mut p = Pair::new(16, None, None);
    let first_id = p.connect();
    let old_child = p.child();
    let second = start_connect(&mut p.net, &p.c, SERVICE, Some(param()));
    let c = p.c.clone();
    p.net
        .run_until(|_| {
            rejected(&c, second).is_some()
                && c.borrow().count(first_id, CmEventKind::Disconnected) == 1
        })
        .unwrap();
    assert_eq!(
        rejected(&p.c, second).unwrap().0,
        EventStatus::Rejected(RejReason::STALE_CONNECTION)
    );
    assert_eq!(p.s.borrow().cm.counters().stale, 1);
    let s = p.s.clone();
    p.net
        .run_until(|_| s.borrow().count(old_child, CmEventKind::Disconnected) == 1)
        .unwrap();
    assert_eq!(p.s.borrow().events_of(CmEventKind::ConnectRequest).len(), 1);
}

#[test]
fn a_late_copy_of_the_req_in_timewait_is_rejected_stale() {
    // A copy of the REQ arrives 2 s after the first, when the connection is already
    // closed and the server sits in timewait (2048 ms here): REJ 10 (CM.md 3.4).
    let mut p = Pair::new(
        17,
        Some(first(
            AttributeId::Req,
            1,
            Verdict::Echo(Duration::from_millis(2000)),
        )),
        None,
    );
    let id = p.connect();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    p.net.run_for(Duration::from_millis(2100));
    assert_eq!(p.s.borrow().rej_reasons, [RejReason::STALE_CONNECTION]);
    assert_eq!(p.s.borrow().events_of(CmEventKind::ConnectRequest).len(), 1);
}

#[test]
fn a_qp_that_will_not_move_is_a_connect_error() {
    // The client's cm-made QP cannot go to RTR/RTS after the REP: CONNECT_ERROR
    // locally, REJ "consumer defined" to the server (librdmacm ucma_process_conn_resp).
    let mut p = Pair::new(18, None, None);
    let id = p.net.call(&p.c, |cm, now| {
        let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
        cm.resolve_addr(
            now,
            id,
            None,
            SERVICE.parse().unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        id
    });
    p.net.call(&p.c, |cm, _| cm.resolve_route(id).unwrap());
    let qp = QpBinding {
        qpn: Qpn::new(0x55),
        srq: false,
        managed: true,
    };
    p.net.call(&p.c, |cm, now| cm.set_qp(now, id, qp).unwrap());
    p.c.borrow_mut().fail_qp = true;
    p.net
        .call(&p.c, |cm, now| cm.connect(now, id, None).unwrap());
    let s = p.s.clone();
    p.net
        .run_until(|_| !s.borrow().events_of(CmEventKind::Rejected).is_empty())
        .unwrap();
    let c = p.c.borrow();
    assert_eq!(c.count(id, CmEventKind::ConnectError), 1);
    assert_eq!(c.count(id, CmEventKind::Established), 0);
    assert_eq!(c.rej_reasons, [RejReason::CONSUMER_DEFINED]);
    // The REJ swallowed nothing the client needs; the server's request failed.
    assert_eq!(
        p.s.borrow().events_of(CmEventKind::Rejected)[0].status,
        EventStatus::Rejected(RejReason::CONSUMER_DEFINED)
    );
}

#[test]
fn disconnecting_from_both_sides_at_once() {
    // Crossing DREQs: each side answers the other's with a DREP and both wait out
    // their timewait; each reports DISCONNECTED once.
    let mut p = Pair::new(19, None, None);
    p.c.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectResponse {
            cm.establish(now, e.id).unwrap();
        }
    }));
    p.s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectRequest {
            let param = ConnParam {
                qp_num: Some(Qpn::new(0x77)),
                ..ConnParam::default()
            };
            cm.accept(now, e.id, Some(param)).unwrap();
        }
    }));
    let id = p.connect();
    let child = p.child();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    p.net
        .call(&p.s, |cm, now| cm.disconnect(now, child).unwrap());
    let (c, s) = (p.c.clone(), p.s.clone());
    p.net
        .run_until(|_| {
            c.borrow().count(id, CmEventKind::TimewaitExit) == 1
                && s.borrow().count(child, CmEventKind::TimewaitExit) == 1
        })
        .unwrap();
    for (h, id) in [(&p.c, id), (&p.s, child)] {
        let h = h.borrow();
        assert_eq!(h.count(id, CmEventKind::Disconnected), 1);
        assert_eq!(h.sent_count(AttributeId::Dreq), 1);
        assert_eq!(h.sent_count(AttributeId::Drep), 1);
        assert_eq!(h.cm.connection_count(), 0);
    }
}

#[test]
fn timewait_lasts_the_ack_timeout_then_exits() {
    // Timewait is 2^(19-8) ms for the ACK timeout 19 both sides use (CM.md 3.5);
    // during it a repeated DREQ is answered again.
    let mut p = Pair::new(
        20,
        Some(first(
            AttributeId::Dreq,
            1,
            Verdict::Echo(Duration::from_millis(500)),
        )),
        None,
    );
    let id = p.connect();
    let child = p.child();
    p.net.call(&p.c, |cm, now| cm.disconnect(now, id).unwrap());
    let sent_at = p.net.now();
    p.net.run_for(Duration::from_millis(1000));
    assert_eq!(p.s.borrow().cm.connection_count(), 1, "in timewait");
    assert_eq!(
        p.s.borrow().sent_count(AttributeId::Drep),
        2,
        "the copy was answered"
    );
    p.disconnect_wait(id, child);
    for (h, id) in [(&p.c, id), (&p.s, child)] {
        let exit = h.borrow().time_of(id, CmEventKind::TimewaitExit).unwrap();
        let waited = Duration::from_nanos(exit.as_nanos() - sent_at.as_nanos());
        assert!(
            waited >= Duration::from_millis(2048) && waited < Duration::from_millis(2049),
            "{waited:?}"
        );
    }
}

impl Pair {
    fn disconnect_wait(&mut self, id: CmIdHandle, child: CmIdHandle) {
        let (c, s) = (self.c.clone(), self.s.clone());
        self.net
            .run_until(|_| {
                c.borrow().count(id, CmEventKind::TimewaitExit) == 1
                    && s.borrow().count(child, CmEventKind::TimewaitExit) == 1
            })
            .unwrap();
    }
}

#[test]
fn a_reply_from_a_qp_already_connected_is_stale() {
    // The server (wrongly) answers two requests from one QP, 0x77: the client
    // refuses the second REP with REJ 10 and closes the first connection with a
    // DREQ (CM.md 3.4 "stale REP"). Its REQ stays outstanding (as in Linux); once
    // the server's side of the refused connection has left timewait, the retried
    // REQ connects.
    let mut p = Pair::new(21, None, None);
    p.s.borrow_mut().hook = Some(Box::new(|cm, now, e| match e.kind {
        CmEventKind::ConnectRequest => {
            let param = ConnParam {
                qp_num: Some(Qpn::new(0x77)),
                ..ConnParam::default()
            };
            cm.accept(now, e.id, Some(param)).unwrap();
        }
        CmEventKind::Disconnected => cm.disconnect(now, e.id).unwrap(),
        _ => {}
    }));
    let first_id = p.connect();
    let old_child = p.child();
    let other = ConnParam {
        qp_num: Some(Qpn::new(0x124)),
        ..param()
    };
    let second = start_connect(&mut p.net, &p.c, SERVICE, Some(other));
    let (c, s) = (p.c.clone(), p.s.clone());
    p.net
        .run_until(|_| {
            c.borrow().count(first_id, CmEventKind::Disconnected) == 1
                && s.borrow().count(old_child, CmEventKind::Disconnected) == 1
        })
        .unwrap();
    assert_eq!(p.c.borrow().cm.counters().stale, 1);
    assert_eq!(p.c.borrow().rej_reasons, [RejReason::STALE_CONNECTION]);
    let refused = last_request(&p.s);
    assert_eq!(
        rejected(&p.s, refused).unwrap().0,
        EventStatus::Rejected(RejReason::STALE_CONNECTION)
    );
    assert_eq!(p.c.borrow().count(second, CmEventKind::ConnectResponse), 0);
    p.net
        .run_until(|_| c.borrow().count(second, CmEventKind::ConnectResponse) == 1)
        .unwrap();
    assert_eq!(p.c.borrow().sent_count(AttributeId::Req), 3);
}
