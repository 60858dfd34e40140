#!/usr/bin/env bash
# Fresh Debian machine to a first result: install dependencies, build build/release once (the
# C++ core, the CLI and the Python package: `pip install .` of the C++ core plus the nanobind
# modules magiattn._C and magiattn._dist), make torch importable for the examples, then run
# `magiattn run` on its default problem (16k-token document-packed causal mask, forward +
# backward checked against the fp64 oracle). Extra arguments go to `magiattn run`. Without a
# GPU no CUDA kernel is compiled (MAGI_CUDA_KERNELS=none); with one, every variant.
set -euo pipefail
cd "$(dirname "$0")/.."
export MAGI_NO_GPU_KERNELS=none
scripts/build.sh release
source scripts/python_env.sh
[ "$python" = python3 ] || echo "[setup] Python environment: . build/venv/bin/activate"
build/release/bin/magiattn run "$@"
