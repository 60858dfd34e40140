"""magiattn._torch, the torch front's per-call forward in C++ (python/src/torch_ext.cc): the
same bits and gradients as the Python path it replaces, autograd only when asked for, errors
that keep their Python type through the autograd engine, and CPU range tensors recognised by
identity but checked against the mask on every call."""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import magiattn  # noqa: E402
from magiattn import functional, masks, torch_ops  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("magiattn._torch") is None,
    reason="magiattn was built without torch (no magiattn._torch)")


def test_the_cpp_front_loads_when_built():
    assert torch_ops._cpp is not None, "magiattn._torch exists but did not load"
    assert torch_ops._cpp.built_with_torch == torch.__version__


def test_a_module_built_against_another_torch_is_not_used():
    with pytest.warns(RuntimeWarning, match="built against torch 0.0.1.*runs its per-call "
                                            "path in Python"):
        got = torch_ops._checked_cpp_front(type("M", (), {"built_with_torch": "0.0.1"}),
                                           torch.__version__)
    assert got is None


def _inputs(n=96, hq=4, hkv=2, d=32, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, d, generator=g, dtype=dtype).requires_grad_()
            for h in (hq, hkv, hkv)]


def _ranges(mask, dtype=torch.int32):
    return tuple(torch.as_tensor(np.asarray(x), dtype=dtype)
                 for x in (mask.q_ranges(), mask.k_ranges(), mask.attn_type_map()))


def _run(front, q, k, v, ranges, **kw):
    """One forward + backward through `front`: "call" (the public function's C++ fast path,
    mask lookup in C++), "forward" (torch_ops' path: lookup in Python, the rest in C++) or
    "python" (no magiattn._torch)."""
    saved = torch_ops._cpp, functional._torch_fast
    if front != "call":
        functional._torch_fast = None
    if front == "python":
        torch_ops._cpp = None
    try:
        for x in (q, k, v, kw.get("sink")):
            if x is not None:
                x.grad = None
        out, meta = magiattn.flex_flash_attn_func(q, k, v, *ranges, **kw)
        (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out).cos()).sum().backward()
        grads = [x.grad.clone() for x in (q, k, v, kw.get("sink")) if x is not None]
        return out.detach(), meta, grads, out.grad_fn
    finally:
        torch_ops._cpp, functional._torch_fast = saved


@pytest.mark.parametrize("options", [
    {},
    {"softcap": 3.0, "return_max_logits": True},
    {"sink": "sh"},
    {"softmax_scale": 0.3, "deterministic": True},
])
def test_same_bits_as_the_python_front(options):
    q, k, v = _inputs()
    ranges = _ranges(masks.varlen_causal([0, 40, 96]))
    kw = dict(options)
    if kw.get("sink") == "sh":
        kw["sink"] = torch.randn(2, q.shape[1], dtype=torch.float64).requires_grad_()
    slow = _run("python", q, k, v, ranges, **kw)
    for front in ("call", "forward"):
        fast = _run(front, q, k, v, ranges, **kw)
        assert torch.equal(fast[0], slow[0])
        assert torch.equal(fast[1].lse, slow[1].lse)
        if kw.get("return_max_logits"):
            assert torch.equal(fast[1].max_logits, slow[1].max_logits)
        else:
            assert fast[1].max_logits is None and slow[1].max_logits is None
        assert len(fast[2]) == len(slow[2])
        for a, b in zip(fast[2], slow[2]):
            assert torch.equal(a, b)
        assert type(fast[3]).__name__ == "CppFunction"


def test_autograd_only_when_asked():
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.causal(96, 96))
    out, meta = magiattn.flex_flash_attn_func(q, k, v, *ranges)
    assert out.grad_fn is None and not meta.lse.requires_grad
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        out, _ = magiattn.flex_flash_attn_func(qg, k, v, *ranges)
    assert out.grad_fn is None
    out, meta = magiattn.flex_flash_attn_func(qg, k, v, *ranges)
    assert out.requires_grad and not meta.lse.requires_grad


