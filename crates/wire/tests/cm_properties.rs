//! Property tests of the CM MADs: every message's repr survives emit -> parse; any
//! 256 bytes can be looked at through every view without a panic; whatever parses
//! re-emits to bytes that parse to the same repr; the QP1 datagram wrapper round-trips
//! and its ICRC covers it.

use proptest::collection::vec;
use proptest::prelude::*;
use softverbs_wire::cm::datagram::{self, CmDatagram};
use softverbs_wire::cm::mad::Mad;
use softverbs_wire::cm::*;
use softverbs_wire::icrc::IcrcContext;
use softverbs_wire::testing::exercise_cm_accessors;
use softverbs_wire::{Gid, Psn, Qpn};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn private(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), max..=max)
}

fn qpn() -> impl Strategy<Value = Qpn> {
    (0u32..1 << 24).prop_map(Qpn::new)
}

fn psn() -> impl Strategy<Value = Psn> {
    (0u32..1 << 24).prop_map(Psn::new)
}

fn path() -> impl Strategy<Value = PathRepr> {
    (
        (
            any::<u16>(),
            any::<u16>(),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
        ),
        (0u32..1 << 20, 0u8..64, any::<u8>(), any::<u8>()),
        (0u8..16, any::<bool>(), 0u8..32),
    )
        .prop_map(
            |((ll, rl, lg, rg), (fl, rate, tc, hl), (sl, local, ack))| PathRepr {
                local_lid: ll,
                remote_lid: rl,
                local_gid: Gid(lg),
                remote_gid: Gid(rg),
                flow_label: fl,
                packet_rate: rate,
                traffic_class: tc,
                hop_limit: hl,
                sl,
                subnet_local: local,
                local_ack_timeout: ack,
            },
        )
}

fn req() -> impl Strategy<Value = ReqRepr> {
    (
        (
            any::<u32>(),
            0u32..1 << 24,
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
        ),
        (
            qpn(),
            any::<u8>(),
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
        ),
        (0u8..32, 0u8..4, any::<bool>(), psn(), 0u8..32, 0u8..8),
        (
            any::<u16>(),
            0u8..16,
            any::<bool>(),
            0u8..8,
            0u8..16,
            any::<bool>(),
            0u8..8,
        ),
        (path(), path(), any::<bool>(), private(92)),
    )
        .prop_map(
            |(
                (local_comm_id, vendor_id, service_id, local_ca_guid, local_qkey),
                (local_qpn, responder_resources, local_eecn, initiator_depth, remote_eecn),
                (rto, tst, flow, starting_psn, lto, retry),
                (pkey, mtu, rdc, rnr, max_retries, srq, ext),
                (primary_path, alternate_path, sap, private_data),
            )| ReqRepr {
                local_comm_id,
                vendor_id,
                service_id,
                local_ca_guid,
                local_qkey,
                local_qpn,
                responder_resources,
                local_eecn,
                initiator_depth,
                remote_eecn,
                remote_cm_response_timeout: rto,
                transport_service_type: tst,
                end_to_end_flow_control: flow,
                starting_psn,
                local_cm_response_timeout: lto,
                retry_count: retry,
                pkey,
                path_mtu: mtu,
                rdc_exists: rdc,
                rnr_retry_count: rnr,
                max_cm_retries: max_retries,
                srq,
                extended_transport_type: ext,
                primary_path,
                alternate_path,
                sap_supported: sap,
                private_data,
            },
        )
}

fn rep() -> impl Strategy<Value = RepRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            qpn(),
            0u32..1 << 24,
            0u32..1 << 24,
        ),
        (
            psn(),
            any::<u8>(),
            any::<u8>(),
            0u8..32,
            0u8..4,
            any::<bool>(),
        ),
        (0u8..8, any::<bool>(), any::<u64>(), private(196)),
    )
        .prop_map(
            |(
                (lid, rid, qkey, qpn, vendor, eecn),
                (psn, rr, id, ack, fo, flow),
                (rnr, srq, guid, pd),
            )| {
                RepRepr {
                    local_comm_id: lid,
                    remote_comm_id: rid,
                    local_qkey: qkey,
                    local_qpn: qpn,
                    vendor_id: vendor,
                    local_eecn: eecn,
                    starting_psn: psn,
                    responder_resources: rr,
                    initiator_depth: id,
                    target_ack_delay: ack,
                    failover_accepted: fo,
                    end_to_end_flow_control: flow,
                    rnr_retry_count: rnr,
                    srq,
                    local_ca_guid: guid,
                    private_data: pd,
                }
            },
        )
}

