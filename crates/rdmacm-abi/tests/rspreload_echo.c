/* An ordinary TCP echo program, nothing RDMA in it, the C peer of a Rust tokio stream
 * (tests/rspreload_tokio.rs). Run under Debian's librspreload.so with softverbs' libraries
 * first, every socket call below becomes an rsocket call.
 *
 *   rspreload_echo server PORT      listen on 127.0.0.1:PORT, echo one connection until
 *                                   EOF, then close it
 *   rspreload_echo client PORT N    connect; a thread sends N pattern bytes in uneven
 *                                   writes then shuts down writing, while the main thread
 *                                   reads the echo until EOF and checks it byte for byte
 *
 * Each side prints whether its socket is an rsocket: getsockopt(SO_TYPE) is a Linux socket
 * option rsockets do not have (EOPNOTSUPP), which a kernel TCP socket answers. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The same pattern as the Rust side's. */
static unsigned char pattern(long i) {
    return (unsigned char)(i * 7 + (i >> 11));
}

static int is_rsocket(int s) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &len) < 0 && errno == EOPNOTSUPP;
}

static int fail(const char *what) {
    perror(what);
    return 1;
}

static int write_all(int s, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(s, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int serve(int s) {
    static unsigned char buf[1 << 16];
    long total = 0;
    ssize_t n;
    int c = accept(s, NULL, NULL);
    if (c < 0)
        return fail("accept");
    while ((n = read(c, buf, sizeof buf)) > 0) {
        if (write_all(c, buf, (size_t)n))
            return fail("write");
        total += n;
    }
    if (n < 0)
        return fail("read");
    printf("echoed %ld\n", total);
    close(c);
    return 0;
}

struct sender {
    int s;
    long total;
    int failed;
};

/* Writes of 1, 2, ... 8191 bytes, cycling: every size the stream has to split or join. */
static void *send_pattern(void *arg) {
    struct sender *snd = arg;
    static unsigned char buf[8192];
    long sent = 0, chunk = 1;
    while (sent < snd->total) {
        long n = chunk < snd->total - sent ? chunk : snd->total - sent;
        for (long i = 0; i < n; i++)
            buf[i] = pattern(sent + i);
        if (write_all(snd->s, buf, (size_t)n)) {
            perror("write");
            snd->failed = 1;
            return NULL;
        }
        sent += n;
        chunk = chunk * 3 % 8191 + 1;
    }
    if (shutdown(snd->s, SHUT_WR)) {
        perror("shutdown");
        snd->failed = 1;
    }
    return NULL;
}

static int client(int s, struct sockaddr_in *sin, long total) {
    static unsigned char buf[1 << 16];
    if (connect(s, (struct sockaddr *)sin, sizeof *sin))
        return fail("connect");
    printf("connected, rsocket %d\n", is_rsocket(s));
    struct sender snd = { .s = s, .total = total };
    pthread_t t;
    if (pthread_create(&t, NULL, send_pattern, &snd))
        return fail("pthread_create");
    long seen = 0, intact = 1;
    ssize_t n;
    while ((n = read(s, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++)
            if (buf[i] != pattern(seen + i))
                intact = 0;
        seen += n;
    }
    if (n < 0)
        return fail("read");
    pthread_join(t, NULL);
    if (snd.failed)
        return 1;
    printf("echoed back %ld, intact %ld\n", seen, intact);
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        return fail("socket");
    if (!strcmp(argv[1], "server")) {
        int one = 1;
        if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one))
            return fail("setsockopt");
        if (bind(s, (struct sockaddr *)&sin, sizeof sin) || listen(s, 1))
            return fail("listen");
        printf("listening, rsocket %d\n", is_rsocket(s));
        return serve(s);
    }
    if (!strcmp(argv[1], "client") && argc == 4)
        return client(s, &sin, atol(argv[3]));
    return 2;
}
