//! Checks shared by the property tests and the fuzz target (not part of the stable API).

use crate::opcode::HeaderSet;
use crate::packet::{RocePacket, ICRC_LEN};

/// Calls every accessor of a packet the checked constructor accepted, and asserts what
/// must hold for any such packet: the opcode row agrees with the opcode, each extension
/// header is present exactly when the row says so, and header, payload, pad and ICRC add
/// up to the packet's length. Panics only on a broken invariant.
pub fn exercise_accessors(packet: &RocePacket<&[u8]>) {
    let info = packet.info();
    assert_eq!(packet.opcode(), info.opcode);
    let bth = packet.bth();
    let _ = (
        bth.opcode(),
        bth.solicited(),
        bth.mig_req(),
        bth.pad_count(),
        bth.tver(),
        bth.pkey(),
        bth.fecn(),
        bth.becn(),
        bth.dest_qp(),
        bth.ack_req(),
        bth.psn(),
    );
    let h = info.headers;
    assert_eq!(packet.deth().is_some(), h.contains(HeaderSet::DETH));
    assert_eq!(packet.reth().is_some(), h.contains(HeaderSet::RETH));
    assert_eq!(
        packet.atomic_eth().is_some(),
        h.contains(HeaderSet::ATOMIC_ETH)
    );
    assert_eq!(packet.aeth().is_some(), h.contains(HeaderSet::AETH));
    assert_eq!(
        packet.atomic_ack_eth().is_some(),
        h.contains(HeaderSet::ATOMIC_ACK_ETH)
    );
    assert_eq!(packet.immdt().is_some(), h.contains(HeaderSet::IMMDT));
    assert_eq!(packet.ieth().is_some(), h.contains(HeaderSet::IETH));
    if let Some(x) = packet.deth() {
        let _ = (x.qkey(), x.src_qp());
    }
    if let Some(x) = packet.reth() {
        let _ = (x.va(), x.rkey(), x.dma_len());
    }
    if let Some(x) = packet.atomic_eth() {
        let _ = (x.va(), x.rkey(), x.swap_add(), x.compare());
    }
    if let Some(x) = packet.aeth() {
        let _ = (x.syndrome(), x.msn());
    }
    if let Some(x) = packet.atomic_ack_eth() {
        let _ = x.orig();
    }
    if let Some(x) = packet.immdt() {
        let _ = x.imm();
    }
    if let Some(x) = packet.ieth() {
        let _ = x.rkey();
    }
    let _ = packet.icrc();
    assert_eq!(
        packet.header_len() + packet.payload().len() + usize::from(bth.pad_count()) + ICRC_LEN,
        packet.as_bytes().len()
    );
}

/// Calls every accessor of the CM message view that a MAD's attribute ID selects (any
/// 232-byte body fits every view), and of the datagram and rdma_cm header views when
/// the bytes allow them. Panics only on a broken invariant.
pub fn exercise_cm_accessors(mad: &crate::cm::mad::Mad<&[u8]>) {
    use crate::cm::*;
    let _ = (
        mad.base_version(),
        mad.mgmt_class(),
        mad.class_version(),
        mad.method(),
        mad.status(),
        mad.class_specific(),
        mad.transaction_id(),
        mad.attribute_id(),
        mad.reserved(),
        mad.attribute_modifier(),
    );
    let body = mad.message();
    assert_eq!(body.len(), mad::CM_MESSAGE_LEN);
    let req = Req::new_checked(body).expect("a MAD body holds a REQ");
    let _ = ReqRepr::parse(&req);
    let rep = Rep::new_checked(body).expect("a MAD body holds a REP");
    let _ = RepRepr::parse(&rep);
    let _ = MraRepr::parse(&Mra::new_checked(body).expect("MRA"));
    let _ = RejRepr::parse(&Rej::new_checked(body).expect("REJ"));
    let _ = RtuRepr::parse(&Rtu::new_checked(body).expect("RTU"));
    let _ = DreqRepr::parse(&Dreq::new_checked(body).expect("DREQ"));
    let _ = DrepRepr::parse(&Drep::new_checked(body).expect("DREP"));
    let sidr_req = SidrReq::new_checked(body).expect("SIDR_REQ");
    let _ = SidrReqRepr::parse(&sidr_req);
    let _ = SidrRepRepr::parse(&SidrRep::new_checked(body).expect("SIDR_REP"));
    for private in [req.private_data(), sidr_req.private_data()] {
        let h = CmaHeader::new_checked(private).expect("REQ private data holds the header");
        let _ = (
            h.version(),
            h.ip_version(),
            h.src_port(),
            h.src_field(),
            h.dst_field(),
        );
        let _ = CmaHeaderRepr::parse(&h);
    }
}
