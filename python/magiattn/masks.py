"""Masks: the C++ ``Mask`` and builders, plus MagiAttention-named helpers on top of them.

Every builder lives in C++ (one definition of mask semantics, docs/semantics.md §1); this
module only re-exports them and adds the conversions MagiAttention users expect:
``AttnMaskType``, ``infer_attn_mask_from_cu_seqlens`` and friends returning ``AttnRanges``.
"""

from __future__ import annotations

import enum
from typing import Any, Sequence, Union

import numpy as np

from ._C import (  # noqa: F401  (re-exported)
    Mask,
    block_causal,
    block_sparse,
    block_sparse_topk,
    build_family,
    causal,
    family_names,
    from_dense,
    full,
    load_mask,
    mask_from_json,
    prefix_lm,
    sample_doc_lengths,
    save_mask,
    shared_question,
    sliding_window,
    varlen_block_causal,
    varlen_causal,
    varlen_full,
    varlen_sliding_window,
)
from .ranges import AttnRange, AttnRanges

__all__ = [
    "Mask", "AttnMaskType", "make_mask", "mask_to_ranges",
    "full", "causal", "varlen_full", "varlen_causal", "sliding_window", "varlen_sliding_window",
    "block_causal", "varlen_block_causal", "prefix_lm", "shared_question", "block_sparse",
    "block_sparse_topk", "from_dense", "build_family", "family_names", "sample_doc_lengths",
    "mask_from_json", "load_mask", "save_mask",
    "infer_attn_mask_from_cu_seqlens", "infer_attn_mask_from_sliding_window",
    "infer_varlen_mask_from_batch",
]


class AttnMaskType(str, enum.Enum):
    """Slice types with MagiAttention's names and values; ints as in ``attn_type_map``."""

    FULL = "full"
    CAUSAL = "causal"
    INVCAUSAL = "inv_causal"
    BICAUSAL = "bi_causal"

    def __str__(self) -> str:
        return self.value

    def to_int_type(self) -> int:
        return _TYPE_TO_INT[self]

    @classmethod
    def from_int_type(cls, int_type: int) -> "AttnMaskType":
        """0 FULL, 1 CAUSAL, 2 INVCAUSAL, 3 BICAUSAL; anything else is a ValueError."""
        try:
            return _INT_TO_TYPE[int(int_type)]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"mask type {int_type!r} is not 0 (full), 1 (causal), "
                             "2 (inv_causal) or 3 (bi_causal)") from None


_TYPE_TO_INT = {AttnMaskType.FULL: 0, AttnMaskType.CAUSAL: 1, AttnMaskType.INVCAUSAL: 2,
                AttnMaskType.BICAUSAL: 3}
_INT_TO_TYPE = {v: k for k, v in _TYPE_TO_INT.items()}

TypeLike = Union[AttnMaskType, str, int]


def _type_int(t: TypeLike, idx: int) -> int:
    """One slice type as its int; ints pass through (the C++ Mask checks their range)."""
    if isinstance(t, AttnMaskType):
        return t.to_int_type()
    if isinstance(t, str):
        try:
            return AttnMaskType(t.lower()).to_int_type()
        except ValueError:
            raise ValueError(f"slice {idx}: unknown mask type '{t}' (expected full, causal, "
                             "inv_causal or bi_causal)") from None
    if isinstance(t, (int, np.integer)):
        return int(t)
    raise ValueError(f"slice {idx}: mask type {t!r} is not an int, a name or an AttnMaskType")


def _ranges_array(ranges: Any, name: str) -> np.ndarray:
    if isinstance(ranges, AttnRanges):
        return ranges.to_array()
    if hasattr(ranges, "detach"):  # torch tensor
        ranges = ranges.detach().cpu().numpy()
    arr = np.asarray(ranges)
    if arr.size == 0:
        return np.zeros((0, 2), np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected integer ranges of shape [N, 2], got "
                         f"{arr.dtype} {list(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def make_mask(q_ranges: Any, k_ranges: Any, attn_mask_type: Any = None,
              total_seqlen_q: int | None = None, total_seqlen_k: int | None = None) -> Mask:
    """A ``Mask`` from ranges in any form (``AttnRanges``, lists, arrays, tensors).

    ``attn_mask_type`` is one type for every slice or one per slice, each an ``AttnMaskType``,
    a name ("full", "causal", "inv_causal", "bi_causal") or an int 0..3; None means FULL.
    Sequence lengths default to the largest range end.
    """
    q = _ranges_array(q_ranges, "q_ranges")
    k = _ranges_array(k_ranges, "k_ranges")
    if attn_mask_type is None:
        types = None
    elif isinstance(attn_mask_type, (str, int, AttnMaskType)):
        types = np.full(len(q), _type_int(attn_mask_type, 0), np.int32)
    else:
        if hasattr(attn_mask_type, "detach"):
            attn_mask_type = attn_mask_type.detach().cpu().numpy()
        types = np.array([_type_int(t, i) for i, t in enumerate(list(attn_mask_type))],
                         dtype=np.int32)
    total_q = int(q[:, 1].max(initial=0)) if total_seqlen_q is None else int(total_seqlen_q)
    total_k = int(k[:, 1].max(initial=0)) if total_seqlen_k is None else int(total_seqlen_k)
    return Mask(total_q, total_k, q, k, types)


