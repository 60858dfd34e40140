"""magiattn.info() and `python -m magiattn`: what the build has, as a bug report needs it."""
import json
import os
import subprocess
import sys

import magiattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _project_version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return next(line.split('"')[1] for line in f if line.startswith("version = "))


def test_info_names_the_backends_and_kernels():
    d = magiattn.info()
    assert d["version"] == _project_version()  # the C++ build's, from CMakeLists.txt
    assert d["cpu_isa"] and isinstance(d["cpu_features"], list)
    assert isinstance(d["cuda"], bool)
    if d["cuda"]:
        assert d["cuda_version"] and d["sm90_forward"], d  # "bf16/128 ..." at least one
        assert all(v.split("/")[0] in ("bf16", "fp16") for v in d["sm90_forward"].split())
    else:
        assert d["sm90_forward"] == "" and d["gpus"] == []
    for g in d["gpus"]:
        assert set(g) == {"index", "name", "compute_capability", "sms"}
    assert isinstance(d["mpi"], bool) and isinstance(d["nccl"], bool)
    assert bool(d["nccl_version"]) == d["nccl"], d  # a version exactly when NCCL is usable
    assert bool(d["nccl_error"]) != d["nccl"] and bool(d["mpi_error"]) != d["mpi"], d


def _run(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "magiattn", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=True).stdout


def test_python_m_magiattn_prints_the_report():
    text = _run()
    for head in (f"magiattn {_project_version()}", "CPU backend: compiled with -march=",
                 "GPU backend:", "GPUs visible:", "distributed: MPI ", "torch:"):
        assert head in text, text
    d = magiattn.info()
    line = next(x for x in text.splitlines() if x.startswith("distributed: "))
    assert line.startswith(f"distributed: MPI {'yes' if d['mpi'] else 'no ('}"), line
    want = f", NCCL yes ({d['nccl_version']})" if d["nccl"] else ", NCCL no ("
    assert want in line, line
    assert json.loads(_run("--json"))["version"] == _project_version()
    assert "usage: python -m magiattn" in _run("--help")
