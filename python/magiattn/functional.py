"""``flex_flash_attn_func``: MagiAttention's single-device entry point over numpy or torch.

numpy arrays go straight to the C++ kernels (no torch needed); torch tensors go through the
``magiattn::ffa_forward`` / ``ffa_backward`` custom ops of ``torch_ops`` (autograd,
``torch.compile``), imported only when a tensor arrives. Both paths share one mask cache keyed
on the ranges' bytes, so a training loop that passes the same ranges every step builds and
validates its ``Mask`` once.
"""

from __future__ import annotations

import atexit
import sys
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _C
from .masks import _TYPE_TO_INT, Mask, _ranges_array, _type_int

__all__ = ["AttnForwardMeta", "flex_flash_attn_func", "flex_flash_attn_backward", "get_mask",
           "prepared_mask", "clear_mask_cache"]


@dataclass
class AttnForwardMeta:
    """Forward side outputs, as MagiAttention: ``lse [Nq, Hq]`` (natural log, fp32, or fp64 for
    fp64 inputs) and ``max_logits [Hq]`` (None unless ``return_max_logits``)."""

    lse: Any = None
    max_logits: Any = None


# ---- mask cache -----------------------------------------------------------------------------
# One entry per distinct mask: a PreparedMask (the validated Mask plus its GPU work lists, built
# on the first GPU call per device and head dim), keyed on the ranges' contents. 64 entries
# cover a model that alternates a few masks per layer; each holds its slices and, once used on
# a GPU, its work lists (about 24 bytes per query tile plus 24 per piece). CUDA range tensors
# are recognised by identity without reading them (the content key is read on first sight of a
# tensor only): same Python object, alive, with the same torch version counter, so an in-place
# write through torch (which bumps it) makes the next call read the ranges again. Writes that
# bypass the version counter (``.data``, DLPack or raw-pointer writers) are not seen: replace
# the tensor instead. Entries used while a CUDA graph is captured stay alive until
# ``clear_mask_cache()``, since the graph's kernels read their work lists on every replay.
_CACHE_SIZE = 64
_BY_TENSOR_SIZE = 256
_cache: "OrderedDict[tuple, Any]" = OrderedDict()  # content key -> _C.PreparedMask
_by_tensor: "OrderedDict[tuple, tuple]" = OrderedDict()  # ids -> (weakrefs, versions, key)
_by_bytes: "OrderedDict[tuple, tuple]" = OrderedDict()  # CPU tensors' raw bytes -> key
_pinned: dict = {}    # content key -> PreparedMask captured in a CUDA graph
_deferred: list = []  # evicted during a capture: freed (cudaFree waits) after it
_cache_lock = threading.RLock()
# Set by torch_ops where magiattn._torch is built: (call, forget_recent, is_compiling). `call`
# runs flex_flash_attn_func's common torch case in C++ and keeps the last few masks it saw by
# identity in front of this cache (torch_ext.cc RecentMasks, 8 entries more in the bound).
_torch_fast: Optional[tuple] = None


def _type_array(attn_type_map: Any, num_slices: int) -> Optional[np.ndarray]:
    """int32 [N] from ints (validated in C++), names or ``AttnMaskType`` values."""
    if attn_type_map is None:
        return None
    if hasattr(attn_type_map, "detach"):  # torch tensor
        attn_type_map = attn_type_map.detach().cpu().numpy()
    if isinstance(attn_type_map, np.ndarray) and attn_type_map.dtype.kind in "iu":
        out = attn_type_map.astype(np.int32, copy=False)
    else:
        items = list(np.ravel(attn_type_map)) if isinstance(attn_type_map, np.ndarray) else \
            list(attn_type_map)
        try:  # the common case, AttnMaskType members, by table (this runs on every call)
            out = np.fromiter(map(_TYPE_TO_INT.__getitem__, items), dtype=np.int32, count=len(items))
        except (KeyError, TypeError):  # names, ints or bad values: one by one, naming the culprit
            out = np.array([_type_int(t, i) for i, t in enumerate(items)], dtype=np.int32)
    if out.ndim != 1 or out.shape[0] != num_slices:
        raise ValueError(f"attn_type_map: expected [{num_slices}] (one type per slice), got "
                         f"{list(out.shape)}")
    return np.ascontiguousarray(out)


