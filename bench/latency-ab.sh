#!/usr/bin/env bash
# 8-byte latency of two softverbs builds against sockperf, interleaved in one run (issue 16's
# latency rows, before / after a change):
#
#   sockperf UDP ping-pong, 24-byte messages, both sides busy-polling (--nonblocked)
#   for each build A (the baseline) and B (this tree's target/release):
#     softverbs perf send --lat, perf write --lat (8 B)
#     ib_send_lat -s 8, ib_write_lat -s 8 on that build's drop-in (softverbs run)
#
# and prints the median t_typical (one way, us) of each over the repetitions, with the
# ratio to sockperf's median. A baseline build is made with, e.g.:
#
#   git worktree add /tmp/base main && (cd /tmp/base && cargo build --release)
#   bench/latency-ab.sh /tmp/base/target/release
#
# Usage: bench/latency-ab.sh BASELINE_DIR [--reps N] [--iters N] [--one-cpu CPU | --apart]
#   BASELINE_DIR  holds the baseline's softverbs binary and libsoftverbs_ibverbs.so
#   --reps N      repetitions (default 5)
#   --iters N     iterations per latency run (default 5000)
#   --one-cpu CPU runs both ends of every run (sockperf's too) on that one CPU (taskset):
#                 the state the scheduler leaves a ping-pong in on some runs of a 2-core
#                 host, where the two spinning ends take turns (docs/udp-latency.md,
#                 session 11); without it the scheduler places them
#   --apart       runs every server (sockperf's, perftest's, `softverbs perf --server`) on
#                 CPU 0 and every client on CPU 1 (taskset): the two spinning ends on two
#                 CPUs on purpose, whatever the scheduler would do. The placement that
#                 issue 16's ratios mean; free placement swings 2x between hours here
#
# Every softverbs run is on the UDP path (SOFTVERBS_SAME_HOST=0) unless the caller sets the
# variable: these are the UDP path's latency rows, and the two ends share a host.
#
# Loopback only; every process is bounded by `timeout`. Needs sockperf, perftest, python3.
set -euo pipefail
export SOFTVERBS_SAME_HOST="${SOFTVERBS_SAME_HOST:-0}"

BASE=""
REPS=5
ITERS=5000
# taskset prefixes of the server and the client of every run (empty: free placement)
SRV_PIN=()
CLI_PIN=()
APART=0
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --iters)
            ITERS="${2:?--iters needs a number}"
            shift
            ;;
        --one-cpu)
            SRV_PIN=(taskset -c "${2:?--one-cpu needs a CPU number}")
            CLI_PIN=("${SRV_PIN[@]}")
            shift
            ;;
        --apart)
            SRV_PIN=(taskset -c 0)
            CLI_PIN=(taskset -c 1)
            APART=1
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            if [ -n "$BASE" ]; then
                echo "latency-ab.sh: unexpected argument $1 (try --help)" >&2
                exit 1
            fi
            BASE="$1"
            ;;
    esac
    shift
done
if [ -z "$BASE" ] || [ ! -x "$BASE/softverbs" ]; then
    echo "latency-ab.sh: give the directory of a baseline build (its softverbs binary); try --help" >&2
    exit 1
fi
for t in sockperf ib_send_lat ib_write_lat timeout python3 taskset; do
    command -v "$t" > /dev/null 2>&1 || {
        echo "latency-ab.sh: missing $t (sudo apt-get install -y sockperf perftest python3)" >&2
        exit 1
    }
done

cd "$(dirname "$0")/.."
cargo build --release -p softverbs-cli -p softverbs-ibverbs-abi
A="$(cd "$BASE" && pwd)/softverbs"
B="$(pwd)/target/release/softverbs"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-lat-ab.XXXXXX")
PIDS=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill "$p" 2> /dev/null || true
    done
    wait 2> /dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

free_port() {
    python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if sys.argv[1] == "udp" else socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"
}

