"""Back-to-back forward calls with no synchronisation between them, as a training loop's
steady state runs them: IMPL (magiattn or ffa) on a full mask, bf16, Hq:Hkv 32:8, D 128 (or
the head dim given last).
Prints TFLOP/s over the whole run (3 warm-up calls first). bench/sustained_clock.sh samples the
SM clock and power meanwhile; docs/benchmarks.md ("Sustained back-to-back calls") has why.

    python3 bench/sustained_calls.py magiattn 16384 300 [64]
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import magiattn  # noqa: E402
from gpu_attention_bench import ffa_func  # noqa: E402


def main() -> int:
    impl, n, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    d = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to run")
        return 0
    hq, hkv = 32, 8
    q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    r = torch.tensor([[0, n]], dtype=torch.int32, device="cuda")
    t = torch.tensor([0], dtype=torch.int32, device="cuda")
    fn = magiattn.flex_flash_attn_func if impl == "magiattn" else ffa_func()
    if fn is None:
        sys.exit("MagiAttention's FFA is not importable (../shared/peer/README.md)")
    for _ in range(3):
        fn(q, k, v, r, r, t)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v, r, r, t)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"{impl} {n} D {d}: {4 * n * n * hq * d * calls / dt / 1e12:.1f} TFLOP/s over {dt:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
