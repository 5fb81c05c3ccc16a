/* The rsocket C API of softverbs' librdmacm.so.1, exercised by an ordinary program built
 * against Debian's <rdma/rsocket.h> (tests/rsocket_api.rs runs it).
 *
 *   rsocket_api [local]       both ends in this process: non-blocking connect, rpoll and
 *                             rselect mixing an rsocket with a pipe, partial non-blocking
 *                             writes, EOF after rshutdown(SHUT_WR), options, errno values.
 *   rsocket_api echo PORT     a server for a Rust softverbs::sock::RdmaStream client: echoes
 *                             everything until EOF, then sends "bye" and closes.
 *   rsocket_api client PORT N connects to a Rust RdmaListener, sends N pattern bytes while
 *                             reading them back, shuts down writing, expects EOF.
 *
 * Every line printed is compared by the test; nothing depends on timing. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
#include <rdma/rsocket.h>

static const char *en(int v) { return v ? strerrorname_np(v) : "0"; }

#define SHOW(name, call) do { \
    errno = 0; long r_ = (long)(call); \
    printf("%s %ld %s\n", name, r_, r_ < 0 ? en(errno) : "-"); } while (0)

#define CHECK(cond) do { if (!(cond)) { \
    printf("check failed line %d: %s (errno %s)\n", __LINE__, #cond, en(errno)); \
    exit(1); } } while (0)

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + (i >> 11)); }

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    return sin;
}

/* Waits (rpoll, no time limit) until `fd` has `events`. */
static short wait_for(int fd, short events) {
    struct pollfd p = { .fd = fd, .events = events };
    CHECK(rpoll(&p, 1, -1) == 1);
    return p.revents;
}

/* SO_REUSEADDR and IPV6_V6ONLY take effect at rbind, as rsocket.c's rdma_set_option
 * (RDMA_OPTION_ID_REUSEADDR, RDMA_OPTION_ID_AFONLY) does. */
