"""The distributed API over NCCL and torch.distributed. Without a GPU: the cp-group types that
are refused (naming the type), the argument checks of Communicator.nccl and the unique id's
length (where magiattn._dist was built with NCCL), a torch process group's bootstrap over gloo
up to the point where a GPU is needed (its error on every rank). With a GPU and NCCL:
torchrun_worker.py and examples/dist_attn_torchrun.py under torchrun at one process (all a
one-GPU machine can run), over an nccl and a gloo process group."""

import importlib.util
import os
import subprocess
import sys

import pytest

import magiattn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
WORKER = os.path.join(HERE, "torchrun_worker.py")
EXAMPLE = os.path.join(ROOT, "examples", "dist_attn_torchrun.py")
TRAIN_STEP = os.path.join(ROOT, "examples", "dist_train_step_torchrun.py")
HAS_DIST = importlib.util.find_spec("magiattn._dist") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _dist():
    if not HAS_DIST:
        pytest.skip("magiattn._dist not built (neither MPI nor NCCL found at build time)")
    from magiattn import _dist
    return _dist


def _dist_with_nccl():
    d = _dist()
    if not d.has_nccl():
        pytest.skip("magiattn._dist built without NCCL (a CUDA build makes it)")
    return d


# ---- without a GPU ----------------------------------------------------------------------------
@pytest.mark.parametrize("group", [3, "world", object(), [0, 1]])
def test_cp_group_of_an_unknown_type_is_a_type_error_naming_it(group):
    with pytest.raises(TypeError, match=f"got {type(group).__name__}$"):
        magiattn.magi_attn_flex_key([[0, 8]], [[0, 8]], "full", 8, 8, 1, 1, 8,
                                    cp_group_or_mesh=group)


def test_a_torch_object_that_is_no_group_is_a_type_error_naming_it():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="ProcessGroup or a 1-D torch DeviceMesh, got Tensor"):
        magiattn.dist._group(torch.zeros(2))


def test_has_mpi_and_has_nccl_say_what_was_built():
    d = _dist()
    assert isinstance(d.has_mpi(), bool) and isinstance(d.has_nccl(), bool)
    assert d.has_mpi() or d.has_nccl()  # _dist is built only with one of them
    ok, why = d.nccl_available()
    assert isinstance(ok, bool) and bool(why) != ok, (ok, why)
    if not d.has_nccl():
        assert not ok and "built without NCCL" in why
        for call in (d.nccl_version, d.nccl_unique_id,
                     lambda: d.Communicator.nccl(bytes(128), 0, 1, 0)):
            with pytest.raises(ValueError, match="built without NCCL"):
                call()


def test_nccl_unique_id_is_128_bytes_and_new_each_time():
    d = _dist_with_nccl()
    ok, why = d.nccl_available()
    if not ok:
        pytest.skip(f"libnccl cannot be loaded here: {why}")
    a, b = d.nccl_unique_id(), d.nccl_unique_id()
    assert isinstance(a, bytes) and len(a) == len(b) == 128 and a != b


@pytest.mark.parametrize("args, match", [
    ((bytes(127), 0, 1, 0), "unique_id: 127 bytes, but an NCCL unique id has 128"),
    ((b"", 0, 1, 0), "unique_id: 0 bytes"),
    ((bytes(128), 2, 2, 0), r"rank: 2 is not in \[0, 2\)"),
    ((bytes(128), -1, 2, 0), r"rank: -1 is not in \[0, 2\)"),
    ((bytes(128), 0, 0, 0), "size: 0 ranks"),
    ((bytes(128), 0, 1, -1), "device: -1 is not a CUDA device index"),
    ((bytes(128), 0, 1, 0, 0.0), "timeout: 0 s must be finite and > 0"),
    ((bytes(128), 0, 1, 0, float("nan")), "timeout: nan s"),
])
def test_nccl_communicator_arguments_are_checked_first(args, match):
    d = _dist_with_nccl()
    with pytest.raises(ValueError, match=match):
        d.Communicator.nccl(*args)


