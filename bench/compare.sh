#!/usr/bin/env bash
# softverbs against the kernel's own paths on this host (issue 16's benchmark), in one run,
# anchors and softverbs interleaved in every repetition:
#
#   anchors                                         softverbs (both ends local, 127.0.0.1)
#   memcpy, process_vm_writev/readv of 64 KiB       softverbs perf write / read --bw 64 KiB
#     (bench-tools copy-limits, two processes)        (run as long as iperf3; CPU both ends)
#   iperf3, one TCP stream (CPU both ends)          perftest on the drop-in: ib_write_bw,
#   raw UDP with GSO: 15 x 4 KiB segments per send,   ib_read_bw -s 65536 -n 5000 (against
#     GRO on receive, windowed (bench-tools udp-gso)  perf with --iters 5000: the same count;
#                                                     ib_read_bw's own default is 1000),
#                                                     5 pairs per repetition
#   sockperf UDP ping-pong, 24-byte messages,       softverbs perf send / write --lat 8 B
#     both sides busy-polling (--nonblocked) and    ib_send_lat, ib_write_lat -s 8 on the
#     blocking (default)                              drop-in
#   (everything above on the UDP path: SOFTVERBS_SAME_HOST=0)
#                                                   softverbs perf write / read --bw 64 KiB
#                                                     by the same-host path (auto): against
#                                                     process_vm_writev/readv and UDP
#   then, once: memory of a long WRITE bandwidth run (client and server) and of one context
#   holding 1024 connected RC QPs (examples/many_qps)
#
# Targets (issue 16): WRITE bw >= 1.5 x iperf3 and >= 0.8 x raw UDP GSO; READ bw >= 1.2 x
# iperf3; perftest on the drop-in >= 0.95 x softverbs perf (bandwidth; latency <= 1.05 x);
# SEND, WRITE, ib_send_lat, ib_write_lat one-way <= 1.2 x sockperf busy-polling; CPU
# seconds per GB, both ends, <= 0.5 x iperf3's; same host "at the process_vm_writev limit"
# (read here as >= 0.9 x process_vm_writev / readv: issue 16 gives no number). Memory:
# <= 64 MiB resident beyond the registered buffers, flat over the run; <= 64 MiB per
# context for 1024 QPs. Latency ratios compare medians (perftest's t_typical, sockperf's
# 50th percentile), robust to a busy-polling process losing its CPU on a loaded machine;
# averages are shown beside them.
#
# Usage: bench/compare.sh [--quick] [--reps N] [--out DIR] [--strict]
#   --quick    3 s instead of 10 s per timed anchor and softverbs bandwidth run, 1 s
#              instead of 2 s per copy, and a 10 s memory run instead of 60 s
#   --reps N   repetitions of everything but the memory runs (default 3; the table shows
#              the medians, each run is listed above it)
#   --out DIR  keep every raw output (JSON, logs, memory samples, results.txt) in DIR
#   --strict   exit with status 2 when a target is missed (default: 0, the table says)
#
# Needs iperf3, sockperf, perftest, python3 and cargo; installs nothing. Loopback only.
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
if [ "$QUICK" = 1 ]; then
    SECS=3 COPY_SECS=1 MEM_SECS=10
else
    SECS=10 COPY_SECS=2 MEM_SECS=60
fi
# The RSS compared with the end of the memory run for flatness.
if [ "$MEM_SECS" -ge 30 ]; then MEM_EARLY=10; else MEM_EARLY=$((MEM_SECS / 2)); fi
SIZE=65536
# Messages per perftest-against-perf bandwidth run, both tools (ib_write_bw's default and
# perf's; ib_read_bw's own is 1000, a run a fifth as long), and pairs of such runs per
# repetition.
BW_ITERS=5000
BW_PAIRS=5
LAT_SIZE=8
SOCKPERF_MSG=24 # UDP payload of an 8-byte RoCE SEND: 12 BTH + 8 data + 4 ICRC
QPS_N=1024
# Bound on any one client run; a run past it fails the script rather than hanging it.
BOUND=180

PY=/usr/bin/python3

# ---------------------------------------------------------------- tools
missing=()
for t in iperf3 sockperf ib_write_bw ib_read_bw ib_send_lat ib_write_lat timeout cargo; do
    command -v "$t" > /dev/null 2>&1 || missing+=("$t")
