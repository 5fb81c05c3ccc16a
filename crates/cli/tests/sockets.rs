//! `softverbs run --sockets`: unmodified socket programs over rsockets, through Debian's
//! librspreload.so and the drop-in librdmacm. Needs `cargo build --workspace` (the drop-in
//! libraries beside the binary), sockperf and librdmacm1; skips loudly without the last two
//! (fails under `SOFTVERBS_REQUIRE_TOOLS=1`).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const RSPRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
const SOCKPERF: &str = "/usr/bin/sockperf";

/// The descriptors of process `pid` open on /dev/null, beyond stdin/stdout/stderr: what
/// librspreload hands a program in place of a kernel socket when it made an rsocket.
fn placeholders(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) > Some(2))
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t == std::path::Path::new("/dev/null"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Debian's sockperf, unmodified, both ends preloaded: a UDP server and a one-second
/// ping-pong client over datagram rsockets (the server's socket is an rsocket: a
/// placeholder on /dev/null stands for it), and the client reports its latency summary.
#[test]
fn sockperf_udp_ping_pong_runs_over_datagram_rsockets() {
    for (path, package) in [(RSPRELOAD, "librdmacm1"), (SOCKPERF, "sockperf")] {
        if !std::path::Path::new(path).is_file() {
            if std::env::var_os("SOFTVERBS_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
                panic!("{path} not installed (apt-get install {package})");
            }
            eprintln!("SKIPPED: {path} not installed (apt-get install {package})");
            return;
        }
    }
    let port = common::free_port("127.0.0.1");
    let spawn = |args: &[&str]| {
        Command::new(BIN)
            .args(["run", "--sockets", "--", SOCKPERF])
            .args(args)
            .args(["-i", "127.0.0.1", "-p", &port])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start softverbs run")
    };
    let mut server = spawn(&["server"]);
    common::wait_bound(&port);
    let client = spawn(&["ping-pong", "-t", "1"]);
    let (client_ok, client_out) = common::finish(client, Duration::from_secs(60));
    // `softverbs run` execs the program: the child is sockperf itself.
    let server_placeholders = placeholders(server.id());
    let _ = server.kill();
    let (_, server_out) = common::finish(server, Duration::from_secs(10));
    assert!(client_ok, "client:\n{client_out}\nserver:\n{server_out}");
    assert!(
        client_out.contains("Summary: Latency is"),
        "client:\n{client_out}\nserver:\n{server_out}"
    );
    assert!(
        server_placeholders >= 1,
        "the server's socket is not an rsocket\n{server_out}"
    );
}