def test_nccl_from_mpi_needs_an_mpi4py_comm():
    with pytest.raises(TypeError, match="expected an mpi4py MPI.Comm, got int"):
        magiattn.Communicator.nccl_from_mpi(3)


GLOO_SCRIPT = r"""
import sys
import torch, torch.distributed as tdist
import magiattn
from torch.distributed.device_mesh import init_device_mesh

try:
    magiattn.Communicator.from_torch_group()
except ValueError as e:
    print("uninitialised:", e)
tdist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
try:
    magiattn.Communicator.from_torch_group(object())
except TypeError as e:
    print("type:", e)
for name, group in (("group", tdist.group.WORLD), ("mesh", init_device_mesh("cpu", (1,)))):
    try:
        magiattn.magi_attn_flex_key([[0, 8]], [[0, 8]], "full", 8, 8, 1, 1, 8,
                                    cp_group_or_mesh=group)
    except ValueError as e:
        print(name + ":", e)
try:
    magiattn.magi_attn_flex_key([[0, 8]], [[0, 8]], "full", 8, 8, 1, 1, 8,
                                cp_group_or_mesh=init_device_mesh("cpu", (1, 1)))
except ValueError as e:
    print("mesh2:", e)
tdist.destroy_process_group()
"""


def test_torch_group_bootstrap_over_gloo_without_a_gpu(tmp_path):
    """A one-rank gloo group on the CPU: the id's broadcast runs, then the missing piece (NCCL
    in the build, libnccl, or a CUDA device) is the error, for a group and a 1-D mesh alike."""
    torch = pytest.importorskip("torch")
    _dist()
    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the GPU tests below run this path to the end")
    run = subprocess.run([sys.executable, "-c", GLOO_SCRIPT, str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines() if ": " in line)
    assert "init_process_group first" in lines["uninitialised"], run.stdout
    assert "ProcessGroup or None (the default group), got object" in lines["type"], run.stdout
    why = ("built without NCCL", "NCCL cannot be loaded", "needs a CUDA device, but torch sees "
           "none")
    for name in ("group", "mesh"):
        assert any(w in lines[name] for w in why), run.stdout
    assert "a 2-D DeviceMesh; pass the cp dimension's 1-D mesh" in lines["mesh2"], run.stdout
    assert "leaked" not in run.stderr, run.stderr


# ---- with a GPU, under torchrun ---------------------------------------------------------------
@pytest.fixture(scope="module")
def nccl_gpu():
    """Skips unless torch sees a GPU, _dist has NCCL, libnccl loads and the bf16 / D 128 sm90
    kernels are built (what the worker and the example run)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    d = _dist_with_nccl()
    ok, why = d.nccl_available()
    if not ok:
        pytest.skip(f"libnccl cannot be loaded: {why}")
    if "bf16/128" not in str(magiattn.info().get("sm90_forward", "")):
        pytest.skip("magiattn built without the bf16 / D 128 sm90 kernels")


def torchrun(*args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "1", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    log = f"$ {' '.join(cmd)}\n{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    assert run.returncode == 0, log
    assert "leaked" not in run.stderr, log  # nanobind's exit-time leak report
    return run.stdout, log


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_torchrun_worker_matches_one_gpu(nccl_gpu, backend):
    out, log = torchrun(WORKER, backend)
    assert f"rank 0: PASS {backend}" in out, log


def test_torchrun_training_step_example(nccl_gpu):
    out, log = torchrun(TRAIN_STEP)
    assert "1 GPUs, 16384 tokens" in out and out.strip().endswith("OK"), log


def test_torchrun_example(nccl_gpu):
    out, log = torchrun(EXAMPLE)
    assert "1 GPUs, 16384 tokens" in out and out.strip().endswith("OK"), log
