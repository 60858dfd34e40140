"""Compiles MagiAttention's FFA forward kernels for one head dim (full and causal, bf16) by
calling them once: FFA JIT-compiles a configuration on its first call (about 3.5 minutes on
16 cores), so the benches start this in the background and time FFA after it
(bench/fwd_knob_ab.sh, bench/issue20_bar.sh).

    python3 bench/ffa_warm.py 64      # MagiAttention on PYTHONPATH (../shared/peer's env.sh)
"""
import sys
import time

import torch
from magi_attention.functional import flex_flash_attn_func as ffa

d, t = int(sys.argv[1]), time.time()
q, k, v = (torch.randn(2048, h, d, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
r = torch.tensor([[0, 2048]], dtype=torch.int32, device="cuda")
for ty in (0, 1):
    ffa(q, k, v, r, r, torch.tensor([ty], dtype=torch.int32, device="cuda"))
torch.cuda.synchronize()
print(f"FFA D {d} ready in {time.time() - t:.0f} s")
