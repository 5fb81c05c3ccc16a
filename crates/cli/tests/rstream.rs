//! `softverbs rstream` between two processes on loopback: rsocket streams (the rsockets
//! wire protocol) with every byte verified (`-T v`), blocking and non-blocking, and with 2 %
//! injected loss.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const TIMEOUT: Duration = Duration::from_secs(120);

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start softverbs")
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

/// Waits (bounded) until some process has a UDP socket bound at `port` (the server's
/// rendezvous socket): a client that comes too early is refused at once, and a fixed head
/// start is overrun on a loaded machine.
fn wait_bound(port: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let filter = format!("sport = :{port}");
    while Instant::now() < deadline {
        let out = Command::new("ss")
            .args(["-Hlnu", &filter])
            .output()
            .expect("run ss");
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> String {
    std::net::UdpSocket::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// Runs a server and a client with the same test arguments; returns the client's output.
fn rstream(test: &[&str], env: &[(&str, &str)]) -> String {
    let port = free_port();
    let mut sargs = vec!["rstream", "-b", "127.0.0.1", "-p", &port];
    sargs.extend_from_slice(test);
    let srv = spawn(&sargs, env);
    wait_bound(&port);
    let mut cargs = vec!["rstream", "-s", "127.0.0.1", "-p", &port];
    cargs.extend_from_slice(test);
    let (cok, cout) = finish(spawn(&cargs, env));
    let (sok, sout) = finish(srv);
    assert!(
        cok && sok,
        "client ok={cok}:\n{cout}\nserver ok={sok}:\n{sout}"
    );
    assert!(sout.contains("custom"), "{sout}");
    cout
}

#[test]
fn rstream_verified_blocking() {
    let out = rstream(&["-S", "70000", "-C", "30", "-T", "v", "-T", "b"], &[]);
    assert!(
        out.contains("custom    68k     30      1       4m"),
        "{out}"
    );
}

#[test]
fn rstream_verified_nonblocking_small_transfers() {
    let out = rstream(&["-S", "100", "-C", "50", "-I", "20", "-T", "v"], &[]);
    assert!(out.contains("custom    100     50      20"), "{out}");
}

#[test]
fn rstream_verified_with_two_percent_loss() {
    let out = rstream(
        &["-S", "50000", "-C", "10", "-T", "v", "-T", "b"],
        &[("SOFTVERBS_FAULTS", "loss=0.02,seed=11")],
    );
    assert!(
        out.contains("custom    48k     10      1       976k"),
        "{out}"
    );
}
