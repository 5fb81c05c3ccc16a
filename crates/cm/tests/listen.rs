//! Finding a listener without a daemon: rendezvous sockets, ports nobody holds,
//! EADDRINUSE, backlog, unreachable destinations, IPv6, and a hundred connects at
//! once with crossing DREQs (CM.md 4.3, 4.4; issue 11 "reaching a listener").

mod common;

use common::*;
use softverbs_cm::*;
use softverbs_sim::Faults;
use softverbs_wire::cm::AttributeId;
use std::net::SocketAddr;
use std::time::Duration;

fn accept_all(h: &HostRef) {
    let mut qpn = 0x100;
    h.borrow_mut().hook = Some(Box::new(move |cm, now, e| match e.kind {
        CmEventKind::ConnectRequest => {
            qpn += 1;
            let param = ConnParam {
                qp_num: Some(Qpn::new(qpn)),
                ..ConnParam::default()
            };
            cm.accept(now, e.id, Some(param)).unwrap();
        }
        CmEventKind::ConnectResponse => cm.establish(now, e.id).unwrap(),
        CmEventKind::Disconnected => cm.disconnect(now, e.id).unwrap(),
        _ => {}
    }));
}

fn connect_with_qpn(net: &mut Net, h: &HostRef, peer: &str, qpn: u32) -> CmIdHandle {
    let param = ConnParam {
        qp_num: Some(Qpn::new(qpn)),
        ..ConnParam::default()
    };
    start_connect(net, h, peer, Some(param))
}

fn status_of(h: &HostRef, id: CmIdHandle, kind: CmEventKind) -> Option<EventStatus> {
    let h = h.borrow();
    h.events
        .iter()
        .find(|e| e.id == id && e.kind == kind)
        .map(|e| e.status)
}

#[test]
fn connect_to_a_port_nobody_listens_on_fails_fast() {
    // Nothing holds 10.0.0.2:7174: the REQ draws ICMP port unreachable, and the
    // connect fails at once with REJECTED 8, as perftest -R's retry loop needs.
    let mut net = Net::lossless(1);
    let _s = net.host("10.0.0.2:4791");
    let c = net.host("10.0.0.1:4791");
    let id = connect_with_qpn(&mut net, &c, "10.0.0.2:7174", 5);
    net.run_until(|_| status_of(&c, id, CmEventKind::Rejected).is_some())
        .unwrap();
    assert_eq!(
        status_of(&c, id, CmEventKind::Rejected),
        Some(EventStatus::Rejected(RejReason::INVALID_SERVICE_ID))
    );
    assert!(net.now().as_nanos() < 1_000_000, "within a millisecond");
    assert_eq!(c.borrow().cm.connection_count(), 0);
}

