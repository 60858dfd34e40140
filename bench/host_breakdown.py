"""Host time of one magiattn forward call, piece by piece, beside cuDNN's SDPA and an empty
torch launch on the same host (2k causal, bf16, Hq:Hkv 32:8, D 128, CUDA range tensors):

    python3 bench/host_breakdown.py

"full call" takes the C++ front (magiattn._torch) where the package has it, mask lookup
included (`_torch.call`); "Python front" rows force the Python per-call path for comparison.

Each line: perf_counter over 200 calls / 200, no synchronisation inside the loop (the GPU work
of a 2k causal call is shorter than its host time, so the queue never fills).
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import range_tensors  # noqa: E402

import magiattn  # noqa: E402
from magiattn import _C, functional, masks, torch_ops  # noqa: E402


def host_us(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return t


def main() -> None:
    n, hq, hkv, d = 2048, 32, 8, 128
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, d, generator=g).to(torch.bfloat16).cuda()
               for h in (hq, hkv, hkv))
    mask = masks.causal(n, n)
    qr, kr, tm = range_tensors(mask, "cuda")
    pm = functional.prepared_mask(n, n, qr, kr, tm)
    out, lse = torch.empty_like(q), torch.empty(n, hq, device="cuda")
    ws = torch.empty(_C.forward_workspace_bytes(n, hkv), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    cap = torch_ops._capsule
    qg = q.clone().requires_grad_(True)
    sdpa_in = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
    cpp = torch_ops._cpp

    def python_front(fn):  # the same call with the torch front's per-call path in Python
        def run():
            fast, torch_ops._cpp, functional._torch_fast = functional._torch_fast, None, None
            try:
                return fn()
            finally:
                torch_ops._cpp, functional._torch_fast = cpp, fast
        return run

    rows = {
        "full call": lambda: magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm),
        "full call, q requires grad": lambda: magiattn.flex_flash_attn_func(qg, k, v, qr, kr, tm),
        "full call, Python front": python_front(
            lambda: magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)),
        "full call, Python front, q grad": python_front(
            lambda: magiattn.flex_flash_attn_func(qg, k, v, qr, kr, tm)),
        "torch_ops path (mask lookup in Python)": lambda: torch_ops.flex_flash_attn_func(
            q, k, v, qr, kr, tm, None, "sh", None, 0.0, False, False, 0),
        "_torch.call (C++ lookup, no Python front)": (lambda: cpp.call(
            q, k, v, qr, kr, tm, None, "sh", None, 0.0, False, False, 0))
        if cpp is not None else (lambda: None),
        "_forward_impl": lambda: torch_ops._forward_impl(q, k, v, qr, kr, tm, None, "sh", None,
                                                         0.0, False, False, 0),
        "custom op (torch.compile's path)": lambda: torch.ops.magiattn.ffa_forward(
            q, k, v, qr, kr, tm, None, "sh", None, 0.0, False, False, 0),
        "_torch.forward (C++ front, no grad)": (lambda: cpp.forward(
            q, k, v, qr, kr, tm, pm, None, "sh", None, 0.0, False, False, 0, stream, False,
            False))
        if cpp is not None else (lambda: None),
        "prepared_mask (cache hit)": lambda: functional.prepared_mask(n, n, qr, kr, tm),
        "_C.forward_prepared, capsules": lambda: _C.forward_prepared(
            cap(q), cap(k), cap(v), pm, cap(out), cap(lse), cap(ws), None, None, None, 0.0, "sh",
            False, 0, stream),
        "5 capsules": lambda: (cap(q), cap(k), cap(v), cap(out), cap(lse)),
        "2 new_empty": lambda: (q.new_empty(q.shape), q.new_empty((n, hq), dtype=torch.float32)),
        "cudnn sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            *sdpa_in, is_causal=True, enable_gqa=True),
        "empty launch (torch add_)": lambda: q.add_(0),
    }
    rows["full call, again"] = rows["full call"]  # the first row also pays first-use costs
    for name, fn in rows.items():
        print(f"{name:34s} {host_us(fn):8.1f} us")


if __name__ == "__main__":
    main()
