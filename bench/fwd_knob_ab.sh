#!/usr/bin/env bash
# Same-run A/B of sm90 forward build knobs (docs/benchmarks.md, tenth session), on the GPU
# machine: each NAME=FLAGS argument is built as its own package (CMAKE_CUDA_FLAGS=FLAGS, the
# kernels of $KERNELS), checked against an fp32 torch reference (bench/knob_check.py), then
# benchmarked (bench/gpu_attention_bench.py $BENCH_ARGS); the first argument is the baseline
# and gets MagiAttention's FFA column (../shared/peer set up as .peer, its JIT for the head dim
# started at once in the background, its workspace saved to $OUT/ffa_ws.tgz). With PROFILE=1,
# ncu --set full of the baseline's and FFA's forward kernels on full 16k at the head dim. The
# device returns at most 8 files from $OUT: build logs and ncu pages go into $OUT/knob_ab.tgz.
#
#   KERNELS=bf16/64 bash bench/fwd_knob_ab.sh main= prefetch2=-DMAGI_FWD_PREFETCH=2
#
# FFA_WS names a saved FFA JIT workspace (an earlier run's $OUT/ffa_ws.tgz) to restore first.
# Offline: MAGI_CUTLASS_WHEEL, MAGI_JSON_WHEEL name the pinned wheels (cmake/wheel_headers.cmake).
set -uo pipefail
OUT=${OUT:-/tmp/out}; W=/tmp/knob_ab; mkdir -p "$OUT" "$W"
pack() {  # the logs and ncu pages, one file
  (cd "$W" && find . -maxdepth 1 -name '*.txt' -o -name '*.csv' | tar czf "$OUT/knob_ab.tgz" -T -)
}
KERNELS=${KERNELS:-bf16/64}
D=${HEAD_DIM:-64}
BENCH_ARGS=${BENCH_ARGS:---reps 5 --inner 3 --seqlens 16384 32768 65536 --masks full causal}
T0=$(date +%s); t() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
[ $# -ge 1 ] || { echo "usage: $0 NAME=FLAGS [NAME=FLAGS ...]" >&2; exit 2; }
JIT=
if [ -d .peer ]; then
  bash .peer/setup.sh > "$OUT/peer.txt" 2>&1 && . "${PEER_DIR:-/tmp/peer}/env.sh"
  # A saved workspace: no 3.5-minute JIT (the D 64 kernel was ready in 0 s, 2026-12-05).
  [ -n "${FFA_WS:-}" ] && tar xzf "$FFA_WS" -C "${PEER_DIR:-/tmp/peer}"
  python3 bench/ffa_warm.py "$D" > "$OUT/ffa_jit.txt" 2>&1 &
  JIT=$!
fi
names=(); pids=()
for arg in "$@"; do
  name=${arg%%=*}; flags=${arg#*=}; names+=("$name")
  python3 -m pip install -q --no-build-isolation --no-deps --target "$W/$name" \
    -Cbuild-dir="$W/build-$name" "-Ccmake.define.MAGI_CUDA_KERNELS=$KERNELS" \
    ${flags:+"-Ccmake.define.CMAKE_CUDA_FLAGS=$flags"} . > "$W/build_$name.txt" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || {
    echo "build ${names[$i]} failed:"; tail -20 "$W/build_${names[$i]}.txt"; pack; exit 1
  }
done
pack
t built
with() { local n=$1; shift; PYTHONPATH=$W/$n${PYTHONPATH:+:$PYTHONPATH} "$@"; }
run() {  # run NAME [--no-ffa]
  echo "== $1"
  with "$1" python3 bench/knob_check.py --head-dim "$D" || echo "CHECK FAILED: $1"
  # shellcheck disable=SC2086
  with "$1" python3 bench/gpu_attention_bench.py --no-flex "${@:2}" --head-dim "$D" $BENCH_ARGS
  t "$1"
}
# The candidates first (no FFA column: they run under FFA's JIT, which uses only the CPU).
for n in "${names[@]:1}"; do run "$n" --no-ffa; done
if [ -n "$JIT" ]; then
  wait "$JIT"; tail -1 "$OUT/ffa_jit.txt"
  (cd "${PEER_DIR:-/tmp/peer}" && tar czf "$OUT/ffa_ws.tgz" ws)
fi
run "${names[0]}"
if [ "${PROFILE:-0}" = 1 ]; then
  for impl in magiattn ffa; do
    k=ffa_fwd_kernel; [ "$impl" = ffa ] && k=device_kernel
    with "${names[0]}" ncu --set full --import-source no --clock-control none -k "regex:$k" \
      --launch-count 4 -f -o "$W/$impl" python3 bench/profile_one_call.py --impl "$impl" \
      --mask full --head-dim "$D" --seqlen 16384 > "$W/ncu_$impl.txt" 2>&1
    ncu --import "$W/$impl.ncu-rep" --page details > "$W/ncu_${impl}_details.txt" 2>&1
    ncu --import "$W/$impl.ncu-rep" --page raw --csv > "$W/ncu_${impl}_raw.csv" 2>&1
    ncu --import "$W/$impl.ncu-rep" --page source --csv --print-source sass \
      > "$W/ncu_${impl}_sass.csv" 2>&1
    grep -E "Duration|Elapsed Cycles|Registers Per|Executed Instructions  |Issue Slots Busy" \
      "$W/ncu_${impl}_details.txt" | head -20
    t "ncu $impl"
  done
  pack
fi
# The candidates again after the baseline (drift).
for n in "${names[@]:1}"; do run "$n" --no-ffa; done
