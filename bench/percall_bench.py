"""Per-call cost of one attention forward as a training loop sees it: magiattn vs cuDNN, Flex.

A loop of --calls back-to-back calls of magiattn.flex_flash_attn_func, and the same loop for
the baselines, in one process on the same inputs.

    python3 bench/percall_bench.py                       # full, causal at 2k..64k
    python3 bench/percall_bench.py --masks causal block-sparse --seqlens 32768 --graph
    python3 bench/percall_bench.py --no-flex --json /tmp/percall.json

Columns:
  cpu-ranges   magiattn, q_ranges / k_ranges / attn_type_map as CPU int32 tensors
  cuda-ranges  magiattn, the same as CUDA int32 tensors (MagiAttention's convention), the same
               tensor objects every call, as a training loop reuses its batch's ranges
  cudnn        torch SDPA, cuDNN backend, q/k/v as [1, H, N, D] views (full and causal only)
  flex         FlexAttention, compiled, block mask built once (gpu_attention_bench.flex_runner)
  graph        (--graph) one magiattn call with the CUDA ranges captured in a CUDA graph
               (torch.cuda.graph), replayed --calls times
Per column: GPU time per call = CUDA events around the whole loop / calls, after a warm-up and a
synchronize; host time per call = perf_counter around the same loop with no synchronize inside
it (the time until the calls are queued) / calls, printed twice: over the whole loop, and
over calls 2..N ("steady"). The first call after a synchronize cost 24-207 us on an H200 host
for every library in two runs, a one-element torch.add_ included (docs/benchmarks.md), which a
training loop, never synchronising between its calls, does not pay on each call. TFLOP/s from
the GPU time, FLOPs = 4 * area * Hq * D, area = visible cells of the mask. Each number is the
median of --reps loops, the columns' loops interleaved. Setup (ranges tensors, Flex's block
mask and compile, the graph capture) stays outside the loops. A column that raises prints '-',
its error once on stderr.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import (SPEC_MASKS, build_mask, dense_ok, flex_runner,  # noqa: E402
                                 range_tensors)

import magiattn  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ["cpu-ranges", "cuda-ranges", "cudnn", "flex", "graph"]
_reported: set = set()


def report(where: str, col: str, e: BaseException) -> None:
    """One stderr line per distinct (column, error)."""
    lines = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {lines[0][:160] if lines else ''}"
    if (col, msg) not in _reported:
        _reported.add((col, msg))
        print(f"  [{where}] {col}: {msg}", file=sys.stderr, flush=True)


def one_loop(call, ctx, calls: int) -> tuple[float, float, float]:
    """(GPU ms per call, host us per call, host us per call after the first) of one loop of
    `calls` calls, started on an idle GPU."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ctx():
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        call()
        t_first = time.perf_counter()
        for _ in range(calls - 1):
            call()
        t1 = time.perf_counter()
        end.record()
        torch.cuda.synchronize()
    steady = (t1 - t_first) * 1e6 / (calls - 1) if calls > 1 else float("nan")
    return start.elapsed_time(end) / calls, (t1 - t0) * 1e6 / calls, steady


def measure(cols: dict, reps: int, calls: int, warmup: int, where: str) -> dict:
    """Median GPU ms, host us and steady host us per call of each column {key: (call, ctx)};
    the reps are interleaved (rep 1 of every column, then rep 2, ...). A column that raises is
    dropped."""
    for key in list(cols):
        call, ctx = cols[key]
        try:
            with ctx():
                for _ in range(warmup):
                    call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on
            report(where, key, e)
            del cols[key]
    samples = {key: ([], [], []) for key in cols}
    for _ in range(reps):
        for key in list(cols):
            try:
                gpu, host, steady = one_loop(*cols[key], calls)
            except Exception as e:  # noqa: BLE001
                report(where, key, e)
                del cols[key], samples[key]
                continue
            samples[key][0].append(gpu)
            samples[key][1].append(host)
            samples[key][2].append(steady)
    return {key: {"gpu_ms": statistics.median(g), "host_us": statistics.median(h),
                  "host_steady_us": statistics.median(st), "gpu_ms_all": g, "host_us_all": h,
                  "host_steady_us_all": st} for key, (g, h, st) in samples.items()}


