//! Debian's unmodified perftest 4.5 tools (package perftest: `ib_write_bw`, `ib_write_lat`,
//! `ib_read_bw`, `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_bw`,
//! `ib_atomic_lat`) run as server and client on loopback, on the drop-in `libibverbs.so.1`
//! and the stub `libmlx5.so.1` / `libefa.so.1` perftest links: each with default options,
//! the bandwidth tools also with `-a` (every message size from 2 B to 8 MiB), and every case
//! again with `-x 0` (GID index 0). Both sides must exit 0, and the client's result table
//! must have non-zero figures: the BW average of every size row for bandwidth tests, t_avg
//! for latency tests (figures themselves are not asserted: latency shows multi-ms outliers).
//!
//! perftest busy-polls, so the cases run one at a time (`common::serial`), each bounded by
//! `common::TIMEOUT`. Skips loudly without perftest, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs `cargo build --workspace` first.

mod common;

use common::{PairOutcome, Side, TIMEOUT};

/// Runs `/usr/bin/{tool} -p PORT extra...` as server and client (on 127.0.0.1); None when
/// perftest is not installed (skipped).
fn perftest(test: &str, tool: &str, extra: &[&str]) -> Option<PairOutcome> {
    let path = format!("/usr/bin/{tool}");
    if !common::tool_present(&path, "perftest") {
        return None;
    }
    let _one_at_a_time = common::serial();
    let lib = common::dropin(test);
    let port = common::free_tcp_port().to_string();
    let server = Side::new(&path, &["-p", &port]).args(extra);
    let client = server.clone().args(&["127.0.0.1"]);
    let r = common::run_pair(&lib, &server, &client, TIMEOUT);
    let end = |o: &common::Outcome| match o.status {
        Some(s) => s.to_string(),
        None => "killed at the deadline".to_string(),
    };
    eprintln!(
        "{test}: server {}, client {}, {:.1} s",
        end(&r.server),
        end(&r.client),
        r.elapsed.as_secs_f64()
    );
    Some(r)
}

/// Asserts both sides exited 0 and the client's table has a positive figure in the column
/// named `column` on every row; with `all_sizes`, one row per size from 2 B to 8 MiB.
fn assert_results(test: &str, r: &PairOutcome, column: &str, all_sizes: bool) {
    r.assert_ok(test);
    let report = r.report();
    let (columns, rows) = common::perftest_table(&r.client.stdout)
        .unwrap_or_else(|| panic!("{test}: no `#bytes` result table from the client\n{report}"));
    let idx = columns
        .iter()
        .position(|c| c.starts_with(column))
        .unwrap_or_else(|| panic!("{test}: no column `{column}` in {columns:?}\n{report}"));
    assert!(!rows.is_empty(), "{test}: empty result table\n{report}");
    for row in &rows {
        let value: f64 = row
            .get(idx)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{test}: bad result row {row:?}\n{report}"));
        assert!(
            value > 0.0,
            "{test}: `{column}` is {value} for size {}\n{report}",
            row[0]
        );
    }
    if all_sizes {
        let sizes: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        let want: Vec<String> = (1..=23).map(|b| (1u64 << b).to_string()).collect();
        assert_eq!(sizes, want, "{test}: -a must report 2 B .. 8 MiB\n{report}");
    }
}

/// Iterations per size of the all-sizes runs (`-a`). perftest's default, 5000, moves 80 GB
/// per run (most of it at 8 MiB), which takes a loaded 2-core machine past the case's
/// deadline; 1000 still runs every size many times over.
const ALL_SIZES_ITERS: &str = "1000";

/// A bandwidth test: the `BW average[MB/sec]` of every size row > 0.
fn bw(test: &str, tool: &str, extra: &[&str]) {
    let all_sizes = extra.contains(&"-a");
    let mut args = extra.to_vec();
    if all_sizes {
        args.extend(["-n", ALL_SIZES_ITERS]);
    }
    if let Some(r) = perftest(test, tool, &args) {
        assert_results(test, &r, "BW average", all_sizes);
    }
}

/// A latency test: `t_avg[usec]` > 0.
fn lat(test: &str, tool: &str, extra: &[&str]) {
    if let Some(r) = perftest(test, tool, extra) {
        assert_results(test, &r, "t_avg", false);
    }
}

// --- RDMA WRITE ------------------------------------------------------------------------------

#[test]
fn write_bw() {
    bw("write_bw", "ib_write_bw", &[]);
}

#[test]
fn write_bw_gid0() {
    bw("write_bw_gid0", "ib_write_bw", &["-x", "0"]);
}

#[test]
fn write_bw_all_sizes() {
    bw("write_bw_all", "ib_write_bw", &["-a"]);
}

#[test]
fn write_bw_all_sizes_gid0() {
    bw("write_bw_all_gid0", "ib_write_bw", &["-a", "-x", "0"]);
}

#[test]
fn write_lat() {
    lat("write_lat", "ib_write_lat", &[]);
}

#[test]
fn write_lat_gid0() {
    lat("write_lat_gid0", "ib_write_lat", &["-x", "0"]);
}

// --- RDMA READ -------------------------------------------------------------------------------

#[test]
fn read_bw() {
    bw("read_bw", "ib_read_bw", &[]);
}

