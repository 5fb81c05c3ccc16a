//! The connection manager between two processes on loopback: `softverbs rping` over IPv4
//! and IPv6 (::1), with injected loss, and the errors a second listener and a closed port
//! get; `perf --cm` (every operation, RC and UD, several QPs) and `pingpong --cm`; UD service
//! resolution (`udaddy`) and multicast joins (`mcast --cm`, three receiving processes) over
//! IPv4 and IPv6, clean and with 2 % loss.

mod common;

use common::{free_port, wait_bound};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(90);

/// Benchmarks spin; on a two-core machine they run one at a time.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("SOFTVERBS_FAULTS")
        .env_remove("SOFTVERBS_PORT")
        .env_remove("SOFTVERBS_ADDR")
        .envs(env.iter().copied());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start softverbs")
}

fn finish(child: Child) -> (bool, String) {
    common::finish(child, TIMEOUT)
}

fn rping(listen: &str, connect: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port(listen);
    let srv = spawn(&["rping", "-s", "-a", listen, "-p", &port, "-v"], env);
    wait_bound(&port);
    let mut args = vec!["rping", "-c", "-a", connect, "-p", &port, "-V", "-v"];
    args.extend_from_slice(extra);
    let cli = spawn(&args, env);
    let (cok, cout) = finish(cli);
    let (sok, sout) = finish(srv);
    assert!(
        cok && sok,
        "client ok={cok}:\n{cout}\nserver ok={sok}:\n{sout}"
    );
    cout
}

#[test]
fn rping_over_ipv4_loopback() {
    let out = rping("127.0.0.1", "127.0.0.1", &["-C", "50", "-S", "1000"], &[]);
    assert!(out.contains("rping client: 50 pings done"), "{out}");
    assert!(out.contains("ping data: rdma-ping-49: "), "{out}");
}

#[test]
fn rping_over_ipv6_loopback() {
    let out = rping("::1", "::1", &["-C", "20", "-S", "64"], &[]);
    assert!(out.contains("rping client: 20 pings done"), "{out}");
}

#[test]
fn rping_with_two_percent_loss() {
    let out = rping(
        "127.0.0.1",
        "127.0.0.1",
        &["-C", "10", "-S", "3000"],
        &[("SOFTVERBS_FAULTS", "loss=0.02,seed=7")],
    );
    assert!(out.contains("rping client: 10 pings done"), "{out}");
}

#[test]
fn a_second_server_on_the_port_fails_and_a_closed_port_is_refused() {
    let port = free_port("127.0.0.1");
    let first = spawn(&["rping", "-s", "-a", "127.0.0.1", "-p", &port], &[]);
    wait_bound(&port);
    let (ok, out) = finish(spawn(&["rping", "-s", "-a", "127.0.0.1", "-p", &port], &[]));
    assert!(!ok && out.contains("address and port in use"), "{out}");
    // Let the first server finish: one client, one ping.
    let (ok, out) = finish(spawn(
        &[
            "rping",
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "1",
            "-V",
        ],
        &[],
    ));
    assert!(ok, "{out}");
    assert!(finish(first).0);
    // Nothing listens there now: the connect is rejected (ICMP port unreachable), not
    // left waiting for the CM's retries.
    let (ok, out) = finish(spawn(
        &["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"],
        &[],
    ));
    assert!(!ok && out.contains("Rejected"), "{out}");
}

#[test]
fn pingpong_connects_through_the_cm() {
    let port = free_port("127.0.0.1");
    let srv = spawn(
        &[
            "pingpong",
            "--cm",
            "--server",
            "-p",
            &port,
            "-s",
            "3000",
            "-n",
            "100",
            "--validate",
        ],
        &[],
    );
    wait_bound(&port);
    let (cok, cout) = finish(spawn(
        &[
            "pingpong",
            "--cm",
            "127.0.0.1",
            "-p",
            &port,
            "-s",
            "3000",
            "-n",
            "100",
            "--validate",
        ],
        &[],
    ));
    let (sok, sout) = finish(srv);
    assert!(cok && sok, "{cout}\n{sout}");
    assert!(cout.contains("100 iters in"), "{cout}");
}

/// `softverbs perf OP --cm` between two processes: a server, then a client connecting to
/// `connect` with `client` arguments (JSON output, parsed). The client retries while the
/// server is not listening yet, as perftest's -R does.
fn perf_cm(op: &str, connect: &str, client: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let _one = heavy();
    let port = free_port("0.0.0.0");
    let srv = spawn(&["perf", op, "--server", "--cm", "-p", &port], env);
    let mut args = vec!["perf", op, connect, "--cm", "-p", &port, "--json"];
    args.extend_from_slice(client);
    let (cok, cout) = finish(spawn(&args, env));
    let (sok, sout) = finish(srv);
    assert!(
        cok && sok,
        "client ok={cok}:\n{cout}\nserver ok={sok}:\n{sout}"
    );
    assert!(
        sout.contains(&format!("softverbs perf {op} server:")),
        "{sout}"
    );
    let json = cout
        .lines()
        .take_while(|l| !l.is_empty())
        .collect::<String>();
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {cout}"));
    assert_eq!(v["exchange"], format!("rdma_cm port {port}"), "{v}");
    v
}

