//! Property tests of the packet layer: emit/parse round trips for every opcode, no
//! panics on arbitrary or mutated bytes, and the ICRC's coverage.

mod common;

use common::Case;
use proptest::prelude::*;
use proptest::sample::select;
use softverbs_wire::headers::atomic_ack_eth::AtomicAckEthRepr;
use softverbs_wire::headers::atomic_eth::AtomicEthRepr;
use softverbs_wire::headers::deth::DethRepr;
use softverbs_wire::headers::reth::RethRepr;
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::opcode::{HeaderSet, OPCODE_TABLE};
use softverbs_wire::packet::{finish, BTH_LEN, ICRC_LEN};
use softverbs_wire::{
    AethRepr, AethSyndrome, BthRepr, NakCode, PacketRepr, Psn, Qkey, Qpn, Rkey, RocePacket,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

fn arb_syndrome() -> impl Strategy<Value = AethSyndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| AethSyndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| AethSyndrome::RnrNak { timer }),
        select(vec![
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ])
        .prop_map(AethSyndrome::Nak),
    ]
}

fn arb_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<[u8; 16]>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
    ]
}

fn arb_ctx() -> impl Strategy<Value = IcrcContext> {
    (arb_ip(), arb_ip(), any::<u16>(), any::<u16>(), any::<u16>()).prop_map(
        |(s, d, sport, dport, ipv4_id)| IcrcContext {
            src: SocketAddr::new(s, sport),
            dst: SocketAddr::new(d, dport),
            ipv4_id,
        },
    )
}

fn arb_bth() -> impl Strategy<Value = (bool, bool, u16, bool, bool, u32, bool, u32)> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        0u32..1 << 24,
        any::<bool>(),
        0u32..1 << 24,
    )
}

#[allow(clippy::type_complexity)]
fn arb_headers(
) -> impl Strategy<Value = (DethRepr, RethRepr, AtomicEthRepr, AethRepr, u64, u32, u32)> {
    (
        (any::<u32>(), 0u32..1 << 24).prop_map(|(q, s)| DethRepr {
            qkey: Qkey(q),
            src_qp: Qpn::new(s),
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, k, len)| RethRepr {
            va,
            rkey: Rkey(k),
            dma_len: len,
        }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(va, k, s, c)| {
            AtomicEthRepr {
                va,
                rkey: Rkey(k),
                swap_add: s,
                compare: c,
            }
        }),
        (arb_syndrome(), 0u32..1 << 24).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn }),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
}

/// Any valid packet of any opcode: the headers its opcode calls for, any field
/// values, a payload of any length (none where the opcode carries none).
fn arb_case() -> impl Strategy<Value = Case> {
    (
        0..OPCODE_TABLE.len(),
        arb_bth(),
        arb_headers(),
        prop::collection::vec(any::<u8>(), 0..600),
        arb_ctx(),
    )
        .prop_map(|(row, bth, hdr, mut payload, ctx)| {
            let info = &OPCODE_TABLE[row];
            let (se, m, pkey, fecn, becn, qp, a, psn) = bth;
            let (deth, reth, atomic, aeth, orig, imm, ieth) = hdr;
            if !info.has_payload {
                payload.clear();
            }
            let h = info.headers;
            Case {
                label: format!("{} with {} payload bytes", info.name, payload.len()),
                info,
                ctx,
                src_ip: ctx.src.ip(),
                dst_ip: ctx.dst.ip(),
                bth: BthRepr {
                    solicited: se,
                    mig_req: m,
                    pkey,
                    fecn,
                    becn,
                    ack_req: a,
                    ..BthRepr::new(info.opcode, Qpn::new(qp), Psn::new(psn))
                },
                deth: h.contains(HeaderSet::DETH).then_some(deth),
                reth: h.contains(HeaderSet::RETH).then_some(reth),
                atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then_some(atomic),
                aeth: h.contains(HeaderSet::AETH).then_some(aeth),
                atomic_ack_eth: h
                    .contains(HeaderSet::ATOMIC_ACK_ETH)
                    .then_some(AtomicAckEthRepr { orig }),
                immdt: h.contains(HeaderSet::IMMDT).then_some(imm),
                ieth: h.contains(HeaderSet::IETH).then_some(Rkey(ieth)),
                payload,
            }
        })
}

