# Sourced by build.sh and gpu_test.sh. Picks the sm90 kernel variants (MAGI_CUDA_KERNELS, unless
# set): every one where a GPU is present; where none is, $MAGI_NO_GPU_KERNELS (test.sh: ci, one
# variant, so that CI still catches build breaks; setup.sh: none, nothing that cannot run here).
# When kernels are wanted and nvcc exists, puts the CUTLASS/CuTe headers of the pinned
# nvidia-cutlass wheel in build/_deps (downloaded once with pip, or taken from
# $MAGI_CUTLASS_WHEEL on a machine without network) and exports MAGI_CUTLASS_DIR. Headers only:
# nothing is pip-installed, so an externally managed Python is no obstacle.
MAGI_CUTLASS_VERSION=4.2.0.0
if [ -z "${MAGI_CUDA_KERNELS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export MAGI_CUDA_KERNELS=all
  else
    export MAGI_CUDA_KERNELS=${MAGI_NO_GPU_KERNELS:-none}
  fi
fi
if [ "$MAGI_CUDA_KERNELS" != none ] && command -v nvcc >/dev/null 2>&1 &&
   [ -z "${MAGI_CUTLASS_DIR:-}" ]; then
  dest=build/_deps/cutlass-$MAGI_CUTLASS_VERSION
  if [ ! -f "$dest/include/cute/tensor.hpp" ]; then
    wheel=${MAGI_CUTLASS_WHEEL:-}
    if [ -z "$wheel" ]; then
      python3 -m pip download -q --no-deps "nvidia-cutlass==$MAGI_CUTLASS_VERSION" -d build/_deps ||
        { echo "[setup] could not download nvidia-cutlass (set MAGI_CUTLASS_WHEEL)" >&2; return 1; }
      wheel=$(ls build/_deps/nvidia_cutlass-$MAGI_CUTLASS_VERSION-*.whl | head -1)
    fi
    python3 - "$wheel" "$dest/include" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = dest / name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(name))
PY
    [ -f "$dest/include/cute/tensor.hpp" ] || { echo "[setup] no CUTLASS headers in $wheel" >&2; return 1; }
    echo "[setup] CUTLASS $MAGI_CUTLASS_VERSION headers in $dest/include"
  fi
  export MAGI_CUTLASS_DIR=$PWD/$dest/include
fi
