// The CPU backend's entry points (backend.h): the compilation of forward.cc / backward.cc that
// fits this CPU (isa.h). A portable build has an AVX-512 one beside the base one; it runs where
// the CPU has AVX-512 F, BW, DQ and VL, unless MAGI_CPU_ISA=base asks for the base one (to
// compare, or to rule the wider one out). Chosen once per process.
#include <cstdlib>
#include <cstring>

#include "../backend.h"

namespace magi::kernels::cpu {

namespace base {
void forward(const Mask& mask, const FwdArgs& args, const Resolved& r);
void backward(const Mask& mask, const BwdArgs& args, const Resolved& r);
}  // namespace base
#ifdef MAGI_CPU_AVX512_VARIANT
namespace avx512 {
void forward(const Mask& mask, const FwdArgs& args, const Resolved& r);
void backward(const Mask& mask, const BwdArgs& args, const Resolved& r);
}  // namespace avx512
#endif

#ifdef MAGI_CPU_AVX512_VARIANT
namespace {

bool use_avx512() {
  static const bool yes = [] {
    const char* want = std::getenv("MAGI_CPU_ISA");
    if (want != nullptr && std::strcmp(want, "base") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return yes;
}

}  // namespace
#endif

const char* isa_in_use() {
#ifdef MAGI_CPU_AVX512_VARIANT
  return use_avx512() ? "avx512 (x86-64-v4, chosen at run time)"
                      : "base (AVX-512 variant built, not used here)";
#else
  return "base (the only one built)";
#endif
}

void forward(const Mask& mask, const FwdArgs& args, const Resolved& r) {
#ifdef MAGI_CPU_AVX512_VARIANT
  if (use_avx512()) return avx512::forward(mask, args, r);
#endif
  base::forward(mask, args, r);
}

void backward(const Mask& mask, const BwdArgs& args, const Resolved& r) {
#ifdef MAGI_CPU_AVX512_VARIANT
  if (use_avx512()) return avx512::backward(mask, args, r);
#endif
  base::backward(mask, args, r);
}

}  // namespace magi::kernels::cpu
