//! Datagram rsockets (`rsocket(AF_INET, SOCK_DGRAM, 0)`) on the drop-in `librdmacm.so.1` +
//! softverbs' `libibverbs.so.1`: a C program checks every byte and source address of
//! datagrams echoed between two rsockets (first over UDP, then over UD) and the errno of
//! what fails; Debian's unmodified `udpong` runs both ends as separate processes.
//!
//! Needs `cc`, librdmacm-dev, rdmacm-utils and the workspace's libibverbs cdylib (`cargo
//! build --workspace`); skips loudly without them, or fails when `SOFTVERBS_REQUIRE_TOOLS=1`
//! (CI).

mod common;

use common::cm_run::{self, Case};
use common::procs::{self, Side};
use common::{build_program, can_build_programs, dropin, run_on, run_on_under_memcheck, C_PRELUDE};

/// Two datagram rsockets in one process: a server bound to 127.0.0.1 echoes what a
/// connected client sends; every datagram size from 0 to the largest is checked byte for
/// byte, with the source the server sees (the client's socket address, as getsockname
/// names it) and the one the client sees (the server's).
const ECHO: &str = r#"
/* "name result errno": errno's name only for a negative result. */
#define SHOWN(name, call) do { \
    errno = 0; long r_ = (long)(call); \
    printf("%s %ld %s\n", name, r_, r_ < 0 ? e(errno) : "-"); } while (0)

#include <pthread.h>
static int g_srv; static char g_got[16]; static ssize_t g_n;
static void *reader(void *arg) { (void)arg; g_n = rrecv(g_srv, g_got, sizeof g_got, 0); return NULL; }

static int fail(const char *what) { printf("FAIL %s: %s\n", what, strerror(errno)); exit(1); }

static void fill(unsigned char *b, int n, int seed) {
    for (int i = 0; i < n; i++) b[i] = (unsigned char)(seed * 31 + i * 7 + (i >> 8));
}

