#!/usr/bin/env bash
# Runs every cargo-fuzz target of the workspace (crates/*/fuzz) for a short while, to
# show the targets build and hold on a fresh corpus. Each fuzz crate is its own
# workspace with a committed Cargo.lock, built --locked-equivalent: the lock is
# checked first, so a dependency change shows up as an error, not a silent update.
#
#   FUZZ_SECONDS   seconds per target (default 30)
#   CI=true        install cargo-fuzz if missing instead of skipping
#
# cargo-fuzz needs nightly-only compiler flags (sanitizers); RUSTC_BOOTSTRAP=1 lets a
# stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-30}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
  else
    echo "############################################################"
    echo "SKIPPED: fuzz smoke test: cargo-fuzz is not installed."
    echo "SKIPPED: install it with 'cargo install cargo-fuzz --locked'"
    echo "SKIPPED: (CI=true installs it automatically)."
    echo "############################################################"
    exit 0
  fi
fi

export RUSTC_BOOTSTRAP=1
shopt -s nullglob
dirs=(crates/*/fuzz)
if [[ ${#dirs[@]} -eq 0 ]]; then
  echo "no fuzz crates under crates/*/fuzz" >&2
  exit 1
fi

for dir in "${dirs[@]}"; do
  if ! cargo fetch --locked --manifest-path "$dir/Cargo.toml" >/dev/null; then
    echo "error: $dir/Cargo.lock is out of date; run 'cargo update --manifest-path $dir/Cargo.toml' and commit it" >&2
    exit 1
  fi
  targets=$(cargo fuzz list --fuzz-dir "$dir")
  if [[ -z "$targets" ]]; then
    echo "error: $dir has no fuzz targets" >&2
    exit 1
  fi
  for target in $targets; do
    echo "== fuzz $dir $target for ${seconds}s"
    cargo fuzz run --fuzz-dir "$dir" "$target" -- -max_total_time="$seconds"
  done
done
