#!/usr/bin/env bash
# softverbs against the kernel's own loopback paths, in one run:
#
#   RDMA WRITE bandwidth (softverbs perf, 64 KiB)  vs  iperf3, one TCP stream
#   SEND latency (softverbs perf, 8 bytes, RTT/2)  vs  sockperf UDP ping-pong, 24 bytes
#   memory of a long WRITE bandwidth run (client and server processes)
#   memory of one context holding 1024 connected RC QPs (examples/many_qps)
#
# Targets: WRITE bandwidth >= 1.5 x iperf3; SEND latency <= 1.0 x sockperf;
# <= 64 MiB resident beyond the registered buffers, flat over the run;
# <= 64 MiB per context for 1024 QPs.
#
# Usage: bench/compare.sh [--quick] [--reps N] [--out DIR] [--strict]
#   --quick    the memory run lasts 10 s instead of 60 s (everything else is the same)
#   --reps N   repetitions of each throughput / latency measurement (default 3; the
#              table shows the median, the runs are listed above it)
#   --out DIR  keep every raw output (JSON, logs, memory samples) in DIR
#   --strict   exit with status 2 when a target is missed (default: 0, the table says)
#
# Needs iperf3, sockperf, python3 and cargo; installs nothing. Loopback only.
set -euo pipefail

QUICK=0
REPS=3
OUT=""
STRICT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --out)
            OUT="${2:?--out needs a directory}"
            shift
            ;;
        --strict) STRICT=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "compare.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
case "$REPS" in
    '' | *[!0-9]* | 0)
        echo "compare.sh: --reps needs a positive number" >&2
        exit 1
        ;;
esac

cd "$(dirname "$0")/.."
ROOT=$(pwd)

# Durations (seconds).
IPERF_SECS=10
SOCKPERF_SECS=10
if [ "$QUICK" = 1 ]; then MEM_SECS=10; else MEM_SECS=60; fi
# The RSS compared with the end of the memory run for flatness.
if [ "$MEM_SECS" -ge 30 ]; then MEM_EARLY=10; else MEM_EARLY=$((MEM_SECS / 2)); fi
SIZE=65536
LAT_SIZE=8
SOCKPERF_MSG=24 # UDP payload of an 8-byte RoCE SEND: 12 BTH + 8 data + 4 ICRC
QPS_N=1024

PY=/usr/bin/python3

# ---------------------------------------------------------------- tools
missing=()
for t in iperf3 sockperf cargo; do
    command -v "$t" > /dev/null 2>&1 || missing+=("$t")
