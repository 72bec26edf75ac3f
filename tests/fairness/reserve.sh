#!/usr/bin/env bash
# The interactive reserve (INTERACTIVE_RESERVE) in the setup of tokens.sh: one client keeps two
# requests with 100k-token prompts in flight, three clients send short streamed chats one after
# another, MAX_NUM_SEQS 2, vllm-sim paced at SIM_SPEED=20 with the plan's 1 024-token prefill
# chunk. Runs in one go, each on a fresh rank: the chats alone (their TTFT without a heavy
# client); today's configuration (no reserve, no prefill threshold); the reserve alone; vLLM's
# LONG_PREFILL_TOKEN_THRESHOLD (768) alone; both. Prints one JSON line per run. Loopback only.
#
# usage: bash tests/fairness/reserve.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
cargo build --release --locked --bins >/dev/null
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=DeepSeek-v4.1-Flash-EXL3
# label:INTERACTIVE_RESERVE:heavy requests in flight:LONG_PREFILL_TOKEN_THRESHOLD (0: none)
# [:LONG_MAX_WAIT_S (the gateway's default when left out)]
for run in ${RUNS:-chats-alone:0:0:0 today:0:2:0 reserve:1:2:0 threshold:0:2:768 reserve+threshold:1:2:768}; do
  IFS=: read -r label reserve heavies threshold max_wait <<<"$run"
  sim_port=$(free_port)
  SIM_SPEED=20 target/release/vllm-sim serve /model --served-model-name "$model" --max-num-seqs 2 \
    --max-model-len 200000 --max-num-batched-tokens 1024 --long-prefill-token-threshold "$threshold" \
    --port "$sim_port" >"$work/sim.$label.log" 2>&1 &
  sim_pid=$!
  until curl -sf "http://127.0.0.1:$sim_port/health" >/dev/null; do
    kill -0 "$sim_pid" 2>/dev/null || { echo "vllm-sim exited:"; cat "$work/sim.$label.log"; exit 1; }
    sleep 0.1
  done
  port=$(free_port)
  PROFILE=deepseek-v4.1-flash SERVED_MODEL_NAME="$model" MAX_NUM_SEQS=2 INTERACTIVE_RESERVE="$reserve" \
    DEPLOY_DIR="$work" STORE_URL="$work/state.$label.sqlite" MAX_BODY_BYTES=67108864 \
    env ${max_wait:+LONG_MAX_WAIT_S=$max_wait} target/release/sparkgate serve --upstream "http://127.0.0.1:$sim_port" --port "$port" >"$work/gw.$label.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "sparkgate exited:"; cat "$work/gw.$label.log"; exit 1; }
    sleep 0.1
  done
  python3 tests/fairness/tokens.py "$port" "$model" "$seconds" "$label" "$heavies"
  kill -TERM "$pid" "$sim_pid"
  wait "$pid" "$sim_pid" || true
done
