#!/usr/bin/env bash
# Prefix affinity against round-robin: two simulated groups behind one gateway (GROUPS_FILE,
# RUNTIME=process, vllm-sim with its prefix cache), CONVERSATIONS conversations of TURNS turns
# with long system prompts replayed side by side under GROUP_ROUTING=affinity, then
# round-robin (and least-loaded); prints hit ratio and time to first token. Loopback only.
#
# Each group's KV cache holds CACHE_BLOCKS blocks of 16 tokens (`--num-gpu-blocks-override`,
# passed to vllm-sim through EXTRA_ARGS): a bounded cache, as on a Spark, instead of the
# simulator's default 1 M tokens that never evicts in a run this size.
#
# Environment: ROUTINGS, the routings to compare, each `routing` or `affinity:MS` for an
# AFFINITY_WAIT_MS other than the default (`affinity:0` takes any free group at once); RUNS, how many
# times the whole list runs, interleaved (so drift on the machine touches every routing alike);
# SEQS, each group's MAX_NUM_SEQS (the profile's default when unset: 2 for deepseek's dspark).
#
# usage: bash tests/affinity/run.sh [CONVERSATIONS=8] [TURNS=20] [SIM_SPEED=4] [CACHE_BLOCKS=1024]
set -euo pipefail
cd "$(dirname "$0")/../.."
conversations="${1:-8}" turns="${2:-20}" speed="${3:-4}" blocks="${4:-1024}"
cargo build --release --locked --bins >/dev/null
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=DeepSeek-v4.1-Flash-EXL3
echo "| routing | turns | prefix-cache hits | mean TTFT | p95 TTFT | wall |"
echo "|---|---|---|---|---|---|"
n=0
for run in $(seq "${RUNS:-1}"); do
for entry in ${ROUTINGS:-affinity affinity:0 round-robin least-loaded}; do
  routing="${entry%%:*}" hold=2000 label="$entry" n=$((n + 1))
  [ "$entry" != "$routing" ] && hold="${entry#*:}"
  [ "$routing" = affinity ] && label="affinity, wait ${hold} ms"
  printf '[a]\nVLLM_PORT=%s\nMASTER_PORT=%s\n[b]\nVLLM_PORT=%s\nMASTER_PORT=%s\n' \
    "$(free_port)" "$(free_port)" "$(free_port)" "$(free_port)" >"$work/groups.env"
  port=$(free_port)
  PROFILE=deepseek-v4.1-flash SERVED_MODEL_NAME="$model" RUNTIME=process VLLM_BIN="$PWD/target/release/vllm-sim" \
    HEAD_IP=127.0.0.1 WORKER_IP=127.0.0.1 BIND_ADDR=127.0.0.1 PORT="$port" LOG_DIR="$work/logs-$n" \
    GROUPS_FILE="$work/groups.env" GROUP_ROUTING="$routing" AFFINITY_WAIT_MS="$hold" WEIGHTS_GIB_PER_RANK= DEPLOY_DIR="$work" \
    RANK_ENV="SIM_SPEED=$speed,SIM_LOAD_SECONDS=0" EXTRA_ARGS="--num-gpu-blocks-override $blocks" \
    env ${SEQS:+MAX_NUM_SEQS=$SEQS} target/release/sparkgate serve >"$work/gw.$n.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "sparkgate exited:"; cat "$work/gw.$n.log"; exit 1; }
    sleep 0.2
  done
  # Both groups ready, not just the first.
  until [ "$(curl -sf "http://127.0.0.1:$port/admin/status" | python3 -c 'import json,sys; print(sum(g["open"] for g in json.load(sys.stdin)["groups"]))')" = 2 ]; do
    sleep 0.2
  done
  python3 tests/affinity/replay.py "$port" "$model" "$label (run $run)" "$conversations" "$turns"
  kill -TERM "$pid"
  wait "$pid" || true
done
done
