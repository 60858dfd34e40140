// The CPU kernels' vector exp (src/kernels/cpu/simd.h). exp_nonpos, the fp64 softmax's exp on
// arguments <= 0, must equal exp() bit for bit there, so choosing it can never change a result.
// exp_fast_nonpos, the fp32 softmax's, is held to its stated accuracy against fp64 exp.
#include <gtest/gtest.h>

#include <algorithm>
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

// Relative error <= 3e-7 + 8e-8 |x| where exp(x) is a normal float: the polynomial's 2.6e-7 and
// the rounding of t = x log2e (half an ulp of t moves 2^t by about 6e-8 |x|). Exactly 0 below
// x = -87.68 (2^-126.5), 1 at 0, NaN for NaN. The bound is tight: a degree-4 polynomial
// (kExp2Poly[0] = 0) fails it, and so does 1.0000008 for the constant term.
TEST(CpuSimd, ExpFastNonposAccuracy) {
  using S = Simd<float>;
  alignas(64) float in[S::kWidth], out[S::kWidth];
  auto run = [&](float x) {
    for (int l = 0; l < S::kWidth; ++l) in[l] = x;
    S::store(out, S::exp_fast_nonpos(S::load(in)));
    return out[0];
  };
  std::mt19937_64 rng(20261204);
  std::uniform_real_distribution<float> wide(-87.3f, 0.f), near(-2.f, 0.f);
  double worst = 0;
  for (int i = 0; i < 400000; ++i) {
    const float x = i % 2 ? wide(rng) : near(rng);
    const double want = std::exp(double(x));
    const double rel = std::fabs(run(x) - want) / want;
    worst = std::max(worst, rel);
    ASSERT_LE(rel, 3e-7 + 8e-8 * std::fabs(x)) << "x = " << x;
  }
  EXPECT_GT(worst, 1e-7);  // the test sees the polynomial's error, not only exact cases
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {-inf, -88.1f, -100.f, -1e30f}) EXPECT_EQ(run(x), 0.f) << "x = " << x;
  EXPECT_NEAR(run(0.f), 1.f, 2e-7);
  EXPECT_NEAR(run(-0.f), 1.f, 2e-7);
  EXPECT_TRUE(std::isnan(run(std::numeric_limits<float>::quiet_NaN())));
}

TEST(CpuSimd, ExpNonposIsExpBitForBitFloat) { expect_same_bits<float>(arguments<float>(-120.f)); }

TEST(CpuSimd, ExpNonposIsExpBitForBitDouble) {
  expect_same_bits<double>(arguments<double>(-800.0));
}

}  // namespace
}  // namespace magi::kernels::cpu::MAGI_CPU_NS