/// Checks one bandwidth row and one latency row of `iters` iterations.
fn check_rows(v: &serde_json::Value, iters: u64) {
    let bw = v["bw"].as_array().unwrap();
    let lat = v["lat"].as_array().unwrap();
    assert_eq!((bw.len(), lat.len()), (1, 1), "{v}");
    assert_eq!(bw[0]["iterations"], iters, "{v}");
    assert!(bw[0]["bw_avg_mb_per_sec"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(lat[0]["iterations"], iters, "{v}");
    assert!(lat[0]["t_min_usec"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn perf_write_and_read_connect_their_qps_through_the_cm() {
    for (op, qps) in [("write", "3"), ("read", "2")] {
        let v = perf_cm(
            op,
            "127.0.0.1",
            &[
                "--bw", "--lat", "--qps", qps, "--size", "4096", "--iters", "200",
            ],
            &[],
        );
        assert_eq!(v["connection"], "RC");
        assert_eq!(v["qps"].as_u64().unwrap().to_string(), qps);
        check_rows(&v, 200);
    }
}

#[test]
fn perf_send_and_atomic_connect_their_qps_through_the_cm() {
    for op in ["send", "atomic"] {
        let v = perf_cm(
            op,
            "127.0.0.1",
            &["--bw", "--lat", "--qps", "2", "--iters", "200"],
            &[],
        );
        assert_eq!(v["connection"], "RC");
        check_rows(&v, 200);
    }
}

/// UD QPs find each other by service resolution (SIDR), here with rdma_cm addresses on
/// IPv6 loopback.
#[test]
fn perf_ud_send_resolves_its_qps_through_sidr_over_ipv6() {
    let v = perf_cm(
        "send",
        "::1",
        &[
            "--ud", "--bw", "--lat", "--qps", "2", "--size", "1024", "--iters", "200",
        ],
        &[],
    );
    assert_eq!(v["connection"], "UD");
    check_rows(&v, 200);
}

/// UD bandwidth through the connection manager over ten times the receives the server
/// keeps posted: the run ends, every message counted as received or lost.
#[test]
fn perf_ud_bw_over_the_cm_outlasts_the_receive_queue() {
    let v = perf_cm(
        "send",
        "127.0.0.1",
        &["--ud", "--bw", "--size", "1024", "--iters", "5000"],
        &[],
    );
    let row = &v["bw"][0];
    assert_eq!(row["iterations"], 5000, "{v}");
    let received = row["received"].as_u64().expect("received count");
    let lost = row["lost"].as_u64().expect("lost count");
    assert_eq!(received + lost, 5000, "{v}");
    assert!(received > 0, "{v}");
}

#[test]
fn perf_cm_with_two_percent_loss() {
    let v = perf_cm(
        "write",
        "127.0.0.1",
        &[
            "--bw", "--lat", "--qps", "2", "--size", "8192", "--iters", "200",
        ],
        // On the UDP path: same-host WRITEs now complete without a packet, so no loss
        // would be injected at all.
        &[
            ("SOFTVERBS_FAULTS", "loss=0.02,seed=5"),
            ("SOFTVERBS_SAME_HOST", "0"),
        ],
    );
    check_rows(&v, 200);
    let c = &v["client_counters"];
    assert!(c["injected_drops"].as_u64().unwrap() > 0, "{c}");
    assert!(c["retransmitted_packets"].as_u64().unwrap() > 0, "{c}");
}

/// The main job with `--cm`: both ends on this machine, the server a child process.
#[test]
fn perf_cm_runs_both_ends_locally() {
    let _one = heavy();
    let (ok, out) = finish(spawn(
        &["perf", "write", "--bw", "--cm", "--iters", "300"],
        &[],
    ));
    assert!(ok, "{out}");
    assert!(out.contains("Data ex. method : rdma_cm port"), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("65536 ")),
        "{out}"
    );
}

/// `softverbs udaddy` between two processes: the server listens at `listen` (or every
/// address), the client resolves the service at `connect` and exchanges datagrams.
fn udaddy(listen: Option<&str>, connect: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port(listen.unwrap_or("0.0.0.0"));
    let mut sargs = vec!["udaddy", "-s", "-p", &port, "-v"];
    if let Some(l) = listen {
        sargs.extend(["-a", l]);
    }
    let srv = spawn(&sargs, env);
    wait_bound(&port);
    let mut args = vec!["udaddy", "-c", "-a", connect, "-p", &port, "-V"];
    args.extend_from_slice(extra);
    let (cok, cout) = finish(spawn(&args, env));
    let (sok, sout) = finish(srv);
    assert!(
        cok && sok,
        "client ok={cok}:\n{cout}\nserver ok={sok}:\n{sout}"
    );
    cout
}

/// How many messages the client sent again (udaddy's summary line).
fn resent(out: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("udaddy client:"))
        .unwrap_or_else(|| panic!("{out}"));
    line.rsplit(", ")
        .next()
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn udaddy_resolves_a_ud_service_over_ipv4() {
    let out = udaddy(
        None,
        "127.0.0.1",
        &["-C", "20", "-n", "2", "-S", "500"],
        &[],
    );
    assert!(
        out.contains("udaddy client: 40 message(s) echoed on 2 connection(s), 0 sent again"),
        "{out}"
    );
}

#[test]
fn udaddy_resolves_a_ud_service_over_ipv6() {
    let out = udaddy(Some("::1"), "::1", &["-C", "20", "-S", "1000"], &[]);
    assert!(
        out.contains("udaddy client: 20 message(s) echoed on 1 connection(s)"),
        "{out}"
    );
}

/// With 2 % of the datagrams dropped (CM and data alike) every message still comes back,
/// some after being sent again.
#[test]
fn udaddy_with_two_percent_loss() {
    for (listen, connect) in [(None, "127.0.0.1"), (Some("::1"), "::1")] {
        let out = udaddy(
            listen,
            connect,
            &["-C", "150", "-S", "1000"],
            &[("SOFTVERBS_FAULTS", "loss=0.02,seed=7")],
        );
        assert!(
            out.contains("udaddy client: 150 message(s) echoed on 1 connection(s)"),
            "{out}"
        );
        assert!(
            resent(&out) > 0,
            "2 % loss of ~600 datagrams lost none: {out}"
        );
    }
}

/// A multicast group of this test's own, so concurrent runs do not hear each other.
fn own_group(tag: u32) -> String {
    let pid = std::process::id();
    format!("239.{}.{}.{}", 100 + tag, pid % 251, (pid / 251) % 251)
}

/// Kills a process when a test ends early.
struct Killer(Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three `mcast --cm --recv` processes join `group` through the connection manager (ids
/// bound to `bind`), one `mcast --cm --send` process (send-only join) sends `repeat`
/// copies; every receiver gets the message. Returns the receivers' lines.
fn multicast_cm(group: &str, bind: &str, repeat: &str, env: &[(&str, &str)]) -> Vec<Vec<String>> {
    let message = format!("hello group {group}");
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut receivers = Vec::new();
    for i in 0..3 {
        let mut child = Command::new(BIN)
            .args([
                "mcast",
                "--cm",
                "--bind",
                bind,
                "--recv",
                group,
                "--timeout",
                "60",
            ])
            .env_remove("SOFTVERBS_PORT")
            .env_remove("SOFTVERBS_ADDR")
            .env_remove("SOFTVERBS_FAULTS")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((i, line));
            }
        });
        receivers.push(Killer(child));
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); 3];
    let next = |lines: &mut Vec<Vec<String>>| {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, line) = rx.recv_timeout(left).expect("receivers went quiet");
        lines[i].push(line);
    };
    while !lines
        .iter()
        .all(|l| l.iter().any(|s| s.starts_with("joined ")))
    {
        next(&mut lines);
    }
    let (ok, out) = finish(spawn(
        &[
            "mcast", "--cm", "--bind", bind, "--send", group, &message, "--repeat", repeat,
        ],
        env,
    ));
    assert!(ok, "the sender failed: {out}");
    while !lines
        .iter()
        .all(|l| l.iter().any(|s| s.starts_with("received ")))
    {
        next(&mut lines);
    }
    for (i, l) in lines.iter().enumerate() {
        let joined = l.iter().find(|s| s.starts_with("joined ")).unwrap();
        assert!(
            joined.starts_with(&format!("joined {group} through the connection manager")),
            "receiver {i}: {joined}"
        );
        let got = l.iter().find(|s| s.starts_with("received ")).unwrap();
        assert!(
            got.ends_with(&format!(": {message}")),
            "receiver {i} got {got:?}"
        );
    }
    for (i, mut r) in receivers.into_iter().enumerate() {
        let status = loop {
            if let Some(s) = r.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "receiver {i} did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "receiver {i} exited with {status}");
    }
    lines
}

#[test]
fn multicast_join_through_the_cm_reaches_three_processes() {
    multicast_cm(&own_group(1), "127.0.0.1", "1", &[]);
}

/// rdma_cm ids on IPv6 loopback join an IPv4 group (the group's address family is what
/// counts); an IPv6 group is refused, as Linux refuses it with RoCEv2 GIDs.
#[test]
fn multicast_join_from_ipv6_ids_and_ipv6_groups_refused() {
    multicast_cm(&own_group(2), "::1", "1", &[]);
    let (ok, out) = finish(spawn(
        &[
            "mcast",
            "--cm",
            "--bind",
            "::1",
            "--recv",
            "ff0e::1:2",
            "--timeout",
            "5",
        ],
        &[],
    ));
    assert!(!ok && out.contains("IPv6 multicast"), "{out}");
}

/// With 2 % loss the sender repeats itself (multicast has no retransmission): every
/// receiver still gets the message.
#[test]
fn multicast_through_the_cm_with_two_percent_loss() {
    multicast_cm(
        &own_group(3),
        "127.0.0.1",
        "10",
        &[("SOFTVERBS_FAULTS", "loss=0.02,seed=9")],
    );
}
