"""Run under mpirun by test_dist.py (not a pytest module). Every rank builds the same global
fp64 tensors, runs key -> dispatch -> calc_attn -> backward -> undispatch with torch autograd
and compares with the single-process flex_flash_attn_func on the global tensors (each rank
computes that reference itself): out, lse, max_logits, dq, dk, dv, dsink to 1e-12 relative.
The reference is the numpy API (torch's first custom-op call costs seconds per rank).
A failure raises (non-zero exit); each rank prints "rank R: PASS <mode> max rel err E" at the
end. Modes: main (torch autograd on every mask, numpy path, roll, bf16), mpi4py (numpy path
on cp groups split by mpi4py), validate (every argument check of magiattn.dist and the
timeout of a skipped call, keys that differ between ranks), crash (rank 0 raises while the others wait), cuda (bf16
CUDA tensors, the ranks sharing one GPU: the runtime on the sm90 kernels behind MPI host
staging, vs the single-GPU kernel). Only main and cuda import torch (its import dominates the
run time).
"""

import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "main"
if MODE == "mpi4py":
    from mpi4py import MPI  # initialises MPI before magiattn does
torch = __import__("torch") if MODE in ("main", "cuda") else None

import magiattn  # noqa: E402

TOL = 1e-12
N, HQ, HKV, D = 240, 4, 2, 16  # 240: every world size 1..4 divides it
worst = 0.0


