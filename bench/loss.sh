#!/usr/bin/env bash
# Loss recovery against TCP (issue 15's benchmark), in one run:
#
#   two network namespaces joined by a veth pair (10.250.0.1 <-> 10.250.0.2), nftables
#   dropping N % of the packets in each direction, and at every rate (0 % = lossless):
#     ib_send_bw, ib_write_bw, ib_read_bw -s 65536   (Debian's perftest on the drop-in,
#                                                     `softverbs run`, MB/s)
#     ibv_rc_pingpong -g 0 -s 4096 -n N               (on the drop-in; the time it prints)
#     iperf3, one TCP stream                          (the anchor, MB/s)
#
# The rules: a table `inet svloss` in each namespace with a chain on the input hook
# (priority filter) holding `meta l4proto udp counter` and
# `meta l4proto udp numgen random mod 100 < N counter drop` while softverbs runs, and the
# same with `tcp` instead of `udp` while iperf3 runs (the tools' own TCP set-up connection
# is never dropped; nothing else runs in the namespaces). Each namespace drops what it
# receives, so both directions lose N %; the counters give the measured drop rate.
#
# What a "packet" is (--drop-unit):
#   wire   (default) every packet on the veth, at most its 1500-byte MTU: the veth ends get
#          gso_max_segs 1, so the sender's kernel cuts UDP GSO batches and TCP segments
#          into wire packets before the peer's rules see them, as on a real link. The
#          receiving softverbs device then gets kernel-split GSO segments one by one, with
#          IPv4 IDs 1, 2, ... its ICRC check must work out (counter icrc_ipv4_id_solved).
#   batch  the veth keeps GSO, so a whole GSO batch (up to 64 KiB of softverbs packets, or
#          a TCP TSO segment) is one packet to the rules and is lost as a unit (issue 15's
#          first measurement was of this kind).
#
# Every run is bounded: a side still running after the bound is killed and the run counts
# as "timeout"; a side that fails (RETRY_EXC_ERR and the like) counts as "died". Neither
# ever hangs the script. The table shows, per tool and rate, the median figure of the runs
# that completed, the slowdown against the lossless run, goodput against TCP at the same
# rate, and deaths; then issue 15's targets as met / missed:
#   at 5 %:  slowdown <= 2x (every tool) and goodput >= TCP's (the bandwidth tools)
#   at 20 %: no run dies or times out (every tool) and goodput >= TCP's (bandwidth tools)
#
# Usage: sudo bench/loss.sh [--rates LIST] [--reps N] [--quick] [--out DIR]
#                           [--drop-unit wire|batch] [--strict] [--tools LIST] [--sv PATH]
#   --rates LIST  drop percentages, whole numbers, comma-separated (default 0,1,5,20;
#                 0 is always added: it is what slowdowns are measured against)
#   --reps N      runs of everything at every rate (default 3, or 1 with --quick)
#   --quick       short runs: 500 perftest iterations instead of 5000, 200 ping-pongs
#                 instead of 2000, iperf3 for 3 s instead of 10, a 40 s bound instead of 120
#   --out DIR     keep every raw output (logs, iperf3 JSON, results.tsv) in DIR
#   --strict      exit with status 2 when a target is missed (default: 0, the table says)
#   --tools LIST  run only these, comma-separated (default: ib_send_bw,ib_write_bw,
#                 ib_read_bw,ibv_rc_pingpong,iperf3); the targets of the others are not judged
#   --sv PATH     as LOSS_SOFTVERBS=PATH below: e.g. another build's binaries copied
#                 aside, to interleave runs of two builds (one invocation each, in turn)
#
# LOSS_SOFTVERBS=PATH: run that softverbs binary (its drop-in libraries beside it)
# instead of building this checkout's.
#
# Needs root (network namespaces, nftables), iproute2, nftables, perftest, ibverbs-utils,
# iperf3, python3 and cargo; installs nothing. Talks only inside the namespaces it makes,
# and removes them (and with them the rules and the veth pair) on exit, also on Ctrl-C.
set -euo pipefail

