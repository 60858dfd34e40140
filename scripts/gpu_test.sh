#!/usr/bin/env bash
# The GPU test command (run it on the GPU machine): configure and build build/gpu with the sm90
# kernels, run every CTest test labelled `gpu`, then, when compute-sanitizer is installed, run
# a few small cases of the forward and backward tests under its memcheck, synccheck and racecheck
# tools, and the prepared-mask test under memcheck and synccheck.
#
#   MAGI_CUDA_KERNELS    all (default) | ci (bf16/D128 only: one CUDA translation unit)
#   MAGI_CUTLASS_DIR     CUTLASS include dir; else the configure fetches the pinned wheel's
#                        headers (MAGI_CUTLASS_WHEEL: a local wheel, for a machine without network)
#   CMAKE_PREFIX_PATH    where GTest (and nlohmann-json, else MAGI_JSON_WHEEL: its PyPI wheel)
#                        are found (that machine has no network: the caller provides them)
#   MAGI_GPU_BUILD_DIR   build directory (default build/gpu)
#   MAGI_GPU_CMAKE_ARGS  extra configure arguments (word-split)
#   MAGI_SANITIZE_FILTER, MAGI_BWD_SANITIZE_FILTER  gtest filters for memcheck and synccheck
#                        of the forward and backward tests (default: 3 small cases each)
#   MAGI_RACECHECK_FILTER, MAGI_BWD_RACECHECK_FILTER  the same for racecheck (one-CTA cases)
#   MAGI_SANITIZE_TIMEOUT seconds per sanitizer run (default 300; a timeout counts as a failure)
# Exit status: non-zero when the build, a test or a sanitizer run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MAGI_GPU_BUILD_DIR:-build/gpu}
MAGI_CUDA_KERNELS=${MAGI_CUDA_KERNELS:-all}
source scripts/gpu_kernels.sh

# All cores, but at most one job per 6 GB of RAM: a CuTe translation unit takes gigabytes.
mem_gb=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
jobs=$(nproc)
[ $((mem_gb / 6)) -lt "$jobs" ] && jobs=$((mem_gb / 6))
[ "$jobs" -ge 1 ] || jobs=1

args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release
      -DMAGI_CUDA_KERNELS="${MAGI_CUDA_KERNELS:-all}"
      # Only the GPU tests are built here: no benches, command line or Python module to find
      # dependencies for.
      -DMAGI_BUILD_TESTS=ON -DMAGI_BUILD_BENCH=OFF -DMAGI_BUILD_APPS=OFF -DMAGI_BUILD_PYTHON=OFF)
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then args+=(-G Ninja); fi
[ -n "${MAGI_CUTLASS_DIR:-}" ] && args+=(-DMAGI_CUTLASS_DIR="$MAGI_CUTLASS_DIR")
# shellcheck disable=SC2206
[ -n "${MAGI_GPU_CMAKE_ARGS:-}" ] && args+=(${MAGI_GPU_CMAKE_ARGS})
echo "[gpu_test] configure $build (MAGI_CUDA_KERNELS=${MAGI_CUDA_KERNELS:-all}), $jobs jobs"
cmake "${args[@]}"
grep -q '^MAGI_ENABLE_CUDA:BOOL=ON' "$build/CMakeCache.txt" || {
  echo "[gpu_test] CUDA is not enabled in $build (no nvcc found?): nothing to test" >&2
  exit 1
}

# With Ninja, build just what tests/gpu and tests/dist define (and what they link: `ctest -L
# gpu` runs the distributed runtime's GPU cases too, where MPI is found); else everything.
if grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt"; then
  targets=(tests/gpu/all)
  [ -d "$build/tests/dist" ] && targets+=(tests/dist/all)
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$build" -j "$jobs"
fi

nvidia-smi -L 2>/dev/null || echo "[gpu_test] nvidia-smi found no GPU: the gpu tests will skip"
status=0
(cd "$build" && ctest -L gpu --output-on-failure) || status=1

# Small cases under compute-sanitizer. racecheck instruments every shared-memory access, so it
# gets one-CTA cases only: a full-grid case with idle CTAs spinning on their barriers
# (RowsThatSeeNothing) did not finish in 240 s on the H200; the one-CTA cases took seconds
# (2026-11-30). They reuse Q (forward), the rings and the dS / dQ staging buffers (backward)
# across many items, at D 64 and D 128.
fwd_filter=${MAGI_SANITIZE_FILTER:-Sm90Forward.RowsThatSeeNothing:Sm90Forward.NanAndInfInUnseenRowsDoNotLeak:Sm90Forward.OnePersistentCtaOnAUserStream}
fwd_race=${MAGI_RACECHECK_FILTER:-Sm90Forward.NanAndInfInUnseenRowsDoNotLeak:Sm90Forward.OnePersistentCtaOnAUserStream}
bwd_filter=${MAGI_BWD_SANITIZE_FILTER:-Sm90Backward.DenseMasksWithLengthsNotMultipleOfTheTiles:Sm90Backward.DeterministicIsBitwiseRepeatable:Sm90Backward.OneCtaOnAUserStream*:Sm90Backward.NanAndInfFollowTheRule}
bwd_race=${MAGI_BWD_RACECHECK_FILTER:-Sm90Backward.OneCtaOnAUserStreamD128}
sanitize_timeout=${MAGI_SANITIZE_TIMEOUT:-300}  # seconds per run: a slow one fails, never hangs

# sanitize TOOL BINARY [FILTER]: one compute-sanitizer run, a one-line summary, status=1 on error.
sanitize() {
  local tool=$1 bin=$2 filter=${3:-} rc=0
  local log="$build/sanitizer_$(basename "$bin")_$tool.log"
  local args=()
  [ -n "$filter" ] && args=(--gtest_filter="$filter")
  timeout "$sanitize_timeout" compute-sanitizer --tool "$tool" --error-exitcode 99 \
    "$build/tests/gpu/$bin" "${args[@]}" >"$log" 2>&1 || rc=$?
  [ "$rc" -eq 124 ] && echo "[gpu_test] $tool timed out after ${sanitize_timeout} s" >>"$log"
  local summary tests
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|timed out after' "$log" | tail -n 1 |
            sed 's/^=* *//' || true)
  tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | head -n 1 || true)
  echo "[gpu_test] $tool on $bin ${filter:-(all)}: ${summary:-no summary}" \
       "| ${tests:-no gtest result} | exit $rc (log $log)"
  [ "$rc" -eq 0 ] || status=1
}

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck synccheck; do
    sanitize "$tool" sm90_forward_test "$fwd_filter"
    sanitize "$tool" sm90_backward_test "$bwd_filter"
    # The prepared-mask tests (work lists resident on the device, CUDA graph capture), whole.
    sanitize "$tool" sm90_prepared_test
  done
  sanitize racecheck sm90_forward_test "$fwd_race"
  sanitize racecheck sm90_backward_test "$bwd_race"
else
  echo "[gpu_test] compute-sanitizer not found: memcheck, synccheck and racecheck skipped"
fi
exit "$status"
