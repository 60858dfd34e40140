"""Distributed attention over MPI or NCCL ranks, with MagiAttention's API (docs/semantics.md §3)::

    key = magi_attn_flex_key(q_ranges, k_ranges, types, n, n, hq, hkv, d)  # once per mask
    q = dispatch(global_q, key)              # this rank's tokens, no communication
    out, meta = calc_attn(q, k, v, key)      # collective: K/V fetched stage by stage
    global_out = undispatch(out, key)        # every rank gets the global order (all_gather_v)

Key decisions: every rank computes the same plan from the mask alone (``make_plan``, no
exchange) and it stays inside ``magiattn._dist``, so ``_C`` and ``_dist`` share no C++ types.
``_dist`` is built where MPI or NCCL (a CUDA build) was found and is imported on first use, so
``import magiattn`` never needs either. The cp group is MPI_COMM_WORLD (None), an mpi4py comm
(MPI), a torch.distributed ProcessGroup or 1-D DeviceMesh (NCCL over the group's ranks, one
communicator per group, bootstrapped through the group itself, whatever its backend) or a
``Communicator``. MPI is initialised when the first MPI communicator is made unless it already
is (``from mpi4py import MPI`` first is fine) and finalised at exit only if we did it.
dsink is this rank's partial by default (``dsink_all_reduce_op="none"``, as MagiAttention):
the sink is a replicated parameter whose gradient the data-parallel reduction sums; "sum" or
"avg" reduce it over the cp group here instead.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import importlib.util
import sys
import warnings
import weakref
from typing import Any, Optional

import numpy as np

from .functional import AttnForwardMeta, _check_sm_margin, _compute_dtype, _is_torch
from .masks import Mask, infer_attn_mask_from_cu_seqlens, make_mask
from .plan import DistAttnConfig, PlanLike, load_plan

__all__ = ["Communicator", "DistAttnRuntimeKey", "calc_attn", "calc_attn_backward", "dispatch",
           "get_position_ids", "magi_attn_flex_key", "magi_attn_varlen_key", "roll",
           "undispatch", "world_communicator"]

_HINT = ("the distributed API needs magiattn._dist, which is built when MPI or NCCL is found: "
         "install an MPI (Debian/Ubuntu: apt install libopenmpi-dev openmpi-bin), or build "
         "with CUDA (nvcc) for NCCL, then reinstall magiattn (pip install .)")
_DEFAULT_TIMEOUT = 300.0  # seconds, as comm.h's Communicator
_DSINK_OPS = ("none", "sum", "avg")
_lib_module = None
_world: Optional["Communicator"] = None
# One NCCL communicator per torch.distributed ProcessGroup (creating one is collective), keyed by
# id(group) with the group held, so that the id cannot be reused while the entry lives.
_torch_comms: "dict[int, tuple[Any, Communicator]]" = {}
# Keys and communicators alive at exit (an autograd graph holds keys) drop their C++ objects
# first, so that MPI is finalised after every communicator and nanobind reports no leaks.
_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _lib():
    global _lib_module
    if _lib_module is None:
        try:
            from . import _dist
        except ImportError as e:
            raise ImportError(f"{_HINT} ({e})") from e
        atexit.register(_shutdown)
        _lib_module = _dist
    return _lib_module


def _shutdown() -> None:
    global _world
    _world = None
    _torch_comms.clear()
    for obj in list(_live):
        vars(obj).clear()
    # After an uncaught exception, MPI_Finalize would wait for peers that may be blocked in a
    # collective this rank never joins; exiting without it makes mpirun end the job at once.
    crashed = getattr(sys, "last_value", None) is not None
    _lib_module.shutdown(finalize=not crashed)  # MPI_Finalize only if we initialised MPI


# ---- communicators ----------------------------------------------------------------------------
class Communicator:
    """A cp group: MPI (CPU ranks, or CUDA tensors staged through host memory) or NCCL (one
    process per GPU). Creating one is collective over the group.

    ``Communicator(comm=None)``: MPI over MPI_COMM_WORLD (None) or an mpi4py ``MPI.Comm``
    (anything with ``py2f()``), duplicated so that magiattn's messages never meet the caller's.
    NCCL: ``from_torch_group(group)``, ``nccl_from_mpi(comm)`` or ``nccl(unique_id, ...)``.
    ``timeout`` (seconds, default 300) bounds every wait: past it the call raises RuntimeError
    naming the ranks it waited for, and the communicator refuses further calls.
    """

    def __init__(self, comm: Any = None, *, timeout: Optional[float] = None):
        if comm is not None and not hasattr(comm, "py2f"):
            raise TypeError(f"comm: expected None (MPI_COMM_WORLD) or an mpi4py MPI.Comm, got "
                            f"{type(comm).__name__}")
        lib = _lib()
        if not lib.has_mpi():
            what = "MPI_COMM_WORLD (what cp_group_or_mesh=None means)" if comm is None else \
                "an mpi4py comm"
            raise ValueError(f"an MPI communicator over {what} needs magiattn._dist built with "
                             "MPI, and this one has NCCL only: pass a torch.distributed "
                             "ProcessGroup (e.g. torch.distributed.group.WORLD) or "
                             "Communicator.nccl_from_mpi(comm)")
        self._adopt(lib.Communicator(None if comm is None else int(comm.py2f())), timeout)

    def _adopt(self, native: Any, timeout: Optional[float]) -> None:
        self._c = native
        _live.add(self)
        if timeout is not None:
            self.timeout = timeout

    @classmethod
    def nccl(cls, unique_id: bytes, rank: int, size: int, device: int, *,
             timeout: Optional[float] = None) -> "Communicator":
        """NCCL on CUDA device ``device``, collective over the ``size`` ranks that pass the
        same ``unique_id`` (128 bytes of ``magiattn._dist.nccl_unique_id()`` made on one rank
        and handed to all by the caller). The bootstraps below call this."""
        self = cls.__new__(cls)
        self._adopt(_lib().Communicator.nccl(
            bytes(unique_id), int(rank), int(size), int(device),
            _DEFAULT_TIMEOUT if timeout is None else float(timeout)), None)
        return self

    @classmethod
    def from_torch_group(cls, group: Any = None, *,
                         timeout: Optional[float] = None) -> "Communicator":
        """The NCCL communicator over the ranks of a torch.distributed ProcessGroup (None: the
        default group) of any backend (gloo, nccl), on ``torch.cuda.current_device()``. Made
        once per group (collective: group rank 0 makes the id and broadcasts it over the
        group), then returned from the cache; ``timeout`` also applies to a cached one."""
        tdist = _torch_distributed()
        if tdist is None or not tdist.is_initialized():
            raise ValueError("from_torch_group: torch.distributed is not initialised (call "
                             "torch.distributed.init_process_group first)")
        g = tdist.group.WORLD if group is None else group
        if not isinstance(g, tdist.ProcessGroup):
            raise TypeError(f"group: expected a torch.distributed ProcessGroup or None (the "
                            f"default group), got {type(group).__name__}")
        hit = _torch_comms.get(id(g))
        if hit is None:
            rank = tdist.get_rank(g)
            if rank < 0:
                raise ValueError(f"group: global rank {tdist.get_rank()} is not a member of "
                                 "the group")
            # With the nccl backend the object travels on the current CUDA device (torch's
            # rule): set it (torch.cuda.set_device) before the first call.
            payload = [_nccl_id() if rank == 0 else None]
            tdist.broadcast_object_list(payload, src=tdist.get_global_rank(g, 0), group=g)
            c = cls.nccl(_received_id(payload[0]), rank, tdist.get_world_size(g),
                         _current_cuda_device(), timeout=timeout)
            _torch_comms[id(g)] = (g, c)
            return c
        c = hit[1]
        if timeout is not None:
            c.timeout = timeout
        return c

    @classmethod
    def nccl_from_mpi(cls, comm: Any, *, device: Optional[int] = None,
                      timeout: Optional[float] = None) -> "Communicator":
        """An NCCL communicator over the ranks of an mpi4py communicator (its rank 0 makes the
        id, ``comm.bcast`` hands it to all), on ``device`` (None: torch's current device).
        Collective; a new communicator per call."""
        if not (hasattr(comm, "bcast") and hasattr(comm, "Get_rank")):
            raise TypeError(f"comm: expected an mpi4py MPI.Comm, got {type(comm).__name__}")
        rank = comm.Get_rank()
        uid = _received_id(comm.bcast(_nccl_id() if rank == 0 else None, root=0))
        return cls.nccl(uid, rank, comm.Get_size(),
                        _current_cuda_device() if device is None else device, timeout=timeout)

    backend = property(lambda self: self._c.backend, doc='"mpi" or "nccl"')
    rank = property(lambda self: self._c.rank)
    size = property(lambda self: self._c.size)
    broken = property(lambda self: self._c.broken, doc="a wait failed; every call now raises")

    @property
    def timeout(self) -> float:
        return self._c.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._c.timeout = float(seconds)

    def barrier(self) -> None:
        _lib().barrier(self._c)

    def all_reduce(self, x: Any, op: str = "sum") -> Any:
        """In place over the group ("sum" or "max") on a contiguous float32/float64 numpy
        array or tensor (a CUDA one through host copies over MPI); returns ``x``. Sums run in
        rank order (deterministic)."""
        _lib().all_reduce(self._c, x.detach() if hasattr(x, "detach") else x, op,
                          cuda_stream=_stream(x))
        return x

    def __repr__(self) -> str:
        return (f"Communicator({self.backend.upper()}, rank {self.rank} of {self.size}, "
                f"timeout {self.timeout:g} s)")


def _torch_distributed() -> Any:
    """torch.distributed when torch is imported already and has it, else None: an object of a
    torch type means torch is imported, so nothing imports torch only to reject a type."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return None
    return torch.distributed


def _nccl_id() -> Any:
    """Group rank 0's part of an NCCL bootstrap: a new unique id, or the text of why none can
    be made, which the other ranks receive in its place (so every rank raises, none waits)."""
    _torch_nccl_first()
    lib = _lib()
    try:
        ok, why = lib.nccl_available()
        return lib.nccl_unique_id() if ok else f"NCCL cannot be loaded: {why}"
    except ValueError as e:  # built without NCCL, or NCCL failed
        return str(e)


def _torch_nccl_first() -> None:
    """Imports torch (when installed) before magiattn loads libnccl: one libnccl.so.2 per
    process, torch's, which ours then shares; the other order leaves torch's NCCL symbols
    unresolved."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


def _received_id(payload: Any) -> bytes:
    if isinstance(payload, str):
        raise ValueError(f"NCCL communicator: group rank 0 could not make the unique id: "
                         f"{payload}")
    return payload


def _current_cuda_device() -> int:
    try:
        import torch
    except ImportError as e:
        raise ValueError("NCCL communicator: the device defaults to torch.cuda.current_device()"
                         f", but torch is not importable ({e}): pass device=") from e
    if not torch.cuda.is_available():
        raise ValueError("NCCL communicator: needs a CUDA device, but torch sees none")
    return torch.cuda.current_device()


def world_communicator() -> Communicator:
    """The communicator that ``cp_group_or_mesh=None`` means (MPI_COMM_WORLD, made once)."""
    global _world
    if _world is None:
        _world = Communicator()
    return _world


def _group(cp_group_or_mesh: Any) -> Communicator:
    g = cp_group_or_mesh
    if g is None:
        return world_communicator()
    if isinstance(g, Communicator):
        return g
    if hasattr(g, "py2f"):
        return Communicator(g)
    tdist = _torch_distributed()
    if tdist is not None:
        if isinstance(g, tdist.ProcessGroup):
            return Communicator.from_torch_group(g)
        from torch.distributed.device_mesh import DeviceMesh
        if isinstance(g, DeviceMesh):
            if g.ndim != 1:
                raise ValueError(f"cp_group_or_mesh: a {g.ndim}-D DeviceMesh; pass the cp "
                                 "dimension's 1-D mesh (mesh['cp']) or its group "
                                 "(mesh.get_group('cp'))")
            return Communicator.from_torch_group(g.get_group())
    raise TypeError("cp_group_or_mesh: expected None (MPI_COMM_WORLD), a magiattn "
                    "Communicator, an mpi4py MPI.Comm, a torch.distributed ProcessGroup or a "
                    f"1-D torch DeviceMesh, got {type(g).__name__}")


# ---- keys -------------------------------------------------------------------------------------
class DistAttnRuntimeKey:
    """One mask planned over one cp group, with the head shape the attention will use: the
    handle that ``dispatch``, ``calc_attn``, ``undispatch``, ``roll`` and ``get_position_ids``
    take. Made by ``magi_attn_flex_key`` / ``magi_attn_varlen_key`` or ``from_plan``."""

    def __init__(self, mask: Mask, plan: Any, comm: Communicator, num_heads_q: int,
                 num_heads_kv: int, head_dim: int, config: DistAttnConfig,
                 plan_text: Optional[str] = None):
        """``plan``: the ``magiattn._dist.Plan`` of ``mask`` (``make_plan``'s C++ value);
        ``plan_text`` only for a plan that came as JSON (``from_plan``): every rank's must
        agree. A plan made from the mask and config is a function of them, so they are what
        the ranks compare."""
        for name, value in (("num_heads_q", num_heads_q), ("num_heads_kv", num_heads_kv),
                            ("head_dim", head_dim)):
            if int(value) != value or value <= 0:
                raise ValueError(f"{name}: {value} must be a positive integer")
        _check_sm_margin(getattr(config, "sm_margin", 0), "dist_attn_config.sm_margin")
        if num_heads_q % num_heads_kv:
            raise ValueError(f"num_heads_q {num_heads_q} is not a multiple of num_heads_kv "
                             f"{num_heads_kv}")
        if plan.cp != comm.size:
            raise ValueError(f"the plan is for cp {plan.cp} ranks but the cp group has "
                             f"{comm.size} (a plan or key made for another world size)")
        if plan.total_seqlen != mask.total_seqlen_q:
            raise ValueError(f"the plan is for {plan.total_seqlen} tokens but the mask has "
                             f"total_seqlen_q {mask.total_seqlen_q}")
        self.mask, self.comm, self.config = mask, comm, config
        self.num_heads_q, self.num_heads_kv, self.head_dim = (int(num_heads_q),
                                                              int(num_heads_kv), int(head_dim))
        self._plan, self._plan_text = plan, plan_text or ""
        self.cp_rank, self.cp_size = comm.rank, comm.size
        self.total_seqlen = plan.total_seqlen
        self.num_local_tokens = plan.rank_tokens(self.cp_rank)
        self._positions = plan.position_ids(self.cp_rank)
        self._device_positions: dict = {}  # torch device -> the positions as an index tensor
        self._workspace_bytes: dict = {}  # (dtype name, backward) -> calc_attn's workspace
        # Every rank must build the same key: one gather of a fingerprint fails at once on
        # every rank, naming the ranks that disagree, where a mismatched plan would otherwise
        # run into the communication timeout later and blame a "dead" rank.
        _lib().check_agree(comm._c, self._identity(),
                           "the key (mask, plan, dist_attn_config, heads, head_dim)")
        # This rank's stage masks, validated and prepared once for every calc_attn call.
        self._prepared = _lib().PreparedRank(plan, self.cp_rank)
        _live.add(self)

    def _identity(self) -> bytes:
        """What every rank's key must share, as bytes (hashed in C++ by check_agree)."""
        m = self.mask
        parts = [np.asarray([m.total_seqlen_q, m.total_seqlen_k, self.num_heads_q,
                             self.num_heads_kv, self.head_dim], np.int64).tobytes(),
                 np.ascontiguousarray(m.q_ranges(), np.int64).tobytes(),
                 np.ascontiguousarray(m.k_ranges(), np.int64).tobytes(),
                 np.ascontiguousarray(m.attn_type_map(), np.int32).tobytes(),
                 repr(self.config).encode(), self._plan_text.encode()]
        return b"".join(len(p).to_bytes(8, "little") + p for p in parts)

    @classmethod
    def from_plan(cls, plan: PlanLike, mask: Mask, num_heads_q: int, num_heads_kv: int,
                  head_dim: int, cp_group_or_mesh: Any = None) -> "DistAttnRuntimeKey":
        """A key from a plan made earlier for ``mask`` (``make_plan``'s dict, or the JSON file
        of ``magiattn plan --json``); its cp must be the group's size."""
        text = json.dumps(load_plan(plan))
        return cls(mask, _lib().Plan.from_json(text), _group(cp_group_or_mesh), num_heads_q,
                   num_heads_kv, head_dim, DistAttnConfig(), plan_text=text)

    @property
    def plan(self) -> dict:
        """The plan as ``make_plan`` returns it (for ``plot_plan`` and friends)."""
        return json.loads(self._plan.to_json())

    def __repr__(self) -> str:
        return (f"DistAttnRuntimeKey({self.total_seqlen} tokens, rank {self.cp_rank} of "
                f"{self.cp_size} holds {self.num_local_tokens}, heads {self.num_heads_q}/"
                f"{self.num_heads_kv}, head_dim {self.head_dim})")


def _config(dist_attn_config: Optional[DistAttnConfig],
            chunk_size: Optional[int]) -> DistAttnConfig:
    config = DistAttnConfig() if dist_attn_config is None else dist_attn_config
    if not isinstance(config, DistAttnConfig):
        raise TypeError(f"dist_attn_config: expected a magiattn.DistAttnConfig, got "
                        f"{type(config).__name__}")
    if chunk_size is not None:
        if config.chunk_size not in (0, chunk_size):
            raise ValueError(f"chunk_size {chunk_size} conflicts with dist_attn_config."
                             f"chunk_size {config.chunk_size}")
        config = dataclasses.replace(config, chunk_size=int(chunk_size))
    return config


# The most recent key per cp group (MagiAttention's get_most_recent_key / clear_cache), keyed
# by the group object the caller passed (None: the world). Weak, so a key the caller dropped
# is not kept alive to the interpreter's exit.
_recent_keys: "dict[int, tuple[Any, weakref.ref]]" = {}


def _remember_key(cp_group_or_mesh: Any, key: "DistAttnRuntimeKey") -> None:
    _recent_keys[id(cp_group_or_mesh)] = (cp_group_or_mesh, weakref.ref(key))


def magi_attn_flex_key(q_ranges: Any, k_ranges: Any, attn_mask_type: Any, total_seqlen_q: int,
                       total_seqlen_k: int, num_heads_q: int, num_heads_kv: int, head_dim: int,
                       pad_size: int = 0, cp_group_or_mesh: Any = None,
                       dist_attn_config: Optional[DistAttnConfig] = None,
                       is_same_source: bool = True, is_q_permutable: bool = True,
                       is_k_permutable: bool = True,
                       chunk_size: Optional[int] = None) -> DistAttnRuntimeKey:
    """The key of a global (un-dispatched) slice mask over the cp group. Ranges and types as
    ``make_mask`` takes them (``AttnRanges``, lists, numpy, torch; one type or one per slice).
    Collective when it creates a communicator (an mpi4py group, or the first world use).
    ``pad_size`` is deprecated and ignored as in MagiAttention (no padding is needed; a length
    that cp does not divide needs ``DistAttnConfig(uneven=True)``); ``chunk_size`` is the
    deprecated spelling of ``DistAttnConfig.chunk_size``. Self-attention only (the three
    ``is_*`` flags True), as in MagiAttention."""
    if not (is_same_source and is_q_permutable and is_k_permutable):
        raise ValueError("only self-attention is supported: is_same_source, is_q_permutable "
                         "and is_k_permutable must be True")
    if pad_size:
        warnings.warn(f"pad_size {pad_size} is deprecated and ignored: the planner needs no "
                      "padding", DeprecationWarning, stacklevel=2)
    config = _config(dist_attn_config, chunk_size)
    mask = make_mask(q_ranges, k_ranges, attn_mask_type, total_seqlen_q, total_seqlen_k)
    comm = _group(cp_group_or_mesh)
    plan = _lib().make_plan(mask.total_seqlen_q, mask.total_seqlen_k, mask.q_ranges(),
                            mask.k_ranges(), mask.attn_type_map(), comm.size, config.num_stages,
                            config.chunk_size, config.algorithm, config.uneven)
    key = DistAttnRuntimeKey(mask, plan, comm, num_heads_q, num_heads_kv, head_dim, config)
    _remember_key(cp_group_or_mesh, key)
    return key


def magi_attn_varlen_key(cu_seqlens_q: Any, cu_seqlens_k: Any, num_heads_q: int,
                         num_heads_kv: int, head_dim: int, pad_size: int = 0,
                         cp_group_or_mesh: Any = None, causal: bool = False,
                         window_size: tuple[int, int] = (-1, -1),
                         dist_attn_config: Optional[DistAttnConfig] = None,
                         chunk_size: Optional[int] = None) -> DistAttnRuntimeKey:
    """``magi_attn_flex_key`` of flash-attn varlen arguments
    (``infer_attn_mask_from_cu_seqlens``: ``causal``, ``window_size``)."""
    q_ranges, k_ranges, types, total_q, total_k = infer_attn_mask_from_cu_seqlens(
        cu_seqlens_q, cu_seqlens_k, causal, window_size)
    return magi_attn_flex_key(q_ranges, k_ranges, types, total_q, total_k, num_heads_q,
                              num_heads_kv, head_dim, pad_size, cp_group_or_mesh,
                              dist_attn_config, chunk_size=chunk_size)


# ---- row movement (any dtype) -----------------------------------------------------------------
def _check_key(key: Any) -> None:
    if not isinstance(key, DistAttnRuntimeKey):
        raise TypeError(f"key: expected a DistAttnRuntimeKey (magi_attn_flex_key / "
                        f"magi_attn_varlen_key), got {type(key).__name__}")


def _units(x: Any, name: str, rows: int, what: str):
    """``x`` as [N, B/2] float16 units of its rows' B bytes, and the function that turns such
    units back into x's dtype and trailing shape. dispatch, undispatch and roll only move
    bytes, so every dtype (int labels, bool masks) travels through the float-typed views."""
    if _is_torch(x):
        from .dist_torch import units
        return units(x, name, rows, what)
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] != rows:
        raise ValueError(f"{name}: {x.shape[0] if x.ndim else 'no'} rows (dim 0, shape "
                         f"{list(x.shape)}), but {what} has {rows}")
    x = np.ascontiguousarray(x)
    dtype, tail = x.dtype, x.shape[1:]
    row = int(np.prod(tail, dtype=np.int64))
    wide = x.itemsize == 1 and row % 2 == 1  # an odd byte count: widen to 2-byte items
    units = (x.astype(np.int16) if wide else x).reshape(rows, row).view(np.float16)

    def back(u: np.ndarray) -> np.ndarray:
        y = u.view(np.int16 if wide else dtype).reshape((u.shape[0],) + tail)
        return y.astype(dtype) if wide else y

    return units, back


def _stream(x: Any) -> int:
    """The CUDA stream (as an integer) that orders a CUDA tensor's work: torch's current stream
    on its device; 0 for host arrays."""
    if getattr(getattr(x, "device", None), "type", None) != "cuda":
        return 0
    from .torch_ops import _stream as torch_stream
    return torch_stream(x)


def _empty_like(x: Any, shape: tuple, dtype: Any = None) -> Any:
    if isinstance(x, np.ndarray):
        return np.empty(shape, x.dtype if dtype is None else dtype)
    return x.new_empty(shape, dtype=dtype)


def _dispatch(x: Any, key: DistAttnRuntimeKey) -> Any:
    u, back = _units(x, "x", key.total_seqlen, "the key's mask")
    local = _empty_like(u, (key.num_local_tokens, u.shape[1]))
    _lib().dispatch(key._plan, key.comm._c, u, local, cuda_stream=_stream(u))
    return back(local)


def _undispatch(x: Any, key: DistAttnRuntimeKey) -> Any:
    u, back = _units(x, "x", key.num_local_tokens, f"rank {key.cp_rank} of the key")
    out = _empty_like(u, (key.total_seqlen, u.shape[1]))
    _lib().undispatch(key._plan, key.comm._c, u, out, cuda_stream=_stream(u))
    return back(out)


def _roll(x: Any, key: DistAttnRuntimeKey, shift: int, fill_value: Any) -> Any:
    u, back = _units(x, "x", key.num_local_tokens, f"rank {key.cp_rank} of the key")
    out = _empty_like(u, u.shape)
    _lib().roll(key._plan, key.comm._c, u, out, int(shift), cuda_stream=_stream(u))
    y = back(out)
    if fill_value is not None:  # rows whose source lies outside [0, N)
        src = key._positions - int(shift)
        outside = (src < 0) | (src >= key.total_seqlen)
        if outside.any():
            y[outside if isinstance(y, np.ndarray) else _torch_index(outside, y)] = fill_value
    return y


def _torch_index(mask: np.ndarray, like: Any):
    import torch
    return torch.from_numpy(mask).to(like.device)


def dispatch(x: Any, key: DistAttnRuntimeKey) -> Any:
    """This rank's rows of the global ``x`` ``[total_seqlen, ...]`` (any dtype), in the plan's
    local order; every rank holds all of ``x``. No communication. torch: the backward gathers
    the local gradients of every rank (``undispatch``)."""
    _check_key(key)
    if _is_torch(x):
        from . import dist_torch
        return dist_torch.dispatch(x, key)
    return _dispatch(x, key)


def undispatch(x: Any, key: DistAttnRuntimeKey) -> Any:
    """The global ``[total_seqlen, ...]`` rows on every rank from each rank's local rows
    (all_gather_v). Collective. torch: the backward keeps this rank's rows of the gradient."""
    _check_key(key)
    if _is_torch(x):
        from . import dist_torch
        return dist_torch.undispatch(x, key)
    return _undispatch(x, key)


def roll(x: Any, shift: int, dim: int = 0, key: Optional[DistAttnRuntimeKey] = None, *,
         fill_value: Any = None) -> Any:
    """``torch.roll(undispatch(x), shift, 0)`` dispatched again, without the global tensor:
    each row moves once (labels for multi-token prediction). With ``fill_value``, rows whose
    source would wrap around get it instead (a shift without wrap). Collective; bit-exact."""
    _check_key(key)
    if dim not in (0, -getattr(x, "ndim", 1)):
        raise ValueError(f"roll: dim {dim} is not the token dim 0 (roll other dims locally)")
    if _is_torch(x):
        from . import dist_torch
        return dist_torch.roll(x, key, shift, fill_value)
    return _roll(x, key, shift, fill_value)


def get_position_ids(key: DistAttnRuntimeKey) -> np.ndarray:
    """int64 ``[num_local_tokens]``: the global index of every local row (for RoPE).
    ``torch.from_numpy`` makes it a tensor without a copy."""
    _check_key(key)
    return key._positions.copy()


# ---- attention --------------------------------------------------------------------------------
def _check_args(key: DistAttnRuntimeKey, dsink_all_reduce_op: str, **arrays: Any) -> None:
    if dsink_all_reduce_op not in _DSINK_OPS:
        raise ValueError(f"dsink_all_reduce_op: '{dsink_all_reduce_op}' is not one of "
                         f"{', '.join(_DSINK_OPS)}")
    n, d = key.num_local_tokens, key.head_dim
    for name, x in arrays.items():
        heads, which = (key.num_heads_q, "num_heads_q") if name in ("q", "dout") else \
            (key.num_heads_kv, "num_heads_kv")
        shape = getattr(x, "shape", None)
        if shape is None:
            raise ValueError(f"{name}: expected an array or tensor, got {type(x).__name__}")
        if tuple(shape) != (n, heads, d):
            raise ValueError(f"{name}: shape {list(shape)} is not [{n}, {heads}, {d}] (the "
                             f"local tokens of rank {key.cp_rank}, the key's {which} and "
                             "head_dim)")


_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _workspace(key: DistAttnRuntimeKey, q, backward: bool):
    """A CUDA call's workspace from torch's caching allocator (runtime.h
    calc_attn_workspace_bytes: the remote K/V of two stages and, backward, their partial
    dK/dV), so no call allocates device memory itself; None for host arrays."""
    if not getattr(q, "is_cuda", False):
        return None
    import torch
    name = _DTYPE_NAMES.get(str(q.dtype).removeprefix("torch."))
    if name is None:
        return None  # the kernels' dtype check names it
    cached = key._workspace_bytes.get((name, backward))
    if cached is None:
        cached = _lib().workspace_bytes(key._plan, key.cp_rank, key.num_heads_q,
                                        key.num_heads_kv, key.head_dim, name, backward)
        key._workspace_bytes[(name, backward)] = cached
    return torch.empty(max(cached, 1), dtype=torch.uint8, device=q.device)


def _forward_into(key: DistAttnRuntimeKey, q, k, v, out, lse, sink, max_logits,
                  softmax_scale: Optional[float], softcap: float) -> None:
    _lib().forward(key._plan, key.comm._c, q, k, v, out, lse, sink=sink, max_logits=max_logits,
                   softmax_scale=None if softmax_scale is None else float(softmax_scale),
                   softcap=float(softcap), prepared=key._prepared, cuda_stream=_stream(q),
                   workspace=_workspace(key, q, False), sm_margin=key.config.sm_margin)


def _backward_into(key: DistAttnRuntimeKey, dout, q, k, v, out, lse, dq, dk, dv, sink, dsink,
                   softmax_scale: Optional[float], softcap: float, dsink_all_reduce_op: str):
    _lib().backward(key._plan, key.comm._c, dout, q, k, v, out, lse, dq, dk, dv, sink=sink,
                    dsink=dsink, softmax_scale=None if softmax_scale is None else
                    float(softmax_scale), softcap=float(softcap), prepared=key._prepared,
                    cuda_stream=_stream(q), workspace=_workspace(key, q, True),
                    sm_margin=key.config.sm_margin)
    if dsink is not None and dsink_all_reduce_op != "none":
        key.comm.all_reduce(dsink, "sum")
        if dsink_all_reduce_op == "avg":
            dsink /= key.cp_size


def calc_attn(q: Any, k: Any, v: Any, key: DistAttnRuntimeKey, sink: Any = None,
              softmax_scale: Optional[float] = None, softcap: float = 0.0,
              return_max_logits: bool = False, *,
              dsink_all_reduce_op: str = "none") -> tuple[Any, AttnForwardMeta]:
    """Attention of this rank's dispatched tokens over the key's mask. Collective.

    q ``[local, Hq, D]``, k/v ``[local, Hkv, D]`` (from ``dispatch``), sink ``[S, Hq]``
    (global, the same on every rank; fp32, or fp64 with fp64 inputs). Returns ``out`` in q's
    dtype and ``AttnForwardMeta(lse [local, Hq] in the compute type, max_logits [Hq] over all
    ranks or None)``. torch tensors are differentiable in q, k, v and sink; dsink is reduced
    over the group by ``dsink_all_reduce_op`` ("none": this rank's partial, "sum", "avg").
    """
    _check_key(key)
    _check_args(key, dsink_all_reduce_op, q=q, k=k, v=v)
    if _is_torch(q, k, v, sink):
        from . import dist_torch
        return dist_torch.calc_attn(q, k, v, key, sink, softmax_scale, softcap,
                                    return_max_logits, dsink_all_reduce_op)
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    compute = _compute_dtype(q.dtype)
    out = np.empty(q.shape, compute)
    lse = np.empty(q.shape[:2], compute)
    max_logits = np.empty(q.shape[1], compute) if return_max_logits else None
    _forward_into(key, q, k, v, out, lse, sink, max_logits, softmax_scale, softcap)
    return out.astype(q.dtype, copy=False), AttnForwardMeta(lse=lse, max_logits=max_logits)


def calc_attn_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                       key: DistAttnRuntimeKey, sink: Any = None,
                       softmax_scale: Optional[float] = None, softcap: float = 0.0, *,
                       dsink_all_reduce_op: str = "none") -> tuple[Any, Any, Any, Any]:
    """numpy gradients ``(dq, dk, dv, dsink)`` of ``calc_attn`` (local rows; dk/dv already
    summed over every rank that used them). Collective. dq/dk/dv in q's dtype."""
    _check_key(key)
    _check_args(key, dsink_all_reduce_op, dout=dout, q=q, k=k, v=v)
    dout, q, k, v, out, lse = (np.ascontiguousarray(x) for x in (dout, q, k, v, out, lse))
    compute = _compute_dtype(q.dtype)
    dq, dk, dv = (np.empty(x.shape, compute) for x in (q, k, v))
    dsink = None if sink is None else np.empty(np.shape(sink), np.asarray(sink).dtype)
    _backward_into(key, dout, q, k, v, out, lse, dq, dk, dv, sink, dsink, softmax_scale,
                   softcap, dsink_all_reduce_op)
    return (dq.astype(q.dtype, copy=False), dk.astype(q.dtype, copy=False),
            dv.astype(q.dtype, copy=False), dsink)