def graph_replay(call, warmup: int):
    """`call` captured once in a CUDA graph (warm-up on a side stream first, as torch's docs
    require); returns the replay function, which keeps the graph and its outputs alive."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = call()

    def replay():
        graph.replay()
    replay.outputs = static_out  # the graph writes into these on every replay
    return replay


def run_row(name: str, seqlen: int, q, k, v, args) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    hq, hkv, d = args.heads_q, args.heads_kv, args.head_dim
    where = f"{name} {seqlen}"
    mask = build_mask(name, seqlen)
    area = int(mask.area())
    cpu_r = range_tensors(mask)
    cuda_r = tuple(x.to("cuda") for x in cpu_r)
    none = contextlib.nullcontext
    magi = lambda r: lambda: magiattn.flex_flash_attn_func(q, k, v, r[0], r[1], r[2])  # noqa: E731
    cols = {"cpu-ranges": (magi(cpu_r), none), "cuda-ranges": (magi(cuda_r), none)}
    if dense_ok(name):
        qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        causal = name == "causal"
        # the backend is chosen once around the loop, as a training loop would
        cols["cudnn"] = (lambda: F.scaled_dot_product_attention(
            qt, kt, vt, is_causal=causal, enable_gqa=hq != hkv),
            lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    if not args.no_flex:
        try:
            torch._dynamo.reset()  # one compile per mask, never the recompile limit
            cols["flex"] = (flex_runner(name, mask, q, k, v, hq, hkv), none)
        except Exception as e:  # noqa: BLE001
            report(where, "flex", e)
    if args.graph:  # last: a failed capture is the most likely to disturb what follows
        try:
            cols["graph"] = (graph_replay(magi(cuda_r), args.warmup), none)
        except Exception as e:  # noqa: BLE001
            report(where, "graph", e)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    flops = 4.0 * area * hq * d
    res = measure(cols, args.reps, args.calls, args.warmup, where)
    for r in res.values():
        r["tflops"] = flops / (r["gpu_ms"] * 1e-3) / 1e12
    del cols, cpu_r, cuda_r, mask
    return {"mask": name, "seqlen": seqlen, "area": area, "flops": flops, "columns": res}


def format_row(row: dict, shown: list) -> str:
    res = row["columns"]
    host = lambda r: f"{r['host_us']:.0f}/{r['host_steady_us']:.0f}"  # noqa: E731
    cells = "".join(f"{res[c]['tflops']:8.1f}{host(res[c]):>9} |" if c in res
                    else f"{'-':>8}{'-':>9} |" for c in shown)
    ratio = lambda c: (f"{res['cuda-ranges']['tflops'] / res[c]['tflops']:8.2f}"  # noqa: E731
                       if c in res and "cuda-ranges" in res else f"{'-':>8}")
    return (f"{row['mask']:<20}{row['seqlen']:>7}{100 * row['area'] / row['seqlen']**2:>7.1f} |"
            f"{cells}{ratio('cudnn')}{ratio('flex')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--seqlens", type=int, nargs="+",
                    default=[2048, 4096, 8192, 16384, 32768, 65536])
    ap.add_argument("--masks", nargs="+", default=["full", "causal"], choices=SPEC_MASKS)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--calls", type=int, default=20, help="back-to-back calls per timed loop")
    ap.add_argument("--reps", type=int, default=5, help="timed loops per column (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per column first")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (compiles per mask)")
    ap.add_argument("--graph", action="store_true", help="add magiattn in a CUDA graph")
    ap.add_argument("--json", metavar="PATH", help="write every number (rewritten after each row)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    hq, hkv, d, dtype = args.heads_q, args.heads_kv, args.head_dim, DTYPES[args.dtype]
    shown = [c for c in COLUMNS if (c != "flex" or not args.no_flex) and (c != "graph" or args.graph)]
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "args": vars(args), "columns": shown}
    print(f"# {meta['gpu']}, torch {meta['torch']}, {meta['date']}; {args.dtype}, Hq {hq}, "
          f"Hkv {hkv}, D {d}; median of {args.reps} loops x {args.calls} calls; per column "
          f"TFLOP/s (GPU time) and host us/call (time to queue: whole loop/calls 2..N); ratios "
          f"are cuda-ranges/x")
    print(f"{'':<34} |" + "".join(f"{c:>17} |" for c in shown) + f"{'cuda/':>8}{'cuda/':>8}")
    print(f"{'mask':<20}{'tokens':>7}{'area%':>7} |" + f"{'TFLOP/s':>8}{'host us':>9} |" * len(shown)
          + f"{'cudnn':>8}{'flex':>8}")
    rows = []
    for seqlen in args.seqlens:
        gen = torch.Generator(device="cuda").manual_seed(seqlen)
        q = torch.randn(seqlen, hq, d, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(seqlen, hkv, d, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(seqlen, hkv, d, device="cuda", dtype=dtype, generator=gen)
        for name in args.masks:
            try:
                row = run_row(name, seqlen, q, k, v, args)
            except Exception as e:  # noqa: BLE001 - e.g. the mask itself or out of memory
                report(f"{name} {seqlen}", "row", e)
                row = {"mask": name, "seqlen": seqlen, "area": 0, "flops": 0.0,
                       "columns": {}, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(format_row(row, shown), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
            magiattn.clear_mask_cache()
            gc.collect()
            torch.cuda.empty_cache()
        del q, k, v
        gc.collect()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
