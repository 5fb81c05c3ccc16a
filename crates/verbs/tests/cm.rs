//! The connection manager over real sockets: two devices of one process on loopback (each
//! its own 127.83.x.y), talking through rendezvous sockets, ICMP and QP1. The protocol itself
//! is tested in the simulator (crates/cm/tests); these prove the driver.

use softverbs::cm::*;
use softverbs::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn device() -> Context {
    Device::with_config("cm-test", Config::default())
        .open()
        .unwrap()
}

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    mr: Mr<Vec<u8>>,
}

fn side() -> Side {
    let ctx = device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let mr = pd
        .reg_mr(
            vec![0u8; 4096],
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    Side { ctx, pd, cq, mr }
}

fn wait_wc(cq: &Cq) -> WorkCompletion {
    let mut wc = [WorkCompletion::default(); 1];
    let end = Instant::now() + T;
    while Instant::now() < end {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("no completion");
}

/// RC: listen, connect, a SEND each way with private data, disconnect from the client.
fn rc_round_trip(listen_at: SocketAddr, connect_to: impl Fn(SocketAddr) -> SocketAddr) {
    let s = side();
    let listener = RcListener::bind(&s.ctx, listen_at, 4).unwrap();
    let at = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let opts = RcOptions {
            param: Some(ConnParam {
                private_data: b"from server".to_vec(),
                responder_resources: 255,
                initiator_depth: 255,
                rnr_retry_count: 7,
                ..ConnParam::default()
            }),
            ..RcOptions::default()
        };
        let conn = listener.accept(&s.pd, &s.cq, &opts).unwrap();
        assert_eq!(&conn.private_data[..11], b"from client");
        conn.qp.post_recv(1, &[s.mr.sge(0, 64)]).unwrap();
        let wc = wait_wc(&s.cq);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len, 5);
        let mut got = [0u8; 5];
        assert!(s.mr.read(0, &mut got));
        assert_eq!(&got, b"hello");
        conn.wait_disconnected(T).unwrap();
    });
    let c = side();
    let opts = RcOptions {
        param: Some(ConnParam {
            private_data: b"from client".to_vec(),
            responder_resources: 255,
            initiator_depth: 255,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }),
        ..RcOptions::default()
    };
    let conn = connect_rc(&c.pd, &c.cq, connect_to(at), &opts).unwrap();
    assert_eq!(&conn.private_data[..11], b"from server");
    assert_eq!(conn.id().peer_addr().unwrap().port(), at.port());
    c.mr.write(0, b"hello");
    let sge = [c.mr.sge(0, 5)];
    conn.qp
        .post_send(&SendWr::new(9, SendOp::Send, &sge))
        .unwrap();
    assert_eq!(wait_wc(&c.cq).status, WcStatus::Success);
    conn.disconnect(T).unwrap();
    server.join().unwrap();
}

#[test]
fn rc_over_ipv4_loopback() {
    rc_round_trip("127.0.0.1:0".parse().unwrap(), |a| a);
}

#[test]
fn rc_with_a_wildcard_listener() {
    rc_round_trip("0.0.0.0:0".parse().unwrap(), |a| {
        SocketAddr::new([127, 0, 0, 1].into(), a.port())
    });
}

#[test]
fn rc_over_ipv6_loopback() {
    rc_round_trip("[::1]:0".parse().unwrap(), |a| a);
}

