#!/usr/bin/env bash
# CPU share of an empty-poll loop beside busy loops on its CPU, with and without
# sched_yield (docs/udp-latency.md, session 16: EEVDF's yield forfeits the rest of the
# yielder's slice). The loop is a recv on an empty non-blocking UDP socket, as an empty
# Cq::poll's recvmmsg; the share is the thread's schedstat run time over wall time.
#
# Usage: bench/yield-share.sh [--cpu N] [--busy N] [--secs S]
#   --cpu N   the CPU the loop and the busy loops are pinned to (default 0)
#   --busy N  busy loops beside it (default 2)
#   --secs S  seconds per configuration (default 2)
#
# Configurations: no yield; a yield every 4th poll (as Cq::poll); every poll; every 4th
# with a 20 µs ppoll once per 25 yields; every 4th with a 100 µs slice
# (sched_attr.sched_runtime); a 20 µs ppoll on the socket instead of each yield.
# Needs cc and taskset. Every process is bounded by `timeout`.
set -euo pipefail
CPU=0
BUSY=2
SECS=2
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) CPU="${2:?}"; shift ;;
        --busy) BUSY="${2:?}"; shift ;;
        --secs) SECS="${2:?}"; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "yield-share.sh: unexpected argument $1 (try --help)" >&2; exit 1 ;;
    esac
    shift
done
DIR=$(mktemp -d)
BUSY_PIDS=()
trap 'kill "${BUSY_PIDS[@]}" 2> /dev/null || true; rm -rf "$DIR"' EXIT
cat > "$DIR/loop.c" << 'C'
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct attr { unsigned size, policy; unsigned long long flags; int nice; unsigned prio;
              unsigned long long runtime, deadline, period; unsigned util_min, util_max; };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned long long run_ns(void) {
    char path[64];
    unsigned long long run = 0;
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    FILE *f = fopen(path, "r");
    if (f) { if (fscanf(f, "%llu", &run) != 1) run = 0; fclose(f); }
    return run;
}

/* loop SECS YIELD_EVERY SLEEP_EVERY_YIELDS(-1: instead of each) SLEEP_US SLICE_US */
int main(int argc, char **argv) {
    if (argc < 6) return 2;
    double secs = atof(argv[1]);
    long every = atol(argv[2]), sleep_every = atol(argv[3]), sleep_us = atol(argv[4]);
    long slice_us = atol(argv[5]);
    if (slice_us) {
        struct attr a; memset(&a, 0, sizeof a);
        a.size = sizeof a; a.runtime = slice_us * 1000ULL;
        if (syscall(SYS_sched_setattr, 0, &a, 0)) perror("sched_setattr");
    }
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    bind(s, (void *)&sa, sizeof sa);
    char buf[64];
    long polls = 0, yields = 0, long_yields = 0;
    unsigned long long run0 = run_ns();
    double t0 = now();
    while (now() - t0 < secs) {
        recv(s, buf, sizeof buf, 0);
        polls++;
        if (!every || polls % every) continue;
        yields++;
        if (sleep_every < 0 || (sleep_every > 0 && yields % sleep_every == 0)) {
            struct pollfd p = {s, POLLIN, 0};
            struct timespec ts = {0, sleep_us * 1000L};
            ppoll(&p, 1, &ts, NULL);
        } else {
            double y0 = now();
            sched_yield();
            long_yields += now() - y0 > 1e-3;
        }
    }
    double wall = now() - t0;
    printf("share %.4f  polls/ms %7.1f  yields over 1 ms %ld\n",
           (run_ns() - run0) / 1e9 / wall, polls / wall / 1e3, long_yields);
    return 0;
}
C
cc -O2 -o "$DIR/loop" "$DIR/loop.c"
for _ in $(seq "$BUSY"); do
    taskset -c "$CPU" timeout 600 sh -c 'while :; do :; done' &
    BUSY_PIDS+=($!)
done
sleep 0.3
echo "CPU $CPU, $BUSY busy loops beside, load average $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # LABEL ARGS...
    printf '%-44s ' "$1"
    shift
    taskset -c "$CPU" timeout 60 "$DIR/loop" "$SECS" "$@"
}
run "no yield" 0 0 0 0
run "yield at every 4th poll (Cq::poll)" 4 0 0 0
run "yield at every poll" 1 0 0 0
run "every 4th, a 20 us sleep per 25 yields" 4 25 20 0
run "every 4th, 100 us slice" 4 0 0 100
run "a 20 us sleep instead of each yield" 4 -1 20 0
