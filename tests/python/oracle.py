"""fp64 numpy oracle (docs/semantics.md §5): materialise the mask cell by cell from the slice
table of docs/semantics.md §1, then dense attention with softcap, sink, GQA and max logits;
backward by the chain rule written out. Short enough to be obviously right; shared by the test
files."""

import numpy as np

FULL, CAUSAL, INV_CAUSAL, BI_CAUSAL = 0, 1, 2, 3


def dense_from_slices(sq, sk, slices):
    """bool [sq, sk] from (qs, qe, ks, ke, type) tuples, straight from the visibility table."""
    dense = np.zeros((sq, sk), dtype=bool)
    for qs, qe, ks, ke, kind in slices:
        n, m = qe - qs, ke - ks
        i = np.arange(n)[:, None]
        j = np.arange(m)[None, :]
        if kind == FULL:
            vis = np.ones((n, m), dtype=bool)
        elif kind == CAUSAL:
            vis = j <= i + (m - n)
        elif kind == INV_CAUSAL:
            vis = j >= i
        else:
            vis = (j >= i) & (j <= i + (m - n))
        dense[qs:qe, ks:ke] |= np.broadcast_to(vis, (n, m))
    return dense


def random_slices(rng, sq, sk, max_slices=8, types=(0, 1, 2, 3)):
    """Non-overlapping random slices: cut q and k into segments, pick some (q-seg, k-seg)
    blocks and a random sub-rectangle and type in each. Slices that share a q segment give
    overlapping q ranges; unpicked rows see nothing."""

    def cuts(n, parts):
        inner = sorted(rng.choice(np.arange(1, n), size=min(parts - 1, n - 1), replace=False))
        pts = [0, *map(int, inner), n]
        return list(zip(pts[:-1], pts[1:]))

    qsegs = cuts(sq, int(rng.integers(1, 4)))
    ksegs = cuts(sk, int(rng.integers(1, 5)))
    blocks = [(a, b) for a in qsegs for b in ksegs]
    rng.shuffle(blocks)
    slices = []
    for (q0, q1), (k0, k1) in blocks[: int(rng.integers(1, max_slices + 1))]:
        qs = int(rng.integers(q0, q1))
        qe = int(rng.integers(qs + 1, q1 + 1))
        ks = int(rng.integers(k0, k1))
        ke = int(rng.integers(ks + 1, k1 + 1))
        slices.append((qs, qe, ks, ke, int(rng.choice(types))))
    return slices


def _scores(q, k, scale, softcap):
    group = q.shape[1] // k.shape[1]
    kr = np.repeat(k.astype(np.float64), group, axis=1)
    raw = np.einsum("qhd,khd->hqk", q.astype(np.float64), kr) * scale  # [H, Nq, Nk]
    s = softcap * np.tanh(raw / softcap) if softcap else raw
    return raw, s


def _sink_rows(sink, layout, nq, hq):
    """[H, Nq, S] sink logits per row."""
    sink = np.asarray(sink, dtype=np.float64)
    if layout == "sh":  # [S, H]
        return np.broadcast_to(sink.T[:, None, :], (hq, nq, sink.shape[0]))
    return np.transpose(sink, (2, 0, 1))  # [Nq, S, H] -> [H, Nq, S]


def forward(q, k, v, dense, scale=None, softcap=0.0, sink=None, sink_layout="sh"):
    """(out [Nq,H,D], lse [Nq,H], max_logits [H], aux) in fp64."""
    nq, hq, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    raw, s = _scores(q, k, scale, softcap)
    vis = np.broadcast_to(dense[None], s.shape)
    sm = np.where(vis, s, -np.inf)
    m = sm.max(axis=2, initial=-np.inf)  # [H, Nq]
    if sink is not None:
        srow = _sink_rows(sink, sink_layout, nq, hq)
        m = np.maximum(m, srow.max(axis=2))
    safe_m = np.where(np.isfinite(m), m, 0.0)
    total = np.exp(sm - safe_m[..., None]).sum(axis=2)
    if sink is not None:
        total = total + np.exp(srow - safe_m[..., None]).sum(axis=2)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, safe_m + np.log(total), -np.inf)  # [H, Nq]
    safe_lse = np.where(np.isfinite(lse), lse, 0.0)
    p = np.where(vis, np.exp(sm - safe_lse[..., None]), 0.0)
    group = hq // v.shape[1]
    vr = np.repeat(v.astype(np.float64), group, axis=1)
    out = np.einsum("hqk,khd->qhd", p, vr)
    max_logits = np.where(vis, raw, -np.inf).max(axis=(1, 2), initial=-np.inf)
    aux = dict(p=p, raw=raw, scale=scale, softcap=softcap, lse=lse, group=group,
               srow=None if sink is None else srow)
    return out, lse.T.copy(), max_logits, aux


def backward(dout, q, k, v, out, aux, sink=None, sink_layout="sh"):
    """(dq, dk, dv, dsink) in fp64 for the forward above (out = its result)."""
    p, raw, scale, softcap, group = aux["p"], aux["raw"], aux["scale"], aux["softcap"], aux["group"]
    dout = dout.astype(np.float64)
    vr = np.repeat(v.astype(np.float64), group, axis=1)
    kr = np.repeat(k.astype(np.float64), group, axis=1)
    dp = np.einsum("qhd,khd->hqk", dout, vr)
    delta = np.einsum("qhd,qhd->hq", out, dout)  # [H, Nq]
    ds = p * (dp - delta[..., None])
    if softcap:
        ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
    dq = np.einsum("hqk,khd->qhd", ds, kr) * scale
    dkr = np.einsum("hqk,qhd->khd", ds, q.astype(np.float64)) * scale
    dvr = np.einsum("hqk,qhd->khd", p, dout)
    nk, hkv, d = k.shape
    dk = dkr.reshape(nk, hkv, group, d).sum(axis=2)
    dv = dvr.reshape(nk, hkv, group, d).sum(axis=2)
    dsink = None
    if sink is not None:
        lse = aux["lse"]  # [H, Nq]
        psink = np.where(np.isfinite(lse)[..., None],
                         np.exp(aux["srow"] - np.where(np.isfinite(lse), lse, 0.0)[..., None]),
                         0.0)  # [H, Nq, S]
        g = -psink * delta[..., None]
        dsink = g.sum(axis=1).T if sink_layout == "sh" else np.transpose(g, (1, 2, 0))
    return dq, dk, dv, dsink


def rel_err(a, b, floor=1.0):
    """max |a - b| / max(max |b|, floor), after checking that inf/nan positions agree. The
    floor (inputs are O(1) normals) keeps a gradient that cancels to rounding noise, e.g. dq
    of a row that sees one key, from turning 1e-16 vs exact 0 into a relative error of 1."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    fa, fb = np.isfinite(a), np.isfinite(b)
    assert np.array_equal(fa, fb), "inf/nan positions differ"
    assert np.array_equal(a[~fa], b[~fb]), "inf values differ"
    if not fa.any():
        return 0.0
    scale = max(np.abs(b[fb]).max(), floor)
    return float(np.abs(a[fa] - b[fb]).max() / scale)
