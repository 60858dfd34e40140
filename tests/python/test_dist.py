"""The distributed API under mpirun: dist_worker.py at world sizes 1-4 (torch autograd and the
numpy path vs the single-process kernels, fp64, 1e-12), on cp groups split by mpi4py (skipped
without mpi4py), the argument checks and a skipped call's timeout, a rank that raises, the
README example; and the error that names the fix when magiattn was built without MPI. The
mpirun cases are skipped without mpirun or magiattn._dist; each rank runs one OpenMP thread."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
WORKER = os.path.join(HERE, "dist_worker.py")
EXAMPLE = os.path.join(ROOT, "examples", "dist_attn.py")
MPIRUN = shutil.which("mpirun")
HAS_DIST = importlib.util.find_spec("magiattn._dist") is not None

needs_mpi = pytest.mark.skipif(MPIRUN is None or not HAS_DIST,
                               reason="needs mpirun and magiattn._dist (magiattn built with MPI)")


def mpirun(np_, *args):
    cmd = [MPIRUN, "--oversubscribe", *(["--allow-run-as-root"] if os.getuid() == 0 else []),
           "-np", str(np_), sys.executable, *args]
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    log = f"$ {' '.join(cmd)}\n{run.stdout[-6000:]}\n{run.stderr[-6000:]}"
    assert run.returncode == 0, log
    assert "leaked" not in run.stderr, log  # nanobind's exit-time leak report
    return run.stdout, log


def run_worker(np_, mode):
    out, log = mpirun(np_, WORKER, mode)
    for r in range(np_):
        assert f"rank {r}: PASS {mode}" in out, log


@needs_mpi
@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_matches_single_process(np_):
    pytest.importorskip("torch")
    run_worker(np_, "main")


@needs_mpi
@pytest.mark.parametrize("np_", [1, 2, 3])
def test_cuda_tensors_with_ranks_sharing_one_gpu(np_):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import magiattn
    if "bf16/128" not in str(magiattn.info().get("sm90_forward", "")):
        pytest.skip("magiattn built without the bf16 / D 128 sm90 kernels")
    run_worker(np_, "cuda")


@needs_mpi
def test_mpi4py_groups():
    pytest.importorskip("mpi4py")
    run_worker(3, "mpi4py")  # groups of 2 and 1 ranks


@needs_mpi
@pytest.mark.parametrize("np_", [1, 3])
def test_argument_checks_and_timeout(np_):
    run_worker(np_, "validate")


@needs_mpi
def test_a_rank_that_raises_ends_the_job_at_once():
    """No MPI_Finalize after an uncaught exception: mpirun aborts the job instead of the
    other ranks waiting out their timeout (300 s) in a collective rank 0 never joins."""
    cmd = [MPIRUN, "--oversubscribe", *(["--allow-run-as-root"] if os.getuid() == 0 else []),
           "-np", "2", sys.executable, WORKER, "crash"]
    env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode != 0 and "rank 0 fails on purpose" in run.stderr, run.stderr
    assert time.monotonic() - start < 30, run.stderr


@needs_mpi
def test_mpi_finalized_by_someone_else_is_a_clear_error():
    pytest.importorskip("mpi4py")
    code = ("from mpi4py import MPI; MPI.Finalize()\n"
            "import magiattn\n"
            "try:\n"
            "    magiattn.world_communicator()\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert "MPI is already finalized" in run.stdout, run.stdout + run.stderr


@needs_mpi
def test_readme_example_runs():
    pytest.importorskip("torch")
    out, log = mpirun(2, EXAMPLE)
    # (mpirun may join two ranks' lines: match each record, not each line)
    norms = re.findall(r"rank (\d) of 2: 512 tokens from position \d+, \|dq\| ([0-9.]+)", out)
    assert sorted(r for r, _ in norms) == ["0", "1"], log
    assert norms[0][1] == norms[1][1], log  # every rank holds the same gathered gradient
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(EXAMPLE) as f:
        assert f.read().strip() in readme


def test_without_mpi_module_the_error_says_how_to_get_it():
    code = ("import sys; sys.modules['magiattn._dist'] = None\n"
            "import magiattn\n"
            "try:\n"
            "    magiattn.magi_attn_flex_key([[0, 8]], [[0, 8]], 'full', 8, 8, 1, 1, 8)\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "apt install libopenmpi-dev" in run.stdout and "reinstall magiattn" in run.stdout