int main(void) {
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof sa;
    int srv = rsocket(AF_INET, SOCK_DGRAM, 0);
    if (srv < 0) fail("rsocket");
    unsigned char b[4096], r[4096];
    /* Before bind, connect or a send: rsocket.c says EINVAL. */
    SHOWN("recv_unused", rrecv(srv, b, sizeof b, MSG_DONTWAIT));
    if (rbind(srv, (struct sockaddr *)&sa, sizeof sa)) fail("rbind");
    if (rgetsockname(srv, (struct sockaddr *)&sa, &sl)) fail("rgetsockname");
    SHOWN("recv_empty", rrecv(srv, b, sizeof b, MSG_DONTWAIT) < 0 && errno == EWOULDBLOCK ? -1 : 0);
    struct pollfd pf = { .fd = srv, .events = POLLIN };
    SHOWN("rpoll_nothing", rpoll(&pf, 1, 0));
    SHOWN("rpoll_timeout", rpoll(&pf, 1, 20));

    int cli = rsocket(AF_INET, SOCK_DGRAM, 0);
    SHOWN("send_unconnected", rsend(cli, b, 10, 0) < 0 && errno == EDESTADDRREQ ? -1 : 0);
    int big = 1 << 19;
    SHOWN("sndbuf", rsetsockopt(cli, SOL_SOCKET, SO_SNDBUF, &big, sizeof big));
    SHOWN("rcvbuf", rsetsockopt(cli, SOL_SOCKET, SO_RCVBUF, &big, sizeof big));
    if (rconnect(cli, (struct sockaddr *)&sa, sizeof sa)) fail("rconnect");
    struct sockaddr_in ca; socklen_t cl = sizeof ca;
    if (rgetsockname(cli, (struct sockaddr *)&ca, &cl)) fail("rgetsockname cli");
    int q = 1;
    SHOWN("rdma_sqsize_in_use", rsetsockopt(cli, SOL_RDMA, RDMA_SQSIZE, &q, sizeof q) < 0 && errno == EINVAL ? -1 : 0);
    SHOWN("too_long", rsend(cli, b, 2041, 0) < 0 && errno == EMSGSIZE ? -1 : 0);
    int bad = 0;
    for (int round = 0; round < 3; round++) {
        for (int n = 0; n <= 2040; n += (n < 64 ? 1 : 61)) {
            fill(b, n, n + round);
            if (rsend(cli, b, n, 0) != n) fail("rsend");
            struct sockaddr_in from; socklen_t fl = sizeof from;
            memset(r, 0xee, sizeof r);
            ssize_t got = rrecvfrom(srv, r, sizeof r, 0, (struct sockaddr *)&from, &fl);
            if (got != n || memcmp(r, b, n)) { printf("server got %zd of %d\n", got, n); bad++; }
            if (fl != sizeof from || from.sin_port != ca.sin_port ||
                from.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) { printf("bad source\n"); bad++; }
            if (rsendto(srv, r, got, 0, (struct sockaddr *)&from, fl) != got) fail("rsendto");
            fl = sizeof from;
            memset(r, 0xee, sizeof r);
            pf.fd = cli;
            if (rpoll(&pf, 1, 5000) != 1 || !(pf.revents & POLLIN)) fail("rpoll echo");
            got = rrecvfrom(cli, r, sizeof r, 0, (struct sockaddr *)&from, &fl);
            if (got != n || memcmp(r, b, n)) { printf("client got %zd of %d\n", got, n); bad++; }
            if (from.sin_port != sa.sin_port) { printf("bad echo source\n"); bad++; }
        }
    }
    printf("mismatches %d\n", bad);
    /* A short buffer takes the start of the datagram; MSG_PEEK leaves it queued. */
    fill(b, 100, 9);
    rsend(cli, b, 100, 0);
    SHOWN("peek", rrecv(srv, r, 10, MSG_PEEK));
    SHOWN("short", rrecv(srv, r, 10, 0));
    printf("short_ok %d\n", memcmp(r, b, 10) == 0);
    SHOWN("then_empty", rrecv(srv, r, sizeof r, MSG_DONTWAIT) < 0 && errno == EWOULDBLOCK ? -1 : 0);
    /* rselect: an rsocket with a datagram waiting is readable; an empty one times out. */
    rsend(cli, b, 5, 0);
    fd_set rd; FD_ZERO(&rd); FD_SET(srv, &rd);
    struct timeval tv = { .tv_sec = 5 };
    SHOWN("rselect", rselect(srv + 1, &rd, NULL, NULL, &tv));
    printf("rselect_srv %d\n", FD_ISSET(srv, &rd) != 0);
    SHOWN("rselect_read", rrecv(srv, r, sizeof r, 0));
    FD_ZERO(&rd); FD_SET(srv, &rd); tv.tv_sec = 0; tv.tv_usec = 20000;
    SHOWN("rselect_timeout", rselect(srv + 1, &rd, NULL, NULL, &tv));
    /* O_NONBLOCK through rfcntl. */
    SHOWN("setfl", rfcntl(srv, F_SETFL, O_NONBLOCK));
    SHOWN("getfl_nonblock", (rfcntl(srv, F_GETFL) & O_NONBLOCK) != 0);
    SHOWN("nonblock_empty", rrecv(srv, r, sizeof r, 0) < 0 && errno == EWOULDBLOCK ? -1 : 0);
    int v = 0; socklen_t vl = sizeof v;
    SHOWN("getopt_rcvbuf", rgetsockopt(cli, SOL_SOCKET, SO_RCVBUF, &v, &vl));
    printf("rcvbuf %d\n", v);
    int one = 1;
    SHOWN("reuseaddr", rsetsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
    v = 0; vl = sizeof v;
    SHOWN("get_reuseaddr", rgetsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &v, &vl));
    printf("reuseaddr %d\n", v);
    /* Not an option rsocket.c knows: ENOTSUP (after the UDP socket took it). */
    SHOWN("broadcast", rsetsockopt(srv, SOL_SOCKET, SO_BROADCAST, &one, sizeof one));
    /* A thread blocked in rrecv wakes for a datagram another thread sends. */
    SHOWN("block_again", rfcntl(srv, F_SETFL, 0));
    g_srv = srv;
    pthread_t t;
    pthread_create(&t, NULL, reader, NULL);
    usleep(50000);
    rsend(cli, "thread", 6, 0);
    pthread_join(t, NULL);
    printf("thread got %zd %.6s\n", g_n, g_got);
    SHOWN("close_cli", rclose(cli));
    SHOWN("close_srv", rclose(srv));
    SHOWN("close_again", rclose(srv));
    return bad != 0;
}
"#;

#[test]
fn datagrams_echo_byte_for_byte_with_their_sources() {
    if !can_build_programs() {
        return;
    }
    let exe = build_program("dgram_echo", &format!("{C_PRELUDE}{ECHO}"));
    let out = run_on(&exe, &dropin("dgram_echo", true));
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    // A check written `call < 0 && errno == E ? -1 : 0` prints "-1" when it holds, with
    // the errno's name ("other" for those the prelude does not name).
    let expected = "\
recv_unused -1 EINVAL
recv_empty -1 EAGAIN
rpoll_nothing 0 -
rpoll_timeout 0 -
send_unconnected -1 other
sndbuf 0 -
rcvbuf 0 -
rdma_sqsize_in_use -1 EINVAL
too_long -1 other
mismatches 0
peek 10 -
short 10 -
short_ok 1
then_empty -1 EAGAIN
rselect 1 -
rselect_srv 1
rselect_read 5 -
rselect_timeout 0 -
setfl 0 -
getfl_nonblock 1 -
nonblock_empty -1 EAGAIN
getopt_rcvbuf 0 -
rcvbuf 1048576
reuseaddr 0 -
get_reuseaddr 0 -
reuseaddr 1
broadcast -1 ENOTSUP
block_again 0 -
thread got 6 thread
close_cli 0 -
close_srv 0 -
close_again -1 EBADF
";
    assert_eq!(out.stdout, expected, "stderr:\n{}", out.stderr);
}