def test_gradcheck_through_the_cpp_node():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(24, h, 8, generator=g, dtype=torch.float64).requires_grad_()
               for h in (2, 1, 1))
    sink = torch.randn(1, 2, generator=g, dtype=torch.float64).requires_grad_()
    ranges = _ranges(masks.varlen_causal([0, 10, 24]))
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: magiattn.flex_flash_attn_func(q, k, v, *ranges, sink=s)[0],
        (q, k, v, sink))


def test_backward_errors_keep_their_python_type():
    q, k, v = _inputs()
    ranges = _ranges(masks.causal(96, 96))
    out, _ = magiattn.flex_flash_attn_func(q, k, v, *ranges)

    def refuse(*args):
        raise ValueError("dout: refused by the test")

    torch_ops._cpp.set_backward(refuse)
    try:
        with pytest.raises(ValueError, match="refused by the test"):
            out.sum().backward()
    finally:
        torch_ops._cpp.set_backward(torch_ops._backward_impl)


def test_bad_arguments_name_the_culprit():
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.causal(96, 96))
    with pytest.raises(ValueError, match="sink: expected a torch tensor"):
        magiattn.flex_flash_attn_func(q, k, v, *ranges, sink=np.zeros((1, 4)))
    with pytest.raises(ValueError, match="k: dtype"):
        magiattn.flex_flash_attn_func(q, k.float(), v, *ranges)
    with pytest.raises(ValueError, match="q: dtype int32 is not supported"):
        magiattn.flex_flash_attn_func(q.int(), k, v, *ranges)
    with pytest.raises(ValueError, match="sm_margin: 4294967296 must be an int in"):
        magiattn.flex_flash_attn_func(q, k, v, *ranges, sm_margin=2**32)
    pm = functional.prepared_mask(96, 96, *ranges)
    with pytest.raises(ValueError, match="prepared: expected a magiattn._C.PreparedMask"):
        torch_ops._cpp.forward(q, k, v, *ranges, pm.mask, None, "sh", None, 0.0, False, False,
                               0, 0, False, False)


def _reference(q, k, v, ranges):
    """The same call with the ranges copied: never served from an identity record."""
    return magiattn.flex_flash_attn_func(q, k, v, *(r.clone() for r in ranges))[0]


def test_cpu_ranges_written_behind_torch_are_seen():
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.varlen_full([0, 48, 96]))
    first = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    version = ranges[0]._version
    view = ranges[0].numpy()  # writes through numpy bypass torch's version counter
    view[:] = [[0, 32], [32, 96]]
    ranges[1].numpy()[:] = [[0, 32], [32, 96]]
    assert ranges[0]._version == version
    second = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    assert not torch.equal(first, second)
    assert torch.equal(second, _reference(q, k, v, ranges))
    third = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]  # recognised again
    assert torch.equal(third, second)


def test_cpu_ranges_written_in_place_are_seen():
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.causal(96, 96))
    first = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    ranges[2].fill_(0)  # causal -> full, through torch (the version counter moves)
    second = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    assert not torch.equal(first, second)
    assert torch.equal(second, _reference(q, k, v, ranges))


@pytest.mark.parametrize("layout", ["int64", "strided", "int16", "no-types"])
def test_cpu_range_layouts(layout):
    q, k, v = (x.detach() for x in _inputs())
    mask = masks.varlen_causal([0, 30, 96])
    ranges = _ranges(mask, torch.int64 if layout == "int64" else torch.int32)
    if layout == "strided":  # every other row of a [2N, 2] buffer; types every other element
        ranges = tuple(torch.stack([r, r], 1).reshape(-1, *r.shape[1:])[::2] for r in ranges)
        assert not ranges[0].is_contiguous()
    if layout == "int16":
        ranges = tuple(r.to(torch.int16) for r in ranges)
    if layout == "no-types":
        ranges = (*ranges[:2], None)
        mask = masks.varlen_full([0, 30, 96])
    want = magiattn.flex_flash_attn_func(q.numpy(), k.numpy(), v.numpy(), mask=mask)[0]
    for _ in range(3):  # first call, then hits
        out = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
        np.testing.assert_array_equal(out.numpy(), want)


def test_inference_mode_and_inference_range_tensors():
    # Inference tensors have no version counter: never recognised by identity, read every call.
    q, k, v = (x.detach() for x in _inputs())
    with torch.inference_mode():
        ranges = _ranges(masks.causal(96, 96))
        first = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
        ranges[2].fill_(0)  # causal -> full; no version bump on an inference tensor
        second = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    assert not first.requires_grad
    assert not torch.equal(first, second)
    assert torch.equal(second, _reference(q, k, v, ranges))


