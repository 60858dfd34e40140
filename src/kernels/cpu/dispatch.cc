// The CPU backend's entry points (backend.h): the compilation of forward.cc / backward.cc that
// fits this CPU (isa.h). A portable build has an AVX-512 one beside the base one; it runs where
// the CPU has AVX-512 F, BW, DQ and VL. Where the compiler could, portable and native builds
// also have an `amx` copy of forward.cc (x86-64-v4 plus AMX-BF16 tiles for bf16 inputs and
// output, amx.h), run where CPUID reports AVX-512, AMX-TILE and AMX-BF16 and Linux grants this
// process the tile data state; its backward is the AVX-512 one (the base one in a native
// build). MAGI_CPU_ISA=base or =avx512 caps the choice there (to compare, or to rule the wider
// ones out; in a native build both mean its own copy), =amx asks for the default. Chosen once
// per process.
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef MAGI_CPU_AMX_VARIANT
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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
#ifdef MAGI_CPU_AMX_VARIANT
namespace amx {
void forward(const Mask& mask, const FwdArgs& args, const Resolved& r);
}  // namespace amx
#endif

namespace {

enum class Isa { kBase, kAvx512, kAmx };

// The widest copy MAGI_CPU_ISA allows; throws on a value it does not know.
Isa requested() {
  const char* want = std::getenv("MAGI_CPU_ISA");
  if (want == nullptr || *want == '\0' || std::strcmp(want, "amx") == 0) return Isa::kAmx;
  if (std::strcmp(want, "avx512") == 0) return Isa::kAvx512;
  if (std::strcmp(want, "base") == 0) return Isa::kBase;
  throw std::invalid_argument(std::string("MAGI_CPU_ISA=") + want +
                              ": expected base, avx512 or amx (or unset)");
}

[[maybe_unused]] bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

#ifdef MAGI_CPU_AMX_VARIANT
// CPUID.(7, 0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE, and CPUID.(7, 1):EAX bit 5 AVX512-BF16
// (the softmax's conversion of P, amx.h); then Linux (5.16+) must let this process use the
// tile data state (XFEATURE_XTILEDATA, 18): without that grant the first tile instruction
// faults.
bool has_amx() {
  if (!has_avx512()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if ((d & (1u << 22)) == 0 || (d & (1u << 24)) == 0) return false;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0 || (a & (1u << 5)) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

Isa chosen() {
  static const Isa isa = [] {
    const Isa want = requested();
    if (want == Isa::kBase) return Isa::kBase;
#ifdef MAGI_CPU_AMX_VARIANT
    if (want == Isa::kAmx && has_amx()) return Isa::kAmx;
#endif
#ifdef MAGI_CPU_AVX512_VARIANT
    if (has_avx512()) return Isa::kAvx512;
#endif
    return Isa::kBase;
  }();
  return isa;
}

}  // namespace

const char* isa_in_use() {
  switch (chosen()) {
    case Isa::kAmx: return "amx (x86-64-v4 with AMX-BF16 tiles for bf16 forward, chosen at run time)";
    case Isa::kAvx512: return "avx512 (x86-64-v4, chosen at run time)";
    case Isa::kBase: break;
  }
#if defined(MAGI_CPU_AVX512_VARIANT)
  return "base (AVX-512 variant built, not used here)";
#elif defined(MAGI_CPU_AMX_VARIANT)
  return "base (the build's own; AMX copy built, not used here)";
#else
  return "base (the only one built)";
#endif
}

void forward(const Mask& mask, const FwdArgs& args, const Resolved& r) {
  switch (chosen()) {
#ifdef MAGI_CPU_AMX_VARIANT
    case Isa::kAmx: return amx::forward(mask, args, r);
#endif
#ifdef MAGI_CPU_AVX512_VARIANT
    case Isa::kAvx512: return avx512::forward(mask, args, r);
#endif
    default: return base::forward(mask, args, r);
  }
}

void backward(const Mask& mask, const BwdArgs& args, const Resolved& r) {
#ifdef MAGI_CPU_AVX512_VARIANT
  if (chosen() != Isa::kBase) return avx512::backward(mask, args, r);  // amx: the AVX-512 one
#endif
  base::backward(mask, args, r);
}

}  // namespace magi::kernels::cpu
