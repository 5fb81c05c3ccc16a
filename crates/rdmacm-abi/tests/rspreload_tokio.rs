//! A Rust tokio rsocket stream (`softverbs::sock`, feature `tokio`) against an unmodified
//! socket program run under Debian's `librspreload.so` with the drop-in `librdmacm.so.1` +
//! softverbs' `libibverbs.so.1` first on `LD_LIBRARY_PATH` (`rspreload_echo.c`: plain
//! socket, bind, listen, accept, connect, read, write, shutdown):
//!
//! - the C program echoes, an `AsyncRdmaStream` client sends 1 MiB of patterned data in
//!   uneven writes and checks the echo byte for byte; the server's socket is an rsocket (it
//!   says so, and the kernel has no TCP listener on its port);
//! - an `AsyncRdmaListener` echoes, the C program is the client and checks the echo; its
//!   socket is an rsocket (librspreload falls back to TCP when `rconnect` fails, so it says).
//!
//! Every child is killed at a deadline. Skips loudly without the preload library or a C
//! compiler, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI). Needs `cargo build --workspace`
//! first.

mod common;

use common::cm_run;
use common::procs::{self, Side};
use common::{build_program, can_build_programs};
use softverbs::sock::{AsyncRdmaListener, AsyncRdmaStream, RdmaListener};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Child;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where Debian's librdmacm1 installs the preload library.
const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// How long one exchange (and a C peer) may take before everything is killed.
const LIMIT: Duration = Duration::from_secs(60);

/// Bytes sent each way.
const TOTAL: usize = 1 << 20;

/// The same pattern as `rspreload_echo.c`'s.
fn pattern(i: usize) -> u8 {
    (i * 7 + (i >> 11)) as u8
}

/// The C echo program, built, and a drop-in directory; None (skipped loudly) without the
/// preload library or a C compiler.
fn setup(test: &str) -> Option<(String, std::path::PathBuf)> {
    if !procs::tool_present(PRELOAD, "librdmacm1") || !can_build_programs() {
        return None;
    }
    let exe = build_program(test, include_str!("rspreload_echo.c"));
    let exe = exe.to_str().expect("utf-8 path").to_string();
    Some((exe, cm_run::dropin(test)))
}

/// The C program under the preload, in a process group of its own.
fn preloaded(exe: &str, args: &[&str], dropin: &Path) -> Peer {
    let side = Side::new(exe, args).env("LD_PRELOAD", PRELOAD);
    let mut cmd = side.command(dropin);
    cmd.process_group(0);
    let mut child = cmd.spawn().expect("start the C program");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Peer {
        child: Some(child),
        lines,
    }
}

/// A C peer whose stdout lines arrive as printed; killed with its process group if the test
/// ends before it does.
struct Peer {
    child: Option<Child>,
    lines: Receiver<String>,
}

impl Peer {
    /// Its next line of output, waiting at most `LIMIT` (empty if none came).
    fn next_line(&self) -> String {
        self.lines.recv_timeout(LIMIT).unwrap_or_default()
    }

    /// Waits (at most `LIMIT`) for its exit; whether it succeeded, its remaining stdout
    /// lines and its stderr.
    fn finish(self) -> (bool, String, String) {
        self.finish_by(Instant::now() + LIMIT)
    }

    /// Kills it unless it exited already; as `finish`.
    fn finish_now(self) -> (bool, String, String) {
        self.finish_by(Instant::now())
    }

    fn finish_by(mut self, deadline: Instant) -> (bool, String, String) {
        let mut child = self.child.take().expect("peer");
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break Some(st);
            }
            if Instant::now() > deadline {
                kill_group(&mut child);
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        // The reader thread ends (and the channel closes) at the end of its stdout.
        let out: Vec<String> = std::iter::from_fn(|| self.lines.recv_timeout(LIMIT).ok()).collect();
        (status.is_some_and(|s| s.success()), out.join("\n"), err)
    }
}

fn kill_group(child: &mut Child) {
    // SAFETY: kill(2) on the process group this child leads (process_group(0) at spawn);
    // it has not been reaped, so the group id is still its own.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.wait();
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            if child.try_wait().ok().flatten().is_none() {
                kill_group(child);
            }
        }
    }
}