#[test]
fn connect_to_a_closed_port_is_rejected_at_once() {
    // A port nobody holds: bind and drop a UDP socket to find one.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = side();
    let started = Instant::now();
    let err = connect_rc(
        &c.pd,
        &c.cq,
        SocketAddr::new([127, 0, 0, 1].into(), port),
        &RcOptions::default(),
    )
    .unwrap_err();
    match err {
        CmError::Unexpected {
            kind: CmEventKind::Rejected,
            status: EventStatus::Rejected(r),
            ..
        } => assert_eq!(r, RejReason::INVALID_SERVICE_ID),
        e => panic!("{e}"),
    }
    // Not the CM's 4 s response timeout: ICMP made it fail (not a timing assertion on
    // speed, only that no retry cycle was needed).
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn a_second_listener_on_one_address_and_port_gets_addr_in_use() {
    let a = device();
    let b = device();
    let first = RcListener::bind(&a, "127.0.0.1:0".parse().unwrap(), 1).unwrap();
    let at = first.local_addr().unwrap();
    match RcListener::bind(&b, at, 1) {
        Err(CmError::Cm(softverbs_cm::CmError::AddrInUse)) => {}
        other => panic!("{other:?}"),
    }
    // Once the first is gone the port is free again.
    drop(first);
    RcListener::bind(&b, at, 1).unwrap();
}

#[test]
fn ud_service_resolution_and_a_datagram() {
    let s = side();
    let channel = EventChannel::new(&s.ctx).unwrap();
    let listener = CmId::new(&channel, PortSpace::Udp).unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    listener.listen(4).unwrap();
    let at = listener.local_addr().unwrap();

    let c = side();
    let cch = EventChannel::new(&c.ctx).unwrap();
    let id = CmId::new(&cch, PortSpace::Udp).unwrap();
    id.resolve_addr(None, at, T).unwrap();
    assert_eq!(
        cch.get_event_timeout(T).unwrap().kind(),
        CmEventKind::AddrResolved
    );
    id.resolve_route().unwrap();
    assert_eq!(
        cch.get_event_timeout(T).unwrap().kind(),
        CmEventKind::RouteResolved
    );
    let cqp = id.create_qp(&c.pd, &c.cq, QpCap::default()).unwrap();
    id.connect(Some(ConnParam {
        private_data: b"udp hello".to_vec(),
        ..ConnParam::default()
    }))
    .unwrap();

    let mut req = channel.get_event_timeout(T).unwrap();
    assert_eq!(req.kind(), CmEventKind::ConnectRequest);
    assert_eq!(&req.private_data()[..9], b"udp hello");
    let child = req.take_request().unwrap();
    let sqp = child.create_qp(&s.pd, &s.cq, QpCap::default()).unwrap();
    sqp.post_recv(1, &[s.mr.sge(0, 64)]).unwrap();
    child.accept(None).unwrap();

    let ev = cch.get_event_timeout(T).unwrap();
    assert_eq!(ev.kind(), CmEventKind::Established, "{ev:?}");
    let EventParam::Ud(ud) = ev.param().clone() else {
        panic!("{ev:?}")
    };
    assert_eq!(ud.qp_num, sqp.qpn());
    assert_eq!(ud.qkey, RDMA_UDP_QKEY);
    let ah = AddressHandle::from_addr(ud.ah.unwrap().dest);
    let sge = [c.mr.sge(0, 8)];
    let wr = SendWr::new(1, ah.send(ud.qp_num, ud.qkey, None), &sge);
    cqp.post_send(&wr).unwrap();
    let wc = wait_wc(&s.cq);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.byte_len, 8 + 40, "payload and GRH");
}

#[test]
fn multicast_join_reaches_three_receivers() {
    let group: std::net::IpAddr = "239.83.11.7".parse().unwrap();
    let receivers: Vec<(Side, EventChannel, CmId, std::sync::Arc<Qp>)> = (0..3)
        .map(|_| {
            let s = side();
            let ch = EventChannel::new(&s.ctx).unwrap();
            let id = CmId::new(&ch, PortSpace::Udp).unwrap();
            id.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let qp = id.create_qp(&s.pd, &s.cq, QpCap::default()).unwrap();
            qp.post_recv(1, &[s.mr.sge(0, 128)]).unwrap();
            id.join_multicast(group, false).unwrap();
            let ev = ch.get_event_timeout(T).unwrap();
            assert_eq!(ev.kind(), CmEventKind::MulticastJoin, "{ev:?}");
            (s, ch, id, qp)
        })
        .collect();
    let sender = side();
    let ch = EventChannel::new(&sender.ctx).unwrap();
    let id = CmId::new(&ch, PortSpace::Udp).unwrap();
    id.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let qp = id
        .create_qp(&sender.pd, &sender.cq, QpCap::default())
        .unwrap();
    id.join_multicast(group, true).unwrap();
    let ev = ch.get_event_timeout(T).unwrap();
    assert_eq!(ev.kind(), CmEventKind::MulticastJoin);
    let EventParam::Multicast { ud, group: at, .. } = ev.param().clone() else {
        panic!("{ev:?}")
    };
    assert_eq!(ud.qp_num, Qpn::MULTICAST);
    let sge = [sender.mr.sge(0, 16)];
    let wr = SendWr::new(
        1,
        AddressHandle::from_addr(at).send(ud.qp_num, ud.qkey, None),
        &sge,
    );
    qp.post_send(&wr).unwrap();
    for (s, _, _, _) in &receivers {
        let wc = wait_wc(&s.cq);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len, 16 + 40, "payload and GRH");
    }
}