def rel(name, a, b):
    """max |a - b| / max |b| over finite entries; inf/nan positions must agree, no NaN."""
    global worst
    a = np.asarray(a.detach() if hasattr(a, "detach") else a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{name}: shape {list(a.shape)} vs {list(b.shape)}"
    assert not np.isnan(a).any() and not np.isnan(b).any(), f"{name}: NaN"
    fin = np.isfinite(b)
    assert np.array_equal(np.isfinite(a), fin), f"{name}: inf positions differ"
    assert np.array_equal(a[~fin], b[~fin]), f"{name}: inf signs differ"
    err = 0.0 if not fin.any() else float(np.abs(a[fin] - b[fin]).max() /
                                         max(np.abs(b[fin]).max(), 1e-300))
    assert err <= TOL, f"{name}: relative error {err:.3g} > {TOL}"
    worst = max(worst, err)
    return err


def leaf(x):
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


def problem(seed, n=N):
    rng = np.random.default_rng(seed)  # the same on every rank
    return {name: rng.standard_normal(shape) for name, shape in (
        ("q", (n, HQ, D)), ("k", (n, HKV, D)), ("v", (n, HKV, D)), ("dout", (n, HQ, D)),
        ("sink", (2, HQ)))}


def reference(p, mask, sink, softcap, scale):
    """Single-process numpy results on the global tensors: out, meta, dq, dk, dv, dsink."""
    opts = dict(mask=mask, sink=p["sink"] if sink else None, softcap=softcap,
                softmax_scale=scale)
    out, meta = magiattn.flex_flash_attn_func(p["q"], p["k"], p["v"], return_max_logits=True,
                                              **opts)
    grads = magiattn.flex_flash_attn_backward(p["dout"], p["q"], p["k"], p["v"], out, meta.lse,
                                              **opts)
    return (out, meta, *grads)


def check_case(name, key, seed, sink=False, softcap=0.0, scale=None):
    """Distributed torch autograd vs the single-process reference on the key's mask."""
    p = problem(seed, key.total_seqlen)
    out_r, meta_r, dq_r, dk_r, dv_r, ds_r = reference(p, key.mask, sink, softcap, scale)
    q, k, v = leaf(p["q"]), leaf(p["k"]), leaf(p["v"])
    s = leaf(p["sink"]) if sink else None
    local = [magiattn.dispatch(x, key) for x in (q, k, v)]
    out, meta = magiattn.calc_attn(*local, key, sink=s, softcap=softcap, softmax_scale=scale,
                                   return_max_logits=True, dsink_all_reduce_op="sum")
    glob = magiattn.undispatch(out, key)
    (glob * torch.from_numpy(p["dout"])).sum().backward()
    pos = magiattn.get_position_ids(key)
    assert out.dtype == torch.float64 and meta.lse.dtype == torch.float64
    errs = [rel(f"{name} out", glob, out_r), rel(f"{name} local out", out, out_r[pos]),
            rel(f"{name} lse", meta.lse, meta_r.lse[pos]),
            rel(f"{name} max_logits", meta.max_logits, meta_r.max_logits),
            rel(f"{name} dq", q.grad, dq_r), rel(f"{name} dk", k.grad, dk_r),
            rel(f"{name} dv", v.grad, dv_r)]
    if sink:
        errs.append(rel(f"{name} dsink", s.grad, ds_r))
    if name.startswith("masked") and 0 not in key.plan["dispatch"]["rank_chunks"][key.cp_rank]:
        assert not out.detach().any(), "a rank without visible cells has nonzero out"
    check_positions(key)
    print(f"rank {key.cp_rank}: OK {name} ({key.num_local_tokens} local tokens) max rel err "
          f"{max(errs):.2e}", flush=True)


def check_positions(key):
    """get_position_ids is the plan's chunk list, and all ranks together cover 0..N-1."""
    plan = key.plan["dispatch"]
    cs, n = plan["chunk_size"], plan["total_seqlen"]
    want = [t for c in plan["rank_chunks"][key.cp_rank] for t in range(c * cs, min(c * cs + cs, n))]
    ids = magiattn.get_position_ids(key)
    assert ids.dtype == np.int64 and ids.tolist() == want, "position ids differ from the plan"
    assert np.array_equal(magiattn.undispatch(ids, key), np.arange(n)), "not a permutation"


def check_numpy(name, key, seed, sink=False, softcap=0.0, scale=None):
    """The numpy path; dsink is left partial ("none") and summed here with all_reduce."""
    p = problem(seed, key.total_seqlen)
    out_r, meta_r, dq_r, dk_r, dv_r, ds_r = reference(p, key.mask, sink, softcap, scale)
    q, k, v, dout = (magiattn.dispatch(p[x], key) for x in ("q", "k", "v", "dout"))
    s = p["sink"] if sink else None
    opts = dict(sink=s, softcap=softcap, softmax_scale=scale)
    out, meta = magiattn.calc_attn(q, k, v, key, return_max_logits=True, **opts)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    dq, dk, dv, dsink = magiattn.calc_attn_backward(dout, q, k, v, out, meta.lse, key, **opts)
    pos = magiattn.get_position_ids(key)
    errs = [rel(f"{name} numpy out", magiattn.undispatch(out, key), out_r),
            rel(f"{name} numpy lse", meta.lse, meta_r.lse[pos]),
            rel(f"{name} numpy max_logits", meta.max_logits, meta_r.max_logits)]
    for grad, got, want in (("dq", dq, dq_r), ("dk", dk, dk_r), ("dv", dv, dv_r)):
        errs.append(rel(f"{name} numpy {grad}", got, want[pos]))
    if sink:
        errs.append(rel(f"{name} numpy dsink", key.comm.all_reduce(dsink.copy()), ds_r))
        _, _, _, avg = magiattn.calc_attn_backward(dout, q, k, v, out, meta.lse, key,
                                                   dsink_all_reduce_op="avg", **opts)
        errs.append(rel(f"{name} numpy dsink avg", avg * key.cp_size, ds_r))
    check_positions(key)
    print(f"rank {key.cp_rank}: OK numpy {name} max rel err {max(errs):.2e}", flush=True)


def check_roll(key):
    labels = np.arange(N, dtype=np.int64)
    got = magiattn.roll(magiattn.dispatch(labels, key), -1, 0, key, fill_value=-100)
    want = np.roll(labels, -1)
    want[-1] = -100
    assert np.array_equal(got, magiattn.dispatch(want, key)), "int roll with fill"
    flags = np.arange(N) % 3 == 0  # bool rows of one byte: the widened path
    got = magiattn.roll(magiattn.dispatch(flags, key), N + 7, key=key)
    assert np.array_equal(magiattn.undispatch(got, key), np.roll(flags, 7)), "bool roll"
    for fill in (None, 0.5):
        x = leaf(np.random.default_rng(3).standard_normal((N, 3)))
        y = magiattn.undispatch(magiattn.roll(magiattn.dispatch(x, key), 5, key=key,
                                              fill_value=fill), key)
        want = torch.roll(x.detach(), 5, 0)
        g = torch.arange(N * 3, dtype=torch.float64).reshape(N, 3)
        want_grad = torch.roll(g, -5, 0)
        if fill is not None:
            want[:5], want_grad[-5:] = fill, 0
        y.backward(g)
        assert torch.equal(y.detach(), want) and torch.equal(x.grad, want_grad), f"roll {fill}"
    print(f"rank {key.cp_rank}: OK roll", flush=True)


def check_bf16(key):
    p = problem(11)
    out_r, meta_r, *_ = reference(p, key.mask, False, 0.0, None)
    q, k, v = (torch.tensor(p[x], dtype=torch.bfloat16, requires_grad=True) for x in "qkv")
    out, meta = magiattn.calc_attn(*(magiattn.dispatch(x, key) for x in (q, k, v)), key)
    assert out.dtype == torch.bfloat16 and meta.lse.dtype == torch.float32
    magiattn.undispatch(out, key).float().sum().backward()
    pos = magiattn.get_position_ids(key)
    err = float(np.abs(out.detach().double().numpy() - out_r[pos]).max())
    assert err < 0.05, f"bf16 out error {err}"
    assert all(x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all() for x in (q, k, v))
    print(f"rank {key.cp_rank}: OK bf16 (abs err {err:.2e})", flush=True)


def check_cuda():
    """bf16 CUDA tensors end to end against the single-GPU kernel (cuda_compare.py)."""
    from cuda_compare import dist_vs_single_gpu, problem  # imports torch
    n, hq, hkv, d = 512, 4, 2, 128
    cu = [0, 100, 107, 300, n]
    key = magiattn.magi_attn_varlen_key(  # 512 tokens: uneven shards at 3 ranks
        cu, cu, hq, hkv, d, causal=True, dist_attn_config=magiattn.DistAttnConfig(uneven=True))
    p = problem(key, n, torch.Generator(device="cuda").manual_seed(5))
    out, err = dist_vs_single_gpu(key, p)
    # sm_margin leaves SMs free for the communication: the same tiles, the same bits.
    key8 = magiattn.magi_attn_varlen_key(
        cu, cu, hq, hkv, d, causal=True,
        dist_attn_config=magiattn.DistAttnConfig(uneven=True, sm_margin=8))
    with torch.no_grad():
        out8, _ = magiattn.calc_attn(*(magiattn.dispatch(p[x], key8) for x in "qkv"), key8)
    assert torch.equal(out8, out), "cuda: sm_margin=8 changed the forward's bits"
    print(f"rank {key.cp_rank}: OK cuda (max rel err {err:.2e})", flush=True)


def check_torch_args(key):
    q = torch.zeros(key.num_local_tokens, HQ, D, dtype=torch.float64)
    k = torch.zeros(key.num_local_tokens, HKV, D, dtype=torch.float64)
    raises(ValueError, "sink: expected a torch tensor like the others", magiattn.calc_attn, q,
           k, k, key, sink=np.zeros((2, HQ)))
    raises(ValueError, "x: 3 rows (dim 0, shape [3, 2])", magiattn.dispatch,
           torch.zeros(3, 2), key)
    raises(ValueError, "x: on meta, but the distributed runtime takes CPU or CUDA tensors",
           magiattn.dispatch, torch.empty(key.total_seqlen, 2, device="meta"), key)
    print(f"rank {key.cp_rank}: OK torch argument checks", flush=True)


def masks_and_keys(group):
    rng = np.random.default_rng(7)
    cu = np.array([0, 37, 100, 181, N])
    yield "causal+sink+gqa", magiattn.magi_attn_flex_key(
        [[0, N]], [[0, N]], "causal", N, N, HQ, HKV, D, cp_group_or_mesh=group), \
        dict(sink=True)
    yield "varlen causal+softcap", magiattn.magi_attn_varlen_key(
        cu, cu, HQ, HKV, D, cp_group_or_mesh=group, causal=True), dict(softcap=10.0)
    yield "sliding window+sink+softcap", magiattn.magi_attn_varlen_key(
        cu, cu, HQ, HKV, D, cp_group_or_mesh=group, window_size=(24, 0),
        dist_attn_config=magiattn.DistAttnConfig(num_stages=2)), dict(sink=True, softcap=5.0)
    slices = oracle.random_slices(rng, N, N, max_slices=8)
    yield "random flex (overlapping q)", magiattn.magi_attn_flex_key(
        magiattn.AttnRanges([s[:2] for s in slices]),
        np.array([s[2:4] for s in slices]) if torch is None else
        torch.tensor([s[2:4] for s in slices]),
        [magiattn.AttnMaskType.from_int_type(s[4]).value for s in slices], N, N, HQ, HKV, D,
        cp_group_or_mesh=group, chunk_size=10), dict(softcap=3.0, scale=0.3)
    # all keys seen by the first 10 queries only: ranks without them hold only masked rows
    yield "masked ranks+sink", magiattn.magi_attn_flex_key(
        [[0, 10]], [[0, N]], "full", N, N, HQ, HKV, D, cp_group_or_mesh=group,
        dist_attn_config=magiattn.DistAttnConfig(chunk_size=10)), dict(sink=True)
    n = N + 2  # 242: uneven shards at 3 and 4 ranks
    cu = np.array([0, 120, n])
    yield "uneven varlen causal", magiattn.magi_attn_varlen_key(
        cu, cu, HQ, HKV, D, cp_group_or_mesh=group, causal=True,
        dist_attn_config=magiattn.DistAttnConfig(uneven=True)), dict(sink=True)


def main(group=None):
    for seed, (name, key, opts) in enumerate(masks_and_keys(group)):
        if torch is None:
            check_numpy(name, key, seed, **opts)
            continue
        check_case(name, key, seed, **opts)
        if seed == 0:
            check_numpy(name, key, seed, **opts)
            check_roll(key)
            check_bf16(key)
            check_torch_args(key)


def raises(exc, text, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        assert text in str(e), f"{exc.__name__} without {text!r}: {e}"
        return
    raise AssertionError(f"no {exc.__name__} ({text!r})")


def validate():
    world = magiattn.world_communicator()
    rank, size = world.rank, world.size
    key = magiattn.magi_attn_flex_key([[0, N]], [[0, N]], "causal", N, N, HQ, HKV, D)
    nl = key.num_local_tokens
    p = problem(0)
    q, k, v = (magiattn.dispatch(p[x], key) for x in "qkv")
    # calc_attn arguments: each check names its culprit and leaves the communicator usable
    raises(ValueError, "q: shape [3, 4, 16]", magiattn.calc_attn, q[:3], k, v, key)
    raises(ValueError, "num_heads_q", magiattn.calc_attn, q[:, :2], k, v, key)
    raises(ValueError, "v: shape", magiattn.calc_attn, q, k, v[:, :, :8], key)
    raises(ValueError, "k: dtype fp32 is not fp64 (k must match q)", magiattn.calc_attn, q,
           k.astype(np.float32), v, key)
    raises(ValueError, "q: dtype int64", magiattn.calc_attn, q.astype(np.int64), k, v, key)
    raises(ValueError, "sink: shape [2, 3]", magiattn.calc_attn, q, k, v, key,
           sink=np.zeros((2, 3)))
    raises(ValueError, "softcap", magiattn.calc_attn, q, k, v, key, softcap=-1.0)
    raises(ValueError, "dsink_all_reduce_op: 'max'", magiattn.calc_attn, q, k, v, key,
           dsink_all_reduce_op="max")
    raises(ValueError, "expected an array", magiattn.calc_attn, q.tolist(), k, v, key)
    raises(TypeError, "key: expected a DistAttnRuntimeKey", magiattn.calc_attn, q, k, v, None)
    raises(ValueError, "dist_attn_config.sm_margin: -1", magiattn.magi_attn_flex_key,
           [[0, N]], [[0, N]], "causal", N, N, HQ, HKV, D,
           dist_attn_config=magiattn.DistAttnConfig(sm_margin=-1))
    raises(ValueError, "dist_attn_config.sm_margin: 4294967296 must be an int in",
           magiattn.magi_attn_flex_key, [[0, N]], [[0, N]], "causal", N, N, HQ, HKV, D,
           dist_attn_config=magiattn.DistAttnConfig(sm_margin=2**32))
    out, meta = magiattn.calc_attn(q, k, v, key)  # still works: no check broke the group
    raises(ValueError, "dout: dtype fp32 is not fp64", magiattn.calc_attn_backward,
           out.astype(np.float32), q, k, v, out, meta.lse, key)
    raises(ValueError, "dout: shape", magiattn.calc_attn_backward, out[:, :1], q, k, v, out,
           meta.lse, key)
    magiattn.calc_attn_backward(out, q, k, v, out, meta.lse, key)
    # dispatch / undispatch / roll
    raises(ValueError, "x: 100 rows (dim 0, shape [100, 4, 16]), but the key's mask has 240",
           magiattn.dispatch, p["q"][:100], key)
    raises(ValueError, f"but rank {rank} of the key has {nl}", magiattn.undispatch, q[:-1], key)
    raises(ValueError, "no rows", magiattn.dispatch, np.float64(1.0), key)
    raises(ValueError, "roll: dim 1", magiattn.roll, q, 1, 1, key)
    raises(TypeError, "key: expected", magiattn.roll, q, 1)
    raises(TypeError, "key: expected", magiattn.dispatch, p["q"], "key")
    raises(TypeError, "key: expected", magiattn.undispatch, q, None)
    raises(TypeError, "key: expected", magiattn.get_position_ids, None)
    # keys
    mask = key.mask
    raises(ValueError, f"the plan is for cp {size + 1} ranks but the cp group has {size}",
           magiattn.DistAttnRuntimeKey.from_plan, magiattn.make_plan(mask, size + 1), mask,
           HQ, HKV, D)
    raises(ValueError, "the plan is for 120 tokens but the mask has total_seqlen_q 240",
           magiattn.DistAttnRuntimeKey.from_plan, magiattn.make_plan(magiattn.causal(120, 120),
                                                                     size), mask, HQ, HKV, D)
    ok = magiattn.DistAttnRuntimeKey.from_plan(key.plan, mask, HQ, HKV, D)
    assert ok.num_local_tokens == nl and ok.plan == key.plan
    flex = magiattn.magi_attn_flex_key
    raises(ValueError, "num_heads_q 5 is not a multiple of num_heads_kv 2", flex,
           [[0, N]], [[0, N]], "full", N, N, 5, 2, D)
    raises(ValueError, "head_dim: 0", flex, [[0, N]], [[0, N]], "full", N, N, HQ, HKV, 0)
    raises(ValueError, "chunk_size 8 conflicts with dist_attn_config.chunk_size 4", flex,
           [[0, N]], [[0, N]], "full", N, N, HQ, HKV, D,
           dist_attn_config=magiattn.DistAttnConfig(chunk_size=4), chunk_size=8)
    raises(TypeError, "dist_attn_config: expected", flex, [[0, N]], [[0, N]], "full", N, N,
           HQ, HKV, D, dist_attn_config={"chunk_size": 4})
    raises(ValueError, "only self-attention", flex, [[0, N]], [[0, N]], "full", N, N, HQ,
           HKV, D, is_same_source=False)
    raises(TypeError, "cp_group_or_mesh: expected None", flex, [[0, N]], [[0, N]], "full", N,
           N, HQ, HKV, D, cp_group_or_mesh="world")
    raises(ValueError, "unknown mask type 'diagonal'", flex, [[0, N]], [[0, N]], "diagonal",
           N, N, HQ, HKV, D)
    if size > 1:
        raises(ValueError, f"not divisible by cp {size}", flex, [[0, N + 1]], [[0, N + 1]],
               "full", N + 1, N + 1, HQ, HKV, D)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flex([[0, N]], [[0, N]], "full", N, N, HQ, HKV, D, pad_size=8)
    assert any(w.category is DeprecationWarning and "pad_size 8" in str(w.message)
               for w in caught), "pad_size warning"
    # communicators
    raises(TypeError, "comm: expected None", magiattn.Communicator, "world")
    raises(ValueError, "timeout: 0", setattr, world, "timeout", 0)
    raises(ValueError, "op 'min'", world.all_reduce, np.zeros(2), "min")
    raises(ValueError, "x: dtype int64 is not supported", world.all_reduce,
           np.zeros(2, np.int64))
    raises(ValueError, "needs float32 or float64", world.all_reduce, np.zeros(2, np.float16))
    raises(ValueError, "must be contiguous", world.all_reduce, np.zeros((4, 4))[:, 1])
    assert world.timeout == 300 and not world.broken
    raises(ValueError, "rank 99 is not in a plan for cp", key._plan.rank_tokens, 99)
    raises(ValueError, "rank -1 is not in a plan for cp", key._plan.position_ids, -1)
    closed = magiattn.dist._lib().Communicator()
    closed.close()
    raises(ValueError, "rank: the communicator is closed", getattr, closed, "rank")
    if size > 1:
        check_timeout(rank)
        check_disagreeing_keys(rank)
    print(f"rank {rank}: OK validate", flush=True)


def check_disagreeing_keys(rank):
    """Rank 0 builds its key from another mask, then from another config: every rank gets a
    ValueError naming rank 0 against the others at once (not the 300 s timeout)."""
    others = "ranks 1, 2" if magiattn.world_communicator().size == 3 else "rank 1 "
    for kwargs in ({"attn_mask_type": "causal" if rank == 0 else "full"},
                   {"attn_mask_type": "full", "chunk_size": 20 if rank == 0 else 40}):
        magiattn.world_communicator().barrier()
        start = time.monotonic()
        try:
            magiattn.magi_attn_flex_key([[0, N]], [[0, N]], total_seqlen_q=N, total_seqlen_k=N,
                                        num_heads_q=HQ, num_heads_kv=HKV, head_dim=D, **kwargs)
        except ValueError as e:
            msg = str(e)
            assert "disagree on the key" in msg and "rank 0 holds" in msg and others in msg, msg
        else:
            raise AssertionError(f"rank {rank}: no error for a key that differs on rank 0")
        assert time.monotonic() - start < 1.0, time.monotonic() - start
    magiattn.world_communicator().barrier()  # the communicator is still usable


def check_timeout(rank):
    """Rank 1 skips an undispatch: every other rank gets RuntimeError naming it within the
    timeout, and that communicator then refuses calls; the world one stays usable."""
    comm = magiattn.Communicator(timeout=1.0)
    key = magiattn.magi_attn_flex_key([[0, N]], [[0, N]], "full", N, N, HQ, HKV, D,
                                      cp_group_or_mesh=comm)
    if rank != 1:
        start = time.monotonic()
        raises(RuntimeError, "timed out after 1000 ms", magiattn.undispatch,
               np.zeros((key.num_local_tokens, 2)), key)
        assert time.monotonic() - start < 5 and comm.broken
        raises(RuntimeError, "unusable", comm.barrier)
    magiattn.world_communicator().barrier()


if __name__ == "__main__":
    if MODE == "main":
        main()
    elif MODE == "mpi4py":
        raises(ValueError, "is MPI_COMM_NULL", magiattn.Communicator, MPI.COMM_NULL)
        world = MPI.COMM_WORLD
        group = world.Split(color=int(world.rank >= 2), key=world.rank)  # sizes 2 and 1 at np 3
        main(group)
        main(magiattn.Communicator(group, timeout=60))
        assert world.allreduce(1) == world.size  # mpi4py's own comm is untouched
    elif MODE == "validate":
        validate()
    elif MODE == "cuda":
        check_cuda()
    elif MODE == "crash":  # rank 0 raises; the others wait in a collective it never joins
        key = magiattn.magi_attn_flex_key([[0, N]], [[0, N]], "full", N, N, HQ, HKV, D)
        if key.cp_rank == 0:
            raise RuntimeError("rank 0 fails on purpose")
        magiattn.undispatch(np.zeros((key.num_local_tokens, 2)), key)
    else:
        raise SystemExit(f"unknown mode {MODE}")
    print(f"rank {magiattn.world_communicator().rank}: PASS {MODE} max rel err {worst:.2e}",
          flush=True)
