// Portable random draws on top of std::mt19937_64. The engine's output is fixed by the
// standard but std::uniform_*_distribution is not (libstdc++ and libc++ differ), so seeded
// document lengths and block-sparse masks map raw 64-bit words to numbers here instead.
#pragma once

#include <cstdint>
#include <limits>
#include <random>

namespace magi::detail {

// Uniform in [0, n) for n > 0: rejection keeps it unbiased; a redraw happens with
// probability below n / 2^64.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t limit = kMax - kMax % n;  // a multiple of n
  std::uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

// Uniform in [0, 1) from the top 53 bits (a double's mantissa).
inline double uniform_unit(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace magi::detail