/// Calls everything that reads a packet; panics only on a broken invariant.
fn exercise(bytes: &[u8]) {
    let ctx = IcrcContext::new(
        "192.0.2.1:49152".parse().unwrap(),
        "192.0.2.2:4791".parse().unwrap(),
    );
    let _ = icrc::compute(&ctx, bytes);
    let _ = icrc::verify(&ctx, bytes);
    let Ok(packet) = RocePacket::new_checked(bytes) else {
        return;
    };
    softverbs_wire::testing::exercise_accessors(&packet);
    assert_eq!(packet.as_bytes(), bytes);
    let Ok(repr) = PacketRepr::parse(&packet) else {
        return;
    };
    // Whatever parses re-emits to a packet that parses to the same fields.
    assert_eq!(repr.buffer_len(), bytes.len());
    let mut again = vec![0u8; repr.buffer_len()];
    assert_eq!(repr.emit(&mut again), Ok(bytes.len()));
    let packet2 = RocePacket::new_checked(&again[..]).expect("re-emitted packet");
    assert_eq!(PacketRepr::parse(&packet2).expect("re-parse"), repr);
}

/// A valid packet with some bytes changed, cut short or extended.
fn arb_mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        arb_case(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        prop::option::of(any::<prop::sample::Index>()),
        prop::collection::vec(any::<u8>(), 0..8),
    )
        .prop_map(|(case, flips, cut, extra)| {
            let mut b = case.emit();
            for (at, x) in flips {
                let i = at.index(b.len());
                b[i] ^= x;
            }
            if let Some(cut) = cut {
                b.truncate(cut.index(b.len() + 1));
            }
            b.extend_from_slice(&extra);
            b
        })
}

