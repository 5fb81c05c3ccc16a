//! `softverbs rstream` between two processes on loopback: rsocket streams (the rsockets
//! wire protocol) with every byte verified (`-T v`), blocking and non-blocking, and with 2 %
//! injected loss.

mod common;

use common::wait_bound;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

fn finish(child: Child) -> (bool, String) {
    common::finish(child, TIMEOUT)
}

fn free_port() -> String {
    common::free_port("127.0.0.1")
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
