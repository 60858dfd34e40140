"""MagiAttention 1.1.1 drop-in: flex_flash_attn_func's keywords (honoured, no-ops with one
warning, or a clear error), AttnMask, and the magi_attention.api extras (the README's
compatibility table)."""

import inspect
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import magiattn
from magiattn import functional

# Every keyword of MagiAttention 1.1.1's flex_flash_attn_func, with its default.
MAGI_KEYWORDS = {
    "index_attn_indices": None, "q_block_size": 1, "k_block_size": 1, "sink": None,
    "sink_layout": "sh", "softmax_scale": None, "softcap": 0.0, "deterministic": False,
    "sm_margin": 0, "disable_fwd_atomic_reduction": False,
    "disable_bwd_dkv_atomic_reduction": False, "ref_block_size": None, "max_seqlen_q": None,
    "auto_range_merge": False, "swap_ab": False, "pack_gqa": False, "cat_gqa": False,
    "sparse_load": False, "index_attn": False, "swap_bwd_qk_loop": False,
    "return_max_logits": False,
}
NO_OPS = {"q_block_size": 2, "k_block_size": 64, "disable_fwd_atomic_reduction": True,
          "disable_bwd_dkv_atomic_reduction": True, "ref_block_size": (128, 64),
          "max_seqlen_q": 16, "auto_range_merge": True, "swap_ab": True, "pack_gqa": True,
          "cat_gqa": True, "sparse_load": True, "swap_bwd_qk_loop": True}
QR, KR, TM = [[0, 6], [6, 12]], [[0, 6], [0, 12]], [1, 0]


def problem(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((12, 4, 8)), rng.standard_normal((12, 2, 8)), \
        rng.standard_normal((12, 2, 8))


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(functional, "_warned", set())


def test_signature_has_every_magi_keyword_with_its_default():
    params = inspect.signature(magiattn.flex_flash_attn_func).parameters
    for name, default in MAGI_KEYWORDS.items():
        assert name in params and params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name
    assert list(params)[:6] == ["q", "k", "v", "q_ranges", "k_ranges", "attn_type_map"]


def test_defaults_and_no_ops_give_the_same_result(fresh_warnings):
    q, k, v = problem()
    want, meta = magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # defaults never warn
        got, _ = magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, **MAGI_KEYWORDS)
    assert np.array_equal(got, want)
    with pytest.warns(UserWarning) as record:
        got, gmeta = magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, sm_margin=4, **NO_OPS)
    assert np.array_equal(got, want) and np.array_equal(gmeta.lse, meta.lse)
    assert sorted(str(w.message).split("=")[0].split()[-1] for w in record) == sorted(NO_OPS)


def test_each_no_op_warns_once_per_process(fresh_warnings):
    q, k, v = problem()
    with pytest.warns(UserWarning, match="swap_ab=True only tunes MagiAttention's kernel"):
        magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, swap_ab=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, swap_ab=True)  # already warned
    with pytest.warns(UserWarning, match="cat_gqa=True"):
        magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, cat_gqa=True)  # a different one


@pytest.mark.parametrize("kwargs,err,match", [
    ({"sm_margin": -1}, ValueError, "sm_margin: -1 must be an int in"),
    ({"sm_margin": 1.5}, ValueError, "sm_margin: 1.5"),
    ({"sm_margin": True}, ValueError, "sm_margin: True"),
    ({"sm_margin": 2**40}, ValueError, "sm_margin: 1099511627776 must be an int in"),
    ({"swap_ab": "yes"}, ValueError, "swap_ab: 'yes' must be a bool"),
    ({"disable_fwd_atomic_reduction": 1}, ValueError, "disable_fwd_atomic_reduction: 1"),
    ({"q_block_size": 0}, ValueError, "q_block_size: 0 must be a positive int"),
    ({"k_block_size": 2.0}, ValueError, "k_block_size: 2.0"),
    ({"max_seqlen_q": -3}, ValueError, "max_seqlen_q: -3"),
    ({"ref_block_size": (128,)}, ValueError, "ref_block_size: \\(128,\\)"),
    ({"ref_block_size": (128, 0)}, ValueError, "ref_block_size"),
    ({"index_attn": 1}, ValueError, "index_attn: 1 must be a bool"),
    ({"index_attn": True}, ValueError, "index_attn=True"),
    ({"index_attn_indices": np.zeros((12, 2, 128), np.int32)}, NotImplementedError,
     "index_attn_indices"),
])
def test_keyword_errors_name_the_culprit(kwargs, err, match):
    q, k, v = problem()
    with pytest.raises(err, match=match):
        magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM, **kwargs)


