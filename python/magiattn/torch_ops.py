"""torch front: ``magiattn::ffa_forward`` / ``magiattn::ffa_backward`` custom ops.

Imported only when torch tensors reach ``flex_flash_attn_func`` (the package works on numpy
without torch). The ops take the ranges as int tensors, so ``torch.compile`` sees one opaque
op per direction (fake impls give shapes and dtypes) and the mask is looked up in the shared
cache at run time (functional.py: CUDA range tensors by identity, without reading them).
Eager calls run in C++ (magiattn._torch: allocation, launch and the autograd node, about
50 us less host time a call than Python) where the package was built against this torch,
else through an ``autograd.Function`` over the custom op's impl (cheaper than the custom op's
dispatch); all three paths share one backward (_backward_impl). ``lse`` and ``max_logits``
are returned without gradient: backward differentiates ``out`` only (and the sink through it).
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import warnings
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from . import _C, functional
from .functional import AttnForwardMeta, forget_ranges, prepared_mask

_to_dlpack = torch.utils.dlpack.to_dlpack


def _load_cpp_front():
    """magiattn._torch (python/src/torch_ext.cc): the per-call forward in C++, built against
    the torch of the build. None where it was not built (no torch at build time), does not
    load, or was built against another torch version (its C++ ABI is not stable across
    releases): the same calls then run in Python, with a warning for the last two."""
    if importlib.util.find_spec("magiattn._torch") is None:
        return None
    try:
        from . import _torch
    except ImportError as e:
        return _cpp_front_unusable(f"it does not load ({e})")
    return _checked_cpp_front(_torch, torch.__version__)


def _checked_cpp_front(module, torch_version: str):
    if module.built_with_torch != torch_version:
        return _cpp_front_unusable(f"it was built against torch {module.built_with_torch}")
    return module


def _cpp_front_unusable(why: str) -> None:
    warnings.warn(f"magiattn._torch is not used with torch {torch.__version__}: {why}; the "
                  "torch front runs its per-call path in Python, about 50 us slower a call "
                  "(reinstall magiattn against this torch)", RuntimeWarning, stacklevel=3)
    return None


_cpp = _load_cpp_front()

__all__ = ["ffa_forward", "ffa_backward", "flex_flash_attn_func", "flex_flash_attn_backward"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _capsule(t: Tensor):
    """A DLPack capsule of t: ~10x cheaper than handing the tensor itself to nanobind (which
    calls ``Tensor.__dlpack__``), and the same zero-copy view."""
    return _to_dlpack(t.detach())


@functools.lru_cache(maxsize=256)
def _workspace_bytes(num_k: int, heads_kv: int) -> int:
    return _C.forward_workspace_bytes(num_k, heads_kv)


# The forward's per-call workspace (the scheduler's counter and K/V's NaN/inf row flags, a few
# bytes per key and kv head): one per (device, stream), reused by every call on that stream,
# which orders them. Inside a CUDA graph capture each call gets its own from the graph's pool.
_scratch: dict = {}
_scratch_lock = threading.Lock()


def _workspace(index: int, stream: int, need: int, device: torch.device) -> Tensor:
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.empty(need, dtype=torch.uint8, device=device)
    ws = _scratch.get((index, stream))
    if ws is None or ws.numel() < need:
        ws = torch.empty(max(need, 2 * (0 if ws is None else ws.numel())), dtype=torch.uint8,
                         device=device)
        with _scratch_lock:
            if len(_scratch) >= 64:  # streams come and go: keep the table small
                _scratch.clear()
            _scratch[(index, stream)] = ws
    return ws


@functools.lru_cache(maxsize=64)
def _no_max_logits(device: torch.device, dtype: torch.dtype) -> Tensor:
    """The [0] max_logits of a call that did not ask for them: one shared empty tensor per
    device and dtype (an allocation costs as much host time as the kernel launch)."""
    return torch.empty((0,), dtype=dtype, device=device)


_RANGE_DTYPES = (torch.int32, torch.int64)


def _device_ranges(index: int, q_ranges: Tensor, k_ranges: Tensor,
                   attn_type_map: Optional[Tensor]) -> Optional[tuple]:
    """The CUDA range tensors' pointers for the kernel's check against the prepared mask
    (attention.h DeviceRanges): a write that torch's version counter missed, or a CUDA graph
    replayed after the ranges changed, then gives NaN instead of a result for stale ranges.
    None (no check) for layouts the check does not read: other dtypes, strides or devices."""
    tm = attn_type_map
    if not (k_ranges.is_cuda and q_ranges.dtype is k_ranges.dtype
            and q_ranges.dtype in _RANGE_DTYPES and q_ranges.is_contiguous()
            and k_ranges.is_contiguous() and q_ranges.get_device() == index
            and k_ranges.get_device() == index):
        return None
    if tm is not None and not (tm.is_cuda and tm.dtype in _RANGE_DTYPES and tm.is_contiguous()
                               and tm.get_device() == index):
        return None
    return (q_ranges.data_ptr(), k_ranges.data_ptr(), 0 if tm is None else tm.data_ptr(),
            q_ranges.element_size(), 4 if tm is None else tm.element_size(), q_ranges.shape[0])


def _stream(q: Tensor) -> int:
    """The cudaStream_t torch runs q's device on (0 for CPU tensors)."""
    return torch._C._cuda_getCurrentRawStream(q.get_device()) if q.is_cuda else 0


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, q_ranges: Tensor, k_ranges: Tensor,
                  attn_type_map: Optional[Tensor], sink: Optional[Tensor], sink_layout: str,
                  softmax_scale: Optional[float], softcap: float, deterministic: bool,
                  return_max_logits: bool, sm_margin: int) -> tuple[Tensor, Tensor, Tensor]:
    """The forward on a cached PreparedMask, every buffer from torch's allocator: on a cache
    hit this does no device-to-host read, no device allocation outside torch's caching
    allocator and no host work that grows with the mask (so it is CUDA-graph capturable).
    No autograd: the callers record it (the custom op's rule, _FFAForward)."""
    pm = prepared_mask(q.shape[0], k.shape[0], q_ranges, k_ranges, attn_type_map)
    if _cpp is not None:
        return _cpp.forward(q, k, v, q_ranges, k_ranges, attn_type_map, pm, sink, sink_layout,
                            softmax_scale, softcap, deterministic, return_max_logits, sm_margin,
                            _stream(q), False, False)
    compute = _compute_dtype(q.dtype)
    device = q.device
    out = q.new_empty(q.shape)  # contiguous, q's dtype and device (new_empty: the cheapest)
    lse = q.new_empty(q.shape[:2], dtype=compute)
    max_logits = (torch.empty((q.shape[1],), dtype=compute, device=device) if return_max_logits
                  else _no_max_logits(device, compute))
    ranges = None
    if q.is_cuda:
        index = q.get_device()
        stream = torch._C._cuda_getCurrentRawStream(index)
        workspace = _workspace(index, stream, _workspace_bytes(k.shape[0], k.shape[1]), device)
        if q_ranges.is_cuda:
            ranges = _device_ranges(index, q_ranges, k_ranges, attn_type_map)
    else:
        workspace, stream = None, 0
    args = (_capsule(q), _capsule(k), _capsule(v), pm, _capsule(out), _capsule(lse),
            None if workspace is None else _capsule(workspace),
            None if sink is None else _capsule(sink),
            _capsule(max_logits) if return_max_logits else None, softmax_scale, softcap,
            sink_layout, deterministic, sm_margin, stream, ranges)
    if workspace is not None and workspace is _scratch.get((index, stream)):
        with _scratch_lock:  # two threads on one stream must not interleave on one workspace
            _C.forward_prepared(*args)
    else:
        _C.forward_prepared(*args)
    return out, lse, max_logits


