"""``AttnMask``: MagiAttention's dense-mask view of a slice list, on top of our ``Mask``.

The slices stay the truth (a validated C++ ``Mask``: overlapping cells are rejected); the
dense ``[Sq, Sk]`` int32 flags are built from them only when asked for (``mask_flag_array``,
``calc_sub_area``, ``make_sub_mask``), since they cost Sq * Sk. Needs numpy only; the
``mask_tensor`` attribute imports torch. Not a ``torch.nn.Module`` (MagiAttention's is one,
with no parameters).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from ._C import from_dense
from .masks import AttnMaskType, Mask, make_mask, mask_to_ranges
from .ranges import AttnRange, AttnRanges

__all__ = ["AttnMask"]

_FACTORY = object()  # only the factory methods may construct, as in MagiAttention


class AttnMask:
    """A mask as ``(q_ranges, k_ranges, attn_mask_type)`` plus its dense 0/1 matrix.

    Make one with ``AttnMask.from_ranges`` or ``AttnMask.from_mask``; the constructor itself
    raises ``RuntimeError``. Every slice type is accepted (MagiAttention's ``from_ranges``
    takes FULL and CAUSAL only).
    """

    masked_flag = 0
    unmasked_flag = 1

    def __init__(self, mask: Mask, q_ranges: AttnRanges, k_ranges: AttnRanges,
                 attn_mask_type: list[AttnMaskType], _token: Any = None) -> None:
        if _token is not _FACTORY:
            raise RuntimeError("use the factory methods AttnMask.from_ranges or "
                               "AttnMask.from_mask to make an AttnMask")
        self.mask = mask
        self.q_ranges, self.k_ranges, self.attn_mask_type = q_ranges, k_ranges, attn_mask_type
        self.total_seqlen_q, self.total_seqlen_k = mask.total_seqlen_q, mask.total_seqlen_k
        self._dense: Optional[np.ndarray] = None

    # ---- factories ------------------------------------------------------------------------------
    @classmethod
    def from_ranges(cls, q_ranges: Any, k_ranges: Any, attn_mask_type: Any,
                    total_seqlen_q: int | None = None,
                    total_seqlen_k: int | None = None) -> "AttnMask":
        """From slices; the lengths default to the largest range end. ``ValueError`` when the
        three lists differ in length, a range leaves the sequence or two slices share a cell."""
        qr, kr = AttnRanges.from_ranges(q_ranges), AttnRanges.from_ranges(k_ranges)
        types = attn_mask_type if isinstance(attn_mask_type, (list, tuple)) else \
            [attn_mask_type] * len(qr)
        if not len(qr) == len(kr) == len(types):
            raise ValueError(f"q_ranges, k_ranges and attn_mask_type must have one entry per "
                             f"slice, got {len(qr)}, {len(kr)} and {len(types)}")
        mask = make_mask(qr, kr, list(types), total_seqlen_q, total_seqlen_k)
        _, _, as_types = mask_to_ranges(mask)
        return cls(mask, qr, kr, as_types, _token=_FACTORY)

    @classmethod
    def from_mask(cls, mask: Any) -> "AttnMask":
        """From a dense 2-D mask (nested lists, numpy or torch; nonzero = visible). Its slices
        are our ``from_dense`` decomposition (runs of equal rows, causal steps), which may use
        INV_CAUSAL / BI_CAUSAL and need not equal MagiAttention's; rows need not be contiguous."""
        if hasattr(mask, "detach"):
            mask = mask.detach().cpu().numpy()
        dense = np.asarray(mask)
        if dense.ndim != 2:
            raise ValueError(f"mask: expected a 2-D matrix, got shape {list(dense.shape)}")
        m = from_dense(np.ascontiguousarray(dense != 0, dtype=np.uint8))
        qr, kr, types = mask_to_ranges(m)
        return cls(m, qr, kr, types, _token=_FACTORY)

    # ---- dense view -----------------------------------------------------------------------------
    @property
    def mask_flag_array(self) -> np.ndarray:
        """int32 ``[Sq, Sk]``: 1 where visible, 0 elsewhere (built once, on first use)."""
        if self._dense is None:
            self._dense = np.asarray(self.mask.to_dense()).astype(np.int32)
        return self._dense

    @property
    def mask_tensor(self):
        """int32 torch tensor ``[Sq, Sk, 1]`` of the flags, MagiAttention's layout."""
        import torch

        return torch.from_numpy(self.mask_flag_array).unsqueeze(-1)

    def tuples(self) -> Iterable[tuple[AttnRange, AttnRange, AttnMaskType]]:
        yield from zip(self.q_ranges, self.k_ranges, self.attn_mask_type)

    def _check_sub_range(self, q_range: Any, k_range: Any) -> tuple[AttnRange, AttnRange]:
        q, k = AttnRange.from_range(q_range), AttnRange.from_range(k_range)
        if q.start < 0 or q.end > self.total_seqlen_q:
            raise ValueError(f"q_range {q!r} is outside [0, {self.total_seqlen_q})")
        if k.start < 0 or k.end > self.total_seqlen_k:
            raise ValueError(f"k_range {k!r} is outside [0, {self.total_seqlen_k})")
        return q, k

    def calc_sub_area(self, q_range: Any, k_range: Any) -> int:
        """Visible cells inside the rectangle ``q_range x k_range``."""
        q, k = self._check_sub_range(q_range, k_range)
        return int(self.mask_flag_array[q.start:q.end, k.start:k.end].sum())

    def make_sub_mask(self, q_range: Any, k_range: Any) -> "AttnMask":
        """The rectangle ``q_range x k_range`` as its own mask (local coordinates)."""
        q, k = self._check_sub_range(q_range, k_range)
        return AttnMask.from_mask(self.mask_flag_array[q.start:q.end, k.start:k.end])

    # ---- predicates -----------------------------------------------------------------------------
    @property
    def area(self) -> int:
        return int(self.mask.area())

    def is_square(self) -> bool:
        return self.total_seqlen_q == self.total_seqlen_k

    def is_pure_full(self) -> bool:
        return self.area == self.total_seqlen_q * self.total_seqlen_k

    def is_pure_causal(self) -> bool:
        """The whole matrix is one bottom-right aligned causal mask."""
        want = self.make_causal_mask(self.total_seqlen_q, self.total_seqlen_k)
        return bool(np.array_equal(self.mask_flag_array, want))

    def _is_varlen(self, t: AttnMaskType) -> bool:
        return (all(x == t for x in self.attn_mask_type)
                and self.q_ranges.is_cu_seqlens(self.total_seqlen_q)
                and self.k_ranges.is_cu_seqlens(self.total_seqlen_k))

    def is_varlen_full(self) -> bool:
        return self._is_varlen(AttnMaskType.FULL)

    def is_varlen_causal(self) -> bool:
        return self._is_varlen(AttnMaskType.CAUSAL)

    def is_empty(self) -> bool:
        return self.area == 0

    @staticmethod
    def make_causal_mask(seqlen_q: int, seqlen_k: int, align: str = "bottom-right",
                         dtype: Any = np.int32, device: Any = None) -> np.ndarray:
        """0/1 ``[seqlen_q, seqlen_k]`` causal matrix, "bottom-right" or "top-left" aligned
        (numpy; with ``device`` a torch tensor on it)."""
        i = np.arange(seqlen_q)[:, None]
        j = np.arange(seqlen_k)[None, :]
        if align == "bottom-right":
            out = j <= i + (seqlen_k - seqlen_q)
        elif align == "top-left":
            out = j <= i
        else:
            raise ValueError(f"align: '{align}' is not 'bottom-right' or 'top-left'")
        if device is None:
            return out.astype(dtype)
        import torch

        return torch.from_numpy(out.astype(np.int32)).to(device=device, dtype=dtype)

    def visualize(self, save_path: str | None = None) -> None:
        """Draw the mask (matplotlib) and save it to ``save_path`` when given."""
        from .viz import plot_mask, save_mask_png

        if save_path is None:
            plot_mask(self.mask)
        else:
            save_mask_png(self.mask, save_path)

    def __eq__(self, other: Any) -> bool:
        return (isinstance(other, AttnMask) and self.mask == other.mask
                and self.q_ranges == other.q_ranges and self.k_ranges == other.k_ranges
                and self.attn_mask_type == other.attn_mask_type)

    __hash__ = None  # mutable attributes, as MagiAttention's

    def __repr__(self) -> str:
        return (f"AttnMask(total_seqlen_q={self.total_seqlen_q}, total_seqlen_k="
                f"{self.total_seqlen_k}, area={self.area}, q_ranges={self.q_ranges!r}, "
                f"k_ranges={self.k_ranges!r}, attn_mask_type="
                f"[{', '.join(t.name for t in self.attn_mask_type)}])")
