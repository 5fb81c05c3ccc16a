//! The rest of Debian's rdmacm-utils, unmodified, as separate processes on the drop-in
//! `librdmacm.so.1` + softverbs' `libibverbs.so.1`: `udaddy` (UD over SIDR), `ucmatose`
//! (RC, one and ten connections), `mckey` (one sender, two receivers of a multicast group),
//! `rdma_server` / `rdma_client` (synchronous ids, `rdma_create_ep`, `rdma_get_request`,
//! the rdma_verbs.h inlines), `cmtime -c 100` (100 connections set up and torn down), and
//! `rdma_xclient -c x`, which asks for XRC and gets a clear EOPNOTSUPP.
//!
//! Skips loudly without rdmacm-utils, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs
//! `cargo build --workspace` first.

mod common;

use common::cm_run::{self, Case, CaseOutcome};
use common::procs::{self, Running, Side};
use std::time::{Duration, Instant};

/// Asserts every process printed `text` (on stdout or stderr).
fn assert_all_print(r: &CaseOutcome, text: &str, what: &str) {
    for o in r.servers.iter().chain(&r.clients) {
        assert!(
            o.output().contains(text),
            "{what}: pid {} did not print {text:?}\n{}",
            o.pid,
            r.report()
        );
    }
}

/// udaddy or ucmatose: a server bound to `addr`, a client to it, `extra` on both; both
/// report "test complete" and "return status 0".
fn cmatose_like(test: &str, tool: &str, addr: &str, extra: &[&str]) {
    if !cm_run::have_tool(tool, "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let path = format!("/usr/bin/{tool}");
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        // udaddy's `-p` is the port space, its port always 7174.
        let port_args = match tool {
            "udaddy" => vec![],
            _ => vec!["-p", port.as_str()],
        };
        Case::pair(
            Side::new(&path, &["-b", addr]).args(&port_args).args(extra),
            Side::new(&path, &["-s", addr, "-b", addr])
                .args(&port_args)
                .args(extra),
        )
    });
    r.assert_ok(test);
    assert_all_print(&r, "return status 0", test);
    for c in &r.clients {
        assert!(
            c.stdout.contains("data transfers complete"),
            "{test}: no data transfer\n{}",
            r.report()
        );
    }
}

#[test]
fn udaddy_over_ipv6() {
    cmatose_like("udaddy_ipv6", "udaddy", "::1", &[]);
}

#[test]
fn udaddy_over_ipv4() {
    cmatose_like("udaddy_ipv4", "udaddy", "127.0.0.1", &[]);
}

#[test]
fn ucmatose_over_ipv4() {
    cmatose_like("ucmatose_ipv4", "ucmatose", "127.0.0.1", &[]);
}

#[test]
fn ucmatose_ten_connections_over_ipv6() {
    cmatose_like("ucmatose_c10", "ucmatose", "::1", &["-c", "10"]);
}

#[test]
fn mckey_one_sender_two_receivers() {
    let test = "mckey";
    if !cm_run::have_tool("mckey", "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let r = cm_run::run_case(&lib, |port| {
        // A group of its own per attempt.
        let group = format!("239.83.{}.{}", port >> 8, port & 0xff);
        let receiver = Side::new(
            "/usr/bin/mckey",
            &["-m", &group, "-b", "127.0.0.1", "-C", "10"],
        );
        // The receivers must have joined before the sender sends.
        Case::new(
            vec![receiver.clone(), receiver],
            vec![Side::new(
                "/usr/bin/mckey",
                &["-m", &group, "-b", "127.0.0.1", "-s", "-C", "10"],
            )],
        )
        .head_start(Duration::from_secs(1))
    });
    r.assert_ok(test);
    assert_all_print(&r, "return status 0", test);
    for o in &r.servers {
        assert!(
            o.stdout.contains("receiving data transfers")
                && o.stdout.contains("data transfers complete"),
            "{test}: a receiver did not receive\n{}",
            r.report()
        );
    }
}

#[test]
fn rdma_server_and_rdma_client() {
    let test = "rdma_server_client";
    if !cm_run::have_tool("rdma_server", "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        Case::pair(
            Side::new("/usr/bin/rdma_server", &["-p", &port]),
            Side::new("/usr/bin/rdma_client", &["-s", "127.0.0.1", "-p", &port]),
        )
    });
    r.assert_ok(test);
    assert!(
        r.servers[0].stdout.contains("rdma_server: end 0")
            && r.clients[0].stdout.contains("rdma_client: end 0"),
        "{test}\n{}",
        r.report()
    );
}

#[test]
fn cmtime_100_connections() {
    let test = "cmtime";
    if !cm_run::have_tool("cmtime", "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        // cmtime's server serves until it is killed.
        Case::pair(
            Side::new("/usr/bin/cmtime", &["-b", "127.0.0.1", "-p", &port]),
            Side::new(
                "/usr/bin/cmtime",
                &["-s", "127.0.0.1", "-p", &port, "-c", "100"],
            ),
        )
        .servers_run_until_killed()
    });
    r.assert_ok(test);
    // The client's table: a row per step with 100 connections' worth of timings.
    for step in ["connect", "disconnect", "destroy"] {
        assert!(
            r.clients[0]
                .stdout
                .lines()
                .any(|l| l.trim_start().starts_with(step) && l.contains(':')),
            "{test}: no {step} row\n{}",
            r.report()
        );
    }
}

#[test]
fn rdma_xclient_asking_for_xrc_gets_eopnotsupp() {
    let test = "rdma_xclient_xrc";
    if !cm_run::have_tool("rdma_xclient", "rdmacm-utils") {
        return;
    }
    let lib = cm_run::dropin(test);
    let port = procs::free_udp_port().to_string();
    let o = Running::spawn(
        &Side::new(
            "/usr/bin/rdma_xclient",
            &["-c", "x", "-s", "127.0.0.1", "-p", &port],
        ),
        &lib,
    )
    .finish(Instant::now() + Duration::from_secs(30));
    assert!(
        !o.success() && o.stderr.contains("rdma_create_ep: Operation not supported"),
        "{test}: {:?}\n{}",
        o.status,
        o.output()
    );
}
