"""The CUDA path from Python: torch CUDA tensors through DLPack to the sm90 forward, on torch's
current stream. Compared with the CPU backend on the same bf16 inputs (fp32 compute there), to
the bf16 rounding of the output. Skipped without a CUDA device or a module built without the
GPU kernels (the C++ GPU tests, tests/gpu, check the kernel itself against the fp64 oracle)."""

import pytest

torch = pytest.importorskip("torch")

import magiattn  # noqa: E402
from magiattn import masks  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def _run(q, k, v, mask, **kw):
    qr, kr, types = masks.mask_to_ranges(mask)
    return magiattn.flex_flash_attn_func(q, k, v, q_ranges=qr, k_ranges=kr, attn_type_map=types,
                                         **kw)


@pytest.fixture(scope="module")
def gpu_built():
    q = torch.zeros(8, 1, 128, device="cuda", dtype=torch.bfloat16)
    try:
        _run(q, q, q, masks.causal(8, 8))
    except ValueError as e:
        if "built without CUDA" in str(e):
            pytest.skip(str(e))
        raise


@pytest.mark.parametrize("name", ["causal", "varlen-causal", "sliding-window", "block-sparse"])
def test_matches_cpu_backend(gpu_built, name):
    n, hq, hkv, d = 2048, 8, 2, 128
    mask = masks.build_family(name, n, seed=1)
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, h, d, generator=gen).to(torch.bfloat16) for h in (hq, hkv, hkv))
    out_gpu, meta_gpu = _run(q.cuda(), k.cuda(), v.cuda(), mask, return_max_logits=True)
    out_cpu, meta_cpu = _run(q.float(), k.float(), v.float(), mask, return_max_logits=True)
    assert out_gpu.dtype == torch.bfloat16 and out_gpu.is_cuda
    err = (out_gpu.float().cpu() - out_cpu).abs().max().item()
    assert err <= 2e-2 * out_cpu.abs().max().item(), f"{name}: out error {err}"
    lse_gpu, lse_cpu = meta_gpu.lse.cpu(), meta_cpu.lse
    assert torch.equal(torch.isinf(lse_gpu), torch.isinf(lse_cpu))
    fin = torch.isfinite(lse_cpu)
    assert (lse_gpu[fin] - lse_cpu[fin]).abs().max().item() < 1e-4
    assert (meta_gpu.max_logits.cpu() - meta_cpu.max_logits).abs().max().item() < 1e-4


def test_runs_on_the_current_stream(gpu_built):
    n = 4096
    q = torch.randn(n, 4, 128, device="cuda", dtype=torch.bfloat16)
    mask = masks.causal(n, n)
    ref, _ = _run(q, q, q, mask)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, _ = _run(q, q, q, mask)  # queued on `side`, not on the default stream
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, ref)


def test_backward_says_it_is_not_built(gpu_built):
    q = torch.randn(64, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = _run(q, q, q, masks.causal(64, 64))
    with pytest.raises(ValueError, match="GPU backward is not built yet"):
        out.sum().backward()
