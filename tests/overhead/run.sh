#!/usr/bin/env bash
# The gateway-overhead benchmark in one command: installs the peers (nginx from Debian; SGLang's
# gateway `smg` and the LiteLLM proxy from PyPI into a venv), builds the release binaries and
# runs tests/src/bin/overhead.rs against vllm-sim. Takes a few minutes; not part of .ci/run.
#
# usage: bash tests/overhead/run.sh [overhead options, e.g. --seconds 5 --streams 2000 --idle 9000]
set -euo pipefail
cd "$(dirname "$0")/../.."
peers="${OVERHEAD_PEERS:-$HOME/.cache/sparkgate-overhead}"
mkdir -p "$peers"

echo "== nginx (Debian package)"
if [ ! -x /usr/sbin/nginx ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1 \
    || apt-get install -y -qq --no-install-recommends nginx >/dev/null
fi
/usr/sbin/nginx -v

echo "== smg and litellm (PyPI, in $peers/venv)"
if [ ! -x "$peers/venv/bin/smg" ] || [ ! -x "$peers/venv/bin/litellm" ]; then
  python3 -m venv "$peers/venv"
  # litellm 1.80.0: the newest whose [proxy] extra installs on Python 3.11 (later ones need the
  # separate litellm-proxy package, published for Python >= 3.12 only).
  "$peers/venv/bin/pip" install --quiet --disable-pip-version-check "smg==1.13.0" "litellm[proxy]==1.80.0"
fi
"$peers/venv/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -E "^(smg|litellm) "

echo "== build"
cargo build --release --locked --bins
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target/overhead"
out="$target/overhead/overhead-$(date +%Y%m%d-%H%M%S).json"

echo "== run (open-files limit $(ulimit -n))"
"$target/release/overhead" --peers "$peers" --out "$out" "$@"
