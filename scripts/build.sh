#!/usr/bin/env bash
# Installs the Debian packages magiattn needs (only the missing ones; sudo only when not root)
# and builds one CMake preset (default: release). Parallel jobs are capped at one per 3 GB of
# RAM so that a small CI machine never runs out of memory while compiling the tests.
set -euo pipefail
preset=${1:-release}
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libgtest-dev libgmock-dev googletest libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libopenblas-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "[setup] installing: ${missing[*]}"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi

mem_gb=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
jobs=$(nproc)
[ $((mem_gb / 3)) -lt "$jobs" ] && jobs=$((mem_gb / 3))
[ "$jobs" -ge 1 ] || jobs=1

source scripts/cutlass.sh
cmake --preset "$preset" ${MAGI_CUTLASS_DIR:+-DMAGI_CUTLASS_DIR=$MAGI_CUTLASS_DIR} \
  -DMAGI_CUDA_KERNELS="$MAGI_CUDA_KERNELS"
cmake --build --preset "$preset" -j "$jobs"
