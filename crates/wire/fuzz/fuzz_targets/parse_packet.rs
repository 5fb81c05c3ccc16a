//! Feeds arbitrary bytes to the RoCEv2 packet parser.
//!
//! Every input goes through the checked constructor; whatever it accepts must allow
//! every accessor without panicking, and whatever then parses to a `PacketRepr` must
//! re-emit to a packet of the same length that parses back to the same repr, with the
//! same payload, and whose filled-in ICRC verifies. ICRC computation runs on every
//! input, valid or not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_wire::icrc::{self, IcrcContext};
use softverbs_wire::testing::exercise_accessors;
use softverbs_wire::{PacketRepr, RocePacket};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

fn contexts() -> [IcrcContext; 2] {
    [
        IcrcContext::new(
            SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 49152)),
            SocketAddr::from((Ipv4Addr::new(192, 0, 2, 2), 4791)),
        ),
        IcrcContext::new(
            SocketAddr::from((Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 49152)),
            SocketAddr::from((Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2), 4791)),
        ),
    ]
}

fuzz_target!(|data: &[u8]| {
    let ctxs = contexts();
    for ctx in &ctxs {
        let _ = icrc::compute(ctx, data);
        let _ = icrc::verify(ctx, data);
    }
    let Ok(packet) = RocePacket::new_checked(data) else {
        return;
    };
    exercise_accessors(&packet);
    let Ok(repr) = PacketRepr::parse(&packet) else {
        return;
    };

    let mut again = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut again).expect("a parsed repr emits");
    assert_eq!(n, data.len(), "re-emitted length");
    let packet2 = RocePacket::new_checked(&again[..]).expect("re-emitted packet is valid");
    exercise_accessors(&packet2);
    let repr2 = PacketRepr::parse(&packet2).expect("re-emitted packet parses");
    assert_eq!(repr2, repr, "parse -> emit -> parse round trip");
    assert_eq!(packet2.payload(), packet.payload());

    for ctx in &ctxs {
        icrc::fill(ctx, &mut again).expect("fill");
        assert!(icrc::verify(ctx, &again), "filled ICRC verifies");
    }
});
