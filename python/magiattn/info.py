"""What this magiattn has and sees: ``magiattn.info()``, printed by ``python -m magiattn``.

The lines a bug report needs: the version, the CPU backend's instruction set and this CPU's,
whether the GPU backend is built and which sm90 kernel variants, the GPUs visible, the
distributed module's backends (MPI; NCCL with the libnccl it loads), and torch with the C++
front built for it.
"""
from __future__ import annotations

import importlib.util
import platform
import sys
from typing import Any

from . import _C


def info() -> dict[str, Any]:
    """A dict of what is built and what the machine offers (see the module docstring)."""
    d = dict(_C.build_info())
    d["python"] = platform.python_version()
    d["platform"] = platform.platform()
    d["torch"] = None
    d["torch_cpp_front"] = None
    if importlib.util.find_spec("torch") is not None:
        # torch first: its libnccl.so.2 must be the one loaded; ours, probed below, would
        # otherwise load another copy of that soname, which torch's NCCL symbols then miss.
        import torch
        d["torch"] = torch.__version__
        d["torch_cuda"] = torch.version.cuda
        try:
            from . import _torch
            d["torch_cpp_front"] = _torch.built_with_torch
        except ImportError:
            pass
    d.update(_distributed())
    return d


def _distributed() -> dict[str, Any]:
    """mpi / nccl: whether magiattn._dist can make such a communicator here (NCCL: built, and
    libnccl loads); the *_error keys say why not, nccl_version which libnccl."""
    try:
        from . import _dist
    except ImportError as e:
        return {"mpi": False, "mpi_error": str(e), "nccl": False, "nccl_version": "",
                "nccl_error": str(e)}
    d = {"mpi": _dist.has_mpi(), "nccl_version": ""}
    d["mpi_error"] = "" if d["mpi"] else "magiattn._dist was built without MPI"
    d["nccl"], d["nccl_error"] = _dist.nccl_available()
    if d["nccl"]:
        try:
            d["nccl_version"] = _dist.nccl_version()
        except ValueError as e:  # loadable but no version: report it, do not fail the report
            d["nccl"], d["nccl_error"] = False, str(e)
    return d


def _lines(d: dict[str, Any]) -> list[str]:
    gpus = d["gpus"]
    gpu_text = ("; ".join(f"{g['index']}: {g['name']} (sm {g['compute_capability']}, "
                          f"{g['sms']} SMs)" for g in gpus)
                if gpus else ("none" + (f" ({d['gpu_error']})" if d["gpu_error"] else "")))
    torch_text = "not installed" if d["torch"] is None else (
        f"{d['torch']} (CUDA {d.get('torch_cuda')}); C++ front "
        + ("built for " + d["torch_cpp_front"] if d["torch_cpp_front"] else "not built"))
    front = d["torch_cpp_front"]
    if front and d["torch"] and front != d["torch"]:
        torch_text += " (a different torch: the Python front is used)"
    return [
        f"magiattn {d['version']}, Python {d['python']}, {d['platform']}",
        f"CPU backend: compiled with {d['cpu_isa']}; running its {d['cpu_kernels']} kernels; "
        "this CPU has " + (", ".join(d["cpu_features"]) or "none of avx2, fma, avx512f"),
        "GPU backend: " + (f"built with CUDA {d['cuda_version']}; sm90 kernels (forward "
                           "and backward): " + (d["sm90_forward"] or "none") if d["cuda"] else
                           "not built (no nvcc or CUTLASS headers at build time, or "
                           "MAGI_CUDA_KERNELS=none)"),
        f"GPUs visible: {gpu_text}",
        "distributed: MPI " + ("yes" if d["mpi"] else f"no ({d['mpi_error']})")
        + ", NCCL " + (f"yes ({d['nccl_version']})" if d["nccl"] else
                       f"no ({d['nccl_error']})"),
        f"torch: {torch_text}",
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m magiattn [--json]\n\n" + __doc__.splitlines()[0])
        return 0
    d = info()
    if args and args[0] == "--json":
        import json
        print(json.dumps(d, indent=1))
    else:
        print("\n".join(_lines(d)))
    return 0
