#!/usr/bin/env bash
# Datagram rsockets against kernel UDP on loopback, in one run: Debian's udpong, both ends
# on the drop-in libraries (`softverbs run`), and the same udpong with `-T s` (its kernel
# socket mode); then sockperf's UDP ping-pong through librspreload (`softverbs run
# --sockets`) against plain sockperf.
#
#   latency    udpong echo, 64-byte datagrams, blocking (-T b), usec per one-way transfer
#              sockperf ping-pong, 64 bytes, avg one-way latency in usec
#   bandwidth  udpong bandwidth mode, 1 KiB datagrams, blocking: Gb/s of what arrived and
#              how many of the datagrams sent arrived
#
# Usage: [PROFILE=dev] bench/dgram.sh [COUNT]   (udpong bandwidth datagrams, default 20000;
# PROFILE picks the cargo profile, release by default). Talks only to
# 127.0.0.1; every process it starts is bounded by `timeout`. Needs rdmacm-utils, sockperf,
# python3, cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT="${1:-20000}"
PROFILE="${PROFILE:-release}"
cargo build --profile "$PROFILE" -q -p softverbs-cli -p softverbs-ibverbs-abi -p softverbs-rdmacm-abi \
    -p softverbs-mlx5-stub -p softverbs-efa-stub
SV=target/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")/softverbs
port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# udpong PREFIX... + ARGS: server and client (the same -T options), the client's row.
udpong() {
    local pre=() p
    while [[ $1 != + ]]; do pre+=("$1"); shift; done
    shift
    p=$(port)
    timeout 120 "${pre[@]}" udpong -b 127.0.0.1 -p "$p" "$@" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    timeout 60 "${pre[@]}" udpong -s 127.0.0.1 -p "$p" "$@" | tail -1 || true
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
}

# Echo runs stay short: udpong's echo client livelocks once an echo takes over 1 ms and a
# datagram is then lost (see crates/rdmacm-abi/tests/rsocket_dgram.rs); a run that hangs
# is cut by its timeout and shows as "n/a".
ECHO=2000
rs_lat=$(udpong "$SV" run -- + -C "$ECHO" -S 64 -T e -T b | awk '{print $7}')
k_lat=$(udpong env + -C "$ECHO" -S 64 -T e -T b -T s | awk '{print $7}')
rs_bw_line=$(udpong "$SV" run -- + -C "$COUNT" -S 1024 -T b)
k_bw_line=$(udpong env + -C "$COUNT" -S 1024 -T b -T s)

# sockperf UDP ping-pong: avg one-way latency.
sockperf_lat() {
    local p; p=$(port)
    timeout 60 "$@" sockperf sr -i 127.0.0.1 -p "$p" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    timeout 60 "$@" sockperf pp -i 127.0.0.1 -p "$p" -m 64 -t 3 2>&1 \
        | sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' | tail -1
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
}
sp_rs=$(sockperf_lat "$SV" run --sockets --)
sp_k=$(sockperf_lat env)

echo "udpong echo 64 B x $ECHO, usec/transfer: rsockets ${rs_lat:-n/a}, kernel UDP ${k_lat:-n/a}"
echo "udpong bandwidth 1 KiB (name bytes xfers-arrived total time Gb/s usec/xfer), $COUNT sent:"
echo "  rsockets:   $rs_bw_line"
echo "  kernel UDP: $k_bw_line"
echo "sockperf UDP ping-pong 64 B avg latency, usec: rsockets (librspreload) $sp_rs, kernel $sp_k"