#[test]
fn a_closed_listener_refuses_and_a_new_one_takes_the_port() {
    let mut net = Net::lossless(2);
    let s = net.host("10.0.0.2:4791");
    accept_all(&s);
    let c = net.host("10.0.0.1:4791");
    accept_all(&c);
    let listener = net
        .listen(&s, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7174", 1)
        .unwrap();
    net.call(&s, |cm, now| cm.destroy_id(now, listener).unwrap());
    assert!(s.borrow().requests.contains(&DriverRequest::ReleasePort {
        addr: "10.0.0.2:7174".parse().unwrap()
    }));
    net.run_for(Duration::from_millis(1));
    let id = connect_with_qpn(&mut net, &c, "10.0.0.2:7174", 5);
    net.run_until(|_| status_of(&c, id, CmEventKind::Rejected).is_some())
        .unwrap();
    // Listening again reopens the rendezvous socket; now the connect works.
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7174", 1)
        .unwrap();
    let id = connect_with_qpn(&mut net, &c, "10.0.0.2:7174", 6);
    net.run_until(|_| c.borrow().count(id, CmEventKind::ConnectResponse) == 1)
        .unwrap();
}

#[test]
fn two_listeners_on_one_address_and_port() {
    // In one process the cm refuses the second at once; across processes (two
    // devices on one IP) the second one's rendezvous bind fails: EADDRINUSE both ways.
    let mut net = Net::lossless(3);
    let a = net.host("10.0.0.2:4791");
    let b = net.host("10.0.0.2:20000");
    net.listen(&a, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7174", 0)
        .unwrap();
    assert_eq!(
        net.listen(&a, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7174", 0),
        Err(CmError::AddrInUse)
    );
    assert_eq!(
        net.listen(&a, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7174", 0),
        Err(CmError::AddrInUse)
    );
    assert_eq!(
        net.listen(&b, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7174", 0),
        Err(CmError::AddrInUse)
    );
    // Another port space, another port, or another address is fine.
    net.listen(&a, PortSpace::Udp, QpType::Ud, "10.0.0.2:7174", 0)
        .unwrap();
    net.listen(&b, PortSpace::Tcp, QpType::Rc, "10.0.0.2:7175", 0)
        .unwrap();
    // The failed id is unbound again and may bind elsewhere.
    let id = b
        .borrow_mut()
        .cm
        .create_id(PortSpace::Tcp, QpType::Rc)
        .unwrap();
    let r = b
        .borrow_mut()
        .cm
        .bind_addr(id, "10.0.0.2:7174".parse().unwrap())
        .unwrap();
    assert_eq!(net.reserve(&b, id, r), Err(CmError::AddrInUse));
    assert_eq!(b.borrow().cm.state(id).unwrap(), IdState::Idle);
    assert_eq!(b.borrow().cm.local_addr(id).unwrap(), None);
}

#[test]
fn address_resolution_to_an_unreachable_address_times_out() {
    let mut net = Net::lossless(4);
    let c = net.host("10.0.0.1:4791");
    c.borrow_mut().blackhole.insert("10.0.0.9".parse().unwrap());
    let id = net.call(&c, |cm, now| {
        let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
        cm.resolve_addr(
            now,
            id,
            None,
            "10.0.0.9:7174".parse().unwrap(),
            Duration::from_millis(2000),
        )
        .unwrap();
        id
    });
    net.run_until(|_| status_of(&c, id, CmEventKind::AddrError).is_some())
        .unwrap();
    assert_eq!(
        status_of(&c, id, CmEventKind::AddrError),
        Some(EventStatus::TimedOut)
    );
    assert_eq!(net.now().as_nanos(), 2_000_000_000);
    // The id can try again.
    assert_eq!(c.borrow().cm.state(id).unwrap(), IdState::AddrBound);
    c.borrow_mut().blackhole.clear();
    net.call(&c, |cm, now| {
        cm.resolve_addr(
            now,
            id,
            None,
            "10.0.0.9:7174".parse().unwrap(),
            Duration::from_secs(1),
        )
    })
    .unwrap();
    assert_eq!(c.borrow().count(id, CmEventKind::AddrResolved), 1);
    assert_eq!(
        c.borrow().cm.local_addr(id).unwrap().unwrap().ip(),
        "10.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
}

#[test]
fn a_full_backlog_drops_requests_until_there_is_room() {
    // Backlog 2, four requests, nobody answers at first: two CONNECT_REQUESTs, the
    // other REQs dropped unanswered (Linux ucma); once the two are accepted the
    // others' retries get in.
    let mut net = Net::lossless(5);
    let s = net.host("10.0.0.2:4791");
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7174", 2)
        .unwrap();
    let c = net.host("10.0.0.1:4791");
    accept_all(&c);
    let ids: Vec<_> = (0..4)
        .map(|i| connect_with_qpn(&mut net, &c, "10.0.0.2:7174", 0x10 + i))
        .collect();
    net.run_for(Duration::from_millis(10));
    assert_eq!(s.borrow().events_of(CmEventKind::ConnectRequest).len(), 2);
    assert_eq!(s.borrow().cm.counters().backlog_drops, 2);
    accept_all(&s);
    let pending: Vec<_> = s
        .borrow()
        .events_of(CmEventKind::ConnectRequest)
        .iter()
        .map(|e| e.id)
        .collect();
    for (n, id) in pending.into_iter().enumerate() {
        net.call(&s, |cm, now| {
            let p = ConnParam {
                qp_num: Some(Qpn::new(0x900 + n as u32)),
                ..ConnParam::default()
            };
            cm.accept(now, id, Some(p)).unwrap()
        });
    }
    net.run_until(|_| {
        ids.iter()
            .all(|id| c.borrow().count(*id, CmEventKind::ConnectResponse) == 1)
    })
    .unwrap();
    assert_eq!(s.borrow().events_of(CmEventKind::ConnectRequest).len(), 4);
}

#[test]
fn ipv6_wildcard_and_specific_listeners() {
    let mut net = Net::lossless(6);
    let s = net.host("[fd00::2]:4791");
    accept_all(&s);
    let listener = net
        .listen(&s, PortSpace::Tcp, QpType::Rc, "[::]:7174", 0)
        .unwrap();
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "[fd00::2]:7175", 0)
        .unwrap();
    let c = net.host("[fd00::1]:4791");
    accept_all(&c);
    let a = connect_with_qpn(&mut net, &c, "[fd00::2]:7174", 1);
    let b = connect_with_qpn(&mut net, &c, "[fd00::2]:7175", 2);
    net.run_until(|_| {
        c.borrow().count(a, CmEventKind::ConnectResponse) == 1
            && c.borrow().count(b, CmEventKind::ConnectResponse) == 1
    })
    .unwrap();
    let s_ref = s.borrow();
    let req = s_ref.events_of(CmEventKind::ConnectRequest)[0];
    assert_eq!(req.listen_id, Some(listener));
    let peer: SocketAddr = s_ref.cm.peer_addr(req.id).unwrap().unwrap();
    assert_eq!(peer.ip(), "fd00::1".parse::<std::net::IpAddr>().unwrap());
    let rtr = c.borrow().cm.init_qp_attr(a, QpState::Rtr).unwrap();
    assert_eq!(rtr.ah.unwrap().dest, "[fd00::2]:4791".parse().unwrap());
}

/// A hundred connects at once from four client devices to one listener, then every
/// connection closed from both ends at the same instant (crossing DREQs), over a
/// lossy, duplicating, reordering network.
#[test]
fn a_hundred_concurrent_connects_with_crossing_dreqs() {
    let faults = Faults::chaos(0.05).with_duplicate(0.05).with_reorder(0.1);
    let mut net = Net::new(7, faults);
    let s = net.host("10.0.0.100:4791");
    accept_all(&s);
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7174", 0)
        .unwrap();
    let clients: Vec<HostRef> = (1..=4)
        .map(|i| {
            let h = net.host(&format!("10.0.0.{i}:4791"));
            accept_all(&h);
            h
        })
        .collect();
    let mut ids = Vec::new();
    for n in 0..100u32 {
        let h = clients[n as usize % 4].clone();
        let id = connect_with_qpn(&mut net, &h, "10.0.0.100:7174", 0x1000 + n);
        ids.push((h, id));
    }
    net.run_until(|_| s.borrow().events_of(CmEventKind::Established).len() == 100)
        .unwrap();
    net.run_until(|_| {
        ids.iter()
            .all(|(h, id)| h.borrow().count(*id, CmEventKind::ConnectResponse) == 1)
    })
    .unwrap();
    let children: Vec<CmIdHandle> = s
        .borrow()
        .events_of(CmEventKind::ConnectRequest)
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(children.len(), 100, "every request handed over once");
    // Both ends disconnect everything now.
    for (h, id) in &ids {
        net.call(h, |cm, now| cm.disconnect(now, *id).unwrap());
    }
    for child in &children {
        net.call(&s, |cm, now| cm.disconnect(now, *child).unwrap());
    }
    net.run_until(|_| {
        s.borrow().events_of(CmEventKind::TimewaitExit).len() == 100
            && ids
                .iter()
                .all(|(h, id)| h.borrow().count(*id, CmEventKind::TimewaitExit) == 1)
    })
    .unwrap();
    for child in &children {
        assert_eq!(s.borrow().count(*child, CmEventKind::Disconnected), 1);
    }
    for (h, id) in &ids {
        assert_eq!(h.borrow().count(*id, CmEventKind::Disconnected), 1);
    }
    assert_eq!(s.borrow().cm.connection_count(), 0);
    assert!(clients
        .iter()
        .all(|h| h.borrow().cm.connection_count() == 0));
    let crossing: usize = clients
        .iter()
        .map(|h| h.borrow().sent_count(AttributeId::Drep))
        .sum();
    assert!(
        crossing >= 50,
        "most DREQs crossed: {crossing} client DREPs"
    );
}

/// A listen at a port of the cm's choosing whose rendezvous bind finds the port taken
/// (another socket of the kernel's ephemeral range holds it) asks for another port; a
/// port the application named fails with AddrInUse, as does the 16th taken port.
#[test]
fn a_taken_port_of_the_cms_choosing_is_replaced() {
    let device: SocketAddr = "127.0.0.1:4791".parse().unwrap();
    let mut cm = Cm::new(CmConfig::new(device, CmConfig::guid_for(device), 7));
    let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    assert_eq!(
        cm.bind_addr(id, "127.0.0.1:0".parse().unwrap()).unwrap(),
        Reservation::NotNeeded
    );
    let Reservation::Needed(first) = cm.listen(id, 0).unwrap() else {
        panic!("a listen reserves its port")
    };
    let Reservation::Needed(second) = cm.reservation_taken(id).unwrap() else {
        panic!("a taken ephemeral port is replaced")
    };
    assert_eq!(second.ip(), first.ip());
    assert_ne!(second.port(), first.port());
    assert!((32768..61000).contains(&second.port()));
    cm.complete_reservation(id, true).unwrap();
    assert_eq!(cm.local_addr(id).unwrap(), Some(second));
    assert_eq!(cm.state(id).unwrap(), IdState::Listen);

    // Taken again and again: the listen fails after `EPHEMERAL_TRIES` ports.
    let again = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    let mut r = cm.listen(again, 0).unwrap();
    let mut tried = 0;
    let err = loop {
        assert!(matches!(r, Reservation::Needed(_)));
        tried += 1;
        match cm.reservation_taken(again) {
            Ok(next) => r = next,
            Err(e) => break e,
        }
    };
    assert_eq!(tried, Cm::EPHEMERAL_TRIES);
    assert!(matches!(err, CmError::AddrInUse), "{err:?}");
    assert_eq!(cm.local_addr(again).unwrap(), None);

    // A named port is the application's: taken, the listen fails at once.
    let named = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    let Reservation::Needed(_) = cm
        .bind_addr(named, "127.0.0.1:7471".parse().unwrap())
        .unwrap()
    else {
        panic!("a named port is reserved at bind")
    };
    assert!(matches!(
        cm.reservation_taken(named),
        Err(CmError::AddrInUse)
    ));
    assert_eq!(cm.local_addr(named).unwrap(), None);
}