_cuda_available: Optional[bool] = None  # torch.cuda.is_available(), asked once (it reads the
# environment on every call)


def _capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph (False without CUDA)."""
    global _cuda_available
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if _cuda_available is None:
        _cuda_available = torch.cuda.is_available()
    return _cuda_available and torch._C._cuda_isCurrentStreamCapturing()


def _prepared_by_content(total_seqlen_q: int, total_seqlen_k: int, q_ranges: Any,
                         k_ranges: Any, attn_type_map: Any) -> tuple[tuple, Any]:
    """(content key, PreparedMask) of these ranges, read (from any array-like) and looked up."""
    q = np.ascontiguousarray(_ranges_array(q_ranges, "q_ranges"))
    k = np.ascontiguousarray(_ranges_array(k_ranges, "k_ranges"))
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q_ranges has {q.shape[0]} slices but k_ranges has {k.shape[0]}")
    types = _type_array(attn_type_map, q.shape[0])
    key = (int(total_seqlen_q), int(total_seqlen_k), q.astype(np.int64, copy=False).tobytes(),
           k.astype(np.int64, copy=False).tobytes(), None if types is None else types.tobytes())
    with _cache_lock:
        pm = _cache.get(key)
        if pm is not None:
            _cache.move_to_end(key)
            return key, pm
    pm = _C.PreparedMask(Mask(int(total_seqlen_q), int(total_seqlen_k), q, k, types))
    return key, _remember(key, pm)


def _remember(key: tuple, pm: Any) -> Any:
    with _cache_lock:
        pm = _cache.setdefault(key, pm)  # another thread may have built it meanwhile
        _cache.move_to_end(key)
        capturing = _capturing()
        while len(_cache) > _CACHE_SIZE:
            evicted = _cache.popitem(last=False)[1]
            if capturing:
                _deferred.append(evicted)
        if not capturing:
            _deferred.clear()
        return pm


def _version(t: Any) -> int:
    """torch's in-place write counter of t (-1 for None); None when torch keeps none (inference
    tensors), so the tensor cannot be recognised by identity."""
    if t is None:
        return -1
    return None if t.is_inference() else t._version


def _raw_key(torch: Any, nq: int, nk: int, q: Any, k: Any, types: Any) -> Optional[tuple]:
    """For CPU int tensors, their dtypes, shapes and bytes as they are (no conversion): the
    cheap exact key of a CPU call (the content key needs int64 copies)."""
    if torch is None or not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
                             and (types is None or isinstance(types, torch.Tensor))):
        return None
    parts = [nq, nk]
    for t in (q, k, types):
        if t is None:
            parts.append(None)
            continue
        if t.is_cuda or t.is_floating_point() or t.is_complex() or not t.is_contiguous():
            return None
        parts += (t.dtype, tuple(t.shape), t.numpy().tobytes())
    return tuple(parts)


def prepared_mask(total_seqlen_q: int, total_seqlen_k: int, q_ranges: Any, k_ranges: Any,
                  attn_type_map: Any = None, *, _cpu_by_identity: bool = False) -> Any:
    """The cached ``_C.PreparedMask`` of these ranges (see the cache notes above): CUDA range
    tensors seen before are recognised without a device-to-host read. With
    ``_cpu_by_identity`` (magiattn._torch, which compares CPU ranges with the mask on every
    call and raises StaleRanges on a difference), int32/int64 CPU tensors are recognised the
    same way instead of by their bytes."""
    torch = sys.modules.get("torch")
    by_identity = (torch is not None and isinstance(q_ranges, torch.Tensor)
                   and (q_ranges.is_cuda
                        or (_cpu_by_identity and q_ranges.dtype in (torch.int32, torch.int64)))
                   and isinstance(k_ranges, torch.Tensor)
                   and (attn_type_map is None or isinstance(attn_type_map, torch.Tensor)))
    if not by_identity:
        raw = _raw_key(torch, total_seqlen_q, total_seqlen_k, q_ranges, k_ranges, attn_type_map)
        key = _by_bytes.get(raw) if raw is not None else None
        pm = _cache.get(key) if key is not None else None
        if pm is None:
            key, pm = _prepared_by_content(total_seqlen_q, total_seqlen_k, q_ranges, k_ranges,
                                           attn_type_map)
            if raw is not None:
                with _cache_lock:
                    _by_bytes[raw] = key
                    while len(_by_bytes) > _BY_TENSOR_SIZE:
                        _by_bytes.popitem(last=False)
        return _pin_if_capturing(key, pm)
    ids = (id(q_ranges), id(k_ranges), id(attn_type_map), total_seqlen_q, total_seqlen_k)
    record = _by_tensor.get(ids)
    if record is not None:
        rq, rk, rt, vq, vk, vt, key = record
        if (rq() is q_ranges and rk() is k_ranges and q_ranges._version == vq
                and k_ranges._version == vk
                and (rt() is attn_type_map and attn_type_map._version == vt if rt is not None
                     else attn_type_map is None)):
            pm = _cache.get(key)
            if pm is not None:
                try:
                    _cache.move_to_end(key)
                except KeyError:  # evicted by another thread meanwhile: still valid here
                    pass
            else:
                pm = _pinned.get(key)
            if pm is not None:
                if (torch._C._cuda_isCurrentStreamCapturing() if q_ranges.is_cuda
                        else _capturing()):
                    _pin_if_capturing(key, pm)
                return pm
    if q_ranges.is_cuda and _capturing():
        raise RuntimeError(
            "q_ranges/k_ranges: CUDA range tensors not used (or changed in place) since before "
            "this CUDA graph capture: reading them would synchronise inside the capture; call "
            "once before capturing (the warm-up torch.cuda.graph needs anyway) or pass the "
            "ranges as CPU tensors")
    key, pm = _prepared_by_content(total_seqlen_q, total_seqlen_k, q_ranges, k_ranges,
                                   attn_type_map)  # one device-to-host read
    versions = (_version(q_ranges), _version(k_ranges), _version(attn_type_map))
    if None not in versions:
        refs = (weakref.ref(q_ranges), weakref.ref(k_ranges),
                None if attn_type_map is None else weakref.ref(attn_type_map))
        with _cache_lock:
            _by_tensor[ids] = (*refs, *versions, key)
            while len(_by_tensor) > _BY_TENSOR_SIZE:
                _by_tensor.popitem(last=False)
    return pm


def forget_ranges(total_seqlen_q: int, total_seqlen_k: int, q_ranges: Any, k_ranges: Any,
                  attn_type_map: Any = None) -> None:
    """Drop the identity record of these range tensors (their contents changed behind torch's
    version counter); the masks themselves stay cached by content."""
    ids = (id(q_ranges), id(k_ranges), id(attn_type_map), total_seqlen_q, total_seqlen_k)
    with _cache_lock:
        _by_tensor.pop(ids, None)


def _pin_if_capturing(key: tuple, pm: Any) -> Any:
    """Keep a mask alive for as long as the CUDA graph being captured may replay it."""
    if _capturing():
        with _cache_lock:
            _pinned[key] = pm
    return pm


def get_mask(total_seqlen_q: int, total_seqlen_k: int, q_ranges: Any, k_ranges: Any,
             attn_type_map: Any = None) -> Mask:
    """The validated ``Mask`` of these ranges, built once and then served from a small cache."""
    return prepared_mask(total_seqlen_q, total_seqlen_k, q_ranges, k_ranges, attn_type_map).mask


def _remember_mask(mask: Mask) -> None:
    """Seed the cache with a mask the caller already built (``mask=`` argument)."""
    key = (mask.total_seqlen_q, mask.total_seqlen_k,
           np.ascontiguousarray(mask.q_ranges(), np.int64).tobytes(),
           np.ascontiguousarray(mask.k_ranges(), np.int64).tobytes(),
           np.ascontiguousarray(mask.attn_type_map(), np.int32).tobytes())
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return
    _remember(key, _C.PreparedMask(mask))


def clear_mask_cache() -> None:
    """Drop every cached mask and its GPU work lists, also those kept for captured CUDA graphs
    (replaying such a graph afterwards would read freed memory: clear only after the graphs)."""
    if _torch_fast is not None:
        _torch_fast[1]()
    with _cache_lock:
        _cache.clear()
        _by_tensor.clear()
        _by_bytes.clear()
        _pinned.clear()
        _deferred.clear()


# Cached masks would outlive the interpreter's teardown when torch's op registry keeps this
# module alive, and nanobind then reports them as leaks at exit.
atexit.register(clear_mask_cache)


def _cache_len() -> int:  # for tests
    return len(_cache)


# ---- helpers ----------------------------------------------------------------------------------
def _is_torch(*xs: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor = torch.Tensor
    for x in xs:
        if isinstance(x, tensor):
            return True
    return False


def _check_ndim(x: Any, name: str, ndim: int) -> None:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise ValueError(f"{name}: expected an array or tensor, got {type(x).__name__}")
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got {len(shape)} (shape {list(shape)})")


def _resolve_ranges(mask: Optional[Mask], q: Any, k: Any, q_ranges: Any, k_ranges: Any,
                    attn_type_map: Any) -> tuple[Any, Any, Any]:
    """The ranges to use; with ``mask=``, its ranges (and the cache seeded with it) after
    checking its sequence lengths, which the ranges alone would not carry."""
    if mask is None:
        if q_ranges is None or k_ranges is None:
            raise ValueError("q_ranges and k_ranges are required (or pass mask=)")
        return q_ranges, k_ranges, attn_type_map
    if q_ranges is not None or k_ranges is not None or attn_type_map is not None:
        raise ValueError("pass either mask= or q_ranges/k_ranges/attn_type_map, not both")
    for x, name, total in ((q, "q", mask.total_seqlen_q), (k, "k", mask.total_seqlen_k)):
        _check_ndim(x, name, 3)
        if x.shape[0] != total:
            raise ValueError(f"{name}: {x.shape[0]} tokens but the mask has total_seqlen_{name} "
                             f"{total}")
    _remember_mask(mask)
    return mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()


def _compute_dtype(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


# ---- MagiAttention's kernel keywords ----------------------------------------------------------
# Keywords that only choose how MagiAttention's kernel runs (its atomics, tile shapes, loop
# order, GQA packing): the result is the same attention, so they are accepted and ignored,
# with one warning per keyword per process when a non-default value arrives.
_TUNING_DEFAULTS = {
    "q_block_size": 1, "k_block_size": 1, "disable_fwd_atomic_reduction": False,
    "disable_bwd_dkv_atomic_reduction": False, "ref_block_size": None, "max_seqlen_q": None,
    "auto_range_merge": False, "swap_ab": False, "pack_gqa": False, "cat_gqa": False,
    "sparse_load": False, "swap_bwd_qk_loop": False,
}
_BOOL_KNOBS = ("disable_fwd_atomic_reduction", "disable_bwd_dkv_atomic_reduction",
               "auto_range_merge", "swap_ab", "pack_gqa", "cat_gqa", "sparse_load",
               "swap_bwd_qk_loop")
_warned: set = set()


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _compiling() -> bool:
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None) if torch is not None else None
    return compiler is not None and compiler.is_compiling()


def _check_sm_margin(sm_margin: Any, name: str = "sm_margin") -> int:
    """The SMs the kernels leave free: an int in [0, 2**31) (the kernel parameter's range)."""
    if sm_margin.__class__ is int and 0 <= sm_margin < 2**31:  # the common case, first
        return sm_margin
    if not _is_int(sm_margin) or not 0 <= sm_margin < 2**31:
        raise ValueError(f"{name}: {sm_margin!r} must be an int in [0, 2**31) (SMs left "
                         "free on the GPU; the CPU ignores it)")
    return int(sm_margin)


def _check_tuning(index_attn_indices: Any, index_attn: Any, knobs: dict) -> None:
    """Validate MagiAttention's kernel keywords; warn once for each non-default no-op."""
    if index_attn_indices is not None:
        raise NotImplementedError(
            "index_attn_indices: per-kv-head token index lists are not supported (a magiattn "
            "mask is one slice list shared by every head); pass q_ranges/k_ranges instead, "
            "e.g. from block_sparse_topk, with one call per kv head if the heads differ")
    if not isinstance(index_attn, (bool, np.bool_)):
        raise ValueError(f"index_attn: {index_attn!r} must be a bool")
    if index_attn:
        raise ValueError("index_attn=True selects MagiAttention's index_attn_indices kernel "
                         "path, which magiattn does not have (and needs index_attn_indices)")
    for name in _BOOL_KNOBS:
        if not isinstance(knobs[name], (bool, np.bool_)):
            raise ValueError(f"{name}: {knobs[name]!r} must be a bool")
    for name in ("q_block_size", "k_block_size"):
        if not _is_int(knobs[name]) or knobs[name] <= 0:
            raise ValueError(f"{name}: {knobs[name]!r} must be a positive int")
    msl = knobs["max_seqlen_q"]
    if msl is not None and (not _is_int(msl) or msl < 0):
        raise ValueError(f"max_seqlen_q: {msl!r} must be None or an int >= 0")
    rbs = knobs["ref_block_size"]
    if rbs is not None and (not isinstance(rbs, (tuple, list)) or len(rbs) != 2
                            or not all(_is_int(b) and b > 0 for b in rbs)):
        raise ValueError(f"ref_block_size: {rbs!r} must be None or a pair of positive ints")
    if _compiling():  # dynamo cannot trace warnings.warn (fullgraph would fail): no warning
        return
    for name, default in _TUNING_DEFAULTS.items():
        value = knobs[name]
        if name not in _warned and (value != default if default is not None else
                                    value is not None):
            _warned.add(name)
            warnings.warn(f"flex_flash_attn_func: {name}={value!r} only tunes MagiAttention's "
                          "kernel; magiattn accepts it and ignores it (same result)",
                          UserWarning, stacklevel=3)


# ---- public API -------------------------------------------------------------------------------
def flex_flash_attn_func(
    q: Any,
    k: Any,
    v: Any,
    q_ranges: Any = None,
    k_ranges: Any = None,
    attn_type_map: Any = None,
    *,
    index_attn_indices: Any = None,
    q_block_size: int = 1,
    k_block_size: int = 1,
    sink: Any = None,
    sink_layout: str = "sh",
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    deterministic: bool = False,
    sm_margin: int = 0,
    disable_fwd_atomic_reduction: bool = False,
    disable_bwd_dkv_atomic_reduction: bool = False,
    ref_block_size: Optional[tuple[int, int]] = None,
    max_seqlen_q: Optional[int] = None,
    auto_range_merge: bool = False,
    swap_ab: bool = False,
    pack_gqa: bool = False,
    cat_gqa: bool = False,
    sparse_load: bool = False,
    index_attn: bool = False,
    swap_bwd_qk_loop: bool = False,
    return_max_logits: bool = False,
    mask: Optional[Mask] = None,
) -> tuple[Any, AttnForwardMeta]:
    """Attention over a slice-list mask (docs/semantics.md §2), MagiAttention 1.1.1's signature.

    q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` (``Hq % Hkv == 0``); ``q_ranges``/``k_ranges`` int
    ``[N, 2]`` and ``attn_type_map`` int ``[N]`` (0 full, 1 causal, 2 inv_causal, 3 bi_causal;
    None = all full), or ``mask=`` a ``Mask`` instead. ``sink`` is ``[S, Hq]`` ("sh") or
    ``[Nq, S, Hq]`` ("ssh"). Returns ``out`` (q's dtype) and ``AttnForwardMeta(lse,
    max_logits)``. numpy inputs give numpy outputs; torch tensors use the autograd custom op.

    MagiAttention's other keywords: ``sm_margin`` (int >= 0) leaves that many SMs free on the
    GPU, forward and backward; on the CPU it is checked and ignored. These only tune
    MagiAttention's kernel and are **accepted as no-ops** (validated; a non-default value warns
    once per keyword per process, not while ``torch.compile`` traces): ``q_block_size``, ``k_block_size``,
    ``disable_fwd_atomic_reduction``, ``disable_bwd_dkv_atomic_reduction``, ``ref_block_size``,
    ``max_seqlen_q``, ``auto_range_merge``, ``swap_ab``, ``pack_gqa``, ``cat_gqa``,
    ``sparse_load``, ``swap_bwd_qk_loop`` (deterministic mode stays available with it).
    ``index_attn_indices`` (per-kv-head token lists) raises NotImplementedError and
    ``index_attn=True`` raises ValueError: magiattn has no such mask form.
    """
    sm_margin = _check_sm_margin(sm_margin)
    if not (q_block_size.__class__ is int and q_block_size == 1 and k_block_size.__class__ is int
            and k_block_size == 1 and ref_block_size is None and max_seqlen_q is None
            and index_attn_indices is None and index_attn is False
            and disable_fwd_atomic_reduction is False and disable_bwd_dkv_atomic_reduction is False
            and auto_range_merge is False and swap_ab is False and pack_gqa is False
            and cat_gqa is False and sparse_load is False and swap_bwd_qk_loop is False):
        _check_tuning(index_attn_indices, index_attn, dict(
            q_block_size=q_block_size, k_block_size=k_block_size,
            disable_fwd_atomic_reduction=disable_fwd_atomic_reduction,
            disable_bwd_dkv_atomic_reduction=disable_bwd_dkv_atomic_reduction,
            ref_block_size=ref_block_size, max_seqlen_q=max_seqlen_q,
            auto_range_merge=auto_range_merge, swap_ab=swap_ab, pack_gqa=pack_gqa,
            cat_gqa=cat_gqa, sparse_load=sparse_load, swap_bwd_qk_loop=swap_bwd_qk_loop))
    if mask is not None or q_ranges is None or k_ranges is None:
        q_ranges, k_ranges, attn_type_map = _resolve_ranges(mask, q, k, q_ranges, k_ranges,
                                                            attn_type_map)
    if _is_torch(q, k, v):
        if _torch_fast is not None and not _torch_fast[2]():
            r = _torch_fast[0](q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout,
                               softmax_scale, softcap, deterministic, return_max_logits,
                               sm_margin)
            if r is not None:
                return r[0], AttnForwardMeta(r[1], r[2] if return_max_logits else None)
        from . import torch_ops

        return torch_ops.flex_flash_attn_func(
            q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout, softmax_scale,
            softcap, deterministic, return_max_logits, sm_margin)
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_ndim(x, name, 3)
    m = get_mask(q.shape[0], k.shape[0], q_ranges, k_ranges, attn_type_map)
    compute = _compute_dtype(q.dtype)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty(q.shape[:2], dtype=compute)
    max_logits = np.empty(q.shape[1], dtype=compute) if return_max_logits else None
    _C.forward(q, k, v, m, out, lse, sink=sink, max_logits=max_logits,
               softmax_scale=softmax_scale, softcap=softcap, sink_layout=sink_layout,
               deterministic=deterministic, sm_margin=sm_margin)
    return out, AttnForwardMeta(lse=lse, max_logits=max_logits)


def flex_flash_attn_backward(
    dout: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    q_ranges: Any = None,
    k_ranges: Any = None,
    attn_type_map: Any = None,
    *,
    sink: Any = None,
    sink_layout: str = "sh",
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    deterministic: bool = False,
    sm_margin: int = 0,
    mask: Optional[Mask] = None,
) -> tuple[Any, Any, Any, Any]:
    """Gradients ``(dq, dk, dv, dsink)`` of ``flex_flash_attn_func`` for upstream ``dout``.

    ``out`` and ``lse`` are the forward results (after the sink). dq/dk/dv have the dtypes of
    q/k/v, dsink that of sink (None without a sink). Works on numpy arrays and, without
    autograd, on torch tensors. ``sm_margin`` as in ``flex_flash_attn_func``.
    """
    sm_margin = _check_sm_margin(sm_margin)
    q_ranges, k_ranges, attn_type_map = _resolve_ranges(mask, q, k, q_ranges, k_ranges,
                                                        attn_type_map)
    if _is_torch(dout, q, k, v):
        from . import torch_ops

        return torch_ops.flex_flash_attn_backward(
            dout, q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, sink=sink,
            sink_layout=sink_layout, softmax_scale=softmax_scale, softcap=softcap,
            deterministic=deterministic, sm_margin=sm_margin)
    for x, name in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v")):
        _check_ndim(x, name, 3)
    m = get_mask(q.shape[0], k.shape[0], q_ranges, k_ranges, attn_type_map)
    dq = np.empty(q.shape, dtype=q.dtype)
    dk = np.empty(k.shape, dtype=k.dtype)
    dv = np.empty(v.shape, dtype=v.dtype)
    dsink = None if sink is None else np.empty(np.shape(sink), dtype=np.asarray(sink).dtype)
    _C.backward(dout, q, k, v, out, lse, dq, dk, dv, m, sink=sink, dsink=dsink,
                softmax_scale=softmax_scale, softcap=softcap, sink_layout=sink_layout,
                deterministic=deterministic, sm_margin=sm_margin)
    return dq, dk, dv, dsink
