//! Hand-made CM datagrams into a cm: what it refuses and how (REJ reasons, SIDR
//! statuses, drops), and the duplicate and stale rules for messages that do not fit
//! its connections (CM.md 2.4, 3.4, 4.3). No network: one cm, direct calls.

use softverbs_cm::*;
use softverbs_wire::cm::datagram::{self, CmDatagram, CM_DATAGRAM_LEN};
use softverbs_wire::cm::*;
use softverbs_wire::icrc::IcrcContext;
use std::net::SocketAddr;
use std::time::Duration;

const SERVER: &str = "10.0.0.2:4791";
const CLIENT: &str = "10.0.0.1:4791";
const T0: Instant = Instant::ZERO;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn cm_at(device: &str) -> Cm {
    let d = addr(device);
    Cm::new(CmConfig::new(d, CmConfig::guid_for(d), 42))
}

/// A listening server cm (TCP port space, the given address).
fn server(listen_on: &str, options: IdOptions) -> (Cm, CmIdHandle) {
    let mut cm = cm_at(SERVER);
    let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    cm.set_options(id, options).unwrap();
    if let Reservation::Needed(_) = cm.bind_addr(id, addr(listen_on)).unwrap() {
        cm.complete_reservation(id, true).unwrap();
    }
    assert_eq!(cm.listen(id, 0).unwrap(), Reservation::NotNeeded);
    (cm, id)
}

/// The REQ a real client cm sends to `service`.
fn client_req(service: &str) -> CmMadRepr {
    let mut c = cm_at(CLIENT);
    let id = c.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    c.resolve_addr(T0, id, None, addr(service), Duration::from_secs(1))
        .unwrap();
    let Some(DriverRequest::ResolveAddr { token, .. }) = c.poll_request() else {
        panic!("resolve request")
    };
    let answer = ResolvedAddr {
        src_ip: addr(CLIENT).ip(),
        mtu: IbMtu::Mtu4096,
        hop_limit: 64,
    };
    c.handle_addr_resolved(T0, token, Ok(answer));
    c.resolve_route(id).unwrap();
    let p = ConnParam {
        qp_num: Some(Qpn::new(0x42)),
        responder_resources: 4,
        initiator_depth: 2,
        retry_count: 6,
        rnr_retry_count: 5,
        ..ConnParam::default()
    };
    c.connect(T0, id, Some(p)).unwrap();
    let mut buf = [0u8; 512];
    let tx = c.poll_transmit(&mut buf).unwrap();
    assert_eq!(tx.dst, addr(service));
    CmMadRepr::parse(&CmDatagram::new_checked(&buf[..tx.len]).unwrap().mad()).unwrap()
}

fn datagram(mad: &CmMadRepr, src: &str, dst: &str) -> Vec<u8> {
    let mut buf = vec![0u8; CM_DATAGRAM_LEN];
    let ctx = IcrcContext::new(addr(src), addr(dst));
    datagram::emit(mad, softverbs_wire::Psn::new(0), &ctx, &mut buf).unwrap();
    buf
}

/// Every message `cm` sends now, with its destination.
fn sent(cm: &mut Cm) -> Vec<(SocketAddr, CmMessage)> {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Some(tx) = cm.poll_transmit(&mut buf) {
        let d = CmDatagram::new_checked(&buf[..tx.len]).unwrap();
        out.push((tx.dst, CmMadRepr::parse(&d.mad()).unwrap().message));
    }
    out
}

fn rej_reason(out: &[(SocketAddr, CmMessage)]) -> Option<RejReason> {
    out.iter().find_map(|(_, m)| match m {
        CmMessage::Rej(r) => Some(r.reason),
        _ => None,
    })
}

fn with_req(mad: &CmMadRepr, f: impl FnOnce(&mut ReqRepr)) -> CmMadRepr {
    let mut mad = mad.clone();
    let CmMessage::Req(r) = &mut mad.message else {
        panic!("a REQ")
    };
    f(r);
    mad
}

fn events(cm: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

#[test]
fn a_specific_listener_takes_only_its_address() {
    let (mut cm, _) = server("10.0.0.2:7174", IdOptions::default());
    let req = client_req("10.0.0.2:7174");
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr("10.0.0.2:7174"),
        &datagram(&req, CLIENT, "10.0.0.2:7174"),
    );
    assert_eq!(events(&mut cm).len(), 1);
    // The same request naming 10.0.0.3 in its rdma_cm header: REJ 28 (CM.md 4.3).
    let other = with_req(&req, |r| {
        r.local_comm_id ^= 1;
        r.local_qpn = Qpn::new(0x43);
        r.private_data[32..36].copy_from_slice(&[10, 0, 0, 3]);
    });
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&other, CLIENT, SERVER),
    );
    assert_eq!(
        rej_reason(&sent(&mut cm)),
        Some(RejReason::CONSUMER_DEFINED)
    );
    assert!(events(&mut cm).is_empty());
}

