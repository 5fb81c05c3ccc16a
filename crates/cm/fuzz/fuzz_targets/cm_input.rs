//! CM MAD input into a cm with live connections.
//!
//! Each run builds a server cm with a listener and connections to a client cm in
//! several states (established, waiting for the RTU, being asked to accept,
//! disconnecting, in timewait, an answered SIDR request), then plays the input as a
//! script against the server: raw datagrams; CM messages built from the live
//! connections' IDs with fuzzed fields (so they pass the ICRC and reach the state
//! machines); time jumps; and application calls (accept, reject, disconnect,
//! destroy, establish). Nothing may panic, every datagram the cm sends must be a
//! well-formed CM datagram from its device, and its tables must drain once time
//! runs on long enough.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softverbs_cm::*;
use softverbs_wire::cm::datagram::{self, CmDatagram, CM_DATAGRAM_LEN};
use softverbs_wire::cm::*;
use softverbs_wire::icrc::IcrcContext;
use std::net::SocketAddr;
use std::time::Duration;

const SERVER: &str = "10.0.0.2:4791";
const CLIENT: &str = "10.0.0.1:4791";
const SERVICE: &str = "10.0.0.2:7174";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// What the server has seen, for building messages that reach its state machines.
#[derive(Default)]
struct Seen {
    mads: Vec<CmMadRepr>,
    ids: Vec<CmIdHandle>,
}

