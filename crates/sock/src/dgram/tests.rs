//! The datagram core's rules, one test each, and two cores meeting through a model network.

use std::net::SocketAddr;

use proptest::prelude::*;

use super::header::gid_of_ip;
use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const A: &str = "127.0.0.1:5001";
const B: &str = "127.0.0.1:5002";

/// A QP `qpn` on the device whose GID is derived from IP address `dev`.
fn local_qp(qpn: u32, dev: &str) -> LocalQp {
    LocalQp {
        qpn,
        gid: gid_of_ip(dev.parse().unwrap()),
    }
}

fn core(qpn: u32, dev: &str, sq: u32, rq: u32) -> DgramCore {
    DgramCore::new(
        local_qp(qpn, dev),
        DgramSizes {
            sq_size: sq,
            rq_size: rq,
        },
    )
}

/// Carries one datagram from `from` (sending to `to_addr`) to `to`, as the drivers would:
/// over UDP, or as a UD SEND (which must name `to`'s QP) into receive slot `slot`.
/// Returns the CTRL reply the receiver sends back, if any.
fn deliver(
    from: &mut DgramCore,
    from_addr: SocketAddr,
    to: &mut DgramCore,
    to_addr: SocketAddr,
    to_qp: LocalQp,
    data: &[u8],
    slot: u32,
) -> Option<Vec<u8>> {
    if !from.knows(to_addr) {
        assert!(from.add_dest(to_addr, from_addr));
    }
    match from.plan_send(to_addr, data.len()).expect("sendable") {
        SendPlan::Udp { header } => {
            let mut wire = header;
            wire.extend_from_slice(data);
            to.handle_udp(from_addr, &wire, |_| to_addr)
                .expect("valid")
                .reply
        }
        SendPlan::Ud {
            slot: sslot,
            header,
            route,
        } => {
            assert_eq!(route.qpn, to_qp.qpn);
            assert_eq!(route.gid, to_qp.gid);
            let mut wire = header;
            wire.extend_from_slice(data);
            assert_eq!(to.handle_ud(slot, &wire), UdVerdict::Queued);
            from.send_done(sslot);
            None
        }
    }
}

/// The rsocket UDP header alone (no payload, no device trailer): what an rdma-core peer sends.
fn header_bytes(op: UdpOp, qpn: u32, ip: &str) -> Vec<u8> {
    let mut wire = Vec::new();
    UdpHeader {
        op,
        qpn,
        addr: ip.parse().unwrap(),
    }
    .emit(&mut wire);
    wire
}

fn bytes_of(d: &Datagram) -> Vec<u8> {
    match &d.payload {
        Payload::Bytes(b) => b.clone(),
        Payload::Slot { .. } => panic!("a slot datagram"),
    }
}

#[test]
fn first_datagram_goes_over_udp_then_the_ctrl_reply_opens_the_ud_path() {
    let (qa, qb) = (local_qp(0x11, "127.83.0.1"), local_qp(0x22, "127.83.0.2"));
    let sizes = DgramSizes {
        sq_size: 4,
        rq_size: 4,
    };
    let (mut a, mut b) = (DgramCore::new(qa, sizes), DgramCore::new(qb, sizes));
    let reply = deliver(&mut a, addr(A), &mut b, addr(B), qb, b"hello", 0).expect("CTRL back");
    let d = b.pop().expect("queued");
    assert_eq!((d.src, bytes_of(&d)), (addr(A), b"hello".to_vec()));
    // The reply is CTRL with B's QPN and device.
    let (h, at) = UdpHeader::parse(&reply, addr(B)).unwrap();
    assert_eq!((h.op, h.qpn), (UdpOp::Ctrl, 0x22));
    assert_eq!(DeviceTrailer::parse(&reply[at..]).unwrap().gid, qb.gid);
    let out = a.handle_udp(addr(B), &reply, |_| unreachable!()).unwrap();
    assert_eq!(out, UdpOutcome::default());
    assert_eq!(
        a.route(addr(B)),
        Some(Route {
            gid: qb.gid,
            qpn: 0x22
        })
    );
    // Now UD: B sees A's socket address in the header.
    assert!(deliver(&mut a, addr(A), &mut b, addr(B), qb, b"again", 3).is_none());
    let d = b.pop().unwrap();
    assert_eq!(d.src, addr(A));
    assert_eq!(
        d.payload,
        Payload::Slot {
            slot: 3,
            offset: 8,
            len: 5
        }
    );
    // B does not know A's QP yet: its answer goes over UDP, and A's CTRL teaches it.
    let reply = deliver(&mut b, addr(B), &mut a, addr(A), qa, b"back", 0).expect("CTRL");
    b.handle_udp(addr(A), &reply, |_| unreachable!()).unwrap();
    assert_eq!(b.route(addr(A)).map(|r| r.qpn), Some(0x11));
    assert_eq!(bytes_of(&a.pop().unwrap()), b"back");
}

