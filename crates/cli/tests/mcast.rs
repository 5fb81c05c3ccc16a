//! Multicast across processes (issue 4): three `softverbs mcast --recv`
//! processes attach a UD QP each to one group; one `softverbs mcast --send`
//! process sends once; all three receive that exact message. Real IP multicast
//! on loopback: every device joins the group on its own socket.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
const LIMIT: Duration = Duration::from_secs(60);

/// Kills the process when the test ends early.
struct Killer(Child);

impl Drop for Killer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn softverbs(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("SOFTVERBS_PORT")
        .env_remove("SOFTVERBS_FAULTS")
        .env("SOFTVERBS_ADDR", "127.0.0.1");
    cmd
}

#[test]
fn three_processes_receive_one_send() {
    // A group of this test's own, so concurrent runs do not hear each other.
    let pid = std::process::id();
    let group = format!(
        "239.78.{}.{}:{}",
        pid % 251,
        (pid / 251) % 251,
        20000 + pid % 20000
    );
    let message = format!("hello group {pid}");
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut receivers = Vec::new();
    for i in 0..3 {
        let mut child = softverbs(&["mcast", "--recv", &group, "--timeout", "50"])
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
    let deadline = Instant::now() + LIMIT;
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); 3];
    let next = |lines: &mut Vec<Vec<String>>| {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, line) = rx.recv_timeout(left).expect("receivers went quiet");
        lines[i].push(line);
    };
    while !lines
        .iter()
        .all(|l| l.iter().any(|s| s.starts_with("attached ")))
    {
        next(&mut lines);
    }
    let status = softverbs(&["mcast", "--send", &group, &message])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the sender failed");
    while !lines
        .iter()
        .all(|l| l.iter().any(|s| s.starts_with("received ")))
    {
        next(&mut lines);
    }
    for (i, l) in lines.iter().enumerate() {
        let got = l.iter().find(|s| s.starts_with("received ")).unwrap();
        assert!(
            got.ends_with(&format!(": {message}")),
            "receiver {i} got {got:?}"
        );
        assert!(got.starts_with(&format!("received {} bytes", message.len())));
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
}
