"""Host time of each call of a short loop, by position: is the first call after a synchronize
dearer than the rest, for magiattn, cuDNN SDPA and a one-element torch.add_ alike?

    python3 bench/first_call_host.py

Causal masks, bf16, Hq:Hkv 32:8, D 128, CUDA range tensors, at 128, 2k and 8k tokens. Each loop:
synchronize (and, for "busy start", a torch.cuda._sleep of ~30 ms queued so the GPU is busy for
the whole loop), then --calls calls each timed with perf_counter_ns. Printed per function: us
per call of call 1, calls 2-5, calls 6..N and the whole loop (the median over --reps loops,
the functions' loops interleaved), then a --long-calls loop's median and mean call.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import range_tensors  # noqa: E402

import magiattn  # noqa: E402
from magiattn import masks  # noqa: E402


def functions(seqlens) -> dict:
    fns = {}
    for n in seqlens:
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v = (torch.randn(n, h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for h in (32, 8, 8))
        m = masks.causal(n, n)
        r = range_tensors(m, "cuda")
        qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        fns[f"magiattn {n}"] = lambda q=q, k=k, v=v, r=r: magiattn.flex_flash_attn_func(q, k, v, *r)
        fns[f"cudnn {n}"] = lambda qt=qt, kt=kt, vt=vt: F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True, enable_gqa=True)
    one = torch.zeros(1, device="cuda")
    fns["torch.add_ (1 element)"] = lambda: one.add_(0)
    return fns


def loop(fn, calls: int, busy: bool) -> list:
    """us of each call of one loop."""
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(60_000_000)  # cycles: about 30 ms at the H200's clock
    times = []
    t = time.perf_counter_ns()
    for _ in range(calls):
        fn()
        t2 = time.perf_counter_ns()
        times.append((t2 - t) / 1e3)
        t = t2
    torch.cuda.synchronize()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[128, 2048, 8192])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--long-calls", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return
    fns = functions(args.seqlens)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for fn in fns.values():
            for _ in range(5):
                fn()
        torch.cuda.synchronize()
        n = args.calls
        for busy in (False, True):
            res = {name: [] for name in fns}
            for _ in range(args.reps):
                for name, fn in fns.items():
                    res[name].append(loop(fn, n, busy))
            print(f"== {n}-call loops, {'busy' if busy else 'idle'} start; us per call (median "
                  f"of {args.reps} loops)")
            print(f"{'':26s}{'call 1':>9}{'2-5':>9}{f'6-{n}':>9}{'loop':>9}")
            for name, loops in res.items():
                def med(a, b, loops=loops):
                    return statistics.median(sum(x[a:b]) / (b - a) for x in loops)
                print(f"{name:26s}{med(0, 1):9.1f}{med(1, 5):9.1f}{med(5, n):9.1f}{med(0, n):9.1f}")
        print(f"== {args.long_calls}-call loops, busy start; us per call")
        print(f"{'':26s}{'median':>9}{'mean':>9}")
        for name, fn in fns.items():
            t = loop(fn, args.long_calls, True)
            print(f"{name:26s}{statistics.median(t):9.1f}{sum(t) / len(t):9.1f}")


if __name__ == "__main__":
    main()
