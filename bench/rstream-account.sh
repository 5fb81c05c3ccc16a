#!/usr/bin/env bash
# Per-message accounting of `softverbs rstream -S 65536 -C COUNT -T b` (issue 13's bulk
# row) beside `softverbs perf write --size 65536` (docs/sockets.md, session 17): for each
# run, the rate, and per process per message (each process writes COUNT messages and reads
# COUNT) its CPU time, context switches and system calls (perf stat's syscall tracepoints:
# the tracing itself costs some of the rate), and from the devices' published counters
# the writes that waited for room, the writer's ACK looks and the datagrams sent; then
# `perf write`'s CPU per message (its client and the local server it starts; one
# process_vm_writev a message, into a buffer nobody reads).
#
# Usage: bench/rstream-account.sh [--runs N] [--count C] [--modes "apart free one"]
#   apart: server `taskset -c 0`, client `-c 1`; one: both on CPU 0; free: the scheduler's
#   placement. Runs are interleaved by mode. SOCKETS_BIN=DIR takes `softverbs` from DIR
#   (an A/B run against saved binaries), else this tree's release build (built here).
# Talks only to 127.0.0.1; every process is bounded by `timeout`. Needs perf (with
# syscall tracepoints), taskset, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3
COUNT=20000
MODES="apart free"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="${2:?}"; shift ;;
        --count) COUNT="${2:?}"; shift ;;
        --modes) MODES="${2:?}"; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "rstream-account.sh: unexpected argument $1 (try --help)" >&2; exit 1 ;;
    esac
    shift
done
NAME=rstream-account.sh
source bench/rstream-pair.sh
EVENTS=task-clock,context-switches
for call in process_vm_writev recvmmsg recvmsg sendmsg sendmmsg ppoll timerfd_settime futex; do
    EVENTS+=",syscalls:sys_enter_$call"
done

# One rstream run in MODE; the devices' counters are sampled every 50 ms while it runs
# (a device publishes them at most every 100 ms and removes them when it closes).
run() {
    local mode=$1 p
    p=$(port)
    placement "$mode"
    rm -f "$DIR"/stat.*
    timeout 120 "${TS[@]}" perf stat -x, -e "$EVENTS" -o "$DIR/server" \
        "$SV" rstream -b 127.0.0.1 -p "$p" -S 65536 -C "$COUNT" -T b > /dev/null &
    local srv=$!
    sleep 0.3
    (for i in $(seq 1 1200); do
        "$SV" stat --json > "$DIR/stat.$i" 2> /dev/null || true
        sleep 0.05
    done) &
    local mon=$!
    timeout 120 "${TC[@]}" perf stat -x, -e "$EVENTS" -o "$DIR/client" \
        "$SV" rstream -s 127.0.0.1 -p "$p" -S 65536 -C "$COUNT" -T b | tail -1 > "$DIR/line"
    wait "$srv"
    kill "$mon" 2> /dev/null || true
    wait "$mon" 2> /dev/null || true
    python3 - "$DIR" "$mode" "$COUNT" << 'PY'
import glob, json, sys
from perfstat import stat
d, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
msgs = 2 * count  # each process writes COUNT and reads COUNT
line = open(f"{d}/line").read().split()
gbps = line[6] if len(line) > 6 else "nan"
# The two devices of this run: those whose published counters show a same-host QP, last
# seen in the newest samples (other programs' devices may be open too: the two with the
# highest pids among the devices seen in the last sample that held any).
last = {}
for f in sorted(glob.glob(f"{d}/stat.*"), key=lambda x: int(x.rsplit(".", 1)[1])):
    try:
        devices = json.load(open(f))
    except (ValueError, OSError):
        continue
    for dev in devices:
        if dev["counters"].get("same_host_qps"):
            last[dev["pid"]] = dev["counters"]
load = open("/proc/loadavg").read().split()[0]
print(f"{mode:5} {gbps:>6} Gb/s  load {load}")
for who in ("server", "client"):
    r = stat(f"{d}/{who}", strip="syscalls:sys_enter_")
    calls = " ".join(f"{k} {v / msgs:.2f}" for k, v in r.items() if k not in ("task-clock", "context-switches"))
    print(f"  {who}: CPU {r.get('task-clock', 0) * 1000 / msgs:.1f} us/msg, "
          f"context switches {r.get('context-switches', 0) / msgs:.3f}/msg; calls/msg: {calls}")
for pid in sorted(last)[-2:]:
    c = last[pid]
    print(f"  device of pid {pid} (last sample): writes blocked {c.get('sock_writes_blocked', 0)}, "
          f"ACK looks {c.get('sock_ack_looks', 0)}, datagrams sent {c.get('udp_tx_datagrams', 0)}, "
          f"placed writes {c.get('same_host_writes', 0)}, progress-thread timer wake-ups "
          f"{c.get('progress_timer_wakeups', 0)}")
PY
}

perf_write() {
    timeout 60 perf stat -x, -e task-clock -o "$DIR/pw" \
        "$SV" perf write --size 65536 -D 1 --json > "$DIR/pw.json"
    python3 - "$DIR" << 'PY'
import json, sys
d = sys.argv[1]
bw = json.load(open(f"{d}/pw.json"))["bw"][0]
cpu_ms = next(float(l.split(",")[0]) for l in open(f"{d}/pw") if "task-clock" in l)
gbps = bw["bw_avg_mb_per_sec"] * 2**20 * 8 / 1e9
load = open("/proc/loadavg").read().split()[0]
print(f"perf write {gbps:.2f} Gb/s  load {load}: CPU {cpu_ms * 1000 / bw['iterations']:.1f} us/msg "
      f"({bw['iterations']} messages; the client and the local server it starts)")
PY
}

for _ in $(seq 1 "$RUNS"); do
    for mode in $MODES; do
        run "$mode"
    done
    perf_write
done
