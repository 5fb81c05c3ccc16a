//! Feeds arbitrary bytes to the CM parsers: as a whole QP1 datagram (BTH + DETH + MAD
//! + ICRC) and, when exactly 256 bytes long, as a bare MAD; also as the rdma_cm
//! private-data header.
//!
//! Whatever the checked constructors accept must allow every accessor of every CM
//! view without a panic; whatever parses to a `CmMadRepr` must re-emit and parse back
//! to the same repr, and a datagram rebuilt from it must check and verify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::cm::datagram::{self, CmDatagram, CM_DATAGRAM_LEN};
use softverbs_wire::cm::mad::Mad;
use softverbs_wire::cm::{CmMadRepr, CmaHeader, CmaHeaderRepr, CMA_HEADER_LEN};
use softverbs_wire::icrc::IcrcContext;
use softverbs_wire::testing::exercise_cm_accessors;
use std::net::{Ipv4Addr, SocketAddr};

fn check_mad(mad: &Mad<&[u8]>) {
    exercise_cm_accessors(mad);
    let Ok(repr) = CmMadRepr::parse(mad) else {
        return;
    };
    let bytes = repr.to_bytes().expect("a parsed repr emits");
    let again = CmMadRepr::parse_bytes(&bytes).expect("re-emitted MAD parses");
    assert_eq!(again, repr, "parse -> emit -> parse");

    let ctx = IcrcContext::new(
        SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 4791)),
        SocketAddr::from((Ipv4Addr::new(192, 0, 2, 2), 7174)),
    );
    let mut buf = [0u8; CM_DATAGRAM_LEN];
    datagram::emit(&repr, softverbs_wire::Psn::new(1), &ctx, &mut buf).expect("emit datagram");
    let d = CmDatagram::new_checked(&buf[..]).expect("our datagram checks");
    assert!(d.icrc_ok(&ctx));
    assert_eq!(CmMadRepr::parse(&d.mad()).expect("parses"), repr);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = CmDatagram::new_checked(data) {
        let _ = d.psn();
        let mad = d.mad();
        check_mad(&mad);
    }
    if let Ok(mad) = Mad::new_checked(data) {
        check_mad(&mad);
    }
    if data.len() >= CMA_HEADER_LEN {
        if let Ok(h) = CmaHeader::new_checked(data) {
            if let Ok(r) = CmaHeaderRepr::parse(&h) {
                let mut b = [0u8; CMA_HEADER_LEN];
                r.emit(&mut b).expect("parsed header emits");
                assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&b[..]).unwrap()), Ok(r));
            }
        }
    }
});
