/* An ordinary TCP program, nothing RDMA in it: copies a file over one connection. Run
 * under Debian's librspreload.so with softverbs' libraries first (tests/rspreload.rs),
 * every socket call below becomes an rsocket call.
 *
 *   rspreload_copy recv PORT OUTFILE   listen on 127.0.0.1:PORT, write what arrives
 *   rspreload_copy send PORT INFILE    connect, send the file, shut down writing, wait
 *
 * Each side prints whether its socket is an rsocket: getsockopt(SO_TYPE) is a Linux socket
 * option rsockets do not have (EOPNOTSUPP), which a kernel TCP socket answers. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int is_rsocket(int s) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &len) < 0 && errno == EOPNOTSUPP;
}

static int fail(const char *what) {
    perror(what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    static char buf[1 << 16];
    long total = 0;
    ssize_t n;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        return fail("socket");
    if (!strcmp(argv[1], "recv")) {
        int one = 1, out = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out < 0)
            return fail("open");
        if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one))
            return fail("setsockopt");
        if (bind(s, (struct sockaddr *)&sin, sizeof sin) || listen(s, 1))
            return fail("listen");
        printf("listening, rsocket %d\n", is_rsocket(s));
        int c = accept(s, NULL, NULL);
        if (c < 0)
            return fail("accept");
        for (;;) {
            /* poll() becomes rpoll() for an rsocket. */
            struct pollfd p = { .fd = c, .events = POLLIN };
            if (poll(&p, 1, -1) != 1)
                return fail("poll");
            if ((n = read(c, buf, sizeof buf)) <= 0)
                break;
            if (write(out, buf, n) != n)
                return fail("write file");
            total += n;
        }
        if (n < 0)
            return fail("read");
        printf("received %ld\n", total);
        close(c);
        close(out);
    } else {
        int in = open(argv[3], O_RDONLY);
        if (in < 0)
            return fail("open");
        if (connect(s, (struct sockaddr *)&sin, sizeof sin))
            return fail("connect");
        printf("connected, rsocket %d\n", is_rsocket(s));
        while ((n = read(in, buf, sizeof buf)) > 0) {
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(s, buf + off, n - off);
                if (w <= 0)
                    return fail("write");
                off += w;
            }
            total += n;
        }
        if (shutdown(s, SHUT_WR))
            return fail("shutdown");
        /* The receiver closes once it has everything. */
        while ((n = read(s, buf, sizeof buf)) > 0)
            ;
        printf("sent %ld\n", total);
    }
    close(s);
    return 0;
}