# The work list is built on the host from the ranges' contents, so a CUDA graph of this op bakes
# the mask in; torch.compile's reduce-overhead replays graphs for new input contents (a new
# batch's ranges of the same shape), so the op runs between its graphs, not inside them.
# torch.cuda.graph captures it as it is (the caller owns what a replay means).
_GRAPH_UNSAFE = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("magiattn::ffa_forward", mutates_args=(), tags=_GRAPH_UNSAFE)
def ffa_forward(
    q: Tensor, k: Tensor, v: Tensor, q_ranges: Tensor, k_ranges: Tensor,
    attn_type_map: Optional[Tensor], sink: Optional[Tensor], sink_layout: str,
    softmax_scale: Optional[float], softcap: float, deterministic: bool,
    return_max_logits: bool, sm_margin: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out [Nq,Hq,D] in q's dtype, lse [Nq,Hq], max_logits [Hq] or [0])``."""
    return _forward_impl(q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout,
                         softmax_scale, softcap, deterministic, return_max_logits, sm_margin)


@ffa_forward.register_fake
def _ffa_forward_fake(q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout,
                      softmax_scale, softcap, deterministic, return_max_logits, sm_margin=0):
    compute = _compute_dtype(q.dtype)
    return (q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=compute),
            q.new_empty((q.shape[1] if return_max_logits else 0,), dtype=compute))


