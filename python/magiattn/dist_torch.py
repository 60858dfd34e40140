"""torch autograd for the distributed API (imported when tensors reach ``magiattn.dist``).

The pairs are each other's adjoints: dispatch's backward is undispatch (all_gather_v of every
rank's local gradient) and undispatch's is dispatch (keep this rank's rows); roll's is the
opposite roll (with fill 0 where the forward filled). calc_attn's backward runs the runtime
backward: dq local, dk/dv summed back to their owners, dsink reduced per the caller's op.
out is computed in the compute type and kept so for the backward; the caller gets q's dtype.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from . import dist
from .functional import AttnForwardMeta


def units(x: Tensor, name: str, rows: int, what: str):
    """The torch twin of ``dist._units``: x's rows as float16 units, and the way back."""
    x = x.detach().contiguous()
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: on {x.device}, but the distributed runtime takes CPU or CUDA "
                         "tensors")
    if x.dim() == 0 or x.shape[0] != rows:
        raise ValueError(f"{name}: {x.shape[0] if x.dim() else 'no'} rows (dim 0, shape "
                         f"{list(x.shape)}), but {what} has {rows}")
    dtype, tail = x.dtype, x.shape[1:]
    row = tail.numel()
    wide = x.element_size() == 1 and row % 2 == 1
    u = (x.to(torch.int16) if wide else x).reshape(rows, row).view(torch.float16)

    def back(v: Tensor) -> Tensor:
        y = v.view(torch.int16 if wide else dtype).reshape((v.shape[0],) + tuple(tail))
        return y.to(dtype) if wide else y

    return u, back


def _local_rows(x: Tensor, key) -> Tensor:
    """dispatch of a CUDA tensor: a gather of this rank's rows on the device (no communication,
    no host copy); the position ids' index tensor is kept on the key per device."""
    if x.dim() == 0 or x.shape[0] != key.total_seqlen:
        dist._units(x, "x", key.total_seqlen, "the key's mask")  # raises, naming the rows
    index = key._device_positions.get(x.device)
    if index is None:
        index = torch.from_numpy(key._positions).to(x.device)
        key._device_positions[x.device] = index
    return x.detach().index_select(0, index)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key):
        ctx.key = key
        return _local_rows(x, key) if x.is_cuda else dist._dispatch(x, key)

    @staticmethod
    def backward(ctx, grad):
        return dist._undispatch(grad, ctx.key), None


class _Undispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key):
        ctx.key = key
        return dist._undispatch(x, key)

    @staticmethod
    def backward(ctx, grad):
        key = ctx.key
        return (_local_rows(grad, key) if grad.is_cuda else dist._dispatch(grad, key)), None


class _Roll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, key, shift, fill_value):
        ctx.key, ctx.shift, ctx.filled = key, shift, fill_value is not None
        return dist._roll(x, key, shift, fill_value)

    @staticmethod
    def backward(ctx, grad):
        back = dist._roll(grad, ctx.key, -ctx.shift, 0 if ctx.filled else None)
        return back, None, None, None


def _compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _CalcAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, key, softmax_scale, softcap, return_max_logits, op):
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        sink = None if sink is None else sink.detach().contiguous()
        compute = _compute(q.dtype)
        out = q.new_empty(q.shape, dtype=compute)
        lse = q.new_empty(q.shape[:2], dtype=compute)
        max_logits = q.new_empty((q.shape[1] if return_max_logits else 0,), dtype=compute)
        dist._forward_into(key, q, k, v, out, lse, sink,
                           max_logits if return_max_logits else None, softmax_scale, softcap)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.options = (key, softmax_scale, softcap, op)
        ctx.mark_non_differentiable(lse, max_logits)
        return out.to(q.dtype), lse, max_logits

    @staticmethod
    def backward(ctx, dout, _dlse, _dmax_logits):
        q, k, v, out, lse, sink = ctx.saved_tensors
        key, softmax_scale, softcap, op = ctx.options
        dq, dk, dv = (x.new_empty(x.shape, dtype=out.dtype) for x in (q, k, v))
        dsink = None if sink is None else torch.empty_like(sink)
        dist._backward_into(key, dout.to(q.dtype).contiguous(), q, k, v, out, lse, dq, dk, dv,
                            sink, dsink, softmax_scale, softcap, op)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink, None, None, None, None,
                None)


def dispatch(x: Tensor, key) -> Tensor:
    return _Dispatch.apply(x, key)


def undispatch(x: Tensor, key) -> Tensor:
    return _Undispatch.apply(x, key)


def roll(x: Tensor, key, shift: int, fill_value: Any) -> Tensor:
    return _Roll.apply(x, key, int(shift), fill_value)


def calc_attn(q: Tensor, k: Tensor, v: Tensor, key, sink: Optional[Tensor],
              softmax_scale: Optional[float], softcap: float, return_max_logits: bool,
              op: str) -> tuple[Tensor, AttnForwardMeta]:
    for name, t in (("q", q), ("k", k), ("v", v), ("sink", sink)):
        if t is not None and not isinstance(t, Tensor):
            raise ValueError(f"{name}: expected a torch tensor like the others, got "
                             f"{type(t).__name__}")
    out, lse, max_logits = _CalcAttn.apply(q, k, v, sink, key, softmax_scale, softcap,
                                           bool(return_max_logits), op)
    return out, AttnForwardMeta(lse=lse, max_logits=max_logits if return_max_logits else None)
