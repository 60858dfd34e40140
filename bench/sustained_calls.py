"""Back-to-back forward calls with no synchronisation between them, as a training loop's
steady state runs them: IMPL (magiattn or ffa) on a full mask, bf16, Hq:Hkv 32:8, D 128 (or
the head dim given last).
Prints TFLOP/s over the whole run (3 warm-up calls first) and, where the driver's NVML counts
it, the energy the GPU drew meanwhile (joules per PFLOP and mean watts).
bench/sustained_clock.sh samples the SM clock and power meanwhile; docs/benchmarks.md
("Sustained back-to-back calls") has why.

    python3 bench/sustained_calls.py magiattn 16384 300 [64]
"""
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import magiattn  # noqa: E402
from gpu_attention_bench import ffa_func  # noqa: E402


def energy_counter():
    """A function returning the GPU's total energy in joules (NVML), or None where NVML or its
    energy counter (Volta and later) is not there, or where NVML sees more than one GPU (its
    order need not be CUDA's, so which one the calls ran on would be a guess)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        handle, mj, count = ctypes.c_void_p(), ctypes.c_ulonglong(), ctypes.c_uint()
        if (nvml.nvmlInit_v2() or nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
                or count.value != 1
                or nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))):
            return None
        read = nvml.nvmlDeviceGetTotalEnergyConsumption
        if read(handle, ctypes.byref(mj)):
            return None
    except (OSError, AttributeError):
        return None

    def joules() -> float:  # NaN if a later read fails, not the last value again
        return float("nan") if read(handle, ctypes.byref(mj)) else mj.value / 1e3
    return joules


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
    joules = energy_counter()
    e0 = joules() if joules else 0.0
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(q, k, v, r, r, t)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    flops = 4 * n * n * hq * d * calls
    energy = ""
    if joules:
        e = joules() - e0
        energy = f", {e / (flops / 1e15):.1f} J/PFLOP, {e / dt:.0f} W"
    print(f"{impl} {n} D {d}: {flops / dt / 1e12:.1f} TFLOP/s over {dt:.2f} s{energy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
