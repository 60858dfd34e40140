// dtype names and IEEE half conversions (bit-exact, round-to-nearest-even, no F16C needed so
// the CPU build stays portable).
#include "magi/dtype.h"

#include <cctype>
#include <string>

#include "magi/error.h"

namespace magi {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF64: return "fp64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "unknown";
}

DType dtype_from_name(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "fp32" || s == "float32" || s == "float") return DType::kF32;
  if (s == "fp64" || s == "float64" || s == "double") return DType::kF64;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "float16" || s == "half") return DType::kF16;
  MAGI_FAIL("unknown dtype '", name, "' (expected fp32, fp64, bf16 or fp16)");
}

float to_float(F16 x) {
  const std::uint32_t sign = std::uint32_t(x.bits & 0x8000u) << 16;
  std::uint32_t exp = (x.bits >> 10) & 0x1fu;
  std::uint32_t man = x.bits & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal half: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | (std::uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

F16 to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return F16{std::uint16_t(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) return F16{std::uint16_t(sign | 0x7c00u)};  // rounds past 65504
  if (abs < 0x38800000u) {  // result is subnormal or zero: scale into integer units of 2^-24
    if (abs < 0x33000000u) return F16{sign};  // below half the smallest subnormal
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14..24 + 1
    std::uint32_t h = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return F16{std::uint16_t(sign | h)};
  }
  std::uint32_t h = ((abs >> 13) - (112u << 10));
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return F16{std::uint16_t(sign | h)};
}

}  // namespace magi
