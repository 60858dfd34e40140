"""Half-open index ranges with MagiAttention's names (``AttnRange``, ``AttnRanges``).

Pure Python and numpy, so that code written against ``magi_attention.common`` keeps working
after an import change. Ranges are ``[start, end)`` with ``start <= end``; empty ranges are
legal. Invalid ranges raise ``RangeError``, a ``ValueError`` (MagiAttention's RangeError is a
plain ``Exception``; ``except RangeError`` works with both). Where MagiAttention asserts
(``chunk`` of overlapping ranges, ``to_cu_seqlens``) we raise ``RangeError`` naming the culprit.
Differences from MagiAttention are listed in the README (MagiAttention compatibility).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Iterable, Iterator, Sequence, Union

import numpy as np

__all__ = ["RangeError", "AttnRange", "AttnRanges", "is_valid_cu_seqlens", "check_valid_cu_seqlens"]

NaiveRange = Union[tuple, list]


class RangeError(ValueError):
    """An invalid range (``start > end``) or an invalid range operation."""


class AttnRange:
    """One half-open range ``[start, end)`` of token indices."""

    __slots__ = ("_start", "_end")

    def __init__(self, start: int, end: int) -> None:
        start, end = int(start), int(end)
        self._check(start, end)
        self._start = start
        self._end = end

    @property
    def start(self) -> int:
        return self._start

    @start.setter
    def start(self, value: int) -> None:
        self._check(int(value), self._end)
        self._start = int(value)

    @property
    def end(self) -> int:
        return self._end

    @end.setter
    def end(self, value: int) -> None:
        self._check(self._start, int(value))
        self._end = int(value)

    @staticmethod
    def _check(start: int, end: int) -> None:
        if start > end:
            raise RangeError(f"range [{start}, {end}) is reversed (start > end)")

    @property
    def seqlen(self) -> int:
        return self._end - self._start

    @staticmethod
    def from_range(attn_range: Union[NaiveRange, "AttnRange"], check: bool = False) -> "AttnRange":
        """A new range from ``(start, end)`` or another ``AttnRange``. Ranges are validated on
        construction, so ``check`` (MagiAttention's opt-in validation) adds nothing."""
        if isinstance(attn_range, AttnRange):
            res = AttnRange(attn_range.start, attn_range.end)
        else:
            try:
                start, end = attn_range
            except (TypeError, ValueError):
                raise RangeError(f"expected a (start, end) pair or an AttnRange, got "
                                 f"{attn_range!r}") from None
            res = AttnRange(start, end)
        if check:
            res.check_valid()
        return res

    # ---- validity (MagiAttention's names) ------------------------------------------------------
    def is_valid_close(self, start: int | None = None, end: int | None = None) -> bool:
        """``start <= end`` (the range read as closed), for this range or the given bounds."""
        start = self._start if start is None else start
        end = self._end if end is None else end
        return start <= end

    def is_valid_open(self, start: int | None = None, end: int | None = None) -> bool:
        """``start < end`` (non-empty as a half-open range), for this range or the given bounds."""
        start = self._start if start is None else start
        end = self._end if end is None else end
        return start < end

    def check_valid(self, start: int | None = None, end: int | None = None) -> None:
        """Raise ``RangeError`` unless ``is_valid_close(start, end)``."""
        s = self._start if start is None else start
        e = self._end if end is None else end
        if not self.is_valid_close(s, e):
            raise RangeError(f"range [{s}, {e}) is reversed (start > end)")

    def to_naive_range(self) -> tuple[int, int]:
        return (self._start, self._end)

    def clone(self) -> "AttnRange":
        return AttnRange(self._start, self._end)

    def offset(self, offset: int) -> "AttnRange":
        return AttnRange(self._start + offset, self._end + offset)

    def truncate(self, start: int | None = None, end: int | None = None) -> "AttnRange":
        """Clip to ``[start, end)``; an empty result is ``[s, s)`` at the clipped start."""
        s = self._start if start is None else max(self._start, start)
        e = self._end if end is None else min(self._end, end)
        return AttnRange(s, max(s, e))

    def intersect(self, other: "AttnRange") -> "AttnRange":
        s = max(self._start, other._start)
        e = min(self._end, other._end)
        return AttnRange(min(s, e), e)

    def intersect_size(self, other: "AttnRange") -> int:
        return self.intersect(other).seqlen

    def union(self, other: "AttnRange") -> list["AttnRange"]:
        """One range if the two overlap or touch, else ``[self, other]`` (copies, in that order);
        with an empty range also ``[self, other]``, as MagiAttention."""
        if self.is_empty() or other.is_empty():
            return [self.clone(), other.clone()]
        if self._start <= other._end and other._start <= self._end:
            return [AttnRange(min(self._start, other._start), max(self._end, other._end))]
        return [self.clone(), other.clone()]

    def union_size(self, other: "AttnRange") -> int:
        return sum(r.seqlen for r in self.union(other))

    def diff_by(self, other: "AttnRange") -> list["AttnRange"]:
        """``other - self``: the non-empty parts of ``other`` outside ``self``."""
        parts = [AttnRange(other.start, max(other.start, min(other.end, self._start))),
                 AttnRange(min(other.end, max(other.start, self._end)), other.end)]
        return [p for p in parts if not p.is_empty()]

    def is_subrange_of(self, other: "AttnRange") -> bool:
        return self._start >= other._start and self._end <= other._end

    def is_overlap_with(self, other: "AttnRange") -> bool:
        return not (self._start >= other._end or self._end <= other._start)

    def is_empty(self) -> bool:
        return self._start == self._end

    def __len__(self) -> int:
        return self.seqlen

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, AttnRange)
                and (self._start, self._end) == (other._start, other._end))

    def __hash__(self) -> int:
        return hash((self._start, self._end))

    def __repr__(self) -> str:
        return f"[{self._start}, {self._end})"


