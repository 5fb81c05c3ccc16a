//! Debian's unmodified `ibv_{rc,uc,ud,srq}_pingpong` (package ibverbs-utils) between two
//! network namespaces joined by a veth pair the test creates: each process runs under
//! `ip netns exec NS` with its device on that namespace's veth address (SOFTVERBS_ADDR), and
//! the client connects to the server's veth address, so the traffic crosses a real (virtual)
//! link instead of loopback.
//!
//! Needs root and iproute2; elsewhere it skips loudly, unless `CI=true` or
//! `SOFTVERBS_REQUIRE_NETNS=1`, where a skip is a failure. Skips loudly without the tools,
//! or fails when `SOFTVERBS_REQUIRE_TOOLS=1`. Needs `cargo build --workspace` first.

mod common;

use common::{Netns, Side, TIMEOUT};
use std::time::Instant;

/// How the pingpongs print the standard RoCEv2 GID of a device at `addr`:4791 (each
/// namespace's device takes UDP 4791 on its own address): `::ffff:10.253.1.2`.
fn gid_text(addr: &str) -> String {
    format!("::ffff:{addr}")
}

fn pingpong_across_namespaces(test: &str, kind: &str) {
    let tool = format!("/usr/bin/ibv_{kind}_pingpong");
    if !common::tool_present(&tool, "ibverbs-utils") {
        return;
    }
    let _one_at_a_time = common::serial();
    let Some(link) = Netns::create(test) else {
        return;
    };
    let started = Instant::now();
    let lib = common::dropin(test);
    let port = common::free_tcp_port().to_string();
    let server = Side::new(&tool, &["-g", "0", "-p", &port])
        .netns(&link.ns[0])
        .env("SOFTVERBS_ADDR", &link.addr[0]);
    let client = Side::new(&tool, &["-g", "0", "-p", &port, &link.addr[0]])
        .netns(&link.ns[1])
        .env("SOFTVERBS_ADDR", &link.addr[1]);
    let r = common::run_pair(&lib, &server, &client, TIMEOUT);
    r.assert_ok(test);
    let report = r.report();
    assert!(r.server.stdout.contains("iters in"), "{test}:\n{report}");
    assert!(r.client.stdout.contains("iters in"), "{test}:\n{report}");
    // Each side learnt the other's GID: the standard IPv4-mapped GID of the peer's veth
    // address, which is what a peer rebuilds from a packet's source address.
    for (who, out, peer) in [
        ("server", &r.server.stdout, &link.addr[1]),
        ("client", &r.client.stdout, &link.addr[0]),
    ] {
        let gid = gid_text(peer);
        assert!(
            out.lines()
                .any(|l| l.contains("remote address") && l.trim_end().ends_with(&gid)),
            "{test}: the {who} does not show the peer GID {gid}:\n{report}"
        );
    }
    eprintln!("{test}: ok in {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn rc_pingpong_between_namespaces() {
    pingpong_across_namespaces("netns_rc_pingpong", "rc");
}

#[test]
fn uc_pingpong_between_namespaces() {
    pingpong_across_namespaces("netns_uc_pingpong", "uc");
}

#[test]
fn ud_pingpong_between_namespaces() {
    pingpong_across_namespaces("netns_ud_pingpong", "ud");
}

#[test]
fn srq_pingpong_between_namespaces() {
    pingpong_across_namespaces("netns_srq_pingpong", "srq");
}