@torch.library.custom_op("magiattn::ffa_backward", mutates_args=())
def ffa_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, q_ranges: Tensor,
    k_ranges: Tensor, attn_type_map: Optional[Tensor], sink: Optional[Tensor], sink_layout: str,
    softmax_scale: Optional[float], softcap: float, deterministic: bool, sm_margin: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dsink)``; dsink is an empty tensor when there is no sink."""
    mask = prepared_mask(q.shape[0], k.shape[0], q_ranges, k_ranges, attn_type_map)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if sink is None:
        dsink = torch.empty((0,), dtype=_compute_dtype(q.dtype), device=q.device)
    else:
        dsink = torch.empty(sink.shape, dtype=sink.dtype, device=sink.device)
    # The GPU backward's scratch (its fp32 dq accumulator, about dq's size in fp32) from torch's
    # caching allocator, per call: inside a CUDA graph capture it comes from the graph's pool.
    workspace = (torch.empty(_C.backward_workspace_bytes(q.shape[0], q.shape[1], q.shape[2]),
                             dtype=torch.uint8, device=q.device) if q.is_cuda else None)
    _C.backward(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                dq, dk, dv, mask, sink=None if sink is None else sink.detach(),
                dsink=None if sink is None else dsink, softmax_scale=softmax_scale,
                softcap=softcap, sink_layout=sink_layout, deterministic=deterministic,
                sm_margin=sm_margin, cuda_stream=_stream(q), workspace=workspace)
    return dq, dk, dv, dsink


@ffa_backward.register_fake
def _ffa_backward_fake(dout, q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, sink,
                       sink_layout, softmax_scale, softcap, deterministic, sm_margin=0):
    dsink = (q.new_empty((0,), dtype=_compute_dtype(q.dtype)) if sink is None
             else sink.new_empty(sink.shape))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout, softmax_scale, softcap,
     deterministic, _return_max_logits, sm_margin) = inputs
    out, lse, max_logits = output
    ctx.save_for_backward(q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, sink)
    ctx.has_sink = sink is not None
    ctx.options = (sink_layout, softmax_scale, softcap, deterministic, sm_margin)
    ctx.mark_non_differentiable(lse, max_logits)


def _backward_impl(dout, q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, sink,
                   sink_layout, softmax_scale, softcap, deterministic, sm_margin):
    """(dq, dk, dv, dsink or None): the backward of every forward path (the custom op's
    autograd rule, _FFAForward and magiattn._torch's node)."""
    # autograd hands over whatever layout the consumer produced (an expanded scalar after
    # out.sum(), say); the kernel wants a unit-stride last dim.
    dq, dk, dv, dsink = torch.ops.magiattn.ffa_backward(
        dout.contiguous(), q, k, v, out, lse, q_ranges, k_ranges, attn_type_map, sink,
        sink_layout, softmax_scale, softcap, deterministic, sm_margin)
    return dq, dk, dv, (dsink if sink is not None else None)


def _backward(ctx, dout, _dlse, _dmax_logits):
    dq, dk, dv, dsink = _backward_impl(dout, *ctx.saved_tensors, *ctx.options)
    return dq, dk, dv, None, None, None, dsink, None, None, None, None, None, None


torch.library.register_autograd("magiattn::ffa_forward", _backward, setup_context=_setup_context)
# What magiattn._torch.call asks torch (torch._C's, absent from CPU-only builds of torch):
# the current raw stream of a device, and whether the current stream is being captured.
_STREAM_HOOKS = (getattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0),
                 getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False))
if _cpp is not None:
    _cpp.set_backward(_backward_impl)
    _cpp.set_lookup(prepared_mask, *_STREAM_HOOKS)
    functional._torch_fast = (_cpp.call, _cpp.forget_recent, torch.compiler.is_compiling)