#[test]
fn an_af_only_ipv6_wildcard_refuses_ipv4() {
    let req = client_req("10.0.0.2:7174");
    let (mut dual, _) = server("[::]:7174", IdOptions::default());
    dual.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&req, CLIENT, SERVER),
    );
    assert_eq!(
        events(&mut dual).len(),
        1,
        "a dual-stack wildcard takes IPv4"
    );
    let afonly = IdOptions {
        afonly: true,
        ..IdOptions::default()
    };
    let (mut v6only, _) = server("[::]:7174", afonly);
    v6only.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&req, CLIENT, SERVER),
    );
    assert_eq!(
        rej_reason(&sent(&mut v6only)),
        Some(RejReason::CONSUMER_DEFINED)
    );
}

#[test]
fn requests_rdma_cm_cannot_take() {
    let req = client_req("10.0.0.2:7174");
    type Patch = Box<dyn Fn(&mut ReqRepr)>;
    let cases: [(&str, Patch, RejReason); 6] = [
        (
            "MTU code 0",
            Box::new(|r| r.path_mtu = 0),
            RejReason::INVALID_MTU,
        ),
        (
            "MTU code 6",
            Box::new(|r| r.path_mtu = 6),
            RejReason::INVALID_MTU,
        ),
        (
            "UC",
            Box::new(|r| r.transport_service_type = 1),
            RejReason::CONSUMER_DEFINED,
        ),
        (
            "XRC",
            Box::new(|r| r.extended_transport_type = 1),
            RejReason::CONSUMER_DEFINED,
        ),
        (
            "header version 1",
            Box::new(|r| r.private_data[0] = 1),
            RejReason::CONSUMER_DEFINED,
        ),
        (
            "not an rdma_cm service ID",
            Box::new(|r| r.service_id |= 1 << 40),
            RejReason::INVALID_SERVICE_ID,
        ),
    ];
    for (what, patch, reason) in cases {
        let (mut cm, _) = server("0.0.0.0:7174", IdOptions::default());
        let bad = with_req(&req, |r| patch(r));
        cm.handle_datagram(
            T0,
            addr(CLIENT),
            addr(SERVER),
            &datagram(&bad, CLIENT, SERVER),
        );
        let out = sent(&mut cm);
        assert_eq!(rej_reason(&out), Some(reason), "{what}");
        assert_eq!(
            out[0].0,
            addr(CLIENT),
            "{what}: the REJ goes to the requester"
        );
        assert!(events(&mut cm).is_empty(), "{what}");
        assert_eq!(cm.connection_count(), 0, "{what}");
    }
}

#[test]
fn what_is_dropped_without_an_answer() {
    let (mut cm, _) = server("0.0.0.0:7174", IdOptions::default());
    let req = client_req("10.0.0.2:7174");
    let good = datagram(&req, CLIENT, SERVER);
    // A bad ICRC (computed for another source).
    let mut bad_icrc = datagram(&req, "10.0.0.9:4791", SERVER);
    cm.handle_datagram(T0, addr(CLIENT), addr(SERVER), &bad_icrc);
    // A MAD of another class (PerfMgmt), with a good ICRC.
    bad_icrc[20 + 1] = 0x04;
    let ctx = IcrcContext::new(addr(CLIENT), addr(SERVER));
    softverbs_wire::icrc::fill(&ctx, &mut bad_icrc).unwrap();
    cm.handle_datagram(T0, addr(CLIENT), addr(SERVER), &bad_icrc);
    // Truncated, and not to QP1.
    cm.handle_datagram(T0, addr(CLIENT), addr(SERVER), &good[..100]);
    let mut other_qp = good.clone();
    other_qp[7] = 2;
    cm.handle_datagram(T0, addr(CLIENT), addr(SERVER), &other_qp);
    // RTU, DREP, MRA and REJ for no connection.
    for m in [
        CmMessage::Rtu(RtuRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![],
        }),
        CmMessage::Drep(DrepRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: vec![],
        }),
        CmMessage::Mra(MraRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: MraTarget::Req,
            service_timeout: 24,
            private_data: vec![],
        }),
        CmMessage::Rej(RejRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: RejectedMessage::Rep,
            reason: RejReason::CONSUMER_DEFINED,
            ari: vec![],
            private_data: vec![],
        }),
    ] {
        let mad = CmMadRepr {
            transaction_id: 9,
            attribute_modifier: 0,
            message: m,
        };
        cm.handle_datagram(
            T0,
            addr(CLIENT),
            addr(SERVER),
            &datagram(&mad, CLIENT, SERVER),
        );
    }
    assert!(sent(&mut cm).is_empty());
    assert!(events(&mut cm).is_empty());
    let n = cm.counters();
    assert_eq!(
        (
            n.drop_icrc,
            n.drop_not_cm,
            n.drop_malformed,
            n.drop_unmatched
        ),
        (1, 1, 2, 4),
        "{n:?}"
    );
    // With the ICRC check at CountOnly a bad ICRC is counted and the REQ taken.
    let mut config = cm.config().clone();
    config.icrc = IcrcCheck::CountOnly;
    let mut lax = Cm::new(config);
    let id = lax.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    let r = lax.bind_addr(id, addr("0.0.0.0:7174")).unwrap();
    assert_eq!(r, Reservation::Needed(addr("0.0.0.0:7174")));
    lax.complete_reservation(id, true).unwrap();
    assert_eq!(lax.listen(id, 0).unwrap(), Reservation::NotNeeded);
    let foreign = datagram(&req, "10.0.0.9:4791", SERVER);
    lax.handle_datagram(T0, addr(CLIENT), addr(SERVER), &foreign);
    assert_eq!(lax.counters().icrc_mismatch_accepted, 1);
    assert_eq!(events(&mut lax).len(), 1);
}