RATES="0,1,5,20"
REPS=""
QUICK=0
OUT=""
STRICT=0
UNIT=wire
TOOLS="ib_send_bw,ib_write_bw,ib_read_bw,ibv_rc_pingpong,iperf3"
while [ $# -gt 0 ]; do
    case "$1" in
        --rates)
            RATES="${2:?--rates needs a list such as 0,5,20}"
            shift
            ;;
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --quick) QUICK=1 ;;
        --out)
            OUT="${2:?--out needs a directory}"
            shift
            ;;
        --drop-unit)
            UNIT="${2:?--drop-unit needs wire or batch}"
            shift
            ;;
        --strict) STRICT=1 ;;
        --tools)
            TOOLS="${2:?--tools needs a list such as ibv_rc_pingpong,iperf3}"
            shift
            ;;
        --sv)
            LOSS_SOFTVERBS="${2:?--sv needs the path of a softverbs binary}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "loss.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
if [ -z "$REPS" ]; then
    if [ "$QUICK" = 1 ]; then REPS=1; else REPS=3; fi
fi
case "$REPS" in
    '' | *[!0-9]* | 0)
        echo "loss.sh: --reps needs a positive number" >&2
        exit 1
        ;;
esac
case "$UNIT" in
    wire | batch) ;;
    *)
        echo "loss.sh: --drop-unit is wire or batch, not $UNIT" >&2
        exit 1
        ;;
esac
rate_list=()
for r in ${RATES//,/ } 0; do
    case "$r" in
        '' | *[!0-9]*)
            echo "loss.sh: --rates takes whole percentages such as 0,1,5,20 (got $r)" >&2
            exit 1
            ;;
    esac
    if [ "$r" -gt 100 ]; then
        echo "loss.sh: a drop rate is at most 100 (got $r)" >&2
        exit 1
    fi
    rate_list+=("$((10#$r))")
done
mapfile -t rate_list < <(printf '%s\n' "${rate_list[@]}" | sort -n -u)
for t in ${TOOLS//,/ }; do
    case "$t" in
        ib_send_bw | ib_write_bw | ib_read_bw | ibv_rc_pingpong | iperf3) ;;
        *)
            echo "loss.sh: --tools takes ib_send_bw, ib_write_bw, ib_read_bw, ibv_rc_pingpong, iperf3 (got $t)" >&2
            exit 1
            ;;
    esac
done
# Whether tool $1 is to run.
wanted() { [[ ",$TOOLS," == *",$1,"* ]]; }

if [ "$(id -u)" != 0 ]; then
    {
        echo "loss.sh: needs root: it creates network namespaces, a veth pair and nftables rules."
        echo "  Run it as root (sudo bench/loss.sh ...); CI runs as root."
    } >&2
    exit 1
fi
missing=()
for t in ip nft ss iperf3 ib_send_bw ib_write_bw ib_read_bw ibv_rc_pingpong timeout python3 cargo; do
    command -v "$t" > /dev/null 2>&1 || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
    {
        echo "loss.sh: missing: ${missing[*]}"
        echo "  On Debian/Ubuntu: apt-get install -y iproute2 nftables iperf3 perftest ibverbs-utils python3"
        echo "This script installs nothing itself."
    } >&2
    exit 1
fi

cd "$(dirname "$0")/.."

if [ "$QUICK" = 1 ]; then
    BW_ITERS=500 PP_ITERS=200 IPERF_SECS=3 BOUND=40
else
    BW_ITERS=5000 PP_ITERS=2000 IPERF_SECS=10 BOUND=120
fi
SIZE=65536
PP_SIZE=4096
# How long a server may outlive its client before it is stopped.
GRACE=10

TAG="svloss-$$"
NS=("$TAG-a" "$TAG-b")
DEV=("svl$$a" "svl$$b")
ADDR=(10.250.0.1 10.250.0.2)

if [ -n "$OUT" ]; then
    mkdir -p "$OUT"
    TMP=$(cd "$OUT" && pwd)
    KEEP=1
else
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/softverbs-loss.XXXXXX")
    KEEP=0
fi
PIDS=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        # Our own `timeout` wrappers only: each passes the signal on to its command.
        kill -TERM "$p" 2> /dev/null || true
    done
    wait 2> /dev/null || true
    local n
    for n in "${NS[@]}"; do
        ip netns del "$n" 2> /dev/null || true
    done
    if [ "$KEEP" = 0 ]; then rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log() { printf '%s\n' "$*"; }
section() { printf '\n== %s\n' "$*"; }

