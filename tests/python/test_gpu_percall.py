"""The per-call path on CUDA tensors (issue: forward at every size): a cache hit reads no
range tensor back to the host, so a loop of calls queues without waiting for the GPU; an
in-place write to a CUDA range tensor is seen; CUDA graphs (torch.cuda.graph and
torch.compile's reduce-overhead) replay the call with new q/k/v; more masks than the cache
holds stay correct. Skipped without a CUDA device or GPU kernels."""

import pytest

torch = pytest.importorskip("torch")

import magiattn  # noqa: E402
from magiattn import _C, functional, masks  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def ranges_of(mask, device="cuda"):
    return tuple(torch.as_tensor(x, dtype=torch.int32).to(device)
                 for x in (mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()))


def qkv(n, hq=4, hkv=2, d=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, d, generator=g).to(torch.bfloat16).cuda() for h in (hq, hkv, hkv)]


def fresh(q, k, v, qr, kr, tm):
    """The same call on CPU copies of the ranges (content-keyed: never a stale entry)."""
    return magiattn.flex_flash_attn_func(q, k, v, qr.cpu(), kr.cpu(), tm.cpu())


@pytest.fixture(scope="module")
def gpu_built():
    q = torch.zeros(8, 1, 128, device="cuda", dtype=torch.bfloat16)
    try:
        magiattn.flex_flash_attn_func(q, q, q, [[0, 8]], [[0, 8]])
    except ValueError as e:
        if "built without CUDA" in str(e):
            pytest.skip(str(e))
        raise


def test_steady_state_never_waits_for_the_gpu(gpu_built):
    n = 4096
    q, k, v = qkv(n)
    qr, kr, tm = ranges_of(masks.build_family("varlen-causal", n, seed=2))
    want, _ = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)  # first use: may read
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time ahead of the calls
    asleep = torch.cuda.Event()
    asleep.record()
    outs = [magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)[0] for _ in range(20)]
    assert not asleep.query(), "a call waited for the GPU (a device-to-host read or a sync)"
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, want)


def test_in_place_write_to_cuda_ranges_is_seen(gpu_built):
    n = 1024
    q, k, v = qkv(n, seed=1)
    qr, kr, tm = ranges_of(masks.causal(n, n))
    magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    qr[0, 1] = 600  # rows 600.. now see nothing
    out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    want, want_meta = fresh(q, k, v, qr, kr, tm)
    assert torch.equal(out, want) and torch.equal(meta.lse, want_meta.lse)
    assert torch.isinf(meta.lse[600:]).all()
    # A new tensor, likely at the freed one's address, with other contents: not the old mask.
    del qr
    qr2 = torch.tensor([[0, 300]], dtype=torch.int32, device="cuda")
    out2, meta2 = magiattn.flex_flash_attn_func(q, k, v, qr2, kr, tm)
    want2, want_meta2 = fresh(q, k, v, qr2, kr, tm)
    assert torch.equal(out2, want2) and torch.equal(meta2.lse, want_meta2.lse)


@pytest.mark.parametrize("placement", ["cuda", "cpu"])
def test_cuda_graph_replays_with_new_inputs(gpu_built, placement):
    n = 2048
    qr, kr, tm = ranges_of(masks.build_family("sliding-window", n, seed=4), placement)
    q, k, v = qkv(n, seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
        magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    for seed in (6, 7):
        for x, y in zip((q, k, v), qkv(n, seed=seed)):
            x.copy_(y)
        graph.replay()
        want, want_meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
        assert torch.equal(out, want) and torch.equal(meta.lse, want_meta.lse)


def test_capture_with_unseen_cuda_ranges_is_a_clear_error(gpu_built):
    q, k, v = qkv(256)
    qr = torch.tensor([[0, 256]], dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="before this CUDA graph capture"):
        with torch.cuda.graph(graph):
            magiattn.flex_flash_attn_func(q, k, v, qr, qr)


def test_torch_compile_reduce_overhead(gpu_built):
    n = 2048
    qr, kr, tm = ranges_of(masks.build_family("varlen-causal", n, seed=8))

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            out, _ = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
            return out * 2

    model = Attn()
    compiled = torch.compile(model, mode="reduce-overhead")
    for seed in range(4):  # warm-up, record, replays
        q, k, v = qkv(n, seed=10 + seed)
        got = compiled(q, k, v).clone()
        assert torch.equal(got, model(q, k, v)), f"call {seed}"


def test_more_masks_than_the_cache_holds(gpu_built):
    n = 512
    q, k, v = qkv(n, seed=9)
    count = functional._CACHE_SIZE + 6
    rs = [ranges_of(magiattn.Mask(n, n, [[0, 64 + 5 * i]], [[i % 5, n]], [i % 4]))
          for i in range(count)]
    for _ in range(2):
        for qr, kr, tm in rs:
            out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
            want, want_meta = fresh(q, k, v, qr, kr, tm)
            assert torch.equal(out, want) and torch.equal(meta.lse, want_meta.lse)
    assert functional._cache_len() <= functional._CACHE_SIZE
    assert len(functional._by_tensor) <= functional._BY_TENSOR_SIZE


def test_bad_workspace_is_an_error_naming_it(gpu_built):
    q, k, v = qkv(128)
    pm = functional.prepared_mask(128, 128, [[0, 128]], [[0, 128]])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], device="cuda")
    need = _C.forward_workspace_bytes(128, 2)
    stream = torch.cuda.current_stream().cuda_stream
    for ws, match in ((torch.empty(need - 1, dtype=torch.uint8, device="cuda"), "workspace: "),
                      (torch.empty(need, dtype=torch.float32, device="cuda"), "uint8"),
                      (torch.empty(need, dtype=torch.uint8), "CUDA tensor"),
                      (torch.empty(2, need, dtype=torch.uint8, device="cuda"), "1-d")):
        with pytest.raises(ValueError, match=match):
            _C.forward_prepared(q, k, v, pm, out, lse, ws, None, None, None, 0.0, "sh", False,
                                0, stream)