done
[ -x "$PY" ] || missing+=("python3 (/usr/bin/python3)")
if [ ${#missing[@]} -gt 0 ]; then
    {
        echo "compare.sh: missing: ${missing[*]}"
        echo "  On Debian/Ubuntu:  sudo apt-get install -y iperf3 sockperf python3"
        echo "  (cargo comes with Rust: https://rustup.rs)"
        echo "This script installs nothing itself."
    } >&2
    exit 1
fi

# ---------------------------------------------------------------- cleanup
PIDS=()
if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    TMP=$(cd "$OUT" && pwd)
    KEEP=1
else
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-bench.XXXXXX")
    KEEP=0
fi
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        # Our own background jobs (and the perf client's server child) only.
        if kill -0 "$p" 2> /dev/null; then
            pkill -TERM -P "$p" 2> /dev/null || true
            kill -TERM "$p" 2> /dev/null || true
        fi
    done
    wait 2> /dev/null || true
    if [ "$KEEP" = 0 ]; then rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s\n' "$*"; }
section() { printf '\n== %s\n' "$*"; }

# A port nobody uses right now (tcp or udp).
free_port() {
    "$PY" -c '
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "$1"
}

# Waits until something listens on TCP port $1 (or is bound to UDP port $1
# with $2 = udp), without connecting to it (iperf3 -1 serves one client only).
wait_bound() {
    local port=$1 proto=${2:-tcp} i
    for i in $(seq 1 100); do
        if "$PY" - "$port" "$proto" << 'EOF'; then return 0; fi
import sys
port, proto = int(sys.argv[1]), sys.argv[2]
want_state = "0A" if proto == "tcp" else "07"   # LISTEN / UDP "close" (bound)
for f in (f"/proc/net/{proto}", f"/proc/net/{proto}6"):
    try:
        rows = open(f).read().splitlines()[1:]
    except OSError:
        continue
    for r in rows:
        cols = r.split()
        if int(cols[1].split(":")[1], 16) == port and cols[3] == want_state:
            sys.exit(0)
sys.exit(1)
EOF
        sleep 0.05
    done
    echo "compare.sh: nothing bound to $proto port $port after 5 s" >&2
    return 1
}

# Median of the numbers given as arguments.
median() { "$PY" -c 'import statistics, sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# A field of a JSON file: json_get FILE 'python expression on d'
json_get() { "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

fmt() { "$PY" -c 'import sys; print(format(float(sys.argv[1]), sys.argv[2]))' "$1" "$2"; }

# ---------------------------------------------------------------- machine
section "machine"
log "kernel $(uname -r), $(nproc) CPU(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
log "$(iperf3 --version | head -1); sockperf $(sockperf --version 2>&1 | head -1 | sed 's/^sockperf, version //')"
log "each throughput / latency figure is the median of $REPS runs (other work may share the CPUs)"

# ---------------------------------------------------------------- build
section "build (release, default target directory)"
unset CARGO_TARGET_DIR
cargo build --release -p softverbs-cli -p softverbs --examples --bins
SV="$ROOT/target/release/softverbs"
MANY="$ROOT/target/release/examples/many_qps"
for f in "$SV" "$MANY"; do
    [ -x "$f" ] || {
        echo "compare.sh: $f was not built" >&2
        exit 1
    }
done

# ---------------------------------------------------------------- iperf3
section "iperf3: TCP, one stream, ${IPERF_SECS} s, 127.0.0.1 (receiver's rate)"
iperf_runs=()
for r in $(seq 1 "$REPS"); do
    port=$(free_port tcp)
    iperf3 -s -1 -B 127.0.0.1 -p "$port" > "$TMP/iperf3-server-$r.log" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" tcp
    iperf3 -c 127.0.0.1 -p "$port" -t "$IPERF_SECS" --json > "$TMP/iperf3-$r.json"
    wait "$srv" || true
    gbs=$(json_get "$TMP/iperf3-$r.json" 'd["end"]["sum_received"]["bits_per_second"] / 8e9')
    iperf_runs+=("$gbs")
    log "  run $r: $(fmt "$gbs" .3f) GB/s"
done
IPERF_GBS=$(median "${iperf_runs[@]}")

# ---------------------------------------------------------------- sockperf
section "sockperf: UDP ping-pong, ${SOCKPERF_MSG}-byte messages, ${SOCKPERF_SECS} s, 127.0.0.1"
port=$(free_port udp)
sockperf server -i 127.0.0.1 -p "$port" > "$TMP/sockperf-server.log" 2>&1 &
SP_SRV=$!
PIDS+=("$SP_SRV")
wait_bound "$port" udp
sp_avg=()
sp_p50=()
for r in $(seq 1 "$REPS"); do
    sockperf ping-pong -i 127.0.0.1 -p "$port" -t "$SOCKPERF_SECS" -m "$SOCKPERF_MSG" 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' > "$TMP/sockperf-$r.log"
    # avg-latency, the median, and a check that they are half round trips: in
    # ping-pong one message is outstanding at a time, so the valid run time over
    # the messages received is the mean round trip.
    read -r avg p50 rtt < <("$PY" - "$TMP/sockperf-$r.log" << 'EOF'
import re, sys
t = open(sys.argv[1]).read()
avg = float(re.search(r"avg-latency=([0-9.]+)", t).group(1))
p50 = float(re.search(r"percentile 50\.000 =\s*([0-9.]+)", t).group(1))
m = re.search(r"\[Valid Duration\] RunTime=([0-9.]+) sec;.*ReceivedMessages=([0-9]+)", t)
print(avg, p50, float(m.group(1)) / int(m.group(2)) * 1e6)
EOF
    )
    sp_avg+=("$avg")
    sp_p50+=("$p50")
    log "  run $r: avg-latency $avg us, median $p50 us; run time / round trips = $(fmt "$rtt" .3f) us per round trip"
    ratio=$("$PY" -c "print($rtt / $avg)")
    if "$PY" -c "import sys; sys.exit(0 if 1.6 < $ratio < 2.4 else 1)"; then
        log "         = $(fmt "$ratio" .2f) x avg-latency: sockperf's latency is half the round trip (RTT/2)"
    else
        log "         = $(fmt "$ratio" .2f) x avg-latency: NOT the expected RTT/2 relation, check sockperf's output"
    fi
done
SP_AVG=$(median "${sp_avg[@]}")
SP_P50=$(median "${sp_p50[@]}")
# Information: the same with both ends on one CPU. On a VM, waking a thread on
# another, idle vCPU can cost more than the whole loopback round trip.
SP_ONE=""
if command -v taskset > /dev/null 2>&1; then
    taskset -p -c 0 "$SP_SRV" > /dev/null
    taskset -c 0 sockperf ping-pong -i 127.0.0.1 -p "$port" -t 5 -m "$SOCKPERF_MSG" 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' > "$TMP/sockperf-one-cpu.log"
    taskset -p -c "0-$(($(nproc) - 1))" "$SP_SRV" > /dev/null
    SP_ONE=$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' "$TMP/sockperf-one-cpu.log")
    log "  both ends on CPU 0 (taskset), one 5 s run: avg-latency $SP_ONE us"
fi
log "  (sockperf ping-pong reports latency = RTT/2 by default; --full-rtt would print the round trip)"
kill "$SP_SRV" 2> /dev/null || true
wait "$SP_SRV" 2> /dev/null || true

# ---------------------------------------------------------------- softverbs bandwidth
section "softverbs perf write --bw --size $SIZE --json (both ends local)"
sv_bw=()
sv_bw_peak=()
for r in $(seq 1 "$REPS"); do
    "$SV" perf write --bw --size "$SIZE" --json > "$TMP/sv-write-bw-$r.json"
    # perftest's MB/sec is 2^20 bytes per second; GB/s here is 10^9.
    gbs=$(json_get "$TMP/sv-write-bw-$r.json" 'd["bw"][0]["bw_avg_mb_per_sec"] * 2**20 / 1e9')
    peak=$(json_get "$TMP/sv-write-bw-$r.json" 'd["bw"][0]["bw_peak_mb_per_sec"] * 2**20 / 1e9')
    secs=$(json_get "$TMP/sv-write-bw-$r.json" 'd["bw"][0]["seconds"]')
    iters=$(json_get "$TMP/sv-write-bw-$r.json" 'd["bw"][0]["iterations"]')
    retx=$(json_get "$TMP/sv-write-bw-$r.json" 'd["client_counters"]["retransmitted_packets"]')
    sv_bw+=("$gbs")
    sv_bw_peak+=("$peak")
    log "  run $r: average $(fmt "$gbs" .3f) GB/s, peak $(fmt "$peak" .3f) GB/s ($iters x $SIZE B in $(fmt "$secs" .3f) s, $retx retransmitted)"
done
SV_BW=$(median "${sv_bw[@]}")
SV_BW_PEAK=$(median "${sv_bw_peak[@]}")

# ---------------------------------------------------------------- softverbs latency
section "softverbs perf send --lat --size $LAT_SIZE --json (both ends local)"
sv_avg=()
sv_typ=()
for r in $(seq 1 "$REPS"); do
    "$SV" perf send --lat --size "$LAT_SIZE" --json > "$TMP/sv-send-lat-$r.json"
    is=$(json_get "$TMP/sv-send-lat-$r.json" 'd["units"]["latency_is"]')
    if [ "$is" != "half round trip" ]; then
        echo "compare.sh: softverbs reports send latency as \"$is\", expected \"half round trip\"" >&2
        exit 1
    fi
    avg=$(json_get "$TMP/sv-send-lat-$r.json" 'd["lat"][0]["t_avg_usec"]')
    typ=$(json_get "$TMP/sv-send-lat-$r.json" 'd["lat"][0]["t_typical_usec"]')
    p99=$(json_get "$TMP/sv-send-lat-$r.json" 'd["lat"][0]["p99_usec"]')
    iters=$(json_get "$TMP/sv-send-lat-$r.json" 'd["lat"][0]["iterations"]')
    sv_avg+=("$avg")
    sv_typ+=("$typ")
    log "  run $r: t_avg $(fmt "$avg" .2f) us, t_typical $(fmt "$typ" .2f) us, 99% $(fmt "$p99" .2f) us ($iters iterations)"
done
log "  (softverbs perf reports send latency as half the round trip, like ib_send_lat: units.latency_is = \"half round trip\")"
SV_AVG=$(median "${sv_avg[@]}")
SV_TYP=$(median "${sv_typ[@]}")

# ---------------------------------------------------------------- memory of a long run
section "memory: softverbs perf write --bw --size $SIZE --duration $MEM_SECS (VmRSS / VmHWM of client and server every second)"
if [ "$QUICK" = 1 ]; then
    log "  --quick: a ${MEM_SECS} s run instead of 60 s; flatness compares ${MEM_EARLY} s with the end"
fi
"$SV" perf write --bw --size "$SIZE" --duration "$MEM_SECS" --json > "$TMP/sv-mem.json" &
CLI=$!
PIDS+=("$CLI")
status_kib() { # pid field: the field of /proc/pid/status in KiB, 0 if gone
    local v
    v=$(awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2> /dev/null) || v=0
    echo "${v:-0}"
}
find_child() {
    local c
    c=$(pgrep -P "$1" 2> /dev/null | head -1 || true)
    if [ -z "$c" ]; then c=$(cat /proc/"$1"/task/*/children 2> /dev/null | tr ' ' '\n' | grep -m1 . || true); fi
    printf '%s' "$c"
}
SRV=""
T0=$(date +%s.%N)
echo "t_s client_rss_kib client_hwm_kib server_rss_kib server_hwm_kib" > "$TMP/mem.txt"
next=1
while kill -0 "$CLI" 2> /dev/null; do
    if [ -z "$SRV" ]; then SRV=$(find_child "$CLI"); fi
    now=$(date +%s.%N)
    t=$("$PY" -c "print(round($now - $T0, 2))")
    if [ -n "$SRV" ]; then
        srss=$(status_kib "$SRV" VmRSS)
        shwm=$(status_kib "$SRV" VmHWM)
    else
        srss=0 shwm=0
    fi
    crss=$(status_kib "$CLI" VmRSS)
    chwm=$(status_kib "$CLI" VmHWM)
    # A process that just exited reads as 0: keep only complete samples.
    if [ "$crss" != 0 ] && [ "$srss" != 0 ]; then
        echo "$t $crss $chwm $srss $shwm" >> "$TMP/mem.txt"
    fi
    # Sample on whole seconds since the start.
    sleep "$("$PY" -c "import time; print(max(0.0, $T0 + $next - time.time()))")"
    next=$((next + 1))
done
wait "$CLI"
MEM_GBS=$(json_get "$TMP/sv-mem.json" 'd["bw"][0]["bw_avg_mb_per_sec"] * 2**20 / 1e9')
MEM_RETX=$(json_get "$TMP/sv-mem.json" 'd["client_counters"]["retransmitted_packets"]')
# What each process registers: one page-aligned buffer per QP of two regions of
# the message size rounded up to pages (see crates/cli/src/perf/mod.rs).
QPS=$(json_get "$TMP/sv-mem.json" 'd["qps"]')
REG_KIB=$((QPS * 2 * ((SIZE + 4095) / 4096) * 4))
read -r MEM_C_PEAK MEM_S_PEAK MEM_C_DRIFT MEM_S_DRIFT MEM_N MEM_T_EARLY MEM_T_LATE MEM_SUMMARY < <(
    "$PY" - "$TMP/mem.txt" "$MEM_EARLY" "$REG_KIB" << 'EOF'
import sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]).read().splitlines()[1:]]
early_t, reg = float(sys.argv[2]), float(sys.argv[3])
if len(rows) < 3:
    sys.exit("too few memory samples")
# Peak resident beyond the registered buffers, MiB: VmHWM is the kernel's
# high-water mark, the best of the sampled VmRSS cannot be above it.
c_peak = (max(r[2] for r in rows) - reg) / 1024
s_peak = (max(r[4] for r in rows) - reg) / 1024
early = min(rows, key=lambda r: abs(r[0] - early_t))
late = rows[-1]
drift = lambda i: 100.0 * (late[i] - early[i]) / early[i]
summary = "client:{:.1f}->{:.1f}MiB,server:{:.1f}->{:.1f}MiB".format(
    early[1] / 1024, late[1] / 1024, early[3] / 1024, late[3] / 1024)
print(c_peak, s_peak, drift(1), drift(3), len(rows), early[0], late[0], summary)
EOF
)
log "  $MEM_N samples; average bandwidth over the run $(fmt "$MEM_GBS" .3f) GB/s, $MEM_RETX retransmitted"
log "  registered per process: $QPS QP x 2 x $SIZE B = $REG_KIB KiB (subtracted below)"
awk 'NR == 1 || (NR - 2) % 5 == 0 { printf "    %s\n", $0 }' "$TMP/mem.txt"
log "    (every 5th sample shown; RSS $MEM_SUMMARY between ${MEM_T_EARLY} s and ${MEM_T_LATE} s)"
log "  peak beyond buffers: client $(fmt "$MEM_C_PEAK" .1f) MiB, server $(fmt "$MEM_S_PEAK" .1f) MiB (VmHWM)"
log "  RSS change ${MEM_T_EARLY} s -> ${MEM_T_LATE} s: client $(fmt "$MEM_C_DRIFT" +.2f) %, server $(fmt "$MEM_S_DRIFT" +.2f) %"

# ---------------------------------------------------------------- many QPs
section "memory: one context with $QPS_N connected RC QPs (examples/many_qps $QPS_N)"
"$MANY" "$QPS_N" > "$TMP/many_qps.txt"
sed 's/^/  /' "$TMP/many_qps.txt"
kv() { awk -F= -v k="$1" '$1 == k { print $2 }' "$TMP/many_qps.txt"; }
PER_CTX_KIB=$(kv "per_context_for_${QPS_N}_qps_kib")
PER_QP_B=$(kv per_qp_bytes)
# With the context itself (two contexts live in the example's process).
WITH_OPEN_KIB=$(($(kv rss_with_qps_kib) - $(kv rss_before_open_kib)))
PER_CTX_MIB=$("$PY" -c "print($PER_CTX_KIB / 1024)")
PER_CTX_OPEN_MIB=$("$PY" -c "print($WITH_OPEN_KIB / 2 / 1024)")

# ---------------------------------------------------------------- table
section "results"
misses=0
row() { # metric softverbs reference ratio target result
    printf '%-44s %12s %14s %9s %-18s %s\n' "$@"
}
check() { # value op limit: sets V to PASS or MISS (and counts misses)
    if "$PY" -c "import sys; sys.exit(0 if $1 $2 $3 else 1)"; then
        V=PASS
    else
        V=MISS
        misses=$((misses + 1))
    fi
}
row "metric" "softverbs" "reference" "ratio" "target" "result"
row "--------------------------------------------" "------------" "--------------" "---------" "------------------" "------"
r=$("$PY" -c "print($SV_BW / $IPERF_GBS)")
check "$r" '>=' 1.5
row "WRITE bw 64 KiB, GB/s (perf default 5000 it)" "$(fmt "$SV_BW" .3f)" "$(fmt "$IPERF_GBS" .3f) iperf3" "$(fmt "$r" .2f)x" ">= 1.5x iperf3" "$V"
r2=$("$PY" -c "print($MEM_GBS / $IPERF_GBS)")
row "  same, ${MEM_SECS} s run (memory test), GB/s" "$(fmt "$MEM_GBS" .3f)" "$(fmt "$IPERF_GBS" .3f) iperf3" "$(fmt "$r2" .2f)x" "(information)" "-"
r=$("$PY" -c "print($SV_AVG / $SP_AVG)")
check "$r" '<=' 1.0
row "SEND lat 8 B, t_avg us (RTT/2)" "$(fmt "$SV_AVG" .2f)" "$(fmt "$SP_AVG" .2f) sockperf" "$(fmt "$r" .2f)x" "<= 1.0x sockperf" "$V"
r=$("$PY" -c "print($SV_TYP / $SP_P50)")
check "$r" '<=' 1.0
row "SEND lat 8 B, t_typical (median) us" "$(fmt "$SV_TYP" .2f)" "$(fmt "$SP_P50" .2f) sockperf" "$(fmt "$r" .2f)x" "<= 1.0x sockperf" "$V"
if [ -n "$SP_ONE" ]; then
    r=$("$PY" -c "print($SV_AVG / $SP_ONE)")
    row "  t_avg vs sockperf on one CPU, us" "$(fmt "$SV_AVG" .2f)" "$(fmt "$SP_ONE" .2f) sockperf" "$(fmt "$r" .2f)x" "(information)" "-"
fi
check "$MEM_C_PEAK" '<=' 64
row "peak RSS beyond buffers, client, MiB" "$(fmt "$MEM_C_PEAK" .1f)" "-" "-" "<= 64 MiB" "$V"
check "$MEM_S_PEAK" '<=' 64
row "peak RSS beyond buffers, server, MiB" "$(fmt "$MEM_S_PEAK" .1f)" "-" "-" "<= 64 MiB" "$V"
worst=$("$PY" -c "print(max(abs($MEM_C_DRIFT), abs($MEM_S_DRIFT)))")
check "$worst" '<' 5
row "RSS change $(fmt "$MEM_T_EARLY" .0f) s -> $(fmt "$MEM_T_LATE" .0f) s, worst process, %" "$(fmt "$worst" .2f)" "-" "-" "< 5 % (flat)" "$V"
check "$PER_CTX_MIB" '<=' 64
row "$QPS_N RC QPs, one context, MiB" "$(fmt "$PER_CTX_MIB" .1f)" "-" "-" "<= 64 MiB" "$V"
row "  with the context itself, MiB" "$(fmt "$PER_CTX_OPEN_MIB" .1f)" "-" "-" "(information)" "-"
echo
log "medians of $REPS runs; GB/s = 10^9 bytes/s (softverbs perf prints MB/sec = 2^20 bytes/s)."
log "latencies are one-way (half the round trip) on both sides; sockperf messages are ${SOCKPERF_MSG} bytes,"
log "the UDP payload of an 8-byte RoCE SEND (12 BTH + 8 + 4 ICRC)."
log "per QP: $PER_QP_B bytes ($QPS_N QPs, 128 send WRs / 512 receive WRs each)."
if [ "$QUICK" = 1 ]; then
    log "--quick: the memory run lasted ${MEM_SECS} s, not 60 s; run without --quick for the real flatness check."
fi
if [ "$KEEP" = 1 ]; then log "raw outputs in $TMP"; fi
if [ "$misses" -gt 0 ]; then
    log "$misses target(s) missed."
    if [ "$STRICT" = 1 ]; then exit 2; fi
else
    log "all targets met."
fi