# Namespaces a killed earlier run left behind (its pid is gone).
for n in $(ip netns list | awk '{ print $1 }' | grep -E '^svloss-[0-9]+-[ab]$' || true); do
    pid=${n#svloss-}
    pid=${pid%-*}
    if ! kill -0 "$pid" 2> /dev/null; then
        ip netns del "$n" 2> /dev/null || true
    fi
done

section "machine"
log "kernel $(uname -r), $(nproc) CPU(s), load average $(cut -d' ' -f1-3 /proc/loadavg)"
log "$(iperf3 --version | head -1); $(nft --version)"
log "drop rates: ${rate_list[*]} %; $REPS run(s) each; drop unit: $UNIT; every run bounded to ${BOUND} s"

if [ -n "${LOSS_SOFTVERBS:-}" ]; then
    # Another build's binary (with its drop-in libraries beside it), e.g. to
    # measure main's against a branch's in alternating runs.
    SV="$(realpath "$LOSS_SOFTVERBS")"
    section "softverbs: $SV (LOSS_SOFTVERBS)"
else
    section "build (release)"
    unset CARGO_TARGET_DIR
    cargo build --release --workspace --quiet
    SV="$(pwd)/target/release/softverbs"
fi
[ -x "$SV" ] || {
    echo "loss.sh: $SV was not built" >&2
    exit 1
}

section "namespaces ${NS[*]}"
for i in 0 1; do ip netns add "${NS[$i]}"; done
ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
for i in 0 1; do
    ip link set "${DEV[$i]}" netns "${NS[$i]}"
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "${DEV[$i]}"
    if [ "$UNIT" = wire ]; then
        ip -n "${NS[$i]}" link set "${DEV[$i]}" gso_max_segs 1
    fi
    ip -n "${NS[$i]}" link set "${DEV[$i]}" up
    ip -n "${NS[$i]}" link set lo up
done
log "${NS[0]} ${ADDR[0]} (servers) <-> ${NS[1]} ${ADDR[1]} (clients), veth MTU 1500"
if [ "$UNIT" = wire ]; then
    log "veth gso_max_segs 1: batches are cut into wire packets before the rules"
fi

# Replaces the drop rules in both namespaces: set_loss udp|tcp PERCENT
set_loss() {
    local proto=$1 rate=$2 i drop=""
    if [ "$rate" -gt 0 ]; then
        drop="meta l4proto $proto numgen random mod 100 < $rate counter drop"
    fi
    for i in 0 1; do
        ip netns exec "${NS[$i]}" nft delete table inet svloss 2> /dev/null || true
        ip netns exec "${NS[$i]}" nft -f - << EOF
table inet svloss {
    chain input {
        type filter hook input priority filter; policy accept;
        meta l4proto $proto counter
        $drop
    }
}
EOF
    done
}

# Packets the rules saw and dropped, both namespaces together: "seen dropped".
loss_counters() {
    local i
    for i in 0 1; do
        ip netns exec "${NS[$i]}" nft list table inet svloss
    done | awk '/counter packets/ {
        for (f = 1; f < NF; f++) if ($f == "packets") n = $(f + 1)
        if ($0 ~ / drop/) dropped += n; else seen += n
    } END { printf "%d %d\n", seen, dropped }'
}

# Waits until something listens on TCP port $2 in namespace $1.
wait_listen() {
    local i
    for i in $(seq 1 200); do
        if [ -n "$(ip netns exec "$1" ss -Hltn "sport = :$2")" ]; then return 0; fi
        sleep 0.05
    done
    return 1
}

# Runs `timeout` on a command inside namespace $1, softverbs configured for that side
# (its counters published under RUNDIR/SIDE): in_ns SIDE BOUND RUNDIR LOG CMD...
# (in the background; the pid of the timeout is in BG).
in_ns() {
    local side=$1 bound=$2 rundir=$3 logf=$4
    shift 4
    mkdir -p "$rundir/$side"
    timeout -k 5 "$bound" ip netns exec "${NS[$side]}" \
        env SOFTVERBS_ADDR="${ADDR[$side]}" XDG_RUNTIME_DIR="$rundir/$side" "$@" \
        > "$logf" 2>&1 &
    BG=$!
    PIDS+=("$BG")
}

