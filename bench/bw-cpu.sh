#!/usr/bin/env bash
# CPU per GB of each end of a 64 KiB (or --size) WRITE or READ stream on the UDP path, two builds
# interleaved (issue 16's CPU row, measured per process so it holds on a loaded host
# better than wall-clock bandwidth does). Per run: `softverbs perf OP --bw --size SIZE
# --duration S`, server and client as two processes on loopback (SOFTVERBS_SAME_HOST=0),
# each under `perf stat` (task-clock, context switches, its recvmmsg / sendmmsg / sendmsg /
# sched_yield / ppoll calls), the kernel's UDP counters (/proc/net/snmp: RcvbufErrors,
# SndbufErrors, InErrors) around the run, and the client's device counters (packets
# resent, early timeouts, probes). Each pair starts with the anchor: raw UDP with GSO and
# GRO (bench-tools udp-gso, 15 x 4096 B per send) for as long, its receiver's and
# sender's CPU s/GB. Prints each run, then per build the medians: GB/s, CPU s/GB of the
# target (server), of the requester (client) and both, context switches and system calls
# per message.
#
# Usage: bench/bw-cpu.sh BASELINE_DIR [--reps N] [--secs S] [--op write|read] [--size B]
#        [--env-b VAR=VALUE]...
#   BASELINE_DIR  holds the baseline's softverbs binary (A); B is this tree's release build
#   --reps N      pairs (default 4; which build goes first alternates)
#   --secs S      seconds per run (default 3)
#   --op OP       write (default) or read
#   --size B      message size in bytes (default 65536)
#   --env-b V=X   set V=X in both processes of B only (e.g. a knob against its default,
#                 with BASELINE_DIR this tree's target/release: an A/A of one build)
#
# Loopback only; every process is bounded by `timeout`. Needs perf (with the syscall
# tracepoints), python3, cargo.
set -euo pipefail

BASE=""
REPS=4
SECS=3
SIZE=65536
OP=write
ENV_B=()
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --size)
            SIZE="${2:?--size needs a number of bytes}"
            shift
            ;;
        --secs)
            SECS="${2:?--secs needs a number}"
            shift
            ;;
        --op)
            OP="${2:?--op needs write or read}"
            shift
            ;;
        --env-b)
            ENV_B+=("${2:?--env-b needs VAR=VALUE}")
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
                echo "bw-cpu.sh: unknown argument $1 (try --help)" >&2
                exit 1
            fi
            ;;
    esac
    shift
done
[ -x "$BASE/softverbs" ] || {
    echo "bw-cpu.sh: $BASE/softverbs is not there (see --help)" >&2
    exit 1
}
EVENTS=task-clock,context-switches
for s in recvmmsg sendmmsg sendmsg sched_yield ppoll; do
    EVENTS="$EVENTS,syscalls:sys_enter_$s"
done
perf stat -x, -e "$EVENTS" -o /dev/null -- true 2> /dev/null || {
    echo "bw-cpu.sh: needs perf stat with the syscall tracepoints" >&2
    exit 1
}

cd "$(dirname "$0")/.."
unset CARGO_TARGET_DIR
cargo build --release -p softverbs-cli -p softverbs-bench-tools
A="$BASE/softverbs"
B="$(pwd)/target/release/softverbs"
GSO="$(pwd)/target/release/udp-gso"
export SOFTVERBS_SAME_HOST=0
BOUND=120
TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-bw-cpu.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
RESULTS="$TMP/results"
: > "$RESULTS"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
udp_errors() { awk '/^Udp:/ { if (h) { print $4, $6, $7; exit } h = 1 }' /proc/net/snmp; }