#[test]
fn read_bw_gid0() {
    bw("read_bw_gid0", "ib_read_bw", &["-x", "0"]);
}

#[test]
fn read_bw_all_sizes() {
    bw("read_bw_all", "ib_read_bw", &["-a"]);
}

#[test]
fn read_bw_all_sizes_gid0() {
    bw("read_bw_all_gid0", "ib_read_bw", &["-a", "-x", "0"]);
}

#[test]
fn read_lat() {
    lat("read_lat", "ib_read_lat", &[]);
}

#[test]
fn read_lat_gid0() {
    lat("read_lat_gid0", "ib_read_lat", &["-x", "0"]);
}

// --- SEND ------------------------------------------------------------------------------------

#[test]
fn send_bw() {
    bw("send_bw", "ib_send_bw", &[]);
}

#[test]
fn send_bw_gid0() {
    bw("send_bw_gid0", "ib_send_bw", &["-x", "0"]);
}

#[test]
fn send_bw_all_sizes() {
    bw("send_bw_all", "ib_send_bw", &["-a"]);
}

#[test]
fn send_bw_all_sizes_gid0() {
    bw("send_bw_all_gid0", "ib_send_bw", &["-a", "-x", "0"]);
}

#[test]
fn send_lat() {
    lat("send_lat", "ib_send_lat", &[]);
}

#[test]
fn send_lat_gid0() {
    lat("send_lat_gid0", "ib_send_lat", &["-x", "0"]);
}

// --- ATOMIC ----------------------------------------------------------------------------------

#[test]
fn atomic_bw() {
    bw("atomic_bw", "ib_atomic_bw", &[]);
}

#[test]
fn atomic_bw_gid0() {
    bw("atomic_bw_gid0", "ib_atomic_bw", &["-x", "0"]);
}

#[test]
fn atomic_lat() {
    lat("atomic_lat", "ib_atomic_lat", &[]);
}

#[test]
fn atomic_lat_gid0() {
    lat("atomic_lat_gid0", "ib_atomic_lat", &["-x", "0"]);
}

/// `ib_atomic_bw -a` cannot run on any device, real or not: atomics are always 8 bytes, and
/// perftest 4.5 itself rejects `-a` (every size) for atomic tests while parsing its arguments
/// ("Message size cannot be changed for Atomic tests", exit 1), on both sides. The case
/// checks that the tools start on the drop-in and fail for that reason only, without the
/// client ever trying to reach the server.
fn atomic_bw_all_sizes_rejected_by_perftest(test: &str, extra: &[&str]) {
    const REJECTED: &str = "Message size cannot be changed for Atomic tests";
    let Some(r) = perftest(test, "ib_atomic_bw", extra) else {
        return;
    };
    let report = r.report();
    for (who, o) in [("server", &r.server), ("client", &r.client)] {
        assert!(
            !o.timed_out() && !o.success(),
            "{test}: the {who} must exit non-zero by itself\n{report}"
        );
        assert!(
            o.output().contains(REJECTED),
            "{test}: the {who} must say `{REJECTED}`\n{report}"
        );
    }
    assert_eq!(r.client_attempts, 1, "{test}\n{report}");
}

#[test]
fn atomic_bw_all_sizes_is_rejected() {
    atomic_bw_all_sizes_rejected_by_perftest("atomic_bw_all", &["-a"]);
}

#[test]
fn atomic_bw_all_sizes_gid0_is_rejected() {
    atomic_bw_all_sizes_rejected_by_perftest("atomic_bw_all_gid0", &["-a", "-x", "0"]);
}

/// The harness runs a pair again when perftest failed its own clock calibration (the fit
/// of TSC cycles against `gettimeofday` it makes before its report; a preempted step fails
/// it on a VM): a stand-in client that prints perftest's message and exits 1 once, then
/// succeeds, makes a pair that succeeds on its second run; one that always fails is run
/// three times and reported failed. Any other failure is not run again.
#[test]
fn a_pair_whose_perftest_clock_check_failed_runs_again() {
    let dir = common::scratch("clock_check_rerun");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let flag = dir.join("failed-once");
    let once = format!(
        "if [ -e {f} ]; then exit 0; fi; touch {f}; echo 'Correlation coefficient r^2: 0.8 < 0.9' >&2; echo \"Can't produce a report\" >&2; exit 1",
        f = flag.display()
    );
    let server = Side::new("/bin/sh", &["-c", "exit 0"]);
    let pair = |client: &str| {
        common::run_pair(
            &dir,
            &server,
            &Side::new("/bin/sh", &["-c", client]),
            std::time::Duration::from_secs(20),
        )
    };
    let r = pair(&once);
    assert!(r.both_ok(), "the second run must succeed\n{}", r.report());
    assert_eq!(r.clock_check_reruns, 1, "{}", r.report());
    let r = pair("echo 'Correlation coefficient r^2: 0.8 < 0.9' >&2; exit 1");
    assert!(!r.both_ok());
    assert_eq!(r.clock_check_reruns, 2, "{}", r.report());
    let r = pair("echo 'Failed to exchange data' >&2; exit 1");
    assert!(!r.both_ok());
    assert_eq!(r.clock_check_reruns, 0, "{}", r.report());
}