# Watches the counters the softverbs devices of one run publish while they run (each
# side's XDG_RUNTIME_DIR/softverbs/PORT.stat, removed when the device closes), keeping
# each counter's largest value per process; on stop writes the sums over the processes
# as "name value" lines to FILE. watch_counters FILE RUNDIR (pid in WATCH); stop: touch
# FILE.stop
watch_counters() {
    python3 - "$1" "$2/0/softverbs" "$2/1/softverbs" << 'EOF' &
import os, sys, time
out, dirs = sys.argv[1], sys.argv[2:]
best = {}
def scan():
    for d in dirs:
        try:
            names = [n for n in os.listdir(d) if n.endswith(".stat")]
        except OSError:
            continue
        for n in names:
            try:
                lines = open(os.path.join(d, n)).read().splitlines()
            except OSError:
                continue
            pairs = [l.split(" ", 1) for l in lines if " " in l]
            pid = next((v for k, v in pairs if k == "pid"), None)
            if pid is None:
                continue
            m = best.setdefault(pid, {})
            for k, v in pairs:
                if v.isdigit():
                    m[k] = max(m.get(k, 0), int(v))
while not os.path.exists(out + ".stop"):
    scan()
    time.sleep(0.05)
scan()
total = {}
for m in best.values():
    for k, v in m.items():
        total[k] = total.get(k, 0) + v
with open(out, "w") as f:
    for k in sorted(total):
        f.write("%s %d\n" % (k, total[k]))
EOF
    WATCH=$!
    PIDS+=("$WATCH")
}

# A counter from a watch_counters file (0 if absent).
counter() { awk -v k="$2" '$1 == k { print $2; found = 1 } END { if (!found) print 0 }' "$1"; }

# Why a side failed, from its exit status and output.
why() { # status logfile
    if [ "$1" = 124 ] || [ "$1" = 137 ]; then
        echo "timeout"
    elif [ "$1" = 143 ]; then
        echo "stopped" # still running $GRACE s after its client ended
    elif grep -qiE 'status 12|retry counter exceeded|RETRY_EXC' "$2"; then
        echo "RETRY_EXC_ERR"
    else
        echo "exit-$1"
    fi
}

PORT=18600
RESULTS="$TMP/results.tsv"
printf 'tool\trate\trep\tstatus\treason\tfigure\tseconds\tseen\tdropped\tretransmitted\tack_timeouts\n' > "$RESULTS"

# One client/server run: pair TOOL RATE REP PROTO :: SERVER-COMMAND :: CLIENT-COMMAND
# Appends a line to results.tsv; the figure is read by figure_of.
pair() {
    local tool=$1 rate=$2 rep=$3 proto=$4
    shift 5
    local server=() client=()
    while [ "$1" != :: ]; do
        server+=("$1")
        shift
    done
    shift
    client=("$@")
    local base="$TMP/$tool-$rate-$rep"
    set_loss "$proto" "$rate"
    watch_counters "$base.counters" "$base.run"
    local watch=$WATCH
    in_ns 0 $((BOUND + GRACE)) "$base.run" "$base.server" "${server[@]}"
    local srv=$BG
    if ! wait_listen "${NS[0]}" "$PORT"; then
        kill -TERM "$srv" 2> /dev/null || true
        wait "$srv" 2> /dev/null || true
        echo "loss.sh: the $tool server never listened:" >&2
        cat "$base.server" >&2
        exit 1
    fi
    local t0 t1 crc=0 src=0 seen dropped
    t0=$(date +%s.%N)
    in_ns 1 "$BOUND" "$base.run" "$base.client" "${client[@]}"
    wait "$BG" || crc=$?
    t1=$(date +%s.%N)
    # The server ends by itself soon after a client that finished; not after one that died.
    local waited=0
    while kill -0 "$srv" 2> /dev/null && [ "$waited" -lt $((GRACE * 10)) ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -TERM "$srv" 2> /dev/null || true
    wait "$srv" || src=$?
    local status=ok reason=- figure
    if [ "$crc" != 0 ]; then
        status=died
        reason="client:$(why "$crc" "$base.client")"
    elif [ "$src" != 0 ]; then
        status=died
        reason="server:$(why "$src" "$base.server")"
    fi
    if [ "$status" = died ] && [[ $reason == *timeout ]]; then status=timeout; fi
    figure=""
    if [ "$status" = ok ]; then
        figure=$(figure_of "$tool" "$base")
        if [ -z "$figure" ]; then
            status=died
            reason="no-result"
        fi
    fi
    read -r seen dropped < <(loss_counters)
    touch "$base.counters.stop"
    wait "$watch" || true
    rm -rf "$base.run" "$base.counters.stop"
    local retx acks
    retx=$(counter "$base.counters" retransmitted_packets)
    acks=$(counter "$base.counters" ack_timeouts)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\n' "$tool" "$rate" "$rep" "$status" "$reason" \
        "${figure:--}" "$(python3 -c "print($t1 - $t0)")" "$seen" "$dropped" "$retx" "$acks" >> "$RESULTS"
    local shown=${figure:--} extra=""
    if [ "$tool" != iperf3 ]; then
        extra="; softverbs: $retx retransmitted, $acks ACK timeouts, $(counter "$base.counters" drop_icrc) ICRC drops"
    fi
    log "  $(printf '%-16s %3s %%  run %s: %-8s %-22s %10s %s %s, %s of %s %s packets dropped%s' \
        "$tool" "$rate" "$rep" "$status" "$reason" "$shown" "$(unit_of "$tool")" \
        "($(python3 -c "print(round($t1 - $t0, 1))") s)" "$dropped" "$seen" "$proto" "$extra")"
    PORT=$((PORT + 1))
}

unit_of() {
    case "$1" in
        ibv_rc_pingpong) echo "s" ;;
        *) echo "MB/s" ;;
    esac
}

