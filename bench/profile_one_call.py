"""A few calls of one attention implementation, nothing else: the process to put under a profiler.

    ncu -k regex:ffa_bwd_kernel --launch-skip 1 --launch-count 1 \
        python3 bench/profile_one_call.py --impl magiattn --backward
    ncu -k regex:bprop --launch-skip 1 --launch-count 1 \
        python3 bench/profile_one_call.py --impl cudnn --backward
    ncu -k regex:device_kernel --launch-count 8 \
        python3 bench/profile_one_call.py --impl ffa          # MagiAttention's FFA (../shared/peer)

FFA's forward is CUTLASS's `device_kernel`, like a short preprocessing kernel of its own: of
the launches profiled, the long one is the attention.

bf16, Hq:Hkv 32:8 (GQA), any benchmark mask (bench_masks.build_mask; cuDNN only full and
causal), --calls forward (and backward) calls on the same inputs; magiattn and FFA get CUDA range
tensors, cuDNN SDPA the same q/k/v as [1, H, N, D] views.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import build_mask, dense_ok, ffa_func, range_tensors  # noqa: E402

import magiattn  # noqa: E402
from magiattn import masks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["magiattn", "ffa", "cudnn"], default="magiattn")
    ap.add_argument("--mask", choices=masks.family_names(), default="full")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args()
    if args.impl == "cudnn" and not dense_ok(args.mask):
        ap.error(f"--impl cudnn runs only the full and causal masks, not '{args.mask}'")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to run")
        return
    n, d, causal = args.seqlen, args.head_dim, args.mask == "causal"
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
               .requires_grad_(args.backward) for h in (32, 8, 8))
    dout = torch.randn(n, 32, d, device="cuda", dtype=torch.bfloat16, generator=g)
    m = build_mask(args.mask, n)
    r = range_tensors(m, "cuda")
    ffa = ffa_func() if args.impl == "ffa" else None
    if args.impl == "ffa" and ffa is None:
        sys.exit("MagiAttention's FFA is not importable (../shared/peer/README.md)")
    for _ in range(args.calls):
        if args.impl == "magiattn":
            out = magiattn.flex_flash_attn_func(q, k, v, *r)[0]
        elif args.impl == "ffa":
            out = ffa(q, k, v, *r)[0]
        else:
            qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                     enable_gqa=True)
            out = out.squeeze(0).transpose(0, 1)
        if args.backward:
            out.backward(dout)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
