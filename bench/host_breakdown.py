"""Host time of one magiattn forward call, piece by piece (2k causal, bf16, 32:8, D 128, CUDA
range tensors), next to cuDNN's SDPA and an empty torch launch on the same host:

    python3 bench/host_breakdown.py

Each line: perf_counter over 200 calls / 200 (no synchronisation inside the loop).
"""
import time, torch, magiattn
from magiattn import _C, functional, masks, torch_ops
n = 2048
g = torch.Generator().manual_seed(0)
q = torch.randn(n, 32, 128, generator=g).to(torch.bfloat16).cuda()
k = torch.randn(n, 8, 128, generator=g).to(torch.bfloat16).cuda()
v = torch.randn(n, 8, 128, generator=g).to(torch.bfloat16).cuda()
m = masks.causal(n, n)
qr, kr, tm = (torch.as_tensor(x, dtype=torch.int32).cuda() for x in (m.q_ranges(), m.k_ranges(), m.attn_type_map()))
def host(fn, n=200):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t
pm = functional.prepared_mask(n, n, qr, kr, tm)
out = torch.empty_like(q); lse = torch.empty(n, 32, device="cuda")
ws = torch.empty(_C.forward_workspace_bytes(n, 8), dtype=torch.uint8, device="cuda")
st = torch.cuda.current_stream().cuda_stream
cap = torch_ops._capsule
rows = {
 "full call": lambda: magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm),
 "_forward_impl": lambda: torch_ops._forward_impl(q, k, v, qr, kr, tm, None, "sh", None, 0.0, False, False, 0),
 "prepared_mask": lambda: functional.prepared_mask(n, n, qr, kr, tm),
 "_C.forward_prepared (tensors)": lambda: _C.forward_prepared(q, k, v, pm, out, lse, ws, None, None, None, 0.0, "sh", False, 0, st),
 "_C.forward_prepared (capsules)": lambda: _C.forward_prepared(cap(q), cap(k), cap(v), pm, cap(out), cap(lse), cap(ws), None, None, None, 0.0, "sh", False, 0, st),
 "5 capsules": lambda: (cap(q), cap(k), cap(v), cap(out), cap(lse)),
 "3 torch.empty": lambda: (torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(q.shape[:2], device=q.device), torch.empty(1000, dtype=torch.uint8, device=q.device)),
 "3 new_empty": lambda: (q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32), q.new_empty((1000,), dtype=torch.uint8)),
 "1 torch.empty": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
 "memset only (torch zero_ small)": lambda: ws.zero_(),
 "custom op": lambda: torch.ops.magiattn.ffa_forward(q, k, v, qr, kr, tm, None, "sh", None, 0.0, False, False, 0),
 "cudnn sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q.transpose(0,1).unsqueeze(0), k.transpose(0,1).unsqueeze(0), v.transpose(0,1).unsqueeze(0), is_causal=True, enable_gqa=True),
 "empty kernel launch (torch add)": lambda: q.add_(0),
}
rows["full call again"] = rows["full call"]  # the first row also pays any lazy first-use cost
qg = q.clone().requires_grad_(True)
rows["full call, q requires grad"] = lambda: magiattn.flex_flash_attn_func(qg, k, v, qr, kr, tm)
for name, fn in rows.items():
    try:
        print(f"{name:34s} {host(fn):8.1f} us")
    except Exception as e:
        print(name, "failed", e)
