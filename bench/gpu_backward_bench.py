"""Backward on one GPU, side by side: magiattn (the sm90 backward; --deterministic adds its
deterministic mode) vs SDPA cuDNN, SDPA flash (FA2), FlexAttention and MagiAttention's FFA
(when `.peer` is set up: its README) on the same inputs. A column that fails says why.

    python3 bench/gpu_backward_bench.py                         # SPEC masks at 16k
    python3 bench/gpu_backward_bench.py --seqlens 8192 32768 --masks full causal --no-flex

Per column: forward alone and forward + backward through autograd (out.backward(dout)),
median of --reps timed loops of --inner calls (CUDA events, the columns' repetitions
interleaved: gpu_attention_bench.time_ms); backward time = the difference;
TFLOP/s with FLOPs = 4 * area * Hq * D forward, 2.5x that backward, 3.5x that for forward +
backward over its own time (SPEC §4).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import (SPEC_MASKS, build_mask, dense_ok, ffa_func,  # noqa: E402
                                 flex_runner, range_tensors, time_ms)

import magiattn  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[16384])
    ap.add_argument("--masks", nargs="+", default=SPEC_MASKS, choices=SPEC_MASKS)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--deterministic", action="store_true",
                    help="add a column of magiattn with deterministic=True")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hq, hkv, d = args.heads_q, args.heads_kv, args.head_dim
    ffa = ffa_func()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, Hq {hq}, Hkv {hkv}, "
          f"D {d}; TFLOP/s forward / backward / forward + backward; FFA {'in' if ffa else 'not available'}")
    for n in args.seqlens:
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
        dout = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for name in args.masks:
            mask = build_mask(name, n)
            flops = 4.0 * int(mask.area()) * hq * d
            ranges = range_tensors(mask, "cuda")
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            cols = {"magiattn": lambda: magiattn.flex_flash_attn_func(*leaves, *ranges)[0]}
            if args.deterministic:
                cols["magiattn det"] = lambda: magiattn.flex_flash_attn_func(
                    *leaves, *ranges, deterministic=True)[0]
            if ffa is not None:
                cols["FFA"] = lambda: ffa(*leaves, *ranges)[0]
            if dense_ok(name):
                qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in leaves)
                causal = name == "causal"

                for label, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION),
                                       ("FA2", SDPBackend.FLASH_ATTENTION)):
                    def sdpa(backend=backend):
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                               enable_gqa=hq != hkv)
                        return o[0].transpose(0, 1)
                    cols[label] = sdpa
            if not args.no_flex:
                try:
                    torch._dynamo.reset()
                    run = flex_runner(name, mask, *leaves, hq, hkv)
                    cols["Flex"] = lambda: run()[0].transpose(0, 1)
                except Exception as e:  # noqa: BLE001
                    print(f"  flex: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
            # Each column's forward and forward + backward, tried once (a failing column says
            # why and is dropped), then timed with the repetitions interleaved over all of them.
            fns, failed = {}, []
            for col, fwd in cols.items():
                fb = (lambda f=fwd: f().backward(dout))
                try:
                    fwd()
                    fb()
                except Exception as e:  # noqa: BLE001
                    failed.append(f"{col} - ({type(e).__name__}: {str(e)[:80]})")
                    continue
                fns[(col, "f")], fns[(col, "fb")] = fwd, fb
            t = time_ms(fns, args.reps, args.inner) if fns else {}
            for x in leaves:
                x.grad = None
            cells = [f"{col} {flops / t[(col, 'f')] / 1e9:.0f} / "
                     f"{2.5 * flops / max(t[(col, 'fb')] - t[(col, 'f')], 1e-6) / 1e9:.0f} / "
                     f"{3.5 * flops / t[(col, 'fb')] / 1e9:.0f}"
                     for col in cols if (col, "f") in t] + failed
            print(f"{name:<20}{n:>7} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