# Waits until something listens on 127.0.0.1:PORT (udp or tcp), at most 10 s.
wait_bound() {
    local flag=-lnt
    if [ "$2" = udp ]; then flag=-lnu; fi
    for _ in $(seq 100); do
        if ss -H "$flag" "sport = :$1" | grep -q .; then return 0; fi
        sleep 0.1
    done
    echo "latency-ab.sh: nothing listens on port $1" >&2
    exit 1
}

record() { echo "$1 $2" >> "$TMP/results"; }

sockperf_busy() {
    local port srv p50
    port=$(free_port udp)
    "${SRV_PIN[@]}" sockperf server -i 127.0.0.1 -p "$port" --nonblocked > /dev/null 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" udp
    p50=$("${CLI_PIN[@]}" timeout 60 sockperf ping-pong -i 127.0.0.1 -p "$port" -t 3 -m 24 --nonblocked 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' | awk '/percentile 50\.000/ { print $NF }')
    kill "$srv" 2> /dev/null || true
    wait "$srv" 2> /dev/null || true
    record sockperf_busy "$p50"
}

perf_lat() { # BUILD_NAME BINARY OP
    local typ port srv
    local client=("$2" perf "$3" --lat --size 8 --iters "$ITERS" --json)
    if [ "$APART" = 1 ]; then
        # The server as a process of its own (not the client's child) on its own CPU.
        port=$(free_port tcp)
        "${SRV_PIN[@]}" timeout 120 "$2" perf "$3" --server -p "$port" > /dev/null 2>&1 &
        srv=$!
        PIDS+=("$srv")
        wait_bound "$port" tcp
        client+=(-p "$port" 127.0.0.1)
    fi
    typ=$("${CLI_PIN[@]}" timeout 120 "${client[@]}" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["lat"][0]["t_typical_usec"])')
    if [ "$APART" = 1 ]; then
        wait "$srv" || true
    fi
    record "$1_perf_$3" "$typ"
}

perftest_lat() { # BUILD_NAME BINARY TOOL
    local port srv typ
    port=$(free_port tcp)
    "${SRV_PIN[@]}" timeout 120 "$2" run -- "$3" -F -p "$port" -s 8 -n "$ITERS" > /dev/null 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" tcp
    typ=$("${CLI_PIN[@]}" timeout 120 "$2" run -- "$3" -F -p "$port" -s 8 -n "$ITERS" 127.0.0.1 2>&1 |
        awk '/#bytes/ { getline; print $5; exit }')
    wait "$srv" || true
    record "$1_$3" "$typ"
}

for rep in $(seq 1 "$REPS"); do
    echo "repetition $rep of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    sockperf_busy
    for build in A B; do
        bin=$A
        if [ "$build" = B ]; then bin=$B; fi
        perf_lat "$build" "$bin" send
        perf_lat "$build" "$bin" write
        perftest_lat "$build" "$bin" ib_send_lat
        perftest_lat "$build" "$bin" ib_write_lat
    done
done

echo
echo "A = $A"
if [ "$APART" = 1 ]; then
    echo "placement: servers on CPU 0, clients on CPU 1 (--apart)"
elif [ ${#CLI_PIN[@]} -gt 0 ]; then
    echo "placement: both ends on CPU ${CLI_PIN[2]} (--one-cpu)"
else
    echo "placement: the scheduler's"
fi
echo "B = $B"
python3 - "$TMP/results" << 'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    key, value = line.split()
    runs[key].append(float(value))
m = {k: statistics.median(v) for k, v in runs.items()}
sp = m["sockperf_busy"]
print("median one-way latency, us (each run's figure after it)")
print("%-18s %8s %9s   %s" % ("", "median", "/sockperf", "runs"))
print("%-18s %8.2f %9s   %s" % ("sockperf busy", sp, "1.00x", " ".join("%.2f" % x for x in runs["sockperf_busy"])))
for what in ["perf_send", "perf_write", "ib_send_lat", "ib_write_lat"]:
    for build in "AB":
        k = build + "_" + what
        print("%-18s %8.2f %8.2fx   %s" % (k, m[k], m[k] / sp, " ".join("%.2f" % x for x in runs[k])))
EOF
