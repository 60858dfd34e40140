// What this build of magiattn has and what the machine it runs on offers: for bug reports and
// for `python -m magiattn` (magiattn.info()).
#pragma once

#include <string>
#include <vector>

namespace magi {

struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sms = 0;
};

struct BuildInfo {
  std::string version;           // the project version
  std::string cpu_isa;           // "-march=x86-64-v3 (avx avx2 fma ...)": what the C++ code
                                 // (the CPU backend) was compiled for
  std::string cpu_kernels;       // the CPU backend's compilation that runs here (a portable
                                 // build also has an AVX-512 one, chosen at run time)
  std::vector<std::string> cpu_features;  // of this CPU: avx2, fma, avx512f, ...
  bool cuda = false;             // the GPU backend is built
  std::string cuda_version;      // of the toolkit it was built with ("" without CUDA)
  std::string sm90_forward;      // built variants, "bf16/128 fp16/64 ..." ("" without CUDA)
  std::vector<GpuInfo> gpus;     // CUDA devices visible now (empty without CUDA or a GPU)
  std::string gpu_error;         // why none are listed, when the runtime says so
};

BuildInfo build_info();

}  // namespace magi
