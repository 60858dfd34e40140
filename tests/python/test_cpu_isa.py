"""The CPU backend's run-time choice (src/kernels/cpu/dispatch.cc): a portable build carries an
AVX-512 compilation beside its base one and runs it where the CPU has AVX-512, and portable and
native builds an AMX copy of the forward (bf16 in and out on AMX tiles) where the CPU and Linux
allow tiles; MAGI_CPU_ISA=base or =avx512 caps the choice (a native build has no AVX-512 copy:
there both mean its own). Both must compute the same attention (to rounding: their vectors differ in
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


def _run(tmp_path, isa, probe=PROBE):
    env = dict(os.environ)
    env.pop("MAGI_CPU_ISA", None)
    if isa:
        env["MAGI_CPU_ISA"] = isa
    path = tmp_path / f"{isa or 'default'}.npz"
    kernels = subprocess.run([sys.executable, "-c", probe, str(path)], env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout.strip()
    return kernels, np.load(path)


def _without_amx():
    """What MAGI_CPU_ISA=avx512 runs: the AVX-512 copy, or a native build's own."""
    return "base" if magiattn.info()["cpu_isa"].startswith("-march=native") else "avx512"


def test_the_report_names_the_kernels_that_run():
    assert magiattn.info()["cpu_kernels"].startswith(("base", "avx512", "amx"))


def test_both_compilations_compute_the_same_attention(tmp_path):
    if "AVX-512 variant built" not in magiattn.info()["cpu_kernels"] and \
            not magiattn.info()["cpu_kernels"].startswith(("avx512", "amx")):
        pytest.skip("this build has one CPU compilation (MAGI_CPU_ARCH native or x86-64-v4)")
    chosen, a = _run(tmp_path, None)
    forced, b = _run(tmp_path, "base")
    assert forced.startswith("base"), forced
    if not chosen.startswith(("avx512", "amx")):
        pytest.skip(f"this CPU has no AVX-512: the default is already the base one ({chosen})")
    for name in ("out", "dq", "dk", "dv"):
        scale = np.abs(b[name]).max()
        assert np.abs(a[name] - b[name]).max() <= 1e-5 * scale, name


# bf16 q, k, v and out: what the AMX copy runs on tiles (the rest goes to its fp32 path).
BF16_PROBE = r"""
import numpy as np, torch, magiattn
g = torch.Generator().manual_seed(2)
outs = {}
for name, n, hq, hkv, d in (("full", 1000, 8, 8, 128), ("causal", 333, 4, 2, 64),
                            ("docs", 301, 4, 1, 72)):
    mask = {"full": magiattn.full(n, n), "causal": magiattn.causal(n, n),
            "docs": magiattn.varlen_causal(np.array([0, 17, 150, n]))}[name]
    q = torch.randn(n, hq, d, generator=g).bfloat16()
    k, v = (torch.randn(n, hkv, d, generator=g).bfloat16() for _ in range(2))
    out, meta = magiattn.flex_flash_attn_func(q, k, v, mask.q_ranges(), mask.k_ranges(),
                                              mask.attn_type_map())
    outs[name], outs[name + "_lse"] = out.float().numpy(), meta.lse.numpy()
np.savez(__import__("sys").argv[1], **outs)
print(magiattn.info()["cpu_kernels"])
"""


def test_amx_and_avx512_agree_on_bf16(tmp_path):
    pytest.importorskip("torch", reason="the bf16 probe makes its inputs with torch")
    chosen, a = _run(tmp_path, None, BF16_PROBE)
    if not chosen.startswith("amx"):
        pytest.skip(f"no AMX copy runs here (no AMX-BF16 on this CPU, no kernel permission, "
                    f"or a build without it): {chosen}")
    forced, b = _run(tmp_path, "avx512", BF16_PROBE)
    assert forced.startswith(_without_amx()), forced
    for name in a.files:
        if name.endswith("_lse"):
            assert np.abs(a[name] - b[name]).max() <= 1e-5, name
        else:  # both round out to bf16 (2^-8 of the largest at worst, each), and the AMX
            # copy P (2^-8 of the largest |v|, far less once summed over hundreds of keys)
            assert np.abs(a[name] - b[name]).max() <= 2 ** -7 * np.abs(b[name]).max(), name


def test_forcing_each_compilation(tmp_path):
    kernels = magiattn.info()["cpu_kernels"]
    for isa in ("base", "avx512", "amx"):
        got, _ = _run(tmp_path, isa)
        if isa == "base":
            assert got.startswith("base"), got
        elif kernels.startswith(("avx512", "amx")):  # the widest copy runs unless capped
            assert got.startswith(_without_amx() if isa == "avx512" else ("avx512", "amx")), got


def test_an_unknown_isa_is_an_error_that_names_it(tmp_path):
    env = dict(os.environ, MAGI_CPU_ISA="avx9")
    r = subprocess.run([sys.executable, "-c", "import magiattn; magiattn.info()"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "MAGI_CPU_ISA=avx9" in r.stderr, r.stderr
