"""Forward TFLOP/s of magiattn's sm90 kernel against MagiAttention's FFA, PyTorch SDPA (cuDNN and
flash backends) and FlexAttention (compiled), on the same inputs in one process
(docs/semantics.md §4).

    python3 bench/gpu_attention_bench.py                 # docs/semantics.md §4 masks at 8k..64k
    python3 bench/gpu_attention_bench.py --seqlens 16384 --masks full causal --head-dim 64

Shapes: batch 1 (packed), bf16, Hq:Hkv = 32:8 by default. FLOPs = 4 * area * Hq * D, area =
visible cells of the mask (the same count for every backend). Each timing is the median of
--reps CUDA-event timings of --inner back-to-back calls after warm-up, the backends' reps
interleaved; inputs are shared.
A baseline that cannot express a mask prints '-': SDPA only does full and causal (cuDNN and
flash); FlexAttention gets every mask through a mask_mod built from the same slices; FFA
(MagiAttention's flex_flash_attn_func, ../shared/peer/README.md: importable after its
setup.sh) takes the same range tensors on the GPU, and is '-' where it is not importable.
Setup stays outside the timing for every backend, as a training step does it once per batch
and reuses it across layers: Flex's block mask, and magiattn's ranges as int32 tensors
(MagiAttention's calling convention). Passing AttnRanges objects and a list of AttnMaskType
instead costs Python time per call that grows with the slice count (measured 2026-11-30,
block-sparse 32k, 6007 slices: 5.2 ms per call with objects, 3.3 ms with tensors, 3.1 ms of
kernel), which would time the interpreter rather than the kernel.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

import magiattn
from magiattn import masks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_masks import SPEC_MASKS, build_mask  # noqa: E402,F401 (re-exported to the other benches)
from ab_table import header, row_line  # noqa: E402 (the row format, one definition)


def time_ms(fns: dict, reps: int, inner: int) -> dict:
    """Median ms per call of each function. The repetitions are interleaved (rep 1 of every
    backend, then rep 2, ...), so clock and power drift during a row hits all of them alike
    instead of whichever runs last."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    times = {key: [] for key in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[key].append(start.elapsed_time(end) / inner)
    return {key: statistics.median(t) for key, t in times.items()}


def range_tensors(mask, device=None) -> tuple:
    """The mask's slices as flex_flash_attn_func takes them: (q_ranges, k_ranges,
    attn_type_map) as int32 tensors on `device` (None: the CPU)."""
    return tuple(torch.as_tensor(x, dtype=torch.int32, device=device)
                 for x in (mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()))


def ffa_func():
    """MagiAttention's flex_flash_attn_func where it is importable, else None."""
    try:
        from magi_attention.functional import flex_flash_attn_func
        return flex_flash_attn_func
    except Exception:  # noqa: BLE001 - the peer is optional
        return None


def dense_ok(name: str) -> bool:
    return name in ("full", "causal")


def row_intervals(mask):
    """Per query row, the visible key intervals of every slice (docs/semantics.md §1 types):
    int32 arrays lo, hi of shape [n, R], R = the most slices any row is in; unused slots are
    empty."""
    qr, kr, types = masks.mask_to_ranges(mask)
    qa = np.asarray(qr.to_naive_ranges(), dtype=np.int64).reshape(-1, 2)
    ka = np.asarray(kr.to_naive_ranges(), dtype=np.int64).reshape(-1, 2)
    ta = np.asarray([t.to_int_type() for t in types], dtype=np.int64)
    n = mask.total_seqlen_q
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, qa[:, 0], 1)
    np.add.at(diff, qa[:, 1], -1)
    r = int(np.cumsum(diff).max()) if len(qa) else 1
    lo = np.zeros((n, max(r, 1)), dtype=np.int32)
    hi = np.zeros((n, max(r, 1)), dtype=np.int32)
    slot = np.zeros(n, dtype=np.int64)
    for (q0, q1), (k0, k1), t in zip(qa, ka, ta):
        rows = np.arange(q0, q1)
        l = np.full(rows.shape, k0)
        h = np.full(rows.shape, k1)
        if t in (1, 3):  # causal edge: k <= q + (k1 - q1)
            h = np.minimum(h, rows + (k1 - q1) + 1)
        if t in (2, 3):  # inverse causal edge: k - k0 >= q - q0
            l = np.maximum(l, rows - q0 + k0)
        s = slot[rows]
        lo[rows, s], hi[rows, s] = l, np.maximum(h, l)
        slot[rows] += 1
    return lo, hi


