"""AttnRange / AttnRanges: hand-picked cases with MagiAttention's documented answers, then a
random sweep against a set-of-integers model."""

import numpy as np
import pytest

from conftest import FULL, seed_note
from magiattn import AttnRange, AttnRanges, RangeError

R = AttnRanges


def test_attn_range_basics():
    r = AttnRange(3, 7)
    assert r.seqlen == len(r) == 4 and not r.is_empty() and repr(r) == "[3, 7)"
    assert AttnRange(5, 5).is_empty()
    assert r.offset(10) == AttnRange(13, 17)
    assert r.truncate(5, 20) == AttnRange(5, 7) and r.truncate(8, 9).is_empty()
    assert r.intersect(AttnRange(6, 10)) == AttnRange(6, 7)
    assert r.intersect(AttnRange(8, 10)).is_empty()
    assert r.intersect_size(AttnRange(0, 5)) == 2
    assert r.union(AttnRange(7, 9)) == [AttnRange(3, 9)]  # touching ranges fuse
    assert r.union(AttnRange(8, 9)) == [AttnRange(3, 7), AttnRange(8, 9)]
    assert r.union_size(AttnRange(5, 9)) == 6
    assert r.diff_by(AttnRange(0, 10)) == [AttnRange(0, 3), AttnRange(7, 10)]
    assert r.diff_by(AttnRange(4, 6)) == []
    assert r.diff_by(AttnRange(5, 9)) == [AttnRange(7, 9)]
    assert r.is_subrange_of(AttnRange(0, 7)) and not r.is_subrange_of(AttnRange(4, 9))
    assert r.is_overlap_with(AttnRange(6, 8)) and not r.is_overlap_with(AttnRange(7, 8))
    assert AttnRange.from_range((1, 2)) == AttnRange.from_range(AttnRange(1, 2))
    assert {AttnRange(1, 2), AttnRange(1, 2)} == {AttnRange(1, 2)}
    with pytest.raises(RangeError, match=r"\[5, 3\) is reversed"):
        AttnRange(5, 3)
    with pytest.raises(ValueError):  # RangeError is a ValueError
        r.end = 1


def test_attn_ranges_magi_examples():
    a = R([(0, 10), (15, 20), (20, 30)])
    assert a.find_hole_ranges(R([(5, 10), (25, 30)])) == R([(0, 5), (15, 25)])
    b = R([(0, 10), (15, 20), (25, 30)])
    assert b.find_overlap_ranges(R([(5, 10), (18, 30)])) == R([(5, 10), (18, 20), (25, 30)])
    assert R([(5, 10), (25, 30), (15, 20)]).make_ranges_local(
        R([(5, 10), (15, 20), (25, 30)])) == R([(0, 5), (5, 10), (10, 15)])
    assert R([(5, 10), (25, 30)]).make_range_local(AttnRange(26, 28)) == (AttnRange(6, 8),
                                                                           AttnRange(25, 30))
    with pytest.raises(ValueError, match=r"\[8, 12\) is not inside"):  # MagiAttention's type
        R([(5, 10)]).make_range_local(AttnRange(8, 12))


def test_attn_ranges_structure():
    a = R([(8, 12), (0, 4), (3, 6), (6, 7)])
    assert not a.is_sorted() and a.sort() == R([(0, 4), (3, 6), (6, 7), (8, 12)])
    assert a.merge() == R([(0, 7), (8, 12)]) and a.merge().is_merged()
    assert not R([(0, 4), (4, 6)]).is_merged()  # touching is not merged
    assert not a.is_non_overlap() and R([(0, 4), (8, 9)]).is_non_overlap()
    assert a.total_seqlen == 12 and a.intersect_size() == 1
    assert a.union_size() == 12 and a.merge().total_seqlen == 11  # union_size: MagiAttention's
    assert a.max_seqlen == 4 and a.start == 0 and a.end == 12 and a.size == 4
    assert a.points == [0, 3, 4, 6, 7, 8, 12]
    assert a.truncate(2, 9) == R([(8, 9), (2, 4), (3, 6), (6, 7)])
    assert a[1] == AttnRange(0, 4) and a[1:3] == R([(0, 4), (3, 6)])
    a.append((20, 21))
    a.insert(0, AttnRange(30, 31))
    assert a.pop() == AttnRange(20, 21) and a.pop(0) == AttnRange(30, 31)
    assert R([(1, 1), (2, 3)]).clear_empty() == R([(2, 3)])
    assert R().is_empty() and R().merge() == R() and R().max_seqlen == 0
    with pytest.raises(RangeError):
        R().start
    assert hash(R([(0, 1)])) == hash(R([(0, 1)]))


