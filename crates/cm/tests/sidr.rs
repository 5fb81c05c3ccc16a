//! UD ids: service ID resolution (SIDR_REQ / SIDR_REP) lost, duplicated, refused,
//! and multicast joins (CM.md 2.7, 4.4 "UD", 4.6).

mod common;

use common::*;
use softverbs_cm::*;
use softverbs_wire::cm::AttributeId;
use std::net::SocketAddr;
use std::time::Duration;

const SERVER: &str = "10.0.0.2:4791";
const CLIENT: &str = "10.0.0.1:4791";

/// A UD server on port 7174 that accepts with QPN 0x333 and private data "ud-ok".
fn ud_server(net: &mut Net) -> HostRef {
    let s = net.host(SERVER);
    net.listen(&s, PortSpace::Udp, QpType::Ud, "0.0.0.0:7174", 0)
        .unwrap();
    s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectRequest {
            let p = ConnParam {
                private_data: b"ud-ok".to_vec(),
                qp_num: Some(Qpn::new(0x333)),
                ..ConnParam::default()
            };
            cm.accept(now, e.id, Some(p)).unwrap();
        }
    }));
    s
}

fn ud_connect(net: &mut Net, c: &HostRef, peer: &str) -> CmIdHandle {
    let peer: SocketAddr = peer.parse().unwrap();
    let id = net.call(c, |cm, now| {
        let id = cm.create_id(PortSpace::Udp, QpType::Ud).unwrap();
        cm.resolve_addr(now, id, None, peer, Duration::from_secs(1))
            .unwrap();
        id
    });
    net.call(c, |cm, _| cm.resolve_route(id).unwrap());
    net.call(c, |cm, now| {
        let p = ConnParam {
            private_data: b"who serves?".to_vec(),
            ..ConnParam::default()
        };
        cm.connect(now, id, Some(p)).unwrap()
    });
    id
}

fn outcome(c: &HostRef, id: CmIdHandle) -> Option<CmEvent> {
    c.borrow()
        .events
        .iter()
        .find(|e| {
            e.id == id && matches!(e.kind, CmEventKind::Established | CmEventKind::Unreachable)
        })
        .cloned()
}

fn resolve(
    seed: u64,
    client_filter: Option<Filter>,
    server_filter: Option<Filter>,
) -> (HostRef, HostRef, CmEvent) {
    let mut net = Net::lossless(seed);
    let s = ud_server(&mut net);
    let c = net.host(CLIENT);
    c.borrow_mut().filter = client_filter;
    s.borrow_mut().filter = server_filter;
    let id = ud_connect(&mut net, &c, "10.0.0.2:7174");
    net.run_until(|_| outcome(&c, id).is_some()).unwrap();
    let e = outcome(&c, id).unwrap();
    (c, s, e)
}

fn assert_resolved(e: &CmEvent) {
    assert_eq!(e.kind, CmEventKind::Established, "{e:?}");
    let EventParam::Ud(p) = &e.param else {
        panic!("UD parameters")
    };
    assert_eq!(p.qp_num, Qpn::new(0x333));
    assert_eq!(p.qkey, RDMA_UDP_QKEY);
    assert_eq!(p.private_data.len(), SIDR_REP_USER_DATA_LEN);
    assert_eq!(&p.private_data[..5], b"ud-ok");
    let ah = p.ah.unwrap();
    assert_eq!(
        ah.dest,
        SERVER.parse().unwrap(),
        "datagrams go to the server's device"
    );
    assert_eq!(
        ah.dgid,
        Gid::from_socket_addr(SERVER.parse().unwrap()).unwrap()
    );
}

#[test]
fn sidr_resolves_qpn_qkey_and_address() {
    let (c, s, e) = resolve(1, None, None);
    assert_resolved(&e);
    let s = s.borrow();
    let req = s.events_of(CmEventKind::ConnectRequest)[0];
    let EventParam::Ud(p) = &req.param else {
        panic!("UD parameters")
    };
    assert_eq!(p.private_data.len(), SIDR_REQ_USER_DATA_LEN);
    assert_eq!(&p.private_data[..11], b"who serves?");
    assert_eq!(
        p.ah, None,
        "the passive side learns the peer from its first datagram"
    );
    assert_eq!(c.borrow().sent, [AttributeId::SidrReq]);
    assert_eq!(s.sent, [AttributeId::SidrRep]);
}

