#!/usr/bin/env bash
# What differs between perftest over the drop-in and `softverbs perf` in a bandwidth run
# (issue 16: ib_write_bw / ib_read_bw >= 0.95 x perf write / read): both tools run
# interleaved, the same operation, size and iteration count, on the UDP path
# (SOFTVERBS_SAME_HOST=0), server and client as two processes on loopback. Per run it
# prints the bandwidth, both devices' counters (their published `softverbs stat` files,
# read every 30 ms from a private XDG_RUNTIME_DIR, the last copy kept) and, when
# `perf stat` works here, each process's CPU time, context switches and system calls:
#
#   target:    datagrams it sent (for WRITE: its ACKs), its progress thread's sleeps
#              (one per wake-up), packets per wake-up
#   requester: packets resent, early timeouts and tail-loss probes, the share of the
#              datagrams it received that its progress thread took (the rest the
#              application's polls did), poll_yields
#   CPU:       ms and context switches of each process (perftest's client spends about
#              0.2 s of its own before the test: it measures the CPU clock), its
#              recvmmsg and sched_yield calls
#
# then the medians per tool. The run-to-run spread on this 2-core host is large (WRITE
# 0.4-1.8 GB/s in every build at load 4-6): judge medians of many runs.
#
# Usage: bench/bw-modes.sh [--reps N] [--op write|read] [--iters N] [--size B] [--bin DIR] [--out DIR]
#   --reps N    runs of each tool (default 6)
#   --op OP     write (default) or read
#   --iters N   messages per run, both tools (default 5000: ib_write_bw's and perf's
#               default; ib_read_bw's own default is 1000)
#   --size B    message size in bytes (default 65536)
#   --bin DIR   the build to run (holds softverbs; default this tree's target/release,
#               built first)
#   --out DIR   keep every run's raw files in DIR
#
# Loopback only; every process is bounded by `timeout`. Needs perftest, python3.
set -euo pipefail

REPS=6
OP=write
ITERS=5000
SIZE=65536
BIN=""
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --op)
            OP="${2:?--op needs write or read}"
            shift
            ;;
        --size)
            SIZE="${2:?--size needs a number of bytes}"
            shift
            ;;
        --iters)
            ITERS="${2:?--iters needs a number}"
            shift
            ;;
        --bin)
            BIN="${2:?--bin needs a directory}"
            shift
            ;;
        --out)
            OUT="${2:?--out needs a directory}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "bw-modes.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
case "$OP" in
    write | read) ;;
    *)
        echo "bw-modes.sh: --op is write or read" >&2
        exit 1
        ;;
esac
command -v "ib_${OP}_bw" > /dev/null || {
    echo "bw-modes.sh: needs ib_${OP}_bw (apt-get install perftest)" >&2
    exit 1
}

cd "$(dirname "$0")/.."
if [ -z "$BIN" ]; then
    unset CARGO_TARGET_DIR
    cargo build --release --workspace --quiet
    BIN="$(pwd)/target/release"
fi
SV="$BIN/softverbs"
[ -x "$SV" ] || {
    echo "bw-modes.sh: $SV is not there" >&2
    exit 1
}
export SOFTVERBS_SAME_HOST=0
BOUND=120
TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-bw-modes.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"

# perf stat of each process, when the kernel lets us.
EVENTS=task-clock,context-switches,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_sched_yield
STAT=()
if perf stat -x, -e "$EVENTS" -o /dev/null -- true 2> /dev/null; then
    STAT=(perf stat -x, -e "$EVENTS" -o)