fn message() -> impl Strategy<Value = CmMessage> {
    let mra = (any::<u32>(), any::<u32>(), 0u8..3, 0u8..32, private(222)).prop_map(
        |(l, r, t, st, pd)| {
            CmMessage::Mra(MraRepr {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: MraTarget::from_value(t).unwrap(),
                service_timeout: st,
                private_data: pd,
            })
        },
    );
    let rej = (
        any::<u32>(),
        any::<u32>(),
        0u8..3,
        any::<u16>(),
        vec(any::<u8>(), 0..=72),
        private(148),
    )
        .prop_map(|(l, r, m, reason, ari, pd)| {
            CmMessage::Rej(RejRepr {
                local_comm_id: l,
                remote_comm_id: r,
                message_rejected: RejectedMessage::from_value(m).unwrap(),
                reason: RejReason(reason),
                ari,
                private_data: pd,
            })
        });
    let ids = || (any::<u32>(), any::<u32>());
    let rtu = (ids(), private(224)).prop_map(|((l, r), pd)| {
        CmMessage::Rtu(RtuRepr {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })
    });
    let dreq = (ids(), qpn(), private(220)).prop_map(|((l, r), q, pd)| {
        CmMessage::Dreq(DreqRepr {
            local_comm_id: l,
            remote_comm_id: r,
            remote_qpn: q,
            private_data: pd,
        })
    });
    let drep = (ids(), private(224)).prop_map(|((l, r), pd)| {
        CmMessage::Drep(DrepRepr {
            local_comm_id: l,
            remote_comm_id: r,
            private_data: pd,
        })
    });
    let sidr_req =
        (any::<u32>(), any::<u16>(), any::<u64>(), private(216)).prop_map(|(id, pkey, sid, pd)| {
            CmMessage::SidrReq(SidrReqRepr {
                request_id: id,
                pkey,
                service_id: sid,
                private_data: pd,
            })
        });
    let sidr_rep = (
        (any::<u32>(), any::<u8>(), 0u32..1 << 24, qpn()),
        (
            any::<u64>(),
            any::<u32>(),
            vec(any::<u8>(), 0..=72),
            private(136),
        ),
    )
        .prop_map(|((id, st, vendor, qpn), (sid, qkey, info, pd))| {
            CmMessage::SidrRep(SidrRepRepr {
                request_id: id,
                status: SidrStatus(st),
                vendor_id: vendor,
                qpn,
                service_id: sid,
                qkey,
                info,
                private_data: pd,
            })
        });
    prop_oneof![
        req().prop_map(CmMessage::Req),
        rep().prop_map(CmMessage::Rep),
        mra,
        rej,
        rtu,
        dreq,
        drep,
        sidr_req,
        sidr_rep,
    ]
}

fn ip_pair() -> impl Strategy<Value = (IpAddr, IpAddr)> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<[u8; 4]>())
            .prop_map(|(a, b)| (Ipv4Addr::from(a).into(), Ipv4Addr::from(b).into())),
        (any::<[u8; 16]>(), any::<[u8; 16]>())
            .prop_map(|(a, b)| (Ipv6Addr::from(a).into(), Ipv6Addr::from(b).into())),
    ]
}

proptest! {
    #[test]
    fn cm_mads_round_trip(tid in any::<u64>(), modifier in any::<u32>(), message in message()) {
        let repr = CmMadRepr { transaction_id: tid, attribute_modifier: modifier, message };
        let bytes = repr.to_bytes().unwrap();
        let mad = Mad::new_checked(&bytes[..]).unwrap();
        exercise_cm_accessors(&mad);
        prop_assert_eq!(CmMadRepr::parse(&mad).unwrap(), repr);
    }

    #[test]
    fn any_mad_bytes_are_safe_and_what_parses_round_trips(bytes in any::<[u8; 256]>(), cm in any::<bool>(), attr in 0x10u8..0x1b) {
        let mut bytes = bytes;
        if cm {
            // Make it a CM MAD often enough to reach every message parser.
            bytes[..4].copy_from_slice(&[1, 7, 2, 3]);
            bytes[16..18].copy_from_slice(&[0, attr]);
        }
        let mad = Mad::new_checked(&bytes[..]).unwrap();
        exercise_cm_accessors(&mad);
        if let Ok(repr) = CmMadRepr::parse(&mad) {
            let again = repr.to_bytes().unwrap();
            prop_assert_eq!(CmMadRepr::parse_bytes(&again).unwrap(), repr);
        }
    }

    #[test]
    fn cma_header_round_trips((src, dst) in ip_pair(), port in any::<u16>()) {
        let h = CmaHeaderRepr { src_ip: src, src_port: port, dst_ip: dst };
        let mut b = [0u8; CMA_HEADER_LEN];
        h.emit(&mut b).unwrap();
        prop_assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&b[..]).unwrap()).unwrap(), h);
    }

    #[test]
    fn datagrams_round_trip_and_the_icrc_covers_every_byte(
        message in message(), psn in psn(), flip in 0usize..datagram::CM_DATAGRAM_LEN * 8,
    ) {
        let ctx = IcrcContext::new("10.0.0.1:4791".parse().unwrap(), "10.0.0.2:7174".parse().unwrap());
        let repr = CmMadRepr { transaction_id: 1, attribute_modifier: 0, message };
        let mut buf = [0u8; datagram::CM_DATAGRAM_LEN];
        datagram::emit(&repr, psn, &ctx, &mut buf).unwrap();
        let d = CmDatagram::new_checked(&buf[..]).unwrap();
        prop_assert!(d.icrc_ok(&ctx));
        prop_assert_eq!(d.psn(), psn);
        prop_assert_eq!(CmMadRepr::parse(&d.mad()).unwrap(), repr);
        // Byte 4 of the BTH is masked out of the ICRC (IBA A17.4.1).
        if flip / 8 != 4 {
            buf[flip / 8] ^= 1 << (flip % 8);
            let caught = CmDatagram::new_checked(&buf[..]).map(|d| !d.icrc_ok(&ctx)).unwrap_or(true);
            prop_assert!(caught);
        }
    }
}
