#!/usr/bin/env bash
# Every cell of issue 20's bar in one device call, on the GPU machine (docs/benchmarks.md):
# D 64 full/causal and D 128 every SPEC §4 mask against MagiAttention's FFA, D 192 and D 256
# full/causal against cuDNN, 16k-64k, bf16, Hq:Hkv 32:8, one process per head dim; then
# FlexAttention in a last pass. The package is built here (bf16/64;128;192;256) with pip
# --target. FFA's D 64 kernel JIT-compiles on first use (about 3.5 minutes on 16 cores): it starts
# at once in the background, D 192/256 run meanwhile (no FFA column), and its workspace is saved
# to $OUT/ffa_ws.tgz; FFA_WS names such a file to restore instead.
#
#   MAGI_CUTLASS_WHEEL=... MAGI_JSON_WHEEL=... bash bench/issue20_bar.sh     # .peer set up first
#
#   REPS, INNER   timing repetitions (default 5 x 3 calls)
#   NO_FLEX=1     skip the FlexAttention pass (it compiles per mask, about a minute)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; W=${BAR_DIR:-/tmp/bar}; mkdir -p "$OUT" "$W"
PEER=${PEER_DIR:-/tmp/peer}
T0=$(date +%s); t() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
[ -d .peer ] || { echo "no .peer: cp -r ../shared/peer .peer and carry it" >&2; exit 2; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
bash .peer/setup.sh > "$OUT/peer.txt" 2>&1 || { cat "$OUT/peer.txt"; exit 1; }
. "$PEER/env.sh"
[ -n "${FFA_WS:-}" ] && tar xzf "$FFA_WS" -C "$PEER"
python3 bench/ffa_warm.py 64 > "$OUT/ffa_jit.txt" 2>&1 &
JIT=$!
python3 -m pip install -q --no-build-isolation --no-deps --target "$W/pkg" -Cbuild-dir="$W/build" \
  "-Ccmake.define.MAGI_CUDA_KERNELS=bf16/64;bf16/128;bf16/192;bf16/256" . > "$W/build.txt" 2>&1 ||
  { tail -30 "$W/build.txt"; exit 1; }
export PYTHONPATH=$W/pkg:$PYTHONPATH
t "package built"
B="python3 bench/gpu_attention_bench.py --reps ${REPS:-5} --inner ${INNER:-3} --seqlens 16384 32768 65536"
for d in 192 256; do $B --no-flex --no-ffa --masks full causal --head-dim $d; t "D $d"; done
wait "$JIT"; tail -1 "$OUT/ffa_jit.txt"
[ -n "${FFA_WS:-}" ] || (cd "$PEER" && tar czf "$OUT/ffa_ws.tgz" ws)
t "FFA D 64 ready"
$B --no-flex; t "D 128"
$B --no-flex --masks full causal --head-dim 64; t "D 64"
if [ "${NO_FLEX:-0}" != 1 ]; then
  python3 bench/gpu_attention_bench.py --reps "${REPS:-5}" --inner "${INNER:-3}" \
    --seqlens 16384 65536 --no-ffa --masks full causal varlen-causal sliding-window shared-prefix
  t "Flex"
fi
