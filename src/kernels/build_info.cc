#include "magi/build_info.h"

#include "backend.h"

#ifdef MAGI_HAS_SM90
#include <cuda_runtime.h>

#include "fwd_instances.h"
#endif

namespace magi {
namespace {

// "-march=x86-64-v3 (avx avx2 fma ...)": what CMakeLists.txt compiled for (MAGI_CPU_ARCH) and
// the features that turns on.
std::string compiled_isa() {
  const std::string arch = MAGI_CPU_ARCH_NAME, flags = MAGI_CPU_FLAGS_TEXT;
  return "-march=" + (arch.empty() ? std::string("default") : arch) +
         (flags.empty() ? std::string() : " (" + flags + ")");
}

std::vector<std::string> cpu_features() {
  std::vector<std::string> f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) f.emplace_back("avx2");
  if (__builtin_cpu_supports("fma")) f.emplace_back("fma");
  if (__builtin_cpu_supports("avx512f")) f.emplace_back("avx512f");
  if (__builtin_cpu_supports("avx512bf16")) f.emplace_back("avx512_bf16");
#endif
  return f;
}

}  // namespace

BuildInfo build_info() {
  BuildInfo b;
  b.version = MAGI_VERSION;
  b.cpu_isa = compiled_isa();
  b.cpu_kernels = kernels::cpu::isa_in_use();
  b.cpu_features = cpu_features();
#ifdef MAGI_HAS_SM90
  b.cuda = true;
  b.cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  b.sm90_forward = MAGI_SM90_FWD_BUILT;
  if (!b.sm90_forward.empty() && b.sm90_forward.front() == ' ') b.sm90_forward.erase(0, 1);
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    b.gpu_error = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    cudaGetLastError();  // not sticky: clear it
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    b.gpus.push_back(GpuInfo{i, p.name, p.major, p.minor, p.multiProcessorCount});
  }
#endif
  return b;
}

}  // namespace magi
