"""The mask cache of the torch front (functional.py): one PreparedMask per distinct mask, CPU
range tensors keyed by their bytes (an in-place write gives a new key), bounded, and correct
when more masks alternate than it holds. The CUDA side (range tensors recognised without a
device-to-host read, CUDA graphs) is test_gpu_percall.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import magiattn  # noqa: E402
from magiattn import _C, functional  # noqa: E402


def qkv(n, hq=2, hkv=1, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv))


def uncached(q, k, v, qr, kr, types):
    """The forward on a Mask built here, bypassing the cache."""
    mask = magiattn.Mask(q.shape[0], k.shape[0], qr.numpy(), kr.numpy(), types.numpy())
    out = np.empty(q.shape)
    lse = np.empty(q.shape[:2])
    _C.forward(q.numpy(), k.numpy(), v.numpy(), mask, out, lse)
    return torch.from_numpy(out), torch.from_numpy(lse)


def test_in_place_write_to_cpu_ranges_is_seen():
    magiattn.clear_mask_cache()
    q, k, v = qkv(64)
    qr = torch.tensor([[0, 64]], dtype=torch.int32)
    kr = torch.tensor([[0, 64]], dtype=torch.int32)
    tm = torch.tensor([1], dtype=torch.int32)
    out1, _ = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    qr[0, 1] = 40  # rows 40.. now see nothing
    tm[0] = 0      # and the rest is full
    out2, meta2 = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    want_out, want_lse = uncached(q, k, v, qr, kr, tm)
    assert torch.equal(out2, want_out) and torch.equal(meta2.lse, want_lse)
    assert not torch.equal(out1, out2)
    assert torch.isinf(meta2.lse[40:]).all()


def test_same_ranges_in_other_dtypes_share_one_mask():
    magiattn.clear_mask_cache()
    r32 = torch.tensor([[0, 8], [8, 16]], dtype=torch.int32)
    pm = functional.prepared_mask(16, 16, r32, r32, None)
    assert functional.prepared_mask(16, 16, r32.clone(), r32, None) is pm
    assert functional.prepared_mask(16, 16, r32.long(), r32.long(), None) is pm
    assert functional.prepared_mask(16, 16, r32.numpy(), [[0, 8], [8, 16]], None) is pm
    assert functional._cache_len() == 1
    assert pm.mask == magiattn.get_mask(16, 16, r32, r32)
    with torch.inference_mode():  # no version counter: still keyed by content
        inf = torch.tensor([[0, 8], [8, 16]], dtype=torch.int32)
    assert functional.prepared_mask(16, 16, inf, inf, None) is pm


def test_more_masks_than_the_cache_holds_stay_correct():
    magiattn.clear_mask_cache()
    n = 48
    q, k, v = qkv(n, seed=3)
    count = functional._CACHE_SIZE + 9
    ranges = [(torch.tensor([[0, 8 + i % 40]], dtype=torch.int32),
               torch.tensor([[i % 7, n]], dtype=torch.int32),
               torch.tensor([i % 4], dtype=torch.int32)) for i in range(count)]
    for _ in range(2):  # round robin: every call of the second pass misses
        for qr, kr, tm in ranges:
            out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
            want_out, want_lse = uncached(q, k, v, qr, kr, tm)
            assert torch.equal(out, want_out) and torch.equal(meta.lse, want_lse)
    assert functional._cache_len() == functional._CACHE_SIZE
    assert len(functional._by_bytes) <= functional._BY_TENSOR_SIZE


def test_float_ranges_are_an_error_naming_them():
    q, k, v = qkv(8)
    with pytest.raises(ValueError, match="q_ranges"):
        magiattn.flex_flash_attn_func(q, k, v, torch.tensor([[0.0, 8.0]]),
                                      torch.tensor([[0, 8]]))


def test_backward_rejects_a_workspace_on_cpu():
    q, k, v = (x.float() for x in qkv(16))
    pm = functional.prepared_mask(16, 16, [[0, 16]], [[0, 16]])
    out, lse = torch.zeros_like(q), torch.zeros(16, 2)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ws = torch.empty(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"workspace: only for CUDA calls \(q is on cpu\)"):
        _C.backward(q, q, k, v, out, lse, dq, dk, dv, pm, workspace=ws)


def test_forward_prepared_rejects_gpu_only_arguments_on_cpu():
    q, k, v = (x.float() for x in qkv(16))
    pm = functional.prepared_mask(16, 16, [[0, 16]], [[0, 16]])
    out, lse = torch.empty_like(q), torch.empty(16, 2)
    ws = torch.empty(64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"workspace: only for CUDA calls \(q is on cpu\)"):
        _C.forward_prepared(q, k, v, pm, out, lse, ws, None, None, None, 0.0, "sh", False, 0, 0)
    with pytest.raises(ValueError, match="device_ranges: 2 slices but the prepared mask has 1"):
        _C.forward_prepared(q, k, v, pm, out, lse, None, None, None, None, 0.0, "sh", False, 0,
                            0, (1, 1, 0, 4, 4, 2))
    with pytest.raises(ValueError, match=r"device_ranges: only for GPU calls \(q is on cpu\)"):
        _C.forward_prepared(q, k, v, pm, out, lse, None, None, None, None, 0.0, "sh", False, 0,
                            0, (1, 1, 0, 4, 4, 1))