def is_valid_cu_seqlens(cu_seqlens: Sequence[int], seq_len: int) -> bool:
    """``cu_seqlens[0] == 0``, non-decreasing, ends at ``seq_len``; an empty list is valid (no
    documents), as MagiAttention. Unlike MagiAttention, equal neighbours (empty documents)
    are allowed."""
    cu = [int(x) for x in cu_seqlens]
    if not cu:
        return True
    return cu[0] == 0 and all(a <= b for a, b in zip(cu, cu[1:])) and cu[-1] == seq_len


def check_valid_cu_seqlens(cu_seqlens: Sequence[int], seq_len: int) -> None:
    if not is_valid_cu_seqlens(cu_seqlens, seq_len):
        raise RangeError(f"cu_seqlens {list(map(int, cu_seqlens))} must start at 0, never "
                         f"decrease and end at seq_len {seq_len}")


class AttnRanges:
    """An ordered list of ``AttnRange``: document boundaries, the q or k side of a mask.

    ``AttnRanges()`` is empty as in MagiAttention; ``AttnRanges([[s, e], ...])`` is a shorthand
    for ``from_ranges``. Ranges are stored as given (copies of them), never sorted implicitly.
    """

    def __init__(self, ranges: Iterable[Union[NaiveRange, AttnRange]] = ()) -> None:
        self._ranges: list[AttnRange] = [AttnRange.from_range(r) for r in ranges]

    # ---- construction and conversion -------------------------------------------------------
    @staticmethod
    def from_ranges(ranges: Union[Iterable[Union[NaiveRange, AttnRange]], "AttnRanges", np.ndarray],
                    check: bool = False) -> "AttnRanges":
        """From ``[[s, e], ...]``, AttnRange objects, an int array ``[N, 2]`` or a tensor (always
        validated; ``check`` is MagiAttention's opt-in and changes nothing here)."""
        if isinstance(ranges, AttnRanges):
            out = ranges.clone()
        else:
            if hasattr(ranges, "tolist"):  # numpy array or torch tensor
                ranges = ranges.tolist()
            out = AttnRanges(ranges)
        if check:
            out.check_valid()
        return out

    @staticmethod
    def from_cu_seqlens(cu_seqlens: Sequence[int], seq_len: int | None = None) -> "AttnRanges":
        """``[0, 3, 7]`` -> ``[[0, 3), [3, 7)]``; ``seq_len`` defaults to ``cu_seqlens[-1]``.
        An empty list gives empty ranges (whatever ``seq_len``), as MagiAttention."""
        if hasattr(cu_seqlens, "tolist"):  # numpy array or torch tensor
            cu_seqlens = cu_seqlens.tolist()
        cu = [int(x) for x in cu_seqlens]
        check_valid_cu_seqlens(cu, cu[-1] if seq_len is None and cu else (seq_len or 0))
        return AttnRanges(zip(cu[:-1], cu[1:]))

    def to_cu_seqlens(self, seq_len: int | None = None) -> list[int]:
        """Inverse of ``from_cu_seqlens`` (``[0]`` when empty); the ranges must tile
        ``[0, seq_len)`` in order."""
        seq_len = (self._ranges[-1].end if self._ranges else 0) if seq_len is None else seq_len
        if not self.is_cu_seqlens(seq_len):
            raise RangeError(f"{self!r} does not tile [0, {seq_len}) in order, so it has no "
                             "cu_seqlens")
        return [0] + [r.end for r in self._ranges]

    def to_naive_ranges(self) -> list[tuple[int, int]]:
        return [r.to_naive_range() for r in self._ranges]

    def to_array(self, dtype: Any = np.int64) -> np.ndarray:
        """``[N, 2]`` integer array (what ``Mask`` and ``flex_flash_attn_func`` take)."""
        n = len(self._ranges)  # one pass over the slots, no tuple per range (per-call cost)
        flat = np.fromiter((x for r in self._ranges for x in (r._start, r._end)), dtype=np.int64,
                           count=2 * n)
        return flat.astype(dtype, copy=False).reshape(n, 2)

    def to_tensor(self, device: str = "cpu", dtype: Any = None):
        """``[N, 2]`` torch tensor, int32 by default as in MagiAttention (needs torch)."""
        import torch

        return torch.tensor(self.to_array(), dtype=dtype or torch.int32, device=device)

    def clone(self) -> "AttnRanges":
        out = AttnRanges()
        out._ranges = [r.clone() for r in self._ranges]
        return out

    # ---- validity ---------------------------------------------------------------------------
    def is_valid(self) -> bool:
        """Every range has ``start <= end`` (always true: ranges are checked when made)."""
        return all(r.is_valid_close() for r in self._ranges)

    def check_valid(self) -> None:
        """Raise ``RangeError`` (a ``ValueError``, MagiAttention's type) naming a bad range."""
        for idx, r in enumerate(self._ranges):
            if not r.is_valid_close():
                raise RangeError(f"range {idx} [{r._start}, {r._end}) is reversed (start > end)")

    # ---- list operations --------------------------------------------------------------------
    def append(self, attn_range: Union[NaiveRange, AttnRange], check: bool = False) -> None:
        self._ranges.append(AttnRange.from_range(attn_range, check))

    def insert(self, idx: int, attn_range: Union[NaiveRange, AttnRange], check: bool = False) -> None:
        self._ranges.insert(idx, AttnRange.from_range(attn_range, check))

    def extend(self, attn_ranges: Iterable[Union[NaiveRange, AttnRange]], check: bool = False) -> None:
        self._ranges.extend([AttnRange.from_range(r, check) for r in attn_ranges])

    def pop(self, idx: int = -1) -> AttnRange:
        if not self._ranges:
            raise IndexError("pop from empty AttnRanges")
        return self._ranges.pop(idx)

    def clear_empty(self) -> "AttnRanges":
        return AttnRanges(r for r in self._ranges if not r.is_empty())

    # ---- set algebra ------------------------------------------------------------------------
    def sort(self) -> "AttnRanges":
        """Sorted by start (stable), as a new object."""
        return AttnRanges(sorted(self._ranges, key=lambda r: r.start))

    def merge(self) -> "AttnRanges":
        """Sorted union: overlapping or touching ranges fuse; empty ranges disappear."""
        return self.merge_with_split_alignment(1)

    def merge_with_split_alignment(self, split_alignment: int = 1) -> "AttnRanges":
        """``merge`` after widening every range outwards to multiples of ``split_alignment``
        (start rounded down, end up), so every merged start and end is aligned. Empty ranges
        disappear."""
        if int(split_alignment) != split_alignment or split_alignment <= 0:
            raise RangeError(f"split_alignment {split_alignment} must be a positive integer")
        a = int(split_alignment)
        merged: list[list[int]] = []
        for r in self.sort():
            if r.is_empty():
                continue
            start, end = r.start // a * a, -(-r.end // a) * a
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return AttnRanges(merged)

    def union(self, other: "AttnRanges") -> "AttnRanges":
        return AttnRanges([*self._ranges, *other._ranges]).merge()

    def intersect(self, other: "AttnRanges") -> "AttnRanges":
        """Merged intersection of the two unions (MagiAttention: ``find_overlap_ranges``)."""
        a, b = self.merge()._ranges, other.merge()._ranges
        out, i, j = AttnRanges(), 0, 0
        while i < len(a) and j < len(b):
            if a[i].is_overlap_with(b[j]):
                out.append(a[i].intersect(b[j]))
            if a[i].end <= b[j].end:
                i += 1
            else:
                j += 1
        return out

    def find_overlap_ranges(self, other_attn_ranges: "AttnRanges", is_self_merged: bool = False,
                            is_other_merged: bool = False) -> "AttnRanges":
        """``self ∩ other`` as merged ranges. The ``is_*_merged`` hints are accepted and not
        needed: both sides are merged here anyway (same answer for merged input, and no wrong
        answer when the hint is false)."""
        return self.intersect(other_attn_ranges)

    def find_hole_ranges(self, other_attn_ranges: "AttnRanges", is_self_merged: bool = False,
                         is_other_merged: bool = False) -> "AttnRanges":
        """``self - other`` as merged ranges (the ``is_*_merged`` hints as in
        ``find_overlap_ranges``)."""
        holes, b = AttnRanges(), other_attn_ranges.merge()._ranges
        for r in self.merge():
            start = r.start
            for o in b:
                if o.end <= start or o.start >= r.end:
                    continue
                if o.start > start:
                    holes.append((start, o.start))
                start = max(start, o.end)
            if start < r.end:
                holes.append((start, r.end))
        return holes

    def truncate(self, start: int | None = None, end: int | None = None) -> "AttnRanges":
        """Clip every range to ``[start, end)`` and drop the ones that become empty."""
        clipped = (r.truncate(start, end) for r in self._ranges)
        return AttnRanges(r for r in clipped if not r.is_empty())

    def chunk(self, chunk_size: int, check: bool = True) -> list["AttnRanges"]:
        """Cut the ranges, in order, into consecutive groups of ``chunk_size`` tokens (the last
        may be shorter). ``check`` rejects self-overlapping ranges (MagiAttention asserts)."""
        if int(chunk_size) != chunk_size or chunk_size <= 0:
            raise RangeError(f"chunk_size {chunk_size} must be a positive integer")
        if check and not self.is_non_overlap():
            raise RangeError(f"{self!r} overlaps itself, so it cannot be chunked")
        chunks: list[AttnRanges] = []
        current, filled = AttnRanges(), 0
        for r in self._ranges:
            start = r.start
            while start < r.end:
                take = min(chunk_size - filled, r.end - start)
                current.append((start, start + take))
                start += take
                filled += take
                if filled == chunk_size:
                    chunks.append(current)
                    current, filled = AttnRanges(), 0
        if len(current):
            chunks.append(current)
        return chunks

    # ---- local coordinates ------------------------------------------------------------------
    def make_range_local(self, other_attn_range: AttnRange, is_self_merged: bool = False,
                         prefix_offset: list[int] | None = None) -> tuple[AttnRange, AttnRange]:
        """Where ``other_attn_range`` lies once ``self.merge()``'s ranges are laid end to end:
        ``(local_range, target_range)``, ``target_range`` being the merged range holding it.
        ``is_self_merged`` skips the merge (self must then be merged); ``prefix_offset`` is the
        start of each merged range in that layout (computed when None). Raises ``RangeError``
        (a ``ValueError``, MagiAttention's type) when no merged range holds it."""
        merged = self._merged_for_local(is_self_merged)
        if prefix_offset is None:
            prefix_offset = _prefix_offset(merged)
        elif len(prefix_offset) != len(merged):
            raise RangeError(f"prefix_offset has {len(prefix_offset)} entries but there are "
                             f"{len(merged)} merged ranges")
        starts = [r.start for r in merged._ranges]
        return merged._local(AttnRange.from_range(other_attn_range), starts, prefix_offset)

    def make_ranges_local(self, other_attn_ranges: "AttnRanges",
                          is_self_merged: bool = False) -> "AttnRanges":
        """``make_range_local`` of every range of ``other_attn_ranges`` (local ranges only)."""
        merged = self._merged_for_local(is_self_merged)
        offsets, starts = _prefix_offset(merged), [r.start for r in merged._ranges]
        return AttnRanges(merged._local(AttnRange.from_range(r), starts, offsets)[0]
                          for r in other_attn_ranges)

    def _merged_for_local(self, is_self_merged: bool) -> "AttnRanges":
        if not is_self_merged:
            return self.merge()
        if not self.is_merged():  # a false promise would give wrong offsets silently
            raise RangeError(f"is_self_merged=True but {self!r} is not merged (sorted, neither "
                             "overlapping nor touching)")
        return self

    def _local(self, other: AttnRange, starts: list[int],
               offsets: list[int]) -> tuple[AttnRange, AttnRange]:
        idx = bisect.bisect_right(starts, other.start) - 1
        if idx >= 0 and other.is_subrange_of(self._ranges[idx]):
            target = self._ranges[idx]
            start = offsets[idx] + other.start - target.start
            return AttnRange(start, start + other.seqlen), target
        raise RangeError(f"range {other!r} is not inside {self!r}")

    # ---- predicates -------------------------------------------------------------------------
    def is_sorted(self) -> bool:
        return all(a.start <= b.start for a, b in zip(self._ranges, self._ranges[1:]))

    def is_merged(self) -> bool:
        """Sorted, with neither overlap nor contact between neighbours."""
        pairs = zip(self._ranges, self._ranges[1:])
        return self.is_sorted() and all(a.end < b.start for a, b in pairs)

    def is_non_overlap(self) -> bool:
        return self.total_seqlen == self.merge().total_seqlen

    def is_cu_seqlens(self, seqlen: int) -> bool:
        """The ranges tile ``[0, seqlen)`` in order (empty ranges only when ``seqlen == 0``)."""
        if not self._ranges:
            return seqlen == 0
        return (self._ranges[0].start == 0 and self._ranges[-1].end == seqlen
                and all(a.end == b.start for a, b in zip(self._ranges, self._ranges[1:])))

    def is_empty(self) -> bool:
        return not self._ranges

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def total_seqlen(self) -> int:
        """Sum of the lengths (overlaps counted twice)."""
        return sum(r.seqlen for r in self._ranges)

    @property
    def max_seqlen(self) -> int:
        return max((r.seqlen for r in self._ranges), default=0)

    def union_size(self) -> int:
        """``total_seqlen``, overlaps counted twice: MagiAttention's definition (for the size of
        the covered set use ``merge().total_seqlen``)."""
        return self.total_seqlen

    def union_size_with(self, other: "AttnRanges") -> int:
        """``self.total_seqlen + other.total_seqlen`` (MagiAttention's definition)."""
        return self.total_seqlen + other.total_seqlen

    def intersect_size(self) -> int:
        """Tokens covered more than once, each counted (cover count - 1) times."""
        return self.total_seqlen - self.merge().total_seqlen

    def intersect_size_with(self, other: "AttnRanges") -> int:
        """Over the tokens in both ``self`` and ``other``: how often the two lists together
        cover each, minus one (for merged inputs, the size of ``self ∩ other``)."""
        both = self.intersect(other)._ranges
        pieces = AttnRanges()
        for r in (*self._ranges, *other._ranges):  # each cut to self ∩ other, with multiplicity
            pieces._ranges.extend(r.intersect(o) for o in both if r.is_overlap_with(o))
        return pieces.intersect_size()

    @property
    def start(self) -> int:
        if not self._ranges:
            raise RangeError("empty AttnRanges has no start")
        return min(r.start for r in self._ranges)

    @property
    def end(self) -> int:
        if not self._ranges:
            raise RangeError("empty AttnRanges has no end")
        return max(r.end for r in self._ranges)

    @property
    def size(self) -> int:
        return len(self._ranges)

    @property
    def points(self) -> list[int]:
        return sorted({p for r in self._ranges for p in (r.start, r.end)})

    # ---- container protocol -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ranges)

    def __getitem__(self, idx: int | slice):
        if isinstance(idx, slice):
            return AttnRanges(self._ranges[idx])
        return self._ranges[idx]

    def __setitem__(self, idx: int | slice, value: Any) -> None:
        """``ranges[i] = (s, e)`` or an ``AttnRange``; ``ranges[a:b] = AttnRanges`` (or a list of
        ranges) of the same length as the slice, as MagiAttention."""
        if isinstance(idx, slice):
            new = [AttnRange.from_range(r) for r in value]
            old = range(*idx.indices(len(self._ranges)))
            if len(new) != len(old):
                raise RangeError(f"slice assignment of {len(new)} ranges to a slice of "
                                 f"{len(old)} (lengths must match)")
            self._ranges[idx] = new
        else:
            self._ranges[idx] = AttnRange.from_range(value)

    def __iter__(self) -> Iterator[AttnRange]:
        return iter(self._ranges)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AttnRanges) and self._ranges == other._ranges

    def __hash__(self) -> int:
        return hash(tuple(self._ranges))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.to_array(dtype or np.int64)

    def __repr__(self) -> str:
        """MagiAttention's: ``[[0, 3), [3, 7)]``, and ``[[,)]`` when empty (not ``[]``)."""
        return f"{self._ranges!r}" if self._ranges else "[[,)]"


def _prefix_offset(merged: AttnRanges) -> list[int]:
    """Start of each merged range once they are laid end to end."""
    return list(itertools.accumulate((r.seqlen for r in merged._ranges[:-1]), initial=0)) \
        if len(merged) else []
