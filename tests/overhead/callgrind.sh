#!/usr/bin/env bash
# Instructions the gateway executes per request, counted by callgrind (user space only; does not
# drift with the machine's load): vllm-sim (instant) behind `sparkgate serve --upstream`, driven
# by a keep-alive Python client (4 connections): after a warm-up, N requests counted, over N.
#
# usage: bash tests/overhead/callgrind.sh [N=2000] [stream]   (needs valgrind; release binaries)
#        CALLGRIND_KEEP=DIR keeps the callgrind files (callgrind_annotate DIR/cg.N) in DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-2000}"
stream="${2:-}"
bin="${SPARKGATE_BIN:-target/release/sparkgate}"
sim="target/release/vllm-sim"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${CALLGRIND_KEEP:-}" ] && cp -r "$work/." "$CALLGRIND_KEEP"; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sim_port=$(free_port)
SIM_SPEED=instant "$sim" serve /model --served-model-name DeepSeek-v4.1-Flash-EXL3 --max-num-seqs 20000 --port "$sim_port" >"$work/sim.log" 2>&1 &
sim_pid=$!
until curl -sf "http://127.0.0.1:$sim_port/health" >/dev/null; do
  kill -0 "$sim_pid" 2>/dev/null || { echo "vllm-sim exited:"; cat "$work/sim.log"; exit 1; }
  sleep 0.1
done
cat >"$work/load.py" <<'PY'
import http.client, json, sys, threading
n, port, stream = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "stream"
body = json.dumps({"model": "DeepSeek-v4.1-Flash-EXL3", "messages": [{"role": "user", "content": "Say hi"}],
                   "max_tokens": 16, "stream": stream, "chat_template_kwargs": {"enable_thinking": False}})
def worker(k):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(k):
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse(); r.read()
        assert r.status == 200, r.status
ts = [threading.Thread(target=worker, args=(n // 4,)) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
run() {
  local count=$1 port out
  port=$(free_port)
  out="$work/cg"
  # Counting starts after a warm-up of 500 requests: the process's start-up and its one-time
  # work (quanta's clock calibration, a loop whose length varies from process to process by
  # more than a thousand instructions a request at N=10000) stay out of the count.
  PROFILE=deepseek-v4.1-flash SERVED_MODEL_NAME=DeepSeek-v4.1-Flash-EXL3 MAX_NUM_SEQS=20000 QUEUE_DEPTH=20000 DEPLOY_DIR="$work" \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" serve --upstream "http://127.0.0.1:$sim_port" --port "$port" \
    >"$work/gw.log" 2>&1 &
  local pid=$!
  until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "sparkgate exited:" >&2; cat "$work/gw.log" >&2; exit 1; }
    sleep 0.2
  done
  python3 "$work/load.py" 500 "$port" "${stream:-whole}"
  callgrind_control -z "$pid" >/dev/null 2>&1
  python3 "$work/load.py" "$count" "$port" "${stream:-whole}"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill -TERM "$pid"
  wait "$pid" || true
  grep -m1 '^summary:' "$out.1" | awk '{print $2}'
}
total=$(run "$n")
echo "instructions per ${stream:-non-streaming} request: $(( total / n )) ($n requests after a warm-up: $total)"
