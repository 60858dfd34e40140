#!/usr/bin/env bash
# The test command of the README and of CI: install dependencies, build build/release once with
# the tests (the same build as setup.sh's, plus tests and benches; without a GPU it compiles
# one sm90 kernel variant so that CI catches CUDA build breaks) and run every CTest test (unit,
# CLI, MPI), then the pytest suite on the package that build installed. MAGI_TEST_ASAN=1 also
# builds and runs the C++ tests under AddressSanitizer + UBSan (the asan preset);
# MAGI_TEST_LEVEL=full and MAGI_TEST_SEED pass through to both suites. torch: build.sh
# sources torch_env.sh (its tests are skipped, saying why, when it cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
# The published histogram sits beside the project in this workplace; when present, the
# built-in table is checked against it.
csv=../shared/data/doc_length_distribution.csv
[ -f "$csv" ] && export MAGI_DOC_LENGTHS_CSV="${MAGI_DOC_LENGTHS_CSV:-$(readlink -f "$csv")}"
export MAGI_NO_GPU_KERNELS=ci
# A kernel whose wgmma ptxas serializes fails the test build (cmake/ptxas_guard.sh).
export MAGI_WGMMA_GUARD=error
MAGI_BUILD_TESTS=ON scripts/build.sh release
ctest --preset release -j "$(nproc)"
# The CMake package for C++ users: installed from build/release, then examples/cpp built
# against it with find_package(magiattn) and run.
rm -rf build/cxx-prefix build/cxx-example
cmake --install build/release --component magiattn_cxx --prefix build/cxx-prefix
cmake -S examples/cpp -B build/cxx-example -DCMAKE_PREFIX_PATH="$PWD/build/cxx-prefix"
cmake --build build/cxx-example -j "$(nproc)"
build/cxx-example/attention_example
if [ -x build/cxx-example/mpi_example ]; then
  mpirun -np 2 --allow-run-as-root --oversubscribe build/cxx-example/mpi_example
fi
if [ "${MAGI_TEST_ASAN:-0}" = 1 ]; then
  scripts/build.sh asan
  ctest --preset asan -j "$(nproc)"
fi

source scripts/python_env.sh
$python -m pip install -q pytest matplotlib
# Optional: one distributed test runs on cp groups that mpi4py splits (binary wheels load the
# Open MPI that build.sh installs); without mpi4py that test is skipped.
$python -m pip install -q mpi4py || echo "[test] mpi4py could not be installed: its test is skipped"
$python -m pytest -q -p no:cacheprovider tests/python

# The pip-only path: a fresh virtualenv, the usual `pip install .` (build isolation: the build
# backend and nanobind from PyPI; nlohmann-json from its pinned wheel even where the system has
# it; portable, x86-64-v3 with the AVX-512 kernels chosen at run time), then `python -m
# magiattn`, the numpy example and the Python tests without torch in it (the CPU kernels'
# run-time choice among them, tests/python/test_cpu_isa.py).
venv=build/pip-only-venv
rm -rf "$venv"
$python -m venv "$venv"
"$venv/bin/python" -m pip install -q -Cbuild-dir=build/pip-only \
  -Ccmake.define.CMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
  -Ccmake.define.MAGI_CUDA_KERNELS=none .
# The JSON headers were compiled from the wheel's directory. A system copy on the default
# include path (build.sh installs one) once hid that the wheel's directory was never added.
grep -q -- '-isystem [^ ]*nlohmann_json/include .*mask/json\.cc' \
  build/pip-only/compile_commands.json || {
  echo "[test] the pip-only build did not compile against the nlohmann-json wheel's headers" >&2
  exit 1
}
(cd "$venv" && bin/python -m magiattn)
"$venv/bin/python" examples/numpy_attention.py
"$venv/bin/python" -m pip install -q pytest
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python