#[test]
fn a_dreq_for_no_connection_is_answered_and_one_for_another_qp_ignored() {
    let (mut cm, _) = server("0.0.0.0:7174", IdOptions::default());
    let dreq = CmMadRepr {
        transaction_id: 0x77,
        attribute_modifier: 0,
        message: CmMessage::Dreq(DreqRepr {
            local_comm_id: 0xaaaa,
            remote_comm_id: 0xbbbb,
            remote_qpn: Qpn::new(3),
            private_data: vec![],
        }),
    };
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&dreq, CLIENT, SERVER),
    );
    let out = sent(&mut cm);
    let [(dst, CmMessage::Drep(drep))] = &out[..] else {
        panic!("one DREP: {out:?}")
    };
    assert_eq!(*dst, addr(CLIENT));
    assert_eq!((drep.local_comm_id, drep.remote_comm_id), (0xbbbb, 0xaaaa));

    // An accepted connection ignores a DREQ naming a QP that is not its own, and
    // one from an address that is not its peer's.
    let req = client_req("10.0.0.2:7174");
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&req, CLIENT, SERVER),
    );
    let child = events(&mut cm)[0].id;
    let p = ConnParam {
        qp_num: Some(Qpn::new(0x99)),
        ..ConnParam::default()
    };
    cm.accept(T0, child, Some(p)).unwrap();
    let out = sent(&mut cm);
    let CmMessage::Rep(rep) = &out[0].1 else {
        panic!("a REP")
    };
    let CmMessage::Req(r) = &req.message else {
        unreachable!()
    };
    let dreq_for = |qpn: u32| CmMadRepr {
        transaction_id: 0x78,
        attribute_modifier: 0,
        message: CmMessage::Dreq(DreqRepr {
            local_comm_id: r.local_comm_id,
            remote_comm_id: rep.local_comm_id,
            remote_qpn: Qpn::new(qpn),
            private_data: vec![],
        }),
    };
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&dreq_for(0x98), CLIENT, SERVER),
    );
    cm.handle_datagram(
        T0,
        addr("10.0.0.7:4791"),
        addr(SERVER),
        &datagram(&dreq_for(0x99), "10.0.0.7:4791", SERVER),
    );
    // Nor does a REJ from elsewhere tear it down.
    let rej = CmMadRepr {
        transaction_id: 0x79,
        attribute_modifier: 0,
        message: CmMessage::Rej(RejRepr {
            local_comm_id: r.local_comm_id,
            remote_comm_id: rep.local_comm_id,
            message_rejected: RejectedMessage::Rep,
            reason: RejReason::CONSUMER_DEFINED,
            ari: vec![],
            private_data: vec![],
        }),
    };
    cm.handle_datagram(
        T0,
        addr("10.0.0.7:4791"),
        addr(SERVER),
        &datagram(&rej, "10.0.0.7:4791", SERVER),
    );
    assert!(sent(&mut cm).is_empty());
    assert!(events(&mut cm).is_empty());
    assert_eq!(cm.counters().drop_wrong_source, 2);
    // The right one is taken: DISCONNECTED (the RTU never came: CM.md 3.3.7).
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&dreq_for(0x99), CLIENT, SERVER),
    );
    let e = events(&mut cm);
    assert_eq!(e[0].kind, CmEventKind::Disconnected);
    cm.disconnect(T0, child).unwrap();
    assert!(matches!(sent(&mut cm)[..], [(_, CmMessage::Drep(_))]));
}

