#!/usr/bin/env bash
# Installs the Debian packages magiattn needs (only the missing ones; sudo only when not root)
# and builds one CMake preset. `release` is the one build that setup.sh and test.sh share: pip
# (scikit-build-core, without build isolation) configures and builds build/release and
# installs the Python package from it, so the C++ core is compiled once for the CLI, the tests
# and the module. MAGI_BUILD_TESTS=ON adds the tests and benches to that build. Any other
# preset (asan, debug) is a plain `cmake --preset`. Parallel jobs: one per 3 GB of RAM, so a
# small CI machine never runs out of memory compiling the tests or a CuTe kernel.
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

source scripts/python_env.sh  # $python; CMAKE_BUILD_PARALLEL_LEVEL (one job per 3 GB)
source scripts/gpu_kernels.sh # MAGI_CUDA_KERNELS
echo "[build] $preset: sm90 kernels ${MAGI_CUDA_KERNELS}"
if [ "$preset" != release ]; then
  cmake --preset "$preset" ${MAGI_CUTLASS_DIR:+-DMAGI_CUTLASS_DIR=$MAGI_CUTLASS_DIR} \
    -DMAGI_CUDA_KERNELS="$MAGI_CUDA_KERNELS"
  cmake --build --preset "$preset" -j "$CMAKE_BUILD_PARALLEL_LEVEL"
  exit 0
fi

# torch before the build: the package's magiattn._torch (the torch front's per-call path in
# C++) is compiled against the torch it finds here.
source scripts/torch_env.sh
tests=${MAGI_BUILD_TESTS:-OFF}
# The build backend and nanobind go into the target Python itself (no isolated build env), so
# the paths build/release caches stay valid for the next incremental build.
$python -m pip install -q "scikit-build-core>=0.10" "nanobind>=3.0" numpy
# The presets use CMake's default generator; build/release must keep one generator whoever
# configured it first (a `cmake --preset release` or this script).
export CMAKE_GENERATOR="Unix Makefiles"
defines=(-Cbuild-dir=build/release
         -Ccmake.define.MAGI_BUILD_APPS=ON
         -Ccmake.define.MAGI_BUILD_TESTS="$tests"
         -Ccmake.define.MAGI_BUILD_BENCH="$tests"
         -Ccmake.define.MAGI_CUDA_KERNELS="$MAGI_CUDA_KERNELS"
         -Ccmake.define.MAGI_WGMMA_GUARD="${MAGI_WGMMA_GUARD:-warn}"
         # Built where it runs: for this CPU (a plain pip install is portable, pyproject.toml).
         -Ccmake.define.MAGI_CPU_ARCH="${MAGI_CPU_ARCH:-native}")
[ -n "${MAGI_CUTLASS_DIR:-}" ] && defines+=(-Ccmake.define.MAGI_CUTLASS_DIR="$MAGI_CUTLASS_DIR")
$python -m pip install -q --no-build-isolation "${defines[@]}" .
echo "[build] build/release: magiattn CLI in build/release/bin; Python package" \
     "$($python -c 'import magiattn; print(magiattn.__file__)')"
