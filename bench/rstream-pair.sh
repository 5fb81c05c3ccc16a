# Sourced by bench/rstream-account.sh and bench/rstream-sched.sh (not run by itself): the
# build both use, a scratch directory, a free port, where each end of a pair runs, and
# the reading of `perf stat -x,` files. Expects to be sourced from the repository's root
# with `set -euo pipefail`, and NAME set to the sourcing script's name (for errors).

BIN=${SOCKETS_BIN:-$PWD/target/release}
if [[ -z ${SOCKETS_BIN:-} ]]; then
    cargo build --release -q -p softverbs-cli
fi
SV=$BIN/softverbs
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Sets the arrays TS and TC (the server's and the client's `taskset` prefix) for a mode:
# apart (server on CPU 0, client on CPU 1), one (both on CPU 0) or free (the scheduler's).
placement() {
    case $1 in
        apart) TS=(taskset -c 0); TC=(taskset -c 1) ;;
        one) TS=(taskset -c 0); TC=(taskset -c 0) ;;
        free) TS=(); TC=() ;;
        *) echo "$NAME: unknown mode $1" >&2; exit 1 ;;
    esac
}

# The Python parts import `bench/perfstat.py` (`from perfstat import stat`).
export PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