def test_bad_backward_workspace_is_an_error_naming_it(gpu_built):
    q, k, v = qkv(128)
    pm = functional.prepared_mask(128, 128, [[0, 128]], [[0, 128]])
    out, meta = magiattn.flex_flash_attn_func(q, k, v, torch.tensor([[0, 128]], dtype=torch.int32),
                                              torch.tensor([[0, 128]], dtype=torch.int32))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    need = _C.backward_workspace_bytes(*q.shape)
    stream = torch.cuda.current_stream().cuda_stream
    big = torch.empty(need + 16, dtype=torch.uint8, device="cuda")
    for ws, match in ((torch.empty(need - 1, dtype=torch.uint8, device="cuda"),
                       r"workspace: .* bytes, but .* are needed \(attn_backward_workspace_bytes"),
                      (big[1:], "16-byte aligned"),
                      (torch.empty(need, dtype=torch.uint8), "CUDA tensor")):
        with pytest.raises(ValueError, match=match):
            _C.backward(q, q, k, v, out, meta.lse, dq, dk, dv, pm, cuda_stream=stream,
                        workspace=ws)
    # A workspace of the right size, even full of garbage, gives the per-call result (bit for
    # bit: deterministic mode fixes dq's order of sums).
    want = [torch.empty_like(x) for x in (q, k, v)]
    _C.backward(q, q, k, v, out, meta.lse, *want, pm, cuda_stream=stream, deterministic=True)
    big.fill_(0xFF)
    _C.backward(q, q, k, v, out, meta.lse, dq, dk, dv, pm, cuda_stream=stream,
                deterministic=True, workspace=big)
    for name, got, ref in zip("qkv", (dq, dk, dv), want):
        assert torch.equal(got, ref), f"d{name} differs with a caller's workspace"


def test_graph_replayed_after_the_ranges_changed_gives_nan(gpu_built):
    """A captured graph keeps the mask it was captured with; the kernel compares the range
    tensors it reads on every replay with that mask, so other ranges give NaN, not a result
    for the old mask."""
    n = 1024
    qr, kr, tm = ranges_of(masks.build_family("varlen-causal", n, seed=12))
    q, k, v = qkv(n, seed=13)
    magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    graph.replay()
    want, want_meta = fresh(q, k, v, qr, kr, tm)
    assert torch.equal(out, want) and torch.equal(meta.lse, want_meta.lse)
    saved = qr.clone()
    qr[-1, 1] -= 1  # another mask in the same tensor
    graph.replay()
    assert torch.isnan(out.float()).all() and torch.isnan(meta.lse).all()
    qr.copy_(saved)
    graph.replay()
    assert torch.equal(out, want) and torch.equal(meta.lse, want_meta.lse)


def test_write_the_version_counter_misses_gives_nan(gpu_built):
    n = 512
    qr, kr, tm = ranges_of(masks.causal(n, n))
    q, k, v = qkv(n, seed=14)
    magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    version = qr._version
    qr.data[0, 1] = 300  # .data has its own version counter: the cache cannot see this
    assert qr._version == version
    out, meta = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
    assert torch.isnan(out.float()).all() and torch.isnan(meta.lse).all()


def test_the_cpp_call_runs_on_torchs_current_stream(gpu_built):
    """The public call's C++ path (magiattn._torch.call) asks torch for the current stream:
    with the default stream busy for a second, a call made on a side stream finishes on the
    side stream long before, with the right result."""
    n = 2048
    q, k, v = qkv(n, seed=20)
    qr, kr, tm = ranges_of(masks.build_family("varlen-causal", n, seed=21))
    want, _ = fresh(q, k, v, qr, kr, tm)
    magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)  # first use: the mask is looked up
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # the default stream: about a second busy
    with torch.cuda.stream(side):
        torch.full_like(want, float("nan"))  # freed at once: the block `out` likely reuses
        out, _ = magiattn.flex_flash_attn_func(q, k, v, qr, kr, tm)
        done = torch.cuda.Event()
        done.record()
    done.synchronize()
    assert not torch.cuda.current_stream().query(), "the default stream finished first"
    assert torch.equal(out, want)
    torch.cuda.synchronize()
