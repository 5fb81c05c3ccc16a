//! Debian's unmodified `ibv_rc_pingpong` (package ibverbs-utils) runs as server and client,
//! two processes on loopback, on the drop-in `libibverbs.so.1`.
//!
//! Skips loudly without the tool, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIB: &str = "libsoftverbs_ibverbs.so";
const TOOL: &str = "/usr/bin/ibv_rc_pingpong";

/// A directory holding `libibverbs.so.1` -> the cdylib cargo built beside this test.
fn dropin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let so = [deps.parent().expect("profile dir"), deps]
        .iter()
        .map(|d| d.join(LIB))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{LIB} not found next to {}", deps.display()));
    let dir = common::scratch(name);
    let link = dir.join("libibverbs.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(so, &link).expect("symlink libibverbs.so.1");
    dir
}

fn free_udp_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

fn free_tcp_port() -> u16 {
    let s = TcpListener::bind("127.0.0.1:0").expect("bind");
    s.local_addr().expect("addr").port()
}

fn spawn(lib: &Path, args: &[String], udp: u16) -> Child {
    Command::new(TOOL)
        .args(args)
        .env("LD_LIBRARY_PATH", lib)
        .env("SOFTVERBS_ADDR", "127.0.0.1")
        .env("SOFTVERBS_PORT", udp.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ibv_rc_pingpong")
}

/// Waits up to `deadline` for `c`, killing it after; (success, stdout, stderr).
fn finish(mut c: Child, deadline: Instant) -> (bool, String, String) {
    let ok = loop {
        if let Some(st) = c.try_wait().expect("wait") {
            break st.success();
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = c.wait_with_output().expect("output");
    (
        ok,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs server and client with `extra` arguments; both must exit 0 within 60 s.
fn pingpong(name: &str, extra: &[&str]) {
    if !Path::new(TOOL).is_file() {
        common::skip(&format!(
            "`{TOOL}` not available (apt-get install ibverbs-utils)"
        ));
        return;
    }
    let lib = dropin(name);
    let tcp = free_tcp_port().to_string();
    let mut args: Vec<String> = ["-g", "0", "-p", &tcp].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let server = spawn(&lib, &args, free_udp_port());
    let mut cargs = args.clone();
    cargs.push("127.0.0.1".into());
    let deadline = Instant::now() + Duration::from_secs(60);
    // The server may not listen yet: retry the client while it cannot connect (a refused
    // connection does not use up the server's single accept).
    let (cok, cout, cerr) = loop {
        std::thread::sleep(Duration::from_millis(200));
        let client = spawn(&lib, &cargs, free_udp_port());
        let r = finish(client, deadline);
        if r.0 || !r.2.contains("Couldn't connect") || Instant::now() > deadline {
            break r;
        }
    };
    let (sok, sout, serr) = finish(server, deadline);
    let report = format!("server ok={sok}\n{sout}\n{serr}\nclient ok={cok}\n{cout}\n{cerr}");
    assert!(sok && cok, "ibv_rc_pingpong failed:\n{report}");
    assert!(sout.contains("iters in"), "{report}");
    assert!(cout.contains("iters in"), "{report}");
}

#[test]
fn rc_pingpong_default() {
    pingpong("rc_pingpong_default", &[]);
}

#[test]
fn rc_pingpong_64k_messages() {
    pingpong("rc_pingpong_64k", &["-n", "100", "-s", "65536"]);
}

#[test]
fn rc_pingpong_with_events() {
    pingpong("rc_pingpong_events", &["-e", "-n", "200"]);
}