static void reuse_and_v6only(void) {
    /* A port nobody uses on either family: the kernel's pick for a dual-stack UDP socket,
     * given back. */
    int probe = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
    socklen_t len = sizeof any6;
    CHECK(probe >= 0 && bind(probe, (struct sockaddr *)&any6, sizeof any6) == 0);
    CHECK(getsockname(probe, (struct sockaddr *)&any6, &len) == 0);
    close(probe);
    int port = ntohs(any6.sin6_port);

    int one = 1, zero = 0;
    int r1 = rsocket(AF_INET, SOCK_STREAM, 0), r2 = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(r1 >= 0 && r2 >= 0);
    CHECK(rsetsockopt(r1, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    CHECK(rsetsockopt(r2, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    struct sockaddr_in sin = loopback(port);
    SHOW("rbind_reuse_first", rbind(r1, (struct sockaddr *)&sin, sizeof sin));
    SHOW("rbind_reuse_second", rbind(r2, (struct sockaddr *)&sin, sizeof sin));
    SHOW("reuseaddr_after_bind", rsetsockopt(r2, SOL_SOCKET, SO_REUSEADDR, &zero, sizeof zero));
    CHECK(rclose(r1) == 0 && rclose(r2) == 0);

    /* An IPv6 wildcard with IPV6_V6ONLY leaves the IPv4 wildcard of its port free. */
    struct sockaddr_in any4 = { .sin_family = AF_INET, .sin_port = htons(port) };
    int v6 = rsocket(AF_INET6, SOCK_STREAM, 0), v4 = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(v6 >= 0 && v4 >= 0);
    SHOW("v6only", rsetsockopt(v6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one));
    SHOW("rbind_v6only", rbind(v6, (struct sockaddr *)&any6, sizeof any6));
    SHOW("v6only_changed_after_bind",
         rsetsockopt(v6, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero));
    SHOW("rbind_v4_beside_v6only", rbind(v4, (struct sockaddr *)&any4, sizeof any4));
    CHECK(rclose(v6) == 0 && rclose(v4) == 0);
    /* Without it the IPv6 wildcard covers IPv4 too. */
    v6 = rsocket(AF_INET6, SOCK_STREAM, 0);
    v4 = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(v6 >= 0 && v4 >= 0);
    SHOW("rbind_dual", rbind(v6, (struct sockaddr *)&any6, sizeof any6));
    SHOW("rbind_v4_beside_dual", rbind(v4, (struct sockaddr *)&any4, sizeof any4));
    CHECK(rclose(v6) == 0 && rclose(v4) == 0);
}

static int local(void) {
    /* A listener on an ephemeral port. */
    int lrs = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(lrs >= 0);
    printf("fd is real %d\n", fcntl(lrs, F_GETFD) >= 0);
    int one = 1;
    SHOW("reuseaddr", rsetsockopt(lrs, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
    struct sockaddr_in sin = loopback(0);
    SHOW("rbind", rbind(lrs, (struct sockaddr *)&sin, sizeof sin));
    SHOW("rlisten", rlisten(lrs, 4));
    socklen_t len = sizeof sin;
    SHOW("rgetsockname", rgetsockname(lrs, (struct sockaddr *)&sin, &len));
    int port = ntohs(sin.sin_port);
    printf("listening port nonzero %d len %d\n", port != 0, (int)len);
    SHOW("rfcntl_setfl_listener", rfcntl(lrs, F_SETFL, O_NONBLOCK));
    SHOW("raccept_none", raccept(lrs, NULL, NULL));
    struct pollfd lp = { .fd = lrs, .events = POLLIN };
    SHOW("rpoll_listener_idle", rpoll(&lp, 1, 0));

    /* rbind binds at once (rsocket.c's rdma_bind_addr): the port is picked there, and a
     * second rbind to the same address and port fails there, before anything listens. */
    int b1 = rsocket(AF_INET, SOCK_STREAM, 0), b2 = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(b1 >= 0 && b2 >= 0);
    struct sockaddr_in bsin = loopback(0);
    SHOW("rbind_first", rbind(b1, (struct sockaddr *)&bsin, sizeof bsin));
    len = sizeof bsin;
    CHECK(rgetsockname(b1, (struct sockaddr *)&bsin, &len) == 0);
    printf("bound port nonzero %d\n", bsin.sin_port != 0);
    SHOW("rbind_taken", rbind(b2, (struct sockaddr *)&bsin, sizeof bsin));
    SHOW("rclose_b1", rclose(b1));
    SHOW("rbind_freed", rbind(b2, (struct sockaddr *)&bsin, sizeof bsin));
    SHOW("rclose_b2", rclose(b2));
    reuse_and_v6only();

    /* Options before connecting. */
    int rs = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(rs >= 0);
    int val = 65536;
    SHOW("sndbuf", rsetsockopt(rs, SOL_SOCKET, SO_SNDBUF, &val, sizeof val));
    val = 0; len = sizeof val;
    SHOW("get_sndbuf", rgetsockopt(rs, SOL_SOCKET, SO_SNDBUF, &val, &len));
    printf("sndbuf %d len %d\n", val, (int)len);
    val = 64;
    SHOW("sqsize", rsetsockopt(rs, SOL_RDMA, RDMA_SQSIZE, &val, sizeof val));
    val = 0; len = sizeof val;
    SHOW("get_sqsize", rgetsockopt(rs, SOL_RDMA, RDMA_SQSIZE, &val, &len));
    printf("sqsize %d\n", val);
    val = 300;
    SHOW("iomapsize", rsetsockopt(rs, SOL_RDMA, RDMA_IOMAPSIZE, &val, sizeof val));
    len = sizeof val;
    SHOW("get_iomapsize", rgetsockopt(rs, SOL_RDMA, RDMA_IOMAPSIZE, &val, &len));
    printf("iomapsize %d\n", val);
    SHOW("nodelay", rsetsockopt(rs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one));
    len = sizeof val;
    SHOW("get_nodelay", rgetsockopt(rs, IPPROTO_TCP, TCP_NODELAY, &val, &len));
    printf("nodelay %d\n", val);
    struct linger lg = { .l_onoff = 0 };
    SHOW("linger_off", rsetsockopt(rs, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
    len = sizeof lg;
    SHOW("get_linger", rgetsockopt(rs, SOL_SOCKET, SO_LINGER, &lg, &len));
    printf("linger %d\n", lg.l_onoff);
    SHOW("unknown_opt", rsetsockopt(rs, SOL_SOCKET, SO_BROADCAST, &one, sizeof one));
    len = sizeof val;
    SHOW("get_unknown_opt", rgetsockopt(rs, SOL_SOCKET, SO_BROADCAST, &val, &len));
    SHOW("keepidle_zero", rsetsockopt(rs, IPPROTO_TCP, TCP_KEEPIDLE, &(int){0}, sizeof(int)));
    SHOW("rsend_unconnected", rsend(rs, "x", 1, 0));
    SHOW("rfcntl_getfl", rfcntl(rs, F_GETFL));
    SHOW("rfcntl_bad_cmd", rfcntl(rs, F_GETOWN));

    /* The client binds first: its connection leaves from that address and port. */
    struct sockaddr_in csin = loopback(0);
    SHOW("rbind_client", rbind(rs, (struct sockaddr *)&csin, sizeof csin));
    len = sizeof csin;
    CHECK(rgetsockname(rs, (struct sockaddr *)&csin, &len) == 0);
    printf("client bound port nonzero %d\n", csin.sin_port != 0);

    /* Non-blocking connect: EINPROGRESS, then the listener sees the request, raccept
     * accepts it, and the connecting socket turns writable with SO_ERROR 0. */
    SHOW("rfcntl_setfl", rfcntl(rs, F_SETFL, O_NONBLOCK));
    printf("getfl nonblock %d\n", (rfcntl(rs, F_GETFL) & O_NONBLOCK) != 0);
    sin = loopback(port);
    SHOW("rconnect", rconnect(rs, (struct sockaddr *)&sin, sizeof sin));
    SHOW("rconnect_again", rconnect(rs, (struct sockaddr *)&sin, sizeof sin));
    printf("listener readable %d\n", (wait_for(lrs, POLLIN) & POLLIN) != 0);
    SHOW("rfcntl_listener_block", rfcntl(lrs, F_SETFL, 0));
    struct sockaddr_in peer;
    len = sizeof peer;
    int srv = raccept(lrs, (struct sockaddr *)&peer, &len);
    CHECK(srv >= 0);
    printf("accepted peer family %d len %d\n", peer.sin_family == AF_INET, (int)len);
    printf("connected writable %d\n", (wait_for(rs, POLLOUT) & POLLOUT) != 0);
    int err = -1;
    len = sizeof err;
    SHOW("so_error", rgetsockopt(rs, SOL_SOCKET, SO_ERROR, &err, &len));
    printf("so_error %s\n", en(err));
    /* The descriptor's wake-up for the connect is reset once the connect is over. */
    struct pollfd plain = { .fd = rs, .events = POLLIN };
    printf("plain poll on the descriptor %d\n", poll(&plain, 1, 0));
    SHOW("rconnect_connected", rconnect(rs, (struct sockaddr *)&sin, sizeof sin));
    SHOW("keepidle", rsetsockopt(rs, IPPROTO_TCP, TCP_KEEPIDLE, &(int){7}, sizeof(int)));
    SHOW("keepalive", rsetsockopt(rs, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
    len = sizeof val;
    SHOW("get_keepalive", rgetsockopt(rs, SOL_SOCKET, SO_KEEPALIVE, &val, &len));
    printf("keepalive %d\n", val);
    len = sizeof val;
    SHOW("get_keepidle", rgetsockopt(rs, IPPROTO_TCP, TCP_KEEPIDLE, &val, &len));
    printf("keepidle %d\n", val);
    SHOW("sqsize_after_connect", rsetsockopt(rs, SOL_RDMA, RDMA_SQSIZE, &val, sizeof val));

    /* Addresses: the two ends name each other. */
    struct sockaddr_in a, b;
    socklen_t la = sizeof a, lb = sizeof b;
    CHECK(rgetsockname(rs, (struct sockaddr *)&a, &la) == 0);
    CHECK(rgetpeername(srv, (struct sockaddr *)&b, &lb) == 0);
    printf("client name is server's peer %d\n", a.sin_port == b.sin_port && a.sin_port != 0);
    printf("client name is its rbind address %d\n",
           a.sin_port == csin.sin_port && a.sin_addr.s_addr == csin.sin_addr.s_addr);
    CHECK(rgetpeername(rs, (struct sockaddr *)&a, &la) == 0);
    printf("client peer port is listener's %d\n", ntohs(a.sin_port) == port);

    char buf[16] = { 0 };

    /* rpoll mixing an rsocket and a pipe. */
    int p[2];
    CHECK(pipe(p) == 0);
    struct pollfd fds[2] = { { .fd = p[0], .events = POLLIN }, { .fd = srv, .events = POLLIN } };
    SHOW("rpoll_nothing", rpoll(fds, 2, 50));
    CHECK(write(p[1], "p", 1) == 1);
    SHOW("rpoll_pipe", rpoll(fds, 2, -1));
    printf("pipe %d rsocket %d\n", fds[0].revents == POLLIN, fds[1].revents != 0);
    char c;
    CHECK(read(p[0], &c, 1) == 1);
    SHOW("rsend_null", rsend(rs, NULL, 5, 0));
    SHOW("rrecv_null", rrecv(srv, NULL, 5, MSG_DONTWAIT));
    SHOW("riomap_null", riomap(rs, NULL, 4096, PROT_WRITE, 0, -1));
    SHOW("riomap_bad_prot", riomap(rs, buf, sizeof buf, PROT_READ, 0, 0));
    SHOW("riounmap_unknown", riounmap(rs, buf, sizeof buf));
    SHOW("riowrite_unmapped", (long)riowrite(rs, "x", 1, 0, 0));
    SHOW("rsend_hello", rsend(rs, "hello", 5, 0));
    SHOW("rpoll_rsocket", rpoll(fds, 2, -1));
    printf("pipe %d rsocket %d\n", fds[0].revents != 0, fds[1].revents == POLLIN);
    SHOW("rrecv_peek", rrecv(srv, buf, 3, MSG_PEEK));
    SHOW("rrecv", rrecv(srv, buf, sizeof buf, 0));
    printf("got %s\n", buf);

    /* rselect: the pipe and the rsocket. */
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(p[0], &rd);
    FD_SET(srv, &rd);
    int maxfd = (p[0] > srv ? p[0] : srv) + 1;
    SHOW("rsend_x", rsend(rs, "x", 1, 0));
    SHOW("rselect", rselect(maxfd, &rd, NULL, NULL, NULL));
    printf("select pipe %d rsocket %d\n", FD_ISSET(p[0], &rd) != 0, FD_ISSET(srv, &rd) != 0);
    SHOW("rread", rread(srv, buf, 1));
    SHOW("rrecv_empty_nonblocking", rrecv(srv, buf, 1, MSG_DONTWAIT));

    /* Partial non-blocking writes: the peer reads nothing, so the writer fills what it was
     * granted, gets a short count and then EAGAIN. Then both sides move it all. */
    size_t total = 4 << 20, sent = 0, got = 0;
    unsigned char *out = malloc(total), *in = malloc(total);
    CHECK(out && in);
    for (size_t i = 0; i < total; i++)
        out[i] = pattern(i);
    int partial = 0, eagain = 0;
    for (;;) {
        ssize_t n = rsend(rs, out + sent, total - sent, 0);
        if (n < 0) {
            eagain = errno == EAGAIN;
            break;
        }
        if ((size_t)n < total - sent)
            partial = 1;
        sent += n;
    }
    printf("partial %d then eagain %d, some sent %d\n", partial, eagain, sent > 0 && sent < total);
    /* With the peer reading nothing the writer ends up not writable; a grant or send
     * completion already on its way when EAGAIN came may still let a little more go
     * first (so this takes what goes until rpoll says no, a bounded number of times). */
    struct pollfd w = { .fd = rs, .events = POLLOUT };
    int writable = 1;
    for (int i = 0; i < 1000 && (writable = rpoll(&w, 1, 0)) > 0; i++) {
        ssize_t n = rsend(rs, out + sent, total - sent, 0);
        if (n > 0)
            sent += n;
        else
            CHECK(errno == EAGAIN);
    }
    printf("rpoll_not_writable %d -\n", writable);
    while (got < total) {
        ssize_t n = rrecv(srv, in + got, total - got, MSG_DONTWAIT);
        if (n > 0)
            got += n;
        else
            CHECK(n < 0 && errno == EAGAIN);
        if (sent < total) {
            n = rsend(rs, out + sent, total - sent, 0);
            if (n > 0)
                sent += n;
            else
                CHECK(n < 0 && errno == EAGAIN);
        }
    }
    printf("moved %zu intact %d\n", got, memcmp(in, out, total) == 0);

    /* MSG_PEEK spans every queued message, as rsocket.c's rs_peek: three sends, each its
     * own message; once all have arrived one peek shows them all, and takes nothing. */
    SHOW("rsend_one", rsend(rs, "one", 3, 0));
    SHOW("rsend_two", rsend(rs, "two", 3, 0));
    SHOW("rsend_three", rsend(rs, "three", 5, 0));
    /* Each peek returns what has arrived; wait (bounded) until all three have. */
    ssize_t peeked = 0;
    for (int i = 0; i < 20000 && peeked < 11; i++) {
        memset(buf, 0, sizeof buf);
        peeked = rrecv(srv, buf, sizeof buf, MSG_PEEK);
        if (peeked < 11)
            usleep(1000);
    }
    printf("peeked %zd %s\n", peeked, buf);
    memset(buf, 0, sizeof buf);
    SHOW("rrecv_peek_some", rrecv(srv, buf, 5, MSG_PEEK));
    printf("peeked %s\n", buf);
    memset(buf, 0, sizeof buf);
    SHOW("rrecv_all", rrecv(srv, buf, sizeof buf, 0));
    printf("got %s\n", buf);

    /* rwritev / rreadv. */
    SHOW("rfcntl_block", rfcntl(rs, F_SETFL, 0));
    struct iovec iov[3] = { { "ab", 2 }, { "", 0 }, { "cde", 3 } };
    SHOW("rwritev", rwritev(rs, iov, 3));
    char v1[16] = { 0 };
    struct iovec riov = { v1, sizeof v1 };
    SHOW("rrecv_waitall", rrecv(srv, v1, 5, MSG_WAITALL));
    printf("readv got %s\n", v1);
    SHOW("rsendto_addr", rsendto(rs, "x", 1, 0, (struct sockaddr *)&sin, sizeof sin));
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 3 };
    SHOW("rsendmsg", rsendmsg(rs, &mh, 0));
    memset(v1, 0, sizeof v1);
    ssize_t rv = rreadv(srv, &riov, 1);
    printf("rreadv some %d\n", rv >= 2 && rv <= 5);
    if (rv < 5)
        CHECK(rrecv(srv, v1 + rv, 5 - rv, MSG_WAITALL) == 5 - rv);
    printf("rsendmsg got %s\n", v1);

    /* EOF after rshutdown(SHUT_WR); the other way still works; then ECONNRESET. */
    SHOW("rsend_last", rsend(rs, "end", 3, 0));
    SHOW("rshutdown_wr", rshutdown(rs, SHUT_WR));
    memset(buf, 0, sizeof buf);
    SHOW("rrecv_last", rrecv(srv, buf, sizeof buf, MSG_WAITALL));
    printf("last %s\n", buf);
    printf("eof readable %d\n", (wait_for(srv, POLLIN) & POLLIN) != 0);
    SHOW("rrecv_eof", rrecv(srv, buf, sizeof buf, 0));
    SHOW("rsend_back", rsend(srv, "back", 4, 0));
    memset(buf, 0, sizeof buf);
    SHOW("rrecv_back", rrecv(rs, buf, 4, MSG_WAITALL));
    printf("back %s\n", buf);
    SHOW("rsend_after_shutdown", rsend(rs, "x", 1, 0));
    SHOW("rshutdown_bad", rshutdown(srv, 42));
    SHOW("rclose_srv", rclose(srv));
    SHOW("rrecv_after_peer_close", rrecv(rs, buf, sizeof buf, 0));
    SHOW("rclose_rs", rclose(rs));
    SHOW("rclose_again", rclose(rs));
    SHOW("rsend_closed", rsend(rs, "x", 1, 0));

    /* A blocking connect nobody answers. */
    int lonely = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(lonely >= 0);
    rclose(lrs);
    SHOW("rconnect_refused", rconnect(lonely, (struct sockaddr *)&sin, sizeof sin));
    SHOW("rconnect_after_error", rconnect(lonely, (struct sockaddr *)&sin, sizeof sin));
    SHOW("rclose_lonely", rclose(lonely));
    free(in);
    free(out);
    return 0;
}

/* Echo server for a Rust client. */
static int echo(int port) {
    int lrs = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(lrs >= 0);
    struct sockaddr_in sin = loopback(port);
    CHECK(rbind(lrs, (struct sockaddr *)&sin, sizeof sin) == 0);
    CHECK(rlisten(lrs, 1) == 0);
    printf("listening\n");
    fflush(stdout);
    int rs = raccept(lrs, NULL, NULL);
    CHECK(rs >= 0);
    static char buf[100000];
    size_t total = 0;
    for (;;) {
        ssize_t n = rrecv(rs, buf, sizeof buf, 0);
        CHECK(n >= 0);
        if (n == 0)
            break;
        CHECK(rsend(rs, buf, n, 0) == n);
        total += n;
    }
    printf("echoed %zu\n", total);
    CHECK(rsend(rs, "bye", 3, 0) == 3);
    CHECK(rclose(rs) == 0);
    CHECK(rclose(lrs) == 0);
    return 0;
}

/* Client of a Rust listener: sends `total` pattern bytes (non-blocking, rpoll) while reading
 * the echo, then shuts down writing and expects EOF. */
static int client(int port, size_t total) {
    int rs = rsocket(AF_INET, SOCK_STREAM, 0);
    CHECK(rs >= 0);
    struct sockaddr_in sin = loopback(port);
    CHECK(rconnect(rs, (struct sockaddr *)&sin, sizeof sin) == 0);
    CHECK(rfcntl(rs, F_SETFL, O_NONBLOCK) == 0);
    unsigned char *out = malloc(total), *in = malloc(total);
    CHECK(out && in);
    for (size_t i = 0; i < total; i++)
        out[i] = pattern(i);
    size_t sent = 0, got = 0;
    while (got < total) {
        struct pollfd p = { .fd = rs, .events = POLLIN | (sent < total ? POLLOUT : 0) };
        CHECK(rpoll(&p, 1, -1) == 1);
        if (p.revents & POLLOUT) {
            ssize_t n = rsend(rs, out + sent, total - sent, 0);
            CHECK(n > 0 || errno == EAGAIN);
            if (n > 0)
                sent += n;
        }
        if (p.revents & POLLIN) {
            ssize_t n = rrecv(rs, in + got, total - got, 0);
            CHECK(n > 0 || errno == EAGAIN);
            if (n > 0)
                got += n;
        }
    }
    printf("echo intact %d\n", memcmp(in, out, total) == 0);
    CHECK(rshutdown(rs, SHUT_WR) == 0);
    char c;
    ssize_t n;
    while ((n = rrecv(rs, &c, 1, 0)) < 0 && errno == EAGAIN)
        wait_for(rs, POLLIN);
    printf("eof %zd\n", n);
    CHECK(rclose(rs) == 0);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 1 || (argc == 2 && !strcmp(argv[1], "local")))
        return local();
    if (argc == 3 && !strcmp(argv[1], "echo"))
        return echo(atoi(argv[2]));
    if (argc == 4 && !strcmp(argv[1], "client"))
        return client(atoi(argv[2]), strtoul(argv[3], NULL, 0));
    fprintf(stderr, "usage: rsocket_api local | echo PORT | client PORT BYTES\n");
    return 2;
}