class _FFAForward(torch.autograd.Function):
    """The eager path: the same impl and autograd rule as the custom op, without the custom
    op's dispatch (about 6 us a call, which at 2k-4k tokens is a fifth of the kernel)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads)


# ---- Python wrappers ------------------------------------------------------------------------
def _int_tensor(x: Any, name: str) -> Tensor:
    if isinstance(x, Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer tensor, got {x.dtype}")
        return x
    if hasattr(x, "to_array"):  # AttnRanges
        x = x.to_array()
    arr = np.asarray(x)
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got {arr.dtype}")
    return torch.as_tensor(arr.astype(np.int64, copy=False))


def _type_tensor(x: Any, num_slices: int) -> Optional[Tensor]:
    if x is None or isinstance(x, Tensor):
        return x
    from .functional import _type_array

    return torch.from_numpy(_type_array(x, num_slices))


def _check_qkv(**tensors: Tensor) -> None:
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a torch tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected 3 dims, got {t.dim()} (shape {list(t.shape)})")


def flex_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, q_ranges: Any, k_ranges: Any,
                         attn_type_map: Any, sink: Optional[Tensor], sink_layout: str,
                         softmax_scale: Optional[float], softcap: float, deterministic: bool,
                         return_max_logits: bool, sm_margin: int
                         ) -> tuple[Tensor, AttnForwardMeta]:
    """The torch half of ``magiattn.flex_flash_attn_func`` (differentiable in q, k, v, sink):
    what its C++ fast path (magiattn._torch.call) leaves to Python, torch.compile's path and
    builds without magiattn._torch. Plain checks, no helper calls on the common path."""
    if not (q.__class__ is Tensor and k.__class__ is Tensor and v.__class__ is Tensor
            and q.dim() == 3 and k.dim() == 3 and v.dim() == 3):
        _check_qkv(q=q, k=k, v=v)
    if not (q_ranges.__class__ is Tensor and not q_ranges.is_floating_point()):
        q_ranges = _int_tensor(q_ranges, "q_ranges")
    if not (k_ranges.__class__ is Tensor and not k_ranges.is_floating_point()):
        k_ranges = _int_tensor(k_ranges, "k_ranges")
    if attn_type_map is not None and attn_type_map.__class__ is not Tensor:
        attn_type_map = _type_tensor(attn_type_map, q_ranges.shape[0])
    if softmax_scale is not None:
        softmax_scale = float(softmax_scale)
    args = (q, k, v, q_ranges, k_ranges, attn_type_map, sink, sink_layout, softmax_scale,
            float(softcap), bool(deterministic), bool(return_max_logits), sm_margin)
    if torch.compiler.is_compiling():
        out, lse, max_logits = torch.ops.magiattn.ffa_forward(*args)
    elif _cpp is not None:  # the eager path in C++, autograd included
        nq, nk = q.shape[0], k.shape[0]
        pm = prepared_mask(nq, nk, q_ranges, k_ranges, attn_type_map, _cpu_by_identity=True)
        try:
            out, lse, max_logits = _cpp.forward(*args[:6], pm, *args[6:], _stream(q), True, True)
        except _cpp.StaleRanges:  # CPU ranges written behind torch's back: look up by content
            forget_ranges(nq, nk, q_ranges, k_ranges, attn_type_map)
            pm = prepared_mask(nq, nk, q_ranges, k_ranges, attn_type_map)
            out, lse, max_logits = _cpp.forward(*args[:6], pm, *args[6:], _stream(q), True,
                                                False)
    else:
        out, lse, max_logits = _FFAForward.apply(*args)
    return out, AttnForwardMeta(lse=lse, max_logits=max_logits if return_max_logits else None)


def flex_flash_attn_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                             lse: Tensor, q_ranges: Any, k_ranges: Any, attn_type_map: Any = None,
                             *, sink: Optional[Tensor] = None, sink_layout: str = "sh",
                             softmax_scale: Optional[float] = None, softcap: float = 0.0,
                             deterministic: bool = False, sm_margin: int = 0):
    """Explicit backward on tensors (no autograd graph): ``(dq, dk, dv, dsink or None)``."""
    _check_qkv(dout=dout, q=q, k=k, v=v)
    q_ranges = _int_tensor(q_ranges, "q_ranges")
    dq, dk, dv, dsink = torch.ops.magiattn.ffa_backward(
        dout, q, k, v, out, lse, q_ranges, _int_tensor(k_ranges, "k_ranges"),
        _type_tensor(attn_type_map, q_ranges.shape[0]), sink, sink_layout,
        None if softmax_scale is None else float(softmax_scale), float(softcap),
        bool(deterministic), int(sm_margin))
    return dq, dk, dv, (dsink if sink is not None else None)
