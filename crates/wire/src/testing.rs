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
