"""Distributed attention per GPU under torchrun: magiattn calc_attn over NCCL vs PyTorch's ring
context parallel vs the single-GPU kernel on one rank's share (docs/semantics.md §4).

    torchrun --nproc_per_node=N bench/gpu_dist_bench.py                    # 8k, 16k per GPU
    torchrun --nproc_per_node=N bench/gpu_dist_bench.py --seqlen-per-gpu 16384 --masks causal
    torchrun --nproc_per_node=1 bench/gpu_dist_bench.py --dry-run          # tiny, to check it runs

Columns (TFLOP/s per GPU, forward / forward + backward; bf16, Hq:Hkv 32:8, D 128):
- magiattn: dispatch once, then calc_attn on the local tokens (NCCL communicator from the
  default process group, Communicator.from_torch_group); forward + backward is
  out.backward(dout) on the local rows.
- ring CP: torch.distributed.tensor.experimental.context_parallel around SDPA with the cuDNN
  backend (full and causal only; torch's load balancing for causal), when importable; else the
  column says why.
- share: magiattn.flex_flash_attn_func alone on exactly what one rank computes (its host
  slices and every stage's slices over its local K/V followed by the remote K/V rows it
  fetches, random data): the rate with no communication at all, the bound for magiattn.

Timing: each rank times every repetition with CUDA events; a repetition's time is the slowest
rank's (all_reduce max), the median over --reps is reported, after two warm-up calls.
FLOPs = 4 * area * Hq * D forward, 3.5x that for forward + backward (SPEC §4), area = visible
cells of the global mask; TFLOP/s per GPU = FLOPs / (slowest rank time * cp).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_attention_bench import build_mask  # noqa: E402

import magiattn  # noqa: E402

MASKS = ["full", "causal", "varlen-causal"]


def slowest_median_ms(fn, reps: int) -> float:
    """Median over reps of the slowest rank's CUDA-event time of one call of fn."""
    for _ in range(2):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = torch.tensor([s.elapsed_time(e) for s, e in events], device="cuda")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.tolist())


def fwd_and_fb(forward, leaves, dout):
    """The two timed calls of a column: forward alone (no graph), and forward + backward."""
    def fwd():
        with torch.no_grad():
            forward()

    def fb():
        for x in leaves:
            x.grad = None
        forward().backward(dout)

    return fwd, fb


def magiattn_column(key, q, k, v, dout):
    leaves = [magiattn.dispatch(x, key).detach().requires_grad_() for x in (q, k, v)]
    local_dout = magiattn.dispatch(dout, key)
    return fwd_and_fb(lambda: magiattn.calc_attn(*leaves, key)[0], leaves, local_dout)