/// A port free for both UDP (where the rsocket listens) and TCP (where a kernel socket
/// would).
fn free_port() -> u16 {
    loop {
        let port = procs::free_udp_port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[test]
fn tokio_client_against_a_preloaded_c_echo_server() {
    let test = "rspreload_tokio_client";
    let Some((exe, dropin)) = setup(test) else {
        return;
    };
    let _one_at_a_time = procs::serial();
    let port = free_port();
    let peer = preloaded(&exe, &["server", &port.to_string()], &dropin);
    assert_eq!(peer.next_line(), "listening, rsocket 1");
    // The kernel has no TCP listener there: the server's socket is an rsocket.
    assert_eq!(
        std::net::TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| e.kind())
            .err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "a kernel TCP socket listens on {port}"
    );
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    let rt = runtime();
    let back = rt.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let stream = AsyncRdmaStream::connect(addr)
                .await
                .expect("connect to the C server");
            let (mut rd, mut wr) = tokio::io::split(stream);
            let data = data.clone();
            let writer = tokio::spawn(async move {
                // Uneven writes: 1, 4, 13, ... bytes, up to 64 KiB.
                let (mut at, mut chunk) = (0, 1);
                while at < data.len() {
                    let n = chunk.min(data.len() - at);
                    wr.write_all(&data[at..at + n]).await.expect("write");
                    at += n;
                    chunk = chunk * 3 % 65_521 + 1;
                }
                wr.shutdown().await.expect("shutdown");
                wr
            });
            let mut back = Vec::with_capacity(TOTAL);
            rd.read_to_end(&mut back).await.expect("read until EOF");
            drop(writer.await.expect("writer"));
            back
        })
        .await
    });
    let (back, peer) = in_time(back, peer);
    let (ok, out, err) = peer.finish();
    assert!(ok, "C echo server failed:\n{out}\n{err}");
    assert_eq!(out, format!("echoed {TOTAL}"), "stderr:\n{err}");
    assert_eq!(back.len(), TOTAL);
    assert!(back == data, "the echo differs");
}

#[test]
fn preloaded_c_client_against_a_tokio_echo_server() {
    let test = "rspreload_tokio_server";
    let Some((exe, dropin)) = setup(test) else {
        return;
    };
    let _one_at_a_time = procs::serial();
    let rt = runtime();
    let listener = rt.block_on(async {
        AsyncRdmaListener::new(RdmaListener::bind("127.0.0.1:0".parse().unwrap()).expect("listen"))
    });
    let port = listener.local_addr().expect("address").port();
    let peer = preloaded(
        &exe,
        &["client", &port.to_string(), &TOTAL.to_string()],
        &dropin,
    );
    let echoed = rt.block_on(async {
        tokio::time::timeout(LIMIT, async {
            let (mut s, _) = listener.accept().await.expect("accept the C client");
            let mut buf = vec![0u8; 40_000];
            let mut seen = 0;
            loop {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                assert!(
                    buf[..n]
                        .iter()
                        .enumerate()
                        .all(|(i, &b)| b == pattern(seen + i)),
                    "bytes from C differ near {seen}"
                );
                seen += n;
                s.write_all(&buf[..n]).await.expect("echo");
            }
            s.shutdown().await.expect("shutdown");
            seen
        })
        .await
    });
    let (echoed, peer) = in_time(echoed, peer);
    let (ok, out, err) = peer.finish();
    assert!(ok, "C client failed:\n{out}\n{err}");
    assert_eq!(echoed, TOTAL);
    assert_eq!(
        out,
        format!("connected, rsocket 1\nechoed back {TOTAL}, intact 1"),
        "stderr:\n{err}"
    );
}

/// A current-thread runtime that does not wait for its blocking tasks when dropped: after a
/// timeout, a connect or accept stuck on the blocking pool must not hold the test forever.
struct Runtime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("runtime")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

fn runtime() -> Runtime {
    Runtime(Some(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime"),
    ))
}

/// Fails the test when the exchange timed out, with what the C peer said.
fn in_time<T>(result: Result<T, tokio::time::error::Elapsed>, peer: Peer) -> (T, Peer) {
    match result {
        Ok(v) => (v, peer),
        Err(_) => {
            let (_, out, err) = peer.finish_now();
            panic!("the echo exchange timed out; the C peer said:\n{out}\n{err}");
        }
    }
}
