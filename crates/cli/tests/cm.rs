//! The connection manager between two processes on loopback: `softverbs rping` over IPv4
//! and IPv6 (::1), with injected loss, and the errors a second listener and a closed port
//! get.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(90);

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(args).envs(env.iter().copied());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("start softverbs")
}

/// Waits for `child` (killing it after TIMEOUT); returns success and output.
fn finish(mut child: Child) -> (bool, String) {
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut out);
    let _ = child.stderr.take().unwrap().read_to_string(&mut out);
    (status.success(), out)
}

/// A free UDP port on `ip` (rdma_cm ports are UDP ports here).
fn free_port(ip: &str) -> String {
    std::net::UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

fn rping(listen: &str, connect: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port(listen);
    let srv = spawn(&["rping", "-s", "-a", listen, "-p", &port, "-v"], env);
    std::thread::sleep(Duration::from_millis(300));
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
    std::thread::sleep(Duration::from_millis(300));
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
    std::thread::sleep(Duration::from_millis(300));
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
