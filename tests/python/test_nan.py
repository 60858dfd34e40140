"""NaN/inf through flex_flash_attn_func and its backward (docs/numerics.md): a row that reads a
NaN or inf (its q, the k/v of a key it sees) is NaN whole, out and lse; an element no row
reads changes nothing, bit for bit, forward and backward. On numpy, and on torch CPU tensors
(autograd) compared with torch SDPA run per row over exactly the keys the row sees, where
torch is installed."""

import numpy as np
import pytest

import magiattn
import oracle

NAN, INF = float("nan"), float("inf")
CAUSAL = 1


def ranges(slices):
    q = np.array([s[:2] for s in slices], dtype=np.int64)
    k = np.array([s[2:4] for s in slices], dtype=np.int64)
    t = np.array([s[4] for s in slices], dtype=np.int32)
    return q, k, t


def qkv(rng, n, hq=2, hkv=1, d=16, dtype=np.float32):
    return (rng.standard_normal((n, hq, d)).astype(dtype),
            rng.standard_normal((n, hkv, d)).astype(dtype),
            rng.standard_normal((n, hkv, d)).astype(dtype))


def fwd_bwd(q, k, v, slices, dout):
    qr, kr, tm = ranges(slices)
    out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, return_max_logits=True)
    grads = magiattn.flex_flash_attn_backward(dout, q, k, v, out, meta.lse, qr, kr, tm)
    return out, meta.lse, meta.max_logits, grads[:3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_key_row_of_the_issue(rng, dtype):
    # Causal 128, NaN in key row 5: rows 5..127 NaN (out and lse), rows 0..4 as without it.
    n = 128
    q, k, v = qkv(rng, n, dtype=dtype)
    dout = rng.standard_normal(q.shape).astype(dtype)
    slices = [(0, n, 0, n, CAUSAL)]
    out0, lse0, ml0, (dq0, _, _) = fwd_bwd(q, k, v, slices, dout)
    k[5] = NAN
    out, lse, ml, (dq, dk, dv) = fwd_bwd(q, k, v, slices, dout)
    assert np.isnan(out[5:]).all() and np.isnan(lse[5:]).all()
    np.testing.assert_array_equal(out[:5], out0[:5])
    np.testing.assert_array_equal(lse[:5], lse0[:5])
    assert np.isnan(ml).all() and np.isfinite(ml0).all()
    assert np.isnan(dq[5:]).all()
    np.testing.assert_array_equal(dq[:5], dq0[:5])
    assert np.isnan(dk).all() and np.isnan(dv).all()  # row 127 sees every key


@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_garbage_where_no_row_reads_changes_nothing(rng, value):
    # Two causal documents with a hole (rows and keys 70..79 in no slice), sizes off the
    # CPU tiles: garbage in the hole's q, k and v leaves every output and gradient bit-equal.
    n = 150
    slices = [(0, 70, 0, 70, CAUSAL), (80, n, 80, n, CAUSAL)]
    q, k, v = qkv(rng, n)
    dout = rng.standard_normal(q.shape).astype(np.float32)
    clean = fwd_bwd(q, k, v, slices, dout)
    for x in (q, k, v):
        x[70:80] = value
    dirty = fwd_bwd(q, k, v, slices, dout)
    for a, b in zip(clean[:3], dirty[:3]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(clean[3], dirty[3]):
        np.testing.assert_array_equal(a, b)
    assert np.isneginf(clean[1][70:80]).all() and (clean[0][70:80] == 0).all()


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_nan_rows_are_the_rows_that_read_it(rng, where, value):
    # One element of row 40 (q) or key 40 (k, v): NaN rows are exactly the rows that read it;
    # its tile neighbours that do not (rows 0..39 for a key) are unchanged.
    n, d = 100, 16
    slices = [(0, n, 0, n, CAUSAL)]
    q, k, v = qkv(rng, n, d=d, dtype=np.float64)
    dout = rng.standard_normal(q.shape)
    out0, lse0, _, _ = fwd_bwd(q, k, v, slices, dout)
    {"q": q, "k": k, "v": v}[where][40, 0, 3] = value
    out, lse, _, (dq, dk, dv) = fwd_bwd(q, k, v, slices, dout)
    dense = oracle.dense_from_slices(n, n, slices)
    reads = np.zeros((n, q.shape[1]), dtype=bool)
    if where == "q":
        reads[40, 0] = True
    else:
        reads[dense[:, 40], :] = True  # one kv head serves both q heads
    assert (np.isnan(lse) == reads).all()
    assert (np.isnan(out).all(axis=-1) == reads).all()
    np.testing.assert_array_equal(out[~reads], out0[~reads])
    assert (np.isnan(dq).any(axis=-1) == reads).all()


def test_torch_cpu_matches_sdpa_per_row(rng):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    n, hq, d = 96, 2, 16
    slices = [(0, 50, 0, 50, CAUSAL), (60, n, 60, n, CAUSAL)]
    dense = oracle.dense_from_slices(n, n, slices)
    q, k, v = (torch.from_numpy(x) for x in qkv(rng, n, hq=hq, hkv=hq, d=d))
    k[20, 1, 4] = NAN   # seen by rows 20..49 of head 1
    v[70, 0, 2] = INF   # seen by rows 70..95 of head 0
    q[30, 0, 0] = -INF  # row 30 of head 0
    k[55, :, :] = NAN   # a hole: no row reads it
    q.requires_grad_(True)
    qr, kr, tm = ranges(slices)
    out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    want_nan = np.zeros((n, hq), dtype=bool)
    for i in range(n):
        keys = np.nonzero(dense[i])[0]
        if len(keys) == 0:
            continue
        for h in range(hq):
            ref = F.scaled_dot_product_attention(q[i:i + 1, h][None], k[keys, h][None],
                                                 v[keys, h][None])
            want_nan[i, h] = not bool(torch.isfinite(ref).all())  # SDPA: inf or NaN
            if not want_nan[i, h]:
                torch.testing.assert_close(out[i, h].detach(), ref[0, 0].detach(),
                                           rtol=1e-5, atol=1e-5)
    got_nan = torch.isnan(meta.lse).numpy()
    assert (got_nan == want_nan).all(), np.argwhere(got_nan != want_nan)
    assert torch.isnan(out.detach()).all(dim=-1).numpy()[want_nan].all()
    out.backward(torch.ones_like(out))
    assert (torch.isnan(q.grad).any(dim=-1).numpy() == want_nan).all()