def test_cu_seqlens_and_arrays():
    cu = [0, 3, 3, 10]
    a = R.from_cu_seqlens(cu)
    assert a == R([(0, 3), (3, 3), (3, 10)]) and a.to_cu_seqlens() == cu
    assert R.from_cu_seqlens(np.array(cu), 10) == a
    assert a.is_cu_seqlens(10) and not a.is_cu_seqlens(11)
    with pytest.raises(RangeError, match="cu_seqlens"):
        R.from_cu_seqlens([0, 5, 4])
    with pytest.raises(RangeError, match="cu_seqlens"):
        R.from_cu_seqlens([1, 5])
    with pytest.raises(RangeError, match="does not tile"):
        R([(0, 3), (4, 5)]).to_cu_seqlens()
    arr = a.to_array()
    assert arr.dtype == np.int64 and arr.tolist() == [[0, 3], [3, 3], [3, 10]]
    assert np.asarray(a).tolist() == arr.tolist()
    assert R().to_array().shape == (0, 2)
    assert R.from_ranges(arr) == a and R.from_ranges(a) == a and R.from_ranges(a) is not a
    assert a.to_naive_ranges() == [(0, 3), (3, 3), (3, 10)]


def test_chunk():
    a = R([(0, 5), (10, 13), (20, 24)])
    chunks = a.chunk(4)
    assert chunks == [R([(0, 4)]), R([(4, 5), (10, 13)]), R([(20, 24)])]
    assert sum(c.total_seqlen for c in a.chunk(5)) == a.total_seqlen
    with pytest.raises(RangeError, match="overlaps"):
        R([(0, 4), (2, 6)]).chunk(2)
    with pytest.raises(RangeError, match="chunk_size"):
        a.chunk(0)


def test_to_tensor():
    torch = pytest.importorskip("torch")
    t = R([(0, 3), (3, 8)]).to_tensor()
    assert t.dtype == torch.int32 and t.tolist() == [[0, 3], [3, 8]]


def test_random_set_model(rng):
    def cells(ranges):
        return set().union(*(set(range(r.start, r.end)) for r in ranges)) if len(ranges) else set()

    def rand_ranges():
        out = []
        for _ in range(int(rng.integers(0, 6))):
            s = int(rng.integers(0, 40))
            out.append((s, s + int(rng.integers(0, 10))))
        return R(out)

    for _ in range(300 if FULL else 100):
        a, b = rand_ranges(), rand_ranges()
        note = f"{a} {b}; {seed_note()}"
        m = a.merge()
        assert cells(m) == cells(a) and m.is_merged() and m.total_seqlen == len(cells(a)), note
        assert cells(a.intersect(b)) == cells(a) & cells(b), note
        assert a.intersect(b).is_merged() or len(a.intersect(b)) <= 1, note
        assert cells(a.find_hole_ranges(b)) == cells(a) - cells(b), note
        assert cells(a.union(b)) == cells(a) | cells(b), note
        if a.is_non_overlap() and a.total_seqlen:
            size = int(rng.integers(1, 8))
            chunks = a.chunk(size)
            assert [c.total_seqlen for c in chunks[:-1]] == [size] * (len(chunks) - 1), note
            assert cells(R([r for c in chunks for r in c])) == cells(a), note


# ---- MagiAttention 1.1.1 parity -------------------------------------------------------------
def test_attn_range_validity_and_check_params():
    r = AttnRange(2, 2)
    assert r.is_valid_close() and not r.is_valid_open() and AttnRange(2, 3).is_valid_open()
    assert r.is_valid_close(1, 4) and not r.is_valid_close(5, 4) and not r.is_valid_open(4, 4)
    r.check_valid()
    with pytest.raises(RangeError, match=r"\[5, 4\) is reversed"):
        r.check_valid(5, 4)
    assert AttnRange.from_range([1, 3], check=True) == AttnRange(1, 3)
    with pytest.raises(RangeError, match="start, end"):
        AttnRange.from_range([1, 2, 3])
    # union with an empty range: both, in order (MagiAttention)
    assert AttnRange(3, 7).union(AttnRange(9, 9)) == [AttnRange(3, 7), AttnRange(9, 9)]
    assert AttnRange(9, 9).union(AttnRange(3, 7)) == [AttnRange(9, 9), AttnRange(3, 7)]
    assert AttnRange(8, 9).union(AttnRange(3, 7)) == [AttnRange(8, 9), AttnRange(3, 7)]
    # an empty range inside splits other - self, as MagiAttention's diff_by
    assert AttnRange(5, 5).diff_by(AttnRange(0, 10)) == [AttnRange(0, 5), AttnRange(5, 10)]


def test_attn_ranges_check_params_and_validity():
    a = R()
    a.append((0, 2), check=True)
    a.insert(0, AttnRange(5, 6), check=True)
    a.extend(R([(7, 9)]), check=True)
    assert a == R([(5, 6), (0, 2), (7, 9)]) and a.is_valid()
    a.check_valid()
    assert R.from_ranges([(0, 1)], check=True) == R([(0, 1)])
    a._ranges[1]._end = -1  # only reachable by poking at internals
    assert not a.is_valid()
    with pytest.raises(ValueError, match=r"range 1 \[0, -1\) is reversed"):
        a.check_valid()
    with pytest.raises(RangeError):
        R().append((3, 1), check=True)