#[test]
fn private_data_limits_and_wrong_states() {
    let mut cm = cm_at(CLIENT);
    let id = cm.create_id(PortSpace::Tcp, QpType::Rc).unwrap();
    assert!(matches!(
        cm.connect(T0, id, None),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(
        cm.accept(T0, id, None),
        Err(CmError::InvalidState { .. })
    ));
    assert!(matches!(
        cm.disconnect(T0, id),
        Err(CmError::InvalidState { .. })
    ));
    assert!(cm.resolve_route(id).is_err());
    assert!(cm.init_qp_attr(id, QpState::Rtr).is_err());
    assert_eq!(
        cm.create_id(PortSpace::Ipoib, QpType::Ud),
        Err(CmError::Unsupported("RDMA_PS_IPOIB needs an IPoIB device"))
    );
    assert!(cm.create_id(PortSpace::Tcp, QpType::Ud).is_err());
    cm.resolve_addr(T0, id, None, addr("10.0.0.2:7174"), Duration::from_secs(1))
        .unwrap();
    let Some(DriverRequest::ResolveAddr { token, .. }) = cm.poll_request() else {
        panic!()
    };
    let answer = ResolvedAddr {
        src_ip: addr(CLIENT).ip(),
        mtu: IbMtu::Mtu1024,
        hop_limit: 64,
    };
    cm.handle_addr_resolved(T0, token, Ok(answer));
    cm.resolve_route(id).unwrap();
    let too_long = ConnParam {
        private_data: vec![0; REQ_USER_DATA_LEN + 1],
        ..ConnParam::default()
    };
    assert_eq!(
        cm.connect(T0, id, Some(too_long)),
        Err(CmError::PrivateDataTooLong { max: 56, len: 57 })
    );
    let greedy = ConnParam {
        responder_resources: 200,
        ..ConnParam::default()
    };
    assert!(matches!(
        cm.connect(T0, id, Some(greedy)),
        Err(CmError::InvalidArgument(_))
    ));
    // Nothing was sent by the refused calls; a stale handle names nothing.
    assert!(sent(&mut cm).is_empty());
    cm.destroy_id(T0, id).unwrap();
    assert_eq!(cm.state(id), Err(CmError::UnknownId));
    assert_eq!(cm.destroy_id(T0, id), Err(CmError::UnknownId));
}

#[test]
fn init_qp_attr_values() {
    // What rdma_init_qp_attr hands out on the passive side right after the request
    // (rping -q moves its own QP with these before accepting; CM.md 3.6).
    let (mut cm, _) = server("0.0.0.0:7174", IdOptions::default());
    let req = client_req("10.0.0.2:7174");
    cm.handle_datagram(
        T0,
        addr(CLIENT),
        addr(SERVER),
        &datagram(&req, CLIENT, SERVER),
    );
    let child = events(&mut cm)[0].id;
    let CmMessage::Req(r) = &req.message else {
        unreachable!()
    };
    let init = cm.init_qp_attr(child, QpState::Init).unwrap();
    assert_eq!(
        init.mask,
        QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT
    );
    // The client issues up to 2 READs: this side accepts them, so remote read and
    // atomics are on.
    assert_eq!(
        init.access_flags,
        ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
    );
    let rtr = cm.init_qp_attr(child, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qpn, Qpn::new(0x42));
    assert_eq!(rtr.path_mtu, IbMtu::Mtu4096);
    assert_eq!(rtr.ah.unwrap().dest, addr(CLIENT));
    assert_eq!(rtr.ah.unwrap().hop_limit, 64);
    assert_eq!(rtr.max_dest_rd_atomic, r.initiator_depth);
    let rts = cm.init_qp_attr(child, QpState::Rts).unwrap();
    assert_eq!(rts.sq_psn, r.starting_psn);
    assert_eq!(rts.timeout, r.primary_path.local_ack_timeout);
    assert_eq!((rts.retry_cnt, rts.rnr_retry), (6, 5));
    assert_eq!((rtr.max_dest_rd_atomic, rts.max_rd_atomic), (2, 4));
    assert_eq!(rts.max_rd_atomic, r.responder_resources);
    assert_eq!(
        rts.mask,
        QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC
    );
    // The REQ the client cm built says what CM.md 2.2 says rdma_cm puts there.
    assert_eq!(
        (
            r.remote_cm_response_timeout,
            r.local_cm_response_timeout,
            r.max_cm_retries
        ),
        (20, 20, 15)
    );
    assert_eq!(
        (r.pkey, r.primary_path.local_lid, r.primary_path.remote_lid),
        (0xffff, 0xffff, 0xffff)
    );
    assert_eq!(r.primary_path.local_ack_timeout, 19);
    assert_eq!(r.primary_path.local_gid, Gid::from_ip(addr(CLIENT).ip()));
    assert!(!r.primary_path.subnet_local);
}