def flex_runner(name, mask, q, k, v, hq, hkv):
    """FlexAttention (compiled) with a mask_mod over the same cells as the slices: per-row key
    intervals, or the block table for block-sparse."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = mask.total_seqlen_q
    if name == "full":
        block_mask = None
    else:
        lo, hi = (torch.as_tensor(x, device="cuda") for x in row_intervals(mask))
        slots = lo.shape[1]

        def mask_mod(b, h, qi, ki):
            m = (ki >= lo[qi, 0]) & (ki < hi[qi, 0])
            for r in range(1, slots):
                m = m | ((ki >= lo[qi, r]) & (ki < hi[qi, r]))
            return m

        block_mask = create_block_mask(mask_mod, 1, None, n, n, device="cuda")
    compiled = torch.compile(flex_attention)
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    return lambda: compiled(qt, kt, vt, block_mask=block_mask, enable_gqa=hq != hkv)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    ap.add_argument("--masks", nargs="+", default=SPEC_MASKS, choices=masks.family_names())
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (compiles per mask)")
    ap.add_argument("--no-ffa", action="store_true", help="skip MagiAttention's FFA")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    hq, hkv, d = args.heads_q, args.heads_kv, args.head_dim
    ffa = None if args.no_ffa else ffa_func()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, Hq {hq}, Hkv {hkv}, "
          f"D {d}; TFLOP/s, median of {args.reps} x {args.inner} calls; "
          f"FFA {'in' if ffa else 'not available'}")
    print(header())
    for seqlen in args.seqlens:
        gen = torch.Generator(device="cuda").manual_seed(seqlen)
        q = torch.randn(seqlen, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(seqlen, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(seqlen, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        for name in args.masks:
            mask = build_mask(name, seqlen)
            flops = 4.0 * mask.area() * hq * d
            tf = lambda ms: flops / (ms * 1e-3) / 1e12
            qr, kr, types = range_tensors(mask)
            fns = {"magiattn": lambda: magiattn.flex_flash_attn_func(
                q, k, v, q_ranges=qr, k_ranges=kr, attn_type_map=types)}
            # Every output of the first calls, [tokens, heads, D]: magiattn's is checked against
            # cuDNN's (dense masks) or FFA's, so a fast wrong kernel shows in its row.
            outs = {"magiattn": fns["magiattn"]()[0]}
            if ffa is not None:
                ranges = range_tensors(mask, "cuda")
                try:
                    outs["ffa"] = ffa(q, k, v, *ranges)[0]
                    fns["ffa"] = lambda: ffa(q, k, v, *ranges)
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"  ffa: {type(e).__name__}: {str(e).splitlines()[0][:100]}",
                          file=sys.stderr)
            if dense_ok(name):
                qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
                for label, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("flash", SDPBackend.FLASH_ATTENTION)):
                    def sdpa(backend=backend, causal=name == "causal"):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(
                                qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv)
                    try:
                        outs[label] = sdpa()[0].transpose(0, 1)
                        fns[label] = sdpa
                    except RuntimeError as e:  # a backend that refuses the shape
                        print(f"  {label}: {str(e).splitlines()[0][:100]}", file=sys.stderr)
            if not args.no_flex:
                try:
                    torch._dynamo.reset()  # one compile per mask, never the recompile limit
                    run = flex_runner(name, mask, q, k, v, hq, hkv)
                    if run is not None:
                        run()
                        fns["flex"] = run
                except Exception as e:  # noqa: BLE001 - report and go on
                    print(f"  flex: {type(e).__name__}: {str(e).splitlines()[0][:100]}",
                          file=sys.stderr)
            row = {key: tf(ms) for key, ms in time_ms(fns, args.reps, args.inner).items()}
            ref = next((key for key in ("cudnn", "ffa") if key in outs), None)
            check = "-" if ref is None else \
                f"{(outs['magiattn'].float() - outs[ref].float()).abs().max().item():.1e} {ref}"
            print(row_line(name, seqlen, 100 * mask.area() / seqlen**2, row, check), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