else
    echo "bw-modes.sh: perf stat with syscall tracepoints is not available: no CPU columns" >&2
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Runs CMD... under perf stat into FILE (or plainly): stat_run FILE CMD...
stat_run() {
    local file=$1
    shift
    if [ ${#STAT[@]} -gt 0 ]; then
        "${STAT[@]}" "$file" -- "$@"
    else
        "$@"
    fi
}

# One run of TOOL (pt: ib_OP_bw over the drop-in; sv: softverbs perf OP --bw) into DIR.
one_run() {
    local tool=$1 dir=$2 port srv sampler ok=0
    mkdir -p "$dir"
    port=$(free_port)
    export XDG_RUNTIME_DIR="$dir/xdg"
    mkdir -p "$XDG_RUNTIME_DIR"
    # The devices' counter files, copied until the run ends (a device removes its file
    # when it closes), with each owner's command line.
    (
        while [ ! -e "$dir/.stop" ]; do
            for f in "$XDG_RUNTIME_DIR"/softverbs/*.stat; do
                [ -e "$f" ] || continue
                local name
                name=$(basename "$f")
                cp "$f" "$dir/cnt.$name" 2> /dev/null || true
                if [ ! -e "$dir/cnt.$name.cmd" ]; then
                    local pid
                    pid=$(awk '$1 == "pid" { print $2 }' "$dir/cnt.$name")
                    tr '\0' ' ' < "/proc/$pid/cmdline" > "$dir/cnt.$name.cmd" 2> /dev/null || true
                fi
            done
            sleep 0.03
        done
    ) &
    sampler=$!
    if [ "$tool" = pt ]; then
        stat_run "$dir/srv.stat" timeout "$BOUND" "$SV" run -- "ib_${OP}_bw" -F -p "$port" \
            -s "$SIZE" -n "$ITERS" > "$dir/srv.out" 2>&1 &
        srv=$!
        sleep 0.3
        stat_run "$dir/cli.stat" timeout "$BOUND" "$SV" run -- "ib_${OP}_bw" -F -p "$port" \
            -s "$SIZE" -n "$ITERS" 127.0.0.1 > "$dir/cli.out" 2>&1 || ok=$?
        awk '/#bytes/ { getline; print $4; exit }' "$dir/cli.out" > "$dir/mbs"
    else
        stat_run "$dir/srv.stat" timeout "$BOUND" "$SV" perf "$OP" --server -p "$port" \
            > "$dir/srv.out" 2>&1 &
        srv=$!
        sleep 0.3
        stat_run "$dir/cli.stat" timeout "$BOUND" "$SV" perf "$OP" --bw --size "$SIZE" \
            --iters "$ITERS" -p "$port" --json 127.0.0.1 > "$dir/cli.out" 2>&1 || ok=$?
        python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bw"][0]["bw_avg_mb_per_sec"])' \
            "$dir/cli.out" > "$dir/mbs" 2> /dev/null || ok=1
    fi
    wait "$srv" || ok=$?
    touch "$dir/.stop"
    wait "$sampler" || true
    rm -rf "$XDG_RUNTIME_DIR"
    unset XDG_RUNTIME_DIR
    if [ "$ok" != 0 ]; then
        echo "bw-modes.sh: the $tool run failed:" >&2
        cat "$dir/srv.out" "$dir/cli.out" >&2
        exit 1
    fi
}

for rep in $(seq 1 "$REPS"); do
    echo "repetition $rep of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    # Which tool goes first alternates.
    order="pt sv"
    if [ $((rep % 2)) = 0 ]; then order="sv pt"; fi
    for tool in $order; do
        one_run "$tool" "$TMP/$tool-$rep"
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$TMP" "$OP" "$REPS" << 'EOF'
import glob, statistics, sys

tmp, op, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])


def counters(path):
    d = {}
    for line in open(path):
        p = line.split()
        if len(p) == 2 and p[1].isdigit():
            d[p[0]] = int(p[1])
    return d


def perf_stat(path):
    d = {}
    try:
        for line in open(path):
            p = line.strip().split(",")
            if len(p) > 2 and p[0][:1].isdigit():
                d[p[2].replace("syscalls:sys_enter_", "")] = float(p[0])
    except OSError:
        pass
    return d


def run(tool, rep):
    r = f"{tmp}/{tool}-{rep}"
    req = tgt = None
    for f in glob.glob(f"{r}/cnt.*.stat"):
        cmd = open(f + ".cmd").read() if glob.glob(f + ".cmd") else ""
        if "127.0.0.1" in cmd:
            req = counters(f)
        else:
            tgt = counters(f)
    if req is None or tgt is None:
        return None
    row = {"tool": tool, "rep": rep, "mbs": float(open(f"{r}/mbs").read())}
    row["t_sent"] = tgt["udp_tx_datagrams"]
    row["t_wakes"] = tgt["progress_sleeps"]
    row["t_pkts_per_wake"] = tgt["rx_packets"] / max(1, tgt["progress_sleeps"])
    row["r_resent"] = req["retransmitted_packets"]
    row["r_early"] = req["early_retransmits"]
    row["r_probes"] = req["tail_loss_probes"]
    row["r_by_progress"] = req["udp_rx_by_progress_thread"] / max(1, req["udp_rx_datagrams"])
    row["r_yields"] = req["poll_yields"]
    for side, f in (("srv", "srv.stat"), ("cli", "cli.stat")):
        s = perf_stat(f"{r}/{f}")
        for k in ("task-clock", "context-switches", "recvmmsg", "sched_yield"):
            row[f"{side}_{k}"] = s.get(k, float("nan"))
    return row


cols = [
    ("MB/s", "mbs", "%7.0f"),
    ("T sent", "t_sent", "%6d"),
    ("T wakes", "t_wakes", "%7d"),
    ("pkts/wake", "t_pkts_per_wake", "%9.1f"),
    ("R resent", "r_resent", "%8d"),
    ("early", "r_early", "%5d"),
    ("probes", "r_probes", "%6d"),
    ("R rx prog", "r_by_progress", "%9.2f"),
    ("yields", "r_yields", "%6d"),
    ("srv ms", "srv_task-clock", "%6.0f"),
    ("srv cs", "srv_context-switches", "%6.0f"),
    ("cli ms", "cli_task-clock", "%6.0f"),
    ("cli cs", "cli_context-switches", "%6.0f"),
    ("cli rmm", "cli_recvmmsg", "%7.0f"),
    ("cli yld", "cli_sched_yield", "%7.0f"),
]
name = {"pt": f"ib_{op}_bw", "sv": f"perf {op}"}
print("%-14s" % "run" + " ".join("%*s" % (len(f % 0), h) for h, _, f in cols))
rows = {"pt": [], "sv": []}
for rep in range(1, reps + 1):
    for tool in ("pt", "sv"):
        row = run(tool, rep)
        if row is None:
            print(f"{name[tool]} {rep}: no counters")
            continue
        rows[tool].append(row)
        print("%-14s" % f"{name[tool]} {rep}" + " ".join(f % row[k] for _, k, f in cols))
print()
for tool in ("pt", "sv"):
    if rows[tool]:
        med = {k: statistics.median(r[k] for r in rows[tool]) for _, k, _ in cols}
        print("%-14s" % f"{name[tool]} med" + " ".join(f % med[k] for _, k, f in cols))
if rows["pt"] and rows["sv"]:
    a = statistics.median(r["mbs"] for r in rows["pt"])
    b = statistics.median(r["mbs"] for r in rows["sv"])
    print(f"\nib_{op}_bw / perf {op}: {a / b:.2f} x (medians of {len(rows['pt'])} and {len(rows['sv'])} runs)")
EOF
if [ -n "$OUT" ]; then
    cp -r "$TMP"/. "$OUT"/
fi