/// Bytes that often get past the opcode check: a table opcode, version 0.
fn arb_plausible() -> impl Strategy<Value = Vec<u8>> {
    (
        select(
            OPCODE_TABLE
                .iter()
                .map(|r| r.opcode.value())
                .collect::<Vec<_>>(),
        ),
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..80),
    )
        .prop_map(|(op, flags, rest)| {
            let mut b = vec![op, flags & 0xf0];
            b.extend_from_slice(&rest);
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn emit_parse_round_trip(case in arb_case()) {
        let repr = case.repr();
        let bytes = case.emit();
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        prop_assert_eq!(bytes.len() % 4, 0);
        let packet = RocePacket::new_checked(&bytes[..]).expect("emitted packet is valid");
        prop_assert_eq!(packet.opcode(), case.info.opcode);
        prop_assert_eq!(packet.payload(), &case.payload[..]);
        prop_assert_eq!(packet.header_len(), BTH_LEN + case.info.headers.len());
        prop_assert_eq!(packet.bth().pad_count() as usize, case.pad());
        prop_assert_eq!(packet.bth().psn(), case.bth.psn);
        prop_assert_eq!(packet.bth().dest_qp(), case.bth.dest_qp);
        prop_assert_eq!(packet.bth().fecn(), case.bth.fecn);
        prop_assert_eq!(packet.bth().becn(), case.bth.becn);
        // Pad bytes are zero.
        let end = bytes.len() - ICRC_LEN;
        prop_assert!(bytes[end - case.pad()..end].iter().all(|&b| b == 0));
        let parsed = PacketRepr::parse(&packet).expect("emitted packet parses");
        prop_assert_eq!(parsed, case.parsed_repr());
        // The split API (headers, then the payload in place, then finish) gives
        // the same bytes, ICRC placeholder and all.
        let mut split = vec![0xeeu8; repr.buffer_len()];
        let at = repr.emit_headers(case.payload.len(), &mut split).unwrap();
        split[at..at + case.payload.len()].copy_from_slice(&case.payload);
        prop_assert_eq!(finish(&mut split, at, case.payload.len()), Ok(bytes.len()));
        icrc::fill(&case.ctx, &mut split).unwrap();
        prop_assert_eq!(split, bytes);
    }

    #[test]
    fn icrc_catches_every_single_bit_flip(case in arb_case(), bit in any::<prop::sample::Index>()) {
        let bytes = case.emit();
        prop_assert!(icrc::verify(&case.ctx, &bytes));
        let bit = bit.index(bytes.len() * 8);
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        // Byte 4 of the BTH (FECN, BECN, reserved) is variant: masked out of the ICRC.
        prop_assert_eq!(icrc::verify(&case.ctx, &flipped), bit / 8 == 4, "bit {}", bit);
    }

    #[test]
    fn icrc_covers_addresses_ports_and_id(case in arb_case(), which in 0..4usize) {
        let bytes = case.emit();
        let mut other = case.ctx;
        match which {
            0 => other.src.set_port(other.src.port() ^ 1),
            1 => other.dst.set_port(other.dst.port().wrapping_add(1)),
            2 => {
                other.dst = match other.dst.ip() {
                    IpAddr::V4(a) => SocketAddr::new(
                        IpAddr::V4(Ipv4Addr::from(u32::from(a) ^ 0x100)), other.dst.port()),
                    IpAddr::V6(a) => SocketAddr::new(
                        IpAddr::V6(Ipv6Addr::from(u128::from(a) ^ 1)), other.dst.port()),
                };
            }
            _ => other.ipv4_id ^= 0x8000,
        }
        let both_v4 = |c: &IcrcContext| {
            let v4 = |ip: IpAddr| match ip {
                IpAddr::V4(_) => true,
                IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
            };
            v4(c.src.ip()) && v4(c.dst.ip())
        };
        // The IPv4 ID only matters when both ends are IPv4 (or IPv4-mapped).
        let changed = which != 3 || both_v4(&case.ctx);
        prop_assert_eq!(icrc::verify(&other, &bytes), !changed);
    }

    #[test]
    fn the_sealed_ipv4_id_is_solved_from_any_guess(
        case in arb_case(),
        id in any::<u16>(),
        guess in any::<u16>(),
        bit in any::<prop::sample::Index>(),
    ) {
        let mut bytes = case.emit();
        let sealed = IcrcContext { ipv4_id: id, ..case.ctx };
        icrc::fill(&sealed, &mut bytes).unwrap();
        let ctx = IcrcContext { ipv4_id: guess, ..case.ctx };
        let v4 = |ip: IpAddr| match ip {
            IpAddr::V4(_) => true,
            IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
        };
        if v4(ctx.src.ip()) && v4(ctx.dst.ip()) {
            prop_assert_eq!(icrc::sealed_ipv4_id(&ctx, &bytes), Some(id));
        } else {
            // IPv6 covers no ID: any guess matches.
            prop_assert_eq!(icrc::sealed_ipv4_id(&ctx, &bytes), Some(guess));
        }
        // A flipped bit outside the masked BTH byte: no ID matches, unless by the
        // 2^-16 chance a corruption has of looking like an ID change (callers bound
        // the IDs they accept).
        let bit = bit.index(bytes.len() * 8);
        if bit / 8 != 4 {
            bytes[bit / 8] ^= 1 << (bit % 8);
            let solved = icrc::sealed_ipv4_id(&ctx, &bytes);
            prop_assert!(solved.is_none_or(|s| s != id), "bit {}: {:?}", bit, solved);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        exercise(&bytes);
    }

    #[test]
    fn plausible_bytes_never_panic(bytes in arb_plausible()) {
        exercise(&bytes);
    }

    #[test]
    fn mutated_packets_never_panic(bytes in arb_mutated()) {
        exercise(&bytes);
    }
}

#[test]
fn every_opcode_round_trips_at_every_pad() {
    // A fixed sweep, so that coverage does not depend on proptest's draws.
    for case in common::cases() {
        let bytes = case.emit();
        let packet = RocePacket::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            PacketRepr::parse(&packet).unwrap(),
            case.parsed_repr(),
            "{}",
            case.label
        );
        exercise(&bytes);
    }
}
