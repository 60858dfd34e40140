"""What one call puts on the GPU: each kernel's and memset's mean time per call, the span per
call and the idle time inside it, from a torch.profiler trace of a loop of back-to-back calls.

    python3 bench/percall_trace.py full:2048 sliding-window:8192      # mask:tokens ...
    python3 bench/percall_trace.py --calls 50 causal:4096

magiattn with the ranges as CUDA int32 tensors, and SDPA cuDNN on full and causal masks, on the
same inputs (bf16, Hq 32, Hkv 8, D 128). Where percall_bench.py says how fast a call is, this
says where its GPU time goes (the kernel, the NaN/inf row-flag pass, the workspace memset, the
gaps between them).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import SPEC_MASKS, build_mask, range_tensors  # noqa: E402

import magiattn  # noqa: E402

GPU_EVENTS = ("kernel", "gpu_memset", "gpu_memcpy")


def trace(call, calls: int) -> tuple[float, float, dict]:
    """(span us per call, busy us per call, {event name: us per call}) of `calls` calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("cat") in GPU_EVENTS]
    events.sort(key=lambda e: e["ts"])
    span = (events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"]) / calls
    per = collections.defaultdict(float)
    for e in events:
        per[e["name"][:48]] += e["dur"] / calls
    return span, sum(per.values()), dict(per)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("cases", nargs="+", metavar="MASK:TOKENS")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to trace")
        return 0
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for case in args.cases:
        name, _, tokens = case.partition(":")
        if name not in SPEC_MASKS or not tokens.isdigit():
            ap.error(f"{case!r}: expected MASK:TOKENS with MASK one of {', '.join(SPEC_MASKS)}")
        n = int(tokens)
        gen = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(n, 32, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(n, 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        mask = build_mask(name, n)
        flops = 4.0 * int(mask.area()) * 32 * 128
        ranges = range_tensors(mask, "cuda")
        cols = {"magiattn": (lambda: magiattn.flex_flash_attn_func(q, k, v, *ranges), None)}
        if name in ("full", "causal"):
            qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            cols["cudnn"] = (lambda: F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=name == "causal", enable_gqa=True),
                lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
        print(f"{name} {n}")
        for col, (call, ctx) in cols.items():
            if ctx is None:
                span, busy, per = trace(call, args.calls)
            else:
                with ctx():
                    span, busy, per = trace(call, args.calls)
            parts = "; ".join(f"{k} {t:.1f}" for k, t in sorted(per.items(), key=lambda kv: -kv[1]))
            print(f"  {col:<9} span {span:8.1f} us ({flops / span / 1e6:4.0f} TFLOP/s), busy "
                  f"{busy:8.1f}, idle {span - busy:5.1f} | {parts}")
        magiattn.clear_mask_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
