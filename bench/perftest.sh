#!/usr/bin/env bash
# perftest on the drop-in libibverbs.so.1 beside softverbs' own `perf`, in one run:
#
#   ib_write_bw -s 65536   (Debian's perftest via `softverbs run`)  vs  softverbs perf write --bw -s 65536
#   ib_send_lat -s 8       (Debian's perftest via `softverbs run`)  vs  softverbs perf send --lat -s 8
#
# Both sides of each run are two processes on loopback (perftest) or one process with
# two devices (softverbs perf); both report MB/s with MB = 2^20 bytes and latency as half
# the round trip. Target: perftest within 5 % of native (bandwidth >= 0.95 x, latency
# <= 1.05 x).
#
# Usage: bench/perftest.sh [--reps N] [--out DIR]
#   --reps N   repetitions of each measurement (default 3; the table shows the median)
#   --out DIR  keep every raw output in DIR
#
# Needs perftest (apt-get install perftest), python3 and cargo. Loopback only.
set -euo pipefail

REPS=3
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
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
            echo "perftest.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
case "$REPS" in
    '' | *[!0-9]* | 0)
        echo "perftest.sh: --reps needs a positive number" >&2
        exit 1
        ;;
esac
for t in ib_write_bw ib_send_lat cargo python3; do
    command -v "$t" > /dev/null || {
        echo "perftest.sh: $t not found (apt-get install -y perftest python3)" >&2
        exit 1
    }
done

cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"

echo "building (release)..."
cargo build --release --workspace --quiet
SV=target/release/softverbs

median() { python3 -c 'import statistics, sys; print("%.2f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# The first figure row under perftest's "#bytes" header, column $2 (1-based).
perftest_col() { awk -v c="$2" '/#bytes/ { getline; print $c; exit }' "$1"; }

# Runs perftest tool $1 (server then client) with the remaining arguments; the client's
# output goes to $TMP/$1.out.
perftest_run() {
    local tool=$1
    shift
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    timeout 120 "$SV" run -- "$tool" -p "$port" "$@" > "$TMP/$tool.srv" 2>&1 &
    local srv=$!
    local ok=1
    for _ in $(seq 50); do
        sleep 0.2
        if timeout 120 "$SV" run -- "$tool" -p "$port" "$@" 127.0.0.1 > "$TMP/$tool.out" 2>&1; then
            ok=0
            break
        fi
        grep -q "Couldn't connect" "$TMP/$tool.out" || break
    done
    wait "$srv" || ok=1
    if [ "$ok" != 0 ]; then
        echo "perftest.sh: $tool $* failed:" >&2
        cat "$TMP/$tool.srv" "$TMP/$tool.out" >&2
        exit 1
    fi
}

declare -a PT_BW NV_BW PT_LAT_TYP PT_LAT_AVG NV_LAT_TYP NV_LAT_AVG
for r in $(seq "$REPS"); do
    echo "run $r/$REPS"
    perftest_run ib_write_bw -s 65536
    PT_BW+=("$(perftest_col "$TMP/ib_write_bw.out" 4)")
    perftest_run ib_send_lat -s 8
    PT_LAT_TYP+=("$(perftest_col "$TMP/ib_send_lat.out" 5)")
    PT_LAT_AVG+=("$(perftest_col "$TMP/ib_send_lat.out" 6)")
    "$SV" perf write --bw --size 65536 --json > "$TMP/native-bw.json"
    NV_BW+=("$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bw"][0]["bw_avg_mb_per_sec"])' "$TMP/native-bw.json")")
    "$SV" perf send --lat --size 8 --json > "$TMP/native-lat.json"
    NV_LAT_TYP+=("$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["lat"][0]["t_typical_usec"])' "$TMP/native-lat.json")")
    NV_LAT_AVG+=("$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["lat"][0]["t_avg_usec"])' "$TMP/native-lat.json")")
    if [ -n "$OUT" ]; then
        for f in ib_write_bw.out ib_write_bw.srv ib_send_lat.out ib_send_lat.srv native-bw.json native-lat.json; do
            cp "$TMP/$f" "$OUT/$r-$f"
        done
    fi
    echo "  ib_write_bw ${PT_BW[-1]} MB/s, native ${NV_BW[-1]} MB/s;" \
        "ib_send_lat typ ${PT_LAT_TYP[-1]} avg ${PT_LAT_AVG[-1]} us, native typ ${NV_LAT_TYP[-1]} avg ${NV_LAT_AVG[-1]} us"
done

pb=$(median "${PT_BW[@]}")
nb=$(median "${NV_BW[@]}")
plt=$(median "${PT_LAT_TYP[@]}")
pla=$(median "${PT_LAT_AVG[@]}")
nlt=$(median "${NV_LAT_TYP[@]}")
nla=$(median "${NV_LAT_AVG[@]}")
ratio() { python3 -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$1" "$2"; }
echo
echo "medians of $REPS runs (perftest via the drop-in library / softverbs perf)"
printf '%-34s %12s %12s %8s %s\n' measure perftest native ratio target
printf '%-34s %12s %12s %8s %s\n' "WRITE bw, 64 KiB [MB/s]" "$pb" "$nb" "$(ratio "$pb" "$nb")" ">= 0.95"
printf '%-34s %12s %12s %8s %s\n' "SEND lat, 8 B, typical [us]" "$plt" "$nlt" "$(ratio "$plt" "$nlt")" "<= 1.05"
printf '%-34s %12s %12s %8s %s\n' "SEND lat, 8 B, average [us]" "$pla" "$nla" "$(ratio "$pla" "$nla")" "<= 1.05"
