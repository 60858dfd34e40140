#!/usr/bin/env bash
# Ours and FFA in back-to-back calls (bench/sustained_calls.py), full mask, D 128 (or $HEAD_DIM;
# FFA compiles its D 64 kernel on the first call, minutes), at 16k (300 calls) and 64k (20
# calls), twice each, alternating, with nvidia-smi sampling the SM clock and power every 25 ms;
# prints TFLOP/s (and NVML's energy over the calls: bench/sustained_calls.py), the mean clock and
# power over the samples above 300 W (the busy ones; on Ampere and later power.draw is a
# one-second average, so it lags a 1.3 s run: compare powers by the energy instead), and
# how many busy samples had each clock event reason mask (clocks_event_reasons.active, or the
# older clocks_throttle_reasons.active: 0x1 idle, 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW
# thermal, 0x40 HW thermal, 0x80 HW power brake; 0x0 none), where the driver knows the field.
# Needs nvidia-smi, magiattn and MagiAttention's FFA on PYTHONPATH.
set -u
cd "$(dirname "$0")/.."
clk=$(mktemp)  # this run's samples (two runs at once would mix them in a fixed file)
trap 'rm -f "$clk"' EXIT
fields=clocks.sm,power.draw
for f in clocks_event_reasons.active clocks_throttle_reasons.active; do  # newer name first
  nvidia-smi --query-gpu=$fields,$f --format=csv,noheader >/dev/null 2>&1 && { fields=$fields,$f; break; }
done
for n in 16384 65536; do for impl in magiattn ffa magiattn ffa; do
  c=300; [ "$n" = 65536 ] && c=20
  nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms 25 > "$clk" &
  sampler=$!
  res=$(python3 bench/sustained_calls.py $impl $n $c "${HEAD_DIM:-128}" 2>&1 | tail -1)
  kill $sampler
  echo "$res | $(awk -F', *' '$2 > 300 {k++; c += $1; w += $2; if (NF > 2) r[$3]++}
    END {if (!k) {printf "no busy samples"; exit}
         printf "%d samples >300 W: %.0f MHz, %.0f W", k, c / k, w / k
         for (x in r) printf ", reasons %s: %d", x, r[x]}' "$clk")"
done; done
