"""flex_flash_attn_func / flex_flash_attn_backward on numpy arrays against the fp64 oracle:
every slice type with sq < sk, sq == sk and sq > sk, overlapping q ranges, empty rows, GQA,
softcap, both sink layouts, max logits; then dtypes, strides, the mask cache and bad input."""

import numpy as np
import pytest

import magiattn
import oracle
from conftest import FULL, seed_note

# docs/semantics.md §5 asks 1e-12 for the kernel; the oracle's einsum order costs a little.
TOL64 = 1e-11


def make_qkv(rng, sq, sk, hq, hkv, d, dtype=np.float64):
    q = rng.standard_normal((sq, hq, d))
    k = rng.standard_normal((sk, hkv, d))
    v = rng.standard_normal((sk, hkv, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def make_sink(rng, layout, sq, hq, s=2, dtype=np.float64):
    if layout is None:
        return None
    shape = (s, hq) if layout == "sh" else (sq, s, hq)
    return rng.standard_normal(shape).astype(dtype)


def ranges_of(slices):
    q = np.array([s[:2] for s in slices], dtype=np.int64).reshape(-1, 2)
    k = np.array([s[2:4] for s in slices], dtype=np.int64).reshape(-1, 2)
    t = np.array([s[4] for s in slices], dtype=np.int32)
    return q, k, t


def check_case(rng, sq, sk, hq, hkv, d, slices, softcap=0.0, sink_layout=None, scale=None,
               tol=TOL64):
    q, k, v = make_qkv(rng, sq, sk, hq, hkv, d)
    sink = make_sink(rng, sink_layout, sq, hq)
    layout = sink_layout or "sh"
    qr, kr, tm = ranges_of(slices)
    out, meta = magiattn.flex_flash_attn_func(
        q, k, v, qr, kr, tm, sink=sink, sink_layout=layout, softmax_scale=scale,
        softcap=softcap, return_max_logits=True)
    dense = oracle.dense_from_slices(sq, sk, slices)
    ref_out, ref_lse, ref_ml, aux = oracle.forward(q, k, v, dense, scale, softcap, sink, layout)
    note = f"slices {slices} softcap {softcap} sink {sink_layout}; {seed_note()}"
    assert out.dtype == np.float64 and meta.lse.dtype == np.float64, note
    assert oracle.rel_err(out, ref_out) <= tol, note
    assert oracle.rel_err(meta.lse, ref_lse) <= tol, note
    assert oracle.rel_err(meta.max_logits, ref_ml) <= tol, note
    dout = rng.standard_normal(out.shape)
    dq, dk, dv, dsink = magiattn.flex_flash_attn_backward(
        dout, q, k, v, out, meta.lse, qr, kr, tm, sink=sink, sink_layout=layout,
        softmax_scale=scale, softcap=softcap)
    rdq, rdk, rdv, rdsink = oracle.backward(dout, q, k, v, ref_out, aux, sink, layout)
    for name, a, b in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert oracle.rel_err(a, b) <= tol, f"{name}: {note}"
    if sink is not None:
        assert dsink.shape == sink.shape and dsink.dtype == sink.dtype
        assert oracle.rel_err(dsink, rdsink) <= tol, f"dsink: {note}"
    else:
        assert dsink is None
    empty = ~dense.any(axis=1)
    assert np.all(out[empty] == 0), note
    assert np.all(dq[empty] == 0), note
    if sink is None:
        assert np.all(meta.lse[empty] == -np.inf), note
    return dense


# ---- hand-picked cases ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", [0, 1, 2, 3], ids=["full", "causal", "inv_causal", "bi_causal"])
@pytest.mark.parametrize("sq,sk", [(13, 29), (24, 24), (29, 13)], ids=["sq<sk", "sq=sk", "sq>sk"])
def test_single_slice_each_type(rng, kind, sq, sk):
    check_case(rng, sq, sk, 4, 2, 16, [(0, sq, 0, sk, kind)])


@pytest.mark.parametrize("sink_layout", [None, "sh", "ssh"])
@pytest.mark.parametrize("softcap", [0.0, 2.5])
@pytest.mark.parametrize("sq,sk", [(21, 40), (33, 33), (40, 21)], ids=["sq<sk", "sq=sk", "sq>sk"])
def test_random_masks_options(rng, sq, sk, softcap, sink_layout):
    slices = oracle.random_slices(rng, sq, sk)
    check_case(rng, sq, sk, 6, 2, 8, slices, softcap=softcap, sink_layout=sink_layout)


def test_overlapping_q_ranges_document_plus_global_tokens(rng):
    # Rows [8, 20) see their own document causally and the 4 global tokens at [0, 4).
    slices = [(0, 8, 0, 8, 1), (8, 20, 8, 20, 1), (8, 20, 0, 4, 0), (14, 20, 4, 8, 3)]
    check_case(rng, 20, 20, 4, 4, 8, slices)


def test_empty_rows_and_empty_mask(rng):
    # Rows [5, 9) and the first 3 rows of the sq > sk causal slice see nothing.
    check_case(rng, 16, 12, 2, 1, 8, [(0, 5, 0, 12, 0), (9, 16, 0, 4, 1)], sink_layout="sh")
    check_case(rng, 16, 12, 2, 1, 8, [(0, 5, 0, 12, 0), (9, 16, 0, 4, 1)])
    q, k, v = make_qkv(rng, 6, 5, 2, 2, 8)
    out, meta = magiattn.flex_flash_attn_func(q, k, v, np.zeros((0, 2), int), np.zeros((0, 2), int),
                                              return_max_logits=True)
    assert np.all(out == 0) and np.all(meta.lse == -np.inf) and np.all(meta.max_logits == -np.inf)


def test_empty_rows_with_sink_give_sink_lse(rng):
    q, k, v = make_qkv(rng, 8, 8, 3, 3, 8)
    sink = rng.standard_normal((2, 3))
    out, meta = magiattn.flex_flash_attn_func(q, k, v, [[0, 4]], [[0, 8]], sink=sink)
    lse_sink = np.log(np.exp(sink).sum(axis=0))
    assert np.all(out[4:] == 0)
    np.testing.assert_allclose(meta.lse[4:], np.broadcast_to(lse_sink, (4, 3)), rtol=1e-14)


def test_outputs_overwritten_not_accumulated(rng):
    # The low-level forward must write every element, including empty rows.
    q, k, v = make_qkv(rng, 10, 10, 2, 2, 8)
    mask = magiattn.Mask(10, 10, [[0, 5]], [[0, 10]], None)
    out = np.full(q.shape, np.nan)
    lse = np.full(q.shape[:2], np.nan)
    magiattn.forward(q, k, v, mask, out, lse)
    assert np.all(out[5:] == 0) and np.all(lse[5:] == -np.inf) and np.isfinite(out).all()


def test_softmax_scale_and_gqa_mqa(rng):
    slices = [(0, 20, 0, 30, 1)]
    check_case(rng, 20, 30, 8, 1, 16, slices, scale=0.37)           # MQA
    check_case(rng, 20, 30, 6, 3, 24, slices, softcap=1.5, scale=2)  # GQA, D = 24


def test_random_sweep(rng):
    n = 60 if FULL else 16
    for _ in range(n):
        sq, sk = (int(x) for x in rng.integers(1, 70, size=2))
        hkv = int(rng.choice([1, 2, 3]))
        hq = hkv * int(rng.choice([1, 2, 4]))
        d = int(rng.choice([8, 16, 32]))
        slices = oracle.random_slices(rng, sq, sk) if min(sq, sk) > 1 else [(0, sq, 0, sk, 0)]
        check_case(rng, sq, sk, hq, hkv, d, slices, softcap=float(rng.choice([0.0, 3.0])),
                   sink_layout=rng.choice([None, "sh", "ssh"]),
                   scale=None if rng.random() < 0.5 else float(rng.uniform(0.05, 1.0)))


# ---- dtypes, strides, options ----------------------------------------------------------------
def test_float32_and_float16_inputs(rng):
    slices = [(0, 24, 0, 24, 1), (24, 40, 10, 40, 3)]
    qr, kr, tm = ranges_of(slices)
    dense = oracle.dense_from_slices(40, 40, slices)
    q, k, v = make_qkv(rng, 40, 40, 4, 2, 32)
    ref_out, ref_lse, _, _ = oracle.forward(q, k, v, dense)
    for dtype, tol in ((np.float32, 2e-5), (np.float16, 3e-3)):
        out, meta = magiattn.flex_flash_attn_func(q.astype(dtype), k.astype(dtype),
                                                  v.astype(dtype), qr, kr, tm)
        assert out.dtype == dtype and meta.lse.dtype == np.float32
        qd, kd, vd = (x.astype(dtype).astype(np.float64) for x in (q, k, v))
        r_out, r_lse, _, _ = oracle.forward(qd, kd, vd, dense)  # same rounded inputs
        assert oracle.rel_err(out, r_out) <= tol
        assert oracle.rel_err(meta.lse, r_lse) <= tol
    assert ref_out.shape == out.shape and ref_lse.shape == meta.lse.shape


def test_strided_inputs_match_contiguous(rng):
    qkv = rng.standard_normal((30, 3, 4, 16))  # packed projections: [N, 3, H, D]
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.flags.c_contiguous
    ranges = ([[0, 30]], [[0, 30]], [1])
    out, meta = magiattn.flex_flash_attn_func(q, k, v, *ranges)
    out_c, meta_c = magiattn.flex_flash_attn_func(*(np.ascontiguousarray(x) for x in (q, k, v)),
                                                  *ranges)
    np.testing.assert_array_equal(out, out_c)
    np.testing.assert_array_equal(meta.lse, meta_c.lse)
    dout = rng.standard_normal((30, 2, 4, 16))[:, 1]
    grads = magiattn.flex_flash_attn_backward(dout, q, k, v, out, meta.lse, *ranges)
    grads_c = magiattn.flex_flash_attn_backward(np.ascontiguousarray(dout), q, k, v, out,
                                                meta.lse, *ranges)
    for a, b in zip(grads[:3], grads_c[:3]):
        np.testing.assert_array_equal(a, b)


def test_deterministic_is_bitwise_repeatable(rng):
    q, k, v = make_qkv(rng, 64, 64, 4, 2, 16)
    args = (q, k, v, [[0, 64], [0, 32]], [[0, 32], [32, 64]], [0, 2])
    out1, m1 = magiattn.flex_flash_attn_func(*args, deterministic=True)
    out2, m2 = magiattn.flex_flash_attn_func(*args, deterministic=True)
    assert np.array_equal(out1, out2) and np.array_equal(m1.lse, m2.lse)
    dout = rng.standard_normal(out1.shape)
    g1, g2 = (magiattn.flex_flash_attn_backward(dout, q, k, v, out1, m1.lse, *args[3:],
                                                deterministic=True) for _ in range(2))
    for a, b in zip(g1[:3], g2[:3]):
        assert np.array_equal(a, b)


def test_mask_argument_and_type_names(rng):
    q, k, v = make_qkv(rng, 32, 32, 2, 2, 8)
    cu = np.array([0, 10, 32])
    out_ranges, _ = magiattn.flex_flash_attn_func(q, k, v, [[0, 10], [10, 32]],
                                                  [[0, 10], [10, 32]], ["causal", "causal"])
    out_mask, _ = magiattn.flex_flash_attn_func(q, k, v, mask=magiattn.varlen_causal(cu))
    out_enum, _ = magiattn.flex_flash_attn_func(
        q, k, v, magiattn.AttnRanges.from_cu_seqlens(cu), magiattn.AttnRanges.from_cu_seqlens(cu),
        [magiattn.AttnMaskType.CAUSAL] * 2)
    np.testing.assert_array_equal(out_ranges, out_mask)
    np.testing.assert_array_equal(out_ranges, out_enum)
    with pytest.raises(ValueError, match="either mask= or"):
        magiattn.flex_flash_attn_func(q, k, v, [[0, 1]], [[0, 1]], mask=magiattn.full(32, 32))


def test_mask_cache_builds_once(rng):
    magiattn.clear_mask_cache()
    q, k, v = make_qkv(rng, 16, 16, 2, 2, 8)
    qr = np.array([[0, 16]])
    m1 = magiattn.get_mask(16, 16, qr, qr, [1])
    m2 = magiattn.get_mask(16, 16, qr.astype(np.int32).tolist(), qr, np.array([1], np.int64))
    assert m1 is m2
    for _ in range(3):
        magiattn.flex_flash_attn_func(q, k, v, qr, qr, [1])
    from magiattn import functional

    assert functional._cache_len() == 1
    magiattn.flex_flash_attn_func(q, k, v, qr, qr, [0])
    assert functional._cache_len() == 2
    for i in range(100):  # bounded
        magiattn.get_mask(200, 200, [[i, i + 1]], [[0, 1]])
    assert functional._cache_len() == functional._CACHE_SIZE


# ---- bad input: ValueError naming the culprit ------------------------------------------------
def bad(rng, match, q_ranges=((0, 16),), k_ranges=((0, 16),), types=None, shapes=None, **kw):
    sq, sk, hq, hkv, d = shapes or (16, 16, 4, 2, 8)
    q, k, v = make_qkv(rng, sq, sk, hq, hkv, d)
    q, k, v = kw.pop("qkv", (q, k, v))
    with pytest.raises(ValueError, match=match):
        magiattn.flex_flash_attn_func(q, k, v, np.array(q_ranges), np.array(k_ranges), types, **kw)


def test_errors_ranges(rng):
    bad(rng, r"slice 0.*reversed", q_ranges=[[5, 3]])
    bad(rng, r"slice 1.*beyond", q_ranges=[[0, 8], [8, 17]], k_ranges=[[0, 8], [0, 8]])
    bad(rng, r"slices 0 .*and 1 .*both cover", q_ranges=[[0, 8], [4, 12]],
        k_ranges=[[0, 8], [6, 10]])
    bad(rng, r"q_ranges has 2 slices but k_ranges has 1", q_ranges=[[0, 8], [8, 16]])
    bad(rng, r"q_ranges: expected integer", q_ranges=[[0.0, 16.0]])
    bad(rng, r"q_ranges: expected integer ranges of shape \[N, 2\]", q_ranges=[[0, 8, 16]])
    bad(rng, r"unknown mask type", types=[7])
    bad(rng, r"attn_type_map: expected \[1\]", types=[0, 1])


def test_errors_tensors(rng):
    q, k, v = make_qkv(rng, 16, 16, 4, 2, 8)
    bad(rng, r"^q: expected 3 dims", qkv=(q[:, 0], k, v))
    bad(rng, r"head dim 12 is not a positive multiple of 8", shapes=(16, 16, 4, 2, 12))
    bad(rng, r"q: 3 heads are not a multiple of the 2", shapes=(16, 16, 3, 2, 8))
    _, k16, v16 = make_qkv(rng, 16, 16, 4, 2, 16)
    bad(rng, r"k: head dim 16 differs from q head dim 8", qkv=(q, k16, v16))
    bad(rng, r"^v: shape", qkv=(q, k, v[:, :1]))
    with pytest.raises(ValueError, match=r"k: 16 tokens but the mask has total_seqlen_k 12"):
        magiattn.flex_flash_attn_func(q, k, v, mask=magiattn.full(16, 12))
    wide = rng.standard_normal((16, 4, 16))
    bad(rng, r"q: last-dim stride 2", qkv=(wide[:, :, ::2], k, v))
    bad(rng, r"^q: dtype", qkv=(q.astype(np.int32), k, v))
    bad(rng, r"^k: dtype", qkv=(q, k.astype(np.float32), v))
    bad(rng, r"^sink: ", sink=np.zeros((2, 3)))
    bad(rng, r"^sink: length 9", sink=np.zeros((9, 4)))
    bad(rng, r"sink layout", sink=np.zeros((2, 4)), sink_layout="hs")
    bad(rng, r"^softcap", softcap=-1.0)


def test_type_map_forms_agree():
    # AttnMaskType members go through a lookup table, other forms one by one: same ints.
    from magiattn.functional import _type_array
    T = magiattn.AttnMaskType
    members = [T.CAUSAL, T.FULL, T.BICAUSAL, T.INVCAUSAL]
    assert _type_array(members, 4).tolist() == [1, 0, 3, 2]
    assert _type_array(["causal", 0, T.BICAUSAL, "INV_CAUSAL"], 4).tolist() == [1, 0, 3, 2]
    assert _type_array(np.array([1, 0], np.int64), 2).dtype == np.int32
    with pytest.raises(ValueError, match=r"slice 1: mask type 1.5"):
        _type_array([T.FULL, 1.5], 2)