def share_column(key, hq, hkv, d):
    """One rank's work as one kernel call: host slices over the local K rows, stage s's slices
    over the rows fetched in stage s, placed after them (the plan's localized slices)."""
    rank = key.plan["ranks"][key.cp_rank]
    n_local = key.num_local_tokens
    slices, offset = [list(x) for x in rank["host_slices"]], n_local
    for stage in rank["stages"]:
        slices += [[q0, q1, k0 + offset, k1 + offset, t] for q0, q1, k0, k1, t in stage["slices"]]
        offset += sum(stage["output_split_sizes"])
    g = torch.Generator(device="cuda").manual_seed(1)
    q, dout = (torch.randn(n_local, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(2))
    k, v = (torch.randn(offset, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    leaves = [x.requires_grad_() for x in (q, k, v)]
    ranges = (torch.tensor([s[0:2] for s in slices], dtype=torch.int32, device="cuda"),
              torch.tensor([s[2:4] for s in slices], dtype=torch.int32, device="cuda"),
              torch.tensor([s[4] for s in slices], dtype=torch.int32, device="cuda"))
    return fwd_and_fb(lambda: magiattn.flex_flash_attn_func(*leaves, *ranges)[0], leaves, dout)


def ring_cp_unavailable() -> str:
    """Why torch's ring context parallel cannot run here ('' when it can)."""
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no context_parallel ({e})"
    return ""


def cp_options():
    """torch's context-parallel options object (its module moved between releases), or None."""
    import importlib
    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):
        try:
            return importlib.import_module(name)._cp_options
        except (ImportError, AttributeError):
            continue
    return None


def time_ring_cp(mask_name, q, k, v, dout, mesh, reps):
    """(fwd ms, fwd + bwd ms) of SDPA cuDNN under context_parallel; the buffers are sharded
    (load-balanced for causal) on entering the context and restored on leaving it. GQA through
    SDPA's enable_gqa; K/V repeated to Hq heads where the ring does not take it."""
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    causal = mask_name == "causal"
    # Load balancing (head-tail shards) is for causal masks; torch refuses it without one.
    options = cp_options()
    if options is not None:
        options.enable_load_balance = causal
    hq, hkv = q.shape[1], k.shape[1]
    bufs = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v, dout)]  # [1, H, S, D]
    note = ""
    for gqa in ((True, False) if hq != hkv else (False,)):
        if not gqa and hq != hkv:
            bufs[1], bufs[2] = (x.repeat_interleave(hq // hkv, dim=1) for x in bufs[1:3])
            note = " (K/V repeated to Hq heads)"
        try:
            with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2]), \
                    sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                leaves = [x.detach().requires_grad_() for x in bufs[:3]]
                fwd, fb = fwd_and_fb(lambda: F.scaled_dot_product_attention(
                    *leaves, is_causal=causal, enable_gqa=gqa), leaves, bufs[3])
                return slowest_median_ms(fwd, reps), slowest_median_ms(fb, reps), note
        except Exception:  # noqa: BLE001 - retried with repeated K/V, then reported
            if not gqa or hq == hkv:
                raise
    raise AssertionError("unreachable")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen-per-gpu", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--masks", nargs="+", default=MASKS, choices=MASKS)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes (1024 tokens per GPU, 8:2 heads, 2 reps): checks it runs")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.seqlen_per_gpu, args.heads_q, args.heads_kv, args.reps = [1024], 8, 2, 2
    if "LOCAL_RANK" not in os.environ:
        print("start it with torchrun: torchrun --nproc_per_node=N bench/gpu_dist_bench.py")
        return 2
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    cp, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    hq, hkv, d = args.heads_q, args.heads_kv, args.head_dim
    ring_why = ring_cp_unavailable()
    mesh = None
    if not ring_why:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (cp,))
    info = magiattn.info()
    say = print if rank == 0 else (lambda *a, **k: None)
    command = " ".join(["torchrun", f"--nproc_per_node={cp}", "bench/gpu_dist_bench.py",
                        *sys.argv[1:]])
    say(f"`{command}`")
    say(f"\n{cp} x {torch.cuda.get_device_name()}, torch {torch.__version__}, magiattn "
        f"{info['version']}, NCCL {info['nccl_version'] or 'none: ' + info['nccl_error']}; "
        f"bf16, Hq {hq}, Hkv {hkv}, D {d}; TFLOP/s per GPU, forward / forward + backward, "
        f"median of {args.reps}" + (f"; ring CP: {ring_why}" if ring_why else "") + "\n")
    say("| mask | tokens per GPU | total | magiattn | ring CP (SDPA cuDNN) | "
        "share (1 GPU, no comm) |")
    say("|---|---|---|---|---|---|")
    notes = []
    for per_gpu in args.seqlen_per_gpu:
        n = per_gpu * cp
        g = torch.Generator(device="cuda").manual_seed(n)  # the same global tensors on every rank
        q, dout = (torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(2))
        k, v = (torch.randn(n, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(2))
        for name in args.masks:
            mask = build_mask(name, n)
            flops = 4.0 * int(mask.area()) * hq * d
            qr, kr, types = mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()
            key = magiattn.magi_attn_flex_key(qr, kr, types, n, n, hq, hkv, d,
                                              cp_group_or_mesh=group)

            def rate(fwd_ms, fb_ms):
                return (f"{flops / (fwd_ms * cp) / 1e9:.0f} / "
                        f"{3.5 * flops / (fb_ms * cp) / 1e9:.0f}")

            cells = []
            for column in (lambda: magiattn_column(key, q, k, v, dout),
                           lambda: share_column(key, hq, hkv, d)):
                fwd, fb = column()
                cells.append(rate(slowest_median_ms(fwd, args.reps),
                                  slowest_median_ms(fb, args.reps)))
            if ring_why or name not in ("full", "causal"):
                ring = "-"
            else:
                try:
                    fwd_ms, fb_ms, note = time_ring_cp(name, q, k, v, dout, mesh, args.reps)
                    ring = rate(fwd_ms, fb_ms) + ("*" if note else "")
                    if note:
                        notes.append(f"* {name} {per_gpu}: ring CP{note}")
                except Exception as e:  # noqa: BLE001 - the column says why
                    ring = "failed"
                    notes.append(f"ring CP {name} {per_gpu}: {type(e).__name__}: {str(e)[:200]}")
            say(f"| {name} | {per_gpu} | {n} | {cells[0]} | {ring} | {cells[1]} |", flush=True)
    for line in notes:
        say(line)
    if not ring_why:
        say("ring CP is SDPA's dense masks only ('-' elsewhere)")
    if cp == 1:
        say("world size 1: every K/V fetch is a copy within one GPU, so these columns say "
            "nothing about communication or its overlap; that needs 2 or more GPUs "
            "(torchrun --nproc_per_node=2 or more)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
