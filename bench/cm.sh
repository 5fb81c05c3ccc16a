#!/usr/bin/env bash
# Connection set-up through the softverbs connection manager on loopback, against TCP connect
# measured in the same run: median and p99 of N sequential connects, and connects per second
# with C at once (R batches: the median rate). Usage: bench/cm.sh [N] [C] [R]   (defaults 1000,
# 100, 10)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p softverbs --example cm_bench
exec target/release/examples/cm_bench "${1:-1000}" "${2:-100}" "${3:-10}"