def mask_to_ranges(mask: Mask) -> tuple[AttnRanges, AttnRanges, list[AttnMaskType]]:
    """The mask's slices as MagiAttention's ``(q_ranges, k_ranges, attn_mask_type)``."""
    return (AttnRanges.from_ranges(mask.q_ranges()), AttnRanges.from_ranges(mask.k_ranges()),
            [AttnMaskType.from_int_type(t) for t in mask.attn_type_map()])


def _cu_list(cu: Any, name: str) -> np.ndarray:
    if hasattr(cu, "detach"):
        cu = cu.detach().cpu().numpy()
    arr = np.asarray(cu)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected a 1-D integer array, got {arr.dtype} {list(arr.shape)}")
    return arr.astype(np.int64, copy=False)


def infer_attn_mask_from_cu_seqlens(
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    global_window_size: int = 0,
) -> tuple[AttnRanges, AttnRanges, list[AttnMaskType], int, int]:
    """flash-attn varlen arguments to slices, as MagiAttention's helper of the same name.

    Returns ``(q_ranges, k_ranges, attn_mask_type, total_seqlen_q, total_seqlen_k)``.
    ``window_size = (left, right)`` (-1 = unbounded) is bottom-right aligned per document like
    flash-attn; ``causal=True`` requires ``window_size == (-1, -1)``. ``global_window_size = G``
    lets every query also see the first G keys of its document, capped at its window's right
    edge (the C++ ``varlen_sliding_window`` with ``num_global``); the slices' rectangles are
    disjoint. With ``window_size == (-1, -1)`` the globals add nothing, as in MagiAttention.
    """
    cu_q = _cu_list(cu_seqlens_q, "cu_seqlens_q")
    cu_k = _cu_list(cu_seqlens_k, "cu_seqlens_k")
    left, right = _window(window_size)
    if causal and (left, right) != (-1, -1):
        raise ValueError(f"window_size {tuple(window_size)}: must be (-1, -1) when causal=True "
                         "(a causal sliding window is window_size=(left, 0))")
    if global_window_size < 0:
        raise ValueError(f"global_window_size {global_window_size} is negative")
    if (left, right) == (-1, -1) and global_window_size == 0:
        mask = (varlen_causal if causal else varlen_full)(cu_q, cu_k)
    else:
        if causal:
            right = 0
        mask = varlen_sliding_window(cu_q, cu_k, left, right, global_window_size)
    q_ranges, k_ranges, types = mask_to_ranges(mask)
    return q_ranges, k_ranges, types, mask.total_seqlen_q, mask.total_seqlen_k


def _window(window_size: Any) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: {window_size!r} must be a pair of ints (left, right), "
                         "-1 meaning unbounded") from None
    return left, right


def infer_attn_mask_from_sliding_window(
    q_range: Union[AttnRange, Sequence[int]],
    k_range: Union[AttnRange, Sequence[int]],
    window_size: tuple[int, int],
) -> tuple[AttnRanges, AttnRanges, list[AttnMaskType]]:
    """The (at most 3) slices of a bottom-right aligned window over one q/k block. When the q
    range is longer than the k range only its last ``sk`` rows attend (MagiAttention's rule:
    the first ``sq - sk`` rows sit left of key 0 and see nothing)."""
    q, k = AttnRange.from_range(q_range), AttnRange.from_range(k_range)
    left, right = _window(window_size)
    mask = sliding_window(q.seqlen, k.seqlen, left, right)
    return (AttnRanges((s + q.start, e + q.start) for s, e in mask.q_ranges().tolist()),
            AttnRanges((s + k.start, e + k.start) for s, e in mask.k_ranges().tolist()),
            [AttnMaskType.from_int_type(t) for t in mask.attn_type_map()])


def infer_varlen_mask_from_batch(batch_size: int, seq_len: int,
                                 device: Any = None) -> tuple[Any, Any]:
    """``cu_seqlens_q, cu_seqlens_k`` of a padded batch packed as ``[batch * seq, ...]``:
    int64 numpy arrays, or with ``device`` (MagiAttention's default is "cuda") int32 torch
    tensors on it."""
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len)):
        if int(v) != v or v < 0:
            raise ValueError(f"{name}: {v!r} must be an int >= 0")
    cu = np.arange(int(batch_size) + 1, dtype=np.int64) * int(seq_len)
    if device is None:
        return cu, cu.copy()
    import torch

    t = torch.from_numpy(cu).to(dtype=torch.int32, device=device)
    return t, t.clone()
