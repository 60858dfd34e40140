// Element types and host conversions. bf16/fp16 are stored as raw 16-bit patterns on the host;
// the CPU backend widens them to fp32 on load (round-to-nearest-even on store).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace magi {

enum class DType : std::uint8_t { kF32, kF64, kBF16, kF16 };

constexpr int dtype_size(DType t) {
  return t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2;
}

std::string_view dtype_name(DType t);
DType dtype_from_name(std::string_view name);  // "fp32"/"float32", "fp64", "bf16", "fp16"

struct BF16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

inline float to_float(BF16 x) {
  std::uint32_t u = std::uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline BF16 to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{std::uint16_t((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{std::uint16_t(u >> 16)};
}

float to_float(F16 x);
F16 to_f16(float f);

}  // namespace magi
