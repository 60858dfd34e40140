"""The torch path: autograd gradients against torch's own SDPA (fp64, dense boolean mask) and,
with sink and softcap, against a dense torch fp64 autograd reference, both to 1e-10; custom-op
checks, torch.compile (fullgraph, aot_eager), gradcheck. Skipped without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import magiattn  # noqa: E402
import oracle  # noqa: E402
from conftest import FULL, SEED, seed_note  # noqa: E402

TOL = 1e-10


def rel(a, b, floor=1.0):
    """max |a - b| / max(max |b|, floor); see oracle.rel_err for the floor."""
    a, b = a.detach().double(), b.detach().double()
    assert a.shape == b.shape
    assert torch.equal(torch.isfinite(a), torch.isfinite(b)), "inf/nan positions differ"
    fin = torch.isfinite(b)
    if not fin.any():
        return 0.0
    return float((a[fin] - b[fin]).abs().max() / b[fin].abs().max().clamp_min(floor))


def leaf(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x)).to(dtype).clone().requires_grad_(True)


def random_problem(rng, sq, sk, hq, hkv, d):
    slices = oracle.random_slices(rng, sq, sk)
    q = rng.standard_normal((sq, hq, d))
    k = rng.standard_normal((sk, hkv, d))
    v = rng.standard_normal((sk, hkv, d))
    qr = torch.tensor([s[:2] for s in slices], dtype=torch.int32)
    kr = torch.tensor([s[2:4] for s in slices], dtype=torch.int32)
    tm = torch.tensor([s[4] for s in slices], dtype=torch.int32)
    return slices, (q, k, v), (qr, kr, tm)


def sdpa_reference(q, k, v, dense, rows):
    """SDPA over the rows that see at least one key (SDPA gives NaN on the others)."""
    qs = q[rows].permute(1, 0, 2)[None]
    ks, vs = k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None]
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=torch.as_tensor(dense[rows]),
                                       enable_gqa=True)
    return o[0].permute(1, 0, 2)


def dense_reference(q, k, v, dense, sink=None, sink_layout="sh", softcap=0.0, scale=None):
    """softmax over [scores, sink] with tanh softcap, fp64 autograd; empty rows give 0/-inf."""
    nq, hq, d = q.shape
    group = hq // k.shape[1]
    scale = d ** -0.5 if scale is None else scale
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    raw = torch.einsum("qhd,khd->hqk", q, kr) * scale
    s = softcap * torch.tanh(raw / softcap) if softcap else raw
    vis = torch.as_tensor(dense)[None].expand_as(s)
    s = s.masked_fill(~vis, float("-inf"))
    if sink is not None:
        srow = (sink.T[:, None, :].expand(hq, nq, sink.shape[0]) if sink_layout == "sh"
                else sink.permute(2, 0, 1))
        s = torch.cat([s, srow], dim=-1)
        vis = torch.cat([vis, torch.ones_like(srow, dtype=torch.bool)], dim=-1)
    empty = ~vis.any(dim=-1)  # [H, Nq]
    lse = torch.logsumexp(s.masked_fill(empty[..., None], 0.0), dim=-1)
    lse = lse.masked_fill(empty, float("-inf"))
    p = torch.exp(s - lse.masked_fill(empty, 0.0)[..., None]).masked_fill(~vis, 0.0)
    out = torch.einsum("hqk,khd->qhd", p[..., :k.shape[0]], vr)
    max_logits = raw.masked_fill(~torch.as_tensor(dense)[None], float("-inf")).amax(dim=(1, 2))
    return out, lse.T, max_logits


@pytest.mark.parametrize("sq,sk,hq,hkv", [(24, 40, 4, 2), (33, 33, 3, 3), (40, 19, 4, 1)],
                         ids=["sq<sk-gqa", "sq=sk-mha", "sq>sk-mqa"])
def test_autograd_vs_sdpa(rng, sq, sk, hq, hkv):
    for trial in range(6 if FULL else 3):
        slices, (q, k, v), ranges = random_problem(rng, sq, sk, hq, hkv, 16)
        dense = oracle.dense_from_slices(sq, sk, slices)
        rows = dense.any(axis=1)
        w = torch.as_tensor(rng.standard_normal((sq, hq, 16)))
        ours = [leaf(x) for x in (q, k, v)]
        out, meta = magiattn.flex_flash_attn_func(*ours, *ranges)
        (out * w).sum().backward()
        ref = [leaf(x) for x in (q, k, v)]
        out_ref = sdpa_reference(*ref, dense, rows)
        (out_ref * w[rows]).sum().backward()
        note = f"trial {trial} slices {slices}; {seed_note()}"
        assert out.dtype == torch.float64 and meta.lse.dtype == torch.float64
        assert not meta.lse.requires_grad and meta.max_logits is None
        assert rel(out[rows], out_ref) <= TOL, note
        assert torch.all(out[~rows] == 0), note
        assert torch.all(meta.lse[~rows] == float("-inf")), note
        for name, a, b in zip("qkv", ours, ref):
            assert rel(a.grad, b.grad) <= TOL, f"d{name}: {note}"
        assert torch.all(ours[0].grad[~rows] == 0), note


def judge(which, ours, ref, q, k, v, dense, sink, sink_layout, softcap):
    """On a failure, the numpy oracle's word on which side moved (out: which=0, lse: 1): a
    mismatch between two fp64 computations does not say which of them is off by itself."""
    third = torch.as_tensor(oracle.forward(q, k, v, dense, softcap=softcap, sink=sink,
                                           sink_layout=sink_layout or "sh")[which])
    return f"; against the numpy oracle: ours {rel(ours, third):.3g}, torch {rel(ref, third):.3g}"


@pytest.mark.parametrize("sink_layout,softcap", [("sh", 0.0), ("ssh", 0.0), (None, 2.0),
                                                 ("sh", 1.5), ("ssh", 3.0)])
def test_sink_softcap_vs_dense_reference(rng, sink_layout, softcap):
    sq, sk, hq, hkv, d = 30, 26, 4, 2, 8
    for trial in range(4 if FULL else 2):
        slices, (q, k, v), ranges = random_problem(rng, sq, sk, hq, hkv, d)
        dense = oracle.dense_from_slices(sq, sk, slices)
        sink_np = None
        if sink_layout:
            sink_np = rng.standard_normal((3, hq) if sink_layout == "sh" else (sq, 3, hq))
        w = torch.as_tensor(rng.standard_normal((sq, hq, d)))
        ours = [leaf(x) for x in (q, k, v)] + ([leaf(sink_np)] if sink_layout else [])
        ref = [leaf(x) for x in (q, k, v)] + ([leaf(sink_np)] if sink_layout else [])
        out, meta = magiattn.flex_flash_attn_func(
            *ours[:3], *ranges, sink=ours[3] if sink_layout else None,
            sink_layout=sink_layout or "sh", softcap=softcap, return_max_logits=True)
        out_ref, lse_ref, ml_ref = dense_reference(
            *ref[:3], dense, ref[3] if sink_layout else None, sink_layout or "sh", softcap)
        (out * w).sum().backward()
        (out_ref * w).sum().backward()
        note = f"trial {trial} slices {slices}; {seed_note()}"
        assert rel(out, out_ref) <= TOL, note + judge(0, out, out_ref, q, k, v, dense, sink_np,
                                                       sink_layout, softcap)
        assert rel(meta.lse, lse_ref) <= TOL, note + judge(1, meta.lse, lse_ref, q, k, v, dense,
                                                           sink_np, sink_layout, softcap)
        assert rel(meta.max_logits, ml_ref) <= TOL, note
        for name, a, b in zip(["q", "k", "v", "sink"], ours, ref):
            assert a.grad.shape == b.grad.shape and a.grad.dtype == b.grad.dtype
            assert rel(a.grad, b.grad) <= TOL, f"d{name}: {note}"


def test_numpy_and_torch_paths_agree_bitwise(rng):
    slices, (q, k, v), (qr, kr, tm) = random_problem(rng, 20, 20, 2, 2, 8)
    out_np, meta_np = magiattn.flex_flash_attn_func(q, k, v, qr.numpy(), kr.numpy(), tm.numpy())
    out_t, meta_t = magiattn.flex_flash_attn_func(*(torch.as_tensor(x) for x in (q, k, v)),
                                                  qr, kr, tm)
    assert np.array_equal(out_np, out_t.numpy()) and np.array_equal(meta_np.lse, meta_t.lse.numpy())
    dout = rng.standard_normal(out_np.shape)
    g_np = magiattn.flex_flash_attn_backward(dout, q, k, v, out_np, meta_np.lse, qr.numpy(),
                                             kr.numpy(), tm.numpy())
    g_t = magiattn.flex_flash_attn_backward(torch.as_tensor(dout), *(torch.as_tensor(x) for x in
                                            (q, k, v)), out_t, meta_t.lse, qr, kr, tm)
    assert g_t[3] is None
    for a, b in zip(g_np[:3], g_t[:3]):
        assert np.array_equal(a, b.numpy())


def test_low_precision_dtypes(rng):
    slices, (q, k, v), ranges = random_problem(rng, 32, 32, 4, 2, 16)
    dense = oracle.dense_from_slices(32, 32, slices)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)):
        xs = [leaf(x, dtype) for x in (q, k, v)]
        out, meta = magiattn.flex_flash_attn_func(*xs, *ranges)
        assert out.dtype == dtype and meta.lse.dtype == torch.float32
        out.float().sum().backward()
        assert all(x.grad.dtype == dtype for x in xs)
        rounded = [x.detach().double().numpy() for x in xs]
        ref_out, ref_lse, _, _ = oracle.forward(*rounded, dense)
        assert oracle.rel_err(out.double().detach().numpy(), ref_out) <= tol, dtype
        assert oracle.rel_err(meta.lse.double().numpy(), ref_lse) <= tol, dtype


def test_expanded_grad_and_strided_inputs(rng):
    qkv = torch.as_tensor(rng.standard_normal((24, 3, 2, 8))).requires_grad_(True)
    q, k, v = qkv.unbind(1)  # strided views, unit last dim
    out, _ = magiattn.flex_flash_attn_func(q, k, v, [[0, 24]], [[0, 24]], [1])
    out.sum().backward()  # dout is an expanded scalar (all strides 0)
    ref = qkv.detach().clone().requires_grad_(True)
    dense = np.tril(np.ones((24, 24), bool))
    o2 = sdpa_reference(*ref.unbind(1), dense, np.ones(24, bool))
    o2.sum().backward()
    assert rel(qkv.grad, ref.grad) <= TOL
    with pytest.raises(ValueError, match="q: last-dim stride"):
        wide = torch.randn(24, 2, 16, dtype=torch.float64)
        magiattn.flex_flash_attn_func(wide[..., ::2], k, v, [[0, 24]], [[0, 24]])


def test_errors_name_the_culprit():
    q = torch.randn(8, 4, 8, dtype=torch.float64)
    kv = torch.randn(8, 2, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"slices 0 .* and 1 .* both cover"):
        magiattn.flex_flash_attn_func(q, kv, kv, [[0, 8], [0, 8]], [[0, 4], [2, 6]])
    with pytest.raises(ValueError, match="^k: expected 3 dims"):
        magiattn.flex_flash_attn_func(q, kv[0], kv, [[0, 8]], [[0, 8]])
    with pytest.raises(ValueError, match="q_ranges: expected an integer tensor"):
        magiattn.flex_flash_attn_func(q, kv, kv, torch.zeros(1, 2), [[0, 8]])
    with pytest.raises(ValueError, match="head dim 12"):
        magiattn.flex_flash_attn_func(q[..., :6].repeat(1, 1, 2), kv[..., :6].repeat(1, 1, 2),
                                      kv[..., :6].repeat(1, 1, 2), [[0, 8]], [[0, 8]])


def test_gradcheck_tiny():
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(6, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(5, 1, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(5, 1, 8, dtype=torch.float64, generator=g, requires_grad=True)
    sink = torch.randn(2, 2, dtype=torch.float64, generator=g, requires_grad=True)
    qr = torch.tensor([[0, 4], [2, 6]])
    kr = torch.tensor([[0, 3], [3, 5]])
    tm = torch.tensor([1, 3])

    def f(q, k, v, sink):
        return magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, sink=sink, softcap=1.5)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, sink))


def test_opcheck():
    opcheck = getattr(torch.library, "opcheck", None)
    if opcheck is None:
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(10, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(12, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(12, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    sink = torch.randn(2, 4, dtype=torch.float64, generator=g, requires_grad=True)
    qr, kr, tm = torch.tensor([[0, 10]]), torch.tensor([[0, 12]]), torch.tensor([1])
    opcheck(torch.ops.magiattn.ffa_forward.default,
            (q, k, v, qr, kr, tm, sink, "sh", None, 0.0, False, True))
    opcheck(torch.ops.magiattn.ffa_forward.default,
            (q, k, v, qr, kr, None, None, "sh", 0.5, 2.0, True, False))
    out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, sink=sink)
    opcheck(torch.ops.magiattn.ffa_backward.default,
            (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), meta.lse,
             qr, kr, tm, sink.detach(), "sh", None, 0.0, False))


def test_torch_compile_fullgraph(rng):
    slices, (q, k, v), (qr, kr, tm) = random_problem(rng, 24, 24, 4, 2, 8)
    sink_np = rng.standard_normal((2, 4))

    def step(q, k, v, sink):
        out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, sink=sink, softcap=2.0,
                                                  return_max_logits=True)
        return (out * out).sum(), meta.lse, meta.max_logits

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (step, compiled):
        xs = [leaf(x) for x in (q, k, v, sink_np)]
        loss, lse, ml = fn(*xs)
        loss.backward()
        results.append((loss, lse, ml, *(x.grad for x in xs)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_autograd_explicit_backward_matches(rng):
    slices, (q, k, v), ranges = random_problem(rng, 16, 20, 2, 1, 8)
    xs = [leaf(x) for x in (q, k, v)]
    sink = leaf(rng.standard_normal((16, 1, 2)))
    out, meta = magiattn.flex_flash_attn_func(*xs, *ranges, sink=sink, sink_layout="ssh")
    dout = torch.as_tensor(rng.standard_normal(out.shape))
    out.backward(dout)
    dq, dk, dv, dsink = magiattn.flex_flash_attn_backward(
        dout, *(x.detach() for x in xs), out.detach(), meta.lse, *ranges, sink=sink.detach(),
        sink_layout="ssh")
    for a, b in zip((dq, dk, dv, dsink), (*(x.grad for x in xs), sink.grad)):
        assert torch.equal(a, b)