/// The same program under valgrind's memcheck: no invalid read or write, no definite leak,
/// in the unsafe code that copies datagrams between the caller's buffers, the registered
/// slots and the sockets.
#[test]
fn datagram_echo_under_memcheck() {
    if !can_build_programs() || !common::tools_present(&["valgrind"]) {
        return;
    }
    let exe = build_program("dgram_echo_memcheck", &format!("{C_PRELUDE}{ECHO}"));
    let out = run_on_under_memcheck(&exe, &dropin("dgram_echo_memcheck", true));
    assert!(out.success, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("mismatches 0"), "{}", out.stdout);
}

/// Debian's udpong: a server (with `server_extra` options), and a client with `extra`
/// options against it; the client prints its result row and exits 0.
///
/// Echo runs keep the server blocking and the counts small. udpong's echo client waits 1 ms
/// for each echo before it sends again, and a late duplicate echo makes it send a stale
/// sequence number (it reads the echo into the message it resends): a steady trickle of
/// extra traffic, and a lasting livelock if a datagram is then lost. On this shared
/// 2-core machine an echo can take over a millisecond (a spinning non-blocking server
/// makes that likelier); thousands of echoes then hang udpong, over kernel UDP too.
fn udpong(test: &str, server_extra: &[&str], extra: &[&str]) -> String {
    udpong_with(test, "127.0.0.1", server_extra, extra, &[])
}

/// [`udpong`] on `addr`, with environment variables for both ends.
fn udpong_with(
    test: &str,
    addr: &str,
    server_extra: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> String {
    if !cm_run::have_tool("udpong", "rdmacm-utils") {
        return String::new();
    }
    let _one_at_a_time = procs::serial();
    let lib = cm_run::dropin(test);
    let r = cm_run::run_case(&lib, |port| {
        let port = port.to_string();
        let mut server =
            Side::new("/usr/bin/udpong", &["-b", addr, "-p", &port]).args(server_extra);
        let mut client = Side::new("/usr/bin/udpong", &["-s", addr, "-p", &port]).args(extra);
        for (k, v) in env {
            server = server.env(k, v);
            client = client.env(k, v);
        }
        Case::pair(server, client).servers_run_until_killed()
    });
    r.assert_ok(test);
    r.clients[0].stdout.clone()
}

/// The numbers of udpong's result row: name, bytes, xfers, total, time, Gb/sec, usec/xfer.
fn row(out: &str) -> Vec<String> {
    out.lines()
        .find(|l| l.starts_with("custom"))
        .unwrap_or_else(|| panic!("no result row:\n{out}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Echo mode: every datagram comes back (udpong sends again when one does not), so the
/// transfer count is exact; non-blocking (udpong's default), blocking and rpoll.
#[test]
fn udpong_echo_nonblocking_blocking_and_async() {
    for (name, mode) in [
        ("udpong_echo_n", "n"),
        ("udpong_echo_b", "b"),
        ("udpong_echo_a", "a"),
    ] {
        let out = udpong(
            name,
            &["-T", "b"],
            &["-C", "200", "-S", "1000", "-T", "e", "-T", mode],
        );
        if out.is_empty() {
            return;
        }
        let r = row(&out);
        assert_eq!(
            (r[1].as_str(), r[2].as_str()),
            ("1000", "400"),
            "{name}: {out}"
        );
    }
}

/// Bandwidth mode: the client sends 2000 datagrams without waiting, the server counts what
/// arrived and says so at the end (datagrams may be dropped when the receiver falls behind,
/// as with UDP; on loopback with a 1 MiB buffer most arrive).
#[test]
fn udpong_bandwidth_counts_what_arrived() {
    let out = udpong("udpong_bw", &[], &["-C", "2000", "-S", "1000"]);
    if out.is_empty() {
        return;
    }
    let r = row(&out);
    assert_eq!(r[1], "1000", "{out}");
}

/// 2 % of the datagrams both devices send are dropped: the bandwidth run still completes
/// (its start and end messages are sent again until answered) and the server counts what
/// got through. (Echo mode is no test of loss: udpong reads a late duplicate echo into the
/// message it then sends again, and after a loss can keep sending a stale sequence number
/// for ever — over kernel UDP too.)
#[test]
fn udpong_bandwidth_survives_injected_loss() {
    let out = udpong_with(
        "udpong_loss",
        "127.0.0.1",
        &[],
        &["-C", "2000", "-S", "512"],
        &[("SOFTVERBS_FAULTS", "loss=0.02,seed=13")],
    );
    if out.is_empty() {
        return;
    }
    let r = row(&out);
    assert_eq!(r[1], "512", "{out}");
}

/// IPv6: the UD header and the UDP header take their IPv6 forms (24 and 28 bytes).
#[test]
fn udpong_echo_over_ipv6_loopback() {
    let out = udpong_with(
        "udpong_ipv6",
        "::1",
        &["-T", "b"],
        &["-C", "200", "-S", "2000", "-T", "e"],
        &[],
    );
    if out.is_empty() {
        return;
    }
    let r = row(&out);
    assert_eq!((r[1].as_str(), r[2].as_str()), ("1.9k", "400"), "{out}");
}
