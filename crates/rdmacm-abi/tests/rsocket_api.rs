//! The rsocket C API of the drop-in `librdmacm.so.1` from an ordinary C program
//! (`rsocket_api.c`, built against Debian's `<rdma/rsocket.h>` and run on the drop-in
//! libraries), alone and against Rust `softverbs::sock` streams in this process:
//!
//! - `local`: non-blocking `rconnect` (EINPROGRESS, rpoll POLLOUT, SO_ERROR), `rpoll` and
//!   `rselect` mixing an rsocket with a pipe, partial non-blocking writes then EAGAIN, EOF
//!   after `rshutdown(SHUT_WR)` with the other direction still open, options, rsocket.c's
//!   errno values;
//! - a Rust `RdmaStream` client against the C program's echo server, and the C program as a
//!   client of a Rust `RdmaListener`: data both ways, verified, then EOF.
//!
//! Needs `cc`, librdmacm-dev and the workspace's libibverbs cdylib (`cargo build
//! --workspace`); skips loudly without the first two, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use common::{build_program, can_build_programs, dropin, run_on};
use softverbs::sock::{RdmaListener, RdmaStream};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SOURCE: &str = include_str!("rsocket_api.c");

/// How long a C peer may run.
const LIMIT: Duration = Duration::from_secs(60);

fn program(name: &str) -> Option<(PathBuf, PathBuf)> {
    if !can_build_programs() {
        return None;
    }
    Some((build_program(name, SOURCE), dropin(name, true)))
}

fn pattern(i: usize) -> u8 {
    (i * 7 + (i >> 11)) as u8
}

/// Kills the child if the test fails before it ends.
struct Peer(Child);

