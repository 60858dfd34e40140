#!/usr/bin/env bash
# Ours and FFA in back-to-back calls (bench/sustained_calls.py), full mask, D 128 (or $HEAD_DIM;
# FFA compiles its D 64 kernel on the first call, minutes), at 16k (300 calls) and 64k (20
# calls), twice each, alternating, with nvidia-smi sampling the SM clock and power every 25 ms;
# prints TFLOP/s and the mean clock and power over the samples above 300 W (the busy ones).
# Needs nvidia-smi, magiattn and MagiAttention's FFA on PYTHONPATH.
set -u
cd "$(dirname "$0")/.."
clk=$(mktemp)  # this run's samples (two runs at once would mix them in a fixed file)
trap 'rm -f "$clk"' EXIT
for n in 16384 65536; do for impl in magiattn ffa magiattn ffa; do
  c=300; [ "$n" = 65536 ] && c=20
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 25 > "$clk" &
  sampler=$!
  res=$(python3 bench/sustained_calls.py $impl $n $c "${HEAD_DIM:-128}" 2>&1 | tail -1)
  kill $sampler
  echo "$res | $(awk -F, '$2 > 300 {k++; c += $1; w += $2} END {if (k) printf "%d samples >300 W: %.0f MHz, %.0f W", k, c / k, w / k; else printf "no busy samples"}' "$clk")"
done; done
