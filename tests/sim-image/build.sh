#!/usr/bin/env bash
# Builds the simulator image sparkgate/vllm-sim:<version> on a Docker daemon that has no images
# and no registry: the vllm-sim binary plus the shared libraries it links, imported as a root
# filesystem. `vllm` in the image is vllm-sim, so a rank container runs the launch plan's
# `vllm serve …` argv unchanged.
#
# usage: tests/sim-image/build.sh [VLLM_SIM_BINARY] [TAG]
#   VLLM_SIM_BINARY  default: target/release/vllm-sim (built if missing)
#   TAG              default: sparkgate/vllm-sim:<workspace version>
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
bin=${1:-target/release/vllm-sim}
tag=${2:-sparkgate/vllm-sim:$version}
if [ ! -x "$bin" ]; then
  cargo build --release -p sparkgate-tests --bin vllm-sim
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -D -m 755 "$bin" "$root/usr/local/bin/vllm-sim"
ln -s vllm-sim "$root/usr/local/bin/vllm"
# The dynamic loader and every library the binary links, at the same paths.
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  install -D "$lib" "$root$lib"
done
mkdir -p "$root/tmp" "$root/etc"
chmod 1777 "$root/tmp"
echo 'root:x:0:0:root:/root:/bin/false' > "$root/etc/passwd"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'ENTRYPOINT ["vllm"]' \
  --change "LABEL org.opencontainers.image.title=vllm-sim org.opencontainers.image.version=$version" \
  - "$tag" >/dev/null
echo "$tag"
