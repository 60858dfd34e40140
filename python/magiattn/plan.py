"""Distributed plans as plain data: ``make_plan`` returns the planner's JSON value (the same
format ``magiattn plan --json`` writes), and the helpers here read it. No communication: every
rank computes the same plan from the same mask.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Union

import numpy as np

from . import _C
from .masks import Mask

__all__ = ["DistAttnConfig", "make_plan", "load_plan", "plan_cells", "plan_bytes_matrix"]

PlanLike = Union[dict, str, os.PathLike]


@dataclasses.dataclass(frozen=True)
class DistAttnConfig:
    """The planner's options, one value (MagiAttention's name): ``num_stages`` (0: chosen by
    the cost model), ``chunk_size`` (0: automatic), ``algorithm`` ("refined" or "minheap"),
    ``uneven`` (allow shards one chunk apart when the length does not divide evenly); and the
    runtime's ``sm_margin``: SMs the GPU attention kernels of ``calc_attn`` leave free, so
    that the communication kernels of the next stage find room beside them."""

    num_stages: int = 0
    chunk_size: int = 0
    algorithm: str = "refined"
    uneven: bool = False
    sm_margin: int = 0


def plan_json(mask: Mask, cp: int, config: Optional[DistAttnConfig] = None, **options) -> str:
    """The plan as the planner's JSON text; ``options`` override fields of ``config``."""
    config = dataclasses.replace(config or DistAttnConfig(), **options)
    return _C.make_plan_json(mask, cp, config.num_stages, config.chunk_size, config.algorithm,
                             config.uneven)


def make_plan(mask: Mask, cp: int, config: Optional[DistAttnConfig] = None, **options) -> dict:
    """The plan of ``mask`` over ``cp`` ranks; ``options`` are ``DistAttnConfig`` fields
    (``make_plan(mask, 4, num_stages=2)``) and override ``config``."""
    return json.loads(plan_json(mask, cp, config, **options))


def load_plan(plan: PlanLike) -> dict:
    """A plan dict from a dict (returned as is) or a JSON file path."""
    if isinstance(plan, dict):
        return plan
    with open(plan) as f:
        return json.load(f)


def _to_global(local: int, ranges: list) -> tuple[int, int]:
    """(global start of the range holding local offset ``local``, that range's local start)."""
    offset = 0
    for start, end in ranges:
        if local < offset + (end - start):
            return start, offset
        offset += end - start
    raise ValueError(f"plan: local offset {local} lies beyond its ranges ({offset} rows)")


def plan_cells(plan: PlanLike):
    """Yield ``(rank, stage, qs, qe, ks, ke, type)`` for every slice of every rank in GLOBAL
    coordinates; stage 0 is the host stage, stage s > 0 the s-th remote stage."""
    plan = load_plan(plan)
    for rank, rp in enumerate(plan["ranks"]):
        host = rp["host_ranges"]
        groups = [(0, rp["host_slices"], host)]
        groups += [(s + 1, st["slices"], st["remote_k_ranges"]) for s, st in enumerate(rp["stages"])]
        for stage, slices, k_ranges in groups:
            for qs, qe, ks, ke, kind in slices:
                if qe <= qs or ke <= ks:
                    continue
                gq, lq = _to_global(qs, host)
                gk, lk = _to_global(ks, k_ranges)
                yield rank, stage, gq + qs - lq, gq + qe - lq, gk + ks - lk, gk + ke - lk, kind


def plan_bytes_matrix(plan: PlanLike) -> np.ndarray:
    """``[cp, cp]`` bytes of K/V rank ``src`` (row) sends to rank ``dst`` (column), all stages."""
    plan = load_plan(plan)
    cp = plan["dispatch"]["cp"]
    per_row = plan["cost"]["bytes_per_row"]
    m = np.zeros((cp, cp))
    for dst, rp in enumerate(plan["ranks"]):
        for st in rp["stages"]:
            for size, src in zip(st["output_split_sizes"], st["src_rank"]):
                m[src, dst] += size * per_row
    return m