def test_backward_takes_and_checks_sm_margin():
    q, k, v = problem()
    out, meta = magiattn.flex_flash_attn_func(q, k, v, QR, KR, TM)
    dout = np.ones_like(out)
    want = magiattn.flex_flash_attn_backward(dout, q, k, v, out, meta.lse, QR, KR, TM)
    got = magiattn.flex_flash_attn_backward(dout, q, k, v, out, meta.lse, QR, KR, TM,
                                            sm_margin=8)
    assert all(np.array_equal(a, b) for a, b in zip(got[:3], want[:3]))
    with pytest.raises(ValueError, match="sm_margin: -2"):
        magiattn.flex_flash_attn_backward(dout, q, k, v, out, meta.lse, QR, KR, TM, sm_margin=-2)


def test_torch_keywords_eager_and_compiled_fullgraph(fresh_warnings):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in problem())
    qr, kr, tm = torch.tensor(QR, dtype=torch.int32), torch.tensor(KR, dtype=torch.int32), \
        torch.tensor(TM, dtype=torch.int32)
    with pytest.warns(UserWarning):  # warned here, so the compiled run below has no warning
        magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, **NO_OPS)

    def step(q, k, v):
        out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, **MAGI_KEYWORDS)
        out2, _ = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm, sm_margin=2, **NO_OPS)
        return (out * out2).sum(), meta.lse

    results = []
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        loss, lse = fn(*xs)
        loss.backward()
        results.append((loss, lse, *(x.grad for x in xs)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_no_op_keyword_first_seen_under_compile_fullgraph(fresh_warnings):
    torch = pytest.importorskip("torch")
    q = torch.from_numpy(problem()[0])
    qr = torch.tensor([[0, 12]], dtype=torch.int32)

    def f(q):
        return magiattn.flex_flash_attn_func(q, q, q, qr, qr, None, swap_ab=True, sm_margin=1)[0]

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(q)  # traced with a non-default knob: no warning, no graph break
    with pytest.warns(UserWarning, match="swap_ab"):  # not warned while tracing: eager warns
        want = f(q)
    assert torch.equal(compiled(q), want)


# ---- AttnMask ---------------------------------------------------------------------------------
def test_attn_mask_from_ranges_and_predicates():
    T = magiattn.AttnMaskType
    m = magiattn.AttnMask.from_ranges(magiattn.AttnRanges([(0, 4), (4, 10)]),
                                      magiattn.AttnRanges([(0, 4), (4, 10)]), [T.CAUSAL, T.CAUSAL])
    assert (m.total_seqlen_q, m.total_seqlen_k, m.area) == (10, 10, 10 + 21)
    assert m.is_varlen_causal() and not m.is_varlen_full() and m.is_square()
    assert not m.is_pure_causal() and not m.is_pure_full() and not m.is_empty()
    assert m.mask_flag_array.dtype == np.int32 and m.mask_flag_array.sum() == m.area
    assert m.calc_sub_area((4, 10), (4, 10)) == 21 and m.calc_sub_area((0, 4), (4, 10)) == 0
    sub = m.make_sub_mask((4, 10), (4, 10))
    assert sub.is_pure_causal() and sub.area == 21
    assert [(qr.to_naive_range(), t) for qr, _, t in m.tuples()] == [((0, 4), T.CAUSAL),
                                                                      ((4, 10), T.CAUSAL)]
    full = magiattn.AttnMask.from_ranges([[0, 3]], [[0, 5]], [T.FULL])
    assert full.is_pure_full() and full.area == 15 and not full.is_square()
    assert m == magiattn.AttnMask.from_ranges([(0, 4), (4, 10)], [(0, 4), (4, 10)],
                                              [T.CAUSAL, T.CAUSAL])
    assert "area=31" in repr(m) and "CAUSAL" in repr(m)


def test_attn_mask_from_dense_and_causal_helper():
    causal = magiattn.AttnMask.make_causal_mask(3, 5)
    assert causal.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert magiattn.AttnMask.make_causal_mask(3, 5, align="top-left")[0].tolist() == \
        [1, 0, 0, 0, 0]
    m = magiattn.AttnMask.from_mask(causal.tolist())
    assert np.array_equal(m.mask_flag_array, causal) and m.is_pure_causal()
    assert not magiattn.AttnMask.from_mask(np.zeros((2, 3))).area


def test_attn_mask_errors():
    with pytest.raises(RuntimeError, match="factory methods"):
        magiattn.AttnMask(None, None, None, None)
    with pytest.raises(ValueError, match="one entry per slice"):
        magiattn.AttnMask.from_ranges([[0, 2]], [[0, 2], [2, 4]], ["full"])
    with pytest.raises(ValueError, match="2-D"):
        magiattn.AttnMask.from_mask(np.zeros(4))
    with pytest.raises(ValueError, match="align"):
        magiattn.AttnMask.make_causal_mask(2, 2, align="middle")
    m = magiattn.AttnMask.from_ranges([[0, 2]], [[0, 2]], ["full"])
    with pytest.raises(ValueError, match=r"q_range \[0, 3\) is outside \[0, 2\)"):
        m.calc_sub_area((0, 3), (0, 2))
    with pytest.raises(ValueError, match=r"k_range \[1, 5\) is outside"):
        m.make_sub_mask((0, 2), (1, 5))


# ---- magi_attention.api extras ------------------------------------------------------------------
def test_compute_pad_size_and_squash_batch_dim():
    assert magiattn.compute_pad_size(10, 2, 4) == 6 and magiattn.compute_pad_size(16, 2, 4) == 0
    assert magiattn.compute_pad_size(0, 3, 5) == 0
    for args, match in (((-1, 2, 4), "total_seqlen_q"), ((10, 0, 4), "cp_size"),
                        ((10, 2, 1.5), "chunk_size"), ((10, True, 4), "cp_size")):
        with pytest.raises(ValueError, match=match):
            magiattn.compute_pad_size(*args)
    x = np.arange(24).reshape(2, 3, 4)
    assert magiattn.squash_batch_dim(x).shape == (6, 4)
    assert np.array_equal(magiattn.squash_batch_dim(x)[3], x[1, 0])
    with pytest.raises(ValueError, match="at least 2 dims"):
        magiattn.squash_batch_dim(np.zeros(3))
    with pytest.raises(ValueError, match="at least 2 dims"):
        magiattn.squash_batch_dim([1, 2])


def test_recent_key_registry_without_keys():
    magiattn.clear_cache()
    with pytest.raises(ValueError, match="no live key"):
        magiattn.get_most_recent_key()
    magiattn.clear_cache(object())  # an unknown group is a no-op


DIST_SCRIPT = textwrap.dedent("""
    import numpy as np, magiattn
    x = np.arange(16 * 3, dtype=np.float64).reshape(16, 3)
    local, key = magiattn.magi_attn_flex_dispatch(x, [[0, 16]], [[0, 16]], "causal", 16, 16,
                                                  2, 1, 8)
    assert magiattn.get_most_recent_key() is key
    assert np.array_equal(local, magiattn.dispatch(x, key))
    assert np.array_equal(magiattn.roll_simple(local, 1, 0, key), magiattn.roll(local, 1, 0, key))
    local2, key2 = magiattn.magi_attn_varlen_dispatch(x, [0, 5, 16], [0, 5, 16], 2, 1, 8,
                                                      causal=True)
    assert magiattn.get_most_recent_key(None) is key2
    assert np.array_equal(local2, magiattn.dispatch(x, key2))
    magiattn.clear_cache()
    try:
        magiattn.get_most_recent_key()
    except ValueError as e:
        assert "no live key" in str(e)
    else:
        raise SystemExit("get_most_recent_key after clear_cache did not raise")
    print("compat-dist-ok")
""")


def test_dispatch_helpers_and_recent_key_one_rank():
    pytest.importorskip("magiattn._dist")
    run = subprocess.run([sys.executable, "-c", DIST_SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "compat-dist-ok" in run.stdout, run.stdout + run.stderr
