//! Debian's unmodified perftest 4.5 with `-R` (connections and the parameter exchange over
//! rdma_cm instead of a TCP socket) as server and client on 127.0.0.1, on the drop-in
//! `librdmacm.so.1` + softverbs' `libibverbs.so.1` and the stub `libmlx5.so.1` /
//! `libefa.so.1`: ib_send_bw, ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_lat,
//! ib_write_lat, and ib_send_bw `-c UD`. Both sides must exit 0, say they used rdma_cm
//! (`rdma_cm QPs : ON`), and the client's result table must have a positive figure (BW
//! average, or t_avg for latency; figures themselves are for bench/perftest.sh).
//!
//! perftest busy-polls, so the cases run one at a time, each bounded. Skips loudly without
//! perftest, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs `cargo build --workspace`
//! first.

mod common;

use common::cm_run::{self, Case};
use common::procs::{self, Side};
use std::time::Duration;

/// Iterations: enough to measure something, few enough to keep the set quick.
const ITERS: &str = "1000";

/// Runs `tool -R -p PORT -n ITERS extra...` as server and client, and checks the client's
/// table has a positive `column` on every row.
fn perftest_cm(test: &str, tool: &str, extra: &[&str], column: &str) {
    if !cm_run::have_tool(tool, "perftest") {
        return;
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let path = format!("/usr/bin/{tool}");
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        let server = Side::new(&path, &["-R", "-p", &port, "-n", ITERS]).args(extra);
        let client = server.clone().args(&["127.0.0.1"]);
        // perftest sets up its buffers before it listens (slowly on a loaded machine).
        Case::pair(server, client).head_start(Duration::from_secs(2))
    });
    r.assert_ok(test);
    let report = r.report();
    for o in r.servers.iter().chain(&r.clients) {
        assert!(
            o.stdout
                .lines()
                .any(|l| l.contains("rdma_cm QPs") && l.contains("ON")),
            "{test}: pid {} did not use rdma_cm\n{report}",
            o.pid
        );
    }
    let (columns, rows) = procs::perftest_table(&r.clients[0].stdout)
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
        assert!(value > 0.0, "{test}: `{column}` is {value}\n{report}");
    }
}

#[test]
fn send_bw() {
    perftest_cm("cm_send_bw", "ib_send_bw", &[], "BW average");
}

#[test]
fn write_bw() {
    perftest_cm("cm_write_bw", "ib_write_bw", &[], "BW average");
}

#[test]
fn read_bw() {
    perftest_cm("cm_read_bw", "ib_read_bw", &[], "BW average");
}

#[test]
fn atomic_bw() {
    perftest_cm("cm_atomic_bw", "ib_atomic_bw", &[], "BW average");
}

#[test]
fn send_lat() {
    perftest_cm("cm_send_lat", "ib_send_lat", &[], "t_avg");
}

#[test]
fn write_lat() {
    perftest_cm("cm_write_lat", "ib_write_lat", &[], "t_avg");
}

#[test]
fn send_bw_ud() {
    perftest_cm("cm_send_bw_ud", "ib_send_bw", &["-c", "UD"], "BW average");
}
