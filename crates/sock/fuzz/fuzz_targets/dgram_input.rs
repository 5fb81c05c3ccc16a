//! A hostile network against one datagram rsocket: arbitrary UDP datagrams (from a few
//! sources, both families) and UD messages into a `DgramCore`, with sends and reads
//! between them. Nothing may panic, every queued datagram must lie within what arrived,
//! and slots must balance.
#![no_main]

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use softverbs_sock::dgram::{
    DgramCore, DgramSizes, DsHeader, LocalQp, Payload, SendPlan, UdVerdict, UdpHeader,
};

const SOURCES: [&str; 4] = ["127.0.0.1:1", "127.0.0.2:2", "[::1]:3", "[fe80::1]:4"];

fuzz_target!(|data: &[u8]| {
    let mut core = DgramCore::new(
        LocalQp {
            qpn: 0x42,
            gid: [0; 16],
        },
        DgramSizes {
            sq_size: 3,
            rq_size: 4,
        },
    );
    let local: SocketAddr = "127.0.0.9:9".parse().unwrap();
    let mut in_flight = Vec::new();
    let mut posted_slots = 0u32;
    // The length of what arrived, for each queued datagram (the core's queue, shadowed).
    let mut arrived = std::collections::VecDeque::new();
    let mut rest = data;
    while let Some((&op, tail)) = rest.split_first() {
        let len = (tail.first().copied().unwrap_or(0) as usize).min(tail.len().saturating_sub(1));
        let body = &tail[1.min(tail.len())..1.min(tail.len()) + len];
        rest = &tail[(1 + len).min(tail.len())..];
        let from: SocketAddr = SOURCES[(op >> 4) as usize % SOURCES.len()].parse().unwrap();
        match op & 7 {
            0 => {
                // Raw bytes as a UDP datagram.
                let _ = UdpHeader::parse(body, from);
                if core.handle_udp(from, body, |_| local).is_ok_and(|o| o.queued) {
                    arrived.push_back(body.len());
                }
            }
            1 => {
                // Raw bytes as a UD message.
                let _ = DsHeader::parse(body);
                let slot = posted_slots;
                posted_slots += 1;
                if core.handle_ud(slot, body) == UdVerdict::Queued {
                    arrived.push_back(body.len());
                }
            }
            2 => {
                let _ = core.add_dest(from, local);
                match core.plan_send(from, body.len()) {
                    Ok(SendPlan::Ud { slot, .. }) => in_flight.push(slot),
                    Ok(SendPlan::Udp { header }) => assert!(header.len() >= 16),
                    Err(_) => {}
                }
            }
            3 => {
                if let Some(slot) = in_flight.pop() {
                    core.send_done(slot);
                }
            }
            4 => {
                let got = core.pop();
                let was = arrived.pop_front();
                assert_eq!(got.is_some(), was.is_some());
                if let (Some(d), Some(was)) = (got, was) {
                    match d.payload {
                        Payload::Slot { offset, len, .. } => assert_eq!(offset + len, was),
                        Payload::Bytes(b) => assert!(b.len() + 16 <= was),
                    }
                }
            }
            _ => {
                core.send_done(op as u32);
            }
        }
        assert!(core.sizes().rq_size as usize >= usize::from(core.readable()));
    }
    for slot in in_flight.drain(..) {
        core.send_done(slot);
    }
    assert!(core.all_sends_done());
});