# The figure a run printed: MB/s (10^6 bytes) for the bandwidth tools, seconds for the
# ping-pong; empty when there is none.
figure_of() {
    local tool=$1 base=$2
    case "$tool" in
        ib_*_bw)
            # perftest's MB/sec is 2^20 bytes per second.
            awk '/#bytes/ { getline; if ($4 != "") printf "%.2f\n", $4 * 1.048576; exit }' "$base.client"
            ;;
        ibv_rc_pingpong)
            sed -n 's/.* iters in \([0-9.]*\) seconds.*/\1/p' "$base.client" | head -1
            ;;
        iperf3)
            python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("%.2f" % (d["end"]["sum_received"]["bits_per_second"] / 8e6))
except Exception:
    pass' "$base.client"
            ;;
    esac
}

section "runs (servers in ${NS[0]}, clients in ${NS[1]})"
for rep in $(seq 1 "$REPS"); do
    for rate in "${rate_list[@]}"; do
        if wanted iperf3; then
            pair iperf3 "$rate" "$rep" tcp :: \
                iperf3 -s -1 -B "${ADDR[0]}" -p "$PORT" :: \
                iperf3 -c "${ADDR[0]}" -p "$PORT" -t "$IPERF_SECS" --json
        fi
        for tool in ib_send_bw ib_write_bw ib_read_bw; do
            wanted "$tool" || continue
            pair "$tool" "$rate" "$rep" udp :: \
                "$SV" run -- "$tool" -F -x 0 -s "$SIZE" -n "$BW_ITERS" -p "$PORT" :: \
                "$SV" run -- "$tool" -F -x 0 -s "$SIZE" -n "$BW_ITERS" -p "$PORT" "${ADDR[0]}"
        done
        if wanted ibv_rc_pingpong; then
            pair ibv_rc_pingpong "$rate" "$rep" udp :: \
                "$SV" run -- ibv_rc_pingpong -g 0 -s "$PP_SIZE" -n "$PP_ITERS" -p "$PORT" :: \
                "$SV" run -- ibv_rc_pingpong -g 0 -s "$PP_SIZE" -n "$PP_ITERS" -p "$PORT" "${ADDR[0]}"
        fi
    done
done

section "results"
set +e
python3 - "$RESULTS" "$BOUND" "$BW_ITERS" "$SIZE" "$PP_ITERS" "$PP_SIZE" << 'EOF'
import csv, statistics, sys

path, bound, bw_iters, size, pp_iters, pp_size = sys.argv[1], *map(int, sys.argv[2:])
rows = list(csv.DictReader(open(path), delimiter="\t"))
tools = ["ib_send_bw", "ib_write_bw", "ib_read_bw", "ibv_rc_pingpong", "iperf3"]
# Only what ran (--tools).
tools = [t for t in tools if any(r["tool"] == t for r in rows)]
bw_tools = ["ib_send_bw", "ib_write_bw", "ib_read_bw"]
rates = sorted({int(r["rate"]) for r in rows})

def cell(tool, rate):
    runs = [r for r in rows if r["tool"] == tool and int(r["rate"]) == rate]
    ok = [float(r["figure"]) for r in runs if r["status"] == "ok"]
    bad = [r for r in runs if r["status"] != "ok"]
    seen = sum(int(r["seen"]) for r in runs)
    dropped = sum(int(r["dropped"]) for r in runs)
    return {
        "n": len(runs),
        "figure": statistics.median(ok) if ok else None,
        "died": len(bad),
        "why": sorted({r["reason"] for r in bad}),
        "drop": 100.0 * dropped / seen if seen else 0.0,
        "retx": statistics.median(int(r["retransmitted"]) for r in runs) if runs else 0,
        "acks": statistics.median(int(r["ack_timeouts"]) for r in runs) if runs else 0,
    }