impl Peer {
    fn spawn(exe: &PathBuf, dir: &PathBuf, args: &[&str]) -> Peer {
        Peer(
            Command::new(exe)
                .args(args)
                .env("LD_LIBRARY_PATH", dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the C program"),
        )
    }

    /// Waits (bounded) for the exit; returns success, stdout, stderr.
    fn finish(mut self) -> (bool, String, String) {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(st) = self.0.try_wait().expect("wait") {
                break Some(st);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = String::new();
        let mut err = String::new();
        if status.is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        if let Some(mut o) = self.0.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.is_some_and(|s| s.success()), out, err)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// What `rsocket_api local` prints (ENOTSUP and EOPNOTSUPP are one value on Linux;
/// `strerrorname_np` names it EOPNOTSUPP).
const LOCAL_EXPECTED: &str = "\
fd is real 1
reuseaddr 0 -
rbind 0 -
rlisten 0 -
rgetsockname 0 -
listening port nonzero 1 len 16
rfcntl_setfl_listener 0 -
raccept_none -1 EAGAIN
rpoll_listener_idle 0 -
rbind_first 0 -
bound port nonzero 1
rbind_taken -1 EADDRINUSE
rclose_b1 0 -
rbind_freed 0 -
rclose_b2 0 -
rbind_reuse_first 0 -
rbind_reuse_second 0 -
reuseaddr_after_bind 0 -
v6only 0 -
rbind_v6only 0 -
v6only_changed_after_bind -1 EINVAL
rbind_v4_beside_v6only 0 -
rbind_dual 0 -
rbind_v4_beside_dual -1 EADDRINUSE
sndbuf 0 -
get_sndbuf 0 -
sndbuf 131072 len 4
sqsize 0 -
get_sqsize 0 -
sqsize 64
iomapsize 0 -
get_iomapsize 0 -
iomapsize 256
nodelay 0 -
get_nodelay 0 -
nodelay 1
linger_off 0 -
get_linger 0 -
linger 0
unknown_opt -1 EOPNOTSUPP
get_unknown_opt -1 EOPNOTSUPP
keepidle_zero -1 EINVAL
rsend_unconnected -1 ENOTCONN
rfcntl_getfl 2 -
rfcntl_bad_cmd -1 EOPNOTSUPP
rbind_client 0 -
client bound port nonzero 1
rfcntl_setfl 0 -
getfl nonblock 1
rconnect -1 EINPROGRESS
rconnect_again -1 EINPROGRESS
listener readable 1
rfcntl_listener_block 0 -
accepted peer family 1 len 16
connected writable 1
so_error 0 -
so_error 0
plain poll on the descriptor 0
rconnect_connected 0 -
keepidle 0 -
keepalive 0 -
get_keepalive 0 -
keepalive 1
get_keepidle 0 -
keepidle 7
sqsize_after_connect -1 EINVAL
client name is server's peer 1
client name is its rbind address 1
client peer port is listener's 1
rpoll_nothing 0 -
rpoll_pipe 1 -
pipe 1 rsocket 0
rsend_null -1 EFAULT
rrecv_null -1 EFAULT
riomap_null -1 EINVAL
riomap_bad_prot -1 EINVAL
riounmap_unknown -1 EINVAL
riowrite_unmapped 0 -
rsend_hello 5 -
rpoll_rsocket 1 -
pipe 0 rsocket 1
rrecv_peek 3 -
rrecv 5 -
got hello
rsend_x 1 -
rselect 1 -
select pipe 0 rsocket 1
rread 1 -
rrecv_empty_nonblocking -1 EAGAIN
partial 1 then eagain 1, some sent 1
rpoll_not_writable 0 -
moved 4194304 intact 1
rsend_one 3 -
rsend_two 3 -
rsend_three 5 -
peeked 11 onetwothree
rrecv_peek_some 5 -
peeked onetw
rrecv_all 11 -
got onetwothree
rfcntl_block 0 -
rwritev 5 -
rrecv_waitall 5 -
readv got abcde
rsendto_addr -1 EISCONN
rsendmsg 5 -
rreadv some 1
rsendmsg got abcde
rsend_last 3 -
rshutdown_wr 0 -
rrecv_last 3 -
last end
eof readable 1
rrecv_eof 0 -
rsend_back 4 -
rrecv_back 4 -
back back
rsend_after_shutdown -1 ECONNRESET
rshutdown_bad -1 EINVAL
rclose_srv 0 -
rrecv_after_peer_close 0 -
rclose_rs 0 -
rclose_again -1 EBADF
rsend_closed -1 EBADF
rconnect_refused -1 ECONNREFUSED
rconnect_after_error -1 ENOTCONN
rclose_lonely 0 -
";

#[test]
fn c_rsockets_in_one_process() {
    let Some((exe, dir)) = program("rsocket-api-local") else {
        return;
    };
    let out = run_on(&exe, &dir);
    assert!(
        out.success,
        "rsocket_api local failed:\n{}\n{}",
        out.stdout, out.stderr
    );
    assert_eq!(out.stdout, LOCAL_EXPECTED, "stderr:\n{}", out.stderr);
}

#[test]
fn rust_stream_client_against_a_c_rsocket_echo_server() {
    let Some((exe, dir)) = program("rsocket-api-echo") else {
        return;
    };
    let port = common::procs::free_udp_port();
    let mut peer = Peer::spawn(&exe, &dir, &["echo", &port.to_string()]);
    let mut lines = BufReader::new(peer.0.stdout.take().expect("stdout"));
    let mut first = String::new();
    lines
        .read_line(&mut first)
        .expect("read the server's first line");
    assert_eq!(first, "listening\n");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let stream = RdmaStream::connect(addr).expect("connect to the C server");
    const TOTAL: usize = 1 << 20;
    let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
    let mut back = Vec::with_capacity(TOTAL + 3);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut w = &stream;
            w.write_all(&data).expect("write");
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
        });
        let mut r = &stream;
        r.read_to_end(&mut back).expect("read until EOF");
        writer.join().expect("writer");
    });
    drop(stream);
    peer.0.stdout = Some(lines.into_inner());
    let (ok, out, err) = peer.finish();
    assert!(ok, "C echo server failed:\n{out}\n{err}");
    assert_eq!(back.len(), TOTAL + 3, "server: {out}{err}");
    assert!(back[..TOTAL] == data[..], "the echo differs");
    assert_eq!(&back[TOTAL..], b"bye");
    assert_eq!(out, format!("echoed {TOTAL}\n"));
}

#[test]
fn c_rsocket_client_against_a_rust_listener() {
    let Some((exe, dir)) = program("rsocket-api-client") else {
        return;
    };
    let listener = RdmaListener::bind("127.0.0.1:0".parse().unwrap()).expect("listen");
    let port = listener.local_addr().expect("address").port();
    const TOTAL: usize = 3 << 20;
    let peer = Peer::spawn(
        &exe,
        &dir,
        &["client", &port.to_string(), &TOTAL.to_string()],
    );
    let (stream, _) = listener.accept().expect("accept the C client");
    // Echo until EOF, checking the bytes on the way.
    let mut buf = vec![0u8; 100_000];
    let mut seen = 0;
    loop {
        let n = (&stream).read(&mut buf).expect("read");
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
        (&stream).write_all(&buf[..n]).expect("echo");
    }
    assert_eq!(seen, TOTAL);
    drop(stream);
    let (ok, out, err) = peer.finish();
    assert!(ok, "C client failed:\n{out}\n{err}");
    assert_eq!(out, "echo intact 1\neof 0\n");
}
