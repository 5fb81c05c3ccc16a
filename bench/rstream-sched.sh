#!/usr/bin/env bash
# Where an rstream pair runs, and how much CPU it gets (docs/sockets.md, session 18,
# rsfree): `softverbs rstream -S SIZE -C COUNT -T b` (issue 13's bulk row) per run under
# `perf stat` (each process's CPU time, context switches, migrations) and, with --trace,
# `perf record -a` of the scheduler's tracepoints (sched_switch, sched_wakeup,
# sched_migrate_task), summed per thread: CPU time per CPU, time runnable but waiting for
# a CPU, sleeps, preemptions, migrations, who woke it and whether the wake-up put it on
# the waker's CPU; and for the pair's two main threads, how long both were runnable on
# one CPU while the other CPU was idle or ran something else (and what).
#
# Per run it prints the rate, the pair's CPU time over the run's seconds ("CPUs": how much
# CPU the scheduler gave the pair) and the rate per CPU-second (how much the pair moves
# per CPU, whatever it was given). With free placement on a host where other work runs,
# the two ends usually share one CPU and the pair gets about one CPU; pinned apart it takes
# two (session 18).
#
# Usage: bench/rstream-sched.sh [--runs N] [--count C] [--size S] [--modes "free apart one"]
#                               [--trace]
#   apart: server `taskset -c 0`, client `-c 1`; one: both on CPU 0; free: the scheduler's
#   placement. Runs are interleaved by mode. SOCKETS_BIN=DIR takes `softverbs` from DIR
#   (an A/B run against saved binaries), else this tree's release build (built here).
# Talks only to 127.0.0.1; every process is bounded by `timeout`. Needs perf, taskset,
# python3 (and, for --trace, permission to record sched tracepoints system-wide).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3
COUNT=20000
SIZE=65536
MODES="free apart"
TRACE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) RUNS="${2:?}"; shift ;;
        --count) COUNT="${2:?}"; shift ;;
        --size) SIZE="${2:?}"; shift ;;
        --modes) MODES="${2:?}"; shift ;;
        --trace) TRACE=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "rstream-sched.sh: unexpected argument $1 (try --help)" >&2; exit 1 ;;
    esac
    shift
done
NAME=rstream-sched.sh
source bench/rstream-pair.sh

# The pair's run: server in the background, the client's result line in $DIR/line.
pair() {
    local mode=$1 p
    p=$(port)
    placement "$mode"
    local ev=task-clock,context-switches,cpu-migrations
    timeout 120 "${TS[@]}" perf stat -x, -e "$ev" -o "$DIR/server" \
        "$SV" rstream -b 127.0.0.1 -p "$p" -S "$SIZE" -C "$COUNT" -T b > /dev/null &
    local srv=$!
    sleep 0.3
    timeout 120 "${TC[@]}" perf stat -x, -e "$ev" -o "$DIR/client" \
        "$SV" rstream -s 127.0.0.1 -p "$p" -S "$SIZE" -C "$COUNT" -T b | tail -1 > "$DIR/line"
    wait "$srv"
}

run() {
    local mode=$1
    if [ "$TRACE" = 1 ]; then
        # The pair runs under a system-wide record of the scheduler's tracepoints.
        export -f pair port placement
        export DIR SV SIZE COUNT NAME
        timeout 180 perf record -q -a -o "$DIR/sched.data" \
            -e sched:sched_switch,sched:sched_wakeup,sched:sched_wakeup_new,sched:sched_migrate_task \
            -- bash -c "pair $mode" > /dev/null 2>&1
    else
        pair "$mode"
    fi
    python3 - "$DIR" "$mode" << 'PY'
import sys
from perfstat import stat
d, mode = sys.argv[1], sys.argv[2]
s, c = stat(f"{d}/server"), stat(f"{d}/client")
line = open(f"{d}/line").read().split()
gbps, secs = float(line[6]), float(line[5].rstrip("s"))
cpu_s = (s["task-clock"] + c["task-clock"]) / 1e3
load = open("/proc/loadavg").read().split()[0]
# (task-clock covers each process's whole life, its set-up too: "CPUs" errs high.)
print(f"{mode:5} {gbps:6.2f} Gb/s  load {load}  pair CPU {cpu_s * 1e3:.0f} ms over {secs:.2f} s "
      f"= {cpu_s / secs:.2f} CPUs, {gbps * secs / cpu_s:.1f} Gb per CPU-s; context switches "
      f"{s['context-switches']:.0f}/{c['context-switches']:.0f}, migrations "
      f"{s['cpu-migrations']:.0f}/{c['cpu-migrations']:.0f} (server/client)")
PY
    if [ "$TRACE" = 1 ]; then
        perf script -F comm,tid,pid,cpu,time,event,trace -i "$DIR/sched.data" 2> /dev/null \
            | python3 "$PWD/bench/sched-summary.py" --comm softverbs
    fi
}

for _ in $(seq 1 "$RUNS"); do
    for mode in $MODES; do
        run "$mode"
    done
done