#[test]
fn sidr_req_lost_once_and_many_times() {
    for lost in [1, 6] {
        let (c, s, e) = resolve(2, Some(drop_first(AttributeId::SidrReq, lost)), None);
        assert_resolved(&e);
        assert_eq!(c.borrow().sent_count(AttributeId::SidrReq), 1);
        assert_eq!(c.borrow().cm.counters().retransmits, lost as u64);
        assert_eq!(s.borrow().events_of(CmEventKind::ConnectRequest).len(), 1);
    }
}

#[test]
fn sidr_rep_lost_is_answered_again_not_asked_again() {
    // The retransmitted SIDR_REQ gets the remembered SIDR_REP: the server's
    // application sees one request, not two.
    for lost in [1, 6] {
        let (c, s, e) = resolve(3, None, Some(drop_first(AttributeId::SidrRep, lost)));
        assert_resolved(&e);
        assert_eq!(c.borrow().cm.counters().retransmits, lost as u64);
        let s = s.borrow();
        assert_eq!(s.events_of(CmEventKind::ConnectRequest).len(), 1);
        assert_eq!(s.cm.counters().duplicates, lost as u64);
    }
}

#[test]
fn sidr_duplicated_and_reordered() {
    let dup: Filter = Box::new(|_, _| Verdict::Duplicate);
    let (_, s, e) = resolve(4, Some(dup), None);
    assert_resolved(&e);
    assert_eq!(s.borrow().events_of(CmEventKind::ConnectRequest).len(), 1);
    // A SIDR_REP held back past the client's retry: the first answer wins, the late
    // copy is dropped as unmatched.
    let late = first(
        AttributeId::SidrRep,
        1,
        Verdict::Delay(Duration::from_secs(5)),
    );
    let (c, _, e) = resolve(5, None, Some(late));
    assert_resolved(&e);
    assert_eq!(c.borrow().cm.counters().retransmits, 1);
}

#[test]
fn sidr_lost_for_good_is_unreachable_timed_out() {
    let (c, _, e) = resolve(6, Some(drop_first(AttributeId::SidrReq, 100)), None);
    assert_eq!(e.kind, CmEventKind::Unreachable);
    assert_eq!(e.status, EventStatus::TimedOut);
    assert_eq!(c.borrow().cm.counters().retransmits, 15);
}

#[test]
fn sidr_refusals() {
    // Rejected by the application: status 2.
    let mut net = Net::lossless(7);
    let s = net.host(SERVER);
    net.listen(&s, PortSpace::Udp, QpType::Ud, "0.0.0.0:7174", 0)
        .unwrap();
    net.listen(&s, PortSpace::Tcp, QpType::Rc, "0.0.0.0:7175", 0)
        .unwrap();
    s.borrow_mut().hook = Some(Box::new(|cm, now, e| {
        if e.kind == CmEventKind::ConnectRequest {
            cm.reject(now, e.id, b"no").unwrap();
        }
    }));
    let c = net.host(CLIENT);
    let id = ud_connect(&mut net, &c, "10.0.0.2:7174");
    net.run_until(|_| outcome(&c, id).is_some()).unwrap();
    let e = outcome(&c, id).unwrap();
    assert_eq!(
        (e.kind, e.status),
        (
            CmEventKind::Unreachable,
            EventStatus::Sidr(SidrStatus::REJECTED)
        )
    );
    // Nobody listens on the UDP port space there (only TCP): status 1, on the wire.
    let id = ud_connect(&mut net, &c, "10.0.0.2:7175");
    net.run_until(|_| outcome(&c, id).is_some()).unwrap();
    let e = outcome(&c, id).unwrap();
    assert_eq!(
        e.status,
        EventStatus::Sidr(SidrStatus::SERVICE_ID_NOT_SUPPORTED)
    );
    // Nothing on the port at all: ICMP, the same status at once.
    let id = ud_connect(&mut net, &c, "10.0.0.2:9999");
    net.run_until(|_| outcome(&c, id).is_some()).unwrap();
    assert_eq!(
        outcome(&c, id).unwrap().status,
        EventStatus::Sidr(SidrStatus::SERVICE_ID_NOT_SUPPORTED)
    );
}

