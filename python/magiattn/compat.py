"""The rest of ``magi_attention.api``: padding and batch helpers, key-and-dispatch in one call,
``roll_simple``, and the most-recent-key registry.

Thin by design: each function is a composition of magiattn calls that already exist (keys and
dispatch in ``dist``), kept apart so that ``dist`` stays about communication. What is not
provided, and why, is listed in the README (MagiAttention compatibility).
"""

from __future__ import annotations

from typing import Any, Optional

from . import dist
from .plan import DistAttnConfig

__all__ = ["compute_pad_size", "squash_batch_dim", "magi_attn_flex_dispatch",
           "magi_attn_varlen_dispatch", "roll_simple", "get_most_recent_key", "clear_cache"]


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ValueError(f"{name}: {value!r} must be a positive int")
    return int(value)


def compute_pad_size(total_seqlen_q: int, cp_size: int, chunk_size: int) -> int:
    """Tokens to append so that ``total_seqlen_q`` is a multiple of ``cp_size * chunk_size``.
    magiattn's planner needs no padding (``DistAttnConfig(uneven=True)`` takes any length);
    this is for code that pads anyway."""
    if isinstance(total_seqlen_q, bool) or int(total_seqlen_q) != total_seqlen_q \
            or total_seqlen_q < 0:
        raise ValueError(f"total_seqlen_q: {total_seqlen_q!r} must be an int >= 0")
    block = _positive(cp_size, "cp_size") * _positive(chunk_size, "chunk_size")
    return -int(total_seqlen_q) % block


def squash_batch_dim(x: Any) -> Any:
    """``[b, s, ...]`` -> ``[b * s, ...]`` (numpy array or torch tensor; a view when possible)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 2:
        raise ValueError(f"x: expected an array or tensor of at least 2 dims [b, s, ...], got "
                         f"{'shape ' + str(list(shape)) if shape is not None else type(x).__name__}")
    return x.reshape((shape[0] * shape[1],) + tuple(shape[2:]))


def magi_attn_flex_dispatch(x: Any, q_ranges: Any, k_ranges: Any, attn_mask_type: Any,
                            total_seqlen_q: int, total_seqlen_k: int, num_heads_q: int,
                            num_heads_kv: int, head_dim: int, pad_size: int = 0,
                            cp_group_or_mesh: Any = None,
                            dist_attn_config: Optional[DistAttnConfig] = None,
                            is_same_source: bool = True, is_q_permutable: bool = True,
                            is_k_permutable: bool = True,
                            chunk_size: Optional[int] = None) -> tuple[Any, "dist.DistAttnRuntimeKey"]:
    """``magi_attn_flex_key`` then ``dispatch(x, key)``: ``(local_x, key)``."""
    key = dist.magi_attn_flex_key(q_ranges, k_ranges, attn_mask_type, total_seqlen_q,
                                  total_seqlen_k, num_heads_q, num_heads_kv, head_dim, pad_size,
                                  cp_group_or_mesh, dist_attn_config, is_same_source,
                                  is_q_permutable, is_k_permutable, chunk_size)
    return dist.dispatch(x, key), key


def magi_attn_varlen_dispatch(x: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, num_heads_q: int,
                              num_heads_kv: int, head_dim: int, pad_size: int = 0,
                              cp_group_or_mesh: Any = None, causal: bool = False,
                              window_size: tuple[int, int] = (-1, -1),
                              dist_attn_config: Optional[DistAttnConfig] = None,
                              chunk_size: Optional[int] = None) -> tuple[Any, "dist.DistAttnRuntimeKey"]:
    """``magi_attn_varlen_key`` then ``dispatch(x, key)``: ``(local_x, key)``."""
    key = dist.magi_attn_varlen_key(cu_seqlens_q, cu_seqlens_k, num_heads_q, num_heads_kv,
                                    head_dim, pad_size, cp_group_or_mesh, causal, window_size,
                                    dist_attn_config, chunk_size)
    return dist.dispatch(x, key), key


def roll_simple(x: Any, shift: int, dim: int, key: "dist.DistAttnRuntimeKey") -> Any:
    """``roll`` (MagiAttention's variant differs only in its P2P calls; ours is one path)."""
    return dist.roll(x, shift, dim, key)


def get_most_recent_key(cp_group: Any = None) -> "dist.DistAttnRuntimeKey":
    """The key most recently made by ``magi_attn_flex_key`` / ``magi_attn_varlen_key`` (or the
    ``*_dispatch`` calls) for this group object (None: the world). ``ValueError`` when there is
    none, or when it was cleared or no longer referenced anywhere (held weakly)."""
    entry = dist._recent_keys.get(id(cp_group))
    key = entry[1]() if entry is not None and entry[0] is cp_group else None
    if key is None:
        raise ValueError(f"no live key was made for cp group {cp_group!r} (or clear_cache "
                         "dropped it)")
    return key


def clear_cache(cp_group: Any = None) -> None:
    """Forget the most recent key of ``cp_group``, or of every group when None. Keys carry
    their plans themselves, so there is no other runtime cache to drop."""
    if cp_group is None:
        dist._recent_keys.clear()
    else:
        dist._recent_keys.pop(id(cp_group), None)
