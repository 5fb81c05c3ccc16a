#!/usr/bin/env bash
# 64 KiB RDMA WRITE and READ bandwidth of two softverbs builds on the UDP path, against
# iperf3 (one TCP stream), interleaved in one run (issue 16's bandwidth and CPU rows,
# before / after a change). Per repetition: iperf3, then for WRITE and READ the
# baseline A and this tree's build B (in turn first) (`softverbs perf OP --bw --size 65536 --duration S`,
# both ends local, SOFTVERBS_SAME_HOST=0). Prints each run, then the medians: GB/s,
# the ratio to iperf3, CPU seconds per GB (user + system of both ends, from
# getrusage of the children) and context switches per 64 KiB message (voluntary +
# involuntary, both ends). A baseline build is made with, e.g.:
#
#   git worktree add /tmp/base main && (cd /tmp/base && cargo build --release -p softverbs-cli)
#   bench/bw-ab.sh /tmp/base/target/release
#
# Usage: bench/bw-ab.sh BASELINE_DIR [--reps N] [--secs S]
#   BASELINE_DIR  holds the baseline's softverbs binary
#   --reps N      repetitions (default 3)
#   --secs S      seconds per run (default 3)
#
# Loopback only; every process is bounded by `timeout`. Needs iperf3, python3, cargo.
set -euo pipefail

BASE=""
REPS=3
SECS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --secs)
            SECS="${2:?--secs needs a number}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            if [ -z "$BASE" ]; then
                BASE="$1"
            else
                echo "bw-ab.sh: unknown argument $1 (try --help)" >&2
                exit 1
            fi
            ;;
    esac
    shift
done
[ -x "$BASE/softverbs" ] || {
    echo "bw-ab.sh: $BASE/softverbs is not there (see --help)" >&2
    exit 1
}
command -v iperf3 > /dev/null || {
    echo "bw-ab.sh: needs iperf3 (apt-get install iperf3)" >&2
    exit 1
}

cd "$(dirname "$0")/.."
unset CARGO_TARGET_DIR
cargo build --release -p softverbs-cli
A="$BASE/softverbs"
B="$(pwd)/target/release/softverbs"
export SOFTVERBS_SAME_HOST=0
BOUND=120
TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-bw-ab.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
RESULTS="$TMP/results"
: > "$RESULTS"

# Runs a command; writes "cpu_seconds context_switches" of it and its waited-for
# descendants to FILE: usage FILE CMD...
usage() {
    /usr/bin/python3 -c '
import resource, subprocess, sys
out = open(sys.argv[1] + ".out", "w")
rc = subprocess.call(sys.argv[2:], stdout=out, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%.6f %d\n" % (r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw))
sys.exit(rc)' "$@"
}

for rep in $(seq 1 "$REPS"); do
    echo "repetition $rep of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    usage "$TMP/iperf-server" timeout "$BOUND" iperf3 -s -1 -B 127.0.0.1 -p "$port" &
    srv=$!
    sleep 0.5
    usage "$TMP/iperf-client" timeout "$BOUND" iperf3 -c 127.0.0.1 -p "$port" -t "$SECS" --json
    wait "$srv" || true
    /usr/bin/python3 - "$TMP" "$RESULTS" << 'EOF'
import json, sys
tmp, results = sys.argv[1:]
d = json.load(open(f"{tmp}/iperf-client.out"))["end"]["sum_received"]
gb = d["bytes"] / 1e9
cpu = sum(float(open(f"{tmp}/iperf-{s}").read().split()[0]) for s in ("server", "client"))
print(f"  iperf3 TCP      {gb / d['seconds']:.3f} GB/s  {cpu / gb:.3f} CPU s/GB")
open(results, "a").write(f"iperf gbs {gb / d['seconds']}\niperf cpu {cpu / gb}\n")
EOF
    # Which build goes first alternates, so neither always follows iperf3.
    order="A B"
    if [ $((rep % 2)) = 0 ]; then order="B A"; fi
    for op in write read; do
        for build in $order; do
            bin=$A
            [ "$build" = B ] && bin=$B
            usage "$TMP/sv" timeout "$BOUND" "$bin" perf "$op" --bw --size 65536 --json --duration "$SECS"
            /usr/bin/python3 - "$TMP" "$RESULTS" "$op" "$build" << 'EOF'
import json, sys
tmp, results, op, build = sys.argv[1:]
bw = json.load(open(f"{tmp}/sv.out"))["bw"][0]
msgs = bw["iterations"]
gb = msgs * 65536 / 1e9
gbs = bw["bw_avg_mb_per_sec"] * 2**20 / 1e9
cpu, cs = open(f"{tmp}/sv").read().split()
key = f"{op}-{build}"
print(f"  {op:5} {build}         {gbs:.3f} GB/s  {float(cpu) / gb:.3f} CPU s/GB  {int(cs) / msgs:.3f} context switches per message")
open(results, "a").write(f"{key} gbs {gbs}\n{key} cpu {float(cpu) / gb}\n{key} cs {int(cs) / msgs}\n")
EOF
        done
    done
done

/usr/bin/python3 - "$RESULTS" "$REPS" << 'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, what, value = line.split()
    rows.setdefault((key, what), []).append(float(value))
med = {k: statistics.median(v) for k, v in rows.items()}
print(f"\nmedians of {sys.argv[2]} (A: baseline, B: this tree)")
print(f"  iperf3 TCP      {med[('iperf', 'gbs')]:.3f} GB/s  {med[('iperf', 'cpu')]:.3f} CPU s/GB")
for op in ("write", "read"):
    for b in ("A", "B"):
        k = f"{op}-{b}"
        print(f"  {op:5} {b}         {med[(k, 'gbs')]:.3f} GB/s = {med[(k, 'gbs')] / med[('iperf', 'gbs')]:.2f}x iperf3"
              f"  {med[(k, 'cpu')]:.3f} CPU s/GB = {med[(k, 'cpu')] / med[('iperf', 'cpu')]:.2f}x iperf3's"
              f"  {med[(k, 'cs')]:.3f} context switches per message")
EOF
