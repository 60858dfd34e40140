#!/usr/bin/env bash
# The GPU test command (run it on the GPU machine): configure and build build/gpu with the sm90
# kernels, run every CTest test labelled `gpu`, then, when compute-sanitizer is installed, run
# a few small cases of the forward test under its memcheck, racecheck and synccheck tools, and
# the prepared-mask test under memcheck and synccheck.
#
#   MAGI_CUDA_KERNELS    all (default) | ci (bf16/D128 only: one CUDA translation unit)
#   MAGI_CUTLASS_DIR     CUTLASS include dir; else the configure fetches the pinned wheel's
#                        headers (MAGI_CUTLASS_WHEEL: a local wheel, for a machine without network)
#   CMAKE_PREFIX_PATH    where GTest (and nlohmann-json, else MAGI_JSON_WHEEL: its PyPI wheel)
#                        are found (that machine has no network: the caller provides them)
#   MAGI_GPU_BUILD_DIR   build directory (default build/gpu)
#   MAGI_GPU_CMAKE_ARGS  extra configure arguments (word-split)
#   MAGI_SANITIZE_FILTER gtest filter for memcheck and synccheck (default: 3 small cases)
#   MAGI_RACECHECK_FILTER gtest filter for racecheck (default: 2 small cases, one CTA among them)
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

# With Ninja, build just what tests/gpu defines (and what it links); else everything.
if grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt"; then
  cmake --build "$build" -j "$jobs" --target tests/gpu/all
else
  cmake --build "$build" -j "$jobs"
fi

nvidia-smi -L 2>/dev/null || echo "[gpu_test] nvidia-smi found no GPU: the gpu tests will skip"
status=0
(cd "$build" && ctest -L gpu --output-on-failure) || status=1

bin="$build/tests/gpu/sm90_forward_test"
filter=${MAGI_SANITIZE_FILTER:-Sm90Forward.RowsThatSeeNothing:Sm90Forward.NanAndInfInUnseenRowsDoNotLeak:Sm90Forward.OnePersistentCtaOnAUserStream}
# racecheck instruments every shared-memory access, so it gets small cases only: a full-grid
# case with idle CTAs spinning on their barriers (RowsThatSeeNothing) did not finish in 240 s on
# the H200; these two took seconds each (2026-11-30). The one-CTA case reuses Q and the rings
# across many items at D 64 and D 128.
race_filter=${MAGI_RACECHECK_FILTER:-Sm90Forward.NanAndInfInUnseenRowsDoNotLeak:Sm90Forward.OnePersistentCtaOnAUserStream}
sanitize_timeout=${MAGI_SANITIZE_TIMEOUT:-300}  # seconds per tool: a slow one fails, never hangs
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck synccheck racecheck; do
    [ "$tool" = racecheck ] && filter=$race_filter
    log="$build/sanitizer_$tool.log"
    rc=0
    timeout "$sanitize_timeout" compute-sanitizer --tool "$tool" --error-exitcode 99 "$bin" \
      --gtest_filter="$filter" >"$log" 2>&1 || rc=$?
    [ "$rc" -eq 124 ] && echo "[gpu_test] $tool timed out after ${sanitize_timeout} s" >>"$log"
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|timed out after' "$log" | tail -n 1 |
              sed 's/^=* *//' || true)
    tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | head -n 1 || true)
    echo "[gpu_test] $tool on $filter: ${summary:-no summary} | ${tests:-no gtest result}" \
         "| exit $rc (log $log)"
    [ "$rc" -eq 0 ] || status=1
  done
  # The prepared-mask tests (work lists resident on the device, CUDA graph capture and replay),
  # whole, under memcheck and synccheck.
  for tool in memcheck synccheck; do
    log="$build/sanitizer_prepared_$tool.log"
    rc=0
    timeout "$sanitize_timeout" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      "$build/tests/gpu/sm90_prepared_test" >"$log" 2>&1 || rc=$?
    echo "[gpu_test] $tool on sm90_prepared_test: $(grep -E 'ERROR SUMMARY' "$log" | tail -n 1 |
         sed 's/^=* *//') | exit $rc (log $log)"
    [ "$rc" -eq 0 ] || status=1
  done
else
  echo "[gpu_test] compute-sanitizer not found: memcheck, synccheck and racecheck skipped"
fi
exit "$status"