#[test]
fn a_ctrl_without_trailer_means_a_roce_peer_at_its_ip() {
    let mut a = core(1, "127.83.0.1", 2, 2);
    let ctrl = header_bytes(UdpOp::Ctrl, 0xabcdef, "10.1.2.3");
    let from = addr("10.1.2.3:7174");
    a.handle_udp(from, &ctrl, |_| addr("10.1.2.4:1")).unwrap();
    assert_eq!(
        a.route(from),
        Some(Route {
            gid: gid_of_ip("10.1.2.3".parse().unwrap()),
            qpn: 0xabcdef
        })
    );
    // And the destination was recorded with the source the driver named.
    match a.plan_send(from, 1).unwrap() {
        SendPlan::Ud { header, .. } => {
            assert_eq!(DsHeader::parse(&header).unwrap().0.src, addr("10.1.2.4:1"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn data_from_another_qp_forgets_the_route() {
    let mut a = core(1, "127.83.0.1", 2, 2);
    let ctrl = header_bytes(UdpOp::Ctrl, 5, "127.0.0.1");
    a.handle_udp(addr(B), &ctrl, |_| addr(A)).unwrap();
    assert!(a.route(addr(B)).is_some());
    let data = header_bytes(UdpOp::Data, 6, "127.0.0.1");
    let out = a.handle_udp(addr(B), &data, |_| addr(A)).unwrap();
    assert!(out.queued && out.reply.is_some());
    assert_eq!(a.route(addr(B)), None);
    assert!(matches!(a.plan_send(addr(B), 1), Ok(SendPlan::Udp { .. })));
    // An empty datagram is a datagram.
    assert!(a.pop().unwrap().payload.is_empty());
}

#[test]
fn send_slots_run_out_and_come_back() {
    let mut a = core(1, "127.83.0.1", 2, 2);
    let ctrl = header_bytes(UdpOp::Ctrl, 5, "127.0.0.1");
    a.handle_udp(addr(B), &ctrl, |_| addr(A)).unwrap();
    let slot = |p: SendPlan| match p {
        SendPlan::Ud { slot, .. } => slot,
        other => panic!("{other:?}"),
    };
    assert!(a.can_send() && a.all_sends_done());
    let s0 = slot(a.plan_send(addr(B), 10).unwrap());
    let s1 = slot(a.plan_send(addr(B), 10).unwrap());
    assert_ne!(s0, s1);
    assert_eq!(a.plan_send(addr(B), 10), Err(SendError::WouldBlock));
    assert!(!a.can_send());
    a.send_done(s1);
    a.send_done(s1); // twice: ignored
    a.send_done(99); // not a slot: ignored
    assert_eq!(slot(a.plan_send(addr(B), 10).unwrap()), s1);
    a.send_done(s0);
    a.send_done(s1);
    assert!(a.all_sends_done());
}

#[test]
fn too_long_unknown_and_sizes() {
    let mut a = core(1, "127.83.0.1", 2, 2);
    assert_eq!(a.plan_send(addr(B), 1), Err(SendError::UnknownDest));
    a.add_dest(addr(B), addr(A));
    assert_eq!(DgramCore::max_payload(addr(A)), 2040);
    assert!(a.plan_send(addr(B), 2040).is_ok());
    assert_eq!(
        a.plan_send(addr(B), 2041),
        Err(SendError::TooLong {
            len: 2041,
            max: 2040
        })
    );
    assert_eq!(DgramCore::max_payload(addr("[::1]:1")), 2024);
    // ds_set_qp_size: buffers bound the queues.
    let c = DgramConfig::default();
    assert_eq!(
        c.sizes(16384),
        DgramSizes {
            sq_size: 64,
            rq_size: 64
        }
    );
    let big = DgramConfig {
        sbuf_size: 1 << 20,
        rbuf_size: 1 << 20,
        ..c
    };
    assert_eq!(big.sizes(16384).sq_size, 384);
    assert_eq!(big.sizes(100).rq_size, 100);
    let tiny = DgramConfig { rbuf_size: 10, ..c };
    assert_eq!(tiny.sizes(16384).rq_size, 1);
}

#[test]
fn a_full_queue_drops_and_bad_headers_are_counted() {
    let mut a = core(1, "127.83.0.1", 2, 1);
    let mut ud = Vec::new();
    DsHeader { src: addr(B) }.emit(&mut ud);
    ud.extend_from_slice(b"x");
    assert_eq!(a.handle_ud(0, &ud), UdVerdict::Queued);
    assert!(!a.has_room() && a.readable());
    assert_eq!(a.handle_ud(1, &ud), UdVerdict::Repost);
    assert_eq!(a.handle_ud(1, b"\x04\x09"), UdVerdict::Repost);
    // DATA over UDP while full: still answered, not queued.
    let data = header_bytes(UdpOp::Data, 6, "127.0.0.1");
    let out = a.handle_udp(addr(B), &data, |_| addr(A)).unwrap();
    assert!(out.reply.is_some() && !out.queued);
    assert!(a.handle_udp(addr(B), b"short", |_| addr(A)).is_err());
    assert_eq!(
        a.stats(),
        DgramStats {
            bad_udp: 1,
            bad_ud: 1,
            dropped_full: 2
        }
    );
    assert_eq!(a.peek().map(|d| d.src), Some(addr(B)));
    assert!(a.pop().is_some() && a.pop().is_none() && !a.readable());
}

#[test]
fn new_peers_stop_at_the_limit() {
    let mut a = core(1, "127.83.0.1", 2, 2);
    let ctrl = header_bytes(UdpOp::Ctrl, 5, "127.0.0.1");
    for port in 0..MAX_DESTS as u16 {
        let from = SocketAddr::from(([127, 0, 0, 1], 10000 + port));
        a.handle_udp(from, &ctrl, |_| addr(A)).unwrap();
    }
    assert_eq!(
        a.handle_udp(addr("127.0.0.1:9"), &ctrl, |_| addr(A)),
        Err(UdpError::TooManyPeers)
    );
    assert!(!a.add_dest(addr("127.0.0.1:9"), addr(A)));
    // A known one still works.
    assert!(a
        .handle_udp(addr("127.0.0.1:10000"), &ctrl, |_| addr(A))
        .is_ok());
}

proptest! {
    /// Two cores exchange random datagrams both ways over a network that loses some UDP
    /// datagrams (CTRL replies included): every datagram that arrives is whole and names
    /// its sender, and once a CTRL gets through the UD path is used.
    #[test]
    fn datagrams_arrive_whole_over_a_lossy_start(
        msgs in proptest::collection::vec((any::<bool>(), 0usize..2041, any::<bool>()), 1..40)
    ) {
        let qa = local_qp(0x11, "127.83.0.1");
        let qb = local_qp(0x22, "127.83.0.2");
        let sizes = DgramSizes { sq_size: 8, rq_size: 64 };
        let (mut a, mut b) = (DgramCore::new(qa, sizes), DgramCore::new(qb, sizes));
        for (i, (a_to_b, len, lose)) in msgs.into_iter().enumerate() {
            let (from, from_addr, to, to_addr, to_qp) = if a_to_b {
                (&mut a, addr(A), &mut b, addr(B), qb)
            } else {
                (&mut b, addr(B), &mut a, addr(A), qa)
            };
            let data: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
            if !from.knows(to_addr) {
                from.add_dest(to_addr, from_addr);
            }
            let via_ud = from.route(to_addr).is_some();
            if lose && !via_ud {
                // The UDP datagram is lost: nothing arrives, nothing is learned.
                let _ = from.plan_send(to_addr, len).unwrap();
                continue;
            }
            let reply = deliver(from, from_addr, to, to_addr, to_qp, &data, i as u32);
            let got = to.pop().expect("arrived");
            prop_assert_eq!(got.src, from_addr);
            match got.payload {
                Payload::Bytes(bytes) => prop_assert_eq!(bytes, data),
                Payload::Slot { slot, offset, len: n } => {
                    prop_assert!(via_ud);
                    prop_assert_eq!((slot, offset, n), (i as u32, 8, len));
                }
            }
            if let Some(reply) = reply {
                if !lose {
                    from.handle_udp(to_addr, &reply, |_| unreachable!()).unwrap();
                    prop_assert_eq!(from.route(to_addr).map(|r| r.qpn), Some(to_qp.qpn));
                }
            }
        }
    }
}
