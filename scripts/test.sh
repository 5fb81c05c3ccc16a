#!/usr/bin/env bash
# Runs every check and test of the workspace. CI (.ci/run) calls this after installing
# the tools; on a developer machine tests that need missing tools skip loudly.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p softverbs --all-targets --features tokio -- -D warnings
# The per-step trace (feature `trace`) compiles to nothing without the feature: check it.
cargo clippy -p softverbs --lib --features trace -- -D warnings
echo "== cargo test"
# Build the libraries first so the C-ABI tests load freshly linked cdylibs.
cargo build --workspace
cargo test --workspace --all-targets
cargo test --workspace --doc
cargo test -p softverbs --features tokio --test async_stream --test sock_async
cargo test -p softverbs --features trace --lib trace::
if [[ -x scripts/fuzz-smoke.sh ]]; then
  echo "== fuzz smoke"
  scripts/fuzz-smoke.sh
fi