/// IBA 11.6.3: a connected QP in RTR reports its first packet as Communication
/// Established (once), which the connection manager takes in place of a lost RTU.
#[test]
fn a_qp_in_rtr_reports_comm_established_once() {
    let a = side();
    let b = side();
    let qa = QpBuilder::new(&a.pd, &a.cq).build().unwrap();
    let qb = QpBuilder::new(&b.pd, &b.cq).build().unwrap();
    let access = InitAttr {
        access: AccessFlags::LOCAL_WRITE,
    };
    qa.to_init(access).unwrap();
    qb.to_init(access).unwrap();
    let rtr = |peer: &Context, qpn, psn| RtrAttr {
        remote: RemoteQp::from_gid(peer.gid(), qpn, psn),
        mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
    };
    qa.to_rtr(rtr(&b.ctx, qb.qpn(), 7)).unwrap();
    qa.to_rts(RtsAttr {
        sq_psn: 5,
        ..RtsAttr::default()
    })
    .unwrap();
    qb.to_rtr(rtr(&a.ctx, qa.qpn(), 5)).unwrap();
    for i in 0..2 {
        qb.post_recv(i, &[b.mr.sge(0, 64)]).unwrap();
    }
    let sge = [a.mr.sge(0, 8)];
    for i in 0..2 {
        qa.post_send(&SendWr::new(i, SendOp::Send, &sge)).unwrap();
        assert_eq!(wait_wc(&b.cq).status, WcStatus::Success);
    }
    let mut seen = Vec::new();
    while let Some(ev) = b.ctx.poll_async_event() {
        b.ctx.ack_async_event(&ev);
        seen.push(ev);
    }
    let est: Vec<_> = seen
        .iter()
        .filter(|e| matches!(e, AsyncEvent::CommEstablished(_)))
        .collect();
    assert_eq!(est, [&AsyncEvent::CommEstablished(qb.handle())], "{seen:?}");
}

/// The device's `cm_packet_life_time` (SOFTVERBS_CM_PACKET_LIFE_TIME) is what routes carry,
/// and so what the connection manager derives RC QPs' ACK timeouts from; Linux's 18 by
/// default.
#[test]
fn the_configured_packet_life_time_is_the_routes() {
    for (config, want) in [
        (Config::default(), 18),
        (
            Config {
                cm_packet_life_time: 10,
                ..Config::default()
            },
            10,
        ),
    ] {
        let ctx = Device::with_config("cm-plt", config).open().unwrap();
        let channel = EventChannel::new(&ctx).unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
        id.resolve_addr(None, "127.0.0.1:7471".parse().unwrap(), T)
            .unwrap();
        assert_eq!(
            channel.get_event_timeout(T).unwrap().kind(),
            CmEventKind::AddrResolved
        );
        id.resolve_route().unwrap();
        assert_eq!(
            channel.get_event_timeout(T).unwrap().kind(),
            CmEventKind::RouteResolved
        );
        assert_eq!(id.route().unwrap().packet_life_time, want);
    }
}

/// The first SEND after a connection comes up finds a receive when both sides posted one
/// in the `prepare` step (before the REQ / REP): no RNR NAK, whose timer the CM sets to
/// 655 ms (min_rnr_timer 0). Without it, a passive side that posts only after the accept
/// returned (here 100 ms later) draws an RNR NAK for that SEND.
#[test]
fn receives_posted_before_the_connection_meet_the_first_send() {
    for prepared in [true, false] {
        let s = side();
        let listener = RcListener::bind(&s.ctx, "127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let at = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (id, data) = listener.get_request(T).unwrap();
            let opts = RcOptions::default();
            let recv = |qp: &Qp| qp.post_recv(1, &[s.mr.sge(0, 64)]);
            let conn = if prepared {
                accept_request_with(id, data, &s.pd, &s.cq, &opts, recv).unwrap()
            } else {
                let conn = accept_request(id, data, &s.pd, &s.cq, &opts).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                recv(&conn.qp).unwrap();
                conn
            };
            assert_eq!(wait_wc(&s.cq).status, WcStatus::Success);
            conn.wait_disconnected(T).unwrap();
            s.ctx.counters().rnr_nak_sent
        });
        let c = side();
        let conn = connect_rc_with(&c.pd, &c.cq, at, &RcOptions::default(), |qp| {
            qp.post_recv(7, &[c.mr.sge(64, 64)])
        })
        .unwrap();
        let sge = [c.mr.sge(0, 8)];
        conn.qp
            .post_send(&SendWr::new(9, SendOp::Send, &sge))
            .unwrap();
        assert_eq!(wait_wc(&c.cq).status, WcStatus::Success);
        conn.disconnect(T).unwrap();
        let rnr_naks = server.join().unwrap();
        if prepared {
            assert_eq!(rnr_naks, 0, "the receive was there before the REP");
        } else {
            assert!(rnr_naks > 0, "a receive posted late draws an RNR NAK");
        }
    }
}