cells = {(t, r): cell(t, r) for t in tools for r in rates}
higher_is_better = lambda t: t != "ibv_rc_pingpong"

def slowdown(t, r):
    base, c = cells[(t, 0)]["figure"], cells[(t, r)]["figure"]
    if base is None or c is None:
        return None
    return base / c if higher_is_better(t) else c / base

def vs_tcp(t, r):
    c, tcp = cells[(t, r)]["figure"], cells.get(("iperf3", r), {}).get("figure")
    if t not in bw_tools or c is None or tcp is None or tcp == 0:
        return None
    return c / tcp

def figure_text(t, r):
    c = cells[(t, r)]
    if c["figure"] is not None:
        if t == "ibv_rc_pingpong":
            return "%.2f s" % c["figure"]
        return ("%.1f MB/s" if c["figure"] >= 10 else "%.2f MB/s") % c["figure"]
    # Nothing completed: what the bound says.
    if t == "ibv_rc_pingpong":
        return "> %d s" % bound if "timeout" in " ".join(c["why"]) else "-"
    if t in bw_tools and "timeout" in " ".join(c["why"]):
        return "< %.1f MB/s" % (bw_iters * size / bound / 1e6)
    return "-"

x = lambda v: "-" if v is None else "%.2fx" % v
fmt = "%-16s %5s %14s %9s %9s %-22s %8s %15s"
print(fmt % ("tool", "drop", "figure", "slowdown", "vs TCP", "died / timeout", "dropped",
             "retx / ACK t.o."))
print(fmt % ("-" * 16, "-" * 5, "-" * 14, "-" * 9, "-" * 9, "-" * 22, "-" * 8, "-" * 15))
for t in tools:
    for r in rates:
        c = cells[(t, r)]
        died = "no" if c["died"] == 0 else "%d/%d %s" % (c["died"], c["n"], ",".join(c["why"]))
        retx = "-" if t == "iperf3" else "%d / %d" % (c["retx"], c["acks"])
        print(fmt % (t, "%d %%" % r, figure_text(t, r), x(slowdown(t, r)), x(vs_tcp(t, r)),
                     died, "%.2f %%" % c["drop"], retx))
print()
print("figures: medians of the runs that completed; MB/s = 10^6 bytes/s (perftest's 2^20 converted);")
print("ping-pong: the time ibv_rc_pingpong prints for %d exchanges of %d bytes; perftest: %d x %d bytes."
      % (pp_iters, pp_size, bw_iters, size))
print("slowdown = lossless figure / figure (time / lossless time for the ping-pong); vs TCP = goodput /")
print("iperf3's at the same drop rate. A run with no result in %d s is a timeout; '< X' is the most it" % bound)
print("could have moved. dropped: what the rules dropped of what they saw (UDP for softverbs, TCP for")
print("iperf3). retx / ACK t.o.: softverbs' retransmitted packets and local ACK timeouts per run, both")
print("ends (median; read from the counters the devices publish while they run).")

print()
print("issue 15 targets")
missed = 0
def verdict(ok):
    global missed
    if ok is None:
        missed += 1
        return "MISSED (no result)"
    if not ok:
        missed += 1
        return "MISSED"
    return "met"
for r, rule in ((5, "slowdown"), (20, "death")):
    if r not in rates:
        print("  %d %%: not measured (add it to --rates)" % r)
        continue
    for t in (t for t in tools if t != "iperf3"):
        parts = []
        if rule == "slowdown":
            s = slowdown(t, r)
            parts.append("slowdown %s <= 2x: %s" % (x(s), verdict(None if s is None else s <= 2.0)))
        else:
            c = cells[(t, r)]
            parts.append("no death (%d/%d died or timed out): %s" % (c["died"], c["n"], verdict(c["died"] == 0)))
        if t in bw_tools:
            g = vs_tcp(t, r)
            parts.append("goodput %s TCP >= 1x: %s" % (x(g), verdict(None if g is None else g >= 1.0)))
        print("  %2d %%  %-16s %s" % (r, t, "; ".join(parts)))
print()
print("%d target(s) missed." % missed if missed else "all targets met.")
sys.exit(2 if missed else 0)
EOF
verdict=$?
set -e
if [ "$KEEP" = 1 ]; then log "raw outputs in $TMP"; fi
if [ "$verdict" = 2 ] && [ "$STRICT" = 1 ]; then exit 2; fi
if [ "$verdict" != 0 ] && [ "$verdict" != 2 ]; then
    echo "loss.sh: the summary failed" >&2
    exit 1
fi
exit 0