one_run() {
    local build=$1 bin=$2 dir=$TMP/run port srv before after
    local env=(env)
    [ "$build" = B ] && env+=("${ENV_B[@]}")
    rm -rf "$dir"
    mkdir -p "$dir"
    port=$(free_port)
    before=$(udp_errors)
    perf stat -x, -e "$EVENTS" -o "$dir/srv.stat" -- "${env[@]}" timeout "$BOUND" "$bin" perf "$OP" \
        --server -p "$port" > "$dir/srv.out" 2>&1 &
    srv=$!
    sleep 0.3
    perf stat -x, -e "$EVENTS" -o "$dir/cli.stat" -- "${env[@]}" timeout "$BOUND" "$bin" perf "$OP" --bw \
        --size "$SIZE" --duration "$SECS" -p "$port" --json 127.0.0.1 > "$dir/cli.out" 2> "$dir/cli.err"
    wait "$srv"
    after=$(udp_errors)
    python3 - "$dir" "$RESULTS" "$OP-$build" "$before" "$after" "$SIZE" << 'EOF'
import json, sys
d, results, key, before, after, size = sys.argv[1:]
def stat(path):
    r = {}
    for line in open(path):
        p = line.strip().split(",")
        if len(p) > 2 and p[0][:1].isdigit():
            r[p[2].replace("syscalls:sys_enter_", "")] = float(p[0])
    return r
out = json.load(open(f"{d}/cli.out"))
bw, c = out["bw"][0], out["client_counters"]
msgs = bw["iterations"]
gb = msgs * int(size) / 1e9
gbs = bw["bw_avg_mb_per_sec"] * 2**20 / 1e9
srv, cli = stat(f"{d}/srv.stat"), stat(f"{d}/cli.stat")
drops = [int(a) - int(b) for a, b in zip(after.split(), before.split())]
row = {
    "gbs": gbs,
    "srv_cpu": srv["task-clock"] / 1e3 / gb,
    "cli_cpu": cli["task-clock"] / 1e3 / gb,
    "cpu": (srv["task-clock"] + cli["task-clock"]) / 1e3 / gb,
    "srv_cs": srv["context-switches"] / msgs,
    "cli_cs": cli["context-switches"] / msgs,
    "srv_rx": srv["recvmmsg"] / msgs,
    "cli_rx": cli["recvmmsg"] / msgs,
    "cli_tx": (cli["sendmmsg"] + cli["sendmsg"]) / msgs,
    "srv_tx": (srv["sendmmsg"] + srv["sendmsg"]) / msgs,
    "cli_yield": cli["sched_yield"] / msgs,
    "resent_per_gb": c["retransmitted_packets"] / gb,
}
print(f"  {key:8} {gbs:.3f} GB/s  CPU s/GB target {row['srv_cpu']:.3f} requester {row['cli_cpu']:.3f}"
      f" both {row['cpu']:.3f}  cs/msg {row['srv_cs']:.2f} {row['cli_cs']:.2f}"
      f"  recvmmsg/msg {row['srv_rx']:.2f} {row['cli_rx']:.2f}  send calls/msg {row['srv_tx']:.2f} {row['cli_tx']:.2f}"
      f"  yields/msg {row['cli_yield']:.2f}  resent {c['retransmitted_packets']}"
      f" (early {c['early_retransmits']}, probes {c['tail_loss_probes']}, IBTA {c['ack_timeouts']})"
      f"  UDP RcvbufErrors/SndbufErrors/InErrors +{drops[1]}/+{drops[2]}/+{drops[0]}")
with open(results, "a") as f:
    for k, v in row.items():
        f.write(f"{key} {k} {v}\n")
EOF
}

for rep in $(seq 1 "$REPS"); do
    echo "pair $rep of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    timeout "$BOUND" "$GSO" --secs "$SECS" > "$TMP/gso.out"
    python3 - "$TMP/gso.out" "$RESULTS" << 'EOF'
import sys
d = dict(line.strip().split("=", 1) for line in open(sys.argv[1]) if "=" in line)
gb = float(d["received_bytes"]) / 1e9
row = {"gbs": float(d["udp_gso_gbs"]), "srv_cpu": float(d["receiver_cpu_s"]) / gb,
       "cli_cpu": float(d["sender_cpu_s"]) / gb}
print(f"  raw UDP GSO {row['gbs']:.3f} GB/s  CPU s/GB receiver {row['srv_cpu']:.3f} sender {row['cli_cpu']:.3f}")
with open(sys.argv[2], "a") as f:
    for k, v in row.items():
        f.write(f"gso {k} {v}\n")
EOF
    order="A B"
    if [ $((rep % 2)) = 0 ]; then order="B A"; fi
    for build in $order; do
        bin=$A
        [ "$build" = B ] && bin=$B
        one_run "$build" "$bin"
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RESULTS" "$REPS" "$OP" << 'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    key, what, value = line.split()
    rows.setdefault((key, what), []).append(float(value))
op = sys.argv[3]
print(f"\nmedians of {sys.argv[2]} pairs (A: baseline, B: this tree), {op}")
g = {what: statistics.median(v) for (key, what), v in rows.items() if key == "gso"}
print(f"  raw UDP GSO: {g['gbs']:.3f} GB/s  CPU s/GB receiver {g['srv_cpu']:.3f} sender {g['cli_cpu']:.3f}")
for b in ("A", "B"):
    k = f"{op}-{b}"
    m = {what: statistics.median(v) for (key, what), v in rows.items() if key == k}
    print(f"  {b}: {m['gbs']:.3f} GB/s  CPU s/GB target {m['srv_cpu']:.3f} requester {m['cli_cpu']:.3f}"
          f" both {m['cpu']:.3f}  cs/msg {m['srv_cs']:.2f} {m['cli_cs']:.2f}"
          f"  recvmmsg/msg {m['srv_rx']:.2f} {m['cli_rx']:.2f}  send calls/msg {m['srv_tx']:.2f} {m['cli_tx']:.2f}"
          f"  yields/msg {m['cli_yield']:.2f}"
          f"  resent/GB {m['resent_per_gb']:.0f}")
EOF
