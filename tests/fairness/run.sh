#!/usr/bin/env bash
# The fair queue against FIFO: one client keeps 16 requests in flight, another sends one request
# every 2 s; the second client's queue wait, under QUEUE_POLICY=fair, then fifo, then fifo with
# SCHEDULING_POLICY=priority and the lone client's requests at `X-Vllm-Priority: -1`. vllm-sim
# is paced (SIM_SPEED) and MAX_NUM_SEQS is 4, so a queue forms. Loopback only.
#
# usage: bash tests/fairness/run.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-60}"
cargo build --release --locked --bins >/dev/null
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=DeepSeek-v4.1-Flash-EXL3
sim_port=$(free_port)
SIM_SPEED=4 target/release/vllm-sim serve /model --served-model-name "$model" --max-num-seqs 4 --port "$sim_port" >"$work/sim.log" 2>&1 &
sim_pid=$!
until curl -sf "http://127.0.0.1:$sim_port/health" >/dev/null; do
  kill -0 "$sim_pid" 2>/dev/null || { echo "vllm-sim exited:"; cat "$work/sim.log"; exit 1; }
  sleep 0.1
done
for policy in ${POLICIES:-fair fifo priority}; do
  port=$(free_port) queue="$policy" scheduling=fcfs
  [ "$policy" = priority ] && queue=fifo scheduling=priority
  PROFILE=deepseek-v4.1-flash SERVED_MODEL_NAME="$model" MAX_NUM_SEQS=4 QUEUE_POLICY="$queue" \
    SCHEDULING_POLICY="$scheduling" DEPLOY_DIR="$work" \
    target/release/sparkgate serve --upstream "http://127.0.0.1:$sim_port" --port "$port" >"$work/gw.$policy.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "sparkgate exited:"; cat "$work/gw.$policy.log"; exit 1; }
    sleep 0.1
  done
  python3 tests/fairness/load.py "$port" "$model" "$seconds" "$policy"
  kill -TERM "$pid"
  wait "$pid" || true
done