def test_threads_share_the_front():
    import threading

    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.varlen_causal([0, 40, 96]))
    want = magiattn.flex_flash_attn_func(q, k, v, *ranges)[0]
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(magiattn.flex_flash_attn_func(q, k, v, *ranges)[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 80 and all(torch.equal(r, want) for r in results)


class _CountingLookup:
    """functional.prepared_mask as `call` sees it, counting the calls (the misses of its
    identity table)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kw):
        self.calls += 1
        return functional.prepared_mask(*args, **kw)


@pytest.fixture
def lookup():
    counting = _CountingLookup()
    torch_ops._cpp.set_lookup(counting, lambda device: 0, lambda: False)
    magiattn.clear_mask_cache()
    try:
        yield counting
    finally:
        torch_ops._cpp.set_lookup(functional.prepared_mask, *torch_ops._STREAM_HOOKS)
        magiattn.clear_mask_cache()


def test_call_asks_python_only_on_a_miss(lookup):
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.varlen_causal([0, 40, 96]))
    want = _reference(q, k, v, ranges)
    lookup.calls = 0
    for _ in range(5):
        assert torch.equal(magiattn.flex_flash_attn_func(q, k, v, *ranges)[0], want)
    assert lookup.calls == 1  # the first call; the rest are identity hits in C++
    ranges[1].add_(0)  # an in-place write through torch: the version counter moves
    magiattn.flex_flash_attn_func(q, k, v, *ranges)
    assert lookup.calls == 2
    magiattn.flex_flash_attn_func(q, k, v, *(r.clone() for r in ranges))  # other tensors
    assert lookup.calls == 3
    magiattn.clear_mask_cache()  # empties the C++ table too
    magiattn.flex_flash_attn_func(q, k, v, *ranges)
    assert lookup.calls == 4
    # the same tensors with another Nq / Nk are another mask
    magiattn.flex_flash_attn_func(torch.cat([q, q[:8]]), k, v, *ranges)
    assert lookup.calls == 5


def test_call_with_more_masks_than_its_table(lookup):
    q, k, v = (x.detach() for x in _inputs())
    cuts = [[0, 8 * i + 8, 96] for i in range(11)]  # 11 masks > the table's 8 entries
    ranges = [_ranges(masks.varlen_causal(c)) for c in cuts]
    want = [_reference(q, k, v, r) for r in ranges]
    lookup.calls = 0
    for _ in range(3):
        for r, w in zip(ranges, want):
            assert torch.equal(magiattn.flex_flash_attn_func(q, k, v, *r)[0], w)
    assert lookup.calls == 3 * len(ranges)  # round robin over more than 8: every call misses
    lookup.calls = 0
    for _ in range(3):
        for r, w in zip(ranges[:8], want[:8]):
            assert torch.equal(magiattn.flex_flash_attn_func(q, k, v, *r)[0], w)
    assert lookup.calls == 8  # eight fit


def test_call_leaves_unusual_arguments_to_python(lookup):
    q, k, v = (x.detach() for x in _inputs())
    ranges = _ranges(masks.causal(96, 96))
    want = magiattn.flex_flash_attn_func(q, k, v, *ranges, softcap=2.0)[0]
    lookup.calls = 0
    # numpy scalars, a Parameter, ranges as lists: the Python path (same result, no C++ lookup)
    got = magiattn.flex_flash_attn_func(q, k, v, *ranges, softcap=np.float32(2.0))[0]
    assert torch.equal(got, want)
    got = magiattn.flex_flash_attn_func(torch.nn.Parameter(q), k, v, *ranges, softcap=2.0)[0]
    assert torch.equal(got.detach(), want)
    got = magiattn.flex_flash_attn_func(q, k, v, *(r.tolist() for r in ranges), softcap=2.0)[0]
    assert torch.equal(got, want)
    assert lookup.calls == 0
    with pytest.raises(ValueError, match="softcap"):
        magiattn.flex_flash_attn_func(q, k, v, *ranges, softcap=-1.0)

