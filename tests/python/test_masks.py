"""The Mask binding and the builders seen from Python: every query method against the dense
oracle, JSON round trips, MagiAttention-named helpers, and errors naming the culprit."""

import json

import numpy as np
import pytest

import magiattn
import oracle
from conftest import FULL, seed_note


def random_mask(rng, sq=None, sk=None):
    sq = sq or int(rng.integers(2, 60))
    sk = sk or int(rng.integers(2, 60))
    slices = oracle.random_slices(rng, sq, sk)
    q = [s[:2] for s in slices]
    k = [s[2:4] for s in slices]
    t = [s[4] for s in slices]
    return magiattn.Mask(sq, sk, q, k, t), slices


def test_mask_queries_match_dense(rng):
    for _ in range(40 if FULL else 12):
        mask, slices = random_mask(rng)
        sq, sk = mask.total_seqlen_q, mask.total_seqlen_k
        dense = oracle.dense_from_slices(sq, sk, slices)
        note = f"{slices}; {seed_note()}"
        got = mask.to_dense()
        assert got.dtype == np.bool_ and got.shape == (sq, sk), note
        assert np.array_equal(got, dense), note
        assert len(mask) == len(slices)
        assert mask.area() == dense.sum(), note
        assert mask.sparsity() == pytest.approx(1 - dense.sum() / (sq * sk))
        q0, q1 = sorted(int(x) for x in rng.integers(0, sq + 1, 2))
        k0, k1 = sorted(int(x) for x in rng.integers(0, sk + 1, 2))
        assert mask.area(q0, q1) == dense[q0:q1].sum(), note
        assert mask.area(q0, q1, k0, k1) == dense[q0:q1, k0:k1].sum(), note
        for _ in range(10):
            qi, ki = int(rng.integers(0, sq)), int(rng.integers(0, sk))
            assert mask.visible(qi, ki) == dense[qi, ki], note
        bq, bk = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        tiles = mask.classify_tiles(bq, bk)
        nq, nk = -(-sq // bq), -(-sk // bk)
        assert tiles.dtype == np.uint8 and tiles.shape == (nq, nk)
        for i in range(nq):
            for j in range(nk):
                block = dense[i * bq:(i + 1) * bq, j * bk:(j + 1) * bk]
                want = 2 if block.all() else (1 if block.any() else 0)
                assert tiles[i, j] == want, f"tile ({i}, {j}) of {bq}x{bk}: {note}"
        assert mask.q_ranges().dtype == np.int64 and mask.q_ranges().shape == (len(slices), 2)
        assert mask.attn_type_map().dtype == np.int32
        assert [tuple(s) for s in mask.slices()] == [tuple(s) for s in slices]


def test_mask_value_semantics_and_json(tmp_path, rng):
    mask, _ = random_mask(rng, 40, 50)
    same = magiattn.Mask(40, 50, mask.q_ranges(), mask.k_ranges(), mask.attn_type_map())
    assert mask == same and not (mask != same)
    assert mask != magiattn.full(40, 50)
    assert "40" in repr(mask) and isinstance(mask.to_string(), str)
    text = mask.to_json()
    doc = json.loads(text)
    assert doc["total_seqlen_q"] == 40 and doc["total_seqlen_k"] == 50
    assert doc["q_ranges"] == mask.q_ranges().tolist()
    assert magiattn.mask_from_json(text) == mask
    assert magiattn.mask_from_json(mask.to_json(indent=2)) == mask
    path = tmp_path / "mask.json"
    magiattn.save_mask(mask, str(path))
    assert magiattn.load_mask(str(path)) == mask
    named = {"total_seqlen_q": 8, "total_seqlen_k": 8, "q_ranges": [[0, 4], [4, 8], [4, 8]],
             "k_ranges": [[0, 4], [0, 2], [4, 8]], "attn_type_map": ["causal", "full", "BI_CAUSAL"]}
    assert magiattn.mask_from_json(json.dumps(named)).attn_type_map().tolist() == [1, 0, 3]


def test_mask_accepts_array_likes():
    ranges = [[0, 4], [4, 8]]
    a = magiattn.Mask(8, 8, ranges, ranges, [1, 1])
    b = magiattn.Mask(8, 8, np.array(ranges, np.int32), np.array(ranges, np.int64),
                      np.array([1, 1], np.int8))
    c = magiattn.Mask(8, 8, ranges, ranges, None)
    assert a == b and c.attn_type_map().tolist() == [0, 0]


def test_mask_errors():
    with pytest.raises(ValueError, match=r"slice 1: q_range \[6, 2\) is reversed"):
        magiattn.Mask(8, 8, [[0, 2], [6, 2]], [[0, 2], [0, 2]], None)
    with pytest.raises(ValueError, match=r"slices 0 .* and 1 .* both cover cell"):
        magiattn.Mask(8, 8, [[0, 4], [2, 6]], [[0, 4], [3, 8]], [0, 0])
    with pytest.raises(ValueError, match=r"attn_type_map\[0\]: unknown mask type 4"):
        magiattn.Mask(8, 8, [[0, 4]], [[0, 4]], [4])
    with pytest.raises(ValueError, match="beyond"):
        magiattn.Mask(8, 8, [[0, 4]], [[0, 9]], None)
    with pytest.raises(ValueError, match="mask JSON"):
        magiattn.mask_from_json('{"total_seqlen_q": 4}')
    with pytest.raises(ValueError, match="cannot open"):
        magiattn.load_mask("/nonexistent/mask.json")


def test_builders_match_their_definitions():
    i = np.arange(12)[:, None]
    j = np.arange(20)[None, :]
    assert np.array_equal(magiattn.full(12, 20).to_dense(), np.ones((12, 20), bool))
    assert np.array_equal(magiattn.causal(12, 20).to_dense(), j <= i + 8)
    # sliding window: p = i + (sk - sq); keys p - left <= j <= p + right
    p = i + 8
    assert np.array_equal(magiattn.sliding_window(12, 20, 3, 1).to_dense(),
                          (j >= p - 3) & (j <= p + 1))
    cu = np.array([0, 5, 5, 12])
    d = magiattn.varlen_causal(cu).to_dense()
    want = np.zeros((12, 12), bool)
    for a, b in zip(cu[:-1], cu[1:]):
        want[a:b, a:b] = np.tril(np.ones((b - a, b - a), bool))
    assert np.array_equal(d, want)
    blocks = np.zeros((12, 12), bool)
    for a, b in zip(cu[:-1], cu[1:]):
        blocks[a:b, a:b] = True
    assert np.array_equal(magiattn.varlen_full(cu, cu).to_dense(), blocks)
    bc = magiattn.block_causal(10, 4).to_dense()
    blk = np.arange(10) // 4
    assert np.array_equal(bc, np.arange(10)[None, :] < np.minimum((blk[:, None] + 1) * 4, 10))
    pl = magiattn.prefix_lm(10, 4).to_dense()
    assert np.array_equal(pl, (np.arange(10)[None, :] <= np.arange(10)[:, None])
                          | (np.arange(10)[None, :] < 4))
    sq_mask = magiattn.shared_question(4, [3, 2]).to_dense()
    assert sq_mask.shape == (9, 9) and not sq_mask[7:, 4:7].any() and sq_mask[8, :4].all()
    bm = np.array([[1, 0], [1, 1]], np.uint8)
    bs = magiattn.block_sparse(bm, 6, 8, 3, 4).to_dense()
    assert np.array_equal(bs, np.kron(bm, np.ones((3, 4), np.uint8)).astype(bool))
    topk = magiattn.block_sparse_topk(np.array([[0, -1], [1, 0]]), 6, 8, 3, 4)
    assert np.array_equal(topk.to_dense(), bs)


def test_from_dense_round_trip(rng):
    for _ in range(20 if FULL else 8):
        mask, slices = random_mask(rng)
        dense = oracle.dense_from_slices(mask.total_seqlen_q, mask.total_seqlen_k, slices)
        back = magiattn.from_dense(dense)
        assert np.array_equal(back.to_dense(), dense), seed_note()
    rand = rng.random((17, 23)) < 0.3
    assert np.array_equal(magiattn.from_dense(rand).to_dense(), rand)


def test_families_and_doc_lengths():
    names = magiattn.family_names()
    assert "varlen-causal" in names and "block-sparse" in names
    for name in names:
        m = magiattn.build_family(name, 2048, seed=3)
        assert m.total_seqlen_q == 2048 and m.area() > 0, name
        assert m == magiattn.build_family(name, 2048, seed=3), name
    with pytest.raises(ValueError, match="unknown mask family 'nope'"):
        magiattn.build_family("nope", 1024)
    lens = magiattn.sample_doc_lengths(10000, seed=1)
    assert sum(lens) == 10000 and min(lens) >= 1
    assert magiattn.fwd_flops(100, 8, 128) == 4 * 100 * 8 * 128


def test_make_mask_and_magi_helpers():
    R = magiattn.AttnRanges
    m = magiattn.make_mask(R([(0, 4), (4, 10)]), R([(0, 4), (0, 10)]),
                           [magiattn.AttnMaskType.CAUSAL, "bi_causal"])
    assert (m.total_seqlen_q, m.total_seqlen_k) == (10, 10)
    assert m.attn_type_map().tolist() == [1, 3]
    assert magiattn.make_mask([[0, 4]], [[0, 4]], "causal", 8, 6).total_seqlen_k == 6
    qr, kr, types = magiattn.mask_to_ranges(m)
    assert qr == R([(0, 4), (4, 10)]) and types[1] is magiattn.AttnMaskType.BICAUSAL
    assert magiattn.AttnMaskType.from_int_type(2) is magiattn.AttnMaskType.INVCAUSAL
    assert magiattn.AttnMaskType.from_int_type(int_type=3) is magiattn.AttnMaskType.BICAUSAL
    for bad in (4, -1, "x", None):
        with pytest.raises(ValueError, match="is not 0 \\(full\\)"):
            magiattn.AttnMaskType.from_int_type(bad)
    assert magiattn.AttnMaskType("causal").to_int_type() == 1
    with pytest.raises(ValueError, match="unknown mask type 'diag'"):
        magiattn.make_mask([[0, 4]], [[0, 4]], ["diag"])
    cu_q, cu_k = magiattn.infer_varlen_mask_from_batch(3, 5)
    assert cu_q.tolist() == [0, 5, 10, 15] and cu_k.tolist() == cu_q.tolist()
    with pytest.raises(ValueError, match="seq_len: -5"):
        magiattn.infer_varlen_mask_from_batch(3, -5)
    with pytest.raises(ValueError, match="batch_size: 1.5"):
        magiattn.infer_varlen_mask_from_batch(1.5, 5)


def varlen_window_dense(cu, left, right, num_global=0):
    """Per document: query i sees keys i - left .. i + right (-1 = unbounded), plus the first
    num_global keys of its document up to its window's right edge."""
    n = cu[-1]
    dense = np.zeros((n, n), bool)
    for a, b in zip(cu[:-1], cu[1:]):
        i = np.arange(b - a)[:, None]
        j = np.arange(b - a)[None, :]
        lo = (j >= i - left) if left >= 0 else np.ones_like(j >= i)
        hi = (j <= i + right) if right >= 0 else np.ones_like(j >= i)
        glob = (j < num_global) & hi
        dense[a:b, a:b] = (lo & hi) | glob
    return dense


@pytest.mark.parametrize("causal,window,num_global", [
    (False, (-1, -1), 0), (True, (-1, -1), 0), (False, (3, 0), 0), (False, (2, 1), 0),
    (False, (3, 0), 2), (False, (-1, 2), 0)])
def test_infer_attn_mask_from_cu_seqlens(causal, window, num_global):
    cu = np.array([0, 7, 8, 20, 31])
    qr, kr, types, tq, tk = magiattn.infer_attn_mask_from_cu_seqlens(
        cu, cu, causal=causal, window_size=window, global_window_size=num_global)
    assert isinstance(qr, magiattn.AttnRanges) and (tq, tk) == (31, 31)
    assert all(isinstance(t, magiattn.AttnMaskType) for t in types)
    got = magiattn.make_mask(qr, kr, types, tq, tk).to_dense()
    left, right = (-1, 0) if causal else window
    if window == (-1, -1) and not causal:
        left = right = -1
    assert np.array_equal(got, varlen_window_dense(cu, left, right, num_global))


def test_infer_helpers_errors_and_window_offsets():
    with pytest.raises(ValueError, match="window_size"):
        magiattn.infer_attn_mask_from_cu_seqlens([0, 4], [0, 4], causal=True, window_size=(2, 0))
    qr, kr, types = magiattn.infer_attn_mask_from_sliding_window((10, 20), (30, 45), (2, 1))
    m = magiattn.make_mask(qr, kr, types, 20, 45)
    local = magiattn.sliding_window(10, 15, 2, 1).to_dense()
    assert np.array_equal(m.to_dense()[10:20, 30:45], local)
    assert m.area() == local.sum()


def disjoint_rectangles(qr, kr):
    rects = list(zip(qr, kr))
    return all(not (a.is_overlap_with(c) and b.is_overlap_with(d))
               for i, (a, b) in enumerate(rects) for c, d in rects[i + 1:])


@pytest.mark.parametrize("window,num_global", [((3, 0), 2), ((2, 1), 4), ((1, 3), 3),
                                               ((0, 0), 1), ((4, 0), 20)])
def test_infer_cu_seqlens_globals_emit_disjoint_slices(window, num_global):
    cu = np.array([0, 7, 8, 20, 31])
    qr, kr, types, tq, tk = magiattn.infer_attn_mask_from_cu_seqlens(
        cu, cu, window_size=window, global_window_size=num_global)
    assert disjoint_rectangles(qr, kr), (qr, kr)
    got = magiattn.make_mask(qr, kr, types, tq, tk).to_dense()
    assert np.array_equal(got, varlen_window_dense(cu, *window, num_global))


def test_infer_sliding_window_longer_q_drops_leading_rows():
    """MagiAttention: with sq > sk only the last sk rows attend (the first sq - sk see
    nothing, whatever the window)."""
    T = magiattn.AttnMaskType
    qr, kr, types = magiattn.infer_attn_mask_from_sliding_window((0, 10), (20, 24), (-1, -1))
    assert (qr, kr, types) == (magiattn.AttnRanges([(6, 10)]), magiattn.AttnRanges([(20, 24)]),
                               [T.FULL])
    for window in ((1, 5), (2, 0), (0, 2), (-1, 1)):
        qr, kr, types = magiattn.infer_attn_mask_from_sliding_window((3, 13), (0, 4), window)
        dense = magiattn.make_mask(qr, kr, types, 13, 4).to_dense()[3:13]
        assert not dense[:6].any(), window
        want = magiattn.sliding_window(4, 4, *window).to_dense()
        assert np.array_equal(dense[6:], want), window
    with pytest.raises(ValueError, match=r"window_size: \(1, 2, 3\) must be a pair"):
        magiattn.infer_attn_mask_from_sliding_window((0, 4), (0, 4), (1, 2, 3))
