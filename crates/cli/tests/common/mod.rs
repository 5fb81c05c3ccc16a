//! What the cli's process tests share: waiting for a child with a deadline, reading its
//! output, and the rdma_cm port a server listens on.

// Each test crate uses part of this.
#![allow(dead_code)]

/// ibverbs-abi's test harness (tool detection, network namespaces), shared by path rather
/// than copied.
#[path = "../../../ibverbs-abi/tests/common/mod.rs"]
pub mod procs;

use std::io::Read;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// Waits for `child`, killing it once `timeout` has passed.
pub fn wait_or_kill(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` (killing it after `timeout`); returns success and output (stdout,
/// then stderr), read as it comes so that a chatty child never blocks on a full pipe.
pub fn finish(mut child: Child, timeout: Duration) -> (bool, String) {
    let readers: Vec<_> = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    })
    .collect();
    let status = wait_or_kill(&mut child, timeout);
    let out = readers
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect::<String>();
    (status.success(), out)
}

/// Waits (bounded) until some process has a UDP socket bound at `port` (the server's
/// rendezvous socket): a fixed head start was overrun on a loaded machine, and a client that
/// comes too early is refused at once.
pub fn wait_bound(port: &str) {
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

/// A free UDP port on `ip` (rdma_cm ports are UDP ports here).
pub fn free_port(ip: &str) -> String {
    std::net::UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}
