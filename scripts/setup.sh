#!/usr/bin/env bash
# Fresh Debian machine to a first result: install dependencies, build the release preset,
# install the Python package (`pip install .`: the C++ core plus the nanobind module
# magiattn._C), then run `magiattn run` on its default problem (16k-token document-packed
# causal mask, forward + backward checked against the fp64 oracle). Extra arguments go to
# `magiattn run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release

source scripts/python_env.sh
source scripts/cutlass.sh  # GPU kernels: headers and variant list for the module's build
cuda_defines=(-Ccmake.define.MAGI_CUDA_KERNELS="$MAGI_CUDA_KERNELS")
[ -n "${MAGI_CUTLASS_DIR:-}" ] && cuda_defines+=(-Ccmake.define.MAGI_CUTLASS_DIR="$MAGI_CUTLASS_DIR")
$python -m pip install -q "${cuda_defines[@]}" . numpy
echo "[setup] python package: $($python -c 'import magiattn; print(magiattn.__file__)')"

build/release/bin/magiattn run "$@"
