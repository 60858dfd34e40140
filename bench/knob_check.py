"""A quick check of a build on the GPU (bench/fwd_knob_ab.sh): magiattn's forward against an
fp32 torch reference of the same bf16 inputs on full, causal, two causal documents and softcap,
with a length that is no tile multiple. Exit status 1 when an error exceeds 2e-2 (bf16 output:
~4e-3 is rounding). The GPU tests (tests/gpu, scripts/gpu_test.sh) are the real suite."""
import argparse
import math
import sys

import torch

import magiattn


def reference(q, k, v, q_ranges, k_ranges, causal, softcap):
    n, hq, d = q.shape
    group = hq // k.shape[1]
    out = torch.zeros(n, hq, d, device=q.device)
    for (q0, q1), (k0, k1), c in zip(q_ranges, k_ranges, causal):
        qq = q[q0:q1].float().transpose(0, 1)
        kk, vv = (x[k0:k1].float().repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))
        s = qq @ kk.transpose(1, 2) / math.sqrt(d)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if c:  # bottom-right aligned (docs/semantics.md): key j sees row i when j - nk <= i - nq
            i = torch.arange(q1 - q0, device=q.device)[:, None]
            j = torch.arange(k1 - k0, device=q.device)[None]
            s = s.masked_fill(j - (k1 - k0) > i - (q1 - q0), float("-inf"))
        out[q0:q1] = (torch.softmax(s, -1) @ vv).transpose(0, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=3001)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    torch.manual_seed(0)
    n, d = args.tokens, args.head_dim
    q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
    cases = {
        "full": ([(0, n)], [(0, n)], [0], 0.0),
        "causal": ([(0, n)], [(0, n)], [1], 0.0),
        "documents": ([(0, n // 3), (n // 3, n)], [(0, n // 3), (n // 3, n)], [1, 1], 0.0),
        "softcap": ([(0, n)], [(0, n)], [0], 20.0),
    }
    worst = 0.0
    for name, (qr, kr, types, cap) in cases.items():
        as_t = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
        out = magiattn.flex_flash_attn_func(q, k, v, as_t(qr), as_t(kr), as_t(types),
                                            softcap=cap)[0].float()
        err = (out - reference(q, k, v, qr, kr, types, cap)).abs().max().item()
        worst = max(worst, err)
        print(f"knob_check D {d} {name}: max abs error {err:.3e}")
    ok = worst < 2e-2
    print(f"knob_check D {d}: {'OK' if ok else 'FAILED'} (worst {worst:.3e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
