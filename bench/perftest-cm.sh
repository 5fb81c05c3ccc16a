#!/usr/bin/env bash
# perftest with rdma_cm (-R) beside the same test without it, and the rdma_cm connection
# rate, all of Debian's binaries on the drop-in libraries (`softverbs run`), loopback:
#
#   ib_write_bw -s 65536      without -R  vs  with -R   (BW average, MB/s)
#   ib_send_lat -s 8          without -R  vs  with -R   (t_typical, us)
#   cmtime -c 100                                       (connect: us per connection)
#
# -R only changes how the QPs are connected (rdma_cm instead of a TCP exchange); the data
# path is the same, so the figures must match within noise.
#
# Usage: bench/perftest-cm.sh [--reps N]   (default 3; the table shows the medians)
# Needs perftest, rdmacm-utils, python3 and cargo.
set -euo pipefail

REPS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "perftest-cm.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
case "$REPS" in
    '' | *[!0-9]* | 0)
        echo "perftest-cm.sh: --reps needs a positive number" >&2
        exit 1
        ;;
esac
for t in ib_write_bw ib_send_lat cmtime cargo python3; do
    command -v "$t" > /dev/null || {
        echo "perftest-cm.sh: $t not found (apt-get install -y perftest rdmacm-utils python3)" >&2
        exit 1
    }
done

cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "building (release)..."
cargo build --release --workspace --quiet
SV=target/release/softverbs

median() { python3 -c 'import statistics, sys; print("%.2f" % statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
ratio() { python3 -c 'import sys; print("%.2f" % (float(sys.argv[1]) / float(sys.argv[2])))' "$1" "$2"; }
free_port() { python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 0)); print(s.getsockname()[1])'; }
perftest_col() { awk -v c="$2" '/#bytes/ { getline; print $c; exit }' "$1"; }

# perftest_run OUT TOOL ARGS...: server, then client; when the client got there before the
# server listened ("Couldn't connect" without -R, REJECTED / UNREACHABLE with -R, also in
# the middle of a -R run, where perftest opens its data listener after a handshake), both
# again on a new port.
perftest_run() {
    local out=$1 tool=$2
    shift 2
    local port srv
    for _ in $(seq 10); do
        port=$(free_port)
        timeout 120 "$SV" run -- "$tool" -p "$port" "$@" > "$out.srv" 2>&1 &
        srv=$!
        sleep 1
        if timeout 120 "$SV" run -- "$tool" -p "$port" "$@" 127.0.0.1 > "$out" 2>&1; then
            wait "$srv" && return 0
            break
        fi
        kill "$srv" 2> /dev/null || true
        wait "$srv" 2> /dev/null || true
        grep -qE "Couldn't connect|REJECTED|UNREACHABLE" "$out" || break
    done
    echo "perftest-cm.sh: $tool $* failed:" >&2
    cat "$out.srv" "$out" >&2
    exit 1
}

declare -a BW BW_R LAT LAT_R CONN
for r in $(seq "$REPS"); do
    echo "run $r/$REPS"
    perftest_run "$TMP/bw" ib_write_bw -s 65536
    BW+=("$(perftest_col "$TMP/bw" 4)")
    perftest_run "$TMP/bw_r" ib_write_bw -s 65536 -R
    BW_R+=("$(perftest_col "$TMP/bw_r" 4)")
    perftest_run "$TMP/lat" ib_send_lat -s 8
    LAT+=("$(perftest_col "$TMP/lat" 5)")
    perftest_run "$TMP/lat_r" ib_send_lat -s 8 -R
    LAT_R+=("$(perftest_col "$TMP/lat_r" 5)")
    port=$(free_port)
    timeout 120 "$SV" run -- cmtime -b 127.0.0.1 -p "$port" > "$TMP/cmtime.srv" 2>&1 &
    srv=$!
    sleep 0.5
    timeout 120 "$SV" run -- cmtime -s 127.0.0.1 -p "$port" -c 100 > "$TMP/cmtime" 2>&1 || {
        cat "$TMP/cmtime" >&2
        exit 1
    }
    kill "$srv" 2> /dev/null || true
    wait "$srv" 2> /dev/null || true
    CONN+=("$(awk '$1 == "connect" { print $NF; exit }' "$TMP/cmtime")")
    echo "  write bw ${BW[-1]} / -R ${BW_R[-1]} MB/s; send lat ${LAT[-1]} / -R ${LAT_R[-1]} us;" \
        "cmtime connect ${CONN[-1]} us/conn"
done

b=$(median "${BW[@]}")
br=$(median "${BW_R[@]}")
l=$(median "${LAT[@]}")
lr=$(median "${LAT_R[@]}")
c=$(median "${CONN[@]}")
echo
echo "medians of $REPS runs (Debian's perftest and cmtime on the drop-in libraries)"
printf '%-34s %12s %12s %8s\n' measure "no -R" "-R" ratio
printf '%-34s %12s %12s %8s\n' "WRITE bw, 64 KiB [MB/s]" "$b" "$br" "$(ratio "$br" "$b")"
printf '%-34s %12s %12s %8s\n' "SEND lat, 8 B, typical [us]" "$l" "$lr" "$(ratio "$lr" "$l")"
printf '%-34s %12s  (%s connections/s)\n' "cmtime -c 100 connect [us/conn]" "$c" \
    "$(python3 -c 'import sys; print("%.0f" % (1e6 / float(sys.argv[1])))' "$c")"
