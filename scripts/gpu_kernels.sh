# Sourced by build.sh and gpu_test.sh: picks the sm90 kernel variants (MAGI_CUDA_KERNELS, unless
# set): every one where a GPU is present; where none is, $MAGI_NO_GPU_KERNELS (test.sh: ci, one
# variant, so that CI still catches build breaks; setup.sh: none, nothing that cannot run here).
# The CUTLASS/CuTe headers come with the CMake configure (cmake/wheel_headers.cmake: the pinned
# nvidia-cutlass wheel, downloaded once into build/_deps, or $MAGI_CUTLASS_WHEEL without
# network; $MAGI_CUTLASS_DIR names an include directory instead).
if [ -z "${MAGI_CUDA_KERNELS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    export MAGI_CUDA_KERNELS=all
  else
    export MAGI_CUDA_KERNELS=${MAGI_NO_GPU_KERNELS:-none}
  fi
fi
