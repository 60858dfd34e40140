"""The CPU backend against the CPU attention users already have: magiattn's forward (and
backward) next to torch's CPU scaled_dot_product_attention, same process, same inputs.

    python3 bench/cpu_sdpa_bench.py                      # full and causal, 4k tokens, fp32, bf16
    python3 bench/cpu_sdpa_bench.py --seqlen 2048 --dtypes fp32 --backward

Heads 8 (MHA), D 128, batch 1, torch.get_num_threads() threads for both (torch's default: the
machine's cores). Median of --reps calls after a warm-up; GFLOP/s over the visible cells
(4 * area * H * D forward, 2.5x that backward), the ratio magiattn / torch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import magiattn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="also time forward + backward")
    args = ap.parse_args(argv)
    n, h, d = args.seqlen, args.heads, args.head_dim
    print(f"# {magiattn.info()['cpu_isa']}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; S {n}, H {h}, D {d}; median of {args.reps}")
    print(f"{'mask':<8}{'dtype':<6}{'pass':<9}{'magiattn GFLOP/s':>18}{'torch SDPA':>12}"
          f"{'ratio':>8}")
    g = torch.Generator().manual_seed(0)
    for name in args.masks:
        mask = magiattn.causal(n, n) if name == "causal" else magiattn.full(n, n)
        area = int(mask.area())
        ranges = (mask.q_ranges(), mask.k_ranges(), mask.attn_type_map())
        for dt in args.dtypes:
            dtype = DTYPES[dt]
            q, k, v = (torch.randn(n, h, d, generator=g).to(dtype) for _ in range(3))
            qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, S, D]
            passes = [("forward", False)] + ([("fwd+bwd", True)] if args.backward else [])
            for label, grad in passes:
                def ours():
                    qq, kk, vv = (x.detach().requires_grad_(grad) for x in (q, k, v))
                    out, _ = magiattn.flex_flash_attn_func(qq, kk, vv, *ranges)
                    if grad:
                        out.sum().backward()

                def theirs():
                    qq, kk, vv = (x.detach().requires_grad_(grad) for x in (qt, kt, vt))
                    out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=name == "causal")
                    if grad:
                        out.sum().backward()

                with torch.inference_mode(not grad):
                    t_ours, t_theirs = median_s(ours, args.reps), median_s(theirs, args.reps)
                flops = 4.0 * area * h * d * (3.5 if grad else 1.0)
                a, b = flops / t_ours / 1e9, flops / t_theirs / 1e9
                print(f"{name:<8}{dt:<6}{label:<9}{a:18.1f}{b:12.1f}{a / b:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
