//! Debian's rsocket programs (rdmacm-utils), unmodified, both ends as separate processes on
//! the drop-in `librdmacm.so.1` + softverbs' `libibverbs.so.1`: `rstream` (its default run
//! with `-T v` data verification, non-blocking; a verified blocking run), `riostream`
//! (riomap/riowrite, verified) and `rcopy` (a 3 MiB random file, compared byte for byte);
//! rstream `-T v` again with 2 % of the datagrams lost.
//!
//! rstream's `-S all` (every size, 100 000 round trips for each small one) runs in both modes:
//! the two together took 184 s in the dev profile at load average 2-4 on 2 cores (session 6;
//! they were over 6 minutes each before, and `#[ignore]`d). They run one at a time.
//!
//! Skips loudly without rdmacm-utils, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs
//! `cargo build --workspace` first.

mod common;

use common::cm_run::{self, Case, CaseOutcome};
use common::procs::{self, Side};
use common::random_bytes;

/// `tool` as server and as client of 127.0.0.1, both with `args`; both must exit 0.
fn both_ends(test: &str, tool: &str, args: &[&str]) -> Option<CaseOutcome> {
    both_ends_with(test, tool, args, &[])
}

/// [`both_ends`] with environment variables for each side (`side_env[0]` the server's,
/// `[1]` the client's).
fn both_ends_with(
    test: &str,
    tool: &str,
    args: &[&str],
    side_env: &[[(&str, &str); 2]],
) -> Option<CaseOutcome> {
    if !cm_run::have_tool(tool, "rdmacm-utils") {
        return None;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let path = format!("/usr/bin/{tool}");
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        let mut server = Side::new(&path, &["-p", &port]).args(args);
        let mut client = Side::new(&path, &["-s", "127.0.0.1", "-p", &port]).args(args);
        for [(sk, sv), (ck, cv)] in side_env {
            server = server.env(sk, sv);
            client = client.env(ck, cv);
        }
        Case::pair(server, client)
    });
    r.assert_ok(test);
    Some(r)
}

/// The result rows (after the header) each side printed.
fn rows(r: &CaseOutcome) -> Vec<Vec<String>> {
    r.servers
        .iter()
        .chain(&r.clients)
        .map(|o| {
            o.stdout
                .lines()
                .skip_while(|l| !l.starts_with("name"))
                .skip(1)
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Every side printed exactly the tests named in `names`, in order.
fn assert_rows(r: &CaseOutcome, names: &[&str], what: &str) {
    for side in rows(r) {
        let got: Vec<&str> = side
            .iter()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(got, names, "{what}: tests run\n{}", r.report());
    }
}

#[test]
fn rstream_default_run_verified_nonblocking() {
    let Some(r) = both_ends("rstream_default", "rstream", &["-T", "v"]) else {
        return;
    };
    assert_rows(
        &r,
        &[
            "64_lat", "4k_lat", "64k_lat", "1m_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw",
        ],
        "rstream -T v",
    );
}

#[test]
fn rstream_blocking_verified() {
    // Sizes across the chunk sizes (2 KiB doubling to 64 KiB) and the 1 MiB rings' halves.
    let Some(r) = both_ends(
        "rstream_blocking",
        "rstream",
        &["-T", "b", "-T", "v", "-S", "700000", "-C", "40"],
    ) else {
        return;
    };
    assert_rows(&r, &["custom"], "rstream -T b -T v");
}

/// 2 % of every datagram each side sends dropped (fixed seeds), with the paths' life time
/// lowered to 10 (a retransmission timeout of ~134 ms instead of ~2.1 s; see rping.rs):
/// connection setup, data and teardown recover and the data verifies.
#[test]
fn rstream_verified_with_2_percent_loss() {
    let Some(r) = both_ends_with(
        "rstream_loss",
        "rstream",
        &["-T", "v", "-S", "100000", "-C", "100"],
        &[
            [
                ("SOFTVERBS_FAULTS", "loss=0.02,seed=31"),
                ("SOFTVERBS_FAULTS", "loss=0.02,seed=13"),
            ],
            [
                ("SOFTVERBS_CM_PACKET_LIFE_TIME", "10"),
                ("SOFTVERBS_CM_PACKET_LIFE_TIME", "10"),
            ],
        ],
    ) else {
        return;
    };
    assert_rows(&r, &["custom"], "rstream -T v at 2 % loss");
}

/// rstream `-S all` (both sides `args` too), bounded by 15 minutes rather than cm_run's 3.
fn rstream_all_sizes(test: &str, args: &[&str]) {
    if !cm_run::have_tool("rstream", "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let port = procs::free_udp_port().to_string();
    let server = Side::new("/usr/bin/rstream", &["-p", &port, "-S", "all"]).args(args);
    let client = Side::new(
        "/usr/bin/rstream",
        &["-s", "127.0.0.1", "-p", &port, "-S", "all"],
    )
    .args(args);
    let r = procs::run_pair(&lib, &server, &client, std::time::Duration::from_secs(900));
    r.assert_ok(test);
    for out in [&r.server.stdout, &r.client.stdout] {
        let tests = out
            .lines()
            .filter(|l| l.contains("_lat ") || l.contains("_bw "))
            .count();
        assert_eq!(tests, 2 * 33, "{}", r.report());
    }
}

#[test]
fn rstream_all_sizes_verified_nonblocking() {
    rstream_all_sizes("rstream_all", &["-T", "v"]);
}

#[test]
fn rstream_all_sizes_verified_blocking() {
    rstream_all_sizes("rstream_all_blocking", &["-T", "b", "-T", "v"]);
}

#[test]
fn riostream_verified() {
    for (size, count) in [("4096", "500"), ("300000", "40")] {
        let test = format!("riostream_{size}");
        let Some(r) = both_ends(&test, "riostream", &["-T", "v", "-S", size, "-C", count]) else {
            return;
        };
        assert_rows(&r, &["custom"], &test);
    }
}

#[test]
fn rcopy_of_a_random_file_arrives_intact() {
    let test = "rcopy";
    if !cm_run::have_tool("rcopy", "rdmacm-utils") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let dir = procs::scratch(test);
    let src = dir.join("source.bin");
    let dst = dir.join("copy.bin");
    // 3 MiB + a little: several rings' worth, not a multiple of any chunk.
    let data = random_bytes((3 << 20) + 12345, 0x9E37_79B9_7F4A_7C15);
    std::fs::write(&src, &data).expect("write the source file");
    let _ = std::fs::remove_file(&dst);
    let lib = cm_run::dropin(test);
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        let target = format!("127.0.0.1:{}", dst.display());
        // The server serves until killed.
        Case::pair(
            Side::new("/usr/bin/rcopy", &["-p", &port]),
            Side::new(
                "/usr/bin/rcopy",
                &[src.to_str().expect("utf-8 path"), &target, "-p", &port],
            ),
        )
        .servers_run_until_killed()
    });
    r.assert_ok(test);
    let copy = std::fs::read(&dst).expect("the copy exists");
    assert_eq!(copy.len(), data.len(), "{}", r.report());
    assert!(copy == data, "the copy differs\n{}", r.report());
}
