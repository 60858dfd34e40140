"""Muon QK-clip (magiattn.qk_clip): the factors' algebra, in-place updates of numpy and torch
projections, the errors, and a small model whose training step blows a head's logits past tau
and whose clipped weights bring every head's max logit (from the kernel) back to tau."""

import math

import numpy as np
import pytest

import magiattn
from magiattn.qk_clip import qk_clip_, qk_clip_factors


def test_factors_clip_each_head_to_tau_and_leave_the_others():
    m = np.array([10.0, 2.0, 50.0, 40.0, -np.inf, 3.0])  # Hq 6, Hkv 3 (groups of 2)
    f = qk_clip_factors(m, 5.0, 3)
    gamma = np.minimum(1.0, 5.0 / np.where(m > 5.0, m, 5.0))
    np.testing.assert_allclose(f.q * np.repeat(f.k, 2), gamma, rtol=1e-15)
    np.testing.assert_allclose(f.k, np.sqrt([0.5, 0.1, 1.0]), rtol=1e-15)
    assert f.q[5] == 1.0 and f.k[2] == 1.0  # a group under tau (and one that saw nothing)
    mha = qk_clip_factors(np.array([20.0, 1.0]), 5.0, 2)  # one q head per kv head: sqrt each
    np.testing.assert_allclose(mha.q, [0.5, 1.0])
    np.testing.assert_allclose(mha.k, [0.5, 1.0])


def test_numpy_projections_in_place():
    rng = np.random.default_rng(0)
    hq, hkv, d, hidden = 4, 2, 3, 5
    wq, wk = rng.standard_normal((hq * d, hidden)), rng.standard_normal((hkv * d, hidden))
    bq, bk = rng.standard_normal(hq * d), rng.standard_normal(hkv * d)
    before = [x.copy() for x in (wq, wk, bq, bk)]
    f = qk_clip_(wq, wk, [8.0, 1.0, 1.0, 2.0], 4.0, num_heads_kv=hkv, q_bias=bq, k_bias=bk)
    for w, w0, fs in ((wq, before[0], f.q), (wk, before[1], f.k), (bq, before[2], f.q),
                      (bk, before[3], f.k)):
        np.testing.assert_allclose(w, w0 * np.repeat(fs, d).reshape((-1,) + (1,) * (w.ndim - 1)),
                                   rtol=1e-15)
    assert np.array_equal(wk[d:], before[1][d:])  # kv head 1's group is under tau: untouched


@pytest.mark.parametrize("args, match", [
    (dict(max_logits=[1.0, np.nan], tau=1.0, num_heads_kv=1), r"NaN or \+inf at q heads \[1\]"),
    (dict(max_logits=[np.inf, 1.0], tau=1.0, num_heads_kv=1), r"at q heads \[0\]"),
    (dict(max_logits=[1.0, 2.0], tau=0.0, num_heads_kv=1), "tau must be a finite number > 0"),
    (dict(max_logits=[1.0, 2.0], tau=math.inf, num_heads_kv=1), "tau must be"),
    (dict(max_logits=[1.0, 2.0, 3.0], tau=1.0, num_heads_kv=2), "positive divisor of Hq = 3"),
    (dict(max_logits=[[1.0]], tau=1.0, num_heads_kv=1), r"1-D array \[Hq\]"),
])
def test_bad_arguments_name_the_culprit(args, match):
    with pytest.raises(ValueError, match=match):
        qk_clip_factors(args["max_logits"], args["tau"], args["num_heads_kv"])


def test_bad_shapes_name_the_culprit():
    wq, wk = np.ones((8, 3)), np.ones((4, 3))
    with pytest.raises(ValueError, match="not 4 and 1 heads of one head_dim"):
        qk_clip_(wq, wk, [9.0] * 4, 1.0, num_heads_kv=1)
    with pytest.raises(ValueError, match=r"q_bias must have shape \(8,\)"):
        qk_clip_(wq, wk, [9.0] * 4, 1.0, num_heads_kv=2, q_bias=np.ones(7))
    assert np.all(wq == 1.0)  # nothing was touched before the error


def test_a_small_model_step_then_clip_brings_every_head_to_tau():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    n, hidden, hq, hkv, d, tau = 96, 32, 4, 2, 16, 6.0

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(hidden, hq * d)
            self.k = torch.nn.Linear(hidden, hkv * d)
            self.v = torch.nn.Linear(hidden, hkv * d)

        def forward(self, x):
            ranges = torch.tensor([[0, 40], [40, n]], dtype=torch.int32)
            out, meta = magiattn.flex_flash_attn_func(
                self.q(x).view(n, hq, d), self.k(x).view(n, hkv, d), self.v(x).view(n, hkv, d),
                ranges, ranges, torch.tensor([1, 0], dtype=torch.int32), return_max_logits=True)
            return out, meta.max_logits

    model = Attention().double()
    x = torch.randn(n, hidden, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with torch.no_grad():
        model.q.weight[: 2 * d] *= 20.0  # q heads 0 and 1 (kv head 0) will exceed tau
    out, max_logits = model(x)
    out.sum().backward()
    opt.step()
    _, before = model(x)
    before = before.detach()
    assert (before[:2] > tau).all() and (before[2:] < tau).all()
    k_rows = model.k.weight[d:].detach().clone()
    f = qk_clip_(model.q.weight, model.k.weight, before, tau, num_heads_kv=hkv,
                 q_bias=model.q.bias, k_bias=model.k.bias)
    assert model.q.weight.requires_grad and model.q.weight.grad is not None
    _, after = model(x)
    want = torch.minimum(before, torch.tensor(tau, dtype=torch.float64))
    torch.testing.assert_close(after.detach(), want, rtol=1e-13, atol=0)
    assert f.k[1] == 1.0 and torch.equal(model.k.weight[d:], k_rows)