/// Drives `cm` like a driver: answers requests, drains events, returns datagrams.
fn drive(cm: &mut Cm, now: Instant, seen: &mut Seen) -> Vec<(SocketAddr, Vec<u8>)> {
    loop {
        let mut busy = false;
        while let Some(r) = cm.poll_request() {
            busy = true;
            match r {
                DriverRequest::ResolveAddr { token, .. } => {
                    let a = ResolvedAddr {
                        src_ip: cm.config().device.ip(),
                        mtu: IbMtu::Mtu1024,
                        hop_limit: 64,
                    };
                    cm.handle_addr_resolved(now, token, Ok(a));
                }
                DriverRequest::ModifyQp { token, .. } => cm.handle_qp_modified(now, token, Ok(())),
                DriverRequest::JoinGroup { token, group, .. } => {
                    cm.handle_group_joined(now, token, Ok(SocketAddr::new(group, 4791)))
                }
                DriverRequest::LeaveGroup { .. } | DriverRequest::ReleasePort { .. } => {}
            }
        }
        while let Some(e) = cm.poll_event() {
            busy = true;
            if !seen.ids.contains(&e.id) {
                seen.ids.push(e.id);
            }
        }
        if !busy {
            break;
        }
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Some(tx) = cm.poll_transmit(&mut buf) {
        assert_eq!(tx.src, cm.config().device);
        let d = CmDatagram::new_checked(&buf[..tx.len]).expect("the cm sends QP1 datagrams");
        let ctx = IcrcContext::new(tx.src, tx.dst);
        assert!(d.icrc_ok(&ctx), "with a right ICRC");
        let mad = CmMadRepr::parse(&d.mad()).expect("carrying CM messages");
        seen.mads.push(mad);
        out.push((tx.dst, buf[..tx.len].to_vec()));
    }
    out
}

/// Moves datagrams between the two cms until both are quiet.
fn exchange(server: &mut Cm, client: &mut Cm, now: Instant, seen: &mut Seen) {
    let mut client_seen = Seen::default();
    for _ in 0..64 {
        let from_server = drive(server, now, seen);
        let from_client = drive(client, now, &mut client_seen);
        if from_server.is_empty() && from_client.is_empty() {
            return;
        }
        for (dst, d) in from_server {
            client.handle_datagram(now, addr(SERVER), dst, &d);
        }
        for (dst, d) in from_client {
            server.handle_datagram(now, addr(CLIENT), dst, &d);
            seen.mads.extend(client_seen.mads.drain(..));
        }
        seen.mads.extend(client_seen.mads.drain(..));
    }
}

fn connect(client: &mut Cm, now: Instant, qpn: u32, ps: PortSpace, qp_type: QpType) -> CmIdHandle {
    let id = client.create_id(ps, qp_type).unwrap();
    client
        .resolve_addr(now, id, None, addr(SERVICE), Duration::from_secs(1))
        .unwrap();
    let mut scratch = Seen::default();
    drive(client, now, &mut scratch);
    client.resolve_route(id).unwrap();
    let p = ConnParam {
        qp_num: Some(Qpn::new(qpn)),
        private_data: vec![7; 8],
        ..ConnParam::default()
    };
    client.connect(now, id, Some(p)).unwrap();
    id
}

struct World {
    server: Cm,
    client: Cm,
    seen: Seen,
    now: Instant,
}

fn world() -> World {
    let s = addr(SERVER);
    let c = addr(CLIENT);
    let mut server = Cm::new(CmConfig::new(s, CmConfig::guid_for(s), 1));
    let mut client = Cm::new(CmConfig::new(c, CmConfig::guid_for(c), 2));
    let mut seen = Seen::default();
    let now = Instant::ZERO;
    for (ps, qp) in [(PortSpace::Tcp, QpType::Rc), (PortSpace::Udp, QpType::Ud)] {
        let l = server.create_id(ps, qp).unwrap();
        if let Reservation::Needed(_) = server.bind_addr(l, addr("0.0.0.0:7174")).unwrap() {
            server.complete_reservation(l, true).unwrap();
        }
        let _ = server.listen(l, 8).unwrap();
    }
    // Five RC requests and a SIDR request; the server accepts four and one SIDR,
    // leaves one pending; then one connection is disconnected (timewait) and one is
    // being disconnected.
    let ids: Vec<CmIdHandle> = (0..5)
        .map(|i| connect(&mut client, now, 0x100 + i, PortSpace::Tcp, QpType::Rc))
        .collect();
    let ud = connect(&mut client, now, 0, PortSpace::Udp, QpType::Ud);
    exchange(&mut server, &mut client, now, &mut seen);
    let children = seen.ids.clone();
    for (n, child) in children.iter().enumerate().take(5) {
        let p = ConnParam {
            qp_num: Some(Qpn::new(0x200 + n as u32)),
            ..ConnParam::default()
        };
        let _ = server.accept(now, *child, Some(p));
    }
    exchange(&mut server, &mut client, now, &mut seen);
    for id in ids.iter().chain([&ud]) {
        let _ = client.establish(now, *id);
    }
    exchange(&mut server, &mut client, now, &mut seen);
    let _ = client.disconnect(now, ids[0]);
    exchange(&mut server, &mut client, now, &mut seen);
    let _ = client.disconnect(now, ids[1]);
    let mut scratch = Seen::default();
    drive(&mut client, now, &mut scratch);
    World {
        server,
        client,
        seen,
        now,
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([self.byte()?, self.byte()?, self.byte()?, self.byte()?]))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn send_mad(w: &mut World, mad: &CmMadRepr, src: SocketAddr, dst: SocketAddr) {
    let mut buf = [0u8; CM_DATAGRAM_LEN];
    let ctx = IcrcContext::new(src, dst);
    if datagram::emit(mad, softverbs_wire::Psn::new(0), &ctx, &mut buf).is_ok() {
        w.server.handle_datagram(w.now, src, dst, &buf);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut w = world();
    let mut input = Input(data);
    while let Some(op) = input.byte() {
        match op % 6 {
            // A raw datagram.
            0 => {
                let len = usize::from(input.byte().unwrap_or(0)) * 2;
                let bytes = input.take(len).to_vec();
                w.server.handle_datagram(w.now, addr(CLIENT), addr(SERVER), &bytes);
            }
            // A message seen in this run, with fuzzed bytes patched into its body.
            1 | 2 => {
                if w.seen.mads.is_empty() {
                    continue;
                }
                let pick = usize::from(input.byte().unwrap_or(0)) % w.seen.mads.len();
                let Ok(mut bytes) = w.seen.mads[pick].to_bytes() else {
                    continue;
                };
                let patches = input.byte().unwrap_or(0) % 8;
                for _ in 0..patches {
                    let at = 24 + usize::from(input.byte().unwrap_or(0)) % 232;
                    bytes[at] = input.byte().unwrap_or(0);
                }
                if op % 6 == 2 {
                    // Another message type with the same body.
                    bytes[17] = 0x10 + input.byte().unwrap_or(0) % 9;
                }
                let Ok(mad) = CmMadRepr::parse_bytes(&bytes) else {
                    continue;
                };
                let from_client = input.byte().unwrap_or(0) % 4 != 0;
                let src = if from_client { addr(CLIENT) } else { addr("10.0.0.9:4791") };
                let dst = if input.byte().unwrap_or(0) % 2 == 0 { addr(SERVER) } else { addr(SERVICE) };
                send_mad(&mut w, &mad, src, dst);
            }
            // Time passes.
            3 => {
                let ms = u64::from(input.u32().unwrap_or(0) % 200_000);
                w.now = w.now + Duration::from_millis(ms);
                w.server.handle_timeout(w.now);
                w.client.handle_timeout(w.now);
            }
            // The application acts on one of the ids.
            4 => {
                if w.seen.ids.is_empty() {
                    continue;
                }
                let id = w.seen.ids[usize::from(input.byte().unwrap_or(0)) % w.seen.ids.len()];
                let now = w.now;
                let _ = match input.byte().unwrap_or(0) % 7 {
                    0 => w.server.accept(now, id, None),
                    1 => w.server.reject(now, id, b"no"),
                    2 => w.server.disconnect(now, id),
                    3 => w.server.destroy_id(now, id),
                    4 => w.server.establish(now, id),
                    5 => w.server.notify_established(now, id),
                    _ => w.server.init_qp_attr(id, QpState::Rtr).map(|_| ()),
                };
            }
            // The two cms talk.
            _ => {
                let now = w.now;
                exchange(&mut w.server, &mut w.client, now, &mut w.seen);
            }
        }
        let now = w.now;
        let mut seen = std::mem::take(&mut w.seen);
        drive(&mut w.server, now, &mut seen);
        if seen.mads.len() > 4096 {
            seen.mads.truncate(1024);
        }
        w.seen = seen;
    }
    // Everything the script left behind ends: an hour later every connection the
    // server keeps belongs to a live id (nothing orphaned lingers), and no timer is
    // overdue.
    for _ in 0..40 {
        w.now = w.now + Duration::from_secs(100);
        w.server.handle_timeout(w.now);
        let now = w.now;
        let mut seen = std::mem::take(&mut w.seen);
        drive(&mut w.server, now, &mut seen);
        w.seen = seen;
    }
    for c in w.server.connections() {
        let id = c.id.unwrap_or_else(|| panic!("orphaned connection lingers: {c:?}"));
        assert!(w.server.state(id).is_ok(), "a connection of a destroyed id: {c:?}");
        assert_ne!(c.state, IbState::Timewait, "timewait outlived its timer");
    }
    assert!(w.server.poll_timeout().is_none_or(|t| t > w.now));
});
