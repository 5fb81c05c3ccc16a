//! Loss recovery on real sockets (issue 15): Debian's unmodified `ibv_rc_pingpong -c`
//! (ibverbs-utils) and `ib_send_bw`, `ib_read_bw`, `ib_write_bw` (perftest), on the
//! drop-in, between two network namespaces joined by a veth pair, with nftables in each
//! namespace dropping a share of the UDP datagrams it sends (so both directions lose): at
//! 5 % and at 20 %, with the tools' default timeout and retry settings. Both sides must
//! exit 0 (a connection ending in RETRY_EXC_ERR fails the tool), the pingpong's buffer
//! check (`-c`) must pass, the perftest result tables must show bandwidth, and the
//! nftables counters must show that datagrams were dropped.
//!
//! The runs are short (a few MB each, bounded by [`RUN_TIMEOUT`]), one at a time. Needs
//! root, iproute2 and nftables; elsewhere it skips loudly, unless `CI=true` or
//! `SOFTVERBS_REQUIRE_NETNS=1`, where a skip is a failure. Skips loudly without the tools,
//! or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs `cargo build --workspace` first.

mod common;

use common::{Netns, PairOutcome, Side};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Each tool run is killed at this deadline (then the test fails).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Drops `percent` % of the UDP datagrams sent from namespace `ns` (nftables, with a
/// counter); Err if nftables cannot be used.
fn drop_udp(ns: &str, percent: u32) -> Result<(), String> {
    let rules = format!(
        "table inet svloss {{\n  chain out {{\n    type filter hook output priority 0; \
         policy accept;\n    meta l4proto udp numgen random mod 100 < {percent} counter drop\n  \
         }}\n}}\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(rules.as_bytes())
        .map_err(|e| format!("write nft rules: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft -f: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Datagrams the nftables rule of namespace `ns` dropped so far.
fn dropped(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "nft", "list", "table", "inet", "svloss",
        ])
        .output()
        .expect("run nft list");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Two namespaces each dropping `percent` % of their outgoing UDP, or None (skipped).
fn lossy_link(test: &str, percent: u32) -> Option<Netns> {
    if !common::tool_present("/usr/sbin/nft", "nftables") {
        return None;
    }
    let link = Netns::create(test)?;
    for ns in &link.ns {
        if let Err(why) = drop_udp(ns, percent) {
            assert!(
                !common::netns_required(),
                "{test}: nftables required here but {why}"
            );
            eprintln!("\n*** SKIPPED {test}: {why} ***\n");
            return None;
        }
    }
    Some(link)
}

/// Runs `tool` as server in the first namespace and client in the second (connecting to
/// the server's veth address), each device on its namespace's address.
fn run(test: &str, link: &Netns, tool: &str, args: &[&str], port_flag: &str) -> PairOutcome {
    let lib = common::dropin(test);
    let port = common::free_tcp_port().to_string();
    // Both processes run on this host and share a runtime directory, so RDMA WRITE and
    // READ would take the same-host path, which sends no data packets for nftables to
    // drop: the UDP path is what is under test.
    let server = Side::new(tool, &[port_flag, port.as_str()])
        .args(args)
        .netns(&link.ns[0])
        .env("SOFTVERBS_ADDR", &link.addr[0])
        .env("SOFTVERBS_SAME_HOST", "0");
    let client = Side::new(tool, &[port_flag, port.as_str()])
        .args(args)
        .args(&[link.addr[0].as_str()])
        .netns(&link.ns[1])
        .env("SOFTVERBS_ADDR", &link.addr[1])
        .env("SOFTVERBS_SAME_HOST", "0");
    let r = common::run_pair(&lib, &server, &client, RUN_TIMEOUT);
    let drops = dropped(&link.ns[0]) + dropped(&link.ns[1]);
    eprintln!(
        "{test}: {} in {:.1} s, {drops} datagrams dropped so far",
        if r.both_ok() { "ok" } else { "FAILED" },
        r.elapsed.as_secs_f64()
    );
    r.assert_ok(test);
    r
}

/// `ibv_rc_pingpong -c` and the three perftest bandwidth tools, 64 KiB messages, through a
/// link dropping `percent` % each way.
fn tools_complete(test: &str, percent: u32, iters: &str) {
    let pingpong = "/usr/bin/ibv_rc_pingpong";
    if !common::tool_present(pingpong, "ibverbs-utils")
        || !common::tool_present("/usr/bin/ib_write_bw", "perftest")
    {
        return;
    }
    let _one_at_a_time = common::serial();
    let Some(link) = lossy_link(test, percent) else {
        return;
    };
    let r = run(
        &format!("{test}_rc_pingpong"),
        &link,
        pingpong,
        &["-g", "0", "-c", "-s", "4096", "-n", iters],
        "-p",
    );
    assert!(r.client.stdout.contains("iters in"), "{}", r.report());
    for tool in ["ib_send_bw", "ib_read_bw", "ib_write_bw"] {
        let r = run(
            &format!("{test}_{tool}"),
            &link,
            &format!("/usr/bin/{tool}"),
            &["-x", "0", "-s", "65536", "-n", iters],
            "-p",
        );
        let report = r.report();
        let (columns, rows) = common::perftest_table(&r.client.stdout)
            .unwrap_or_else(|| panic!("{test} {tool}: no result table\n{report}"));
        let bw = columns
            .iter()
            .position(|c| c.starts_with("BW average"))
            .unwrap_or_else(|| panic!("{test} {tool}: no BW average in {columns:?}"));
        let value: f64 = rows
            .first()
            .and_then(|row| row.get(bw))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{test} {tool}: bad result table\n{report}"));
        assert!(value > 0.0, "{test} {tool}: no bandwidth\n{report}");
    }
    let drops = dropped(&link.ns[0]) + dropped(&link.ns[1]);
    assert!(drops > 0, "{test}: nftables dropped nothing");
}

#[test]
fn tools_complete_at_5_percent_loss_each_way() {
    tools_complete("loss5", 5, "200");
}

#[test]
fn tools_complete_at_20_percent_loss_each_way() {
    tools_complete("loss20", 20, "100");
}