#[test]
fn multicast_join_and_leave() {
    let mut net = Net::lossless(8);
    let c = net.host(CLIENT);
    let group: std::net::IpAddr = "239.1.2.3".parse().unwrap();
    let id = net.call(&c, |cm, now| {
        let id = cm.create_id(PortSpace::Udp, QpType::Ud).unwrap();
        cm.resolve_addr(
            now,
            id,
            None,
            SocketAddr::new(group, 0),
            Duration::from_secs(1),
        )
        .unwrap();
        id
    });
    let qp = QpBinding {
        qpn: Qpn::new(0x44),
        srq: false,
        managed: true,
    };
    net.call(&c, |cm, now| cm.set_qp(now, id, qp).unwrap());
    net.call(&c, |cm, now| {
        cm.join_multicast(now, id, group, false, 0xfeed).unwrap()
    });
    // Twice is refused; IPv6 groups and unicast addresses too.
    assert_eq!(
        net.call(&c, |cm, now| cm.join_multicast(now, id, group, false, 0)),
        Err(CmError::AddrInUse)
    );
    assert!(net
        .call(&c, |cm, now| cm.join_multicast(
            now,
            id,
            "ff0e::1".parse().unwrap(),
            false,
            0
        ))
        .is_err());
    assert!(net
        .call(&c, |cm, now| cm.join_multicast(
            now,
            id,
            "10.1.1.1".parse().unwrap(),
            false,
            0
        ))
        .is_err());
    let h = c.borrow();
    let join = h.events_of(CmEventKind::MulticastJoin)[0];
    let EventParam::Multicast {
        group: g,
        context,
        ud,
    } = &join.param
    else {
        panic!("multicast parameters")
    };
    assert_eq!(*context, 0xfeed);
    assert_eq!(g.ip(), group);
    assert_eq!(ud.qp_num, Qpn::MULTICAST);
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    assert_eq!(ud.ah.unwrap().dgid, Gid::from_ip(group));
    // The UD QP was readied (INIT with the UDP Q_Key, RTR, RTS) and attached.
    let modify = h
        .requests
        .iter()
        .find_map(|r| match r {
            DriverRequest::ModifyQp { steps, .. } => Some(steps.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        modify.iter().map(|s| s.state).collect::<Vec<_>>(),
        [QpState::Init, QpState::Rtr, QpState::Rts]
    );
    assert_eq!(modify[0].qkey, RDMA_UDP_QKEY);
    assert!(h.requests.iter().any(|r| matches!(
        r,
        DriverRequest::JoinGroup { attach: Some(q), send_only: false, .. } if *q == Qpn::new(0x44)
    )));
    drop(h);
    net.call(&c, |cm, _| cm.leave_multicast(id, group).unwrap());
    assert!(c.borrow().requests.iter().any(|r| matches!(
        r,
        DriverRequest::LeaveGroup { detach: Some(q), .. } if *q == Qpn::new(0x44)
    )));
    assert!(net.call(&c, |cm, _| cm.leave_multicast(id, group)).is_err());
}

/// A join the driver cannot make (the host refuses the membership) ends in
/// MULTICAST_ERROR with the join's status, and leaves nothing behind: the id may
/// try the group again, and there is nothing to leave.
#[test]
fn a_failed_join_is_a_multicast_error_and_may_be_tried_again() {
    let mut net = Net::lossless(9);
    let c = net.host(CLIENT);
    c.borrow_mut().fail_join = true;
    let group: std::net::IpAddr = "239.1.2.4".parse().unwrap();
    let id = net.call(&c, |cm, now| {
        let id = cm.create_id(PortSpace::Udp, QpType::Ud).unwrap();
        // Port 0: an ephemeral port, no rendezvous socket to reserve.
        assert!(matches!(
            cm.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap(),
            Reservation::NotNeeded
        ));
        cm.join_multicast(now, id, group, false, 0xbad).unwrap();
        id
    });
    net.run_until(|_| !c.borrow().events_of(CmEventKind::MulticastError).is_empty())
        .unwrap();
    {
        let h = c.borrow();
        let failed = h.events_of(CmEventKind::MulticastError)[0];
        assert_eq!(failed.id, id);
        assert_eq!(failed.status, EventStatus::JoinFailed);
        assert!(h.events_of(CmEventKind::MulticastJoin).is_empty());
    }
    assert!(net.call(&c, |cm, _| cm.leave_multicast(id, group)).is_err());
    // The failed join is forgotten: a second try is a new join, not EADDRINUSE.
    c.borrow_mut().fail_join = false;
    net.call(&c, |cm, now| {
        cm.join_multicast(now, id, group, false, 0xfeed).unwrap()
    });
    net.run_until(|_| !c.borrow().events_of(CmEventKind::MulticastJoin).is_empty())
        .unwrap();
    net.call(&c, |cm, _| cm.leave_multicast(id, group).unwrap());
}
