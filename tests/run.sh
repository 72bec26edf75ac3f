#!/usr/bin/env bash
# Runs every check and test of the workspace (format, clippy, the hot path's instruction counts,
# the whole suite); the last lines are the test runner's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The speed guard: the hot path's instructions per operation against the committed baseline.
cargo bench -p sparkgate-gateway --bench hot_path --locked -- --check
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