def test_merge_with_split_alignment_and_sizes_with():
    a = R([(3, 5), (9, 10), (17, 17), (21, 30)])
    assert a.merge_with_split_alignment(4) == R([(0, 12), (20, 32)])
    assert a.merge_with_split_alignment() == a.merge() == R([(3, 5), (9, 10), (21, 30)])
    with pytest.raises(RangeError, match="split_alignment 0"):
        a.merge_with_split_alignment(0)
    x, y = R([(0, 10), (5, 8)]), R([(6, 12)])
    # over x ∩ y = [6, 10): x covers [6, 8) twice and [8, 10) once, y all of it once
    assert x.intersect_size_with(y) == 2 * 2 + 2 * 1
    assert R([(0, 4)]).intersect_size_with(R([(2, 9)])) == 2
    assert R([(0, 4)]).intersect_size_with(R([(4, 9)])) == 0
    assert x.union_size_with(y) == x.total_seqlen + y.total_seqlen == 19


def test_slice_assignment_and_repr():
    a = R([(0, 1), (1, 2), (2, 3)])
    a[0:2] = R([(5, 6), (6, 8)])
    assert a == R([(5, 6), (6, 8), (2, 3)])
    a[1:] = [(0, 0), AttnRange(9, 9)]
    a[0] = (4, 5)
    assert a == R([(4, 5), (0, 0), (9, 9)])
    with pytest.raises(RangeError, match="lengths must match"):
        a[0:2] = R([(0, 1)])
    assert repr(R()) == "[[,)]" and repr(R([(0, 3), (3, 7)])) == "[[0, 3), [3, 7)]"
    assert str(a) == "[[4, 5), [0, 0), [9, 9)]"


def test_make_local_returns_and_parameter_names():
    a = R([(5, 10), (25, 30), (15, 20)])
    local, target = a.make_range_local(other_attn_range=AttnRange(16, 19))
    assert (local, target) == (AttnRange(6, 9), AttnRange(15, 20))
    merged = a.merge()
    assert merged.make_range_local(AttnRange(25, 30), is_self_merged=True,
                                   prefix_offset=[0, 5, 10]) == (AttnRange(10, 15),
                                                                 AttnRange(25, 30))
    assert a.make_ranges_local(other_attn_ranges=R([(26, 27), (5, 6)]),
                               is_self_merged=False) == R([(11, 12), (0, 1)])
    with pytest.raises(RangeError, match="prefix_offset has 2 entries but there are 3"):
        merged.make_range_local(AttnRange(5, 6), is_self_merged=True, prefix_offset=[0, 5])
    with pytest.raises(RangeError, match="is_self_merged=True but"):
        a.make_range_local(AttnRange(5, 6), is_self_merged=True)
    with pytest.raises(ValueError, match=r"\[0, 2\) is not inside"):
        a.make_range_local(AttnRange(0, 2))
    b, c = R([(0, 10), (15, 20)]), R([(5, 10), (18, 30)])
    assert b.find_overlap_ranges(c, is_self_merged=True, is_other_merged=True) == \
        R([(5, 10), (18, 20)])
    assert b.find_hole_ranges(other_attn_ranges=c, is_self_merged=True,
                              is_other_merged=True) == R([(0, 5), (15, 18)])


def test_cu_seqlens_empty_and_seqlen_name():
    assert R.from_cu_seqlens([]) == R() and R.from_cu_seqlens([], 7) == R()
    assert R().to_cu_seqlens() == [0]
    assert R([(0, 3), (3, 5)]).is_cu_seqlens(seqlen=5) and R().is_cu_seqlens(seqlen=0)
    assert not R().is_cu_seqlens(seqlen=1)
    assert magiattn_cu_helpers_agree()


def magiattn_cu_helpers_agree():
    from magiattn import check_valid_cu_seqlens, is_valid_cu_seqlens

    assert is_valid_cu_seqlens([], 3) and is_valid_cu_seqlens([0, 2, 2, 5], 5)
    assert not is_valid_cu_seqlens([0, 2], 5) and not is_valid_cu_seqlens([1, 2], 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        check_valid_cu_seqlens([0, 3, 2], 2)
    return True


def test_chunk_check_param():
    overlapping = R([(0, 4), (2, 6)])
    assert overlapping.chunk(3, check=False) == [R([(0, 3)]), R([(3, 4), (2, 4)]), R([(4, 6)])]
    with pytest.raises(RangeError, match="overlaps"):
        overlapping.chunk(3, check=True)
    with pytest.raises(RangeError, match="chunk_size 2.5"):
        R([(0, 4)]).chunk(2.5)
