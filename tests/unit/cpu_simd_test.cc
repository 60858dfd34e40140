// The CPU kernels' vector exp (src/kernels/cpu/simd.h): exp_nonpos, the softmax's exp on
// arguments <= 0, must equal exp() bit for bit there (the forward uses it in its AVX-512
// compilations only, for speed; docs/benchmarks.md), so choosing it can never change a result.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/simd.h"

namespace magi::kernels::cpu::MAGI_CPU_NS {
namespace {

template <typename T>
void expect_same_bits(const std::vector<T>& xs) {
  using S = Simd<T>;
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  alignas(64) T in[S::kWidth], a[S::kWidth], b[S::kWidth];
  for (std::size_t i = 0; i < xs.size(); i += S::kWidth) {
    for (int l = 0; l < S::kWidth; ++l) in[l] = xs[(i + l) % xs.size()];
    S::store(a, S::exp(S::load(in)));
    S::store(b, S::exp_nonpos(S::load(in)));
    for (int l = 0; l < S::kWidth; ++l) {
      if (std::isnan(a[l])) {  // a NaN's payload is not part of the contract
        ASSERT_TRUE(std::isnan(b[l])) << "x = " << in[l];
        continue;
      }
      ASSERT_EQ(std::bit_cast<Bits>(a[l]), std::bit_cast<Bits>(b[l])) << "x = " << in[l];
    }
  }
}

template <typename T>
std::vector<T> arguments(T lo) {
  const T inf = std::numeric_limits<T>::infinity();
  std::vector<T> xs = {T(0), -T(0), -inf, std::numeric_limits<T>::quiet_NaN(), T(-87.3),
                       T(-87.33), T(-708.3), T(-708.4), -std::numeric_limits<T>::denorm_min(),
                       -std::numeric_limits<T>::min(), T(-1e-30), T(-0.5), T(-1), T(-16)};
  std::mt19937_64 rng(20261204);
  std::uniform_real_distribution<T> wide(lo, T(0)), near(T(-2), T(0));
  for (int i = 0; i < 200000; ++i) xs.push_back(i % 2 ? wide(rng) : near(rng));
  return xs;
}

TEST(CpuSimd, ExpNonposIsExpBitForBitFloat) { expect_same_bits<float>(arguments<float>(-120.f)); }

TEST(CpuSimd, ExpNonposIsExpBitForBitDouble) {
  expect_same_bits<double>(arguments<double>(-800.0));
}

}  // namespace
}  // namespace magi::kernels::cpu::MAGI_CPU_NS
