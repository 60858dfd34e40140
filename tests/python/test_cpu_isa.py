"""The CPU backend's run-time choice (src/kernels/cpu/dispatch.cc): a portable build carries an
AVX-512 compilation beside its base one and runs it where the CPU has AVX-512; MAGI_CPU_ISA=base
forces the base one. Both must compute the same attention (to rounding: their vectors differ in
width, so their sums differ in order)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import magiattn

PROBE = r"""
import numpy as np, magiattn
rng = np.random.default_rng(1)
mask = magiattn.varlen_causal(np.array([0, 70, 300, 333]))
q = rng.standard_normal((333, 4, 64)).astype(np.float32)
k = rng.standard_normal((333, 2, 64)).astype(np.float32)
v = rng.standard_normal((333, 2, 64)).astype(np.float32)
out, meta = magiattn.flex_flash_attn_func(q, k, v, mask.q_ranges(), mask.k_ranges(),
                                          mask.attn_type_map())
dq, dk, dv, _ = magiattn.flex_flash_attn_backward(np.ones_like(out), q, k, v, out, meta.lse,
                                                  mask=mask)
np.savez(__import__("sys").argv[1], out=out, dq=dq, dk=dk, dv=dv)
print(magiattn.info()["cpu_kernels"])
"""


def _run(tmp_path, isa):
    env = dict(os.environ)
    env.pop("MAGI_CPU_ISA", None)
    if isa:
        env["MAGI_CPU_ISA"] = isa
    path = tmp_path / f"{isa or 'default'}.npz"
    kernels = subprocess.run([sys.executable, "-c", PROBE, str(path)], env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout.strip()
    return kernels, np.load(path)


def test_the_report_names_the_kernels_that_run():
    assert magiattn.info()["cpu_kernels"].startswith(("base", "avx512"))


def test_both_compilations_compute_the_same_attention(tmp_path):
    if "AVX-512 variant built" not in magiattn.info()["cpu_kernels"] and \
            not magiattn.info()["cpu_kernels"].startswith("avx512"):
        pytest.skip("this build has one CPU compilation (MAGI_CPU_ARCH native or x86-64-v4)")
    chosen, a = _run(tmp_path, None)
    forced, b = _run(tmp_path, "base")
    assert forced.startswith("base"), forced
    if not chosen.startswith("avx512"):
        pytest.skip(f"this CPU has no AVX-512: the default is already the base one ({chosen})")
    for name in ("out", "dq", "dk", "dv"):
        scale = np.abs(b[name]).max()
        assert np.abs(a[name] - b[name]).max() <= 1e-5 * scale, name
