"""Muon QK-clip (Kimi K2's MuonClip): after an optimizer step, rescale the query and key
projections of each head whose largest attention logit exceeded ``tau``, so that the same
inputs would give it at most ``tau``.

The logit of head ``h`` is ``scale * q . k`` with ``q = W_q x + b_q`` and ``k = W_k x + b_k``
(rotary embeddings rotate, so they commute with a scaling). Scaling the rows of head ``h`` of
``W_q`` (and ``b_q``) by ``a`` and those of its kv head ``g`` of ``W_k`` by ``b`` scales every
logit of ``h`` by ``a * b``. With ``gamma_h = min(1, tau / max_logits[h])`` this module takes

    b_g = sqrt(min over the q heads h of group g of gamma_h),    a_h = gamma_h / b_g,

so ``a_h * b_g = gamma_h`` for every q head: a clipped head's maximum lands on ``tau``, an
unclipped head's logits are unchanged (its ``a`` undoes its group's ``b``), and with one q head
per kv head both factors are ``sqrt(gamma_h)``, as in the paper.

``max_logits`` is what ``flex_flash_attn_func(..., return_max_logits=True)`` and
``calc_attn`` return (``AttnForwardMeta.max_logits``, ``[Hq]``, the pre-softcap scaled logit;
``calc_attn`` has already reduced it with max over the cp group, so every rank computes the
same factors and replicated weights stay equal). A head that saw nothing (``-inf``) is left
alone; a NaN or ``+inf`` maximum (a diverged step) is an error naming the heads, not a silent
NaN in the weights.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["QKClipFactors", "qk_clip_factors", "qk_clip_"]


class QKClipFactors(NamedTuple):
    q: np.ndarray  # [Hq] float64: the factor of each q head's rows of W_q (and b_q)
    k: np.ndarray  # [Hkv] float64: the factor of each kv head's rows of W_k (and b_k)


def _host(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, on any device
        x = x.detach().cpu().double().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"qk_clip: {name} must be a non-empty 1-D array [Hq], got shape "
                         f"{tuple(a.shape)}")
    return a


def qk_clip_factors(max_logits: Any, tau: float, num_heads_kv: int) -> QKClipFactors:
    """The per-head factors (module docstring) for ``max_logits [Hq]`` and threshold ``tau``;
    ``Hq`` must be a multiple of ``num_heads_kv``."""
    m = _host(max_logits, "max_logits")
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) \
            or tau <= 0:
        raise ValueError(f"qk_clip: tau must be a finite number > 0, got {tau!r}")
    if isinstance(num_heads_kv, bool) or not isinstance(num_heads_kv, int) or num_heads_kv <= 0 \
            or m.size % num_heads_kv != 0:
        raise ValueError(f"qk_clip: num_heads_kv must be a positive divisor of Hq = {m.size}, "
                         f"got {num_heads_kv!r}")
    bad = np.flatnonzero(np.isnan(m) | (m == np.inf))
    if bad.size:
        raise ValueError(f"qk_clip: max_logits is NaN or +inf at q heads {bad.tolist()} (a "
                         "diverged step?): no factor is defined there")
    gamma = np.ones_like(m)
    over = m > tau
    gamma[over] = tau / m[over]
    k = np.sqrt(gamma.reshape(num_heads_kv, -1).min(axis=1))
    q = gamma / np.repeat(k, m.size // num_heads_kv)
    return QKClipFactors(q=q, k=k)


def _scale_heads_(w: Any, factors: np.ndarray) -> None:
    d = w.shape[0] // factors.size  # qk_clip_ checked the rows
    for h in np.flatnonzero(factors != 1.0):  # in place, for any layout and dtype
        w[h * d:(h + 1) * d] *= float(factors[h])


def qk_clip_(q_weight: Any, k_weight: Any, max_logits: Any, tau: float, *, num_heads_kv: int,
             q_bias: Optional[Any] = None, k_bias: Optional[Any] = None) -> QKClipFactors:
    """Apply QK-clip in place to one attention layer's projections: ``q_weight [Hq * D, ...]``
    and ``k_weight [Hkv * D, ...]`` (``nn.Linear.weight`` layout: output features first, head
    by head), optional biases ``[Hq * D]`` / ``[Hkv * D]``; torch tensors (parameters: updated
    under ``torch.no_grad``) or numpy arrays. Returns the factors; rows whose factor is 1 are
    not touched."""
    f = qk_clip_factors(max_logits, tau, num_heads_kv)
    hq, hkv = f.q.size, f.k.size
    for x, name in ((q_weight, "q_weight"), (k_weight, "k_weight")):
        if len(getattr(x, "shape", ())) < 1:
            raise ValueError(f"qk_clip: {name} must be an array with heads * head_dim rows")
    if q_weight.shape[0] // hq * hkv != k_weight.shape[0] or q_weight.shape[0] % hq != 0:
        raise ValueError(f"qk_clip: q_weight has {q_weight.shape[0]} rows and k_weight "
                         f"{k_weight.shape[0]}: not {hq} and {hkv} heads of one head_dim")
    for b, w, name in ((q_bias, q_weight, "q_bias"), (k_bias, k_weight, "k_bias")):
        if b is not None and tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"qk_clip: {name} must have shape ({w.shape[0]},), got "
                             f"{tuple(b.shape)}")
    targets = [(w, fs) for w, fs in ((q_weight, f.q), (k_weight, f.k), (q_bias, f.q),
                                     (k_bias, f.k)) if w is not None]
    no_grad = contextlib.nullcontext()
    if hasattr(q_weight, "detach"):
        import torch
        no_grad = torch.no_grad()
    with no_grad:
        for w, fs in targets:
            _scale_heads_(w, fs)
    return f
