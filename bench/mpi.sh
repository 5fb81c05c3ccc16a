#!/usr/bin/env bash
# MPI ping-pong on softverbs against Open MPI over TCP, in one run:
#
#   softverbs:  softverbs run -- mpirun -np 2 --mca pml ucx   (UCX_TLS=rc_verbs,ud_verbs)
#   TCP:        mpirun -np 2 --mca pml ob1 --mca btl tcp,self
#
# Both run crates/cli/tests/scale_out/mpi_pingpong.c --bench: latency of 8 B messages
# (half the round trip, ITERS round trips) and ping-pong bandwidth of 64 KiB and 1 MiB
# messages (size / half round trip, ITERS/10 round trips), each after a warm-up; MB =
# 10^6 bytes. The two stacks alternate, REPS times; the table shows medians and the
# ratios softverbs / TCP. Targets: bandwidth >= TCP's, latency <= TCP's.
#
# With --perf, one more run of each stack under `perf stat` (task clock, context
# switches, CPU migrations, summed over mpirun and both ranks) says where time goes.
#
# Usage: bench/mpi.sh [--reps N] [--iters N] [--perf] [--out DIR]
#   --reps N    repetitions of each stack (default 3)
#   --iters N   8 B round trips per measurement (default 20000; bandwidth uses N/10)
#   --perf      also count context switches and CPU time with perf stat
#   --out DIR   keep every raw output in DIR
#
# Needs openmpi-bin, libopenmpi-dev (mpicc), ucx-utils' libucx0, python3, cargo (and
# linux-perf for --perf). Loopback only; mpirun gets --allow-run-as-root and
# --oversubscribe (a root CI machine with 2 cores), nothing else beyond the transport.
set -euo pipefail

REPS=3
ITERS=20000
PERF=0
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps)
            REPS="${2:?--reps needs a number}"
            shift
            ;;
        --iters)
            ITERS="${2:?--iters needs a number}"
            shift
            ;;
        --perf) PERF=1 ;;
        --out)
            OUT="${2:?--out needs a directory}"
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "mpi.sh: unknown argument $1 (try --help)" >&2
            exit 1
            ;;
    esac
    shift
done
for n in "$REPS" "$ITERS"; do
    case "$n" in
        '' | *[!0-9]* | 0)
            echo "mpi.sh: --reps and --iters need positive numbers" >&2
            exit 1
            ;;
    esac
done
for t in mpirun mpicc cargo python3; do
    command -v "$t" > /dev/null || {
        echo "mpi.sh: $t not found (apt-get install -y openmpi-bin libopenmpi-dev python3)" >&2
        exit 1
    }
done
if [ "$PERF" = 1 ] && ! command -v perf > /dev/null; then
    echo "mpi.sh: --perf needs perf (apt-get install -y linux-perf)" >&2
    exit 1
fi

cd "$(dirname "$0")/.."
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -n "$OUT" ] && mkdir -p "$OUT"

echo "building (release)..."
cargo build --release --workspace --quiet
SV=$PWD/target/release/softverbs
mpicc -O2 -o "$TMP/mpi_pingpong" crates/cli/tests/scale_out/mpi_pingpong.c

MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
# Runs one stack ($1: softverbs or tcp) once; output to $2. Extra arguments go first
# (a wrapper such as perf stat).
run_stack() {
    local stack=$1 out=$2
    shift 2
    case "$stack" in
        softverbs)
            UCX_TLS=rc_verbs,ud_verbs timeout 300 "$@" "$SV" run -- "${MPIRUN[@]}" --mca pml ucx \
                "$TMP/mpi_pingpong" --bench "$ITERS" > "$out" 2>&1
            ;;
        tcp)
            timeout 300 "$@" "${MPIRUN[@]}" --mca pml ob1 --mca btl tcp,self \
                "$TMP/mpi_pingpong" --bench "$ITERS" > "$out" 2>&1
            ;;
    esac || {
        echo "mpi.sh: the $stack run failed:" >&2
        tail -20 "$out" >&2
        exit 1
    }
}

for rep in $(seq "$REPS"); do
    for stack in softverbs tcp; do
        echo "run $rep/$REPS: $stack"
        run_stack "$stack" "$TMP/$stack.$rep"
    done
done
[ -n "$OUT" ] && cp "$TMP"/softverbs.* "$TMP"/tcp.* "$OUT"/

python3 - "$TMP" "$REPS" << 'EOF'
import statistics, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
def figures(stack):
    lat, bw64, bw1m = [], [], []
    for rep in range(1, reps + 1):
        for line in open(f"{tmp}/{stack}.{rep}"):
            f = line.split()
            if len(f) == 8 and f[0] == "size":  # size S iters N latency_us L bandwidth_MBps B
                size, latency, bandwidth = int(f[1]), float(f[5]), float(f[7])
                {8: lat, 65536: bw64, 1048576: bw1m}[size].append(latency if size == 8 else bandwidth)
    return [statistics.median(v) for v in (lat, bw64, bw1m)]
sv, tcp = figures("softverbs"), figures("tcp")
print()
print(f"{'':28}{'softverbs (pml ucx)':>22}{'TCP (btl tcp)':>16}{'ratio':>9}")
names = ["latency 8 B (us)", "bandwidth 64 KiB (MB/s)", "bandwidth 1 MiB (MB/s)"]
for i, name in enumerate(names):
    print(f"{name:28}{sv[i]:>22.2f}{tcp[i]:>16.2f}{sv[i] / tcp[i]:>8.2f}x")
print(f"(medians of {reps} runs; ratio = softverbs / TCP; targets: latency <= 1.00x, bandwidth >= 1.00x)")
EOF

if [ "$PERF" = 1 ]; then
    echo
    echo "where time goes (perf stat over mpirun and both ranks, one run each):"
    for stack in softverbs tcp; do
        run_stack "$stack" "$TMP/$stack.perf" perf stat -x, -e task-clock,context-switches,cpu-migrations --
        [ -n "$OUT" ] && cp "$TMP/$stack.perf" "$OUT"/
        awk -F, -v s="$stack" '
            $3 == "task-clock" { cpu = $1 / 1000 }
            $3 == "context-switches" { cs = $1 }
            $3 == "cpu-migrations" { mig = $1 }
            END { printf "  %-10s CPU %.2f s, %d context switches, %d migrations\n", s, cpu, cs, mig }' \
            "$TMP/$stack.perf"
    done
fi
