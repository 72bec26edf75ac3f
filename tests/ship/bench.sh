#!/usr/bin/env bash
# Image shipping timings on one machine: the head is this machine's Docker daemon, the worker a
# second dockerd reached through sshd on 127.0.0.2 (as in tests/tests/prepare_ship.rs). Ships an
# image of SIZE_MIB of incompressible data by stream, by staged transfer, and once more (a no-op
# when the layers match), printing seconds and MiB/s for each.
#
# usage: bash tests/ship/bench.sh [SIZE_MIB]   (default 1024; needs root, dockerd, sshd, rsync)
set -euo pipefail
cd "$(dirname "$0")/../.."
size_mib=${1:-1024}
cargo build --release -q -p sparkgate-gateway --bin sparkgate
sg=$PWD/target/release/sparkgate
work=$(mktemp -d /tmp/sgb.XXXXXX)
image=sparkgate/ship-bench:$size_mib
cleanup() {
  docker -H "unix://$work/docker.sock" ps -aq 2>/dev/null | xargs -r docker -H "unix://$work/docker.sock" rm -f >/dev/null 2>&1 || true
  [ -f "$work/dockerd.pid" ] && kill "$(cat "$work/dockerd.pid")" 2>/dev/null || true
  [ -f "$work/sshd.pid" ] && kill "$(cat "$work/sshd.pid")" 2>/dev/null || true
  sleep 2
  rm -rf "$work" || true
}
trap cleanup EXIT

echo '{}' > "$work/daemon.json"
setsid dockerd --config-file "$work/daemon.json" --data-root "$work/data" --exec-root "$work/exec" \
  --pidfile "$work/dockerd.pid" -H "unix://$work/docker.sock" --bridge=none --iptables=false \
  --ip6tables=false >"$work/dockerd.log" 2>&1 &
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])')
mkdir -p /run/sshd
cat > "$work/sshd_config" <<CFG
Port $port
ListenAddress 127.0.0.2
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
PidFile $work/sshd.pid
# A login shell whose rc runs `pyenv rehash` waits 60 s on a stale lock (root's on these machines).
SetEnv PYENV_REHASH_TIMEOUT=0
CFG
/usr/sbin/sshd -f "$work/sshd_config"
for _ in $(seq 1 100); do docker -H "unix://$work/docker.sock" info >/dev/null 2>&1 && break; sleep 0.2; done

if ! docker image inspect "$image" >/dev/null 2>&1; then
  mkdir -p "$work/root"
  head -c "$((size_mib * 1024 * 1024))" /dev/urandom > "$work/root/blob"
  tar -C "$work/root" -c . | docker import - "$image" >/dev/null
  rm -rf "$work/root"
fi

export IMAGE=$image HEAD_IP=127.0.0.1 WORKER_IP=127.0.0.2 WORKER_USER=$(id -un) \
  WORKER_SSH_PORT=$port WORKER_SSH_KEY=$work/id SSH_KNOWN_HOSTS_FILE=$work/known_hosts \
  SSH_CONTROL_DIR=$work/c WORKER_DOCKER_SOCKET=$work/docker.sock IMAGE_SHIP_DIR=$work/head-ship \
  WORKER_IMAGE_SHIP_DIR=$work/worker-ship LOG_DIR=$work/logs SKIP_PULL=1
run() {
  local start end
  start=$(date +%s.%N)
  "$sg" --profile glm-5.3-flash ship "$@" > "$work/out" 2>&1 || { cat "$work/out"; exit 1; }
  end=$(date +%s.%N)
  python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); print(f'{sys.argv[3]:<28} {s:7.2f} s  {int(sys.argv[4])/s:8.1f} MiB/s')" "$start" "$end" "$*" "$size_mib"
  grep -E "^ship: " "$work/out" || true
  [ -n "${SHOW:-}" ] && cat "$work/out"
}
echo "image: $size_mib MiB of random data"
run --mode stream
docker -H "unix://$work/docker.sock" rmi -f "$image" >/dev/null
run --mode staged
run --mode auto