done
[ -x "$PY" ] || missing+=("python3 (/usr/bin/python3)")
if [ ${#missing[@]} -gt 0 ]; then
    {
        echo "compare.sh: missing: ${missing[*]}"
        echo "  On Debian/Ubuntu:  sudo apt-get install -y iperf3 sockperf perftest python3"
        echo "  (cargo comes with Rust: https://rustup.rs)"
        echo "This script installs nothing itself."
    } >&2
    exit 1
fi

# Every run measures the UDP path unless it asks for the same-host one (sv_bw_same_host).
export SOFTVERBS_SAME_HOST=0

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
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        # Our own background jobs (and their children: the perf client's server, the
        # CPU-measuring wrapper's command) only.
        if kill -0 "$p" 2> /dev/null; then
            pkill -TERM -P "$p" 2> /dev/null || true
            kill -TERM "$p" 2> /dev/null || true
        fi
    done
    wait 2> /dev/null || true
    if [ "$KEEP" = 0 ]; then rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
    local port=$1 proto=${2:-tcp} _
    for _ in $(seq 1 200); do
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
    echo "compare.sh: nothing bound to $proto port $port after 10 s" >&2
    return 1
}

# A field of a JSON file: json_get FILE 'python expression on d'
json_get() { "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

# A key=value line of a file.
kv_get() { awk -F= -v k="$2" '$1 == k { print $2 }' "$1"; }

fmt() { "$PY" -c 'import sys; print(format(float(sys.argv[1]), sys.argv[2]))' "$1" "$2"; }

# Runs a command and writes the CPU seconds (user + system) it and every descendant it
# waited for used to FILE: cpu_run FILE CMD...
cpu_run() {
    "$PY" -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%.6f\n" % (r.ru_utime + r.ru_stime))
sys.exit(rc)' "$@"
}

# Every figure, one "rep key value" line each; the table is made from this file.
RESULTS="$TMP/results.txt"
: > "$RESULTS"
put() { echo "$REP $1 $2" >> "$RESULTS"; }

# ---------------------------------------------------------------- machine
section "machine"
log "kernel $(uname -r), $(nproc) CPU(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
log "$(iperf3 --version | head -1); sockperf $(sockperf --version 2>&1 | head -1 | sed 's/^sockperf, version //')"
log "$REPS repetition(s), anchors and softverbs interleaved in each; the table shows medians (other work may share the CPUs)"

# ---------------------------------------------------------------- build
section "build (release, default target directory)"
unset CARGO_TARGET_DIR
cargo build --release --workspace
cargo build --release -p softverbs --examples
SV="$ROOT/target/release/softverbs"
MANY="$ROOT/target/release/examples/many_qps"
COPY="$ROOT/target/release/copy-limits"
GSO="$ROOT/target/release/udp-gso"
for f in "$SV" "$MANY" "$COPY" "$GSO" "$ROOT/target/release/libsoftverbs_ibverbs.so"; do
    [ -e "$f" ] || {
        echo "compare.sh: $f was not built" >&2
        exit 1
    }
done

# ---------------------------------------------------------------- one measurement each
copy_limits() {
    local f="$TMP/copy-limits-$REP.txt"
    timeout "$BOUND" "$COPY" --size "$SIZE" --secs "$COPY_SECS" > "$f"
    [ "$(kv_get "$f" check)" = ok ] || {
        echo "compare.sh: copy-limits did not verify its copies" >&2
        exit 1
    }
    put memcpy_gbs "$(kv_get "$f" memcpy_gbs)"
    put pvw_gbs "$(kv_get "$f" process_vm_writev_gbs)"
    put pvr_gbs "$(kv_get "$f" process_vm_readv_gbs)"
    log "  copies of $SIZE B: memcpy $(kv_get "$f" memcpy_gbs) GB/s, process_vm_writev $(kv_get "$f" process_vm_writev_gbs) GB/s, process_vm_readv $(kv_get "$f" process_vm_readv_gbs) GB/s (verified)"
}

iperf() {
    local port srv j="$TMP/iperf3-$REP.json"
    port=$(free_port tcp)
    cpu_run "$TMP/iperf3-server-$REP.cpu" iperf3 -s -1 -B 127.0.0.1 -p "$port" > "$TMP/iperf3-server-$REP.log" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" tcp
    cpu_run "$TMP/iperf3-client-$REP.cpu" timeout "$BOUND" iperf3 -c 127.0.0.1 -p "$port" -t "$SECS" --json > "$j"
    wait "$srv" || true
    local gbs bytes cpu
    gbs=$(json_get "$j" 'd["end"]["sum_received"]["bits_per_second"] / 8e9')
    bytes=$(json_get "$j" 'd["end"]["sum_received"]["bytes"]')
    cpu=$("$PY" -c "print($(cat "$TMP/iperf3-server-$REP.cpu") + $(cat "$TMP/iperf3-client-$REP.cpu"))")
    put iperf_gbs "$gbs"
    put iperf_cpu_per_gb "$("$PY" -c "print($cpu / ($bytes / 1e9))")"
    log "  iperf3 TCP, one stream, ${SECS} s: $(fmt "$gbs" .3f) GB/s (receiver), $(fmt "$cpu" .2f) CPU s both ends for $(fmt "$("$PY" -c "print($bytes / 1e9)")" .2f) GB"
}

udp_gso() {
    local f="$TMP/udp-gso-$REP.txt"
    timeout "$BOUND" "$GSO" --secs "$SECS" > "$f"
    put udp_gso_gbs "$(kv_get "$f" udp_gso_gbs)"
    put udp_gso_cpu_per_gb "$(kv_get "$f" cpu_s_per_gb)"
    log "  raw UDP GSO, $(kv_get "$f" segments_per_batch) x $(kv_get "$f" segment) B per send, GRO segment $(kv_get "$f" gro_segment_size): $(kv_get "$f" udp_gso_gbs) GB/s, $(kv_get "$f" cpu_s_per_gb) CPU s/GB, $(kv_get "$f" lost_segments) lost, $(kv_get "$f" stalls) window stalls"
}

# softverbs perf bandwidth: sv_bw write|read KEY [perf args...]
sv_bw() {
    local op=$1 key=$2
    shift 2
    local j="$TMP/sv-$op-bw-$key-$REP.json"
    cpu_run "$j.cpu" timeout "$BOUND" "$SV" perf "$op" --bw --size "$SIZE" --json "$@" > "$j"
    local mbs gbs iters secs retx cpu
    mbs=$(json_get "$j" 'd["bw"][0]["bw_avg_mb_per_sec"]')
    # perftest's MB/sec is 2^20 bytes per second; GB/s here is 10^9.
    gbs=$("$PY" -c "print($mbs * 2**20 / 1e9)")
    iters=$(json_get "$j" 'd["bw"][0]["iterations"]')
    secs=$(json_get "$j" 'd["bw"][0]["seconds"]')
    retx=$(json_get "$j" 'd["client_counters"]["retransmitted_packets"]')
    cpu=$(cat "$j.cpu")
    put "${key}_gbs" "$gbs"
    put "${key}_mbs" "$mbs"
    put "${key}_cpu_per_gb" "$("$PY" -c "print($cpu / ($iters * $SIZE / 1e9))")"
    log "  softverbs perf $op --bw ${*:-(default iterations)}: $(fmt "$gbs" .3f) GB/s ($iters x $SIZE B in $(fmt "$secs" .2f) s, $retx retransmitted), $(fmt "$cpu" .2f) CPU s both ends"
}

# softverbs perf bandwidth by the same-host path: sv_bw_same_host write|read KEY [args...]
sv_bw_same_host() {
    local j="$TMP/sv-$1-bw-$2-$REP.json"
    SOFTVERBS_SAME_HOST=auto sv_bw "$@"
    local c='d["client_counters"]'
    log "    same-host path: $(json_get "$j" "$c.get('same_host_qps', 0)") QP(s), $(json_get "$j" "$c.get('same_host_bytes_written', 0) + $c.get('same_host_bytes_read', 0)") bytes moved by it, $(json_get "$j" "$c.get('same_host_fallbacks', 0)") WRs by UDP"
}

# softverbs perf latency: sv_lat send|write KEY
sv_lat() {
    local op=$1 key=$2 j="$TMP/sv-$1-lat-$REP.json"
    timeout "$BOUND" "$SV" perf "$op" --lat --size "$LAT_SIZE" --json > "$j"
    local is
    is=$(json_get "$j" 'd["units"]["latency_is"]')
    if [ "$is" != "half round trip" ]; then
        echo "compare.sh: softverbs reports $op latency as \"$is\", expected \"half round trip\"" >&2
        exit 1
    fi
    local avg typ
    avg=$(json_get "$j" 'd["lat"][0]["t_avg_usec"]')
    typ=$(json_get "$j" 'd["lat"][0]["t_typical_usec"]')
    put "${key}_avg" "$avg"
    put "${key}_typ" "$typ"
    log "  softverbs perf $op --lat $LAT_SIZE B: t_typical $(fmt "$typ" .2f) us, t_avg $(fmt "$avg" .2f) us (half round trip)"
}

# The first figure row under perftest's "#bytes" header, column $2 (1-based).
perftest_col() { awk -v c="$2" '/#bytes/ { getline; print $c; exit }' "$1"; }

# perftest on the drop-in, server and client on 127.0.0.1: perftest TOOL ARGS...;
# the client's output is $TMP/TOOL-REP.out.
perftest() {
    local tool=$1
    shift
    local port srv base="$TMP/$tool-$REP"
    port=$(free_port tcp)
    timeout "$BOUND" "$SV" run -- "$tool" -F -p "$port" "$@" > "$base.srv" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" tcp
    local ok=0
    timeout "$BOUND" "$SV" run -- "$tool" -F -p "$port" "$@" 127.0.0.1 > "$base.out" 2>&1 || ok=$?
    wait "$srv" || ok=$?
    if [ "$ok" != 0 ]; then
        echo "compare.sh: $tool $* failed:" >&2
        cat "$base.srv" "$base.out" >&2
        exit 1
    fi
}

perftest_bw() { # TOOL KEY
    perftest "$1" -s "$SIZE" -n "$BW_ITERS"
    local mbs
    mbs=$(perftest_col "$TMP/$1-$REP.out" 4)
    put "${2}_mbs" "$mbs"
    log "  $1 -s $SIZE -n $BW_ITERS (drop-in): $mbs MB/s (2^20)"
}

perftest_lat() { # TOOL KEY
    perftest "$1" -s "$LAT_SIZE"
    local typ avg
    typ=$(perftest_col "$TMP/$1-$REP.out" 5)
    avg=$(perftest_col "$TMP/$1-$REP.out" 6)
    put "${2}_typ" "$typ"
    put "${2}_avg" "$avg"
    log "  $1 -s $LAT_SIZE (drop-in): t_typical $typ us, t_avg $avg us"
}

# sockperf UDP ping-pong, both sides in MODE (busy: --nonblocked sockets, so both spin on
# recvfrom; blocking: sockperf's default blocking recvfrom): sockperf_pp MODE KEY
sockperf_pp() {
    local mode=$1 key=$2 flags=() port srv
    if [ "$mode" = busy ]; then flags=(--nonblocked); fi
    port=$(free_port udp)
    sockperf server -i 127.0.0.1 -p "$port" "${flags[@]}" > "$TMP/sockperf-server-$key-$REP.log" 2>&1 &
    srv=$!
    PIDS+=("$srv")
    wait_bound "$port" udp
    timeout "$BOUND" sockperf ping-pong -i 127.0.0.1 -p "$port" -t "$SECS" -m "$SOCKPERF_MSG" "${flags[@]}" 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' > "$TMP/sockperf-$key-$REP.log"
    kill "$srv" 2> /dev/null || true
    wait "$srv" 2> /dev/null || true
    # avg-latency, the median, and a check that they are half round trips: in
    # ping-pong one message is outstanding at a time, so the valid run time over
    # the messages received is the mean round trip.
    local avg p50 rtt
    read -r avg p50 rtt < <("$PY" - "$TMP/sockperf-$key-$REP.log" << 'EOF'
import re, sys
t = open(sys.argv[1]).read()
avg = float(re.search(r"avg-latency=([0-9.]+)", t).group(1))
p50 = float(re.search(r"percentile 50\.000 =\s*([0-9.]+)", t).group(1))
m = re.search(r"\[Valid Duration\] RunTime=([0-9.]+) sec;.*ReceivedMessages=([0-9]+)", t)
print(avg, p50, float(m.group(1)) / int(m.group(2)) * 1e6)
EOF
    )
    put "${key}_avg" "$avg"
    put "${key}_p50" "$p50"
    local ratio note
    ratio=$("$PY" -c "print($rtt / $avg)")
    if "$PY" -c "import sys; sys.exit(0 if 1.6 < $ratio < 2.4 else 1)"; then
        note="= $(fmt "$ratio" .2f) x avg: half round trips"
    else
        note="= $(fmt "$ratio" .2f) x avg: NOT the expected RTT/2 relation, check sockperf's output"
    fi
    log "  sockperf ping-pong $mode: median $p50 us, avg $avg us; run time / round trips $(fmt "$rtt" .2f) us $note"
}

# ---------------------------------------------------------------- interleaved runs
for REP in $(seq 1 "$REPS"); do
    section "repetition $REP of $REPS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    copy_limits
    iperf
    sv_bw write sv_write --duration "$SECS"
    udp_gso
    sv_bw read sv_read --duration "$SECS"
    sv_bw_same_host write sv_sh_write --duration "$SECS"
    sv_bw_same_host read sv_sh_read --duration "$SECS"
    # Short runs whose speed swings 2x from run to run (docs/udp-bandwidth.md, session
    # 11): several pairs per repetition, in turn first, the medians compared.
    for pair in $(seq 1 "$BW_PAIRS"); do
        if [ $((pair % 2)) = 1 ]; then
            perftest_bw ib_write_bw pt_write_bw
            sv_bw write sv_write_it --iters "$BW_ITERS"
            perftest_bw ib_read_bw pt_read_bw
            sv_bw read sv_read_it --iters "$BW_ITERS"
        else
            sv_bw write sv_write_it --iters "$BW_ITERS"
            perftest_bw ib_write_bw pt_write_bw
            sv_bw read sv_read_it --iters "$BW_ITERS"
            perftest_bw ib_read_bw pt_read_bw
        fi
    done
    sockperf_pp busy sp_busy
    sv_lat send sv_send_lat
    perftest_lat ib_send_lat pt_send_lat
    sockperf_pp blocking sp_block
    sv_lat write sv_write_lat
    perftest_lat ib_write_lat pt_write_lat
done
REP=0

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
put mem_gbs "$MEM_GBS"
put mem_client_peak_mib "$MEM_C_PEAK"
put mem_server_peak_mib "$MEM_S_PEAK"
put mem_worst_drift_pct "$("$PY" -c "print(max(abs($MEM_C_DRIFT), abs($MEM_S_DRIFT)))")"

# ---------------------------------------------------------------- many QPs
section "memory: one context with $QPS_N connected RC QPs (examples/many_qps $QPS_N)"
"$MANY" "$QPS_N" > "$TMP/many_qps.txt"
sed 's/^/  /' "$TMP/many_qps.txt"
PER_CTX_KIB=$(kv_get "$TMP/many_qps.txt" "per_context_for_${QPS_N}_qps_kib")
PER_QP_B=$(kv_get "$TMP/many_qps.txt" per_qp_bytes)
# With the context itself (two contexts live in the example's process).
WITH_OPEN_KIB=$(($(kv_get "$TMP/many_qps.txt" rss_with_qps_kib) - $(kv_get "$TMP/many_qps.txt" rss_before_open_kib)))
put qps_per_ctx_mib "$("$PY" -c "print($PER_CTX_KIB / 1024)")"
put qps_with_open_mib "$("$PY" -c "print($WITH_OPEN_KIB / 2 / 1024)")"

# ---------------------------------------------------------------- table
section "results (medians of $REPS repetitions)"
set +e
"$PY" - "$RESULTS" "$SECS" "$MEM_SECS" "$MEM_T_EARLY" "$MEM_T_LATE" "$QPS_N" << 'EOF'
import statistics, sys
from collections import defaultdict

path, secs, mem_secs, t_early, t_late, qps_n = sys.argv[1], *sys.argv[2:]
runs = defaultdict(list)
for line in open(path):
    rep, key, value = line.split()
    runs[key].append(float(value))
m = {k: statistics.median(v) for k, v in runs.items()}

misses = 0
row_fmt = "%-42s %16s %27s %8s %-26s %s"
def row(metric, mine, ref, ratio, target, result):
    print(row_fmt % (metric, mine, ref, ratio, target, result))

def check(value, op, limit):
    global misses
    ok = value >= limit if op == ">=" else value <= limit
    if not ok:
        misses += 1
    return "met" if ok else "MISSED"

def ratio_row(metric, a, b, ref_name, op, limit, unit_fmt="%.3f", target=None, extra_ratio=None):
    r = a / b
    shown_ratio = "%.2fx" % r
    if extra_ratio is not None:
        shown_ratio += " (%.2fx)" % extra_ratio
    if op is None:
        row(metric, unit_fmt % a, (unit_fmt % b) + " " + ref_name, shown_ratio, target or "(information)", "-")
    else:
        row(metric, unit_fmt % a, (unit_fmt % b) + " " + ref_name, shown_ratio,
            target or "%s %gx %s" % (op, limit, ref_name), check(r, op, limit))

def lat_row(metric, mine, ref, ref_name, limit):
    # median ratio decides; the average ratio is shown in parentheses
    a_typ, a_avg = m[mine + "_typ"], m[mine + "_avg"]
    b_typ = m[ref + ("_p50" if ref.startswith("sp_") else "_typ")]
    b_avg = m[ref + "_avg"]
    r, r_avg = a_typ / b_typ, a_avg / b_avg
    row(metric, "%.2f (%.2f)" % (a_typ, a_avg), "%.2f (%.2f) %s" % (b_typ, b_avg, ref_name),
        "%.2fx" % r, "<= %gx %s" % (limit, ref_name), check(r, "<=", limit) + "  (avg %.2fx)" % r_avg)

row("metric", "softverbs", "reference", "ratio", "target", "result")
row("-" * 42, "-" * 16, "-" * 27, "-" * 8, "-" * 26, "------")
print("bandwidth, GB/s (10^9 bytes/s), both ends on 127.0.0.1")
ratio_row("  WRITE 64 KiB, perf, %s s" % secs, m["sv_write_gbs"], m["iperf_gbs"], "iperf3", ">=", 1.5)
ratio_row("  WRITE 64 KiB, perf, %s s" % secs, m["sv_write_gbs"], m["udp_gso_gbs"], "UDP GSO", ">=", 0.8)
ratio_row("  READ 64 KiB, perf, %s s" % secs, m["sv_read_gbs"], m["iperf_gbs"], "iperf3", ">=", 1.2)
ratio_row("  ib_write_bw 64 KiB (drop-in), MB/s", m["pt_write_bw_mbs"], m["sv_write_it_mbs"], "perf", ">=", 0.95, "%.0f")
ratio_row("  ib_read_bw 64 KiB (drop-in), MB/s", m["pt_read_bw_mbs"], m["sv_read_it_mbs"], "perf", ">=", 0.95, "%.0f")
print("latency one-way (RTT/2), us: median (average)")
lat_row("  SEND 8 B, perf", "sv_send_lat", "sp_busy", "sockperf busy", 1.2)
lat_row("  WRITE 8 B, perf", "sv_write_lat", "sp_busy", "sockperf busy", 1.2)
lat_row("  ib_send_lat 8 B (drop-in)", "pt_send_lat", "sp_busy", "sockperf busy", 1.2)
lat_row("  ib_write_lat 8 B (drop-in)", "pt_write_lat", "sp_busy", "sockperf busy", 1.2)
lat_row("  ib_send_lat 8 B (drop-in)", "pt_send_lat", "sv_send_lat", "perf", 1.05)
lat_row("  ib_write_lat 8 B (drop-in)", "pt_write_lat", "sv_write_lat", "perf", 1.05)
ratio_row("  SEND 8 B, perf, median", m["sv_send_lat_typ"], m["sp_block_p50"], "sockperf blocking", None, 0, "%.2f")
print("CPU seconds per GB moved, both ends")
ratio_row("  WRITE 64 KiB, perf, %s s" % secs, m["sv_write_cpu_per_gb"], m["iperf_cpu_per_gb"], "iperf3", "<=", 0.5)
ratio_row("  raw UDP GSO (bench-tools udp-gso)", m["udp_gso_cpu_per_gb"], m["iperf_cpu_per_gb"], "iperf3", None, 0)
print("same host: one 64 KiB message between two processes, GB/s")
ratio_row("  WRITE 64 KiB, same-host path, %s s" % secs, m["sv_sh_write_gbs"], m["pvw_gbs"], "proc_vm_writev", ">=", 0.9,
          target=">= 0.9x (\"at the limit\")")
ratio_row("  READ 64 KiB, same-host path, %s s" % secs, m["sv_sh_read_gbs"], m["pvr_gbs"], "proc_vm_readv", ">=", 0.9,
          target=">= 0.9x (\"at the limit\")")
ratio_row("  WRITE 64 KiB, same-host path, %s s" % secs, m["sv_sh_write_gbs"], m["sv_write_gbs"], "UDP path", None, 0)
ratio_row("  READ 64 KiB, same-host path, %s s" % secs, m["sv_sh_read_gbs"], m["sv_read_gbs"], "UDP path", None, 0)
ratio_row("  WRITE 64 KiB, same-host path, %s s" % secs, m["sv_sh_write_gbs"], m["memcpy_gbs"], "memcpy", None, 0)
ratio_row("  WRITE 64 KiB, UDP path, %s s" % secs, m["sv_write_gbs"], m["pvw_gbs"], "proc_vm_writev", None, 0)
print("memory")
def mem_row(metric, value, limit, target):
    row(metric, "%.1f" % value, "-", "-", target, check(value, "<=", limit))
mem_row("  peak RSS beyond buffers, client, MiB", m["mem_client_peak_mib"], 64, "<= 64 MiB")
mem_row("  peak RSS beyond buffers, server, MiB", m["mem_server_peak_mib"], 64, "<= 64 MiB")
row("  RSS change %.0f s -> %.0f s, worst process, %%" % (float(t_early), float(t_late)),
    "%.2f" % m["mem_worst_drift_pct"], "-", "-", "< 5 % (flat)", check(m["mem_worst_drift_pct"], "<=", 5))
mem_row("  %s RC QPs, one context, MiB" % qps_n, m["qps_per_ctx_mib"], 64, "<= 64 MiB")
row("    with the context itself, MiB", "%.1f" % m["qps_with_open_mib"], "-", "-", "(information)", "-")
row("  WRITE 64 KiB, %s s memory run, GB/s" % mem_secs, "%.3f" % m["mem_gbs"], "-", "-", "(information)", "-")
print()
print("softverbs perf bandwidth runs last as long as iperf3 (%s s); the drop-in comparison runs 5000" % secs)
print("iterations on both tools (ib_read_bw's own default is 1000), several pairs per repetition, and")
print("compares the medians. perftest's MB/sec is 2^20 bytes/s. Latency ratios")
print("compare medians (t_typical, sockperf's 50th percentile); averages in parentheses. sockperf sends")
print("24-byte UDP messages, the UDP payload of an 8-byte RoCE SEND (12 BTH + 8 + 4 ICRC). CPU: user +")
print("system seconds of both processes (and their threads) over the bytes the receiver got.")
print("Heap allocations per packet: see cargo bench -p softverbs-engine --bench rdma_write.")
print()
print("%d target(s) missed." % misses if misses else "all targets met.")
sys.exit(2 if misses else 0)
EOF
verdict=$?
set -e
if [ "$QUICK" = 1 ]; then
    log "--quick: shorter runs, and the memory run lasted ${MEM_SECS} s, not 60 s; run without --quick for the real figures."
fi
log "per QP: $PER_QP_B bytes ($QPS_N QPs, 128 send WRs / 512 receive WRs each)."
if [ "$KEEP" = 1 ]; then log "raw outputs in $TMP"; fi
if [ "$verdict" != 0 ] && [ "$verdict" != 2 ]; then
    echo "compare.sh: the summary failed" >&2
    exit 1
fi
if [ "$verdict" = 2 ] && [ "$STRICT" = 1 ]; then exit 2; fi
exit 0
