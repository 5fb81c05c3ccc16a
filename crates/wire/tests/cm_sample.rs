//! The CM reference capture (`tests/data/cm-sample.pcap`, built for the project's CM
//! reference from the kernel's field tables and checked there with tshark): every
//! datagram in it must pass our QP1 checks, carry a good ICRC, parse as the CM message
//! it is, and come back byte for byte, ICRC included, when softverbs builds the same
//! message.

use softverbs_wire::cm::datagram::{self, CmDatagram, CM_DATAGRAM_LEN};
use softverbs_wire::cm::{AttributeId, CmMadRepr, CmMessage};
use softverbs_wire::icrc::IcrcContext;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

struct Frame {
    ctx: IcrcContext,
    udp_payload: Vec<u8>,
}

/// Classic pcap, Ethernet / IPv4 / UDP.
fn frames() -> Vec<Frame> {
    let pcap = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/cm-sample.pcap"
    ))
    .expect("read the capture");
    assert_eq!(&pcap[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "little-endian pcap");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let f = &pcap[at + 16..at + 16 + len];
        at += 16 + len;
        assert_eq!(&f[12..14], &[0x08, 0x00], "IPv4");
        let ip = &f[14..34];
        let udp = &f[34..42];
        let addr = |b: &[u8], port: &[u8]| {
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
                u16::from_be_bytes([port[0], port[1]]),
            )
        };
        out.push(Frame {
            ctx: IcrcContext {
                src: addr(&ip[12..16], &udp[0..2]),
                dst: addr(&ip[16..20], &udp[2..4]),
                ipv4_id: u16::from_be_bytes([ip[4], ip[5]]),
            },
            udp_payload: f[42..].to_vec(),
        });
    }
    out
}

#[test]
fn every_capture_datagram_checks_parses_and_rebuilds() {
    let frames = frames();
    let order = [
        AttributeId::Req,
        AttributeId::Rep,
        AttributeId::Rtu,
        AttributeId::Rej,
        AttributeId::Mra,
        AttributeId::Dreq,
        AttributeId::Drep,
        AttributeId::SidrReq,
        AttributeId::SidrRep,
    ];
    assert_eq!(frames.len(), order.len());
    for (frame, attribute) in frames.iter().zip(order) {
        let d = CmDatagram::new_checked(&frame.udp_payload[..])
            .unwrap_or_else(|e| panic!("{attribute:?}: {e}"));
        assert!(d.icrc_ok(&frame.ctx), "{attribute:?}: ICRC");
        let repr = CmMadRepr::parse(&d.mad()).unwrap();
        assert_eq!(repr.message.attribute_id(), attribute);
        let mut again = [0u8; CM_DATAGRAM_LEN];
        let n = datagram::emit(&repr, d.psn(), &frame.ctx, &mut again).unwrap();
        assert_eq!(again[..n], frame.udp_payload[..], "{attribute:?}");
    }
}

#[test]
fn the_capture_says_what_cm_md_says() {
    let frames = frames();
    let parse = |i: usize| {
        CmMadRepr::parse(
            &CmDatagram::new_checked(&frames[i].udp_payload[..])
                .unwrap()
                .mad(),
        )
        .unwrap()
    };
    let CmMessage::Req(req) = parse(0).message else {
        panic!("frame 1 is a REQ")
    };
    assert_eq!(req.local_comm_id, 0x1122_3344);
    assert_eq!(req.primary_path.flow_label, 0x12345);
    assert_eq!(req.primary_path.local_ack_timeout, 19);
    assert_eq!(&req.private_data[36..49], b"hello-private");
    let CmMessage::Rep(rep) = parse(1).message else {
        panic!("frame 2 is a REP")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(rep.target_ack_delay, 15);
    let CmMessage::Dreq(dreq) = parse(5).message else {
        panic!("frame 6 is a DREQ")
    };
    assert_eq!(dreq.remote_qpn, rep.local_qpn);
    let CmMessage::SidrRep(sidr) = parse(8).message else {
        panic!("frame 9 is a SIDR_REP")
    };
    assert_eq!(sidr.qkey, 0x0123_4567);
}
