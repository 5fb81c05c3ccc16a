//! Debian's unmodified `ibv_*_pingpong` tools (package ibverbs-utils) run as server and
//! client, two processes on loopback, on the drop-in `libibverbs.so.1`: RC (default, `-c`
//! buffer validation, 64 KiB messages, completion events), UC, UD (address handles) and SRQ.
//! Both must exit 0 and print their `iters in` summary.
//!
//! Skips loudly without the tools, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).
//! Needs `cargo build --workspace` first (the provider stub libraries).

mod common;

use common::{Side, TIMEOUT};
use std::time::Instant;

/// Runs `/usr/bin/ibv_{kind}_pingpong -g 0 -p PORT extra...` as server and client.
fn pingpong(test: &str, kind: &str, extra: &[&str]) {
    pingpong_addressed(test, kind, &["-g", "0"], extra);
}

/// Runs `/usr/bin/ibv_{kind}_pingpong ADDRESSING -p PORT extra...` as server and client.
fn pingpong_addressed(test: &str, kind: &str, addressing: &[&str], extra: &[&str]) {
    let tool = format!("/usr/bin/ibv_{kind}_pingpong");
    if !common::tool_present(&tool, "ibverbs-utils") {
        return;
    }
    let _one_at_a_time = common::serial();
    let started = Instant::now();
    let lib = common::dropin(test);
    let port = common::free_tcp_port().to_string();
    let server = Side::new(&tool, addressing)
        .args(&["-p", &port])
        .args(extra);
    let client = server.clone().args(&["127.0.0.1"]);
    let r = common::run_pair(&lib, &server, &client, TIMEOUT);
    r.assert_ok(test);
    let report = r.report();
    assert!(r.server.stdout.contains("iters in"), "{test}:\n{report}");
    assert!(r.client.stdout.contains("iters in"), "{test}:\n{report}");
    eprintln!("{test}: ok in {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn rc_pingpong_default() {
    pingpong("rc_pingpong_default", "rc", &[]);
}

#[test]
fn rc_pingpong_validate_buffers() {
    pingpong("rc_pingpong_validate", "rc", &["-c"]);
}

#[test]
fn rc_pingpong_64k_messages() {
    pingpong("rc_pingpong_64k", "rc", &["-s", "65536", "-n", "1000"]);
}

#[test]
fn rc_pingpong_with_events() {
    pingpong("rc_pingpong_events", "rc", &["-e"]);
}

#[test]
fn uc_pingpong_default() {
    pingpong("uc_pingpong_default", "uc", &[]);
}

#[test]
fn ud_pingpong_default() {
    pingpong("ud_pingpong_default", "ud", &[]);
}

#[test]
fn srq_pingpong_default() {
    pingpong("srq_pingpong_default", "srq", &[]);
}

/// Without `-g` the tools exchange LIDs only (and a zero GID): each process's device has its
/// own loopback address, and the LID names it to the other process.
#[test]
fn rc_pingpong_by_lid_only() {
    pingpong_addressed("rc_pingpong_lid", "rc", &[], &[]);
}

#[test]
fn ud_pingpong_by_lid_only() {
    pingpong_addressed("ud_pingpong_lid", "ud", &[], &[]);
}