/// Address and route resolution through the kernel: the route's hop limit (the default
/// TTL for a destination of this host) and MTU (loopback's, capped by the device's) in
/// the path record; and a source address that is not this host's ends in ADDR_ERROR
/// with EADDRNOTAVAIL's status, the id back in ADDR_BOUND (bound to that source, as
/// Linux leaves an id whose resolution failed).
#[test]
fn resolution_reports_the_kernels_route_and_its_failures() {
    let ctx = device();
    let channel = EventChannel::new(&ctx).unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let next = |want: CmEventKind| {
        let ev = channel.get_event_timeout(T).expect("an event");
        assert_eq!(ev.kind(), want, "{:?}", ev.status());
        ev.status()
    };
    let dst: SocketAddr = "127.0.0.1:7174".parse().unwrap();
    // TEST-NET-1 (RFC 5737): never an address of this host.
    id.resolve_addr(Some("192.0.2.1".parse().unwrap()), dst, T)
        .unwrap();
    assert_eq!(
        next(CmEventKind::AddrError),
        EventStatus::Resolve(softverbs_cm::ResolveError::AddressNotAvailable)
    );
    assert_eq!(id.state().unwrap(), IdState::AddrBound);
    drop(id);
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, dst, T).unwrap();
    assert_eq!(next(CmEventKind::AddrResolved), EventStatus::Ok);
    id.resolve_route().unwrap();
    assert_eq!(next(CmEventKind::RouteResolved), EventStatus::Ok);
    let path = id.route().expect("a path record");
    let ttl: u8 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_default_ttl")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(path.hop_limit, ttl);
    // Loopback's MTU (65536) is above every IB MTU: the device's own (4096) is the cap.
    assert_eq!(path.mtu, softverbs_cm::IbMtu::Mtu4096);
    assert!(id.local_addr().unwrap().ip().is_loopback());
}

/// A SEND the peer received is never flushed by the peer's disconnect that follows at
/// once. The receiver spins on its CQ through a ping-pong, so it holds its ACKs back for
/// its answer (`ack_hold`); after the last SEND it has no answer and disconnects. Its ACK
/// goes to the sender's device socket, its DREQ to the sender's rendezvous socket: the
/// ACK must leave first, and the sender's device must read what waits on its device
/// socket before it acts on the DREQ, as a NIC's ACK precedes anything sent after it.
#[test]
fn a_send_received_just_before_the_peers_disconnect_completes_successfully() {
    const EXCHANGES: u64 = 200;
    let spin = |cq: &Cq| {
        let mut wc = [WorkCompletion::default(); 1];
        let end = Instant::now() + T;
        while cq.poll(&mut wc) == 0 {
            assert!(Instant::now() < end, "no completion");
        }
        wc[0]
    };
    for round in 0..5 {
        let s = side();
        let listener = RcListener::bind(&s.ctx, "127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let at = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (id, data) = listener.get_request(T).unwrap();
            let conn = accept_request_with(id, data, &s.pd, &s.cq, &RcOptions::default(), |qp| {
                qp.post_recv(0, &[s.mr.sge(64, 64)])
            })
            .unwrap();
            let sge = [s.mr.sge(0, 8)];
            let mut statuses = Vec::new();
            for i in 0..=EXCHANGES {
                conn.qp
                    .post_send(&SendWr::new(i, SendOp::Send, &sge))
                    .unwrap();
                // The send's completion and, but after the last, the answer.
                let wanted = if i == EXCHANGES { 1 } else { 2 };
                for _ in 0..wanted {
                    let wc = spin(&s.cq);
                    if wc.opcode == WcOpcode::Recv {
                        conn.qp.post_recv(0, &[s.mr.sge(64, 64)]).unwrap();
                    } else {
                        statuses.push(wc.status);
                    }
                }
            }
            conn.wait_disconnected(T).unwrap();
            statuses
        });
        let c = side();
        let conn = connect_rc_with(&c.pd, &c.cq, at, &RcOptions::default(), |qp| {
            qp.post_recv(7, &[c.mr.sge(0, 64)])
        })
        .unwrap();
        let sge = [c.mr.sge(128, 8)];
        for i in 0..=EXCHANGES {
            let wc = spin(&c.cq);
            assert_eq!(wc.status, WcStatus::Success, "round {round}");
            conn.qp.post_recv(7, &[c.mr.sge(0, 64)]).unwrap();
            if i < EXCHANGES {
                conn.qp
                    .post_send(&SendWr::new(i, SendOp::Send, &sge))
                    .unwrap();
                assert_eq!(spin(&c.cq).status, WcStatus::Success, "round {round}");
            }
        }
        conn.disconnect(T).unwrap();
        let statuses = server.join().unwrap();
        assert_eq!(statuses.len() as u64, EXCHANGES + 1);
        assert!(
            statuses.iter().all(|s| *s == WcStatus::Success),
            "round {round}: a SEND the peer received was flushed: {statuses:?}"
        );
    }
}
